package handoff

import (
	"testing"

	"github.com/nixlctl/nixlctl/internal/kv"
	"github.com/nixlctl/nixlctl/internal/runcore/runcoretest"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
)

func TestRoundsFor(t *testing.T) {
	for _, tc := range []struct{ requests, conc, want, size int }{
		{64, 4, 8, 16},  // 64 / (4 x 4) = 4 rounds at most
		{128, 4, 8, 16}, // 8 rounds of 16
		{100, 4, 8, 17}, // 6 rounds, the last one short
		{10, 4, 8, 10},  // too few for two rounds: one, after the run
		{256, 1, 8, 32}, // 8 rounds
		{64, 4, 1, 64},  // asked for one
		{64, 0, 8, 8},   // no concurrency (open loop): rounds of 4
	} {
		if got := roundsFor(tc.requests, tc.conc, tc.want); got != tc.size {
			t.Errorf("roundsFor(%d, %d, %d) = %d, want %d", tc.requests, tc.conc, tc.want, got, tc.size)
		}
	}
}

func TestSummarizeRounds(t *testing.T) {
	ms := int64(1e6)
	// Two rounds of two 1 GB requests: round 0 over 500 ms (4 GB/s),
	// round 1 over 1 s (2 GB/s). A warm-up request and a failed one stay
	// out.
	recs := []HandoffRecord{
		{Warmup: true, Bytes: 1e9, TStart: 1, TReady: 10000 * ms},
		{Round: 0, Bytes: 1e9, TStart: 1000 * ms, TReady: 1300 * ms},
		{Round: 0, Bytes: 1e9, TStart: 1100 * ms, TReady: 1500 * ms},
		{Round: 0, Error: "boom", TStart: 900 * ms, TReady: 2000 * ms},
		{Round: 1, Bytes: 1e9, TStart: 3000 * ms, TReady: 3600 * ms},
		{Round: 1, Bytes: 1e9, TStart: 3100 * ms, TReady: 4000 * ms},
	}
	refs := []roundRefs{{xfer: 5, limit: 20, cpuNS: 1.2}, {xfer: 2, limit: 10, cpuNS: 2.4}}
	var s HandoffSummary
	summarizeRounds(&s, recs, refs)
	approx := cmpopts.EquateApprox(1e-9, 0)
	want := []XferRound{
		{Round: 1, Requests: 2, HandoffGBps: 4, SpanGBps: 4, XferGBps: 5, LimitGBps: 20, CPUNSPerStep: 1.2},
		{Round: 2, Requests: 2, HandoffGBps: 2, SpanGBps: 2, XferGBps: 2, LimitGBps: 10, CPUNSPerStep: 2.4},
	}
	if d := cmp.Diff(want, s.Rounds, approx); d != "" {
		t.Fatal(d)
	}
	// The host slowed down 2x in round 2 and both sides with it: the
	// ratios are 0.8 and 1.0, their median 0.9, whatever the rates did.
	if s.EfficiencyXferSpread == nil || s.EfficiencyXferSpread.N != 2 {
		t.Fatalf("spread %+v", s.EfficiencyXferSpread)
	}
	if d := cmp.Diff([]float64{0.9, 3.5, 0.2}, []float64{s.EfficiencyXfer, s.XferGBps, s.EfficiencyLimit}, approx); d != "" {
		t.Errorf("efficiency, xfer median, limit efficiency: %s", d)
	}
	if s.LimitGBps != 15 {
		t.Errorf("limit median %v, want 15", s.LimitGBps)
	}
	// The timed span leaves out the reference between the rounds: 0.5 s
	// + 1 s, not 3 s.
	sum := SummarizeHandoff(recs, 0)
	if d := cmp.Diff(1.5, sum.Seconds, approx); d != "" {
		t.Errorf("seconds: %s", d)
	}
}

// A closed loop of equal requests runs in waves, and between two waves
// every request is in its prefill: the round's rate counts only the time
// a handoff was outstanding, and says how much it left out.
func TestSummarizeRoundsLeavesOutTimeWithNothingOutstanding(t *testing.T) {
	ms := int64(1e6)
	// Stamps are monotonic clock readings, never 0: the round starts at 1 s.
	at := func(t int64) int64 { return 1000*ms + t*ms }
	recs := []HandoffRecord{
		// Wave 1: prefills 0-100 ms, handoffs 100-500 (one overlapping).
		{Round: 0, Bytes: 1e9, TStart: at(0), TFinish: at(100), TReady: at(400)},
		{Round: 0, Bytes: 1e9, TStart: at(0), TFinish: at(150), TReady: at(500)},
		// Wave 2: prefills 500-600 ms (nothing outstanding), handoffs 600-1000.
		{Round: 0, Bytes: 1e9, TStart: at(500), TFinish: at(600), TReady: at(1000)},
		{Round: 0, Bytes: 1e9, TStart: at(500), TFinish: at(600), TReady: at(900)},
		// Outside the round: its reference, then round 2 with a record
		// from before the prefill stamp (its whole span counts).
		{Round: 1, Bytes: 1e9, TStart: at(2000), TReady: at(2500)},
	}
	var s HandoffSummary
	summarizeRounds(&s, recs, []roundRefs{{xfer: 5}, {xfer: 2}})
	approx := cmpopts.EquateApprox(1e-9, 0)
	// Round 1: 4 GB over 800 ms outstanding (100-500, 600-1000) of a
	// 1000 ms span.
	want := []XferRound{
		{Round: 1, Requests: 4, HandoffGBps: 5, SpanGBps: 4, IdleFraction: 0.2, XferGBps: 5},
		{Round: 2, Requests: 1, HandoffGBps: 2, SpanGBps: 2, XferGBps: 2},
	}
	if d := cmp.Diff(want, s.Rounds, approx); d != "" {
		t.Fatal(d)
	}
	// Over the spans: 0.8 and 1.0.
	if d := cmp.Diff([]float64{1, 0.1, 0.9}, []float64{s.EfficiencyXfer, s.RoundIdleFraction, s.SpanEfficiencyXfer}, approx); d != "" {
		t.Errorf("efficiency, idle fraction, span efficiency: %s", d)
	}
}

func TestUnionLength(t *testing.T) {
	for _, tc := range []struct {
		name string
		iv   [][2]int64
		want int64
	}{
		{"none", nil, 0},
		{"one", [][2]int64{{1, 4}}, 3},
		{"apart, unsorted", [][2]int64{{10, 12}, {1, 4}}, 5},
		{"overlapping", [][2]int64{{1, 4}, {3, 6}}, 5},
		{"nested", [][2]int64{{1, 10}, {2, 3}, {4, 11}}, 10},
		{"touching", [][2]int64{{1, 2}, {2, 3}}, 2},
		{"empty and reversed ones cover nothing", [][2]int64{{5, 5}, {7, 6}, {1, 2}}, 1},
	} {
		if got := unionLength(tc.iv); got != tc.want {
			t.Errorf("%s: unionLength(%v) = %d, want %d", tc.name, tc.iv, got, tc.want)
		}
	}
}

func TestSummarizeRoundsSkipsRoundsWithoutReference(t *testing.T) {
	recs := []HandoffRecord{{Round: 0, Bytes: 1e9, TStart: 1, TReady: 1e9}, {Round: 1, Bytes: 1e9, TStart: 2e9, TReady: 3e9}}
	var s HandoffSummary
	summarizeRounds(&s, recs, []roundRefs{{}, {xfer: 2}})
	if len(s.Rounds) != 1 || s.Rounds[0].Round != 2 || s.EfficiencyXfer != 0.5 {
		t.Errorf("rounds %+v, efficiency %v: want round 2 alone, 1 GB/s against 2", s.Rounds, s.EfficiencyXfer)
	}
	var none HandoffSummary
	summarizeRounds(&none, recs, nil)
	if none.EfficiencyXferSpread != nil || none.XferGBps != 0 {
		t.Errorf("no references: %+v", none)
	}
}

func TestPoolPassWarmup(t *testing.T) {
	o := DefaultHandoffOptions()
	o.Spec = kv.Spec{Model: runcoretest.SmallModel(t), BlockSize: 16, TP: 1}
	o.ISL, o.Requests, o.Concurrency = ISL{Dist: ISLFixed, Fixed: 2048}, 64, 4
	per := o.blocksPerRequest()
	for _, tc := range []struct {
		name   string
		blocks int
		trace  int // entries; 0: no trace
		reqs   int
		want   int
	}{
		{"one pass over the pool", 7 * per, 0, 64, 7},
		{"a partial request counts", 7*per + 1, 0, 64, 8},
		{"at least 2", per, 0, 64, 2},
		{"never more than measured", 100 * per, 0, 10, 10},
		{"a trace keeps 2", 7 * per, 5, 64, 2},
		// A short trace's warm-up leaves its last request measured (2
		// warm-up requests of a 2-line trace measured nothing).
		{"a 2-request trace keeps 1", 7 * per, 2, 64, 1},
		{"a 1-request trace keeps none", 7 * per, 1, 64, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := o
			o.Requests = tc.reqs
			for range tc.trace {
				o.Trace = append(o.Trace, TraceEntry{ISL: 2048})
			}
			if got := o.poolPass(tc.blocks); got != tc.want {
				t.Errorf("poolPass(%d blocks) = %d, want %d", tc.blocks, got, tc.want)
			}
		})
	}
}
