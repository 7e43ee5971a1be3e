package rendezvous

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Roster is who the driver waits for.
type Roster struct {
	// Run is the run id every hello must carry (etcd: the key namespace,
	// so it must not be empty there).
	Run string
	// Ranks lists each role's ranks; together they are the world, so each
	// hello's world size must be their count.
	Ranks map[string][]int
}

// PrefillDecode is the usual roster: prefill ranks 0..prefill-1, then
// decode ranks prefill..prefill+decode-1 (an Indexed Job of 2: index 0
// prefill, index 1 decode).
func PrefillDecode(run string, prefill, decode int) Roster {
	r := Roster{Run: run, Ranks: map[string][]int{}}
	for i := range prefill {
		r.Ranks["prefill"] = append(r.Ranks["prefill"], i)
	}
	for i := range decode {
		r.Ranks["decode"] = append(r.Ranks["decode"], prefill+i)
	}
	return r
}

// Slot is one role and rank.
type Slot struct {
	Role string
	Rank int
}

func (s Slot) String() string { return s.Role + " rank " + strconv.Itoa(s.Rank) }

// Slots are the roster's slots, by role then rank.
func (r Roster) Slots() []Slot {
	var out []Slot
	for role, ranks := range r.Ranks {
		for _, rank := range ranks {
			out = append(out, Slot{role, rank})
		}
	}
	sortSlots(out)
	return out
}

// Size is the world size the roster implies.
func (r Roster) Size() int { return len(r.Slots()) }

// Validate refuses an empty roster, bad role names and a rank listed
// twice (across roles too: ranks are the world's).
func (r Roster) Validate() error {
	if err := validRun(r.Run); err != nil {
		return err
	}
	seen := map[int]string{}
	for role, ranks := range r.Ranks {
		if err := validRole(role); err != nil {
			return err
		}
		for _, rank := range ranks {
			if rank < 0 {
				return fmt.Errorf("roster: %s rank %d is negative", role, rank)
			}
			if other, dup := seen[rank]; dup {
				return fmt.Errorf("roster: rank %d is both %s and %s", rank, other, role)
			}
			seen[rank] = role
		}
	}
	if len(seen) == 0 {
		return fmt.Errorf("roster: nobody to wait for")
	}
	return nil
}

func (r Roster) has(s Slot) bool {
	for _, rank := range r.Ranks[s.Role] {
		if rank == s.Rank {
			return true
		}
	}
	return false
}

func slotLess(a, b Slot) bool {
	if a.Role != b.Role {
		return a.Role < b.Role
	}
	return a.Rank < b.Rank
}

func sortSlots(s []Slot) { sort.Slice(s, func(i, j int) bool { return slotLess(s[i], s[j]) }) }

// Member is one endpoint that joined.
type Member struct {
	Hello
	// Addr is where to ctl.Dial the member's control channel: Hello.Ctl,
	// its unspecified host replaced (TCP mode) by the address the hello
	// came from. Empty for a reverse member.
	Addr string
	// Conn, for a reverse member only, is the connection to run
	// ctl.NewConnClient on. Driver.Close closes it too.
	Conn net.Conn
	// From is where the hello came from: the peer's address (TCP) or the
	// key (etcd).
	From   string
	Joined time.Time
}

// Why a hello was turned away; Driver.Rejected counts them by these.
const (
	RejectGarbage   = "garbage"       // not a valid hello line or value
	RejectRun       = "wrong-run"     // another run's id
	RejectRoster    = "not-in-roster" // a role or rank the roster does not list
	RejectWorld     = "world-size"    // a world size other than the roster's
	RejectDuplicate = "duplicate"     // the slot is already taken
	RejectLate      = "late"          // after Wait returned
)

// RejectedError is what Join returns when the driver turned the hello
// away.
type RejectedError struct {
	Reason string // one of the Reject constants, or "" if the driver did not say
	Detail string
}

func (e *RejectedError) Error() string {
	return fmt.Sprintf("rendezvous: hello rejected (%s): %s", e.Reason, e.Detail)
}

// Departure is a member that joined and then left before Wait returned,
// and whose slot nobody took again.
type Departure struct {
	Slot
	Host string
	Why  string
}

// IncompleteError is Wait's error when the join window ended (or its
// context did) before the roster was complete.
type IncompleteError struct {
	Waited   time.Duration // how long Wait waited
	Missing  []Slot        // never joined
	Gone     []Departure   // joined, then left
	Rejected map[string]int
}

func (e *IncompleteError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "rendezvous: roster incomplete after %v", e.Waited.Round(time.Millisecond))
	if len(e.Missing) > 0 {
		b.WriteString(": missing ")
		b.WriteString(slotList(e.Missing))
	}
	if len(e.Gone) > 0 {
		b.WriteString("; gone: ")
		for i, d := range e.Gone {
			if i > 0 {
				b.WriteString(", ")
			}
			fmt.Fprintf(&b, "%s (host %s: %s)", d.Slot, d.Host, d.Why)
		}
	}
	if r := rejectSummary(e.Rejected); r != "" {
		b.WriteString("; rejected ")
		b.WriteString(r)
	}
	return b.String()
}

// slotList names slots compactly: "decode ranks 1,3, prefill rank 0".
func slotList(slots []Slot) string {
	var parts []string
	for i := 0; i < len(slots); {
		j := i
		var ranks []string
		for ; j < len(slots) && slots[j].Role == slots[i].Role; j++ {
			ranks = append(ranks, strconv.Itoa(slots[j].Rank))
		}
		noun := " rank "
		if len(ranks) > 1 {
			noun = " ranks "
		}
		parts = append(parts, slots[i].Role+noun+strings.Join(ranks, ","))
		i = j
	}
	return strings.Join(parts, ", ")
}

func rejectSummary(m map[string]int) string {
	var keys []string
	total := 0
	for k, n := range m {
		keys = append(keys, k)
		total += n
	}
	if total == 0 {
		return ""
	}
	sort.Strings(keys)
	var parts []string
	for _, k := range keys {
		parts = append(parts, fmt.Sprintf("%s %d", k, m[k]))
	}
	return fmt.Sprintf("%d hello(s) (%s)", total, strings.Join(parts, ", "))
}

// Options tune both transports; the zero value is usable.
type Options struct {
	// Log receives every join, departure and rejection with its reason
	// (default slog.Default()).
	Log *slog.Logger
	// HelloTimeout is how long a TCP connection may take to send its hello
	// and a member to get its answer (default 10s).
	HelloTimeout time.Duration
	// LeaseTTL is an etcd member's lease: how soon after it dies its key
	// goes (default 10s; etcd may round it up).
	LeaseTTL time.Duration
	// RetryFor bounds how long Register keeps retrying a TCP driver that
	// cannot be reached (0: until ctx ends). A typo'd or dead driver
	// address otherwise kept a registering endpoint waiting forever. With
	// etcd it bounds reaching etcd, for a member and for the driver
	// (which passes its join window): an unreachable etcd took the 10 s
	// hello timeout whatever either said.
	RetryFor time.Duration
}

// etcdTimeout is how long reaching etcd may take: the hello timeout, or
// RetryFor when that is shorter.
func (o Options) etcdTimeout() time.Duration {
	if o.RetryFor > 0 {
		return min(o.RetryFor, o.helloTimeout())
	}
	return o.helloTimeout()
}

func (o Options) log() *slog.Logger {
	if o.Log != nil {
		return o.Log
	}
	return slog.Default()
}

func (o Options) helloTimeout() time.Duration {
	if o.HelloTimeout > 0 {
		return o.HelloTimeout
	}
	return 10 * time.Second
}

func (o Options) leaseTTL() time.Duration {
	if o.LeaseTTL > 0 {
		return o.LeaseTTL
	}
	return 10 * time.Second
}

// Driver waits for a roster; Listen and WatchEtcd make one.
type Driver struct {
	b    *board
	addr string
	stop func() error // the transport's close
	once sync.Once
	err  error
}

// Addr is the TCP listener's HOST:PORT (its real port when Listen was
// given port 0; members on other hosts need a routable host in place of
// an unspecified one) or the etcd:// address.
func (d *Driver) Addr() string { return d.addr }

// Wait returns once every slot of the roster is held by a live member,
// with the members sorted by role and rank. When the join window ends
// first (or ctx does), it returns the members that are there and an
// *IncompleteError naming the missing, gone and rejected (wrapping
// ctx.Err() when ctx ended, ErrClosed when Close was called). After Wait
// returns, later hellos are turned away as late and departures are only
// logged. Wait is called once; a second call is an error.
func (d *Driver) Wait(ctx context.Context, window time.Duration) ([]Member, error) {
	return d.b.wait(ctx, window)
}

// Rejected counts the hellos turned away so far, by reason.
func (d *Driver) Rejected() map[string]int { return d.b.rejectedCopy() }

// Close stops listening or watching and closes every connection the
// driver accepted, reverse members' included (close their ctl clients
// first).
func (d *Driver) Close() error {
	d.once.Do(func() {
		d.b.close()
		d.err = d.stop()
	})
	return d.err
}

// Ending says the run is over and its endpoints are being closed: the
// departures that follow are the teardown, not a member lost mid-run, and
// are logged at debug level only.
func (d *Driver) Ending() {
	d.b.mu.Lock()
	d.b.ending = true
	d.b.mu.Unlock()
}

// ErrClosed is why a Wait ended by Close returned.
var ErrClosed = errors.New("rendezvous: driver closed")

// board is the roster's state, shared by both transports.
type board struct {
	expect   Roster
	log      *slog.Logger
	mu       sync.Mutex
	held     map[Slot]*entry // joined and alive (or reserved, see entry.ready)
	gone     map[Slot]Departure
	rejected map[string]int
	changed  chan struct{} // closed and replaced on every change
	done     bool          // Wait returned
	waiting  bool          // Wait was called
	closed   bool          // Close was called
	ending   bool          // Ending was called: departures are expected
	// finish runs once when Wait returns, outside mu: the TCP transport
	// hands reverse connections over.
	finish func(members []*entry)
}

// entry is a slot's holder. A TCP hello reserves its slot before it is
// answered and is ready once the answer is out, so that a reverse
// member's connection carries nothing after the answer but ctl.
type entry struct {
	m     Member
	ready bool
	conn  *bufConn // TCP only
}

func newBoard(expect Roster, log *slog.Logger) *board {
	return &board{expect: expect, log: log, held: map[Slot]*entry{}, gone: map[Slot]Departure{},
		rejected: map[string]int{}, changed: make(chan struct{})}
}

func (b *board) notifyLocked() {
	close(b.changed)
	b.changed = make(chan struct{})
}

func (b *board) reject(reason, detail, from string) *RejectedError {
	b.mu.Lock()
	b.rejected[reason]++
	b.notifyLocked()
	b.mu.Unlock()
	b.log.Warn("rendezvous: hello rejected", "reason", reason, "detail", detail, "from", from)
	return &RejectedError{Reason: reason, Detail: detail}
}

func (b *board) rejectedCopy() map[string]int {
	b.mu.Lock()
	defer b.mu.Unlock()
	out := make(map[string]int, len(b.rejected))
	for k, v := range b.rejected {
		out[k] = v
	}
	return out
}

// check says why a valid hello cannot have its slot (run, roster, world
// size), or nil. Duplicates and lateness are reserve's.
func (b *board) check(h Hello) (reason, detail string) {
	s := Slot{h.Role, h.Rank}
	switch {
	case h.Run != b.expect.Run:
		return RejectRun, fmt.Sprintf("run id %q, this driver's is %q", h.Run, b.expect.Run)
	case !b.expect.has(s):
		return RejectRoster, fmt.Sprintf("%s is not in the roster (%s)", s, slotList(b.expect.Slots()))
	case h.World != b.expect.Size():
		return RejectWorld, fmt.Sprintf("%s says world size %d, the roster has %d", s, h.World, b.expect.Size())
	}
	return "", ""
}

// reserve takes h's slot for e, or says why not (and counts it).
func (b *board) reserve(e *entry) *RejectedError {
	h := e.m.Hello
	if reason, detail := b.check(h); reason != "" {
		return b.reject(reason, detail, e.m.From)
	}
	s := Slot{h.Role, h.Rank}
	b.mu.Lock()
	if b.done {
		b.mu.Unlock()
		return b.reject(RejectLate, fmt.Sprintf("%s joined after the rendezvous ended", s), e.m.From)
	}
	if old := b.held[s]; old != nil {
		b.mu.Unlock()
		return b.reject(RejectDuplicate, fmt.Sprintf("%s is already held by host %s (%s)", s, old.m.Host, old.m.From), e.m.From)
	}
	b.held[s] = e
	b.mu.Unlock()
	return nil
}

// commit makes a reserved entry count as joined.
func (b *board) commit(e *entry) {
	b.mu.Lock()
	e.ready = true
	s := Slot{e.m.Role, e.m.Rank}
	delete(b.gone, s)
	b.notifyLocked()
	b.mu.Unlock()
	b.log.Info("rendezvous: joined", "role", e.m.Role, "rank", e.m.Rank, "host", e.m.Host, "ctl", e.m.Hello.Ctl, "from", e.m.From)
}

// leave frees e's slot (if e still holds it) and records why.
func (b *board) leave(e *entry, why string) {
	s := Slot{e.m.Role, e.m.Rank}
	b.mu.Lock()
	if b.held[s] != e {
		b.mu.Unlock()
		return
	}
	if b.done {
		ending := b.ending
		b.mu.Unlock()
		if ending {
			// The run closed its endpoints, which ends their
			// registrations: every successful run's teardown.
			b.log.Debug("rendezvous: member left as the run ended", "role", s.Role, "rank", s.Rank, "host", e.m.Host, "why", why)
			return
		}
		b.log.Warn("rendezvous: member left after the rendezvous", "role", s.Role, "rank", s.Rank, "host", e.m.Host, "why", why)
		return
	}
	delete(b.held, s)
	wasReady := e.ready
	if wasReady {
		b.gone[s] = Departure{Slot: s, Host: e.m.Host, Why: why}
	}
	b.notifyLocked()
	b.mu.Unlock()
	if wasReady {
		b.log.Warn("rendezvous: member gone", "role", s.Role, "rank", s.Rank, "host", e.m.Host, "why", why)
	}
}

func (b *board) close() {
	b.mu.Lock()
	b.closed = true
	b.notifyLocked()
	b.mu.Unlock()
}

func (b *board) wait(ctx context.Context, window time.Duration) ([]Member, error) {
	b.mu.Lock()
	again := b.waiting
	b.waiting = true
	b.mu.Unlock()
	if again {
		return nil, errors.New("rendezvous: Wait was already called")
	}
	start := time.Now()
	timer := time.NewTimer(window)
	defer timer.Stop()
	var ctxErr error
	for {
		b.mu.Lock()
		complete := true
		for _, s := range b.expect.Slots() {
			if e := b.held[s]; e == nil || !e.ready {
				complete = false
				break
			}
		}
		if b.closed && !complete {
			ctxErr = ErrClosed
		}
		if complete || ctxErr != nil {
			return b.endLocked(time.Since(start), complete, ctxErr)
		}
		changed := b.changed
		b.mu.Unlock()
		select {
		case <-changed:
		case <-timer.C:
			ctxErr = errWindow
		case <-ctx.Done():
			ctxErr = ctx.Err()
		}
	}
}

var errWindow = errors.New("join window ended")

// endLocked ends the rendezvous; b.mu is held and released here.
func (b *board) endLocked(waited time.Duration, complete bool, why error) ([]Member, error) {
	b.done = true
	var ready []*entry
	var missing []Slot
	for _, s := range b.expect.Slots() {
		if e := b.held[s]; e != nil && e.ready {
			ready = append(ready, e)
		} else if _, left := b.gone[s]; !left {
			missing = append(missing, s)
		}
	}
	var gone []Departure
	for _, d := range b.gone {
		gone = append(gone, d)
	}
	sort.Slice(gone, func(i, j int) bool { return slotLess(gone[i].Slot, gone[j].Slot) })
	rejected := make(map[string]int, len(b.rejected))
	for k, v := range b.rejected {
		rejected[k] = v
	}
	b.mu.Unlock()
	if b.finish != nil {
		b.finish(ready)
	}
	members := make([]Member, len(ready))
	for i, e := range ready {
		members[i] = e.m
	}
	if complete {
		b.log.Info("rendezvous: roster complete", "members", len(members))
		return members, nil
	}
	inc := &IncompleteError{Waited: waited, Missing: missing, Gone: gone, Rejected: rejected}
	if why == errWindow {
		return members, inc
	}
	return members, fmt.Errorf("%w: %w", why, inc)
}

// ParseRoster reads a roster flag: role=RANKS separated by commas, RANKS
// a rank or a range N-M, a role repeated for ranks that are not one range
// ("prefill=0,decode=1"; "prefill=0-3,decode=4-7"; "decode=1,decode=3").
func ParseRoster(run, spec string) (Roster, error) {
	r := Roster{Run: run, Ranks: map[string][]int{}}
	for _, part := range strings.Split(spec, ",") {
		role, ranks, ok := strings.Cut(strings.TrimSpace(part), "=")
		if !ok {
			return Roster{}, fmt.Errorf("roster %q: %q is not role=RANKS", spec, part)
		}
		lo, hi, isRange := strings.Cut(ranks, "-")
		first, err1 := strconv.Atoi(lo)
		last, err2 := first, error(nil)
		if isRange {
			last, err2 = strconv.Atoi(hi)
		}
		if err1 != nil || err2 != nil || first < 0 || last < first || last-first >= 1<<16 {
			return Roster{}, fmt.Errorf("roster %q: %q is not a rank or a range N-M", spec, ranks)
		}
		for rank := first; rank <= last; rank++ {
			r.Ranks[role] = append(r.Ranks[role], rank)
		}
	}
	return r, r.Validate()
}

// String is the roster as ParseRoster reads it (without the run id).
func (r Roster) String() string {
	var parts []string
	slots := r.Slots()
	for i := 0; i < len(slots); {
		j := i + 1
		for j < len(slots) && slots[j].Role == slots[i].Role && slots[j].Rank == slots[j-1].Rank+1 {
			j++
		}
		if j-i == 1 {
			parts = append(parts, fmt.Sprintf("%s=%d", slots[i].Role, slots[i].Rank))
		} else {
			parts = append(parts, fmt.Sprintf("%s=%d-%d", slots[i].Role, slots[i].Rank, slots[j-1].Rank))
		}
		i = j
	}
	return strings.Join(parts, ",")
}
