package engine

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/nixlctl/nixlctl/internal/pushmatch"
)

// Push-mode heartbeats between real engines, on a fake clock, keyed as
// upstream keys them and as the fix does. Upstream decode heartbeats the
// router's id and prefill leases "<router id>-<8 hex>" and looks the id
// up exactly: nothing renews, every id is unknown, the lease lapses at its
// initial duration (vLLM #53095). Fixed: decode heartbeats its own id and
// prefill matches it by base id: the lease is renewed and outlives it.
func TestPushHeartbeatKeys(t *testing.T) {
	for _, tc := range []struct {
		keys    HeartbeatKeys
		renewed bool
	}{
		{HBKeysUpstream, false},
		{"", false}, // the default is upstream's
		{HBKeysFixed, true},
	} {
		t.Run(cmpOr(string(tc.keys), "default"), func(t *testing.T) {
			clk := newFakeClock()
			p, d, rec := leaseEngines(t, ProtoPush, func(c *Config) { c.Clock, c.PushHeartbeatKeys = clk, tc.keys })
			pr, err := p.pre.Prefill(context.Background(), PrefillRequest{ID: "cmpl-7", Tokens: 32, Key: 3})
			if err != nil {
				t.Fatal(err)
			}
			if pushmatch.BaseRequestID(pr.RequestID) != "cmpl-7" || pr.RequestID == "cmpl-7" {
				t.Fatalf("prefill leases %q, want the router's id with prefill's suffix", pr.RequestID)
			}
			// Decode has the request from the router (its coordinates name
			// the router's id) and waits: it heartbeats from its arrival.
			d.dec.track("cmpl-7-"+randHex(4), pushCoords(p, "cmpl-7"))
			// 0.6 s lease, heartbeats every 100 ms extending to now+400 ms:
			// at 0.9 s only a renewed lease is still held.
			for range 9 {
				leaseStep(t, clk, p, d, 100*time.Millisecond)
			}
			st := p.Stats()
			if st.Heartbeats == 0 {
				t.Fatal("prefill got no heartbeat")
			}
			held := st.BlocksInUse > 0
			if tc.renewed {
				if !held || st.Leases.Renewed == 0 || st.Leases.UnknownRenewals != 0 || st.ExpiredLeases != 0 {
					t.Errorf("fixed keys: held %v, prefill %+v leases %+v", held, st, *st.Leases)
				}
				return
			}
			if held || st.Leases.Renewed != 0 || st.Leases.UnknownRenewals < st.Heartbeats || st.ExpiredLeases != 1 {
				t.Errorf("upstream keys: held %v, prefill %+v leases %+v", held, st, *st.Leases)
			}
			if ev := waitFreed(t, rec, FreedExpired); ev.Renewals != 0 || ev.ID != pr.RequestID {
				t.Errorf("freed %+v", ev)
			}
		})
	}
}

func cmpOr(s, def string) string {
	if s == "" {
		return def
	}
	return s
}

// Upstream's registration watchdog (the default) only drops the
// registration and logs: the request keeps waiting, and prefill's WRITE
// after it still completes it. Its default is push_registration_timeout's,
// 480 s.
func TestPushWatchdogDrops(t *testing.T) {
	clk := newFakeClock()
	p, d, _ := engines(t, ProtoPush, 1, 1, func(c *Config) { c.Clock, c.RegTimeout = clk, 0 })
	if time.Duration(d.cfg.RegTimeout) != DefaultRegTimeout || d.cfg.RegWatchdog != WatchdogDrop || d.cfg.PushHeartbeatKeys != HBKeysUpstream {
		t.Fatalf("defaults: timeout %v watchdog %q keys %q", d.cfg.RegTimeout, d.cfg.RegWatchdog, d.cfg.PushHeartbeatKeys)
	}
	loaded := loadAsync(d, LoadRequest{ID: "slow", Tokens: 64, Key: 4, Params: pushCoords(p, "slow")})
	id := waitWaiting(t, d)
	if got := time.Duration(d.dec.waitDeadline(id) - clk.Now()); got != 480*time.Second {
		t.Fatalf("watchdog in %v, want 480s", got)
	}
	// Decode's step at the deadline, and one after it; the clock itself
	// stays, so prefill keeps the registration it parked.
	d.dec.watchdog(clk.Now() + int64(480*time.Second))
	d.dec.watchdog(clk.Now() + int64(481*time.Second)) // fires once
	if st := d.Stats(); st.RegTimeouts != 1 || st.BlocksInUse == 0 {
		t.Fatalf("after the watchdog: %+v", st)
	}
	select {
	case lr := <-loaded:
		t.Fatalf("the dropped registration failed the request: %+v", lr)
	case <-time.After(50 * time.Millisecond):
	}
	// Prefill's WRITE comes after all (PUSH_REG reached it before the
	// watchdog): the request completes.
	if _, err := p.pre.Prefill(context.Background(), PrefillRequest{ID: "slow", Tokens: 64, Key: 4}); err != nil {
		t.Fatal(err)
	}
	select {
	case lr := <-loaded:
		if lr.Error != "" || lr.CorruptBlocks != 0 || strings.Contains(lr.Error, "watchdog") {
			t.Fatalf("late WRITE: %+v", lr)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no reply after the WRITE")
	}
}
