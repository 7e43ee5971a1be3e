#!/usr/bin/env bash
# Runs NIXL's own nixlbench (two processes on this host, ASIO runtime: no
# etcd) next to `nixlctl bench xfer --backend nixl --notif` for the same
# points, alternating the two tools point by point, REPEAT times, so machine
# noise hits both alike. Both attach a notification to every request (as
# nixlbench always does over the network backends), both WRITE DRAM to DRAM
# through NIXL's UCX plugin, with the same block and batch sizes, the same
# iteration counts (enough to run for about a second, not cut above 1 MiB:
# --large_blk_iter_ftr 1) and the same working set: a buffer of one batch
# (block x batch bytes) per side.
# Prints each tool's median and best GB/s (decimal) and nixlctl / nixlbench:
# on a small or shared host both processes of each tool spin on a core, and a
# run that a neighbour preempts reads 10-100x slow, so look at both.
#
#   scripts/baseline-nixl.sh [BLOCKS] [BATCHES] [REPEAT]
#   e.g. scripts/baseline-nixl.sh "4K 64K 1M 4M" "1 64" 5
#
# It builds nothing: NIXL, its UCX and Abseil must be installed already
# (docs/backends.md says how the paths fit together). Environment:
#   NIXL_PREFIX  NIXL's install prefix (lib/libnixl_capi.so, lib/plugins,
#                bin/nixlbench); required
#   UCX_PREFIX   the UCX NIXL was built with (default $NIXL_PREFIX/../ucx)
#   ABSL_PREFIX  the Abseil NIXL was built with (default $NIXL_PREFIX/../absl;
#                ignored if missing)
#   NIXLBENCH    default $NIXL_PREFIX/bin/nixlbench
#   NIXLCTL      default bin/nixlctl (make build)
#   PROGRESS     bench xfer --progress modes to run, one column each (default
#                poll; e.g. "poll thread"; "-" passes no --progress, for
#                nixlctl builds that predate it)
#   ITERS        requests per point (default 20000), fewer where a point would
#                move more than POINT_BYTES (default 4 GiB), but at least 16;
#                a tenth of them more as warm-up
#   NIXLCTL_NIXL_PTHR_DELAY_US, UCX_* as usual.
set -euo pipefail
cd "$(dirname "$0")/.."
BLOCKS=${1:-"4K 64K 1M 4M"}
BATCHES=${2:-"1 64"}
REPEAT=${3:-5}
ITERS=${ITERS:-20000}
POINT_BYTES=${POINT_BYTES:-$((4 << 30))}
NIXLCTL=${NIXLCTL:-bin/nixlctl}
PROGRESS=${PROGRESS:-poll}
[ -n "${NIXL_PREFIX:-}" ] || { echo "set NIXL_PREFIX to NIXL's install prefix" >&2; exit 1; }
NIXL_PREFIX=$(cd "$NIXL_PREFIX" && pwd)
UCX_PREFIX=${UCX_PREFIX:-$NIXL_PREFIX/../ucx}
ABSL_PREFIX=${ABSL_PREFIX:-$NIXL_PREFIX/../absl}
NIXLBENCH=${NIXLBENCH:-$NIXL_PREFIX/bin/nixlbench}

nixl_lib=
for d in "$NIXL_PREFIX/lib" "$NIXL_PREFIX/lib/x86_64-linux-gnu" "$NIXL_PREFIX/lib64"; do
  [ -e "$d/libnixl_capi.so" ] && { nixl_lib=$d; break; }
done
[ -n "$nixl_lib" ] || { echo "no libnixl_capi.so under $NIXL_PREFIX/lib*" >&2; exit 1; }
[ -x "$NIXLBENCH" ] || { echo "$NIXLBENCH not found: set NIXLBENCH" >&2; exit 1; }
[ -x "$NIXLCTL" ] || { echo "$NIXLCTL not built: make build" >&2; exit 1; }
[ -e "$UCX_PREFIX/lib/libucp.so.0" ] || { echo "no libucp.so.0 in $UCX_PREFIX/lib: set UCX_PREFIX" >&2; exit 1; }

# libnixl_capi.so and the plugins record no library path: NIXL's own lib
# directory and Abseil's must be on the loader path, and NIXL's UCX must come
# before Debian's (one libucp.so.0 per process, and nixlctl links it).
ld=$UCX_PREFIX/lib:$nixl_lib
[ -d "$ABSL_PREFIX/lib" ] && ld=$ld:$ABSL_PREFIX/lib
export LD_LIBRARY_PATH=$ld${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export NIXL_PLUGIN_DIR=${NIXL_PLUGIN_DIR:-$nixl_lib/plugins}
export NIXLCTL_NIXL_LIB=$nixl_lib/libnixl_capi.so
export NIXL_LOG_LEVEL=${NIXL_LOG_LEVEL:-error}

bytes() { # 64K -> 65536
  local s=${1^^}; case $s in *K) echo $(( ${s%K} << 10 ));; *M) echo $(( ${s%M} << 20 ));; *G) echo $(( ${s%G} << 30 ));; *) echo "$s";; esac
}
median() { sort -g | awk '{a[NR]=$1} END {print (NR%2 ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2)}'; }

port=$((20000 + RANDOM % 20000))
iters() { # block batch -> requests
  local i=$((POINT_BYTES / ($1 * $2)))
  i=$((i < ITERS ? i : ITERS))
  echo $((i > 16 ? i : 16))
}
nixlbench() { # block batch -> GB/s
  local b=$1 n=$2 out i
  i=$(iters "$b" "$n")
  port=$((port + 1))
  local args=(--runtime_type=ASIO --asio_port="$port" --backend=UCX --op_type=WRITE
    --initiator_seg_type=DRAM --target_seg_type=DRAM --total_buffer_size=$((b * n))
    --start_block_size="$b" --max_block_size="$b" --start_batch_size="$n" --max_batch_size="$n"
    --num_iter="$i" --warmup_iter=$((i / 10)) --large_blk_iter_ftr=1)
  # The first process to bind the port is rank 0, the initiator.
  out=$(mktemp)
  "$NIXLBENCH" "${args[@]}" >"$out" 2>&1 &
  local ini=$!
  sleep 0.3
  "$NIXLBENCH" "${args[@]}" >/dev/null 2>&1 &
  local tgt=$!
  wait "$ini" || true
  wait "$tgt" || true
  # The row: block, batch, B/W (GB/Sec), avg lat, prep, p99 prep, post, p99 post, tx, p99 tx.
  awk -v b="$b" -v n="$n" '$1 == b && $2 == n && NF >= 10 {print $3; found = 1} END {if (!found) print "nan"}' "$out"
  rm -f "$out"
}
nixlctl() { # block batch progress -> GB/s
  local b=$1 n=$2 p=$3 i
  i=$(iters "$b" "$n")
  local args=()
  [ "$p" = - ] || args=(--progress "$p")
  "$NIXLCTL" bench xfer --backend nixl --notif "${args[@]}" --op-type WRITE --total-buffer-size $((b * n)) \
    --start-block-size "$b" --max-block-size "$b" --start-batch-size "$n" --max-batch-size "$n" \
    --num-iter "$i" --warmup-iter $((i / 10)) --large-blk-iter-ftr 1 -o json 2>/dev/null |
    awk -F': ' '/"bandwidth_gbps"/ {gsub(/,/, "", $2); printf "%.3f\n", $2; found = 1} END {if (!found) print "nan"}'
}
best() { sort -g | tail -1; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN {printf "%.2f", (b > 0 ? a / b : 0)}'; }

ucx_version=$("$UCX_PREFIX/bin/ucx_info" -v 2>/dev/null | awk '/Library version/ {print $4; exit}' || true)
printf 'NIXL in %s, UCX %s, %s, %d cores; up to %d requests a point (at most %d bytes, at least 16); %d alternating runs\n' \
  "$nixl_lib" "${ucx_version:-?}" "$(uname -r)" "$(nproc)" "$ITERS" "$POINT_BYTES" "$REPEAT"
printf 'GB/s: median (best) [every run]; ratio: nixlctl / nixlbench of the medians (of the best runs)\n\n'
declare -A res
for r in $(seq "$REPEAT"); do
  for size in $BLOCKS; do
    for n in $BATCHES; do
      b=$(bytes "$size")
      res[nixlbench/$size/$n]+="$(nixlbench "$b" "$n") "
      for p in $PROGRESS; do
        res[$p/$size/$n]+="$(nixlctl "$b" "$n" "$p") "
      done
    done
  done
  printf 'run %d of %d done\n' "$r" "$REPEAT" >&2
done
hdr=$(printf '%-6s %5s  %-34s' block batch "nixlbench")
for p in $PROGRESS; do
  name=nixlctl
  [ "$p" = - ] || name="nixlctl $p"
  hdr+=$(printf '  %-34s %-11s' "$name" ratio)
done
echo "$hdr"
for size in $BLOCKS; do
  for n in $BATCHES; do
    l=${res[nixlbench/$size/$n]% }
    mb=$(printf '%s\n' $l | median) bb=$(printf '%s\n' $l | best)
    line=$(printf '%-6s %5s  %-34s' "$size" "$n" "$mb ($bb) [$l]")
    for p in $PROGRESS; do
      l=${res[$p/$size/$n]% }
      mx=$(printf '%s\n' $l | median) bx=$(printf '%s\n' $l | best)
      line+=$(printf '  %-34s %-11s' "$mx ($bx) [$l]" "$(ratio "$mx" "$mb") ($(ratio "$bx" "$bb"))")
    done
    echo "$line"
  done
done
