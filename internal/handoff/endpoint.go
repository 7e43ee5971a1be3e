package handoff

import (
	"context"
	"fmt"
	"net"
	"strings"
	"syscall"
	"time"

	"github.com/nixlctl/nixlctl/internal/clocksync"
	"github.com/nixlctl/nixlctl/internal/ctl"
	"github.com/nixlctl/nixlctl/internal/fleet"
	"github.com/nixlctl/nixlctl/internal/runcore"
)

// registration says who put an endpoint's address in the rendezvous: what
// a failure to dial it must name, since the address may be stale.
type registration struct {
	who string // "decode rank 1, registered from host node2 (KEY)"
	// etcd: a killed endpoint's key outlives it by a lease there.
	etcd bool
}

// meet relates the endpoint's clock to the driver's and learns its host.
func (ep *Endpoint) meet(ctx context.Context, role, addr string) error {
	off, host, err := ep.rpc.ClockOffset(ctx, ctl.ClockPings)
	if err != nil {
		return fmt.Errorf("%s endpoint clock: %w", role, err)
	}
	ep.clock, ep.host = off, host
	ep.info = runcore.EndpointInfo{Role: role, Addr: addr, Hostname: host.Hostname, BootID: host.Identity.BootID, Clock: runcore.NewClockOffset(off)}
	return nil
}

// toDriver maps one of the endpoint's stamps onto the driver's clock.
func (ep *Endpoint) toDriver(t int64) int64 { return ep.clock.ToDriver(t) }

// Endpoint is a connection to a prefill or decode endpoint.
type Endpoint struct {
	rpc   *ctl.Client
	clock clocksync.Offset // its clock relative to the driver's
	host  ctl.HostInfo
	info  runcore.EndpointInfo
	// conn is how it was started or reached (nil for a reverse
	// rendezvous member): closing it flushes a child's stderr.
	conn *fleet.Conn
}

// endpointGrace is how long an endpoint may take to close its engine
// (agents, pools) before it is killed.
const endpointGrace = 15 * time.Second

func (ep *Endpoint) close() {
	switch {
	case ep == nil:
	case ep.conn != nil:
		_ = ep.conn.Close(endpointGrace, nil)
	default:
		_ = ep.rpc.Close(endpointGrace, nil)
	}
}

// Signal sends the endpoint process a signal (fault tests, chaos).
func (ep *Endpoint) Signal(sig syscall.Signal) error { return ep.rpc.Signal(sig) }

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
