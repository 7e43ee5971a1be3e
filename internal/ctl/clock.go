package ctl

import (
	"context"
	"fmt"
	"net"
	"os"
	"time"

	"github.com/nixlctl/nixlctl/internal/clocksync"
	"github.com/nixlctl/nixlctl/internal/mono"
)

// The server answers these itself, for every role, so that a driver can
// relate any endpoint's timestamps to its own clock.
const (
	// hostMethod answers HostInfo: which host (and clock) the server runs on.
	hostMethod = "ctl.host"
	// clockMethod answers clockReading: the server's monotonic clock when
	// the request arrived and when the reply left.
	clockMethod = "ctl.clock"
)

// HostInfo is where a server runs: what results record about every
// endpoint, and what decides whether its clock needs an estimate.
type HostInfo struct {
	Hostname string                 `json:"hostname"`
	Identity clocksync.HostIdentity `json:"identity"`
	// Addr is the server's end of the control connection ("" for a child
	// on stdio or a server in this process).
	Addr string `json:"addr,omitempty"`
}

// LocalHostInfo is this process's HostInfo.
func LocalHostInfo() (HostInfo, error) {
	id, err := clocksync.ReadHostIdentity()
	if err != nil {
		return HostInfo{}, err
	}
	name, _ := os.Hostname()
	return HostInfo{Hostname: name, Identity: id}, nil
}

type clockReading struct {
	T1 int64 `json:"t1"`
	T2 int64 `json:"t2"`
}

// answerBuiltin answers the methods every server has; false when m is
// not one of them. It runs on the reading goroutine, not a handler's, so
// that a clock reading waits for nothing.
func (s *Server) answerBuiltin(m Message, received int64) bool {
	switch m.Method {
	case clockMethod:
		s.reply(m.ID, clockReading{T1: received, T2: mono.Now()}, nil)
	case hostMethod:
		h, err := LocalHostInfo()
		if s.local != nil {
			h.Addr = s.local.String()
		}
		s.reply(m.ID, h, err)
	case netstatMethod:
		s.answerNetStat(m.ID)
	default:
		return false
	}
	return true
}

// LocalAddr is the server's end of the connection it serves (nil for
// stdio and in-process servers): an endpoint listening on 0.0.0.0
// advertises the address its driver reached.
func (s *Server) LocalAddr() net.Addr { return s.local }

// Host asks the server where it runs.
func (c *Client) Host(ctx context.Context) (HostInfo, error) {
	var h HostInfo
	err := c.Call(ctx, hostMethod, nil, &h)
	return h, err
}

// ClockPings is how many pings ClockOffset sends: enough that one of them
// meets no queueing on a quiet link, few enough to take milliseconds.
const ClockPings = 16

// ClockOffset relates the server's monotonic clock to this process's:
// exactly zero when both read one clock (one kernel, one time namespace),
// else estimated from pings, the fastest round trip winning.
func (c *Client) ClockOffset(ctx context.Context, pings int) (clocksync.Offset, HostInfo, error) {
	h, err := c.Host(ctx)
	if err != nil {
		return clocksync.Offset{}, h, fmt.Errorf("host: %w", err)
	}
	me, err := LocalHostInfo()
	if err != nil {
		return clocksync.Offset{}, h, err
	}
	if clocksync.SameClock(me.Identity, h.Identity) {
		return clocksync.SameClockOffset(), h, nil
	}
	samples := make([]clocksync.Sample, 0, pings)
	for range pings {
		var r clockReading
		t0 := mono.Now()
		if err := c.Call(ctx, clockMethod, nil, &r); err != nil {
			return clocksync.Offset{}, h, fmt.Errorf("clock ping: %w", err)
		}
		t3 := mono.Now()
		samples = append(samples, clocksync.Sample{T0: t0, T1: r.T1, T2: r.T2, T3: t3})
		// Spaced a little, so that one burst of load does not spoil them all.
		time.Sleep(200 * time.Microsecond)
	}
	off, err := clocksync.Estimate(samples)
	return off, h, err
}
