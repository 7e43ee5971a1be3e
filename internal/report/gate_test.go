package report

import (
	"bytes"
	"math"
	"strings"
	"testing"

	"github.com/nixlctl/nixlctl/internal/golden"
)

func TestGateDecisions(t *testing.T) {
	t.Parallel()
	base := fake(0.80, latencies(400, 2.0, 0.4))
	tests := []struct {
		name    string
		runs    []Result
		opts    GateOptions
		verdict Verdict
		passed  bool
	}{
		{"within the allowance", []Result{fake(0.78, latencies(400, 2.05, 0.4))}, GateOptions{MaxRegression: 0.05}, Pass, true},
		{"regression: 20% less, latencies clearly slower", []Result{fake(0.64, latencies(400, 2.5, 0.4))}, GateOptions{MaxRegression: 0.05}, Regression, false},
		{"improvement", []Result{fake(0.96, latencies(400, 1.7, 0.4))}, GateOptions{MaxRegression: 0.05}, Improvement, true},
		{"noise: the ratio fell but the latencies did not move", []Result{fake(0.64, latencies(400, 2.0, 0.4))}, GateOptions{MaxRegression: 0.05}, Noise, true},
		{"noise: the ratio rose but the latencies did not move", []Result{fake(0.96, latencies(400, 2.0, 0.4))}, GateOptions{MaxRegression: 0.05}, Noise, true},
		{"noise: baseline within the range of three runs", []Result{fake(0.70, nil), fake(0.72, nil), fake(0.85, nil)}, GateOptions{MaxRegression: 0.05}, Noise, true},
		{"regression: three runs all below", []Result{fake(0.70, nil), fake(0.72, nil), fake(0.71, nil)}, GateOptions{MaxRegression: 0.05}, Regression, false},
		// A run that froze for most of its time has typical requests:
		// the latency test sees no shift, yet the ratio fell by 80%.
		{"regression: an 80% drop the latencies do not show", []Result{fake(0.16, latencies(400, 2.0, 0.4))}, GateOptions{MaxRegression: 0.05}, Regression, false},
		{"noise: an 80% drop under a ceiling raised to 90%", []Result{fake(0.16, latencies(400, 2.0, 0.4))}, GateOptions{MaxRegression: 0.05, NoiseCeiling: 0.9}, Noise, true},
		{"improvement: doubled, beyond the ceiling", []Result{fake(1.7, latencies(400, 2.0, 0.4))}, GateOptions{MaxRegression: 0.05}, Improvement, true},
		{"absolute metric on request", []Result{fake(0.80, latencies(400, 2.6, 0.4))}, GateOptions{MaxRegression: 0.05, Metrics: []string{"p99_ms"}}, Pass, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := base
			if tc.name == "noise: baseline within the range of three runs" || tc.name == "regression: three runs all below" {
				b = fake(0.80, nil)
			}
			g, err := Gate(b, tc.runs, tc.opts)
			if err != nil {
				t.Fatal(err)
			}
			if len(g.Rows) != 1 || g.Rows[0].Verdict != tc.verdict || g.Passed != tc.passed {
				t.Fatalf("got %+v (passed %v), want %s", g.Rows, g.Passed, tc.verdict)
			}
		})
	}
	// The median of the runs is judged.
	g, _ := Gate(fake(0.80, nil), []Result{fake(0.5, nil), fake(0.79, nil), fake(0.9, nil)}, GateOptions{MaxRegression: 0.05})
	if g.Rows[0].Result != 0.79 || len(g.Rows[0].Runs) != 3 {
		t.Errorf("median: %+v", g.Rows[0])
	}
	// A count that was zero: any worsening is a regression.
	zero, one := fake(0.8, nil), fake(0.8, nil)
	one.Failed = 1
	g, _ = Gate(zero, []Result{one}, GateOptions{MaxRegression: 0.05, Metrics: []string{"failed"}})
	if g.Passed || !math.IsInf(g.Rows[0].Change, 1) {
		t.Errorf("zero baseline: %+v", g.Rows[0])
	}
	var js bytes.Buffer
	if err := WriteJSON(&js, g); err != nil || !strings.Contains(js.String(), `"change": null`) {
		t.Errorf("an infinite change must encode as null: %v\n%s", err, js.String())
	}
}

func TestGateErrors(t *testing.T) {
	t.Parallel()
	b := fake(0.8, nil)
	other := fake(0.8, nil)
	other.Command = "fake other"
	for _, tc := range []struct {
		base Result
		runs []Result
		opts GateOptions
		want string
	}{
		{b, nil, GateOptions{}, "no result"},
		{b, []Result{other}, GateOptions{}, `baseline is "fake measure" but a result is "fake other"`},
		{b, []Result{b}, GateOptions{Metrics: []string{"latency_p42"}}, `metric "latency_p42" is not in the baseline (keys: efficiency, bandwidth_gbps, p99_ms, failed)`},
		{&fakeResult{Meta: b.Meta, Hist: ""}, []Result{b}, GateOptions{}, "no efficiency ratios"},
	} {
		if _, err := Gate(tc.base, tc.runs, tc.opts); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("got %v, want %q", err, tc.want)
		}
	}
}

// The Markdown a CI job summary shows, and the comparison tables.
func TestGateAndCompareGolden(t *testing.T) {
	t.Parallel()
	base := fake(0.80, latencies(400, 2.0, 0.4))
	g, err := Gate(base, []Result{fake(0.64, latencies(400, 2.5, 0.4))}, GateOptions{MaxRegression: 0.05, Metrics: []string{"efficiency", "p99_ms"}})
	if err != nil {
		t.Fatal(err)
	}
	var md bytes.Buffer
	if err := g.WriteMarkdown(&md); err != nil {
		t.Fatal(err)
	}
	golden.Check(t, "gate.md", md.Bytes())

	c, err := Compare([]string{"base", "same", "slower"}, []Result{base, fake(0.81, latencies(400, 2.0, 0.4)), fake(0.64, latencies(400, 2.5, 0.4))}, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range []struct {
		format Format
		file   string
	}{{FormatTable, "compare.txt"}, {FormatMarkdown, "compare.md"}} {
		var b bytes.Buffer
		if err := c.Render(&b, f.format); err != nil {
			t.Fatal(err)
		}
		golden.Check(t, f.file, b.Bytes())
	}
	var js bytes.Buffer
	if err := c.Render(&js, FormatJSON); err != nil || !strings.Contains(js.String(), `"runs": [`) {
		t.Errorf("compare JSON: %v", err)
	}
	if err := c.Render(&js, FormatProm); err == nil {
		t.Error("compare cannot write prom")
	}
	if _, err := Compare([]string{"a"}, []Result{base}, nil); err == nil {
		t.Error("one result is no comparison")
	}
}

func TestPromGolden(t *testing.T) {
	t.Parallel()
	v := NewVLLMTransfers(map[string]string{"model_name": "llama-3.1-8b", "source": "nixlctl"})
	v.Observe(4e6, 200e3, 64<<20, 64)                                       // 4 ms, 0.2 ms
	v.Observe(12e6, 1e6, 64<<20, 64)                                        // le=0.025, post exactly on 0.001
	v.Observe(2e9, 30e6, 512<<20, 2048)                                     // 2 s
	v.ObserveHistograms(latencies(2, 40, 0), latencies(2, 0.5, 0), 4096, 1) // 2 x 40 ms
	v.FailedTransfers, v.ExpiredKV = 1, 2
	var b bytes.Buffer
	if err := v.Write(&b); err != nil {
		t.Fatal(err)
	}
	golden.Check(t, "vllm.prom", b.Bytes())
	for _, want := range []string{`le="8589934592.0"`, `le="2048.0"`, `vllm:nixl_num_failed_transfers_total{model_name="llama-3.1-8b",source="nixlctl"} 1.0`,
		"# TYPE vllm:nixl_num_kv_expired_reqs counter", `vllm:nixl_post_time_seconds_bucket{model_name="llama-3.1-8b",source="nixlctl",le="0.001"} 4.0`} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("exposition lacks %q", want)
		}
	}
}

// With the baseline re-run beside the results (gate --baseline-binary),
// the saved baseline's numbers do not count: a slow spell of the host that
// hits both sides is not a regression, and a real slowdown is one even
// where the saved baseline, from a slower day, would have passed it.
func TestGateWithBaselineReruns(t *testing.T) {
	t.Parallel()
	runs := func(effs ...float64) []Result {
		var rs []Result
		for _, e := range effs {
			rs = append(rs, fake(e, nil))
		}
		return rs
	}
	tests := []struct {
		name     string
		saved    float64
		reruns   []Result
		results  []Result
		baseline float64
		verdict  Verdict
		refused  []string
	}{
		{"a slow hour on both sides is no regression", 0.95, runs(0.70, 0.72, 0.71), runs(0.71, 0.70, 0.72), 0.71, Pass, nil},
		{"a real slowdown below a slower saved baseline", 0.66, runs(0.80, 0.82, 0.81), runs(0.64, 0.65, 0.63), 0.81, Regression, nil},
		{"overlapping runs are noise", 0.80, runs(0.70, 0.80, 0.90), runs(0.62, 0.74, 0.86), 0.80, Noise, nil},
		{"a refused re-run fails the gate", 0.80, []Result{fake(0.8, nil), sickResult{fake(0.8, nil), []string{"interrupted"}}, fake(0.8, nil)}, runs(0.8, 0.8, 0.8), 0, "", []string{"baseline run 2: interrupted"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			g, err := Gate(fake(tc.saved, nil), tc.results, GateOptions{MaxRegression: 0.05, BaselineRuns: tc.reruns})
			if err != nil {
				t.Fatal(err)
			}
			if strings.Join(g.Refused, "|") != strings.Join(tc.refused, "|") {
				t.Fatalf("refused %q, want %q", g.Refused, tc.refused)
			}
			if tc.refused != nil {
				if g.Passed || !strings.HasPrefix(g.Headline(), "FAIL") {
					t.Errorf("a refused re-run passed: %s", g.Headline())
				}
				return
			}
			if len(g.Rows) != 1 || g.Rows[0].Verdict != tc.verdict || g.Rows[0].Baseline != tc.baseline || len(g.Rows[0].BaselineRuns) != len(tc.reruns) {
				t.Fatalf("got %+v, want verdict %s against %g", g.Rows, tc.verdict, tc.baseline)
			}
		})
	}
	// Pooled baselines (gate --baseline a --baseline b) pass the first file
	// as base and again among the runs: its problem is listed once, as a
	// run's. A saved baseline whose numbers the re-runs replace refuses
	// nothing by itself.
	sick := sickResult{fake(0.8, nil), []string{"interrupted"}}
	g, err := Gate(sick, runs(0.8, 0.8, 0.8), GateOptions{MaxRegression: 0.05, BaselineRuns: []Result{sick, fake(0.8, nil), fake(0.8, nil)}})
	if err != nil || strings.Join(g.Refused, "|") != "baseline run 1: interrupted" || g.Passed {
		t.Errorf("pooled baselines with a sick first: refused %q, passed %v, err %v", g.Refused, g.Passed, err)
	}
	g, err = Gate(sick, runs(0.8, 0.8, 0.8), GateOptions{MaxRegression: 0.05, BaselineRuns: runs(0.8, 0.8, 0.8)})
	if err != nil || len(g.Refused) != 0 || !g.Passed {
		t.Errorf("healthy re-runs of a sick saved baseline: refused %q, passed %v, err %v", g.Refused, g.Passed, err)
	}
	other := fake(0.8, nil)
	other.Command = "fake other"
	if _, err := Gate(fake(0.8, nil), runs(0.8), GateOptions{BaselineRuns: []Result{other}}); err == nil || !strings.Contains(err.Error(), `a result is "fake other"`) {
		t.Errorf("a re-run of another command: %v", err)
	}
}
