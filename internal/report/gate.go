package report

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"slices"
	"strings"

	"github.com/nixlctl/nixlctl/internal/stats"
)

// Verdict is the gate's judgement of one metric.
type Verdict string

// Verdicts. Only Regression fails the gate.
const (
	Pass        Verdict = "pass"        // within the allowed regression
	Improvement Verdict = "improvement" // better by more than the allowance
	Noise       Verdict = "noise"       // worse by more than the allowance, but the distributions say chance
	Regression  Verdict = "regression"  // worse by more than the allowance, and real
)

// GateOptions configure Gate.
type GateOptions struct {
	// MaxRegression is the allowed relative change in the worse
	// direction, 0.05 for 5%.
	MaxRegression float64
	// Metrics selects metrics by key or full name; empty selects the
	// baseline's Stable metrics (its efficiency ratios).
	Metrics []string
	// NoiseCeiling is the largest change the noise tests may explain
	// away (0.5 for 50%; 0 takes DefaultNoiseCeiling). A change beyond it
	// is judged on its size alone: the tests compare typical requests or
	// a few runs, and a run that froze for 20 s of its 25 has typical
	// requests too.
	NoiseCeiling float64
	// BaselineRuns, when set, are the baseline's runs: the baseline's
	// values are theirs (pooled, as runs are), and base only names the
	// command and the metrics: its own problems are not the gate's, the
	// runs' are. Made in turns with the results' runs (gate
	// --baseline-binary), a slow spell of the host hits both sides alike,
	// where a baseline saved on another day meets the results' noise alone.
	BaselineRuns []Result
	// JudgeMoved judges every run, also those a neighbour moved
	// (HostSharer.HostMoved). By default the moved runs are set aside
	// when both sides keep MinRuns or more runs it did not move.
	JudgeMoved bool
}

// DefaultNoiseCeiling is GateOptions.NoiseCeiling's default: no run of
// an unchanged build moved a ratio by half in the gate trials that
// docs/ci-gates.md reports (their widest spread was 0.59-1.25, one run).
const DefaultNoiseCeiling = 0.5

// GateRow is one metric's judgement.
type GateRow struct {
	Name     string    `json:"metric"`
	Unit     string    `json:"unit,omitempty"`
	Better   string    `json:"better"`
	Baseline float64   `json:"baseline"`
	Result   float64   `json:"result"`     // median of the runs
	Runs     []float64 `json:"runs"`       // every run's value
	Change   float64   `json:"change"`     // (result - baseline) / baseline; ±Inf from a zero baseline
	Worse    float64   `json:"worse"`      // the change in the worse direction (> 0 is worse)
	Test     string    `json:"noise_test"` // the distribution test, "-" when there was none
	Verdict  Verdict   `json:"verdict"`    //
	Why      string    `json:"why"`        // one line
	// BaselineRuns are the baseline's runs when it was measured with
	// --repeat (Baseline is then their median).
	BaselineRuns []float64 `json:"baseline_runs,omitempty"`
	shift        *Shift
	runs         *RunsShift
	spread       [2]float64
}

// GateReport is the gate's whole judgement.
type GateReport struct {
	Command       string    `json:"command"`
	MaxRegression float64   `json:"max_regression"`
	Runs          int       `json:"runs"`
	Rows          []GateRow `json:"metrics"`
	// Refused lists why results could not be judged on their numbers: a
	// baseline or run that failed requests, leaked or corrupted blocks, or
	// was interrupted (report.HealthReporter). Any entry fails the gate.
	Refused []string `json:"refused,omitempty"`
	// SharedHost lists the runs that other processes took a share of the
	// host's CPUs from while they measured (report.HostSharer): their
	// numbers moved with the neighbour's load, not only with the build.
	// It fails nothing by itself.
	SharedHost []string `json:"shared_host,omitempty"`
	// SetAside lists the runs not judged because a neighbour moved them
	// (GateOptions.JudgeMoved), both sides' quiet runs being enough.
	SetAside []string `json:"set_aside,omitempty"`
	Passed   bool     `json:"passed"`
	// BaselineReruns is how many runs of the baseline's command the gate
	// made beside the results' (gate --baseline-binary; Gate leaves it to
	// its caller, since GateOptions.BaselineRuns may also be saved runs).
	BaselineReruns int `json:"baseline_reruns,omitempty"`
}

// Gate compares result runs (their median) with a baseline. The rules,
// per selected metric:
//
//   - change within MaxRegression either way: pass; better by more than
//     that: improvement, unless the latency distributions behind it are
//     not faster (then noise);
//   - worse by more: a regression, unless it looks like noise, which
//     takes one of: the latency distributions behind the metric (merged
//     over the runs) are not shifted towards slower by a Mann-Whitney U
//     test (see Shift.Real), or, with three runs or more, the baseline
//     lies within the runs' range.
//
// Only regressions fail the gate. A zero baseline makes any worsening a
// regression (there is no relative change to allow).
func Gate(base Result, runs []Result, o GateOptions) (*GateReport, error) {
	if len(runs) == 0 {
		return nil, errors.New("no result to compare with the baseline")
	}
	bh := base.Header()
	for _, r := range append(append([]Result(nil), runs...), o.BaselineRuns...) {
		if h := r.Header(); h.Command != bh.Command {
			return nil, fmt.Errorf("baseline is %q but a result is %q", bh.Command, h.Command)
		}
	}
	sel, err := selectMetrics(base.Metrics(), o.Metrics)
	if err != nil {
		return nil, err
	}
	rep := &GateReport{Command: bh.Command, MaxRegression: o.MaxRegression, Runs: len(runs), Passed: true}
	// A run that lost, leaked or corrupted anything, or stopped early, has
	// numbers that flatter it: the gate never passes it, whatever they say.
	// With BaselineRuns, base's numbers are not used (the runs' are), so
	// only the runs' problems count; pooled baselines pass their first file
	// as base and again as a run, and its problems were listed twice.
	if len(o.BaselineRuns) == 0 {
		for _, p := range Problems(base) {
			rep.Refused = append(rep.Refused, "baseline: "+p)
		}
		if sh := sharedHost(base); sh != "" {
			rep.SharedHost = append(rep.SharedHost, "baseline: "+sh)
		}
	}
	results := newGateSide("result", runs, rep)
	reruns := newGateSide("baseline run", o.BaselineRuns, rep)
	saved := &gateSide{what: "baseline", runs: []Result{base}, metrics: []map[string]Metric{metricsByName(base)}, refused: []bool{false}}
	if !o.JudgeMoved {
		other := saved
		if len(o.BaselineRuns) > 0 {
			other = reruns
		}
		setAside(rep, results, other)
	}
	if len(rep.Refused) > 0 {
		rep.Passed = false
	}
	for _, bm := range sel {
		row := GateRow{Name: bm.Name(), Unit: bm.Unit, Better: bm.Better.String(), Baseline: bm.Value}
		baseDist := bm.Dist
		if len(o.BaselineRuns) > 0 {
			vs, dist, skip, err := reruns.values(bm.Name())
			if err != nil {
				return nil, err
			}
			if skip {
				continue
			}
			row.BaselineRuns, row.Baseline, baseDist = vs, stats.Median(vs), dist
		} else if _, ok := bh.Repeats.values(bm.Name()); ok {
			vs, _, _, err := saved.values(bm.Name())
			if err != nil {
				return nil, err
			}
			row.BaselineRuns = vs
			row.Baseline = stats.Median(vs)
		}
		vs, dist, skip, err := results.values(bm.Name())
		if err != nil {
			return nil, err
		}
		if skip {
			continue
		}
		row.Runs = vs
		row.Result = stats.Median(row.Runs)
		row.spread = [2]float64{slicesMin(row.Runs), slicesMax(row.Runs)}
		if len(row.BaselineRuns) >= MinRuns && len(row.Runs) >= MinRuns {
			// Runs on both sides: test the numbers themselves.
			rs := CompareRuns(row.BaselineRuns, row.Runs, bm.Better)
			row.runs = &rs
			row.Test = rs.String()
		} else if baseDist != nil && dist != nil {
			s := CompareDists(baseDist, dist)
			row.shift = &s
			row.Test = s.String()
		} else {
			row.Test = "-"
		}
		ceiling := o.NoiseCeiling
		if ceiling <= 0 {
			ceiling = DefaultNoiseCeiling
		}
		row.judge(bm, o.MaxRegression, ceiling)
		if row.Verdict == Regression {
			rep.Passed = false
		}
		rep.Rows = append(rep.Rows, row)
	}
	return rep, nil
}

// gateSide is one side's runs (the results, or the baseline's re-runs)
// with their metrics by name, which of them the gate refused, and which
// of their values it sets aside.
type gateSide struct {
	what    string // "result" or "baseline run", for messages
	runs    []Result
	metrics []map[string]Metric
	refused []bool
	// aside[i][k] sets aside the k-th value of run i (its k-th repeat,
	// or k = 0 its own); nil: none is (setAside).
	aside [][]bool
}

// metricsByName indexes r's metrics.
func metricsByName(r Result) map[string]Metric {
	m := map[string]Metric{}
	for _, x := range r.Metrics() {
		m[x.Name()] = x
	}
	return m
}

// setAside leaves out the runs a neighbour moved (a repeated result's
// run by run), on both sides, when each side keeps MinRuns or more that
// it did not move, and lists them in rep. Set aside on one side alone,
// quiet runs would be judged against moved ones, whose numbers a
// neighbour pushed either way; with too few quiet runs on a side, every
// run of both is judged.
func setAside(rep *GateReport, sides ...*gateSide) {
	moved := make([][][]bool, len(sides))
	anyMoved := false
	for j, s := range sides {
		var quiet int
		moved[j], quiet = s.movedRuns()
		if quiet < MinRuns {
			return
		}
		for _, ms := range moved[j] {
			anyMoved = anyMoved || slices.Contains(ms, true)
		}
	}
	if !anyMoved {
		return
	}
	for j, s := range sides {
		s.aside = moved[j]
		for i, ms := range moved[j] {
			for k, m := range ms {
				if !m {
					continue
				}
				label := fmt.Sprintf("%s %d", s.what, i+1)
				if len(s.runs) == 1 && s.what == "baseline" {
					label = s.what
				}
				if len(ms) > 1 {
					label += fmt.Sprintf(", run %d of %d", k+1, len(ms))
				}
				rep.SetAside = append(rep.SetAside, label)
			}
		}
	}
}

// movedRuns says, per run and per value it brings (a repeated result's
// runs, else itself), whether a neighbour moved it, and how many values
// it did not move.
func (s *gateSide) movedRuns() (moved [][]bool, quiet int) {
	moved = make([][]bool, len(s.runs))
	for i, r := range s.runs {
		if rr := r.Header().Repeats; rr != nil && len(rr.Runs) == rr.N {
			for _, run := range rr.Runs {
				moved[i] = append(moved[i], run.HostMoved)
			}
		} else {
			moved[i] = []bool{NeighbourMoved(r)}
		}
		for _, m := range moved[i] {
			if !m {
				quiet++
			}
		}
	}
	return moved, quiet
}

// kept says whether the k-th value of run i is judged.
func (s *gateSide) kept(i, k int) bool {
	return s.aside == nil || k >= len(s.aside[i]) || !s.aside[i][k]
}

// newGateSide indexes runs' metrics and records their problems in rep.
func newGateSide(what string, runs []Result, rep *GateReport) *gateSide {
	s := &gateSide{what: what, runs: runs, metrics: make([]map[string]Metric, len(runs)), refused: make([]bool, len(runs))}
	for i, r := range runs {
		for _, p := range Problems(r) {
			rep.Refused = append(rep.Refused, fmt.Sprintf("%s %d: %s", what, i+1, p))
			s.refused[i] = true
		}
		if sh := sharedHost(r); sh != "" {
			rep.SharedHost = append(rep.SharedHost, fmt.Sprintf("%s %d: %s", what, i+1, sh))
		}
		s.metrics[i] = metricsByName(r)
	}
	return s
}

// values is one metric over the side's runs: every run's value (a result
// made with --repeat counts as its runs) and their latency distributions
// merged. skip: a refused run lacks the metric (a run that measured
// nothing has none), and the refusal is the reason, not a mismatched sweep.
func (s *gateSide) values(name string) (vs []float64, dist *Histogram, skip bool, err error) {
	for i, r := range s.runs {
		m, ok := s.metrics[i][name]
		if !ok && s.refused[i] {
			return nil, nil, true, nil
		}
		if !ok {
			return nil, nil, false, fmt.Errorf("%s %d has no %s (is it the same sweep as the baseline?)", s.what, i+1, name)
		}
		judged := false
		if rv, ok := r.Header().Repeats.values(name); ok {
			for k, v := range rv {
				if s.kept(i, k) {
					vs, judged = append(vs, v), true
				}
			}
		} else if s.kept(i, 0) {
			vs, judged = append(vs, m.Value), true
		}
		if m.Dist != nil && judged {
			if dist == nil {
				dist = NewHistogram()
			}
			dist.Merge(m.Dist)
		}
	}
	return vs, dist, false, nil
}

// Refuse fails the gate for a reason found outside the numbers (a
// baseline edited since its run), listed with the others.
func (g *GateReport) Refuse(why string) {
	g.Refused = append(g.Refused, why)
	g.Passed = false
}

func (row *GateRow) judge(bm Metric, allowed, ceiling float64) {
	base, res := row.Baseline, row.Result
	switch {
	case base == res:
		row.Change = 0
	case base == 0:
		row.Change = math.Copysign(math.Inf(1), res)
	default:
		row.Change = (res - base) / math.Abs(base)
	}
	row.Worse = row.Change
	if bm.Better == HigherIsBetter {
		row.Worse = -row.Change
	}
	limit := fmt.Sprintf("%.3g%%", allowed*100)
	switch {
	case row.Worse <= allowed && row.Worse >= -allowed:
		row.Verdict, row.Why = Pass, "within "+limit
	case row.Worse > ceiling && base != 0:
		row.Verdict, row.Why = Regression, fmt.Sprintf("worse by %s (allowed %s), beyond what noise may explain (%s)", pct(row.Worse), limit, pct(ceiling))
	case -row.Worse > ceiling:
		row.Verdict, row.Why = Improvement, fmt.Sprintf("better by %s, beyond what noise may explain (%s)", pct(-row.Worse), pct(ceiling))
	case row.runs != nil && row.Worse < 0 && row.runs.PBetter > RunsAlpha:
		row.Verdict, row.Why = Noise, fmt.Sprintf("better by %s, but the runs overlap the baseline's (%s)", pct(-row.Worse), row.runs)
	case row.runs != nil && row.Worse > 0 && row.runs.PWorse > RunsAlpha:
		row.Verdict, row.Why = Noise, fmt.Sprintf("worse by %s, but the runs overlap the baseline's (%s)", pct(row.Worse), row.runs)
	case row.runs != nil && row.Worse > 0:
		row.Verdict, row.Why = Regression, fmt.Sprintf("worse by %s (allowed %s), and the runs are worse than the baseline's (%s)", pct(row.Worse), limit, row.runs)
	case row.Worse < 0 && row.shift != nil && !row.shift.Faster():
		// Symmetric with regressions: a gain the distributions do not
		// show is not claimed either.
		row.Verdict, row.Why = Noise, fmt.Sprintf("better by %s, but the latency distributions are not faster (%s)", pct(-row.Worse), row.shift)
	case row.Worse < 0:
		row.Verdict, row.Why = Improvement, fmt.Sprintf("better by %s", pct(-row.Worse))
	case base == 0:
		row.Verdict, row.Why = Regression, "worse than a zero baseline"
	case row.shift != nil && !row.shift.Slower():
		row.Verdict, row.Why = Noise, fmt.Sprintf("worse by %s, but the latency distributions are not slower (%s)", pct(row.Worse), row.shift)
	case len(row.Runs) >= 3 && base >= row.spread[0] && base <= row.spread[1]:
		row.Verdict, row.Why = Noise, fmt.Sprintf("worse by %s, but the baseline lies within the %d runs' range", pct(row.Worse), len(row.Runs))
	default:
		row.Verdict, row.Why = Regression, fmt.Sprintf("worse by %s (allowed %s)", pct(row.Worse), limit)
	}
}

func pct(x float64) string {
	if math.IsInf(x, 0) {
		return "∞"
	}
	return fmt.Sprintf("%.3g%%", x*100)
}

// selectMetrics picks the metrics to gate: the stable ones by default,
// else those matching a selector; a selector matching nothing is an error
// naming the keys there are.
func selectMetrics(all []Metric, selectors []string) ([]Metric, error) {
	var out []Metric
	if len(selectors) == 0 {
		for _, m := range all {
			if m.Stable {
				out = append(out, m)
			}
		}
		if len(out) == 0 {
			return nil, fmt.Errorf("the baseline has no efficiency ratios to gate on; name metrics with --metric (keys: %s)", strings.Join(metricKeys(all), ", "))
		}
		return out, nil
	}
	for _, sel := range selectors {
		n := 0
		for _, m := range all {
			if m.MatchKey(sel) {
				out = append(out, m)
				n++
			}
		}
		if n == 0 {
			return nil, fmt.Errorf("metric %q is not in the baseline (keys: %s)", sel, strings.Join(metricKeys(all), ", "))
		}
	}
	return out, nil
}

func metricKeys(all []Metric) []string {
	seen := map[string]bool{}
	var keys []string
	for _, m := range all {
		if !seen[m.Key] {
			seen[m.Key] = true
			keys = append(keys, m.Key)
		}
	}
	return keys
}

func slicesMin(xs []float64) float64 {
	m := math.Inf(1)
	for _, x := range xs {
		m = math.Min(m, x)
	}
	return m
}

func slicesMax(xs []float64) float64 {
	m := math.Inf(-1)
	for _, x := range xs {
		m = math.Max(m, x)
	}
	return m
}

var verdictMark = map[Verdict]string{Pass: "✅ pass", Improvement: "🟢 improvement", Noise: "⚪ noise", Regression: "❌ regression"}

// Table lays the judgement out, one row per metric.
func (g *GateReport) Table() *Table {
	t := &Table{Columns: []Column{{"Metric", Left}, {"Baseline", Right}, {"Result", Right}, {"Change", Right},
		{"Noise test", Left}, {"Verdict", Left}, {"Why", Left}}}
	for _, r := range g.Rows {
		res := Float(r.Result)
		if len(r.Runs) > 1 {
			res = fmt.Sprintf("%s (median of %d)", res, len(r.Runs))
		}
		t.AddRow(r.Name, Float(r.Baseline), res, signedPct(r.Change), r.Test, verdictMark[r.Verdict], r.Why)
	}
	return t
}

func signedPct(x float64) string {
	if math.IsInf(x, 0) {
		if x > 0 {
			return "+∞"
		}
		return "-∞"
	}
	return fmt.Sprintf("%+.2f%%", x*100)
}

// Headline is the one-line outcome.
func (g *GateReport) Headline() string {
	n := map[Verdict]int{}
	for _, r := range g.Rows {
		n[r.Verdict]++
	}
	word := "PASS"
	if !g.Passed {
		word = "FAIL"
	}
	line := fmt.Sprintf("%s: %s, %d metric(s): %d pass, %d improvement, %d noise, %d regression (allowed regression %.3g%%, %d run(s))",
		word, g.Command, len(g.Rows), n[Pass], n[Improvement], n[Noise], n[Regression], g.MaxRegression*100, g.Runs)
	if g.BaselineReruns > 0 {
		line += fmt.Sprintf("; the baseline re-run %d time(s) interleaved with them", g.BaselineReruns)
	}
	if len(g.Refused) > 0 {
		line += "; refused: " + strings.Join(g.Refused, "; ")
	}
	if len(g.SharedHost) > 0 {
		line += fmt.Sprintf("; %d run(s) shared the host with other processes, whose load moved their numbers: %s", len(g.SharedHost), strings.Join(g.SharedHost, "; "))
	}
	if len(g.SetAside) > 0 {
		line += fmt.Sprintf("; set aside, judged without them (a neighbour moved them, and enough runs it did not remained): %s", strings.Join(g.SetAside, ", "))
	}
	return line
}

// WriteText is the headline over the table, for a terminal.
func (g *GateReport) WriteText(w io.Writer) error {
	if _, err := fmt.Fprintln(w, g.Headline()); err != nil {
		return err
	}
	return g.Table().WriteText(w)
}

// WriteCSV is the table alone.
func (g *GateReport) WriteCSV(w io.Writer) error { return g.Table().WriteCSV(w) }

// WriteProm refuses: a judgement is no set of samples, and without it
// Write would fall through to the text.
func (g *GateReport) WriteProm(io.Writer) error { return FormatError("gate", FormatProm) }

// WriteMarkdown writes the judgement for a CI job summary.
func (g *GateReport) WriteMarkdown(w io.Writer) error {
	mark := "✅"
	if !g.Passed {
		mark = "❌"
	}
	if _, err := fmt.Fprintf(w, "### %s nixlctl gate\n\n%s\n\n", mark, g.Headline()); err != nil {
		return err
	}
	if err := g.Table().WriteMarkdown(w); err != nil {
		return err
	}
	_, err := fmt.Fprintf(w, "\nNoise test: with %d runs or more on both sides (--repeat), a one-sided Mann-Whitney U test on the runs' values, \"worse\" or \"better\" at p ≤ %g; otherwise Mann-Whitney U on the latency histograms behind each metric, \"slower\" or \"faster\" needs p < %g and Cliff's |δ| ≥ %g.\n", MinRuns, RunsAlpha, ShiftAlpha, ShiftMinDelta)
	return err
}

// MarshalJSON writes an infinite change (from a zero baseline) as null,
// since JSON has no infinity.
func (r GateRow) MarshalJSON() ([]byte, error) {
	type plain GateRow
	fin := func(x float64) *float64 {
		if math.IsInf(x, 0) || math.IsNaN(x) {
			return nil
		}
		return &x
	}
	return json.Marshal(struct {
		plain
		Change *float64 `json:"change"`
		Worse  *float64 `json:"worse"`
	}{plain(r), fin(r.Change), fin(r.Worse)})
}
