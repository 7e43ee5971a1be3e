#!/usr/bin/env bash
# Sets up nixlctl on a fresh Debian 12 machine and runs its main job.
#
#   scripts/setup.sh          install packages, build bin/nixlctl, run the main job
#   scripts/setup.sh --deps   only install what building and testing need
#
# Safe to run again: it installs only what is missing.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh

install_system_packages
ensure_go
go mod download
[ "${1:-}" = "--deps" ] && exit 0

build_nixlctl
log "main job: vLLM push-mode KV handoff, Llama-3.1-8B, 2048-token prompts, prefill and decode as separate processes"
exec bin/nixlctl bench push --model llama-3.1-8b --isl 2048 --requests 48 --concurrency 4 -o table
