#!/usr/bin/env bash
# Everything owed on a real GPU, in one command (docs/gpu.md):
#
#   scripts/gpu-check.sh OUTDIR
#
# runs, each bounded in time and each past the failure of another:
#   0 the machine: nvidia-smi (GPUs, driver, topology), CPU, OS
#   1 nixlctl probe env
#   2 bench xfer VRAM->VRAM over cuda-ipc between two processes on one GPU,
#     WRITE and READ, batch 1 and 64, 64K..64M, --check-consistency, against
#     the same run's device-to-device copy (target: >= 0.9 at >= 1 MiB)
#   3 bench push, pull and sglang with --mem vram, TP 1->1 and 2->1, 0 corrupt
#     blocks, each against bench xfer on the same bytes (--xfer-reference)
#   4 faults: decode killed mid-run (push), the READ target killed mid-run
#     (pull's prefill), Ctrl-C: an error within seconds, nobody left behind
#   5 the GPU packages' tests with NIXLCTL_TEST_CUDA=real (pass or skip with
#     the reason)
#   6 NIXL on VRAM: bench xfer --backend nixl next to nixlbench, when a
#     CUDA-enabled NIXL is installed (NIXL_PREFIX; docs/gpu.md builds one)
# and writes OUTDIR/report.md (what ran, what passed, failed or was skipped
# and why, the results as tables) and OUTDIR/raw/ (every command's JSON,
# stdout and stderr). It exits 0 when every step that ran passed, else 1.
#
# Binaries come from a bundle (scripts/gpu-bundle.sh): GPU_CHECK_BUNDLE, default
# .device/gpu, or .device/gpu.tar.xz unpacked; without either, and with Go
# here, the bundle is built first. Its libraries are put on the loader path
# of nixlctl's commands only.
#
# Environment:
#   GPU_CHECK_DRIVER  auto (default): the real driver where nvidia-smi or
#                     libcuda.so.1 is found, else the tests' FAKE driver
#                     (host memory posing as GPU memory; built with gcc, and
#                     nixlctl accepts it only in a test binary, so nixlctl runs
#                     as the cmd/nixlctl test binary then); real; fake
#   GPU_CHECK_QUICK   1: small sizes (the default with the fake driver)
#   GPU_CHECK_STEPS   the steps to run (default "0 1 2 3 4 5 6")
#   GPU_CHECK_HANDOFF_SHAPE, GPU_CHECK_FAULT_SHAPE, GPU_CHECK_TPS  step 3's and
#                     4's workload (see "sizes" below)
#   GPU_CHECK_BUDGET  seconds the whole check may take (default 3600): each
#                     step is bounded by what is left, and skipped when too
#                     little is
#   NIXL_PREFIX, UCX_PREFIX, ABSL_PREFIX, NIXLBENCH   step 6 (as scripts/baseline-nixl.sh);
#                     NIXLBENCH_SEG=DRAM tries its nixlbench pair where NIXL has no CUDA
set -uo pipefail
CALLER_DIR=$(pwd)
cd "$(dirname "$0")/.."
REPO=$(pwd)
SELF=$REPO/scripts/gpu-check.sh

# ---------------------------------------------------------------- internal
# The fault scenarios and the nixlbench pair run as "gpu-check.sh __sub NAME
# ARGS..." so that the step runner bounds them with timeout(1) like any
# other command.
if [ "${1:-}" = __sub ]; then
  shift
  SUB_ARGS=("$@")
fi

OUT=${1:?usage: scripts/gpu-check.sh OUTDIR}
if [ -z "${SUB_ARGS+x}" ]; then
  case $OUT in /*) ;; *) OUT=$CALLER_DIR/$OUT ;; esac
  mkdir -p "$OUT" || exit 2
  OUT=$(cd "$OUT" && pwd)
  RAW=$OUT/raw
  WORK=$OUT/.work
  rm -rf "$RAW" "$WORK"
  mkdir -p "$RAW" "$WORK"
fi

log() { printf '[gpu-check %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }

# ------------------------------------------------------------------ faults
# Each waits for the state it needs (requests done, as the records file
# shows), injects the fault, and then waits for the consequence, bounded.

# wait_for SECONDS WHAT COMMAND...: polls COMMAND every 50 ms.
wait_for() {
  local limit=$1 what=$2
  shift 2
  local deadline=$((SECONDS + limit))
  until "$@"; do
    if [ "$SECONDS" -ge "$deadline" ]; then
      echo "gave up after ${limit}s waiting for $what" >&2
      return 1
    fi
    sleep 0.05
  done
}

records_at_least() { [ -f "$1" ] && [ "$(wc -l <"$1")" -gt "$2" ]; } # header line + N
gone() { ! kill -0 "$1" 2>/dev/null; }
# Processes are found through /proc: a GPU machine's image may lack procps.
# procs [FIELD VALUE]: "PID PPID PGID CMDLINE" of every process (whose PPID
# or PGID, FIELD 2 or 3, is VALUE), read without a fork per process.
procs() {
  local d stat rest f
  for d in /proc/[0-9]*; do
    { read -r stat <"$d/stat"; } 2>/dev/null || continue
    rest=${stat##*) }
    read -r -a f <<<"$rest"
    if [ $# -eq 2 ]; then
      case $1 in 2) [ "${f[1]}" = "$2" ] || continue ;; 3) [ "${f[2]}" = "$2" ] || continue ;; esac
    fi
    printf '%s %s %s %s\n' "${d#/proc/}" "${f[1]}" "${f[2]}" "$(tr '\0' ' ' <"$d/cmdline" 2>/dev/null)"
  done
}
child_matching() { procs 2 "$1" | awk -v pat="$2" 'index($0, pat) {print $1; exit}'; }
group_members() { procs 3 "$1" | grep -v "^$$ "; }
group_empty() { [ -z "$(group_members "$1")" ]; }

# ms_since T0 LINE: milliseconds from T0 (seconds since the epoch) to the
# time= stamp of a log line of nixlctl's (UTC, RFC 3339).
ms_since() {
  local at
  at=$(printf '%s\n' "$2" | sed -n 's/^time=\([^ ]*\).*/\1/p')
  [ -n "$at" ] || { echo "?"; return; }
  awk -v a="$1" -v b="$(date -d "$at" +%s.%N)" 'BEGIN {printf "%.0f", (b - a) * 1000}'
}

# start_run PROTO DIR: a long handoff run in a process group of its own
# (RUN_PID), its result, stderr and records in DIR, returned once 2 requests
# finished.
start_run() {
  setsid "$NX" bench "$1" --mem vram --backend cuda-ipc "${FAULT_SHAPE[@]}" --requests 100000 \
    --concurrency 4 --warmup 0 --records "$2/records.jsonl" --tui=off -o json >"$2/result.json" 2>"$2/stderr" &
  RUN_PID=$!
  wait_for 120 "2 requests done" records_at_least "$2/records.jsonl" 2 || { kill -9 -- -"$RUN_PID"; return 1; }
}

# nobody_left PID: waits (10 s at most) for PID's process group to empty;
# what is left is named, killed, and fails the check.
nobody_left() {
  if wait_for 10 "the process group to empty" group_empty "$1"; then
    echo "no process of the run is left"
    return 0
  fi
  echo "FAIL: left behind: $(group_members "$1" | tr '\n' ';')"
  kill -9 -- -"$1" 2>/dev/null
  return 1
}

# fault_kill_endpoint PROTO ENDPOINT DIR: a handoff run whose ENDPOINT child
# is SIGKILLed once 2 requests finished. The run must log an error naming
# the dead endpoint within 5 s, end within 30 s with exit 1, the surviving
# endpoint must still answer (its final stats are in the result), and no
# process may be left.
fault_kill_endpoint() {
  local proto=$1 endpoint=$2 dir=$3 survivor=prefill
  [ "$endpoint" = prefill ] && survivor=decode
  local rec=$dir/records.jsonl pid
  start_run "$proto" "$dir" || return 1
  pid=$RUN_PID
  local victim
  victim=$(child_matching "$pid" "serve $endpoint")
  [ -n "$victim" ] || { echo "no serve $endpoint child of $pid" >&2; kill -9 -- -"$pid"; return 1; }
  echo "SIGKILL to serve $endpoint (pid $victim) after $(($(wc -l <"$rec") - 1)) requests"
  local t0
  t0=$(date +%s.%N)
  kill -9 "$victim"
  wait_for 30 "the run to end after its $endpoint died" gone "$pid"
  local ended=$?
  local t1
  t1=$(date +%s.%N)
  wait "$pid"
  local rc=$?
  local first
  first=$(grep -m1 'level=ERROR' "$dir/stderr")
  echo "first error $(ms_since "$t0" "$first") ms after the kill: ${first#*msg=}"
  echo "run ended $(awk -v a="$t0" -v b="$t1" 'BEGIN {printf "%.2f", b - a}') s after the kill (it waits up to 6 s for leased blocks to come back), exit $rc"
  local ok=0
  [ -n "$first" ] && [ "$(ms_since "$t0" "$first")" -le 5000 ] 2>/dev/null || { echo "FAIL: no error within 5 s"; ok=1; }
  [[ $first == *"$endpoint"* ]] || { echo "FAIL: the error does not name the $endpoint"; ok=1; }
  [ "$ended" -eq 0 ] || { echo "FAIL: the run did not end within 30 s"; ok=1; kill -9 -- -"$pid" 2>/dev/null; }
  [ "$rc" -eq 1 ] || { echo "FAIL: exit $rc, want 1 (a failed run)"; ok=1; }
  if grep -q "\"$survivor stats: " "$dir/result.json"; then
    echo "FAIL: the surviving $survivor did not answer: $(grep -o "\"$survivor stats: [^\"]*" "$dir/result.json")"
    ok=1
  else
    echo "the surviving $survivor answered its final stats"
  fi
  nobody_left "$pid" || ok=1
  return $ok
}

# fault_interrupt DIR: Ctrl-C (SIGINT to the whole process group, as a
# terminal sends it) once 2 requests finished: the run ends within 20 s,
# says it was interrupted, exits 130 (nixlctl's code for an interrupted
# run), and leaves no process.
fault_interrupt() {
  local dir=$1
  local rec=$dir/records.jsonl pid
  start_run push "$dir" || return 1
  pid=$RUN_PID
  echo "SIGINT to the process group after $(($(wc -l <"$rec") - 1)) requests"
  local t0 t1
  t0=$(date +%s.%N)
  kill -INT -- -"$pid"
  wait_for 20 "the run to end after Ctrl-C" gone "$pid"
  local ended=$?
  t1=$(date +%s.%N)
  wait "$pid"
  local rc=$?
  echo "run ended $(awk -v a="$t0" -v b="$t1" 'BEGIN {printf "%.2f", b - a}')s after SIGINT, exit $rc"
  local ok=0
  [ "$ended" -eq 0 ] || { echo "FAIL: still running 20 s after SIGINT"; ok=1; kill -9 -- -"$pid" 2>/dev/null; }
  [ "$rc" -eq 130 ] || { echo "FAIL: exit $rc, want 130 (an interrupted run)"; ok=1; }
  grep -q '"interrupted": true' "$dir/result.json" || { echo "FAIL: the result does not say interrupted"; ok=1; }
  nobody_left "$pid" || ok=1
  return $ok
}

# nixlbench_pair NIXLBENCH OP START MAX ITERS WARMUP: NIXL's own benchmark,
# VRAM to VRAM over its UCX plugin, batch 1, two processes meeting over its
# ASIO runtime (no etcd): the first to bind the port is the initiator, so the
# target starts once the initiator listens.
nixlbench_pair() {
  local bin=$1 op=$2 start=$3 max=$4 iters=$5 warm=$6
  local port=$((20000 + RANDOM % 20000))
  # The working set as bench xfer's default: one block of the largest size.
  local args=(--runtime_type=ASIO --asio_address=127.0.0.1 --asio_port="$port" --worker_type=nixl --backend=UCX
    --scheme=pairwise --mode=SG --op_type="$op" --initiator_seg_type="${NIXLBENCH_SEG:-VRAM}" --target_seg_type="${NIXLBENCH_SEG:-VRAM}"
    --start_block_size="$start" --max_block_size="$max" --start_batch_size=1 --max_batch_size=1
    --total_buffer_size="$max" --num_iter="$iters" --warmup_iter="$warm" --large_blk_iter_ftr=16 --check_consistency)
  echo "nixlbench ${args[*]}"
  "$bin" "${args[@]}" &
  local ini=$!
  # Listening: port in /proc/net/tcp{,6} (hex), state 0A.
  listening() { awk -v p="$(printf ':%04X' "$port")" '$2 ~ p"$" && $4 == "0A" {f = 1} END {exit !f}' /proc/net/tcp /proc/net/tcp6 2>/dev/null; }
  wait_for 20 "nixlbench to listen on $port" listening || sleep 1
  "$bin" "${args[@]}" >/dev/null 2>&1 &
  local tgt=$!
  wait "$ini"
  local rc=$?
  wait "$tgt"
  return $rc
}

if [ -n "${SUB_ARGS+x}" ]; then
  # Called by run_step below, with NX and the shapes in the environment.
  read -r -a FAULT_SHAPE <<<"${GPU_CHECK_FAULT_SHAPE:-}"
  case ${SUB_ARGS[0]} in
    kill-decode) fault_kill_endpoint push decode "${SUB_ARGS[1]}" ;;
    kill-read-target) fault_kill_endpoint pull prefill "${SUB_ARGS[1]}" ;;
    interrupt) fault_interrupt "${SUB_ARGS[1]}" ;;
    nixlbench) nixlbench_pair "${SUB_ARGS[@]:1}" ;;
    *) echo "unknown sub-command ${SUB_ARGS[0]}" >&2; exit 2 ;;
  esac
  exit $?
fi

# ------------------------------------------------------------------ bundle
BUNDLE=${GPU_CHECK_BUNDLE:-.device/gpu}
if [ ! -x "$BUNDLE/bin/nixlctl" ] && [ -f "$BUNDLE.tar.xz" ]; then
  log "unpacking $BUNDLE.tar.xz"
  if command -v xz >/dev/null; then
    xz -dc "$BUNDLE.tar.xz" | tar -C "$(dirname "$BUNDLE")" -xf -
  else
    python3 -c 'import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2])' "$BUNDLE.tar.xz" "$(dirname "$BUNDLE")"
  fi
fi
if [ ! -x "$BUNDLE/bin/nixlctl" ] && command -v go >/dev/null; then
  log "no bundle at $BUNDLE: building it (scripts/gpu-bundle.sh)"
  bash scripts/gpu-bundle.sh "$BUNDLE" >&2 || { log "building the bundle failed"; exit 2; }
fi
[ -x "$BUNDLE/bin/nixlctl" ] || { log "no bundle at $BUNDLE (run scripts/gpu-bundle.sh where Go is)"; exit 2; }
BUNDLE=$(cd "$BUNDLE" && pwd)

# ------------------------------------------------------------------ driver
DRIVER=${GPU_CHECK_DRIVER:-auto}
if [ "$DRIVER" = auto ]; then
  DRIVER=fake
  if nvidia-smi -L >/dev/null 2>&1 || ldconfig -p 2>/dev/null | grep -q 'libcuda.so.1 '; then DRIVER=real; fi
fi
case $DRIVER in real | fake) ;; *) log "GPU_CHECK_DRIVER=$DRIVER: want auto, real or fake"; exit 2 ;; esac
QUICK=${GPU_CHECK_QUICK:-$([ "$DRIVER" = fake ] && echo 1 || echo 0)}
STEPS=" ${GPU_CHECK_STEPS:-0 1 2 3 4 5 6} "
# The whole check ends within BUDGET seconds, report included: a step
# gets what is left, and a step with too little left is skipped.
BUDGET=${GPU_CHECK_BUDGET:-3600}
DEADLINE=$((SECONDS + BUDGET))

# The bundle's libraries go first on nixlctl's loader path; its C++ runtime
# (Debian 12's) only where the machine has none, since a library built
# there (NIXL) needs the machine's newer one.
LIBS=$BUNDLE/lib
if ! ldconfig -p 2>/dev/null | grep -q 'libstdc++.so.6 ' && [ ! -e /usr/lib/x86_64-linux-gnu/libstdc++.so.6 ] &&
  [ ! -e /usr/lib64/libstdc++.so.6 ]; then
  LIBS=$LIBS:$BUNDLE/lib/gcc-runtime
fi

# NX runs nixlctl with the bundle's libraries; with the fake driver it is the
# cmd/nixlctl test binary under the name nixlctl (testscript runs it as the
# CLI, and nixlctl accepts the fake driver only in a test binary).
NX=$WORK/nixlctl
FAKE_NOTE=
if [ "$DRIVER" = fake ]; then
  mkdir -p "$WORK/fakebin"
  ln -sf "$BUNDLE/tests/cmd_nixlctl.test" "$WORK/fakebin/nixlctl"
  if ! "${CC:-gcc}" -shared -fPIC -O1 -Wall -o "$WORK/libcuda-nixlctl-fake.so" \
      -I internal/nixl/cuda internal/nixl/cuda/cudatest/testdata/fakecuda.c -lpthread 2>"$RAW/fake-driver.err"; then
    log "cannot build the fake CUDA driver: $(tail -1 "$RAW/fake-driver.err")"
    exit 2
  fi
  cat >"$NX" <<EOF
#!/bin/sh
export LD_LIBRARY_PATH="$LIBS\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}" PATH="$WORK/fakebin:$BUNDLE/bin:\$PATH"
export NIXLCTL_CUDA_LIB="$WORK/libcuda-nixlctl-fake.so" NIXLCTL_FAKE_CUDA_DEVICES=1
exec "$WORK/fakebin/nixlctl" "\$@"
EOF
  FAKE_NOTE="**FAKE DRIVER: no GPU here. These are the tests' fake CUDA driver (host memory posing as GPU memory): the steps run end to end, the numbers say nothing about GPUs.**"
else
  cat >"$NX" <<EOF
#!/bin/sh
export LD_LIBRARY_PATH="$LIBS\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}" PATH="$BUNDLE/bin:\$PATH"
exec "$BUNDLE/bin/nixlctl" "\$@"
EOF
fi
chmod +x "$NX"
export NX

# ------------------------------------------------------------------- sizes
if [ "$QUICK" = 1 ]; then
  XFER_SIZES=(--start-block-size 64K --max-block-size 256K --num-iter 20 --warmup-iter 2)
  XFER_BATCHES="1 4"
  HANDOFF_SHAPE=(--model llama-3.2-1b --isl 256 --requests 8 --concurrency 2)
  FAULT_SHAPE=(--model llama-3.2-1b --isl 256)
  TEST_TIMEOUT=300
else
  XFER_SIZES=(--start-block-size 64K --max-block-size 64M --num-iter 1000 --warmup-iter 100)
  XFER_BATCHES="1 64"
  # llama-3.1-8b, not 70b: on an H200 a 70b run took 3 minutes, all of it
  # nixlctl's tagging through host copies (docs/gpu.md); 8b took 43 s.
  HANDOFF_SHAPE=(--model llama-3.1-8b --isl 4096 --requests 16 --concurrency 4)
  FAULT_SHAPE=(--model llama-3.1-8b --isl 4096)
  TEST_TIMEOUT=240
fi
# Overrides, as words: GPU_CHECK_HANDOFF_SHAPE, GPU_CHECK_FAULT_SHAPE (e.g. a
# smaller model when GPU time is short), GPU_CHECK_TPS ("1:1 2:1").
[ -z "${GPU_CHECK_HANDOFF_SHAPE:-}" ] || read -r -a HANDOFF_SHAPE <<<"$GPU_CHECK_HANDOFF_SHAPE"
[ -z "${GPU_CHECK_FAULT_SHAPE:-}" ] || read -r -a FAULT_SHAPE <<<"$GPU_CHECK_FAULT_SHAPE"
TPS=${GPU_CHECK_TPS:-1:1 2:1}
export GPU_CHECK_FAULT_SHAPE="${FAULT_SHAPE[*]}"

# ------------------------------------------------------------------ runner
STEPS_MD=$WORK/steps.md
BODY_MD=$WORK/body.md
: >"$STEPS_MD"
: >"$BODY_MD"
FAILED=0
RAN=0

# run_step ID TITLE TIMEOUT CMD...: runs CMD bounded by TIMEOUT seconds,
# stdout to raw/ID.out, stderr to raw/ID.err, and records the outcome.
run_step() {
  local id=$1 title=$2 limit=$3
  shift 3
  local left=$((DEADLINE - SECONDS))
  if [ "$left" -lt 20 ]; then
    skip_step "$id" "$title" "out of time (GPU_CHECK_BUDGET=$BUDGET s)"
    return 124
  fi
  [ "$limit" -le $((left - 10)) ] || limit=$((left - 10))
  log "$id: $title"
  local t0 rc status
  t0=$(date +%s.%N)
  timeout -k 10 "$limit" "$@" >"$RAW/$id.out" 2>"$RAW/$id.err"
  rc=$?
  local secs
  secs=$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN {printf "%.1f", b - a}')
  RAN=$((RAN + 1))
  case $rc in
    0) status=ok ;;
    124 | 137) status="**TIMED OUT** after ${limit}s"; FAILED=$((FAILED + 1)) ;;
    *) status="**FAILED** (exit $rc)"; FAILED=$((FAILED + 1)) ;;
  esac
  log "$id: $status (${secs}s)"
  printf '| %s | %s | %s | %s | `raw/%s.*` |\n' "$id" "$title" "$status" "$secs" "$id" >>"$STEPS_MD"
  if [ "$rc" -ne 0 ]; then
    {
      printf '\n**%s %s**: the end of its stderr:\n\n```\n' "$id" "$status"
      tail -15 "$RAW/$id.err"
      printf '```\n'
    } >>"$BODY_MD"
  fi
  return "$rc"
}

skip_step() { # ID TITLE REASON
  log "$1: skipped: $3"
  printf '| %s | %s | skipped: %s | | |\n' "$1" "$2" "$3" >>"$STEPS_MD"
}

section() { printf '\n## %s\n\n' "$*" >>"$BODY_MD"; }
say() { printf '%s\n' "$*" >>"$BODY_MD"; }

# show ID: the result of a bench step (raw/ID.out, JSON) as nixlctl renders it.
show() {
  local id=$1
  [ -s "$RAW/$id.out" ] || return 0
  cp "$RAW/$id.out" "$RAW/$id.json"
  {
    printf '\n### %s\n\n' "$id"
    "$NX" report show "$RAW/$id.json" -o markdown 2>&1 || true
  } >>"$BODY_MD"
}

want() { [[ $STEPS == *" $1 "* ]]; }
bytes() { # 64K -> 65536
  local v=${1^^}
  case $v in *K) echo $((${v%K} << 10)) ;; *M) echo $((${v%M} << 20)) ;; *G) echo $((${v%G} << 30)) ;; *) echo "$v" ;; esac
}

# ------------------------------------------------------------------- steps
if want 0; then
  section "0. The machine"
  {
    echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
    echo "kernel: $(uname -r)"
    [ -r /etc/os-release ] && echo "os: $(. /etc/os-release && echo "$PRETTY_NAME")"
    echo "cpus: $(nproc), $(awk -F': ' '/model name/ {print $2; exit}' /proc/cpuinfo)"
    echo "memory: $(awk '/MemTotal/ {printf "%.0f GiB", $2 / 1048576}' /proc/meminfo)"
    echo "glibc: $(ldd --version 2>/dev/null | head -1 | awk '{print $NF}')"
    echo "bundle: $(sed -n 's/^version: //p' "$BUNDLE/MANIFEST") ($(sed -n 's/^commit: //p' "$BUNDLE/MANIFEST"))"
    if command -v nvidia-smi >/dev/null; then
      nvidia-smi --query-gpu=index,name,uuid,driver_version,memory.total,pci.bus_id --format=csv
      nvidia-smi topo -m
    else
      echo "nvidia-smi: not installed"
    fi
  } >"$RAW/0-machine.out" 2>&1
  say '```'
  cat "$RAW/0-machine.out" >>"$BODY_MD"
  say '```'
  printf '| 0 | the machine | ok | | `raw/0-machine.out` |\n' >>"$STEPS_MD"
fi

if want 1; then
  section "1. nixlctl probe env"
  run_step 1-probe-env "nixlctl probe env" 120 "$NX" probe env -o table
  say '```'
  cat "$RAW/1-probe-env.out" >>"$BODY_MD"
  say '```'
fi

if want 2; then
  section "2. bench xfer VRAM->VRAM over cuda-ipc, two processes, one GPU"
  say "Efficiency = transfer bandwidth / the same run's device-to-device copy of the same descriptors. Target: >= 0.9 at blocks >= 1 MiB."
  say ""
  say "| op | batch | points | min efficiency at >= 1 MiB | best GB/s | consistency |"
  say "|---|---:|---:|---:|---:|---|"
  for op in WRITE READ; do
    for batch in $XFER_BATCHES; do
      id=2-xfer-$op-b$batch
      run_step "$id" "bench xfer $op batch $batch" 300 "$NX" bench xfer --backend cuda-ipc --mem VRAM --target-mem VRAM \
        --op-type "$op" "${XFER_SIZES[@]}" --start-batch-size "$batch" --max-batch-size "$batch" \
        --check-consistency -o json
      if [ -s "$RAW/$id.out" ]; then
        cp "$RAW/$id.out" "$RAW/$id.json"
        "$NX" report show "$RAW/$id.json" -o csv >"$RAW/$id.csv" 2>/dev/null
        awk -F, -v op="$op" -v batch="$batch" '
          NR == 1 { for (i = 1; i <= NF; i++) col[$i] = i; next }
          { n++; bw = $col["bandwidth_gbps"] + 0; if (bw > best) best = bw
            if ($col["block_size"] >= 1048576) { e = $col["efficiency"] + 0; if (min == "" || e < min) min = e }
            if ($col["consistency"] !~ /^ok/) bad++ }
          END { printf "| %s | %d | %d | %s | %.1f | %s |\n", op, batch, n, (min == "" ? "-" : sprintf("%.3f%s", min, (min >= 0.9 ? "" : " (below 0.9)"))), best, (bad ? bad " points not ok" : "ok") }' \
          "$RAW/$id.csv" >>"$BODY_MD"
      fi
    done
  done
  for op in WRITE READ; do for batch in $XFER_BATCHES; do show "2-xfer-$op-b$batch"; done; done
fi

if want 3; then
  section "3. KV handoff with both pools in GPU memory (--mem vram, cuda-ipc)"
  say "Shape: ${HANDOFF_SHAPE[*]}; each run also runs bench xfer on the same bytes between its rounds (--xfer-reference)."
  for tp in $TPS; do
    ptp=${tp%:*} dtp=${tp#*:}
    for proto in push pull sglang; do
      id=3-$proto-tp$ptp-$dtp
      run_step "$id" "bench $proto TP $ptp->$dtp" 300 "$NX" bench "$proto" --mem vram --backend cuda-ipc \
        "${HANDOFF_SHAPE[@]}" --prefill-tp "$ptp" --decode-tp "$dtp" --xfer-reference --tui=off -o json
      show "$id"
    done
  done
fi

if want 4; then
  section "4. Faults on the GPU"
  for f in kill-decode kill-read-target interrupt; do
    mkdir -p "$RAW/4-$f"
    case $f in
      kill-decode) title="decode killed mid-run (push)" ;;
      kill-read-target) title="READ target killed mid-run (pull's prefill)" ;;
      interrupt) title="Ctrl-C (SIGINT to the process group)" ;;
    esac
    run_step "4-$f" "$title" 180 bash "$SELF" __sub "$f" "$RAW/4-$f"
    say "**$title**"
    say '```'
    cat "$RAW/4-$f.out" >>"$BODY_MD"
    say '```'
  done
fi

if want 5; then
  section "5. The GPU packages' tests, NIXLCTL_TEST_CUDA=real"
  say "| package | result | passed | skipped (reason) | failed |"
  say "|---|---|---:|---|---:|"
  while read -r bin pkg; do
    filter=.
    case $pkg in
      internal/engine) filter='VRAM' ;;
      internal/xferbench) filter='VRAM|MemType|Mixed' ;;
      internal/probe) filter='CUDA|Cuda|GPU' ;;
      cmd/nixlctl) filter='TestScript/(bench_xfer_vram|bench_handoff_vram|bench_xfer_nocuda)$' ;;
    esac
    id=5-test-$(basename "$bin" .test)
    # In its package's directory (env -C), for the testdata it reads.
    run_step "$id" "go test $pkg -run '$filter'" "$TEST_TIMEOUT" env -C "$pkg" NIXLCTL_TEST_CUDA=real \
      LD_LIBRARY_PATH="$LIBS${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" PATH="$BUNDLE/bin:$PATH" "$BUNDLE/tests/$bin" -test.v -test.count=1 \
      -test.run "$filter" -test.timeout "$((TEST_TIMEOUT - 20))s"
    rc=$?
    if [ ! -f "$RAW/$id.out" ]; then
      say "| $pkg | skipped: out of time | | | |"
      continue
    fi
    pass=$(grep -c -- '--- PASS' "$RAW/$id.out")
    fail=$(grep -c -- '--- FAIL' "$RAW/$id.out")
    # A skip's reason is the test's last log line before its --- SKIP.
    skips=$(awk '/^=== / {msg = ""; next}
      /^ +[A-Za-z0-9_]+\.go:[0-9]+: / {msg = $0; sub(/^ +[^:]+:[0-9]+: /, "", msg); next}
      /^ +> .*skip '"'"'/ {m = $0; sub(/.*skip '"'"'/, "", m); sub(/'"'"'.*/, "", m); print "script: " m; next}
      /--- SKIP/ && msg !~ /^WORK=/ {print (msg == "" ? "(no reason given)" : msg)}' "$RAW/$id.out" |
      sed 's/|/\\|/g' | sort | uniq -c | awk '{n = $1; $1 = ""; printf "%s%dx%s", (NR > 1 ? "; " : ""), n, $0}')
    say "| $pkg | $([ "$rc" -eq 0 ] && echo ok || echo "**FAILED** (exit $rc)") | $pass | ${skips:-none} | $fail |"
  done <"$BUNDLE/tests/PACKAGES"
fi

if want 6; then
  section "6. NIXL on VRAM"
  if [ -z "${NIXL_PREFIX:-}" ]; then
    skip_step 6-nixl "NIXL VRAM->VRAM vs nixlbench" "NIXL_PREFIX not set: no CUDA-enabled NIXL here (docs/gpu.md builds one)"
    say "Skipped: NIXL_PREFIX is not set (no CUDA-enabled NIXL here; docs/gpu.md says how to build one on the GPU machine)."
  elif [ "$DRIVER" = fake ]; then
    skip_step 6-nixl "NIXL VRAM->VRAM vs nixlbench" "the fake driver cannot serve NIXL's CUDA-enabled UCX"
  else
    UCX_PREFIX=${UCX_PREFIX:-$NIXL_PREFIX/../ucx}
    ABSL_PREFIX=${ABSL_PREFIX:-$NIXL_PREFIX/../absl}
    NIXLBENCH=${NIXLBENCH:-$NIXL_PREFIX/bin/nixlbench}
    nixl_env=(env LD_LIBRARY_PATH="$UCX_PREFIX/lib:$NIXL_PREFIX/lib:$ABSL_PREFIX/lib:$LIBS${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
      NIXL_PLUGIN_DIR="$NIXL_PREFIX/lib/plugins" NIXLCTL_NIXL_LIB="$NIXL_PREFIX/lib/libnixl_capi.so"
      NIXL_LOG_LEVEL=error PATH="$BUNDLE/bin:$PATH")
    say "| op | tool | block | batch | GB/s |"
    say "|---|---|---:|---:|---:|"
    for op in WRITE READ; do
      id=6-nixlctl-$op
      run_step "$id" "bench xfer --backend nixl $op VRAM->VRAM" 300 "${nixl_env[@]}" "$BUNDLE/bin/nixlctl" bench xfer \
        --backend nixl --mem VRAM --target-mem VRAM --op-type "$op" "${XFER_SIZES[@]}" --check-consistency -o json
      show "$id"
      if [ -x "$NIXLBENCH" ]; then
        id=6-nixlbench-$op
        run_step "$id" "nixlbench $op VRAM->VRAM" 300 "${nixl_env[@]}" bash "$SELF" __sub nixlbench "$NIXLBENCH" "$op" \
          "$(bytes "${XFER_SIZES[1]}")" "$(bytes "${XFER_SIZES[3]}")" "${XFER_SIZES[5]}" "${XFER_SIZES[7]}"
        say '```'
        tail -40 "$RAW/$id.out" >>"$BODY_MD"
        say '```'
      else
        skip_step 6-nixlbench-$op "nixlbench $op" "$NIXLBENCH not found"
      fi
    done
  fi
fi

if [ "$DRIVER" = real ] && command -v nvidia-smi >/dev/null; then
  gpu_left=$(nvidia-smi --query-compute-apps=pid,process_name,used_memory --format=csv,noheader 2>/dev/null)
  section "GPU memory held by processes after the steps"
  say "${gpu_left:-none}"
fi

# Nothing of nixlctl's may outlive the check.
left=$(procs | awk -v b="$BUNDLE/" -v w="$WORK/fakebin/" 'index($4, b) == 1 || index($4, w) == 1')
if [ -n "$left" ]; then
  FAILED=$((FAILED + 1))
  section "Left running after the steps (killed now)"
  say '```'
  say "$left"
  say '```'
  for p in $(printf '%s\n' "$left" | awk '{print $1}'); do kill -9 "$p" 2>/dev/null; done
fi

# ------------------------------------------------------------------ report
{
  echo "# nixlctl GPU check"
  echo
  [ -n "$FAKE_NOTE" ] && { echo "$FAKE_NOTE"; echo; }
  echo "driver: $DRIVER; sizes: $([ "$QUICK" = 1 ] && echo quick || echo full); steps: ${STEPS# }"
  echo
  echo "| step | what | status | seconds | raw |"
  echo "|---|---|---|---:|---|"
  cat "$STEPS_MD"
  echo
  echo "$FAILED of $RAN steps that ran failed."
  cat "$BODY_MD"
} >"$OUT/report.md"
log "report: $OUT/report.md ($FAILED failed)"
[ "$FAILED" -eq 0 ]
