package lease

import (
	"container/heap"
	"errors"
	"fmt"
	"sort"
	"strings"
	"time"
)

// The KV lease protocol (vLLM PR #41383) as plain state machines: a
// Table on prefill and a HeartbeatTracker on decode. Neither reads a
// clock: every method takes "now" in nanoseconds of whatever clock the
// caller runs on (CLOCK_MONOTONIC in the endpoints, a virtual clock in the
// simulator and the unit tests), so the same code runs in both.

// Policy is how prefill decides that a finished request's blocks
// will never be read.
type Policy string

// Policies.
const (
	// PolicyLease: a short initial lease that decode's heartbeats extend.
	PolicyLease Policy = "lease"
	// PolicyFixed: one fixed timeout and no heartbeats, as before the lease
	// (VLLM_NIXL_ABORT_REQUEST_TIMEOUT, 480 s).
	PolicyFixed Policy = "fixed"
)

// ReaperMode is how prefill scans its lease table for expired entries.
type ReaperMode string

// Reaper modes.
const (
	// ReapFull looks at every entry each step.
	ReapFull ReaperMode = "full"
	// ReapHeadOnly walks the table in insertion order and stops at the
	// first entry that has not expired, as vLLM did before PR #50789:
	// expired leases behind a renewed one are never freed (issue #58222).
	ReapHeadOnly ReaperMode = "head-only"
)

// Defaults, as vLLM ships them.
const (
	DefaultDuration     = 30 * time.Second
	DefaultFixedTimeout = 480 * time.Second
)

// MaxDuration bounds the lease and the fixed timeout. Plans and the
// simulator's horizon are small multiples of them in int64 nanoseconds; a
// month is far beyond any deployment and far from wrapping.
const MaxDuration = 30 * 24 * time.Hour

// Config configures both sides of the protocol.
type Config struct {
	Policy Policy `json:"policy"`
	// Duration is kv_lease_duration: the initial lease; heartbeats go out
	// every Duration/6 and extend a lease to now + Duration*2/3.
	Duration time.Duration `json:"duration"`
	// Timeout is the fixed policy's only timeout.
	Timeout time.Duration `json:"timeout"`
	Reaper  ReaperMode    `json:"reaper"`
}

// Normalize fills defaults and checks the values.
func (c Config) Normalize() (Config, error) {
	if c.Policy == "" {
		c.Policy = PolicyLease
	}
	if c.Reaper == "" {
		c.Reaper = ReapFull
	}
	if c.Duration == 0 {
		c.Duration = DefaultDuration
	}
	if c.Timeout == 0 {
		c.Timeout = DefaultFixedTimeout
	}
	var errs []error
	switch c.Policy {
	case PolicyLease, PolicyFixed:
	default:
		errs = append(errs, fmt.Errorf("lease policy %q: want lease or fixed", c.Policy))
	}
	switch c.Reaper {
	case ReapFull, ReapHeadOnly:
	default:
		errs = append(errs, fmt.Errorf("reaper %q: want full or head-only", c.Reaper))
	}
	if c.Duration < 6*time.Millisecond {
		errs = append(errs, fmt.Errorf("lease duration %v: want at least 6ms (heartbeats go out every sixth of it)", c.Duration))
	}
	if c.Timeout < time.Millisecond {
		errs = append(errs, fmt.Errorf("fixed timeout %v: want at least 1ms", c.Timeout))
	}
	if c.Duration > MaxDuration {
		errs = append(errs, fmt.Errorf("lease duration %v: want at most %v", c.Duration, MaxDuration))
	}
	if c.Timeout > MaxDuration {
		errs = append(errs, fmt.Errorf("fixed timeout %v: want at most %v", c.Timeout, MaxDuration))
	}
	return c, errors.Join(errs...)
}

// Initial is how long a fresh lease lasts.
func (c Config) Initial() time.Duration {
	if c.Policy == PolicyFixed {
		return c.Timeout
	}
	return c.Duration
}

// Extension is how far past its arrival a heartbeat extends a lease
// (vLLM: duration * 2 // 3); the fixed policy has none.
func (c Config) Extension() time.Duration {
	if c.Policy == PolicyFixed {
		return 0
	}
	return c.Duration * 2 / 3
}

// HeartbeatInterval is how often decode heartbeats each prefill engine
// (vLLM: duration // 6); 0 under the fixed policy, which has none. vLLM
// divides whole seconds; this divides nanoseconds, so compressed leases
// (3 s) keep the same ratios.
func (c Config) HeartbeatInterval() time.Duration {
	if c.Policy == PolicyFixed {
		return 0
	}
	return c.Duration / 6
}

// Lease is one finished request's hold on its blocks.
type Lease struct {
	ID        string
	Bytes     int64 // what the blocks weigh (for dead GB·s)
	Granted   int64 // ns
	Deadline  int64 // ns; expired when now >= Deadline
	LastRenew int64 // ns of the last heartbeat that named it (0: none)
	Renewals  int
	// Pinned leases are not reaped (a WRITE from their blocks is in
	// flight); they are looked at again after they are unpinned.
	Pinned bool

	seq        uint64
	heapIdx    int
	prev, next *Lease
}

// Stats counts what a table did.
type Stats struct {
	Granted         int64 `json:"granted"`
	Released        int64 `json:"released"`
	Expired         int64 `json:"expired"`
	HeartbeatIDs    int64 `json:"heartbeat_ids"`    // ids named by heartbeats
	Renewed         int64 `json:"renewed"`          // of those, leases extended
	UnknownRenewals int64 `json:"unknown_renewals"` // ids not in the table (late, freed, foreign)
	IgnoredRenewals int64 `json:"ignored_renewals"` // heartbeats under the fixed policy
}

// Table is prefill's table of finished requests waiting for their
// consumers. It is not safe for concurrent use: the endpoint holds its
// lock around it; the simulator is single-threaded.
type Table struct {
	cfg        Config
	byID       map[string]*Lease
	head, tail *Lease // insertion order
	byDeadline leaseHeap
	seq        uint64
	heldBytes  int64
	stats      Stats
}

// NewTable makes an empty table; cfg must be normalized.
func NewTable(cfg Config) *Table {
	return &Table{cfg: cfg, byID: map[string]*Lease{}}
}

// Len is the number of leases held.
func (t *Table) Len() int { return len(t.byID) }

// Stats returns the counters.
func (t *Table) Stats() Stats { return t.stats }

// Grant starts a lease when prefill finishes a request. Granting an id
// that is held already restarts that lease.
func (t *Table) Grant(id string, bytes int64, now int64) *Lease {
	if old, ok := t.byID[id]; ok {
		t.remove(old)
	}
	t.seq++
	l := &Lease{ID: id, Bytes: bytes, Granted: now, Deadline: now + int64(t.cfg.Initial()), seq: t.seq}
	t.byID[id] = l
	if t.tail == nil {
		t.head, t.tail = l, l
	} else {
		l.prev, t.tail.next, t.tail = t.tail, l, l
	}
	heap.Push(&t.byDeadline, l)
	t.heldBytes += bytes
	t.stats.Granted++
	return l
}

// Renew applies one heartbeat: each named lease is extended to at least
// now + the extension, never shortened. Unknown ids are ignored (counted);
// the fixed policy ignores heartbeats altogether. It reports how many
// leases were extended.
func (t *Table) Renew(ids []string, now int64) int {
	t.stats.HeartbeatIDs += int64(len(ids))
	if t.cfg.Policy == PolicyFixed {
		t.stats.IgnoredRenewals += int64(len(ids))
		return 0
	}
	ext := now + int64(t.cfg.Extension())
	n := 0
	for _, id := range ids {
		l, ok := t.byID[id]
		if !ok {
			t.stats.UnknownRenewals++
			continue
		}
		l.LastRenew = max(l.LastRenew, now)
		l.Renewals++
		if ext > l.Deadline {
			l.Deadline = ext
			heap.Fix(&t.byDeadline, l.heapIdx)
			n++
		}
	}
	t.stats.Renewed += int64(n)
	return n
}

// Release ends a lease because its consumers are done (or the request
// failed for good); it returns the lease, or false for an unknown id.
func (t *Table) Release(id string) (*Lease, bool) {
	l, ok := t.byID[id]
	if !ok {
		return nil, false
	}
	t.remove(l)
	t.stats.Released++
	return l, true
}

// Pin keeps a lease from being reaped (or lets it be again).
func (t *Table) Pin(id string, pinned bool) {
	if l, ok := t.byID[id]; ok {
		l.Pinned = pinned
	}
}

// Reap removes and returns the leases that expired by now, as one engine
// step's reaper does: every expired one (full), or those before the first
// unexpired one in insertion order (head-only).
func (t *Table) Reap(now int64) []*Lease {
	var out []*Lease
	if t.cfg.Reaper == ReapHeadOnly {
		for l := t.head; l != nil; {
			next := l.next
			if now < l.Deadline {
				break
			}
			if !l.Pinned {
				t.remove(l)
				out = append(out, l)
			}
			l = next
		}
	} else {
		var pinned []*Lease
		for len(t.byDeadline) > 0 && t.byDeadline[0].Deadline <= now {
			l := heap.Pop(&t.byDeadline).(*Lease)
			if l.Pinned {
				pinned = append(pinned, l)
				continue
			}
			t.unlink(l)
			out = append(out, l)
		}
		for _, l := range pinned {
			heap.Push(&t.byDeadline, l)
		}
	}
	t.stats.Expired += int64(len(out))
	return out
}

// ExpiredHeld counts the leases past their deadline that are still held
// (and what they weigh): 0 with the full reaper right after a step; the
// head-only reaper's leak shows up here. When the earliest deadline is
// still ahead (every step of a healthy table) it answers without a scan.
func (t *Table) ExpiredHeld(now int64) (n int, bytes int64) {
	if len(t.byDeadline) == 0 || t.byDeadline[0].Deadline > now {
		return 0, 0
	}
	for _, l := range t.byID {
		if now >= l.Deadline && !l.Pinned {
			n++
			bytes += l.Bytes
		}
	}
	return n, bytes
}

// NextDeadline is the earliest deadline held (false when empty), for a
// simulator that wakes the reaper only when something can expire.
func (t *Table) NextDeadline() (int64, bool) {
	if len(t.byDeadline) == 0 {
		return 0, false
	}
	return t.byDeadline[0].Deadline, true
}

// HeldBytes is what the held leases weigh.
func (t *Table) HeldBytes() int64 { return t.heldBytes }

func (t *Table) remove(l *Lease) {
	heap.Remove(&t.byDeadline, l.heapIdx)
	t.unlink(l)
}

func (t *Table) unlink(l *Lease) {
	delete(t.byID, l.ID)
	t.heldBytes -= l.Bytes
	if l.prev != nil {
		l.prev.next = l.next
	} else {
		t.head = l.next
	}
	if l.next != nil {
		l.next.prev = l.prev
	} else {
		t.tail = l.prev
	}
	l.prev, l.next = nil, nil
}

// leaseHeap orders leases by deadline, then by grant order.
type leaseHeap []*Lease

func (h leaseHeap) Len() int { return len(h) }
func (h leaseHeap) Less(i, j int) bool {
	return h[i].Deadline < h[j].Deadline || h[i].Deadline == h[j].Deadline && h[i].seq < h[j].seq
}
func (h leaseHeap) Swap(i, j int) {
	h[i], h[j] = h[j], h[i]
	h[i].heapIdx, h[j].heapIdx = i, j
}
func (h *leaseHeap) Push(x any) {
	l := x.(*Lease)
	l.heapIdx = len(*h)
	*h = append(*h, l)
}
func (h *leaseHeap) Pop() any {
	old := *h
	l := old[len(old)-1]
	old[len(old)-1] = nil
	*h = old[:len(old)-1]
	l.heapIdx = -1
	return l
}

// HeartbeatTarget is a prefill engine decode heartbeats: where its side
// channel is and how many ranks it has (every pp x tp rank gets each
// heartbeat).
type HeartbeatTarget struct {
	EngineID string `json:"engine_id"`
	Endpoint string `json:"endpoint"` // side channel, tcp://host:port
	TPSize   int    `json:"tp_size"`
	PPSize   int    `json:"pp_size,omitempty"` // pipeline stages (0: 1)
}

// HeartbeatBatch is one heartbeat: the prefill-side ids of every request
// decode still waits for from one engine.
type HeartbeatBatch struct {
	Target HeartbeatTarget
	IDs    []string
}

// Message is the notification: "HB:" and the ids, comma-separated.
func (b HeartbeatBatch) Message() []byte {
	return []byte("HB:" + strings.Join(b.IDs, ","))
}

// ParseHeartbeat splits a heartbeat notification into its ids; ok is false
// when msg is not one. Empty ids (",,") are dropped.
func ParseHeartbeat(msg string) (ids []string, ok bool) {
	rest, ok := strings.CutPrefix(msg, "HB:")
	if !ok {
		return nil, false
	}
	for _, id := range strings.Split(rest, ",") {
		if id != "" {
			ids = append(ids, id)
		}
	}
	return ids, true
}

type hbEngine struct {
	target HeartbeatTarget
	ids    map[string]uint64 // remote id -> tracking order
}

type hbRef struct {
	engine, remote string
}

// HeartbeatTracker is decode's side: the requests it waits for, grouped by
// prefill engine, tracked from the moment they arrive (not when they are
// scheduled) until their KV is in or they end; Due hands out one batch
// per engine at most every interval. Not safe for concurrent use.
type HeartbeatTracker struct {
	interval time.Duration
	engines  map[string]*hbEngine
	local    map[string]hbRef
	seq      uint64
	last     int64
	emitted  bool
}

// NewHeartbeatTracker tracks with the given interval; 0 disables
// heartbeats (the fixed policy): Track still records, Due returns nothing.
func NewHeartbeatTracker(interval time.Duration) *HeartbeatTracker {
	return &HeartbeatTracker{interval: interval, engines: map[string]*hbEngine{}, local: map[string]hbRef{}}
}

// Track starts heartbeating remoteID at target on behalf of the local
// request localID. Tracking a local id again moves it.
func (t *HeartbeatTracker) Track(localID string, target HeartbeatTarget, remoteID string) {
	t.Stop(localID)
	e := t.engines[target.EngineID]
	if e == nil {
		e = &hbEngine{target: target, ids: map[string]uint64{}}
		t.engines[target.EngineID] = e
	}
	e.target = target
	t.seq++
	e.ids[remoteID] = t.seq
	t.local[localID] = hbRef{target.EngineID, remoteID}
}

// Stop ends tracking of a local request (KV received, aborted, failed);
// false when it was not tracked.
func (t *HeartbeatTracker) Stop(localID string) bool {
	ref, ok := t.local[localID]
	if !ok {
		return false
	}
	delete(t.local, localID)
	if e := t.engines[ref.engine]; e != nil {
		delete(e.ids, ref.remote)
		if len(e.ids) == 0 {
			delete(t.engines, ref.engine)
		}
	}
	return true
}

// Retry lets the next Due emit at once: decode could not send the last
// batch (no handshake with the engine yet) and sends it a step later,
// once the handshake it started is done.
func (t *HeartbeatTracker) Retry() { t.emitted = false }

// Tracked is the number of requests being heartbeated.
func (t *HeartbeatTracker) Tracked() int { return len(t.local) }

// Due returns the heartbeats to send now: one batch per engine with
// tracked requests (ids in tracking order, engines by id), or nothing
// when the last batch went out less than an interval ago, nothing is
// tracked, or heartbeats are off.
func (t *HeartbeatTracker) Due(now int64) []HeartbeatBatch {
	if t.interval <= 0 || len(t.engines) == 0 {
		return nil
	}
	if t.emitted && now-t.last < int64(t.interval) {
		return nil
	}
	t.last, t.emitted = now, true
	out := make([]HeartbeatBatch, 0, len(t.engines))
	for _, e := range t.engines {
		b := HeartbeatBatch{Target: e.target, IDs: make([]string, 0, len(e.ids))}
		for id := range e.ids {
			b.IDs = append(b.IDs, id)
		}
		sort.Slice(b.IDs, func(i, j int) bool { return e.ids[b.IDs[i]] < e.ids[b.IDs[j]] })
		out = append(out, b)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Target.EngineID < out[j].Target.EngineID })
	return out
}
