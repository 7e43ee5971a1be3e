package engine

import (
	"context"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/nixlctl/nixlctl/internal/lease"
	"github.com/nixlctl/nixlctl/internal/nixl"
)

// fakeClock is a Clock that moves only when the test says so.
type fakeClock struct{ t atomic.Int64 }

func newFakeClock() *fakeClock {
	c := &fakeClock{}
	c.t.Store(1_000_000_000_000)
	return c
}

func (c *fakeClock) Now() int64                    { return c.t.Load() }
func (c *fakeClock) Advance(d time.Duration) int64 { return c.t.Add(int64(d)) }

func TestPushMatcher(t *testing.T) {
	const ttl = 1000
	reg := func(id string) PushReg {
		return PushReg{RequestID: id, DecodeEngineID: "d", DecodeTPSize: 1, DecodePort: 1}
	}
	type step struct {
		op   string // finish, reg, take, hs, post, done, fail, forget
		id   string // prefill id (finish, hs, post, done, fail, forget) or decode id (reg)
		rank int
		at   int64
		n    int  // post: writes posted
		bad  bool // post, done: a WRITE failed
		// What the step says.
		matched bool     // reg: matched; finish: rank 0 had a parked match
		jobs    []string // take: the ids handed out
		ok, pin bool     // hs
		end     pushEnd  // post, done, fail
		// The phase of the request on the rank after the step ("": no
		// check, "-": no such request).
		phase string
	}
	for _, tc := range []struct {
		name  string
		ranks int
		steps []step
		stats pushMatchStats
	}{
		{name: "prefill finishes first", ranks: 1, steps: []step{
			{op: "finish", id: "r-0a0a0a0a", phase: "waiting-for-registration"},
			{op: "reg", id: "r-1b1b1b1b", at: 5, matched: true, phase: "matched"},
			{op: "take", id: "r-0a0a0a0a", at: 6, jobs: []string{"r-0a0a0a0a"}, phase: "handshaking"},
			{op: "hs", id: "r-0a0a0a0a", ok: true, pin: true, phase: "writing"},
			{op: "post", id: "r-0a0a0a0a", n: 1, phase: "writing"},
			{op: "done", id: "r-0a0a0a0a", at: 9, end: pushEnd{free: true, unpin: true}, phase: "done"},
		}},
		{name: "registration first", ranks: 1, steps: []step{
			{op: "reg", id: "r-1b1b1b1b", at: 1},
			{op: "reg", id: "r-1b1b1b1b", at: 2}, // another decode rank's copy
			{op: "take", at: 3},
			{op: "finish", id: "r-0a0a0a0a", at: 4, matched: true, phase: "matched"},
			{op: "take", id: "r-0a0a0a0a", at: 5, jobs: []string{"r-0a0a0a0a"}, phase: "handshaking"},
		}, stats: pushMatchStats{Duplicates: 1}},
		{name: "exact id before base id", ranks: 1, steps: []step{
			{op: "finish", id: "r-0a0a0a0a"},
			{op: "finish", id: "r-2c2c2c2c"}, // same base: byBase now points here
			{op: "reg", id: "r-0a0a0a0a", matched: true},
			{op: "take", id: "r-0a0a0a0a", jobs: []string{"r-0a0a0a0a"}, phase: "handshaking"},
			{op: "reg", id: "r-9f9f9f9f", matched: true}, // base id: the latest request
			{op: "take", id: "r-2c2c2c2c", jobs: []string{"r-2c2c2c2c"}, phase: "handshaking"},
			{op: "reg", id: "r-0a0a0a0a", phase: "handshaking"}, // a duplicate now
		}, stats: pushMatchStats{Duplicates: 1}},
		{name: "a parked registration expires after the lease", ranks: 1, steps: []step{
			{op: "reg", id: "x-1b1b1b1b", at: 0},
			{op: "take", at: ttl},
			{op: "take", at: ttl + 1},
			{op: "finish", id: "x-0a0a0a0a", at: ttl + 2, phase: "waiting-for-registration"},
		}, stats: pushMatchStats{ExpiredRegs: 1}},
		{name: "two ranks: free when both are done, pin while either writes", ranks: 2, steps: []step{
			{op: "finish", id: "r-0a0a0a0a"},
			{op: "reg", id: "r-1b1b1b1b", rank: 0, matched: true},
			{op: "reg", id: "r-1b1b1b1b", rank: 1, matched: true},
			{op: "take", id: "r-0a0a0a0a", rank: 0, jobs: []string{"r-0a0a0a0a"}},
			{op: "take", id: "r-0a0a0a0a", rank: 1, jobs: []string{"r-0a0a0a0a"}},
			{op: "hs", id: "r-0a0a0a0a", rank: 0, ok: true, pin: true},
			{op: "hs", id: "r-0a0a0a0a", rank: 1, ok: true, pin: false},
			{op: "post", id: "r-0a0a0a0a", rank: 0, n: 1},
			{op: "post", id: "r-0a0a0a0a", rank: 1, n: 2},
			{op: "done", id: "r-0a0a0a0a", rank: 1, end: pushEnd{}, phase: "done"},
			{op: "done", id: "r-0a0a0a0a", rank: 0, end: pushEnd{free: true, unpin: true}, phase: "done"},
		}},
		{name: "a failed WRITE leaves the blocks to the lease", ranks: 2, steps: []step{
			{op: "finish", id: "r-0a0a0a0a"},
			{op: "reg", id: "r-1b1b1b1b", rank: 0, matched: true},
			{op: "reg", id: "r-1b1b1b1b", rank: 1, matched: true},
			{op: "take", id: "r-0a0a0a0a", rank: 0, jobs: []string{"r-0a0a0a0a"}},
			{op: "take", id: "r-0a0a0a0a", rank: 1, jobs: []string{"r-0a0a0a0a"}},
			{op: "hs", id: "r-0a0a0a0a", rank: 0, ok: true, pin: true},
			{op: "post", id: "r-0a0a0a0a", rank: 0, n: 1},
			{op: "done", id: "r-0a0a0a0a", rank: 0, bad: true, end: pushEnd{unpin: true}, phase: "failed"},
			{op: "hs", id: "r-0a0a0a0a", rank: 1, ok: true, pin: true},
			{op: "post", id: "r-0a0a0a0a", rank: 1, n: 1},
			{op: "done", id: "r-0a0a0a0a", rank: 1, end: pushEnd{unpin: true}, phase: "done"},
		}, stats: pushMatchStats{Failed: 1}},
		{name: "a post that fails outright ends the rank", ranks: 1, steps: []step{
			{op: "finish", id: "r-0a0a0a0a"},
			{op: "reg", id: "r-1b1b1b1b", matched: true},
			{op: "take", id: "r-0a0a0a0a", jobs: []string{"r-0a0a0a0a"}},
			{op: "hs", id: "r-0a0a0a0a", ok: true, pin: true},
			{op: "post", id: "r-0a0a0a0a", n: 0, bad: true, end: pushEnd{unpin: true}, phase: "failed"},
		}, stats: pushMatchStats{Failed: 1}},
		{name: "a failed handshake", ranks: 1, steps: []step{
			{op: "finish", id: "r-0a0a0a0a"},
			{op: "reg", id: "r-1b1b1b1b", matched: true},
			{op: "take", id: "r-0a0a0a0a", jobs: []string{"r-0a0a0a0a"}},
			{op: "fail", id: "r-0a0a0a0a", end: pushEnd{unpin: true}, phase: "failed"},
			{op: "hs", id: "r-0a0a0a0a", ok: false, phase: "failed"},
		}, stats: pushMatchStats{Failed: 1}},
		{name: "freed while handshaking: nothing to post", ranks: 1, steps: []step{
			{op: "finish", id: "r-0a0a0a0a"},
			{op: "reg", id: "r-1b1b1b1b", matched: true},
			{op: "take", id: "r-0a0a0a0a", jobs: []string{"r-0a0a0a0a"}},
			{op: "forget", id: "r-0a0a0a0a", phase: "-"},
			{op: "hs", id: "r-0a0a0a0a", ok: false},
			{op: "reg", id: "r-1b1b1b1b", at: 7}, // late: parked, harmless
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := newPushMatcher(tc.ranks, ttl)
			for i, st := range tc.steps {
				switch st.op {
				case "finish":
					matched := m.Finished(st.id)
					if got := len(matched) > 0 && matched[0] == 0; got != st.matched {
						t.Fatalf("step %d: finish matched %v", i, matched)
					}
				case "reg":
					if got := m.Register(st.rank, reg(st.id), []int{1}, st.at); got != st.matched {
						t.Fatalf("step %d: register matched %v", i, got)
					}
				case "take":
					var ids []string
					for _, j := range m.Take(st.rank, st.at) {
						ids = append(ids, j.id)
					}
					if diff := cmp.Diff(st.jobs, ids); diff != "" {
						t.Fatalf("step %d: take (-want +got):\n%s", i, diff)
					}
				case "hs":
					if ok, pin := m.Handshaken(st.id, st.rank); ok != st.ok || pin != st.pin {
						t.Fatalf("step %d: handshaken ok %v pin %v", i, ok, pin)
					}
				case "post", "done", "fail":
					var end pushEnd
					switch st.op {
					case "post":
						end = m.Posted(st.id, st.rank, pushPost{writes: st.n, failed: st.bad}, st.at)
					case "done":
						end = m.WritesDone(st.id, st.rank, st.bad, st.at)
					default:
						end = m.Fail(st.id, st.rank)
					}
					if end != st.end {
						t.Fatalf("step %d: %s ended %+v, want %+v", i, st.op, end, st.end)
					}
				case "forget":
					m.Forget(st.id)
				}
				if st.phase != "" {
					id := st.id
					if q := m.match(id); st.op == "reg" && q != nil {
						id = q.id // the request the decode id matched
					}
					ph, ok := m.Phase(id, st.rank)
					got := "-"
					if ok {
						got = ph.String()
					}
					if got != st.phase {
						t.Fatalf("step %d (%s %s): phase %s, want %s", i, st.op, st.id, got, st.phase)
					}
				}
			}
			if diff := cmp.Diff(tc.stats, m.stats); diff != "" {
				t.Errorf("stats (-want +got):\n%s", diff)
			}
			for r := range tc.ranks {
				if m.waiting[r] < 0 || m.writing[r] < 0 {
					t.Errorf("rank %d: waiting %d writing %d", r, m.waiting[r], m.writing[r])
				}
			}
		})
	}
}

// The watchdog fires once, at the deadline; failing (fail) makes the
// request's later completions unknown, dropping (upstream) keeps counting
// them.
func TestPushWaits(t *testing.T) {
	for _, tc := range []struct {
		action WatchdogAction
		late   completionEvent // a's completion after the watchdog fired
	}{
		{WatchdogFail, completionUnknown},
		{WatchdogDrop, completionProgress},
	} {
		t.Run(string(tc.action), func(t *testing.T) {
			w := newPushWaits()
			fail := tc.action == WatchdogFail
			w.Add("a", []int{1, 2}, 100, 50) // deadline 150
			w.Add("b", []int{1}, 120, 50)    // deadline 170
			type step struct {
				op   string // notif, expire
				id   string
				rank int
				at   int64
				ev   completionEvent
				ids  []string
			}
			for i, st := range []step{
				{op: "expire", at: 149},
				{op: "notif", id: "a", rank: 1, at: 140, ev: completionProgress},
				{op: "notif", id: "ghost", at: 141, ev: completionUnknown},
				{op: "expire", at: 150, ids: []string{"a"}}, // at its deadline, not before
				{op: "expire", at: 151},                     // once
				{op: "notif", id: "a", rank: 0, at: 151, ev: tc.late},
				{op: "notif", id: "b", at: 160, ev: completionComplete},
				{op: "notif", id: "b", at: 161, ev: completionDuplicate},
				{op: "expire", at: 500}, // complete requests never fire
			} {
				switch st.op {
				case "notif":
					if ev := w.Completion(st.id, st.rank, st.at); ev != st.ev {
						t.Fatalf("step %d: completion %d, want %d", i, ev, st.ev)
					}
				case "expire":
					if diff := cmp.Diff(st.ids, w.Expire(st.at, fail)); diff != "" {
						t.Fatalf("step %d: expired (-want +got):\n%s", i, diff)
					}
				}
			}
			if tLast := w.Remove("b"); tLast != 161 {
				t.Errorf("b's last completion at %d", tLast)
			}
		})
	}
}

// The watchdog and the lease on the engine's clock: time passes when the
// test moves it, and the steps that check deadlines run when it calls them.
func TestPushWatchdogOnFakeClock(t *testing.T) {
	clk := newFakeClock()
	p, d, rec := engines(t, ProtoPush, 1, 1, func(c *Config) {
		// The fixed policy: no heartbeats, which would renew the lease
		// whenever they happen to be sent and applied.
		c.Clock, c.RegTimeout, c.LeasePolicy, c.FixedTimeout = clk, 5*time.Second, lease.PolicyFixed, 10*time.Second
		c.RegWatchdog = WatchdogFail         // the option; upstream's drop is TestPushWatchdogDrops
		c.Faults = &nixl.Faults{FailPost: 1} // prefill's WRITE fails (decode posts none)
	})
	ctx := context.Background()
	// A request prefill never runs: the watchdog fires at its deadline.
	loaded := loadAsync(d, LoadRequest{ID: "lonely", Tokens: 64, Key: 1, Params: pushCoords(p, "lonely")})
	id := waitWaiting(t, d)
	deadline := d.dec.waitDeadline(id)
	clk.Advance(time.Duration(deadline - clk.Now() - 1))
	d.dec.watchdog(clk.Now())
	select {
	case lr := <-loaded:
		t.Fatalf("the watchdog fired before its deadline: %+v", lr)
	default:
	}
	clk.Advance(1)
	d.dec.watchdog(clk.Now())
	if lr := <-loaded; !strings.Contains(lr.Error, "watchdog") || d.Stats().RegTimeouts != 1 || d.Stats().BlocksInUse != 0 {
		t.Fatalf("watchdog: %q %+v", lr.Error, d.Stats())
	}
	// A request whose WRITE fails: decode is not told (its watchdog fires),
	// prefill keeps the blocks for the lease.
	loaded = loadAsync(d, LoadRequest{ID: "failing", Tokens: 64, Key: 2, Params: pushCoords(p, "failing")})
	id = waitWaiting(t, d)
	pr, err := p.pre.Prefill(ctx, PrefillRequest{ID: "failing", Tokens: 64, Key: 2})
	if err != nil {
		t.Fatal(err)
	}
	waitStat(t, "failed transfers", func() int64 { return p.Stats().FailedTransfers }, 1)
	clk.Advance(time.Duration(d.dec.waitDeadline(id) - clk.Now()))
	d.dec.watchdog(clk.Now())
	if lr := <-loaded; !strings.Contains(lr.Error, "watchdog") {
		t.Fatalf("failed WRITE: decode says %q", lr.Error)
	}
	if p.Stats().BlocksInUse == 0 {
		t.Fatal("prefill freed the blocks of a failed push before their lease")
	}
	clk.Advance(10 * time.Second)
	p.pre.step(clk.Now())
	ev := waitFreed(t, rec, "expired")
	if ev.ID != pr.RequestID || !ev.Failed {
		t.Errorf("freed %+v", ev)
	}
}

// waitWaiting waits for decode to register one push request (it polls an
// event, not the passing of time) and returns its id.
func waitWaiting(t *testing.T, d *Engine) string {
	t.Helper()
	var id string
	waitFor(t, "decode to register its request", func() bool {
		d.dec.mu.Lock()
		defer d.dec.mu.Unlock()
		for k, w := range d.dec.waits.reqs {
			if !w.expired {
				id = k
				return true
			}
		}
		return false
	})
	return id
}

func (s *decodeState) waitDeadline(id string) int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.waits.reqs[id].deadline
}
