package report

import (
	"bytes"
	"strings"
	"testing"
)

// repeated is a --repeat result of fake runs with these efficiencies.
func repeated(t *testing.T, effs ...float64) Result {
	t.Helper()
	var runs []Result
	for _, e := range effs {
		runs = append(runs, fake(e, nil))
	}
	r, err := WithRepeats(runs)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func TestWithRepeatsPicksTheMedianRun(t *testing.T) {
	runs := []Result{fake(0.9, nil), fake(0.5, nil), fake(0.7, nil), fake(0.8, nil)}
	runs[1].Header().Warn("slow host")
	runs[2].Header().Warn("slow host")
	r, err := WithRepeats(runs)
	if err != nil {
		t.Fatal(err)
	}
	rep := r.Header().Repeats
	// Even count: the lower middle run (0.7, the third), a run that
	// happened rather than an average.
	if rep.N != 4 || rep.Representative != 3 || rep.Main != "efficiency" || r.(*fakeResult).Efficiency != 0.7 {
		t.Fatalf("repeats %+v, representative efficiency %v", rep, r.(*fakeResult).Efficiency)
	}
	vs, ok := rep.values("efficiency")
	if !ok || len(vs) != 4 || vs[0] != 0.9 || vs[1] != 0.5 {
		t.Errorf("values %v: want every run's, in run order", vs)
	}
	w := strings.Join(r.Header().Warnings, "\n")
	if !strings.Contains(w, "(2 of 4 runs) slow host") {
		t.Errorf("warnings %q: want the other runs' warnings with their count", w)
	}
	if !strings.Contains(w, "the 4 runs disagree: efficiency ranged 0.5-0.9") {
		t.Errorf("warnings %q: want the spread warning (max/min 1.8)", w)
	}
	var b bytes.Buffer
	if err := WriteRepeats(&b, r, FormatTable); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(b.String(), "run 3 of 4") || !strings.Contains(b.String(), "Over 4 runs") {
		t.Errorf("repeats table:\n%s", b.String())
	}
}

func TestGateJudgesRepeatedRuns(t *testing.T) {
	base := repeated(t, 1.0, 1.02, 0.98, 1.01, 0.99)
	for _, tc := range []struct {
		name    string
		runs    []Result
		verdict Verdict
	}{
		{"same build", []Result{repeated(t, 0.99, 1.0, 1.01)}, Pass},
		{"20% slower in every run", []Result{repeated(t, 0.80, 0.81, 0.79)}, Regression},
		// The median is 6% worse, but one run sits among the baseline's.
		{"one unlucky run is not a regression", []Result{repeated(t, 0.90, 0.94, 1.01)}, Noise},
		{"runs of separate results are pooled", []Result{fake(0.8, nil), fake(0.79, nil), fake(0.81, nil)}, Regression},
		{"better in every run", []Result{repeated(t, 1.2, 1.21, 1.19)}, Improvement},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g, err := Gate(base, tc.runs, GateOptions{MaxRegression: 0.05})
			if err != nil {
				t.Fatal(err)
			}
			row := g.Rows[0]
			if row.Verdict != tc.verdict {
				t.Fatalf("verdict %s (%s), want %s", row.Verdict, row.Why, tc.verdict)
			}
			if row.Baseline != 1.0 || len(row.BaselineRuns) != 5 || !strings.HasPrefix(row.Test, "runs 5 vs 3") {
				t.Errorf("row %+v: want the baseline's median and its runs, tested run against run", row)
			}
		})
	}
}
