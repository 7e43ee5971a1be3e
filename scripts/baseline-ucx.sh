#!/usr/bin/env bash
# Runs ucx_perftest (ucp_put_bw for WRITE, ucp_get for READ) on loopback next
# to `nixlctl bench xfer` for the same block sizes, the same allocation (UCX
# allocates the memory, as ucx_perftest does: --dram-alloc ucx) and the same
# working set (one buffer of one block, as ucx_perftest reuses its buffer),
# alternating the two tools REPEAT times so machine noise hits both alike.
# Prints each tool's median GB/s (decimal) and nixlctl / ucx_perftest.
#
#   scripts/baseline-ucx.sh [SIZES] [REPEAT]    e.g. scripts/baseline-ucx.sh "64K 1M" 5
#
# Environment: NIXLCTL (default bin/nixlctl), ITERS (default 10000), UCX_* as usual.
set -euo pipefail
cd "$(dirname "$0")/.."
SIZES=${1:-"64K 1M"}
REPEAT=${2:-5}
ITERS=${ITERS:-10000}
NIXLCTL=${NIXLCTL:-bin/nixlctl}
command -v ucx_perftest >/dev/null || { echo "ucx_perftest not found: apt-get install ucx-utils" >&2; exit 1; }
[ -x "$NIXLCTL" ] || { echo "$NIXLCTL not built: make build" >&2; exit 1; }

bytes() { # 64K -> 65536
  local s=${1^^}; case $s in *K) echo $(( ${s%K} << 10 ));; *M) echo $(( ${s%M} << 20 ));; *G) echo $(( ${s%G} << 30 ));; *) echo "$s";; esac
}
median() { sort -g | awk '{a[NR]=$1} END {print (NR%2 ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2)}'; }

port=$((20000 + RANDOM % 20000))
perftest() { # test size -> GB/s
  local t=$1 size=$2 iters=$3
  port=$((port + 1))
  ucx_perftest -t "$t" -s "$size" -n "$iters" -w $((iters / 10)) -p "$port" >/dev/null 2>&1 &
  local srv=$!
  sleep 0.5
  local mbs
  mbs=$(ucx_perftest localhost -t "$t" -s "$size" -n "$iters" -w $((iters / 10)) -p "$port" 2>/dev/null | awk '/^Final:/ {print $7}')
  wait "$srv" 2>/dev/null || true
  # ucx_perftest reports MB/s as 2^20 bytes per second.
  awk -v m="$mbs" 'BEGIN {printf "%.3f\n", m * 1048576 / 1e9}'
}
nixlctl() { # op size -> GB/s
  local op=$1 size=$2 iters=$3
  "$NIXLCTL" bench xfer --backend ucx --op-type "$op" --dram-alloc ucx --start-block-size "$size" --max-block-size "$size" \
    --total-buffer-size "$size" --num-iter "$iters" --warmup-iter $((iters / 10)) --large-blk-iter-ftr 1 -o json 2>/dev/null |
    awk -F': ' '/"bandwidth_gbps"/ {gsub(/,/, "", $2); printf "%.3f\n", $2}'
}

printf 'ucx %s, %s, %d iterations, median of %d alternating runs\n\n' "$(ucx_info -v | awk '/Version/ {print $3; exit}')" "$(uname -r)" "$ITERS" "$REPEAT"
printf '%-6s %10s %22s %22s %8s\n' "op" "block" "ucx_perftest GB/s" "nixlctl GB/s" "ratio"
for size in $SIZES; do
  b=$(bytes "$size")
  for pair in "WRITE ucp_put_bw" "READ ucp_get"; do
    set -- $pair
    op=$1 test=$2
    pt=() nx=()
    for _ in $(seq "$REPEAT"); do
      pt+=("$(perftest "$test" "$b" "$ITERS")")
      nx+=("$(nixlctl "$op" "$size" "$ITERS")")
    done
    mp=$(printf '%s\n' "${pt[@]}" | median)
    mn=$(printf '%s\n' "${nx[@]}" | median)
    ratio=$(awk -v a="$mn" -v b="$mp" 'BEGIN {printf "%.2f", (b > 0 ? a / b : 0)}')
    printf '%-6s %10s %22s %22s %8s\n' "$op" "$size" "$mp [${pt[*]}]" "$mn [${nx[*]}]" "$ratio"
  done
done
