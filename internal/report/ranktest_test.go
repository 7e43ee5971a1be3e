package report

import (
	"math"
	"testing"
)

func TestUDistributionCountsArrangements(t *testing.T) {
	// 3 and 3 values: C(6,3) = 20 arrangements, symmetric, one with U = 0.
	d := uDistribution(3, 3)
	want := []float64{1, 1, 2, 3, 3, 3, 3, 2, 1, 1}
	if len(d) != len(want) {
		t.Fatalf("len %d, want %d", len(d), len(want))
	}
	for u := range want {
		if d[u] != want[u] {
			t.Errorf("count of U=%d: %v, want %v", u, d[u], want[u])
		}
	}
}

func TestCompareRuns(t *testing.T) {
	for _, tc := range []struct {
		name        string
		base, runs  []float64
		better      Better
		pWorse      float64
		worseAtRuns bool
	}{
		{"every run worse, higher is better", []float64{1.0, 1.01, 0.99}, []float64{0.8, 0.81, 0.79}, HigherIsBetter, 1.0 / 20, true},
		{"every run worse, lower is better", []float64{10, 11, 12}, []float64{20, 21, 22}, LowerIsBetter, 1.0 / 20, true},
		{"every run better", []float64{1.0, 1.01, 0.99}, []float64{1.2, 1.21, 1.19}, HigherIsBetter, 1, false},
		{"interleaved", []float64{1, 3, 5}, []float64{2, 4, 6}, HigherIsBetter, 16.0 / 20, false},
		{"five against five, all worse", []float64{5, 6, 7, 8, 9}, []float64{0, 1, 2, 3, 4}, HigherIsBetter, 1.0 / 252, true},
		{"ties count half", []float64{1, 1, 1}, []float64{1, 1, 1}, HigherIsBetter, 10.0 / 20, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := CompareRuns(tc.base, tc.runs, tc.better)
			if math.Abs(s.PWorse-tc.pWorse) > 1e-9 {
				t.Errorf("PWorse %.4f, want %.4f (U %v)", s.PWorse, tc.pWorse, s.U)
			}
			if got := s.PWorse <= RunsAlpha; got != tc.worseAtRuns {
				t.Errorf("worse at alpha %v: %v, want %v", RunsAlpha, got, tc.worseAtRuns)
			}
		})
	}
}
