#!/usr/bin/env bash
# Prints, from one invocation, how close bench pull, push and sglang come to
# bench xfer on the same bytes (--xfer-reference: same descriptors, same
# concurrency as pipeline depth, same direction), measured in rounds
# between the handoff's (the same numbers `bench ... --xfer-reference`
# reports: the median of the rounds' ratios, with their p10-p90), and to
# the host's limit (the same transfers between UCX-allocated memory).
# Target: 0.9-1.05; above ~1.05 the result itself warns that its
# reference did not measure the limit. scripts/stability.sh repeats this
# ten times per protocol.
#
#   scripts/handoff-ratio.sh [MODEL] [ISL] [CONCURRENCY] [REQUESTS]
#
# Run it on a quiet machine: every number here is CPU-bound on small hosts.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh
ensure_go
model=${1:-llama-3.1-8b} isl=${2:-2048} conc=${3:-4} reqs=${4:-64}
bin=$(mktemp -d)/nixlctl
go build -o "$bin" ./cmd/nixlctl
printf '%-7s %10s %10s %7s %13s %9s  %s\n' protocol "GB/s" "xfer GB/s" ratio "p10-p90" "vs limit" "host CPU swing"
for p in pull push sglang; do
  "$bin" bench "$p" --model "$model" --isl "$isl" --concurrency "$conc" --requests "$reqs" --xfer-reference -o json 2>/dev/null |
    python3 -c '
import json, sys
d = json.load(sys.stdin); s = d["summary"]
sp = s.get("efficiency_vs_xfer_spread") or {}
print("%-7s %10.2f %10.2f %7.2f %13s %9.2f  %.2f" % (sys.argv[1], s["bandwidth_gbps"], s.get("xfer_gbps", 0), s.get("efficiency_vs_xfer", 0),
      "%.2f-%.2f" % (sp["p10"], sp["p90"]) if sp else "-", s.get("efficiency_vs_limit", 0), (d.get("host_cpu") or {}).get("swing", 0)))' "$p"
done
rm -rf "$(dirname "$bin")"
