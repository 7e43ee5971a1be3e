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
# AB=1 measures the A/B gate (gate --baseline-binary) beside the saved
# baseline's: each trial makes REPEAT runs of the baseline's command and
# REPEAT of the trial's, in turns (base, trial, trial, base, ...), one
# process a run, and judges the trial's runs twice: against the baseline
# saved at the start (what `gate --repeat` does) and against the runs made
# beside them (what `gate --baseline-binary` does: the same judgement,
# given here as pooled --baseline files so that every metric can be
# judged on the same runs).
#
# NEIGHBOUR=1 runs a noisy neighbour beside the trials (not the baseline):
# one core busy for 5-30 s, then idle for 5-30 s, at random, so that the
# host's state drifts during the trials as it does on a shared runner.
#
# RERUN=1 (with AB=1) makes a trial run again that a neighbour moved
# (host_others_cpu's mean at 0.25 CPUs or more), up to REPEAT extra runs a
# side, as `gate --repeat` does (--reruns); the gate then sets aside the
# moved runs when both sides keep three quiet ones.
#
# KEEP=1 leaves the work folder (every run's result and every gate's
# verdict) and names it at the end, so that the same runs can be judged
# again later, for example on their first few runs a side.
#
#   [AB=1] [NEIGHBOUR=1] [RERUN=1] [KEEP=1] [BASE_REPEAT=N] [PROTO=push] [MODEL=...] [METRICS="..."] scripts/gate-error-rates.sh [TRIALS] [SLOW] [REPEAT] [REQUESTS]
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
cleanup_work() { if [ "${KEEP:-0}" = 1 ]; then log "kept: $work"; else rm -rf "$work"; fi; }
trap cleanup_work EXIT
bin=$work/nixlctl
go build -o "$bin" ./cmd/nixlctl
run=("$bin" bench "$proto" --model "$model" --isl 2048 --requests "$reqs" --concurrency 4 --xfer-reference)
log "baseline: ${run[*]#"$work/"} --repeat $base_repeat --save base"
"${run[@]}" --repeat "$base_repeat" --save "$work/base" -o json >/dev/null 2>"$work/base.err"
# The pipeline's ratio (span_efficiency_vs_xfer), the one --prefill-time
# lowers: efficiency_vs_xfer leaves the prefill stage out.
ratio() { python3 -c 'import json,sys; s=json.load(open(sys.argv[1]))["summary"]; print("%.3f" % s.get("span_efficiency_vs_xfer", s["efficiency_vs_xfer"]))' "$1"; }
median_ratio() {
  python3 -c 'import json,sys,statistics as st
ss=[json.load(open(f))["summary"] for f in sys.argv[1:]]
print("%.3f" % st.median(s.get("span_efficiency_vs_xfer", s["efficiency_vs_xfer"]) for s in ss))' "$@"
}
# trial_runs KIND I: the files the trial's gate judges as its results
# (and, with AB=1, as its baseline: side_base).
trial_runs() {
  local kind=$1 i=$2 extra=()
  [ "$kind" = slow ] && extra=(--prefill-time "$slow")
  side_res=() side_base=()
  if [ "${AB:-0}" != 1 ]; then
    "${run[@]}" --repeat "$repeat" "${extra[@]}" -o json >"$work/$kind-$i.json" 2>"$work/$kind-$i.err"
    side_res=("$work/$kind-$i.json")
    return
  fi
  local r order f n args
  local -A left=([base]=0 [res]=0) # re-runs left a side (RERUN=1)
  if [ "${RERUN:-0}" = 1 ]; then left=([base]=$repeat [res]=$repeat); fi
  for r in $(seq 1 "$repeat"); do
    order="base res"
    [ $((r % 2)) = 0 ] && order="res base"
    for side in $order; do
      args=("${run[@]}")
      [ "$side" = res ] && args+=("${extra[@]}")
      for ((n = 0; ; n++)); do
        f=$work/$kind-$i-$side$r.json
        [ "$n" = 0 ] || f=$work/$kind-$i-$side${r}r$n.json
        "${args[@]}" -o json >"$f" 2>"${f%.json}.err"
        if [ "$side" = base ]; then side_base+=("$f"); else side_res+=("$f"); fi
        moved "$f" && [ "${left[$side]}" -gt 0 ] || break
        left[$side]=$((left[$side] - 1))
      done
    done
  done
}
# moved FILE: whether other processes took 0.25 CPUs or more on average
# while the run measured (its host_others_cpu), as the gate reads it.
moved() {
  python3 -c 'import json,sys; o=json.load(open(sys.argv[1])).get("host_others_cpu") or {}; sys.exit(0 if o.get("mean_cpus", 0) >= 0.25 else 1)' "$1"
}
# judge KIND I [gate flags...]: the trial's gate against the saved
# baseline (saved) and, with AB=1, against the runs beside it (ab); exit
# codes in rc_saved and rc_ab.
judge() {
  local kind=$1 i=$2
  shift 2
  local res=() f
  for f in $(cat "$work/$kind-$i.res"); do res+=(--result "$f"); done
  rc_saved=0
  "$bin" gate --baseline "$work/base" "${res[@]}" --max-regression "$maxreg" "$@" -o json >"$work/gate-$kind-$i.json" 2>/dev/null || rc_saved=$?
  rc_ab=0
  if [ "${AB:-0}" = 1 ]; then
    local bs=()
    for f in $(cat "$work/$kind-$i.base"); do bs+=(--baseline "$f"); done
    "$bin" gate "${bs[@]}" "${res[@]}" --max-regression "$maxreg" "$@" -o json >"$work/gate-ab-$kind-$i.json" 2>/dev/null || rc_ab=$?
  fi
}
if [ "${NEIGHBOUR:-0}" = 1 ]; then
  # RANDOM seeded, so that two runs of the script meet the same pattern.
  (
    RANDOM=25
    while :; do
      timeout $((5 + RANDOM % 26)) sh -c 'while :; do :; done' || true
      sleep $((5 + RANDOM % 26))
    done
  ) &
  neighbour=$!
  trap 'kill -STOP "$neighbour" 2>/dev/null; pkill -P "$neighbour" 2>/dev/null; kill "$neighbour" 2>/dev/null; kill -CONT "$neighbour" 2>/dev/null; cleanup_work' EXIT
  log "noisy neighbour: pid $neighbour, one core busy 5-30 s, then idle 5-30 s"
fi
verdict() { python3 -c 'import json,sys; g=json.load(open(sys.argv[1])); print(g["metrics"][0]["verdict"] if g.get("metrics") else "refused")' "$1"; }
fa=0 pw=0 fa_ab=0 pw_ab=0
same_ratios=() slow_ratios=()
for i in $(seq 1 "$trials"); do
  for kind in same slow; do
    trial_runs "$kind" "$i"
    printf '%s\n' "${side_res[@]}" >"$work/$kind-$i.res"
    printf '%s\n' "${side_base[@]}" >"$work/$kind-$i.base"
    judge "$kind" "$i"
    r=$(median_ratio "${side_res[@]}")
    line=$(printf 'trial %2d %-4s ratio %s gate exit %d (%s)' "$i" "$kind" "$r" "$rc_saved" "$(verdict "$work/gate-$kind-$i.json")")
    if [ "${AB:-0}" = 1 ]; then
      line+=$(printf '; beside ratio %s, A/B gate exit %d (%s)' "$(median_ratio "${side_base[@]}")" "$rc_ab" "$(verdict "$work/gate-ab-$kind-$i.json")")
    fi
    echo "$line"
    for pair in "$rc_saved:fa:pw" "$rc_ab:fa_ab:pw_ab"; do
      IFS=: read -r rc fvar pvar <<<"$pair"
      case "$kind:$rc" in
        same:1) eval "$fvar=\$(( $fvar + 1 ))" ;;
        slow:1) eval "$pvar=\$(( $pvar + 1 ))" ;;
        *:0) ;;
        *) log "gate exit $rc in trial $i ($kind): see $work"; exit 1 ;;
      esac
    done
    if [ "$kind" = same ]; then same_ratios+=("$r"); else slow_ratios+=("$r"); fi
  done
done
base=$(ratio "$work/base/result.json")
slowdown=$(python3 -c 'import sys, statistics as st; a=[float(x) for x in sys.argv[1].split()]; b=[float(x) for x in sys.argv[2].split()]; print("%.1f%%" % (100 * (1 - st.median(b) / st.median(a))))' "${same_ratios[*]}" "${slow_ratios[*]}")
echo
echo "baseline span_efficiency_vs_xfer (median of $base_repeat runs): $base"
echo "slowdown made by --prefill-time $slow: $slowdown (median ratio of the slowed trials against the unchanged ones)"
echo "false alarms: $fa of $trials (same build, against the saved baseline)"
echo "power: $pw of $trials (slowed build detected, against the saved baseline)"
if [ "${AB:-0}" = 1 ]; then
  echo "A/B false alarms: $fa_ab of $trials (against the runs made beside)"
  echo "A/B power: $pw_ab of $trials"
  reruns=$(find "$work" -name '*-base*r*.json' -o -name '*-res*r*.json' | wc -l)
  aside=$(python3 -c 'import json,sys; print(sum(1 for f in sys.argv[1:] if json.load(open(f)).get("set_aside")))' "$work"/gate-ab-*.json)
  echo "re-runs of runs a neighbour moved: $reruns; A/B gates that set moved runs aside: $aside of $((2 * trials))"
fi
# The same trials judged on other metrics (no new runs): which one a gate
# on this machine should use.
echo
if [ "${AB:-0}" = 1 ]; then
  printf '%-26s %-14s %-10s %-14s %s\n' metric "false alarms" power "A/B false" "A/B power"
else
  printf '%-26s %-14s %s\n' metric "false alarms" power
fi
for m in ${METRICS:-efficiency_vs_xfer span_efficiency_vs_xfer efficiency_vs_limit efficiency_vs_memcpy bandwidth_gbps transfer_gbps_p50 handoff_latency_ms.p50}; do
  mfa=0 mpw=0 mfa_ab=0 mpw_ab=0
  for i in $(seq 1 "$trials"); do
    judge same "$i" --metric "$m"
    [ "$rc_saved" = 0 ] || mfa=$((mfa + 1))
    [ "$rc_ab" = 0 ] || mfa_ab=$((mfa_ab + 1))
    judge slow "$i" --metric "$m"
    [ "$rc_saved" = 0 ] || mpw=$((mpw + 1))
    [ "$rc_ab" = 0 ] || mpw_ab=$((mpw_ab + 1))
  done
  if [ "${AB:-0}" = 1 ]; then
    printf '%-26s %-14s %-10s %-14s %s\n' "$m" "$mfa of $trials" "$mpw of $trials" "$mfa_ab of $trials" "$mpw_ab of $trials"
  else
    printf '%-26s %-14s %s\n' "$m" "$mfa of $trials" "$mpw of $trials"
  fi
done
