package report

import (
	"strings"
	"testing"
)

// sickResult is a fake result whose run went wrong.
type sickResult struct {
	*fakeResult
	problems []string
}

func (s sickResult) Problems() []string { return s.problems }

// The gate never passes a run that lost, leaked or corrupted anything or
// was interrupted, however good its numbers, nor judges against such a
// baseline.
func TestGateRefusesFailedRuns(t *testing.T) {
	t.Parallel()
	healthy, better := fake(0.80, nil), fake(0.95, nil)
	crashed := sickResult{fake(0.95, nil), []string{"83 of 200 requests failed", "224 blocks leaked (still held at the end)"}}
	tests := []struct {
		name    string
		base    Result
		runs    []Result
		refused []string
	}{
		{"healthy", healthy, []Result{better}, nil},
		{"a run failed requests", healthy, []Result{better, crashed},
			[]string{"result 2: 83 of 200 requests failed", "result 2: 224 blocks leaked (still held at the end)"}},
		{"the baseline was interrupted", sickResult{fake(0.8, nil), []string{"interrupted"}}, []Result{better},
			[]string{"baseline: interrupted"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			g, err := Gate(tc.base, tc.runs, GateOptions{MaxRegression: 0.05})
			if err != nil {
				t.Fatal(err)
			}
			if g.Passed != (len(tc.refused) == 0) || strings.Join(g.Refused, "|") != strings.Join(tc.refused, "|") {
				t.Fatalf("passed %v, refused %q; want refused %q", g.Passed, g.Refused, tc.refused)
			}
			if len(tc.refused) > 0 && (!strings.HasPrefix(g.Headline(), "FAIL") || !strings.Contains(g.Headline(), tc.refused[0])) {
				t.Errorf("headline does not say why: %s", g.Headline())
			}
		})
	}
}

// sharedResult is a fake run that shared its host with a neighbour.
type sharedResult struct {
	*fakeResult
	line string
}

func (s sharedResult) SharedHost() string { return s.line }
func (s sharedResult) HostMoved() bool    { return s.line != "" }

// A run that shared its host is listed beside the verdict, on either
// side, and fails nothing by itself.
func TestGateListsRunsThatSharedTheHost(t *testing.T) {
	t.Parallel()
	shared := sharedResult{fake(0.8, nil), "other processes used 0.79 of the host's 2 CPUs (0.86 at the most)"}
	quiet := sharedResult{fake(0.8, nil), ""}
	g, err := Gate(fake(0.8, nil), []Result{fake(0.8, nil), shared, quiet}, GateOptions{MaxRegression: 0.05, BaselineRuns: []Result{shared, fake(0.8, nil), fake(0.8, nil)}})
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"result 2: " + shared.line, "baseline run 1: " + shared.line}
	if strings.Join(g.SharedHost, "|") != strings.Join(want, "|") {
		t.Fatalf("shared host %q, want %q", g.SharedHost, want)
	}
	if !g.Passed || !strings.Contains(g.Headline(), "2 run(s) shared the host with other processes") {
		t.Errorf("passed %v, headline %q", g.Passed, g.Headline())
	}
	g, err = Gate(shared, []Result{fake(0.8, nil)}, GateOptions{MaxRegression: 0.05})
	if err != nil || len(g.SharedHost) != 1 || !strings.HasPrefix(g.SharedHost[0], "baseline: ") {
		t.Errorf("a shared saved baseline: %q (%v)", g.SharedHost, err)
	}
}

// neighbouredBaseline is a saved --repeat baseline of five runs whose
// second and fourth (0.95 and 0.90, a neighbour's push) shared the host,
// with their line.
func neighbouredBaseline(t *testing.T) (Result, string) {
	t.Helper()
	line := "other processes used 0.79 of the host's 2 CPUs (0.86 at the most)"
	var runs []Result
	for i, eff := range []float64{0.70, 0.95, 0.80, 0.90, 0.75} {
		r := sharedResult{fake(eff, nil), ""}
		if i == 1 || i == 3 {
			r.line = line
		}
		runs = append(runs, r)
	}
	base, err := WithRepeats(runs)
	if err != nil {
		t.Fatal(err)
	}
	return base, line
}

// A --repeat result names every one of its runs that shared the host,
// not only its representative's: a saved baseline of five runs whose
// second and fourth ran beside a neighbour says so, though its
// representative (the median run, the third) ran alone.
func TestGateListsTheRepeatedRunsThatSharedTheHost(t *testing.T) {
	t.Parallel()
	base, line := neighbouredBaseline(t)
	if rep := base.Header().Repeats; rep.Representative != 3 || base.(HostSharer).SharedHost() != "" {
		t.Fatalf("representative run %d with line %q: want the third, which ran alone", rep.Representative, base.(HostSharer).SharedHost())
	}
	g, err := Gate(base, []Result{fake(0.8, nil)}, GateOptions{MaxRegression: 0.05})
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"baseline: 2 of its 5 runs (run 2, 4); run 2: " + line}
	if strings.Join(g.SharedHost, "|") != strings.Join(want, "|") {
		t.Errorf("shared host %q, want %q", g.SharedHost, want)
	}
}

// A neighbour moves a run's numbers either way (beside one, the handoff
// and its reference lose CPUs unequally): the gate judges without the
// runs it moved where each side keeps MinRuns quiet ones, and says so.
// Here a real 20% regression hides behind two results a neighbour
// inflated: judged with them it is noise, without them a regression.
func TestGateSetsAsideTheRunsANeighbourMoved(t *testing.T) {
	t.Parallel()
	line := "other processes used 0.79 of the host's 2 CPUs (0.86 at the most)"
	runs := func(line string, effs ...float64) []Result {
		var out []Result
		for _, e := range effs {
			out = append(out, sharedResult{fake(e, nil), ""})
		}
		if line != "" {
			out = append(out, sharedResult{fake(1.10, nil), line}, sharedResult{fake(1.05, nil), line})
		}
		return out
	}
	base := runs("", 0.80, 0.82, 0.79, 0.81, 0.80)
	for _, tc := range []struct {
		name       string
		base       []Result // nil: base
		results    []Result
		judgeMoved bool
		verdict    Verdict
		setAside   []string
	}{
		{"moved runs set aside", nil, runs(line, 0.64, 0.65, 0.66), false, Regression, []string{"result 4", "result 5"}},
		{"moved runs judged (--judge-shared)", nil, runs(line, 0.64, 0.65, 0.66), true, Noise, nil},
		{"too few quiet runs to set any aside", nil, runs(line, 0.64, 0.65), false, Noise, nil},
		{"too few quiet baseline runs", runs(line, 0.80, 0.81), runs(line, 0.64, 0.65, 0.66), false, Noise, nil},
		{"nothing moved", nil, runs("", 0.64, 0.65, 0.66), false, Regression, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := base
			if tc.base != nil {
				b = tc.base
			}
			g, err := Gate(b[0], tc.results, GateOptions{MaxRegression: 0.05, BaselineRuns: b, JudgeMoved: tc.judgeMoved})
			if err != nil {
				t.Fatal(err)
			}
			if len(g.Rows) != 1 || g.Rows[0].Verdict != tc.verdict {
				t.Fatalf("rows %+v: want one %s", g.Rows, tc.verdict)
			}
			if strings.Join(g.SetAside, "|") != strings.Join(tc.setAside, "|") {
				t.Errorf("set aside %q, want %q", g.SetAside, tc.setAside)
			}
			if len(tc.setAside) > 0 && (len(g.Rows[0].Runs) != 3 || !strings.Contains(g.Headline(), "set aside, judged without them")) {
				t.Errorf("runs judged %v, headline %q: want the three quiet ones, and the headline to say so", g.Rows[0].Runs, g.Headline())
			}
		})
	}
}

// A saved --repeat baseline sets aside its own runs a neighbour moved,
// by the flag each run recorded, when the results bring three quiet runs
// too.
func TestGateSetsAsideTheSavedBaselinesMovedRuns(t *testing.T) {
	t.Parallel()
	base, _ := neighbouredBaseline(t)
	if rr := base.Header().Repeats.Runs; !rr[1].HostMoved || !rr[3].HostMoved || rr[0].HostMoved {
		t.Fatalf("runs %+v: want the second and fourth marked moved", rr)
	}
	// One result run: too few quiet runs on its side, so every run of
	// both sides is judged.
	g, err := Gate(base, []Result{fake(0.75, nil)}, GateOptions{MaxRegression: 0.05})
	if err != nil {
		t.Fatal(err)
	}
	if len(g.SetAside) > 0 || len(g.Rows[0].BaselineRuns) != 5 {
		t.Errorf("set aside %q, baseline runs %v: want none set aside against one result", g.SetAside, g.Rows[0].BaselineRuns)
	}
	g, err = Gate(base, []Result{repeated(t, 0.74, 0.75, 0.76)}, GateOptions{MaxRegression: 0.05})
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"baseline, run 2 of 5", "baseline, run 4 of 5"}
	if strings.Join(g.SetAside, "|") != strings.Join(want, "|") {
		t.Errorf("set aside %q, want %q", g.SetAside, want)
	}
	if row := g.Rows[0]; len(row.BaselineRuns) != 3 || row.Baseline != 0.75 || row.Verdict != Pass {
		t.Errorf("baseline runs %v (median %v), verdict %s: want 0.70, 0.80, 0.75, median 0.75, pass", row.BaselineRuns, row.Baseline, row.Verdict)
	}
}
