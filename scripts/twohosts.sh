#!/usr/bin/env bash
# twohosts.sh stages two "hosts" on one Linux machine, for nixlctl's
# multi-host test and docs: two network namespaces joined by a veth, each
# process run in it also gets its own IPC, PID and mount namespace (so UCX
# sees another machine and uses TCP over the veth with peer error
# handling) and, on request, a time namespace whose CLOCK_MONOTONIC is
# shifted (two hosts whose clocks disagree). Needs root.
#
#   twohosts.sh up NAME [RATE]      create NAME-a (10.99.X.1) and NAME-b (10.99.X.2);
#                                   RATE (e.g. 1gbit) shapes both ends with tbf
#   twohosts.sh dup NAME            add a device NAMEd1 with one address on both hosts, as
#                                   docker0 does (it can break UCX, depending on the order UCX
#                                   finds devices in; UCX_NET_DEVICES=NAME0 keeps it out)
#   twohosts.sh run NAME a|b [--shift SECONDS] CMD...
#                                   run CMD on host a or b (in the foreground;
#                                   it dies with this script's process)
#   twohosts.sh addr NAME a|b       print the host's veth address
#   twohosts.sh dev NAME a|b        print the host's veth device name (NAME0 on both)
#   twohosts.sh down NAME           remove both namespaces and everything in them
#
# NAME must be short (veth names are at most 15 characters): 2-8 of [a-z0-9].
set -euo pipefail

die() { echo "twohosts: $*" >&2; exit 2; }

name=${2:-}
[[ $name =~ ^[a-z0-9]{2,8}$ ]] || die "NAME: want 2-8 of [a-z0-9], got '${name}'"
# The subnet's third octet comes from the name, so that two sets of hosts
# (a test and a person's manual run) do not collide.
octet=$(( $(printf '%s' "$name" | cksum | cut -d' ' -f1) % 200 + 20 ))
net=10.99.$octet

addr_of() { case $1 in a) echo "$net.1" ;; b) echo "$net.2" ;; *) die "host: want a or b" ;; esac; }
# Both ends carry one name, as NICs on two real hosts usually do (eth1 on
# each), so that one UCX_NET_DEVICES value pins both.
dev_of() { echo "${name}0"; }

case ${1:-} in
up)
	rate=${3:-}
	ip netns add "$name-a"
	ip netns add "$name-b"
	ip link add "${name}a0" type veth peer name "${name}b0"
	for h in a b; do
		ip link set "${name}${h}0" netns "$name-$h"
		ip -n "$name-$h" link set "${name}${h}0" name "$(dev_of $h)"
		ip -n "$name-$h" addr add "$(addr_of $h)/24" dev "$(dev_of $h)"
		ip -n "$name-$h" link set lo up
		ip -n "$name-$h" link set "$(dev_of $h)" up
		if [[ -n $rate ]]; then
			# No netem in this kernel; tbf gives the link a ceiling.
			ip netns exec "$name-$h" tc qdisc add dev "$(dev_of $h)" root tbf rate "$rate" burst 256kb latency 50ms
		fi
	done
	;;
dup)
	# Like docker0: a device on each host with one address on both, which
	# UCX's TCP transport may offer to its peer and then cannot reach.
	# Whether it breaks an unpinned run depends on the order UCX finds
	# devices in (/sys/class/net's, a hash of name and namespace), so it
	# is not certain; UCX_NET_DEVICES=NAME0 always keeps it out.
	for h in a b; do
		# A veth whose peer stays on the same host (no dummy driver here).
		ip -n "$name-$h" link add "${name}d1" type veth peer name "${name}d1p"
		ip -n "$name-$h" addr add "172.31.$octet.1/24" dev "${name}d1"
		ip -n "$name-$h" link set "${name}d1p" up
		ip -n "$name-$h" link set "${name}d1" up
	done
	echo "${name}d1"
	;;
run)
	h=${3:-}
	addr_of "$h" >/dev/null
	shift 3
	shift_args=()
	if [[ ${1:-} == --shift ]]; then
		shift_args=(--time --monotonic "$2")
		shift 2
	fi
	# ip netns exec gives a fresh sysfs (UCX lists the namespace's devices);
	# unshare adds IPC (no shared memory across hosts), PID (nixlctl's
	# same-host check) and time namespaces. --kill-child: the command dies
	# with its caller.
	exec ip netns exec "$name-$h" unshare --ipc --pid --mount-proc --kill-child "${shift_args[@]}" -- "$@"
	;;
addr) addr_of "${3:-}" ;;
dev) addr_of "${3:-}" >/dev/null; dev_of "$3" ;;
down)
	for h in a b; do
		if ip netns pids "$name-$h" >/dev/null 2>&1; then
			ip netns pids "$name-$h" | xargs -r kill -9 2>/dev/null || true
			ip netns del "$name-$h" || true
		fi
	done
	;;
*) die "usage: twohosts.sh up|dup|run|addr|dev|down NAME ..." ;;
esac
