#!/usr/bin/env bash
# How far apart back-to-back runs of the same handoff land, per protocol:
# RUNS runs each of bench pull, push and sglang with --xfer-reference (the
# reference interleaved with the handoff, round by round), then per
# protocol min / median / max and max/min of
#   - GB/s, the absolute rate,
#   - the efficiency against bench xfer (each run's median over its rounds),
#   - the efficiency against the host's limit (UCX shared memory) and memcpy,
# and how many runs kept their rounds' ratio (p10-p90) inside 0.85-1.1 and
# their median inside 0.9-1.05. The host's CPU-speed swing (cpuspeed) of
# each run is listed too: a VM's CPUs can slow 2-3x for seconds; and the
# CPUs other processes took while it measured (host_others_cpu, the mean;
# a * marks a run that warned, at 0.25 or more): a neighbour, or a build,
# beside a run moves its numbers.
#
#   scripts/stability.sh [RUNS] [MODEL] [ISL] [CONCURRENCY] [REQUESTS]
#
# STABILITY_FLAGS adds flags to every run (STABILITY_FLAGS="--dram-alloc thp").
#
# Run it on a quiet machine; the runs of the three protocols alternate, so
# a slow spell of the host hits them alike.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh
ensure_go
runs=${1:-10} model=${2:-llama-3.1-8b} isl=${3:-2048} conc=${4:-4} reqs=${5:-128}
read -r -a extra <<<"${STABILITY_FLAGS:-}"
work=$(mktemp -d)
# STABILITY_KEEP=DIR keeps the runs' results there.
trap 'if [ -n "${STABILITY_KEEP:-}" ]; then mkdir -p "$STABILITY_KEEP" && cp "$work"/*.json "$STABILITY_KEEP"/ || true; fi; rm -rf "$work"' EXIT
go build -o "$work/nixlctl" ./cmd/nixlctl
for i in $(seq 1 "$runs"); do
  for p in pull push sglang; do
    "$work/nixlctl" bench "$p" --model "$model" --isl "$isl" --concurrency "$conc" --requests "$reqs" \
      --xfer-reference "${extra[@]}" -o json 2>/dev/null >"$work/$p-$i.json" || echo "run $i of $p failed (exit $?)" >&2
  done
done
python3 - "$work" "$runs" <<'PY'
import json, os, sys
work, runs = sys.argv[1], int(sys.argv[2])
def mmm(xs):
    xs = sorted(x for x in xs if x)
    if not xs:
        return "-"
    n = len(xs)
    med = xs[n // 2] if n % 2 else (xs[n // 2 - 1] + xs[n // 2]) / 2
    return "%.2f / %.2f / %.2f (%.2fx)" % (xs[0], med, xs[-1], xs[-1] / xs[0])
print("%-7s %-28s %-28s %-12s %-12s %-28s %-28s %-28s %s  %s" % ("proto", "GB/s min/med/max (max/min)", "vs xfer min/med/max", "p10-p90 ok", "median ok",
      "over whole span", "vs host limit", "vs memcpy", "host CPU swing per run", "others' CPUs per run"))
for p in ("pull", "push", "sglang"):
    gbps, eff, span, lim, mem, swing, others, spread_ok, med_ok, n = [], [], [], [], [], [], [], 0, 0, 0
    for i in range(1, runs + 1):
        path = os.path.join(work, "%s-%d.json" % (p, i))
        try:
            d = json.load(open(path))
        except Exception:
            continue
        n += 1
        s = d["summary"]
        gbps.append(s["bandwidth_gbps"]); eff.append(s.get("efficiency_vs_xfer", 0))
        lim.append(s.get("efficiency_vs_limit", 0)); mem.append(s.get("efficiency_vs_memcpy", 0))
        span.append(s.get("span_efficiency_vs_xfer", 0))
        swing.append((d.get("host_cpu") or {}).get("swing", 0))
        o = d.get("host_others_cpu") or {}
        others.append("%.2f%s" % (o.get("mean_cpus", 0), "*" if max(o.get("mean_cpus", 0), o.get("max_cpus", 0)) >= 0.25 else "") if o else "-")
        sp = s.get("efficiency_vs_xfer_spread") or {}
        if sp and 0.85 <= sp["p10"] and sp["p90"] <= 1.1:
            spread_ok += 1
        if 0.9 <= s.get("efficiency_vs_xfer", 0) <= 1.05:
            med_ok += 1
    print("%-7s %-28s %-28s %-12s %-12s %-28s %-28s %-28s %s  %s" % (p, mmm(gbps), mmm(eff), "%d of %d" % (spread_ok, n), "%d of %d" % (med_ok, n),
          mmm(span), mmm(lim), mmm(mem), " ".join("%.2f" % x for x in swing), " ".join(others)))
PY
