#!/usr/bin/env bash
# Runs nixlctl's tests (race detector on), installing what they need first.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh --deps
. scripts/lib.sh
ensure_go
go vet ./...
# The lease-chaos real-process test compares timings with the simulator:
# it runs alone afterwards, not next to every other package's processes.
go test -race -count=1 -timeout 20m -skip 'TestLeaseChaosRealProcesses|TestScripts/lease_chaos|TestMultiHost|^TestSlurm$|^TestOpenMPI$|^TestUCXLeak' ./...
# probe ucx-leak's verdicts fit 12 s of a receiver's RSS: alone, not beside
# the other packages' tests, which on a slow day kept its Go heap growing
# past the warm-up (2.3-2.9 MB/min, INCONCLUSIVE or LEAK; alone it is STABLE).
go test -race -count=1 -timeout 10m -run '^TestUCXLeak' ./internal/probe
go test -race -count=1 -timeout 10m -run 'TestLeaseChaosRealProcesses' ./internal/leasechaos
go test -race -count=1 -timeout 10m -run 'TestScripts/lease_chaos$' ./cmd/nixlctl
# Two hosts staged with namespaces and a shaped veth (root; under CI=true
# it must run): alone, since its link is shaped to a ceiling it asserts.
go test -race -count=1 -timeout 10m -run 'TestMultiHost' ./cmd/nixlctl
# A real Slurm (slurmctld, a slurmd on each staged host, munged) running
# deploy/slurm's template, and Open MPI's mpirun across the staged hosts:
# on staged hosts too, so alone.
go test -race -count=1 -timeout 10m -run '^(TestSlurm|TestOpenMPI)$' ./cmd/nixlctl
# Again without any CUDA driver (the default run uses the real one or the
# tests' fake): GPU tests must skip with their reason, and VRAM options must
# fail clearly. Only the packages whose behaviour changes.
# The lease-chaos runs (two minutes of real processes) do not touch GPU
# memory, so they run once, above.
NIXLCTL_TEST_CUDA=off go test -race -count=1 -timeout 10m -skip 'TestLeaseChaos|TestScripts/lease_chaos|TestMultiHost|^TestSlurm$|^TestOpenMPI$' \
  ./internal/nixl/cuda/... ./internal/nixl/cudaipc ./internal/engine ./internal/xferbench ./internal/handoff ./cmd/nixlctl
# The GPU check (scripts/gpu-check.sh, docs/gpu.md) end to end on the tests'
# fake driver, from a freshly built bundle that is first proven to need
# nothing but glibc (a chroot holding glibc alone: root only).
gpu_tmp=$(mktemp -d /tmp/nixlctl-gpu-check.XXXXXX)
trap 'rm -rf "$gpu_tmp"' EXIT
CHECK=$([ "$(id -u)" -eq 0 ] && echo 1 || echo 0) bash scripts/gpu-bundle.sh "$gpu_tmp/gpu"
GPU_CHECK_BUNDLE="$gpu_tmp/gpu" GPU_CHECK_DRIVER=fake bash scripts/gpu-check.sh "$gpu_tmp/out" ||
  { cat "$gpu_tmp/out/report.md"; exit 1; }
