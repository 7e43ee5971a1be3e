#!/usr/bin/env bash
# multihost-bench.sh measures nixlctl across a link between two staged
# hosts (scripts/twohosts.sh: network, IPC, PID and mount namespaces joined
# by a veth shaped with tbf) in one run:
#   1. bench xfer WRITE next to ucx_perftest ucp_put_bw, same message sizes
#      and iteration counts, over the same link;
#   2. bench push with decode on the other host, against a bench xfer
#      reference over the same link (--xfer-target).
# It prints a table and the ratios; targets: xfer >= 0.95x ucx_perftest at
# 1 MiB, push >= 0.9x its same-run xfer reference. Needs root.
#
#   NIXLCTL=path/to/nixlctl RATE=1gbit bash scripts/multihost-bench.sh
# RATE=none leaves the veth unshaped (then TCP over veth is CPU-bound).
set -euo pipefail
cd "$(dirname "$0")/.."
here=$PWD
twohosts="$here/scripts/twohosts.sh"
nixlctl=${NIXLCTL:-}
if [[ -z $nixlctl ]]; then
	nixlctl=$(mktemp -d)/nixlctl
	go build -o "$nixlctl" ./cmd/nixlctl
fi
for tool in ucx_perftest jq bc; do
	command -v "$tool" >/dev/null || { echo "multihost-bench: $tool not found (scripts/setup.sh --deps installs it)" >&2; exit 2; }
done
rate=${RATE:-1gbit}
sizes=${SIZES:-65536 1048576 4194304}
iters=${ITERS:-300}
name=mhb$((RANDOM % 10000))
tmp=$(mktemp -d)
cleanup() {
	{
		jobs -p | xargs -r kill
		wait
	} 2>/dev/null || true
	"$twohosts" down "$name" || true
	rm -rf "$tmp"
}
trap cleanup EXIT
if [[ $rate == none ]]; then "$twohosts" up "$name"; else "$twohosts" up "$name" "$rate"; fi
b=$("$twohosts" addr "$name" b)
echo "link: veth $("$twohosts" dev "$name" a) on both hosts, tbf rate $rate; UCX $(ucx_info -v | awk '/Version/ {print $3; exit}')"

wait_port() { # host port
	for _ in $(seq 100); do
		if ip netns exec "$name-a" bash -c "exec 3<>/dev/tcp/$1/$2" 2>/dev/null; then return 0; fi
		sleep 0.1
	done
	echo "multihost-bench: nothing listens on $1:$2" >&2
	return 1
}

"$twohosts" run "$name" b "$nixlctl" serve target --listen 0.0.0.0:7300 2>"$tmp/target.log" &
wait_port "$b" 7300
printf '%-10s %8s %14s %14s %7s\n' size iters ucx_perftest nixlctl_xfer ratio
port=13400
for s in $sizes; do
	port=$((port + 1))
	"$twohosts" run "$name" b ucx_perftest -p "$port" >"$tmp/perftest-server.log" 2>&1 &
	server=$!
	sleep 0.5
	# ucx_perftest's MB/s are MiB/s; its "overall" bandwidth is the whole
	# run's, as nixlctl's is.
	pt=$("$twohosts" run "$name" a ucx_perftest "$b" -p "$port" -t ucp_put_bw -s "$s" -n "$iters" -w 20 2>&1 |
		awk '/^Final:/ {printf "%.4f", $7 * 1048576 / 1e9}')
	wait "$server" || true
	# serve target takes one driver after another on the same port.
	x=$("$twohosts" run "$name" a "$nixlctl" bench xfer --target "$b:7300" --op-type WRITE --start-block-size "$s" --max-block-size "$s" \
		--num-iter "$iters" --warmup-iter 20 --large-blk-iter-ftr 1 -o json 2>"$tmp/xfer.err" | jq -r '.points[0].bandwidth_gbps')
	printf '%-10s %8s %11.4f GB/s %9.4f GB/s %7.3f\n' "$s" "$iters" "$pt" "$x" "$(echo "$x / $pt" | bc -l)"
done

"$twohosts" run "$name" b "$nixlctl" serve decode --listen 0.0.0.0:7401 2>"$tmp/decode.log" &
wait_port "$b" 7401
"$twohosts" run "$name" a "$nixlctl" bench push --decode "$b:7401" --xfer-reference --xfer-target "$b:7300" \
	--model llama-3.1-8b --isl "${ISL:-1024}" --requests "${REQUESTS:-24}" --concurrency 4 -o json 2>"$tmp/push.err" >"$tmp/push.json" || {
	echo "bench push failed:" >&2
	tail -5 "$tmp/push.err" >&2
	exit 1
}
jq -r '"bench push across the link: \(.summary.bandwidth_gbps*10000|round/10000) GB/s, same-run bench xfer reference \(.summary.xfer_gbps*10000|round/10000) GB/s, ratio \(.summary.efficiency_vs_xfer*1000|round/1000); placement \(.placement); decode clock \(.endpoints[1].clock.text); \(.summary.failed) failed, \(.summary.corrupt_blocks) corrupt"' "$tmp/push.json"
