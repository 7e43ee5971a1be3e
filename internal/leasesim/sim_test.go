package leasesim

import (
	"fmt"
	"math"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	"github.com/nixlctl/nixlctl/internal/lease"
)

var simLeases = []time.Duration{time.Second, 3 * time.Second, 30 * time.Second}

var simGeom = SimGeometry{BytesPerRequest: 1e9, BlocksPerRequest: 16}

func simLC(t testing.TB, c lease.Config) lease.Config {
	t.Helper()
	n, err := c.Normalize()
	if err != nil {
		t.Fatal(err)
	}
	return n
}

func simPlan(t testing.TB, scenario string, lc lease.Config) ChaosPlan {
	t.Helper()
	p, err := PlanFor(scenario, lc)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// simCounts is what the expectations pin down exactly.
type simCounts struct {
	Completed, Failed, Recomputed, Aborted, Lost, Consumed int
	Expired, Premature, LateReads, ExpiredUnreleased       int
	Leaked                                                 int64
}

func countsOf(r ScenarioResult) simCounts {
	return simCounts{r.Completed, r.Failed, r.Recomputed, r.Aborted, r.Lost, r.Consumed,
		r.ExpiredLeases, r.PrematureFrees, r.LateReadsDetected, r.ExpiredUnreleased, r.LeakedBlocks}
}

var (
	allComplete = simCounts{Completed: 8, Consumed: 8}
	crashCounts = simCounts{Completed: 3, Consumed: 3, Lost: 5, Expired: 5}
	abortCounts = simCounts{Completed: 2, Consumed: 2, Aborted: 4, Expired: 4}
	restartCnts = simCounts{Completed: 6, Consumed: 6, Failed: 6, Recomputed: 6}
)

// simWant is each scenario's counts under the lease policy and under a
// long fixed timeout: the same for all but the decode stall, whose
// counts (stall) tell the two apart.
func simWant(stall simCounts) map[string]simCounts {
	return map[string]simCounts{
		ScenarioDecodeOverload: allComplete,
		ScenarioHeartbeatLoss:  allComplete,
		ScenarioSlowStep:       allComplete,
		ScenarioDecodeCrash:    crashCounts,
		ScenarioDecodeStall:    stall,
		ScenarioAbortBeforeRd:  abortCounts,
		ScenarioPrefillRestart: restartCnts,
	}
}

func TestSimulatePlanLeasePolicy(t *testing.T) {
	t.Parallel()
	want := simWant(simCounts{Completed: 2, Consumed: 2, Failed: 6, Recomputed: 6, Expired: 6, Premature: 6, LateReads: 6})
	for _, L := range simLeases {
		lc := simLC(t, lease.Config{Duration: L})
		for _, sc := range Scenarios() {
			t.Run(fmt.Sprintf("%s/%v", sc, L), func(t *testing.T) {
				t.Parallel()
				p := simPlan(t, sc, lc)
				r := SimulatePlan(p, lc, simGeom)
				if d := cmp.Diff(want[sc], countsOf(r)); d != "" {
					t.Errorf("counts (-want +got):\n%s", d)
				}
				if !r.Passed {
					t.Errorf("judge failed: %s\noutcome: %s", r.Expectation, r.Outcome)
				}
				if r.Mode != "sim" || r.Requests != p.Requests || r.Policy != "lease" || r.Reaper != "full" || r.LeaseS != L.Seconds() || r.StepS != p.Step.Seconds() {
					t.Errorf("header: %+v", r)
				}
				switch sc {
				case ScenarioDecodeOverload, ScenarioHeartbeatLoss, ScenarioSlowStep:
					// Request 7 waits for 7 others: each holds 0.6 L plus a 1 ms
					// read; it arrives 7 gaps after the first.
					if w := 7 * (0.6*L.Seconds() + 0.001 - p.ArrivalGap.Seconds()); math.Abs(r.MaxQueueWaitS-w) > 1e-6 {
						t.Errorf("max queue wait %.6fs, want %.6fs", r.MaxQueueWaitS, w)
					}
					if r.HeartbeatsSent == 0 || r.HeartbeatsRecvd != r.HeartbeatsSent-r.HeartbeatsLost {
						t.Errorf("heartbeats sent %d lost %d received %d", r.HeartbeatsSent, r.HeartbeatsLost, r.HeartbeatsRecvd)
					}
				case ScenarioDecodeCrash:
					limit := lc.Extension().Seconds() + lc.HeartbeatInterval().Seconds() + 2*p.Step.Seconds()
					if r.DeathToFreeS.Count != 5 || r.DeathToFreeS.Max > limit {
						t.Errorf("death to free %+v, want 5 within %.3fs", r.DeathToFreeS, limit)
					}
					// Five 1 GB leases dead from the kill to their common free.
					if got := 5 * r.DeathToFreeS.Max; math.Abs(r.DeadBlockGBs-got) > 1e-6 {
						t.Errorf("dead GB·s %.6f, want %.6f", r.DeadBlockGBs, got)
					}
				case ScenarioAbortBeforeRd:
					if r.DeathToFreeS.Count != 4 || r.ExpiredUnreleasedEnd != 0 {
						t.Errorf("death to free %+v, expired held at the end %d", r.DeathToFreeS, r.ExpiredUnreleasedEnd)
					}
				case ScenarioPrefillRestart:
					// Heartbeats to the dead prefill go out and are never applied.
					if r.HeartbeatsRecvd >= r.HeartbeatsSent {
						t.Errorf("heartbeats sent %d received %d", r.HeartbeatsSent, r.HeartbeatsRecvd)
					}
				}
				if sc == ScenarioHeartbeatLoss {
					if r.HeartbeatsLost != r.HeartbeatsSent/2 {
						t.Errorf("lost %d of %d heartbeats, want half", r.HeartbeatsLost, r.HeartbeatsSent)
					}
				} else if r.HeartbeatsLost != 0 {
					t.Errorf("lost %d heartbeats without loss", r.HeartbeatsLost)
				}
			})
		}
	}
}

// The head-only reaper stops at the renewed head (request 1, queued
// behind request 0's long decode): the aborted requests' leases expire
// behind it and stay held until it is consumed (vLLM issue #58222).
func TestSimulatePlanHeadOnlyReaperLeaksAbortedLeases(t *testing.T) {
	t.Parallel()
	for _, L := range simLeases {
		lc := simLC(t, lease.Config{Duration: L, Reaper: lease.ReapHeadOnly})
		p := simPlan(t, ScenarioAbortBeforeRd, lc)
		r := SimulatePlan(p, lc, simGeom)
		want := abortCounts
		want.ExpiredUnreleased = 4
		if d := cmp.Diff(want, countsOf(r)); d != "" {
			t.Errorf("%v: counts (-want +got):\n%s", L, d)
		}
		if r.Passed || !strings.Contains(r.Expectation, "NOT MET: 0 leases expired but not released") {
			t.Errorf("%v: judge passed a leaking reaper: %s", L, r.Expectation)
		}
		if r.ExpiredUnreleasedEnd != 0 {
			t.Errorf("%v: %d still expired and held at the end", L, r.ExpiredUnreleasedEnd)
		}
		// They are freed only once request 1 (the head) is consumed, late.
		full := SimulatePlan(p, simLC(t, lease.Config{Duration: L}), simGeom)
		if r.DeathToFreeS.Max <= full.DeathToFreeS.Max || r.DeadBlockGBs <= full.DeadBlockGBs {
			t.Errorf("%v: head-only death to free %.3fs (%.1f GB·s), full %.3fs (%.1f GB·s)", L,
				r.DeathToFreeS.Max, r.DeadBlockGBs, full.DeathToFreeS.Max, full.DeadBlockGBs)
		}
	}
}

func TestSimulatePlanFixedPolicyLongTimeout(t *testing.T) {
	t.Parallel()
	want := simWant(allComplete)
	for _, L := range simLeases {
		lc := simLC(t, lease.Config{Policy: lease.PolicyFixed, Duration: L, Timeout: 16 * L})
		for _, sc := range Scenarios() {
			p := simPlan(t, sc, lc)
			r := SimulatePlan(p, lc, simGeom)
			if d := cmp.Diff(want[sc], countsOf(r)); d != "" {
				t.Errorf("%s/%v: counts (-want +got):\n%s", sc, L, d)
			}
			if !r.Passed {
				t.Errorf("%s/%v: judge failed: %s", sc, L, r.Expectation)
			}
			if r.HeartbeatsSent != 0 {
				t.Errorf("%s/%v: %d heartbeats under the fixed policy", sc, L, r.HeartbeatsSent)
			}
			// The dead requests' blocks are freed exactly Timeout after their grant.
			if r.ExpiredLeases > 0 && (r.ReclaimLatencyS.Min != lc.Timeout.Seconds() || r.ReclaimLatencyS.Max != lc.Timeout.Seconds()) {
				t.Errorf("%s/%v: reclaim %+v, want %v", sc, L, r.ReclaimLatencyS, lc.Timeout)
			}
		}
	}
}

// A fixed timeout of 3.3 leases is shorter than the waits of requests 6
// (6 x 0.6 L) and 7: their blocks are freed before decode reads them, and
// decode catches both reads.
func TestSimulatePlanFixedPolicyShortTimeoutFreesQueuedRequests(t *testing.T) {
	t.Parallel()
	for _, L := range simLeases {
		lc := simLC(t, lease.Config{Policy: lease.PolicyFixed, Duration: L, Timeout: L * 33 / 10})
		r := SimulatePlan(simPlan(t, ScenarioDecodeOverload, lc), lc, simGeom)
		want := simCounts{Completed: 6, Consumed: 6, Failed: 2, Recomputed: 2, Expired: 2, Premature: 2, LateReads: 2}
		if d := cmp.Diff(want, countsOf(r)); d != "" {
			t.Errorf("%v: counts (-want +got):\n%s", L, d)
		}
		if !r.Passed {
			t.Errorf("%v: judge failed: %s", L, r.Expectation)
		}
		var expired []int
		for _, l := range r.Timeline.Leases {
			if l.Outcome == "expired" {
				expired = append(expired, l.Request)
			}
		}
		if !slices.Equal(expired, []int{6, 7}) {
			t.Errorf("%v: expired leases of requests %v, want [6 7]", L, expired)
		}
	}
}

// simConfigs are the configurations the equivalence and determinism
// tests play every scenario under.
func simConfigs(L time.Duration) []lease.Config {
	return []lease.Config{
		{Duration: L},
		{Duration: L, Reaper: lease.ReapHeadOnly},
		{Policy: lease.PolicyFixed, Duration: L, Timeout: 16 * L},
		{Policy: lease.PolicyFixed, Duration: L, Timeout: L * 33 / 10},
	}
}

// Scheduling steps only where something can happen must give exactly what
// stepping at every boundary gives (the held-leases samples aside: they
// are taken at every prefill step processed).
func TestSimulatePlanSteppingEquivalence(t *testing.T) {
	t.Parallel()
	for _, L := range simLeases {
		for _, c := range simConfigs(L) {
			lc := simLC(t, c)
			for _, sc := range Scenarios() {
				p := simPlan(t, sc, lc)
				skip := simulatePlan(p, lc, simGeom, false)
				every := simulatePlan(p, lc, simGeom, true)
				if d := cmp.Diff(every, skip, cmpopts.IgnoreFields(LeaseTimeline{}, "Held")); d != "" {
					t.Errorf("%s %s/%s timeout %v L %v: every step vs skipping (-every +skip):\n%s", sc, lc.Policy, lc.Reaper, lc.Timeout, L, d)
				}
				if len(every.Timeline.Held) < len(skip.Timeline.Held) {
					t.Errorf("%s: stepping every boundary took fewer samples (%d) than skipping (%d)", sc, len(every.Timeline.Held), len(skip.Timeline.Held))
				}
			}
		}
	}
}

func TestSimulatePlanDeterministicAndTimeline(t *testing.T) {
	t.Parallel()
	lc := simLC(t, lease.Config{Duration: 3 * time.Second})
	faults := map[string][]string{
		ScenarioDecodeOverload: nil,
		ScenarioHeartbeatLoss:  nil,
		ScenarioSlowStep:       nil,
		ScenarioDecodeCrash:    {"decode-kill"},
		ScenarioDecodeStall:    {"decode-stall", "decode-resume"},
		ScenarioAbortBeforeRd:  {"abort"},
		ScenarioPrefillRestart: {"prefill-kill"},
	}
	for _, sc := range Scenarios() {
		p := simPlan(t, sc, lc)
		a, b := SimulatePlan(p, lc, simGeom), SimulatePlan(p, lc, simGeom)
		if d := cmp.Diff(a, b); d != "" {
			t.Errorf("%s: two runs differ:\n%s", sc, d)
		}
		tl := a.Timeline
		var what []string
		for _, f := range tl.Faults {
			what = append(what, f.What)
		}
		if !slices.Equal(what, faults[sc]) {
			t.Errorf("%s: faults %v, want %v", sc, what, faults[sc])
		}
		if len(tl.Heartbeats) != int(a.HeartbeatsRecvd) || !slices.IsSorted(tl.Heartbeats) {
			t.Errorf("%s: %d heartbeats on the timeline, %d received", sc, len(tl.Heartbeats), a.HeartbeatsRecvd)
		}
		// One lease per request granted, each ended once.
		outcomes := map[string]int{}
		seen := map[int]bool{}
		for _, l := range tl.Leases {
			outcomes[l.Outcome]++
			if seen[l.Request] || l.End < l.Start {
				t.Errorf("%s: lease %+v", sc, l)
			}
			seen[l.Request] = true
		}
		if len(tl.Leases) != p.Requests || outcomes["consumed"] != a.Consumed || outcomes["expired"] != a.ExpiredLeases || outcomes["held"] != 0 {
			t.Errorf("%s: lease outcomes %v for %d requests", sc, outcomes, p.Requests)
		}
		if sc == ScenarioPrefillRestart && outcomes["discarded"] != 6 {
			t.Errorf("prefill-restart: %d leases discarded with the dead prefill, want 6", outcomes["discarded"])
		}
		if len(tl.Held) == 0 || tl.Held[len(tl.Held)-1].Held != 0 || !slices.IsSortedFunc(tl.Held, func(x, y TimelineSample) int { return cmpFloat(x.T, y.T) }) {
			t.Errorf("%s: held samples %v", sc, tl.Held)
		}
		if a.Seconds <= 0 || a.Seconds < tl.Leases[len(tl.Leases)-1].End {
			t.Errorf("%s: ran %.3fs", sc, a.Seconds)
		}
	}
}

func cmpFloat(a, b float64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// A plan whose decode dies at a fixed time: requests that reach decode
// after the death are lost too, and every lease lapses.
func TestSimulatePlanKillDecodeAt(t *testing.T) {
	t.Parallel()
	lc := simLC(t, lease.Config{Duration: 3 * time.Second})
	p := simPlan(t, ScenarioDecodeOverload, lc)
	p.ArrivalGap = time.Second
	p.KillDecodeAt = 2500 * time.Millisecond // 0 and 1 read (1 at 1.801 s), 2 queued, 3-7 not there yet
	r := SimulatePlan(p, lc, simGeom)
	want := simCounts{Completed: 2, Consumed: 2, Lost: 6, Expired: 6}
	if d := cmp.Diff(want, countsOf(r)); d != "" {
		t.Errorf("counts (-want +got):\n%s", d)
	}
	if r.DeathToFreeS.Count != 6 || r.DeathToFreeS.Min < 0 {
		t.Errorf("death to free %+v", r.DeathToFreeS)
	}
}

func smallTraffic() TrafficOptions {
	o := DefaultTrafficOptions()
	o.Requests = 4000
	o.Lease.Duration = 3 * time.Second
	o.CrashEvery = 5 * time.Second
	o.RestartAfter = time.Second
	o.HBLoss = 0.3
	return o
}

func TestSimulateTrafficConservation(t *testing.T) {
	t.Parallel()
	for _, o := range []TrafficOptions{smallTraffic(), func() TrafficOptions {
		o := smallTraffic()
		o.Lease.Policy, o.Lease.Timeout = lease.PolicyFixed, 2*time.Second
		o.Rate, o.Decodes = 300, 3 // queues: the short timeout frees waiting requests
		return o
	}(), func() TrafficOptions {
		o := smallTraffic()
		o.Lease.Reaper = lease.ReapHeadOnly
		return o
	}()} {
		r, err := SimulateTraffic(o)
		if err != nil {
			t.Fatal(err)
		}
		name := fmt.Sprintf("%s/%s", r.Policy, r.Reaper)
		if r.Completed+r.Failed+r.Lost != o.Requests || r.SimulatedRequests != o.Requests {
			t.Errorf("%s: %d completed + %d failed + %d lost != %d requests", name, r.Completed, r.Failed, r.Lost, o.Requests)
		}
		if r.LeasesHeldAtEnd != 0 || r.Truncated {
			t.Errorf("%s: %d leases held at the end (truncated %v)", name, r.LeasesHeldAtEnd, r.Truncated)
		}
		// Every lost request's lease lapses; the other lapses were premature
		// and decode caught the read.
		if r.ExpiredLeases != r.Lost+r.LateReadsDetected || r.Failed != r.LateReadsDetected || r.Recomputed != r.Failed || r.Consumed != r.Completed {
			t.Errorf("%s: expired %d, lost %d, late reads %d, failed %d, recomputed %d, consumed %d, completed %d", name,
				r.ExpiredLeases, r.Lost, r.LateReadsDetected, r.Failed, r.Recomputed, r.Consumed, r.Completed)
		}
		if r.PrematureFrees < r.LateReadsDetected || r.Crashes == 0 || r.Lost == 0 {
			t.Errorf("%s: premature %d, late reads %d, crashes %d, lost %d", name, r.PrematureFrees, r.LateReadsDetected, r.Crashes, r.Lost)
		}
		if r.Policy == "lease" && (r.HeartbeatsLost == 0 || r.HeartbeatsRecvd != r.HeartbeatsSent-r.HeartbeatsLost) {
			t.Errorf("%s: heartbeats sent %d lost %d received %d", name, r.HeartbeatsSent, r.HeartbeatsLost, r.HeartbeatsRecvd)
		}
		if r.Policy == "fixed" && r.PrematureFrees == 0 {
			t.Errorf("%s: a 2 s timeout under queueing freed nothing early (max wait %.2fs)", name, r.MaxQueueWaitS)
		}
	}
}

func TestSimulateTrafficSeeds(t *testing.T) {
	t.Parallel()
	o := smallTraffic()
	a, err := SimulateTraffic(o)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := SimulateTraffic(o)
	ignoreWall := cmpopts.IgnoreFields(TrafficResult{}, "WallSeconds")
	if d := cmp.Diff(a, b, ignoreWall); d != "" {
		t.Errorf("same seed, different results:\n%s", d)
	}
	o.Seed++
	c, _ := SimulateTraffic(o)
	if cmp.Equal(a, c, ignoreWall) || a.SimulatedSeconds == c.SimulatedSeconds {
		t.Errorf("seeds %d and %d gave the same run", o.Seed-1, o.Seed)
	}
}

func TestSimulateTrafficSteppingEquivalence(t *testing.T) {
	t.Parallel()
	for _, o := range []TrafficOptions{smallTraffic(), func() TrafficOptions {
		o := smallTraffic()
		o.Lease.Reaper = lease.ReapHeadOnly
		o.Step = 70 * time.Millisecond // not a divisor of the interval
		return o
	}()} {
		o.Requests = 1500
		skip, err := simulateTraffic(o, false)
		if err != nil {
			t.Fatal(err)
		}
		every, _ := simulateTraffic(o, true)
		if d := cmp.Diff(every, skip, cmpopts.IgnoreFields(TrafficResult{}, "WallSeconds", "Events")); d != "" {
			t.Errorf("%s: every step vs skipping (-every +skip):\n%s", o.Lease.Reaper, d)
		}
		if every.Events <= skip.Events {
			t.Errorf("stepping every boundary took %d events, skipping %d", every.Events, skip.Events)
		}
	}
}

// Without crashes or lost heartbeats, and with queue waits far below the
// lease, nothing expires.
func TestSimulateTrafficNoFaultsNothingExpires(t *testing.T) {
	t.Parallel()
	o := DefaultTrafficOptions()
	o.Requests, o.CrashEvery, o.HBLoss = 20000, 0, 0
	r, err := SimulateTraffic(o)
	if err != nil {
		t.Fatal(err)
	}
	if r.MaxQueueWaitS > o.Lease.Duration.Seconds()/3 {
		t.Fatalf("queue waits up to %.1fs: not far below the %v lease", r.MaxQueueWaitS, o.Lease.Duration)
	}
	want := TrafficResult{Completed: o.Requests, Consumed: o.Requests}
	got := TrafficResult{Completed: r.Completed, Consumed: r.Consumed, Failed: r.Failed, Lost: r.Lost, ExpiredLeases: r.ExpiredLeases,
		PrematureFrees: r.PrematureFrees, DeadBlockGBs: r.DeadBlockGBs, HeartbeatsLost: r.HeartbeatsLost, Crashes: r.Crashes}
	if d := cmp.Diff(want, got); d != "" {
		t.Errorf("(-want +got):\n%s", d)
	}
	if r.HeartbeatsSent == 0 || r.HeartbeatBytes < r.HeartbeatsSent*int64(len("HB:")+TrafficIDBytes) {
		t.Errorf("heartbeats: %d messages, %d bytes", r.HeartbeatsSent, r.HeartbeatBytes)
	}
}

// Long queues and 90% of heartbeats lost: leases lapse under waiting
// requests, and decode catches every late read.
func TestSimulateTrafficHeavyLossFreesQueuedRequests(t *testing.T) {
	t.Parallel()
	o := DefaultTrafficOptions()
	o.Requests, o.Rate, o.Decodes, o.Slots, o.DecodeTime = 3000, 100, 1, 4, 50*time.Millisecond // 80/s of capacity
	o.Lease.Duration, o.HBLoss, o.CrashEvery = 3*time.Second, 0.9, 0
	r, err := SimulateTraffic(o)
	if err != nil {
		t.Fatal(err)
	}
	if r.MaxQueueWaitS < 3*o.Lease.Duration.Seconds() {
		t.Fatalf("queue waits up to %.1fs only", r.MaxQueueWaitS)
	}
	if r.PrematureFrees == 0 || r.LateReadsDetected != r.PrematureFrees || r.Lost != 0 {
		t.Errorf("premature %d, late reads %d, lost %d", r.PrematureFrees, r.LateReadsDetected, r.Lost)
	}
	o.HBLoss = 0
	r, _ = SimulateTraffic(o)
	if r.PrematureFrees != 0 || r.ExpiredLeases != 0 {
		t.Errorf("without loss: premature %d, expired %d", r.PrematureFrees, r.ExpiredLeases)
	}
}

func TestTrafficOptionsValidate(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		edit func(*TrafficOptions)
		want string
	}{
		{func(o *TrafficOptions) { o.Requests = 0 }, "requests 0"},
		{func(o *TrafficOptions) { o.Rate = 0 }, "rate 0"},
		{func(o *TrafficOptions) { o.Rate = math.NaN() }, "rate NaN"},
		{func(o *TrafficOptions) { o.Rate = math.Inf(1) }, "rate +Inf"},
		{func(o *TrafficOptions) { o.Decodes = 0 }, "decodes 0"},
		{func(o *TrafficOptions) { o.Slots = -1 }, "slots -1"},
		// A fleet past any deployment ran the simulator out of memory.
		{func(o *TrafficOptions) { o.Decodes = 1e8 }, "decodes 100000000: want between 1 and 4096"},
		{func(o *TrafficOptions) { o.Slots = 1e8 }, "slots 100000000: want between 1 and 65536 per decode"},
		{func(o *TrafficOptions) { o.DecodeTime = -time.Second }, "decode time -1s"},
		{func(o *TrafficOptions) { o.TransferTime = -1 }, "transfer time"},
		{func(o *TrafficOptions) { o.Step = 0 }, "step 0s"},
		{func(o *TrafficOptions) { o.RestartAfter = 0 }, "restart delay 0s"},
		{func(o *TrafficOptions) { o.HBLoss = 1.5 }, "heartbeat loss 1.5"},
		{func(o *TrafficOptions) { o.HBLoss = math.NaN() }, "heartbeat loss NaN"},
		{func(o *TrafficOptions) { o.BytesPerRequest = -1 }, "bytes per request -1"},
		{func(o *TrafficOptions) { o.Lease.Policy = "sometimes" }, `lease policy "sometimes"`},
		{func(o *TrafficOptions) { o.Lease.Duration = time.Millisecond }, "lease duration 1ms"},
		// 10 x (1e12 / 200 s) wrapped the horizon: a negative simulated time.
		{func(o *TrafficOptions) { o.Requests = 1e12 }, "requests 1000000000000: want between 1 and 1000000000"},
		{func(o *TrafficOptions) { o.Requests, o.Rate = 1e9, 1e-3 }, "the simulator's clock holds"},
		{func(o *TrafficOptions) { o.Rate = 1e-300 }, "the simulator's clock holds"},
		{func(o *TrafficOptions) { o.CrashEvery = 200 * 365 * 24 * time.Hour }, "crash interval"},
		{func(o *TrafficOptions) { o.DecodeTime = math.MaxInt64 }, "decode time"},
	} {
		o := DefaultTrafficOptions()
		tc.edit(&o)
		_, err := SimulateTraffic(o)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("want an error with %q, got %v", tc.want, err)
		}
	}
	// Zero crash interval needs no restart delay; a zero lease gets the default.
	o := DefaultTrafficOptions()
	o.CrashEvery, o.RestartAfter, o.Lease = 0, 0, lease.Config{}
	v, err := o.Validate()
	if err != nil || v.Lease.Duration != lease.DefaultDuration {
		t.Errorf("valid options refused: %v (%+v)", err, v.Lease)
	}
}

func TestSweepLease(t *testing.T) {
	t.Parallel()
	o := smallTraffic()
	o.Requests = 3000
	leases := []time.Duration{time.Second, 3 * time.Second, 10 * time.Second}
	s, err := SweepLease(o, leases)
	if err != nil {
		t.Fatal(err)
	}
	if len(s.Rows) != len(leases)+1 || s.Rows[len(leases)].Policy != "fixed" || s.Rows[len(leases)].TimeoutS != o.Lease.Timeout.Seconds() {
		t.Fatalf("rows %+v", s.Rows)
	}
	for i, l := range leases {
		row := s.Rows[i]
		if row.Policy != "lease" || row.LeaseS != l.Seconds() || row.Result.LeaseS != l.Seconds() {
			t.Errorf("row %d: %+v", i, row)
		}
		// Same traffic: the same crashes.
		if row.Result.Crashes != s.Rows[0].Result.Crashes {
			t.Errorf("row %d: %d crashes, row 0 %d", i, row.Result.Crashes, s.Rows[0].Result.Crashes)
		}
	}
	// Longer leases hold dead blocks longer.
	if !(s.Rows[0].DeadBlockGBs < s.Rows[2].DeadBlockGBs && s.Rows[2].DeadBlockGBs < s.Rows[3].DeadBlockGBs) {
		t.Errorf("dead GB·s not increasing with the lease: %v %v %v %v", s.Rows[0].DeadBlockGBs, s.Rows[1].DeadBlockGBs, s.Rows[2].DeadBlockGBs, s.Rows[3].DeadBlockGBs)
	}
	best := s.Rows[s.Best]
	if best.Policy != "lease" || best.PrematureFrees != 0 {
		t.Errorf("recommended %+v", best)
	}
	for _, r := range s.Rows[:len(leases)] {
		if r.PrematureFrees == 0 && r.DeadBlockGBs < best.DeadBlockGBs {
			t.Errorf("recommended %s (%.1f GB·s) over %s (%.1f GB·s)", best.Name(), best.DeadBlockGBs, r.Name(), r.DeadBlockGBs)
		}
	}
	if !strings.Contains(s.Recommendation, best.Name()) || !strings.Contains(s.Recommendation, "GB·s") {
		t.Errorf("recommendation %q", s.Recommendation)
	}
	var text strings.Builder
	if err := s.Table().WriteText(&text); err != nil || !strings.Contains(text.String(), best.Name()+" *") {
		t.Errorf("table: %v\n%s", err, text.String())
	}
	if _, err := SweepLease(o, nil); err == nil {
		t.Error("empty sweep accepted")
	}
	o.Rate = -1
	if _, err := SweepLease(o, leases); err == nil {
		t.Error("bad options accepted")
	}
}

func TestSweepLeaseRecommendation(t *testing.T) {
	t.Parallel()
	row := func(lease float64, dead float64, premature int) SweepRow {
		return SweepRow{Policy: "lease", LeaseS: lease, DeadBlockGBs: dead, PrematureFrees: premature}
	}
	fixed := SweepRow{Policy: "fixed", TimeoutS: 480, DeadBlockGBs: 5000}
	for _, tc := range []struct {
		rows []SweepRow
		best int
		says []string
	}{
		{[]SweepRow{row(5, 10, 3), row(10, 20, 0), row(30, 60, 0), fixed}, 1, []string{"lease 10.0 s", "20.0 GB·s", "no premature free", "lease 5.00 s freed 3", "fixed 480 s: 5000.0 GB·s"}},
		{[]SweepRow{row(30, 60, 0), row(10, 20, 0), fixed}, 1, []string{"lease 10.0 s", "shortest lease tried", "(next: lease 30.0 s, 60.0 GB·s)"}},
		{[]SweepRow{row(5, 10, 9), row(10, 20, 2), row(30, 60, 2), fixed}, 1, []string{"no lease avoided premature frees", "lease 10.0 s freed the fewest", "(2)"}},
		{[]SweepRow{fixed}, -1, []string{"no lease"}},
	} {
		best, text := recommendLease(tc.rows)
		if best != tc.best {
			t.Errorf("best %d, want %d: %s", best, tc.best, text)
		}
		for _, s := range tc.says {
			if !strings.Contains(text, s) {
				t.Errorf("recommendation %q lacks %q", text, s)
			}
		}
	}
}

// One iteration simulates a million requests (about 83 minutes of traffic).
func BenchmarkSimulateTraffic1M(b *testing.B) {
	o := DefaultTrafficOptions()
	var r TrafficResult
	for b.Loop() {
		var err error
		if r, err = SimulateTraffic(o); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(r.Events), "events/op")
	b.ReportMetric(r.SimulatedSeconds, "sim-s/op")
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/float64(o.Requests), "ns/request")
}
