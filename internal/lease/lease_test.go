package lease

import (
	"strconv"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// fakeClock is the tests' clock: nanoseconds that move only when told.
type fakeClock struct{ now int64 }

func (c *fakeClock) advance(d time.Duration) int64 { c.now += int64(d); return c.now }

func leaseCfg(t *testing.T, c Config) Config {
	t.Helper()
	n, err := c.Normalize()
	if err != nil {
		t.Fatal(err)
	}
	return n
}

func TestLeaseConfigDerivedTimes(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		cfg                    Config
		initial, ext, interval time.Duration
	}{
		{Config{}, 30 * time.Second, 20 * time.Second, 5 * time.Second},
		{Config{Duration: 3 * time.Second}, 3 * time.Second, 2 * time.Second, 500 * time.Millisecond},
		{Config{Duration: 60 * time.Second}, 60 * time.Second, 40 * time.Second, 10 * time.Second},
		{Config{Policy: PolicyFixed}, 480 * time.Second, 0, 0},
		{Config{Policy: PolicyFixed, Timeout: 5 * time.Second}, 5 * time.Second, 0, 0},
	} {
		c := leaseCfg(t, tc.cfg)
		if c.Initial() != tc.initial || c.Extension() != tc.ext || c.HeartbeatInterval() != tc.interval {
			t.Errorf("%+v: initial %v ext %v interval %v, want %v %v %v", tc.cfg, c.Initial(), c.Extension(), c.HeartbeatInterval(), tc.initial, tc.ext, tc.interval)
		}
	}
}

func TestLeaseConfigRejectsBadValues(t *testing.T) {
	t.Parallel()
	for _, c := range []Config{
		{Policy: "sometimes"}, {Reaper: "tail"}, {Duration: time.Millisecond}, {Duration: -time.Second}, {Timeout: -1},
		{Duration: MaxDuration + 1}, {Timeout: 2000000 * time.Hour},
	} {
		if _, err := c.Normalize(); err == nil {
			t.Errorf("%+v accepted", c)
		}
	}
}

func TestLeaseRenewExtendsAndNeverShortens(t *testing.T) {
	t.Parallel()
	clk := &fakeClock{}
	tb := NewTable(leaseCfg(t, Config{Duration: 30 * time.Second}))
	l := tb.Grant("a", 100, clk.now)
	if l.Deadline != int64(30*time.Second) {
		t.Fatalf("initial deadline %v", time.Duration(l.Deadline))
	}
	// At t=5s a heartbeat would give 25 s: shorter than the 30 s held, so kept.
	if n := tb.Renew([]string{"a"}, clk.advance(5*time.Second)); n != 0 || l.Deadline != int64(30*time.Second) {
		t.Errorf("renew at 5s shortened or counted: n=%d deadline %v", n, time.Duration(l.Deadline))
	}
	// At t=15s: 15+20 = 35 s, later: extended.
	if n := tb.Renew([]string{"a"}, clk.advance(10*time.Second)); n != 1 || l.Deadline != int64(35*time.Second) {
		t.Errorf("renew at 15s: n=%d deadline %v, want 35s", n, time.Duration(l.Deadline))
	}
	if l.Renewals != 2 || l.LastRenew != int64(15*time.Second) {
		t.Errorf("renewals %d last %v", l.Renewals, time.Duration(l.LastRenew))
	}
	// An older heartbeat processed late never moves it back.
	if tb.Renew([]string{"a"}, int64(14*time.Second)); l.Deadline != int64(35*time.Second) || l.LastRenew != int64(15*time.Second) {
		t.Errorf("late heartbeat moved the lease: deadline %v last %v", time.Duration(l.Deadline), time.Duration(l.LastRenew))
	}
}

func TestLeaseRenewIgnoresUnknownIDs(t *testing.T) {
	t.Parallel()
	tb := NewTable(leaseCfg(t, Config{}))
	tb.Grant("a", 1, 0)
	if n := tb.Renew([]string{"x", "a", "y"}, int64(20*time.Second)); n != 1 {
		t.Errorf("renewed %d", n)
	}
	want := Stats{Granted: 1, HeartbeatIDs: 3, Renewed: 1, UnknownRenewals: 2}
	if d := cmp.Diff(want, tb.Stats()); d != "" {
		t.Errorf("stats (-want +got):\n%s", d)
	}
	if tb.Len() != 1 {
		t.Errorf("unknown ids changed the table: %d held", tb.Len())
	}
}

func TestFixedPolicyIgnoresHeartbeats(t *testing.T) {
	t.Parallel()
	tb := NewTable(leaseCfg(t, Config{Policy: PolicyFixed, Timeout: 10 * time.Second}))
	l := tb.Grant("a", 1, 0)
	tb.Renew([]string{"a"}, int64(9*time.Second))
	if l.Deadline != int64(10*time.Second) || tb.Stats().IgnoredRenewals != 1 {
		t.Errorf("fixed policy renewed: deadline %v stats %+v", time.Duration(l.Deadline), tb.Stats())
	}
	if got := tb.Reap(int64(10*time.Second) - 1); len(got) != 0 {
		t.Errorf("reaped before the timeout")
	}
	if got := tb.Reap(int64(10 * time.Second)); len(got) != 1 {
		t.Errorf("not reaped at the timeout")
	}
}

func ids(ls []*Lease) []string {
	var out []string
	for _, l := range ls {
		out = append(out, l.ID)
	}
	return out
}

func TestFullReaperFreesEveryExpiredLease(t *testing.T) {
	t.Parallel()
	tb := NewTable(leaseCfg(t, Config{Duration: 3 * time.Second}))
	for i, id := range []string{"a", "b", "c", "d"} {
		tb.Grant(id, 10, int64(i)*int64(100*time.Millisecond))
	}
	// "a" (the head) is kept alive by heartbeats; the rest expire behind it.
	tb.Renew([]string{"a"}, int64(2*time.Second))
	got := tb.Reap(int64(3500 * time.Millisecond))
	if d := cmp.Diff([]string{"b", "c", "d"}, ids(got)); d != "" {
		t.Errorf("reaped (-want +got):\n%s", d)
	}
	if n, _ := tb.ExpiredHeld(int64(3500 * time.Millisecond)); n != 0 || tb.Len() != 1 {
		t.Errorf("after a full reap: %d expired still held, %d held", n, tb.Len())
	}
}

func TestHeadOnlyReaperLeaksBehindARenewedLease(t *testing.T) {
	t.Parallel()
	tb := NewTable(leaseCfg(t, Config{Duration: 3 * time.Second, Reaper: ReapHeadOnly}))
	for i, id := range []string{"a", "b", "c", "d"} {
		tb.Grant(id, 10, int64(i)*int64(100*time.Millisecond))
	}
	tb.Renew([]string{"a"}, int64(2*time.Second)) // a: until 4 s; b, c, d: 3.1, 3.2, 3.3 s
	now := int64(3500 * time.Millisecond)
	if got := tb.Reap(now); len(got) != 0 {
		t.Errorf("head-only reaper walked past a live head: reaped %v", ids(got))
	}
	if n, b := tb.ExpiredHeld(now); n != 3 || b != 30 {
		t.Errorf("expired but held: %d (%d B), want 3 (30 B)", n, b)
	}
	if n, _ := tb.ExpiredHeld(int64(3 * time.Second)); n != 0 {
		t.Errorf("nothing had expired at 3 s, got %d", n)
	}
	if tb.HeldBytes() != 40 {
		t.Errorf("held bytes %d, want 40", tb.HeldBytes())
	}
	// Once the head is consumed, the walk reaches the others.
	tb.Release("a")
	if got := tb.Reap(now); len(got) != 3 {
		t.Errorf("after the head left: reaped %v", ids(got))
	}
	if tb.HeldBytes() != 0 || tb.Len() != 0 {
		t.Errorf("empty table holds %d B in %d leases", tb.HeldBytes(), tb.Len())
	}
}

func TestReaperSkipsPinnedLeases(t *testing.T) {
	t.Parallel()
	for _, mode := range []ReaperMode{ReapFull, ReapHeadOnly} {
		tb := NewTable(leaseCfg(t, Config{Duration: time.Second, Reaper: mode}))
		tb.Grant("a", 1, 0)
		tb.Grant("b", 1, 0)
		tb.Pin("a", true)
		if got := ids(tb.Reap(int64(2 * time.Second))); !cmp.Equal(got, []string{"b"}) {
			t.Errorf("%s: reaped %v with a pinned", mode, got)
		}
		tb.Pin("a", false)
		if got := ids(tb.Reap(int64(2 * time.Second))); !cmp.Equal(got, []string{"a"}) {
			t.Errorf("%s: reaped %v after unpinning", mode, got)
		}
		if tb.Len() != 0 {
			t.Errorf("%s: %d left", mode, tb.Len())
		}
	}
}

func TestLeaseReleaseAndRegrant(t *testing.T) {
	t.Parallel()
	tb := NewTable(leaseCfg(t, Config{Duration: time.Second}))
	tb.Grant("a", 1, 0)
	if _, ok := tb.Release("a"); !ok {
		t.Fatal("release of a held lease failed")
	}
	if _, ok := tb.Release("a"); ok {
		t.Error("released twice")
	}
	if got := tb.Reap(int64(time.Hour)); len(got) != 0 {
		t.Errorf("released lease reaped: %v", ids(got))
	}
	tb.Grant("b", 1, 0)
	tb.Grant("b", 1, int64(5*time.Second)) // restarted
	if got := tb.Reap(int64(5500 * time.Millisecond)); len(got) != 0 || tb.Len() != 1 {
		t.Errorf("regranted lease reaped on its old deadline")
	}
	if dl, ok := tb.NextDeadline(); !ok || dl != int64(6*time.Second) {
		t.Errorf("next deadline %v %v", time.Duration(dl), ok)
	}
}

func TestLeaseTableManyLeasesExpireInDeadlineOrder(t *testing.T) {
	t.Parallel()
	tb := NewTable(leaseCfg(t, Config{Duration: 6 * time.Second}))
	const n = 1000
	for i := range n {
		tb.Grant(string(rune('a'+i%26))+itoa(i), 1, int64(i)*int64(time.Millisecond))
	}
	// Renew every other one at 3 s: their deadlines move to 7 s.
	var renew []string
	for i := 0; i < n; i += 2 {
		renew = append(renew, string(rune('a'+i%26))+itoa(i))
	}
	tb.Renew(renew, int64(3*time.Second))
	got := tb.Reap(int64(6*time.Second) + int64(n-1)*int64(time.Millisecond))
	if len(got) != n/2 {
		t.Fatalf("reaped %d, want %d", len(got), n/2)
	}
	for i := 1; i < len(got); i++ {
		if got[i].Deadline < got[i-1].Deadline {
			t.Fatalf("reaped out of deadline order at %d", i)
		}
	}
	if got := tb.Reap(int64(7 * time.Second)); len(got) != n/2 {
		t.Fatalf("second reap: %d", len(got))
	}
}

func itoa(i int) string { return strconv.Itoa(i) }

func TestParseHeartbeat(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		in   string
		ids  []string
		isHB bool
	}{
		{"HB:a,b,c", []string{"a", "b", "c"}, true},
		{"HB:", nil, true},
		{"HB:a,,b,", []string{"a", "b"}, true},
		{"hb:a", nil, false},
		{"req-1:2", nil, false},
	} {
		ids, ok := ParseHeartbeat(tc.in)
		if ok != tc.isHB || !cmp.Equal(ids, tc.ids) {
			t.Errorf("%q: %v %v", tc.in, ids, ok)
		}
	}
	b := HeartbeatBatch{IDs: []string{"x-1", "y-2"}}
	if string(b.Message()) != "HB:x-1,y-2" {
		t.Errorf("message %q", b.Message())
	}
}

func FuzzParseHeartbeat(f *testing.F) {
	f.Add("HB:a,b")
	f.Add("HB:")
	f.Add("PUSH_REG:x")
	f.Fuzz(func(t *testing.T, s string) {
		ids, ok := ParseHeartbeat(s)
		if !ok {
			return
		}
		for _, id := range ids {
			if id == "" {
				t.Fatalf("empty id from %q", s)
			}
		}
		// What parses re-encodes to a message that parses the same.
		again, ok := ParseHeartbeat(string(HeartbeatBatch{IDs: ids}.Message()))
		if !ok || !cmp.Equal(ids, again) {
			t.Fatalf("%q: %v then %v", s, ids, again)
		}
	})
}

var (
	engA = HeartbeatTarget{EngineID: "prefill-a", Endpoint: "tcp://10.0.0.1:5600", TPSize: 2}
	engB = HeartbeatTarget{EngineID: "prefill-b", Endpoint: "tcp://10.0.0.2:5600", TPSize: 1}
)

func TestHeartbeatTrackerGroupsByEngine(t *testing.T) {
	t.Parallel()
	tr := NewHeartbeatTracker(5 * time.Second)
	tr.Track("d1", engA, "p1")
	tr.Track("d2", engB, "p2")
	tr.Track("d3", engA, "p3")
	got := tr.Due(0)
	want := []HeartbeatBatch{{Target: engA, IDs: []string{"p1", "p3"}}, {Target: engB, IDs: []string{"p2"}}}
	if d := cmp.Diff(want, got); d != "" {
		t.Errorf("batches (-want +got):\n%s", d)
	}
}

func TestHeartbeatTrackerThrottles(t *testing.T) {
	t.Parallel()
	clk := &fakeClock{}
	tr := NewHeartbeatTracker(5 * time.Second)
	if got := tr.Due(clk.now); got != nil {
		t.Errorf("nothing tracked, got %v", got)
	}
	tr.Track("d1", engA, "p1")
	if got := tr.Due(clk.now); len(got) != 1 {
		t.Fatalf("first call: %v", got)
	}
	if got := tr.Due(clk.now); got != nil {
		t.Errorf("immediate second call: %v", got)
	}
	if got := tr.Due(clk.advance(5*time.Second - 1)); got != nil {
		t.Errorf("just before the interval: %v", got)
	}
	if got := tr.Due(clk.advance(1)); len(got) != 1 {
		t.Errorf("at the interval: %v", got)
	}
}

func TestHeartbeatTrackerStops(t *testing.T) {
	t.Parallel()
	tr := NewHeartbeatTracker(time.Second)
	tr.Track("done", engA, "p1")   // KV arrives
	tr.Track("abort", engA, "p2")  // aborted while queued
	tr.Track("queued", engB, "p3") // still waiting
	if !tr.Stop("done") || !tr.Stop("abort") {
		t.Fatal("stop of tracked requests failed")
	}
	if tr.Stop("done") || tr.Stop("never") {
		t.Error("stop of untracked requests succeeded")
	}
	got := tr.Due(0)
	want := []HeartbeatBatch{{Target: engB, IDs: []string{"p3"}}}
	if d := cmp.Diff(want, got); d != "" {
		t.Errorf("after stops (-want +got):\n%s", d)
	}
	tr.Stop("queued")
	if tr.Tracked() != 0 || tr.Due(int64(time.Hour)) != nil {
		t.Errorf("all stopped, still tracked %d", tr.Tracked())
	}
}

func TestHeartbeatTrackerOffUnderFixedPolicy(t *testing.T) {
	t.Parallel()
	cfg := leaseCfg(t, Config{Policy: PolicyFixed})
	tr := NewHeartbeatTracker(cfg.HeartbeatInterval())
	tr.Track("d1", engA, "p1")
	if got := tr.Due(0); got != nil {
		t.Errorf("fixed policy heartbeats: %v", got)
	}
}
