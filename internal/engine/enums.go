package engine

import (
	"fmt"
	"slices"

	"github.com/nixlctl/nixlctl/internal/enum"
)

// The engine's enumerations parse themselves (encoding.TextUnmarshaler),
// so a flag, an environment variable, a config file and a JSON RPC all
// reject an unknown value the same way, naming the valid ones.

// Protocol is how KV moves from prefill to decode.
type Protocol string

// Protocols lists the valid protocols.
var Protocols = []Protocol{ProtoPull, ProtoPush, ProtoSGLang}

func (p Protocol) String() string { return string(p) }

// UnmarshalText accepts pull, push or sglang.
func (p *Protocol) UnmarshalText(b []byte) error { return enum.Parse(p, "protocol", b, Protocols) }

// Valid reports whether p is one of Protocols.
func (p Protocol) Valid() bool { return slices.Contains(Protocols, p) }

// Role is an endpoint's part in a handoff.
type Role string

// Roles lists the valid roles.
var Roles = []Role{RolePrefill, RoleDecode}

func (r Role) String() string { return string(r) }

// UnmarshalText accepts prefill or decode.
func (r *Role) UnmarshalText(b []byte) error { return enum.Parse(r, "role", b, Roles) }

// Valid reports whether r is one of Roles.
func (r Role) Valid() bool { return slices.Contains(Roles, r) }

// Verifies lists the valid verification depths.
var Verifies = []Verify{Sparse, Full}

func (v Verify) String() string {
	switch v {
	case Sparse:
		return "sparse"
	case Full:
		return "full"
	}
	return fmt.Sprintf("Verify(%d)", int(v))
}

// MarshalText writes the name, so configs and results read "sparse", not 0.
func (v Verify) MarshalText() ([]byte, error) {
	if !slices.Contains(Verifies, v) {
		return nil, fmt.Errorf("unknown verify mode %d", int(v))
	}
	return []byte(v.String()), nil
}

// UnmarshalText accepts sparse or full.
func (v *Verify) UnmarshalText(b []byte) error { return enum.Parse(v, "verify mode", b, Verifies) }

// Fragmentation is how the block allocator places a request's blocks.
type Fragmentation string

// Fragmentations.
const (
	// FragContiguous allocates first-fit, so descriptors merge.
	FragContiguous Fragmentation = "contiguous"
	// FragScattered places blocks at random, so descriptors cannot merge.
	FragScattered Fragmentation = "scattered"
)

// Fragmentations lists the valid fragmentations.
var Fragmentations = []Fragmentation{FragContiguous, FragScattered}

func (f Fragmentation) String() string { return string(f) }

// UnmarshalText accepts contiguous or scattered.
func (f *Fragmentation) UnmarshalText(b []byte) error {
	return enum.Parse(f, "fragmentation", b, Fragmentations)
}

// Valid reports whether f is one of Fragmentations.
func (f Fragmentation) Valid() bool { return slices.Contains(Fragmentations, f) }

// DRAMAlloc is how a DRAM pool is allocated: mmap (as an engine allocates
// its own pool, 4 KiB pages), thp (the same advised for transparent huge
// pages, as PyTorch allocates with C10_THP_MEM_ALLOC_ENABLE=1 or on a
// host whose THP mode is "always") or by the transfer backend
// (UCX-allocated memory).
type DRAMAlloc string

// DRAM allocations.
const (
	AllocMmap DRAMAlloc = "mmap"
	AllocTHP  DRAMAlloc = "thp"
	AllocUCX  DRAMAlloc = "ucx"
)

// DRAMAllocs lists the valid allocations.
var DRAMAllocs = []DRAMAlloc{AllocMmap, AllocTHP, AllocUCX}

func (a DRAMAlloc) String() string { return string(a) }

// DRAMAllocChoices lists the valid allocations for error messages.
func DRAMAllocChoices() string { return enum.Names(DRAMAllocs) }

// UnmarshalText accepts mmap, thp or ucx; empty is the zero value, which the
// allocator takes as mmap (a Config that never set it still decodes).
func (a *DRAMAlloc) UnmarshalText(b []byte) error {
	if len(b) == 0 {
		*a = ""
		return nil
	}
	return enum.Parse(a, "DRAM allocation", b, DRAMAllocs)
}

// Valid reports whether a is one of DRAMAllocs.
func (a DRAMAlloc) Valid() bool { return slices.Contains(DRAMAllocs, a) }

// FreedReason says why prefill released a request's blocks (FreedEvent).
type FreedReason string

// Freed reasons.
const (
	FreedConsumed FreedReason = "consumed" // every consumer read them (pull)
	FreedExpired  FreedReason = "expired"  // the lease ran out first
	FreedPushed   FreedReason = "pushed"   // prefill's WRITEs into decode finished (push)
	FreedFailed   FreedReason = "failed"   // the transfer failed
)

// FreedReasons lists the valid reasons.
var FreedReasons = []FreedReason{FreedConsumed, FreedExpired, FreedPushed, FreedFailed}

func (r FreedReason) String() string { return string(r) }

// UnmarshalText accepts the FreedReasons.
func (r *FreedReason) UnmarshalText(b []byte) error {
	return enum.Parse(r, "freed reason", b, FreedReasons)
}

// Valid reports whether r is one of FreedReasons.
func (r FreedReason) Valid() bool { return slices.Contains(FreedReasons, r) }

// Consumed reports whether the blocks went where they were meant to (read
// by decode, or written into it), as opposed to expiring or failing.
func (r FreedReason) Consumed() bool { return r == FreedConsumed || r == FreedPushed }

// HeartbeatKeys is what push mode's lease heartbeats are keyed by.
//
// Upstream (vLLM's NixlPushConnector, vLLM issue #53095): decode only
// knows the router's request id, so it heartbeats that, while prefill
// leases its own suffixed id ("<router id>-<8 hex>") and looks heartbeat
// ids up exactly: the heartbeats never renew a lease. Fixed (what vLLM PR
// #53244 proposes): decode heartbeats its own request id, as PUSH_REG
// does, and prefill matches it by base id (the suffix stripped), so they
// renew. Pull mode is unaffected: decode heartbeats prefill's exact id.
type HeartbeatKeys string

// Heartbeat keyings.
const (
	HBKeysUpstream HeartbeatKeys = "upstream"
	HBKeysFixed    HeartbeatKeys = "fixed"
)

// HeartbeatKeyings lists the valid keyings.
var HeartbeatKeyings = []HeartbeatKeys{HBKeysUpstream, HBKeysFixed}

func (k HeartbeatKeys) String() string { return string(k) }

// UnmarshalText accepts upstream or fixed.
func (k *HeartbeatKeys) UnmarshalText(b []byte) error {
	return enum.Parse(k, "push heartbeat keys", b, HeartbeatKeyings)
}

// Valid reports whether k is one of HeartbeatKeyings.
func (k HeartbeatKeys) Valid() bool { return slices.Contains(HeartbeatKeyings, k) }

// WatchdogAction is what push mode's decode-side registration watchdog
// does when it fires.
//
// Drop is upstream's (vLLM's push_registration_timeout): the
// registration is dropped and a warning logged; the request is neither
// failed nor finished, so it keeps waiting for its WRITEs (a late one
// still completes it). Fail ends the request with an error.
type WatchdogAction string

// Watchdog actions.
const (
	WatchdogDrop WatchdogAction = "drop"
	WatchdogFail WatchdogAction = "fail"
)

// WatchdogActions lists the valid actions.
var WatchdogActions = []WatchdogAction{WatchdogDrop, WatchdogFail}

func (a WatchdogAction) String() string { return string(a) }

// UnmarshalText accepts drop or fail.
func (a *WatchdogAction) UnmarshalText(b []byte) error {
	return enum.Parse(a, "registration watchdog action", b, WatchdogActions)
}

// Valid reports whether a is one of WatchdogActions.
func (a WatchdogAction) Valid() bool { return slices.Contains(WatchdogActions, a) }
