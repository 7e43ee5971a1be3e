package engine

import (
	"context"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nixlctl/nixlctl/internal/lease"
	"github.com/nixlctl/nixlctl/internal/nixl"
	"github.com/nixlctl/nixlctl/internal/runcore"
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

// The watchdog and the lease on the engine's clock: time passes when the
// test moves it, and the steps that check deadlines run when it calls them.
func TestPushWatchdogOnFakeClock(t *testing.T) {
	clk := newFakeClock()
	p, d, rec := engines(t, ProtoPush, 1, 1, func(c *Config) {
		// The fixed policy: no heartbeats, which would renew the lease
		// whenever they happen to be sent and applied.
		c.Clock, c.RegTimeout, c.LeasePolicy, c.FixedTimeout = clk, runcore.Duration(5*time.Second), lease.PolicyFixed, 10*time.Second
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
		if ids := d.dec.waits.Waiting(); len(ids) > 0 {
			id = ids[0]
			return true
		}
		return false
	})
	return id
}

func (s *decodeState) waitDeadline(id string) int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.waits.Deadline(id)
}
