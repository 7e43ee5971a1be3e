package engine

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/nixlctl/nixlctl/internal/testkit"

	"go.uber.org/goleak"

	"github.com/nixlctl/nixlctl/internal/lease"
	"github.com/nixlctl/nixlctl/internal/nixl"
	"github.com/nixlctl/nixlctl/internal/runcore"
)

// The lease protocol between real engines (one process, real UCX):
// decode heartbeats what it waits for from the moment it arrives, prefill
// extends those leases, and frees the ones nobody heartbeats.

const testLease = 600 * time.Millisecond // extension 400 ms, heartbeat every 100 ms

func leaseEngines(t *testing.T, proto Protocol, mut func(*Config)) (*Engine, *Engine, *evRecorder) {
	t.Helper()
	return engines(t, proto, 1, 1, func(c *Config) {
		c.Lease, c.Step, c.DecodeSlots = runcore.Duration(testLease), 5*time.Millisecond, 1
		if mut != nil {
			mut(c)
		}
	})
}

// loadAsync starts a load and returns its reply later.
func loadAsync(d *Engine, r LoadRequest) <-chan LoadReply {
	ch := make(chan LoadReply, 1)
	go func() {
		lr, _ := d.dec.Load(context.Background(), r)
		ch <- lr
	}()
	return ch
}

func TestLeaseHeartbeatsKeepQueuedRequestsAlive(t *testing.T) {
	for _, proto := range []Protocol{ProtoPull, ProtoPush} {
		t.Run(string(proto), func(t *testing.T) {
			// Push heartbeats renew only with fixed keys (upstream's never
			// do: TestPushHeartbeatKeys).
			p, d, rec := leaseEngines(t, proto, func(c *Config) { c.DecodeHold, c.PushHeartbeatKeys = 4*testLease/3, HBKeysFixed })
			ctx := context.Background()
			var replies []<-chan LoadReply
			for i := range 3 {
				id := fmt.Sprintf("hb-%d", i)
				r := PrefillRequest{ID: id, Tokens: 48, Key: uint64(70 + i)}
				lr := LoadRequest{ID: id, Tokens: 48, Key: r.Key}
				if proto == ProtoPull {
					pr, err := p.pre.Prefill(ctx, r)
					if err != nil {
						t.Fatal(err)
					}
					lr.Params = pr.Params
					replies = append(replies, loadAsync(d, lr))
				} else {
					lr.Params = pushCoords(p, id)
					replies = append(replies, loadAsync(d, lr))
					if _, err := p.pre.Prefill(ctx, r); err != nil {
						t.Fatal(err)
					}
				}
				// Decode's queue is first come first served: hb-i must be in
				// it before hb-i+1 is sent.
				waitFor(t, "decode to take "+id, func() bool {
					d.dec.mu.Lock()
					defer d.dec.mu.Unlock()
					return d.dec.running+len(d.dec.queue) >= i+1
				})
			}
			// The last one waits 2 x 0.8 s in decode's queue: longer than the
			// 0.6 s lease, kept by heartbeats.
			for i, ch := range replies {
				select {
				case lr := <-ch:
					if lr.Error != "" || lr.CorruptBlocks != 0 {
						t.Errorf("request %d: %s (corrupt %d)", i, lr.Error, lr.CorruptBlocks)
					}
					if i == 2 && time.Duration(lr.TScheduled-lr.TArrive) < testLease {
						t.Errorf("request 2 waited only %v: the test did not queue it past the lease", time.Duration(lr.TScheduled-lr.TArrive))
					}
				case <-time.After(20 * time.Second):
					t.Fatal("no reply")
				}
			}
			for range 3 {
				ev := waitFreed(t, rec, map[Protocol]FreedReason{ProtoPull: FreedConsumed, ProtoPush: FreedPushed}[proto])
				if ev.Renewals == 0 && ev.RouterID != "hb-0" {
					t.Errorf("%s was freed without a heartbeat: %+v", ev.RouterID, ev)
				}
			}
			ps, ds := p.Stats(), d.Stats()
			if ps.ExpiredLeases != 0 || ps.Leases.Renewed == 0 || ps.Heartbeats == 0 || ds.HeartbeatsSent == 0 {
				t.Errorf("prefill %+v %+v, decode sent %d", ps, *ps.Leases, ds.HeartbeatsSent)
			}
			d.dec.mu.Lock()
			tracked := d.dec.tracker.Tracked()
			d.dec.mu.Unlock()
			if tracked != 0 {
				t.Errorf("decode still heartbeats %d requests after their KV arrived", tracked)
			}
		})
	}
}

func pushCoords(p *Engine, id string) TransferParams {
	host, port, _ := splitEndpoint(p.side.Endpoint())
	return TransferParams{DoRemotePrefill: true, RemoteEngineID: p.cfg.EngineID, RemoteRequestID: id, RemoteHost: host,
		RemotePort: port, TPSize: p.spec.TP, PPSize: 1, TransferMode: string(ProtoPush)}
}

func TestLeaseExpiresWithoutHeartbeats(t *testing.T) {
	// The fixed policy sends none: a queued request outlives its timeout
	// and its blocks are freed under it: the late READ sees poisoned tags.
	clk := newFakeClock()
	t0 := clk.Now()
	p, d, rec := leaseEngines(t, ProtoPull, func(c *Config) {
		c.LeasePolicy, c.FixedTimeout, c.DecodeHold = lease.PolicyFixed, 300*time.Millisecond, 800*time.Millisecond
		c.Clock = clk
	})
	ctx := context.Background()
	var chs []<-chan LoadReply
	for i := range 2 {
		pr, err := p.pre.Prefill(ctx, PrefillRequest{ID: fmt.Sprintf("fx-%d", i), Tokens: 32, Key: uint64(90 + i)})
		if err != nil {
			t.Fatal(err)
		}
		chs = append(chs, loadAsync(d, LoadRequest{ID: pr.Params.RemoteRequestID, Tokens: 32, Key: uint64(90 + i), Params: pr.Params}))
		// The queue is first come first served: fx-0 must hold the slot
		// (or wait in the queue) before fx-1 arrives.
		waitFor(t, "decode to take request "+fmt.Sprint(i), func() bool {
			d.dec.mu.Lock()
			defer d.dec.mu.Unlock()
			return d.dec.running+len(d.dec.queue) == i+1
		})
	}
	// fx-0 is read and decodes for 800 ms (real time) holding the only
	// slot; meanwhile fx-1's timeout passes on the engines' clock.
	if first := <-chs[0]; first.Error != "" || first.CorruptBlocks != 0 {
		t.Errorf("first: %+v", first)
	}
	waitFreed(t, rec, "consumed")
	p.pre.step(clk.Advance(300*time.Millisecond - 1))
	if st := p.Stats(); st.ExpiredLeases != 0 {
		t.Fatalf("freed before the fixed timeout: %+v", st)
	}
	p.pre.step(clk.Advance(1))
	ev := waitFreed(t, rec, "expired")
	if ev.Renewals != 0 || ev.TDeadline != t0+int64(300*time.Millisecond) {
		t.Errorf("fixed timeout: deadline %v after the grant, %d renewals", time.Duration(ev.TDeadline-t0), ev.Renewals)
	}
	if second := <-chs[1]; second.CorruptBlocks == 0 {
		t.Errorf("the read after the timeout was not caught: %+v", second)
	}
	deadline := time.Now().Add(5 * time.Second)
	for p.Stats().UnknownNotifs == 0 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if st := p.Stats(); st.ExpiredLeases != 1 || st.UnknownNotifs != 1 || st.Leases.IgnoredRenewals != 0 {
		t.Errorf("prefill: %+v", st)
	}
	if d.Stats().HeartbeatsSent != 0 {
		t.Errorf("fixed policy: decode sent heartbeats")
	}
}

func TestAbortStopsHeartbeatsAndTheLeaseLapses(t *testing.T) {
	clk := newFakeClock()
	p, d, rec := leaseEngines(t, ProtoPull, func(c *Config) { c.DecodeHold = 3 * testLease; c.Clock = clk })
	ctx := context.Background()
	var chs []<-chan LoadReply
	var ids []string
	for i := range 2 {
		pr, err := p.pre.Prefill(ctx, PrefillRequest{ID: fmt.Sprintf("ab-%d", i), Tokens: 32, Key: uint64(40 + i)})
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, pr.RequestID)
		chs = append(chs, loadAsync(d, LoadRequest{ID: fmt.Sprintf("ab-%d", i), Tokens: 32, Key: uint64(40 + i), Params: pr.Params}))
		waitFor(t, "decode to take request "+fmt.Sprint(i), func() bool { // keep the order in decode's queue
			d.dec.mu.Lock()
			defer d.dec.mu.Unlock()
			return d.dec.running+len(d.dec.queue) == i+1
		})
	}
	if lr := <-chs[0]; lr.Error != "" {
		t.Fatal(lr.Error)
	}
	waitFreed(t, rec, "consumed")
	for range 6 { // a few heartbeats for ab-1, half a lease
		leaseStep(t, clk, p, d, testLease/12)
	}
	if d.dec.Abort("nope") {
		t.Error("aborted an unknown request")
	}
	tAbort := clk.Now()
	if !d.dec.Abort("ab-1") {
		t.Fatal("ab-1 was not in the queue")
	}
	if lr := <-chs[1]; lr.Error != errAborted.Error() {
		t.Errorf("aborted load: %q", lr.Error)
	}
	// Its heartbeats stopped: the lease lapses an extension after the last
	// one, which came at most an interval before the abort.
	ext, iv := 2*testLease/3, testLease/6
	for p.Stats().ExpiredLeases == 0 && time.Duration(clk.Now()-tAbort) <= 2*ext {
		leaseStep(t, clk, p, d, testLease/12)
	}
	ev := waitFreed(t, rec, "expired")
	took := time.Duration(clk.Now() - tAbort)
	if ev.ID != ids[1] || ev.Renewals == 0 || took > ext+iv || took < ext-iv {
		t.Errorf("aborted request freed after %v (extension %v + interval %v), event %+v", took, ext, iv, ev)
	}
	if st := d.Stats(); st.Aborted != 1 || st.Queued != 0 {
		t.Errorf("decode: %+v", st)
	}
}

func TestHeadOnlyReaperLeaksInAnEngine(t *testing.T) {
	// Three finished requests; decode heartbeats only the first (its KV is
	// wanted), the router never gives decode the other two. The full
	// reaper frees those at their lease; the head-only one stops at the
	// first, which stays renewed.
	for _, reaper := range []lease.ReaperMode{lease.ReapFull, lease.ReapHeadOnly} {
		t.Run(string(reaper), func(t *testing.T) {
			clk := newFakeClock()
			p, d, rec := leaseEngines(t, ProtoPull, func(c *Config) { c.Reaper = reaper; c.DecodeHold = 2 * time.Second; c.Clock = clk })
			ctx := context.Background()
			var prs []PrefillReply
			for i := range 4 {
				pr, err := p.pre.Prefill(ctx, PrefillRequest{ID: fmt.Sprintf("ho-%d", i), Tokens: 16, Key: uint64(i + 1)})
				if err != nil {
					t.Fatal(err)
				}
				prs = append(prs, pr)
			}
			// ho-0 decodes for 2 s holding the only slot; ho-1 waits behind it.
			c0 := loadAsync(d, LoadRequest{ID: "ho-0", Tokens: 16, Key: 1, Params: prs[0].Params})
			if lr := <-c0; lr.Error != "" {
				t.Fatal(lr.Error)
			}
			c1 := loadAsync(d, LoadRequest{ID: "ho-1", Tokens: 16, Key: 2, Params: prs[1].Params})
			waitFor(t, "decode to queue ho-1", func() bool {
				d.dec.mu.Lock()
				defer d.dec.mu.Unlock()
				return len(d.dec.queue) == 1
			})
			for range (testLease + 300*time.Millisecond) / (50 * time.Millisecond) {
				leaseStep(t, clk, p, d, 50*time.Millisecond)
			}
			st := p.Stats()
			if reaper == lease.ReapFull && (st.ExpiredLeases != 2 || st.ExpiredUnreleasedMax != 0) {
				t.Errorf("full reaper: %+v", st)
			}
			if reaper == lease.ReapHeadOnly && (st.ExpiredLeases != 0 || st.ExpiredUnreleased != 2) {
				t.Errorf("head-only reaper should hold 2 expired leases behind ho-1: %+v", st)
			}
			if lr := <-c1; lr.Error != "" || lr.CorruptBlocks != 0 {
				t.Errorf("ho-1: %+v", lr)
			}
			// Once ho-1 is consumed, the head-only walk reaches the others.
			deadline := time.Now().Add(5 * time.Second)
			for st := p.Stats(); (st.ExpiredLeases != 2 || st.BlocksInUse != 0) && time.Now().Before(deadline); st = p.Stats() {
				time.Sleep(10 * time.Millisecond)
			}
			if st := p.Stats(); st.ExpiredLeases != 2 || st.BlocksInUse != 0 {
				t.Errorf("after the head left: %+v", st)
			}
			_ = rec
		})
	}
}

func TestDecodeQueueIsFirstComeFirstServed(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	s := &decodeState{slots: 1, e: &Engine{}}
	if err := s.acquire(context.Background(), "a"); err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var order []string
	var wg sync.WaitGroup
	for _, id := range []string{"b", "c", "d"} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := s.acquire(context.Background(), id); err == nil {
				mu.Lock()
				order = append(order, id)
				mu.Unlock()
				s.releaseAfter(0)
			}
		}()
		for { // wait until it is queued, so the order is known
			s.mu.Lock()
			n := len(s.queue)
			last := n > 0 && s.queue[n-1].router == id
			s.mu.Unlock()
			if last {
				break
			}
			time.Sleep(time.Millisecond)
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancelled := make(chan error, 1)
	go func() { cancelled <- s.acquire(ctx, "e") }()
	for {
		s.mu.Lock()
		n := len(s.queue)
		s.mu.Unlock()
		if n == 4 {
			break
		}
		time.Sleep(time.Millisecond)
	}
	cancel()
	if err := <-cancelled; err == nil {
		t.Error("cancelled waiter got a slot")
	}
	s.releaseAfter(0)
	wg.Wait()
	if fmt.Sprint(order) != "[b c d]" {
		t.Errorf("served %v", order)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.running != 0 || len(s.queue) != 0 {
		t.Errorf("running %d queued %d", s.running, len(s.queue))
	}
}

// The heartbeat loss plan goes through the fault wrapper on decode's
// agent: every other heartbeat is dropped, and the leases still hold.
func TestHeartbeatLossEveryOther(t *testing.T) {
	p, d, rec := leaseEngines(t, ProtoPull, func(c *Config) {
		c.DecodeHold = 2 * testLease
		c.Faults = &nixl.Faults{DropSend: 0.5, DropSendEvenly: true, NotifPrefix: "HB:"}
	})
	ctx := context.Background()
	var chs []<-chan LoadReply
	for i := range 2 {
		pr, err := p.pre.Prefill(ctx, PrefillRequest{ID: fmt.Sprintf("hl-%d", i), Tokens: 16, Key: uint64(7 + i)})
		if err != nil {
			t.Fatal(err)
		}
		chs = append(chs, loadAsync(d, LoadRequest{ID: fmt.Sprintf("hl-%d", i), Tokens: 16, Key: uint64(7 + i), Params: pr.Params}))
		time.Sleep(20 * time.Millisecond)
	}
	for _, ch := range chs {
		if lr := <-ch; lr.Error != "" || lr.CorruptBlocks != 0 {
			t.Errorf("%+v", lr)
		}
	}
	waitFreed(t, rec, "consumed")
	waitFreed(t, rec, "consumed")
	ds := d.Stats()
	if ds.HeartbeatsLost == 0 || ds.HeartbeatsLost > ds.HeartbeatsSent/2+1 || p.Stats().ExpiredLeases != 0 {
		t.Errorf("decode sent %d lost %d; prefill %+v", ds.HeartbeatsSent, ds.HeartbeatsLost, p.Stats())
	}
}

// waitFor polls cond until it holds or 10 s pass (then the test fails).
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	testkit.WaitFor(t, 0, what, cond, nil)
}

// leaseStep moves the engines' fake clock by dt and runs one engine step
// on each side as their loops would at that time: decode sends the
// heartbeats that are due (shaking hands first if it must), prefill gets
// them, then applies them and reaps. Nothing waits for time to pass, so
// a loaded machine cannot make a heartbeat late.
func leaseStep(t *testing.T, clk *fakeClock, p, d *Engine, dt time.Duration) {
	t.Helper()
	now := clk.Advance(dt)
	waitFor(t, "decode's heartbeat handshake", func() bool {
		d.dec.heartbeatStep(now)
		d.dec.mu.Lock()
		defer d.dec.mu.Unlock()
		hp := d.dec.hb[p.cfg.EngineID]
		return hp == nil || hp.ready
	})
	d.dec.heartbeatStep(now) // a batch held back while the handshake ran goes now
	sent := d.Stats().HeartbeatsSent
	waitStat(t, "heartbeats at prefill", func() int64 { return p.Stats().Heartbeats }, sent)
	p.pre.step(now)
}
