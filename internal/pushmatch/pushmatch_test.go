package pushmatch

import (
	"testing"

	"github.com/google/go-cmp/cmp"
)

// reg stands for the engine's registration message: the machines keep
// and hand it back, and never read it.
type reg struct{ decodeID string }

func TestPushMatcher(t *testing.T) {
	const ttl = 1000
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
		end     End      // post, done, fail
		// The phase of the request on the rank after the step ("": no
		// check, "-": no such request).
		phase string
	}
	for _, tc := range []struct {
		name  string
		ranks int
		steps []step
		stats Stats
	}{
		{name: "prefill finishes first", ranks: 1, steps: []step{
			{op: "finish", id: "r-0a0a0a0a", phase: "waiting-for-registration"},
			{op: "reg", id: "r-1b1b1b1b", at: 5, matched: true, phase: "matched"},
			{op: "take", id: "r-0a0a0a0a", at: 6, jobs: []string{"r-0a0a0a0a"}, phase: "handshaking"},
			{op: "hs", id: "r-0a0a0a0a", ok: true, pin: true, phase: "writing"},
			{op: "post", id: "r-0a0a0a0a", n: 1, phase: "writing"},
			{op: "done", id: "r-0a0a0a0a", at: 9, end: End{Free: true, Unpin: true}, phase: "done"},
		}},
		{name: "registration first", ranks: 1, steps: []step{
			{op: "reg", id: "r-1b1b1b1b", at: 1},
			{op: "reg", id: "r-1b1b1b1b", at: 2}, // another decode rank's copy
			{op: "take", at: 3},
			{op: "finish", id: "r-0a0a0a0a", at: 4, matched: true, phase: "matched"},
			{op: "take", id: "r-0a0a0a0a", at: 5, jobs: []string{"r-0a0a0a0a"}, phase: "handshaking"},
		}, stats: Stats{Duplicates: 1}},
		{name: "exact id before base id", ranks: 1, steps: []step{
			{op: "finish", id: "r-0a0a0a0a"},
			{op: "finish", id: "r-2c2c2c2c"}, // same base: byBase now points here
			{op: "reg", id: "r-0a0a0a0a", matched: true},
			{op: "take", id: "r-0a0a0a0a", jobs: []string{"r-0a0a0a0a"}, phase: "handshaking"},
			{op: "reg", id: "r-9f9f9f9f", matched: true}, // base id: the latest request
			{op: "take", id: "r-2c2c2c2c", jobs: []string{"r-2c2c2c2c"}, phase: "handshaking"},
			{op: "reg", id: "r-0a0a0a0a", phase: "handshaking"}, // a duplicate now
		}, stats: Stats{Duplicates: 1}},
		{name: "a parked registration expires after the lease", ranks: 1, steps: []step{
			{op: "reg", id: "x-1b1b1b1b", at: 0},
			{op: "take", at: ttl},
			{op: "take", at: ttl + 1},
			{op: "finish", id: "x-0a0a0a0a", at: ttl + 2, phase: "waiting-for-registration"},
		}, stats: Stats{ExpiredRegs: 1}},
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
			{op: "done", id: "r-0a0a0a0a", rank: 1, end: End{}, phase: "done"},
			{op: "done", id: "r-0a0a0a0a", rank: 0, end: End{Free: true, Unpin: true}, phase: "done"},
		}},
		{name: "a failed WRITE leaves the blocks to the lease", ranks: 2, steps: []step{
			{op: "finish", id: "r-0a0a0a0a"},
			{op: "reg", id: "r-1b1b1b1b", rank: 0, matched: true},
			{op: "reg", id: "r-1b1b1b1b", rank: 1, matched: true},
			{op: "take", id: "r-0a0a0a0a", rank: 0, jobs: []string{"r-0a0a0a0a"}},
			{op: "take", id: "r-0a0a0a0a", rank: 1, jobs: []string{"r-0a0a0a0a"}},
			{op: "hs", id: "r-0a0a0a0a", rank: 0, ok: true, pin: true},
			{op: "post", id: "r-0a0a0a0a", rank: 0, n: 1},
			{op: "done", id: "r-0a0a0a0a", rank: 0, bad: true, end: End{Unpin: true}, phase: "failed"},
			{op: "hs", id: "r-0a0a0a0a", rank: 1, ok: true, pin: true},
			{op: "post", id: "r-0a0a0a0a", rank: 1, n: 1},
			{op: "done", id: "r-0a0a0a0a", rank: 1, end: End{Unpin: true}, phase: "done"},
		}, stats: Stats{Failed: 1}},
		{name: "a post that fails outright ends the rank", ranks: 1, steps: []step{
			{op: "finish", id: "r-0a0a0a0a"},
			{op: "reg", id: "r-1b1b1b1b", matched: true},
			{op: "take", id: "r-0a0a0a0a", jobs: []string{"r-0a0a0a0a"}},
			{op: "hs", id: "r-0a0a0a0a", ok: true, pin: true},
			{op: "post", id: "r-0a0a0a0a", n: 0, bad: true, end: End{Unpin: true}, phase: "failed"},
		}, stats: Stats{Failed: 1}},
		{name: "a failed handshake", ranks: 1, steps: []step{
			{op: "finish", id: "r-0a0a0a0a"},
			{op: "reg", id: "r-1b1b1b1b", matched: true},
			{op: "take", id: "r-0a0a0a0a", jobs: []string{"r-0a0a0a0a"}},
			{op: "fail", id: "r-0a0a0a0a", end: End{Unpin: true}, phase: "failed"},
			{op: "hs", id: "r-0a0a0a0a", ok: false, phase: "failed"},
		}, stats: Stats{Failed: 1}},
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
			m := NewMatcher[reg](tc.ranks, ttl)
			for i, st := range tc.steps {
				switch st.op {
				case "finish":
					matched := m.Finished(st.id)
					if got := len(matched) > 0 && matched[0] == 0; got != st.matched {
						t.Fatalf("step %d: finish matched %v", i, matched)
					}
				case "reg":
					if got := m.Register(st.rank, st.id, reg{decodeID: st.id}, []int{1}, st.at); got != st.matched {
						t.Fatalf("step %d: register matched %v", i, got)
					}
				case "take":
					var ids []string
					for _, j := range m.Take(st.rank, st.at) {
						ids = append(ids, j.ID)
					}
					if diff := cmp.Diff(st.jobs, ids); diff != "" {
						t.Fatalf("step %d: take (-want +got):\n%s", i, diff)
					}
				case "hs":
					if ok, pin := m.Handshaken(st.id, st.rank); ok != st.ok || pin != st.pin {
						t.Fatalf("step %d: handshaken ok %v pin %v", i, ok, pin)
					}
				case "post", "done", "fail":
					var end End
					switch st.op {
					case "post":
						end = m.Posted(st.id, st.rank, Post{Writes: st.n, Failed: st.bad}, st.at)
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
						id = q.ID // the request the decode id matched
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
		action string     // the engine's --reg-watchdog
		late   Completion // a's completion after the watchdog fired
	}{
		{"fail", CompletionUnknown},
		{"drop", CompletionProgress},
	} {
		t.Run(tc.action, func(t *testing.T) {
			w := NewWaits()
			fail := tc.action == "fail"
			w.Add("a", []int{1, 2}, 100, 50) // deadline 150
			w.Add("b", []int{1}, 120, 50)    // deadline 170
			type step struct {
				op   string // notif, expire
				id   string
				rank int
				at   int64
				ev   Completion
				ids  []string
			}
			for i, st := range []step{
				{op: "expire", at: 149},
				{op: "notif", id: "a", rank: 1, at: 140, ev: CompletionProgress},
				{op: "notif", id: "ghost", at: 141, ev: CompletionUnknown},
				{op: "expire", at: 150, ids: []string{"a"}}, // at its deadline, not before
				{op: "expire", at: 151},                     // once
				{op: "notif", id: "a", rank: 0, at: 151, ev: tc.late},
				{op: "notif", id: "b", at: 160, ev: CompletionComplete},
				{op: "notif", id: "b", at: 161, ev: CompletionDuplicate},
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

// What the engine and its tests read of the machines from outside.
func TestAccessors(t *testing.T) {
	m := NewMatcher[reg](2, 10)
	m.Register(1, "r-1b1b1b1b", reg{}, nil, 0)
	if m.Parked(0, "r") || !m.Parked(1, "r") {
		t.Errorf("parked on rank 0 %v, rank 1 %v; want only rank 1", m.Parked(0, "r"), m.Parked(1, "r"))
	}
	for _, tc := range []struct {
		fail    bool
		expired bool
		waiting []string
	}{{true, true, nil}, {false, false, []string{"a"}}} {
		w := NewWaits()
		w.Add("a", []int{1}, 100, 50)
		if d := w.Deadline("a"); d != 150 || w.Deadline("ghost") != 0 {
			t.Errorf("deadline %d, want 150 (and 0 for none)", d)
		}
		w.Expire(150, tc.fail)
		if w.Expired("a") != tc.expired || w.Expired("ghost") {
			t.Errorf("fail %v: expired %v, want %v", tc.fail, w.Expired("a"), tc.expired)
		}
		if diff := cmp.Diff(tc.waiting, w.Waiting()); diff != "" {
			t.Errorf("fail %v: waiting (-want +got):\n%s", tc.fail, diff)
		}
	}
}
