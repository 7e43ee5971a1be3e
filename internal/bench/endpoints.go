package bench

import (
	"context"
	"fmt"
	"net"
	"regexp"
	"strings"
	"time"

	"github.com/nixlctl/nixlctl/internal/clocksync"
	"github.com/nixlctl/nixlctl/internal/ctl"
)

// EndpointInfo is where one endpoint ran and how its clock was related to
// the driver's: what a result needs to be read across hosts.
type EndpointInfo struct {
	Role     string `json:"role"`
	Addr     string `json:"addr,omitempty"` // its control address; "" for a child of the driver
	Hostname string `json:"hostname"`
	BootID   string `json:"boot_id"`
	// Clock is how its CLOCK_MONOTONIC relates to the driver's; its stamps
	// were moved onto the driver's clock by it before any subtraction.
	Clock ClockOffset `json:"clock"`
	// SideChannel is the address it advertised to its peer.
	SideChannel string `json:"side_channel,omitempty"`
}

// ClockOffset is clocksync.Offset as a result records it.
type ClockOffset struct {
	// SameClock: one kernel and time namespace, offset exactly 0.
	SameClock     bool   `json:"same_clock"`
	OffsetNS      int64  `json:"offset_ns"`
	UncertaintyNS int64  `json:"uncertainty_ns"`
	RTTNS         int64  `json:"rtt_ns,omitempty"`
	Samples       int    `json:"samples,omitempty"`
	Text          string `json:"text"`
}

func clockOffset(o clocksync.Offset) ClockOffset {
	return ClockOffset{SameClock: o.SameClock, OffsetNS: o.Nanos, UncertaintyNS: int64(o.Uncertainty), RTTNS: int64(o.RTT),
		Samples: o.Samples, Text: o.String()}
}

// Placements of two endpoints.
const (
	PlacementOneHost    = "one host"
	PlacementNamespaces = "one kernel, separate namespaces"
	PlacementCrossHost  = "cross-host"
)

// placement says whether a run crossed hosts. Two ends on one kernel are
// never called cross-host, even in separate namespaces (how tests stage
// two hosts): the bytes did not leave the machine.
func placement(a, b ctl.HostInfo) string {
	switch {
	case clocksync.SameHost(a.Identity, b.Identity):
		return PlacementOneHost
	case a.Identity.BootID != "" && a.Identity.BootID == b.Identity.BootID:
		return PlacementNamespaces
	}
	return PlacementCrossHost
}

// meet relates the endpoint's clock to the driver's and learns its host.
func (ep *Endpoint) meet(ctx context.Context, role, addr string) error {
	off, host, err := ep.rpc.ClockOffset(ctx, ctl.ClockPings)
	if err != nil {
		return fmt.Errorf("%s endpoint clock: %w", role, err)
	}
	ep.clock, ep.host = off, host
	ep.info = EndpointInfo{Role: role, Addr: addr, Hostname: host.Hostname, BootID: host.Identity.BootID, Clock: clockOffset(off)}
	return nil
}

// toDriver maps one of the endpoint's stamps onto the driver's clock.
func (ep *Endpoint) toDriver(t int64) int64 { return ep.clock.ToDriver(t) }

// localHostFor is the address by which this host reaches a remote
// endpoint: where a local child must bind and what it must advertise so
// that the remote one can reach it back. "" when ep is local.
func localHostFor(eps ...*Endpoint) string {
	for _, ep := range eps {
		if ep == nil {
			continue
		}
		if a, ok := ep.rpc.LocalAddr().(*net.TCPAddr); ok {
			return a.IP.String()
		}
	}
	return ""
}

// sideChannelDial is how long the driver waits to reach an advertised
// side channel before it calls the address unreachable.
const sideChannelDial = 3 * time.Second

// checkReachable dials each address an endpoint advertised. A wrong
// --advertise otherwise shows up as every request timing out in a
// handshake; here it fails before the run, naming the address.
func checkReachable(ctx context.Context, role string, addrs ...string) error {
	for _, a := range addrs {
		if a == "" {
			continue
		}
		hp := strings.TrimPrefix(strings.TrimPrefix(a, "tcp://"), "http://")
		dctx, cancel := context.WithTimeout(ctx, sideChannelDial)
		var d net.Dialer
		conn, err := d.DialContext(dctx, "tcp", hp)
		cancel()
		if err != nil {
			return fmt.Errorf("%s advertises %s, which this driver cannot reach (%v): run its serve with --advertise set to an address of its host that the peers can reach", role, a, err)
		}
		conn.Close()
	}
	return nil
}

// checkLoopbackAdvert refuses an advertised address that is loopback when
// an endpoint that must dial it runs on another host. The driver's own
// reachability check cannot see this: the driver may share the advertiser's
// host, dial 127.0.0.1 happily, and pass a run in which every request then
// fails in its handshake ("no reply within 5s").
func checkLoopbackAdvert(role string, adv *Endpoint, addr string, dialers []*Endpoint) error {
	host := advertHost(addr)
	if host == "" || !isLoopbackHost(host) {
		return nil
	}
	for _, d := range dialers {
		if d == nil || clocksync.SameHost(adv.host.Identity, d.host.Identity) {
			continue
		}
		where := d.info.Role
		if d.info.Hostname != "" {
			where += " on " + d.info.Hostname
		}
		return fmt.Errorf("%s advertises %s, a loopback address, but %s runs on another host and would dial its own loopback: give %s an address its peers can reach (serve --listen/--advertise with the host's IP, not 127.0.0.1 or localhost)",
			role, addr, where, role)
	}
	return nil
}

// advertHost is the host part of an advertised address ("tcp://h:p",
// "http://h:p" or "h:p"); "" when it has none.
func advertHost(addr string) string {
	hp := strings.TrimPrefix(strings.TrimPrefix(addr, "tcp://"), "http://")
	if i := strings.IndexByte(hp, '/'); i >= 0 {
		hp = hp[:i]
	}
	h, _, err := net.SplitHostPort(hp)
	if err != nil {
		return ""
	}
	return h
}

// isLoopbackHost: 127.0.0.0/8, ::1 or the name localhost.
func isLoopbackHost(h string) bool {
	if strings.EqualFold(h, "localhost") || strings.HasSuffix(strings.ToLower(h), ".localhost") {
		return true
	}
	ip := net.ParseIP(h)
	return ip != nil && ip.IsLoopback()
}

// describePeer records where a run's one remote process (bench xfer's
// target, bench ec's encoder) and this driver ran, and whether that was one
// host. Times of those runs come from the driver's side alone, so no clock
// is estimated; a failure to ask costs the record, not the run.
func describePeer(ctx context.Context, role, addr string, c *ctl.Client) ([]EndpointInfo, string) {
	me, err := ctl.LocalHostInfo()
	if err != nil {
		return nil, ""
	}
	hctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	peer, err := c.Host(hctx)
	if err != nil {
		return nil, ""
	}
	self := EndpointInfo{Role: "driver", Hostname: me.Hostname, BootID: me.Identity.BootID, Clock: clockOffset(clocksync.SameClockOffset())}
	other := EndpointInfo{Role: role, Addr: addr, Hostname: peer.Hostname, BootID: peer.Identity.BootID}
	other.Clock.SameClock = clocksync.SameClock(me.Identity, peer.Identity)
	return []EndpointInfo{self, other}, placement(me, peer)
}

// unreachable matches the errors of a path that does not reach the peer:
// UCX's UCS_ERR_UNREACHABLE and the kernel's.
var unreachable = regexp.MustCompile(`(?i)destination is unreachable|no route to host|network is unreachable`)

// unreachableFailures counts the failed requests whose reason's example
// says the path did not reach the peer.
func unreachableFailures(s HandoffSummary) int {
	n := 0
	for reason, k := range s.FailuresByReason {
		if unreachable.MatchString(s.FailureExamples[reason]) {
			n += k
		}
	}
	return n
}

// unreachableWarning explains failures whose path did not reach the peer:
// on a host with a second network device UCX may pick it, and every request
// fails with nothing but "Destination is unreachable" in its records. It
// names the device this host routes each remote peer through (route) and
// the flag that pins it.
func unreachableWarning(s HandoffSummary, netDevices string, eps []EndpointInfo, route func(ip string) (string, error)) string {
	n, first := unreachableFailures(s), ""
	for _, reason := range reasonOrder(s.FailuresByReason) {
		if ex := s.FailureExamples[reason]; unreachable.MatchString(ex) && first == "" {
			first = ex
		}
	}
	if n == 0 {
		return ""
	}
	if netDevices != "" {
		return fmt.Sprintf("%d requests failed as unreachable (first: %q) with --net-devices %s: the pinned device does not reach the peers", n, first, netDevices)
	}
	var via []string
	seen := map[string]bool{}
	for _, ep := range eps {
		h := advertHost(ep.SideChannel)
		if ip := net.ParseIP(h); ip == nil || ip.IsLoopback() || seen[h] {
			continue
		}
		seen[h] = true
		if dev, err := route(h); err == nil {
			via = append(via, fmt.Sprintf("%s through %s", h, dev))
		}
	}
	hint := "pin the device that reaches the peers with --net-devices (nixlctl probe env lists what UCX sees)"
	if len(via) > 0 {
		hint += "; this host reaches " + strings.Join(via, ", ")
	}
	return fmt.Sprintf("%d requests failed as unreachable (first: %q): UCX used a network device that does not reach the peer, as happens on hosts with a second interface (a docker or libvirt bridge); %s", n, first, hint)
}
