package runcore

import (
	"context"
	"strings"
	"time"

	"github.com/nixlctl/nixlctl/internal/clocksync"
	"github.com/nixlctl/nixlctl/internal/ctl"
	"github.com/nixlctl/nixlctl/internal/report"
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
	// PID is its process id, where it said: on the driver's host, its CPU
	// time is the run's own, not a neighbour's (hostload).
	PID int `json:"pid,omitempty"`
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

// NewClockOffset is o as a result records it.
func NewClockOffset(o clocksync.Offset) ClockOffset {
	return ClockOffset{SameClock: o.SameClock, OffsetNS: o.Nanos, UncertaintyNS: int64(o.Uncertainty), RTTNS: int64(o.RTT),
		Samples: o.Samples, Text: o.String()}
}

// Placement says whether a run crossed hosts. Two ends on one kernel are
// never called cross-host, even in separate namespaces (how tests stage
// two hosts): the bytes did not leave the machine.
func Placement(a, b ctl.HostInfo) string {
	switch {
	case clocksync.SameHost(a.Identity, b.Identity):
		return PlacementOneHost
	case a.Identity.BootID != "" && a.Identity.BootID == b.Identity.BootID:
		return PlacementNamespaces
	}
	return PlacementCrossHost
}

// DescribePeer records where a run's one remote process (bench xfer's
// target, bench ec's encoder) and this driver ran, and whether that was one
// host. Times of those runs come from the driver's side alone, so no clock
// is estimated; a failure to ask costs the record, not the run.
func DescribePeer(ctx context.Context, role, addr string, c *ctl.Client) ([]EndpointInfo, string) {
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
	self := EndpointInfo{Role: "driver", Hostname: me.Hostname, BootID: me.Identity.BootID, Clock: NewClockOffset(clocksync.SameClockOffset())}
	other := EndpointInfo{Role: role, Addr: addr, Hostname: peer.Hostname, BootID: peer.Identity.BootID}
	other.Clock.SameClock = clocksync.SameClock(me.Identity, peer.Identity)
	return []EndpointInfo{self, other}, Placement(me, peer)
}

// Placements of two endpoints.
const (
	PlacementOneHost    = "one host"
	PlacementNamespaces = "one kernel, separate namespaces"
	PlacementCrossHost  = "cross-host"
)

// RecordBackend says in a result which transfer backend ran, and which
// UCX when it is nixlctl's own layer over it.
func RecordBackend(m *report.Meta, name, version string) {
	m.Env.Backend, m.Env.BackendVersion = name, version
	if name == "ucx" {
		m.Env.UCX = version
	}
}

// DecodeHist decodes an encoded histogram; an empty string is no
// histogram (results from before histograms were kept).
func DecodeHist(s string) (*report.Histogram, error) {
	if s == "" {
		return nil, nil
	}
	return report.DecodeHistogram(s)
}

// SoftwareRMAWarning explains a transport line that says UCX emulates RMA
// over shared-memory active messages (the ucx backend on UCX 1.13 between
// two processes on plain mmap'd memory, as vLLM allocates it): "" for any
// other path, and for TCP, which has its own warning.
func SoftwareRMAWarning(transport, measure string) string {
	if !strings.Contains(transport, "emulated over active messages") || strings.Contains(transport, "emulated over active messages on tcp") {
		return ""
	}
	return "software RMA: UCX copies every byte through its shared-memory active messages on both sides (protocols v1, UCX 1.13's default, " +
		"serve put/get only on rma lanes, and cma offers only zero-copy, so it is never one: src/ucp/wireup/select.c); " +
		"a NIXL engine on this UCX does the same. UCX 1.14 and later with UCX_PROTO_ENABLE=y (the default from 1.16) put and get zero-copy over cma; " +
		measure
}
