#!/usr/bin/env bash
# Measures, on this machine, how often `nixlctl gate` is wrong with the
# commands docs/ci-gates.md recommends:
#   - false alarms: the same build judged against its own baseline
#     (TRIALS times; each trial a fresh --repeat run);
#   - power: the same with a real slowdown of the handoff pipeline alone,
#     made by --prefill-time SLOW (modelled prefill compute per token, which
#     delays every request's KV and not the bench xfer reference beside it;
#     span_efficiency_vs_xfer sees it, efficiency_vs_xfer, which counts only
#     the time a handoff is outstanding, does not).
# Trials of the two kinds alternate, so a slow spell of the host hits both.
#
#   [BASE_REPEAT=N] [PROTO=push] [MODEL=...] [METRICS="..."] scripts/gate-error-rates.sh [TRIALS] [SLOW] [REPEAT] [REQUESTS]
#
# Defaults: 20 trials, 3 runs a side, 128 requests of MODEL (llama-3.2-1b:
# 64 MiB a request, so a run takes seconds, not the half minute of
# llama-3.1-8b's 3.6 GB of pools on a VM whose page faults cost 13 us) at
# 2048 tokens, concurrency 4, PROTO push; SLOW is the --prefill-time that
# takes about 20% off the ratio on the project's 2-core hosts: check the
# "slowdown" line it prints.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh
ensure_go
trials=${1:-20} slow=${2:-10us} repeat=${3:-3} reqs=${4:-128}
proto=${PROTO:-push} model=${MODEL:-llama-3.2-1b} maxreg=${MAX_REGRESSION:-5%}
base_repeat=${BASE_REPEAT:-$repeat} # runs of the baseline (docs/ci-gates.md: 5)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
bin=$work/nixlctl
go build -o "$bin" ./cmd/nixlctl
run=("$bin" bench "$proto" --model "$model" --isl 2048 --requests "$reqs" --concurrency 4 --xfer-reference)
log "baseline: ${run[*]#"$work/"} --repeat $base_repeat --save base"
"${run[@]}" --repeat "$base_repeat" --save "$work/base" -o json >/dev/null 2>"$work/base.err"
run+=(--repeat "$repeat")
# The pipeline's ratio (span_efficiency_vs_xfer), the one --prefill-time
# lowers: efficiency_vs_xfer leaves the prefill stage out.
ratio() { python3 -c 'import json,sys; s=json.load(open(sys.argv[1]))["summary"]; print("%.3f" % s.get("span_efficiency_vs_xfer", s["efficiency_vs_xfer"]))' "$1"; }
false_alarms=0 detected=0
same_ratios=() slow_ratios=()
for i in $(seq 1 "$trials"); do
  for kind in same slow; do
    extra=()
    [ "$kind" = slow ] && extra=(--prefill-time "$slow")
    "${run[@]}" "${extra[@]}" -o json >"$work/$kind-$i.json" 2>"$work/$kind-$i.err"
    rc=0
    "$bin" gate --baseline "$work/base" --result "$work/$kind-$i.json" --max-regression "$maxreg" -o json \
      >"$work/gate-$kind-$i.json" 2>/dev/null || rc=$?
    r=$(ratio "$work/$kind-$i.json")
    verdict=$(python3 -c 'import json,sys; g=json.load(open(sys.argv[1])); print(g["metrics"][0]["verdict"] if g.get("metrics") else "refused")' "$work/gate-$kind-$i.json")
    printf 'trial %2d %-4s ratio %s gate exit %d (%s)\n' "$i" "$kind" "$r" "$rc" "$verdict"
    case "$kind:$rc" in
      same:1) false_alarms=$((false_alarms + 1)) ;;
      slow:1) detected=$((detected + 1)) ;;
      *:0) ;;
      *) log "gate exit $rc in trial $i ($kind): see $work/gate-$kind-$i.json"; exit 1 ;;
    esac
    if [ "$kind" = same ]; then same_ratios+=("$r"); else slow_ratios+=("$r"); fi
  done
done
base=$(ratio "$work/base/result.json")
slowdown=$(python3 -c 'import sys, statistics as st; a=[float(x) for x in sys.argv[1].split()]; b=[float(x) for x in sys.argv[2].split()]; print("%.1f%%" % (100 * (1 - st.median(b) / st.median(a))))' "${same_ratios[*]}" "${slow_ratios[*]}")
echo
echo "baseline span_efficiency_vs_xfer (median of $base_repeat runs): $base"
echo "slowdown made by --prefill-time $slow: $slowdown (median ratio of the slowed trials against the unchanged ones)"
echo "false alarms: $false_alarms of $trials (same build)"
echo "power: $detected of $trials (slowed build detected)"
# The same trials judged on other metrics (no new runs): which one a gate
# on this machine should use.
echo
printf '%-26s %-14s %s\n' metric "false alarms" power
for m in ${METRICS:-efficiency_vs_xfer span_efficiency_vs_xfer efficiency_vs_limit efficiency_vs_memcpy bandwidth_gbps transfer_gbps_p50 handoff_latency_ms.p50}; do
  fa=0 pw=0
  for i in $(seq 1 "$trials"); do
    "$bin" gate --baseline "$work/base" --result "$work/same-$i.json" --metric "$m" --max-regression "$maxreg" -o json >/dev/null 2>&1 || fa=$((fa + 1))
    "$bin" gate --baseline "$work/base" --result "$work/slow-$i.json" --metric "$m" --max-regression "$maxreg" -o json >/dev/null 2>&1 || pw=$((pw + 1))
  done
  printf '%-26s %-14s %s\n' "$m" "$fa of $trials" "$pw of $trials"
done
