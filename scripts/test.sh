#!/usr/bin/env bash
# Runs nixlctl's tests (race detector on), installing what they need first.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh --deps
. scripts/lib.sh
ensure_go
go vet ./...
go test -race -count=1 -timeout 20m ./...
