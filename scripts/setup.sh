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
log "main job: KV layout of Llama-3.1-70B for a sweep of prompt lengths"
exec bin/nixlctl kv layout --model llama-3.1-70b --tokens 1024,4096,8192,32768,131072 -o table
