package leasechaos

import (
	"cmp"
	"context"
	"encoding/json"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nixlctl/nixlctl/internal/engine"
	"github.com/nixlctl/nixlctl/internal/kv"
	"github.com/nixlctl/nixlctl/internal/lease"
	"github.com/nixlctl/nixlctl/internal/leasesim"
	"github.com/nixlctl/nixlctl/internal/report"
	"github.com/nixlctl/nixlctl/internal/runcore/runcoretest"
)

// chaosOpts runs lease-chaos on child processes (this test binary) with a
// short lease: 1.5 s, so heartbeats every 250 ms and a 1 s extension; the
// fixed timeout (2.7 leases) is shorter than the overload's queue (4.2
// leases), so the fixed policy shows its premature frees. It sits at least
// 0.16 leases from every request's queue wait in every scenario (overload
// waits 0.6 L apart, the stall's requests resume at 2.5, 2.9, 3.3 ... L),
// so which requests outlive it does not depend on scheduling noise.
func chaosOpts(t *testing.T, proto engine.Protocol, scenarios ...string) LeaseChaosOptions {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	leaseDur := 1500 * time.Millisecond
	return LeaseChaosOptions{Scenarios: scenarios, Policies: []lease.Policy{lease.PolicyLease, lease.PolicyFixed},
		Lease: leaseDur, Timeout: leaseDur * 27 / 10, Reaper: lease.ReapFull, Protocol: engine.Protocol(proto), Backend: "ucx",
		Spec: kv.Spec{Model: runcoretest.SmallModel(t), BlockSize: 16, TP: 1}, ISL: 128, Slack: 400 * time.Millisecond,
		Exe: exe, ExeArgs: []string{"-test.run=^$"}, ChildEnv: []string{runcoretest.ChildEnv + "=1"}, Seed: 5}
}

// Every scenario under both policies on real processes: each meets its
// expectation (the lease frees a crashed decode's blocks within about an
// extension plus an interval and frees nothing early under overload; the
// fixed timeout holds dead blocks for all of it).
func TestLeaseChaosRealProcesses(t *testing.T) {
	if testing.Short() {
		t.Skip("real-process scenarios take about two minutes")
	}
	res, err := RunLeaseChaos(context.Background(), chaosOpts(t, engine.ProtoPull, leasesim.Scenarios()...))
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Scenarios) != 2*len(leasesim.Scenarios()) {
		t.Fatalf("%d scenario results", len(res.Scenarios))
	}
	for _, r := range res.Scenarios {
		if !r.Passed {
			t.Errorf("%s: FAIL: %s\n  saw: %s\n  errors: %v", r.Series(), r.Expectation, r.Outcome, r.Errors)
		}
		if r.Timeline == nil || len(r.Timeline.Leases) == 0 || len(r.Timeline.Held) == 0 {
			t.Errorf("%s: no timeline", r.Series())
		}
	}
	byName := map[string]leasesim.ScenarioResult{}
	for _, r := range res.Scenarios {
		byName[r.Series()] = r
	}
	// The numbers behind the verdicts, for the ones the issue names.
	crash := byName["decode-crash lease"]
	if crash.Lost == 0 || crash.ExpiredLeases != crash.Lost || crash.DeathToFreeS.Max > 1.0+0.25+0.5 {
		t.Errorf("decode-crash lease: %+v", crash)
	}
	fixedCrash := byName["decode-crash fixed"]
	if fixedCrash.ReclaimLatencyS.Min < 4.0 || fixedCrash.DeadBlockGBs <= crash.DeadBlockGBs {
		t.Errorf("fixed policy should hold dead blocks its whole timeout, longer than the lease: %+v vs %+v", fixedCrash, crash)
	}
	if o := byName["decode-overload lease"]; o.PrematureFrees != 0 || o.MaxQueueWaitS < 3*1.5 || o.HeartbeatsRecvd == 0 {
		t.Errorf("decode-overload lease: %+v", o)
	}
	if o := byName["decode-overload fixed"]; o.PrematureFrees == 0 || o.LateReadsDetected != o.PrematureFrees {
		t.Errorf("decode-overload fixed: %+v", o)
	}
	if h := byName["heartbeat-loss lease"]; h.HeartbeatsLost == 0 || h.HeartbeatsLost*2 > h.HeartbeatsSent+1 {
		t.Errorf("heartbeat-loss: sent %d lost %d", h.HeartbeatsSent, h.HeartbeatsLost)
	}
	if s := byName["decode-stall lease"]; s.PrematureFrees == 0 || s.Recomputed != s.PrematureFrees {
		t.Errorf("decode-stall lease: %+v", s)
	}

	// The simulator agrees with the processes on the same plans: the same
	// requests complete, die, are aborted, expire and are freed early.
	geo := leasesim.SimGeometry{BytesPerRequest: 1, BlocksPerRequest: 1}
	for _, r := range res.Scenarios {
		lc, _ := lease.Config{Policy: lease.Policy(r.Policy), Duration: 1500 * time.Millisecond,
			Timeout: 1500 * time.Millisecond * 27 / 10, Reaper: lease.ReapFull}.Normalize()
		p, err := leasesim.PlanFor(r.Scenario, lc)
		if err != nil {
			t.Fatal(err)
		}
		sim := leasesim.SimulatePlan(p, lc, geo)
		type counts struct{ Completed, Lost, Aborted, Expired, Premature int }
		real := counts{r.Completed, r.Lost, r.Aborted, r.ExpiredLeases, r.PrematureFrees}
		virt := counts{sim.Completed, sim.Lost, sim.Aborted, sim.ExpiredLeases, sim.PrematureFrees}
		if real == virt {
			continue
		}
		// Under the fixed timeout a live request's blocks go when its wait
		// passes the timeout; with quarter-lease steps (slow-step) the
		// reaper's step can land within 0.05 leases of the next request's
		// READ, so the request nearest the timeout may fall either way.
		near := r.Policy == "fixed" && r.Scenario == leasesim.ScenarioSlowStep &&
			real.Completed+real.Premature == virt.Completed+virt.Premature && abs(real.Premature-virt.Premature) <= 1
		if !near {
			t.Errorf("%s: processes %+v, simulator %+v", r.Series(), real, virt)
		}
	}

	// The whole result renders and survives a round trip.
	var b strings.Builder
	if err := res.Render(&b, report.FormatTable); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(b.String(), "decode-crash") || !strings.Contains(b.String(), "14 passed") {
		t.Errorf("table:\n%s", b.String())
	}
	data, _ := json.Marshal(res)
	back, err := report.DecodeResult(data)
	if err != nil {
		t.Fatal(err)
	}
	if got := back.(*LeaseChaosResult); len(got.Scenarios) != len(res.Scenarios) || got.Scenarios[0].Timeline == nil {
		t.Errorf("round trip lost scenarios")
	}
	if _, err := res.Figure(); err != nil {
		t.Errorf("figure: %v", err)
	}
}

func abs(x int) int {
	if x < 0 {
		return -x
	}
	return x
}

// The head-only reaper (vLLM before PR #50789) leaks expired leases
// behind a renewed one; lease-chaos catches it, the full reaper passes.
func TestLeaseChaosHeadOnlyReaperFails(t *testing.T) {
	o := chaosOpts(t, engine.ProtoPull, leasesim.ScenarioAbortBeforeRd)
	o.Policies = []lease.Policy{lease.PolicyLease}
	o.Reaper = lease.ReapHeadOnly
	res, err := RunLeaseChaos(context.Background(), o)
	if err != nil {
		t.Fatal(err)
	}
	r := res.Scenarios[0]
	if r.Passed || r.ExpiredUnreleased == 0 || res.Failed != 1 {
		t.Errorf("head-only reaper passed: %+v", r)
	}
}

// Push mode on real processes. Keyed as upstream keys them (the
// default), heartbeats name the router's id while prefill leases its own
// suffixed id: nothing renews and the verdict names vLLM #53095. With
// fixed keys the lease and heartbeats work as in pull mode.
func TestLeaseChaosPush(t *testing.T) {
	for _, tc := range []struct {
		keys      engine.HeartbeatKeys
		scenarios []string
	}{
		{"", []string{leasesim.ScenarioDecodeOverload}},
		{engine.HBKeysFixed, []string{leasesim.ScenarioDecodeOverload, leasesim.ScenarioDecodeCrash}},
	} {
		t.Run(cmp.Or(string(tc.keys), "upstream"), func(t *testing.T) {
			o := chaosOpts(t, engine.ProtoPush, tc.scenarios...)
			o.Policies = []lease.Policy{lease.PolicyLease}
			o.PushHeartbeatKeys = tc.keys
			res, err := RunLeaseChaos(context.Background(), o)
			if err != nil {
				t.Fatal(err)
			}
			for _, r := range res.Scenarios {
				if r.HeartbeatIDs == 0 || r.HeartbeatKeys != string(cmp.Or(tc.keys, engine.HBKeysUpstream)) {
					t.Errorf("%s: %d heartbeat ids, keys %q", r.Series(), r.HeartbeatIDs, r.HeartbeatKeys)
				}
				if tc.keys == engine.HBKeysFixed {
					// A heartbeat in flight when its request is freed names an
					// id prefill no longer holds: a few, not all.
					if !r.Passed || r.Renewals == 0 || r.UnknownIDs*10 > r.HeartbeatIDs {
						t.Errorf("%s: FAIL: %s\n  saw: %s %v", r.Series(), r.Expectation, r.Outcome, r.Errors)
					}
					continue
				}
				if r.Passed || r.Renewals != 0 || r.UnknownIDs != r.HeartbeatIDs || r.PrematureFrees == 0 ||
					!strings.Contains(r.Expectation, leasesim.Issue53095) {
					t.Errorf("%s: #53095 not reproduced: %s\n  saw: %s (renewals %d, unknown ids %d of %d)",
						r.Series(), r.Expectation, r.Outcome, r.Renewals, r.UnknownIDs, r.HeartbeatIDs)
				}
			}
			fixedWarned := slices.ContainsFunc(res.Warnings, func(w string) bool { return strings.Contains(w, "not upstream behaviour") })
			if fixedWarned != (tc.keys == engine.HBKeysFixed) || res.Config.HeartbeatKeys != string(cmp.Or(tc.keys, engine.HBKeysUpstream)) {
				t.Errorf("config %+v, warnings %q", res.Config, res.Warnings)
			}
		})
	}
}

func TestLeaseChaosValidate(t *testing.T) {
	good := chaosOpts(t, engine.ProtoPull, leasesim.ScenarioDecodeCrash)
	for name, mut := range map[string]func(*LeaseChaosOptions){
		"unknown scenario": func(o *LeaseChaosOptions) { o.Scenarios = []string{"decode-explodes"} },
		"no scenario":      func(o *LeaseChaosOptions) { o.Scenarios = nil },
		"unknown policy":   func(o *LeaseChaosOptions) { o.Policies = []lease.Policy{"maybe"} },
		"sglang":           func(o *LeaseChaosOptions) { o.Protocol = engine.ProtoSGLang },
		"tiny lease":       func(o *LeaseChaosOptions) { o.Lease = 10 * time.Millisecond },
		"bad reaper":       func(o *LeaseChaosOptions) { o.Reaper = "tail-first" },
		"no tokens":        func(o *LeaseChaosOptions) { o.ISL = 0 },
		"pull fixed keys":  func(o *LeaseChaosOptions) { o.PushHeartbeatKeys = engine.HBKeysFixed },
		"unknown keys":     func(o *LeaseChaosOptions) { o.Protocol, o.PushHeartbeatKeys = engine.ProtoPush, "router" },
	} {
		o := good
		mut(&o)
		if err := o.Validate(); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
	if err := good.Validate(); err != nil {
		t.Errorf("good options refused: %v", err)
	}
}
