package report

import (
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
)

func TestSpreadOf(t *testing.T) {
	approx := cmpopts.EquateApprox(0, 1e-9)
	for _, tc := range []struct {
		name string
		xs   []float64
		want Spread
	}{
		{"empty", nil, Spread{}},
		// Under six values no order statistics bound the median at 95%.
		{"five", []float64{2, 1, 4, 3, 5}, Spread{N: 5, Min: 1, P10: 1.4, Median: 3, P90: 4.6, Max: 5, CILow: 1, CIHigh: 5, MaxOverMin: 5}},
		// n = 10: P(B <= 1) = 11/1024, so [x(1), x(8)] covers 97.9%;
		// [x(2), x(7)] would cover 89%.
		{"ten", []float64{10, 9, 8, 7, 6, 5, 4, 3, 2, 1}, Spread{N: 10, Min: 1, P10: 1.9, Median: 5.5, P90: 9.1, Max: 10, CILow: 2, CIHigh: 9, MaxOverMin: 10}},
		{"non-positive min", []float64{0, 1}, Spread{N: 2, Min: 0, P10: 0.1, Median: 0.5, P90: 0.9, Max: 1, CILow: 0, CIHigh: 1}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if d := cmp.Diff(tc.want, SpreadOf(tc.xs), approx); d != "" {
				t.Error(d)
			}
		})
	}
}

func TestMedianCICoversNinetyFive(t *testing.T) {
	// The interval for 20 values: P(B <= 5) = 0.0207, so ranks 5..14
	// (0-based) cover 95.9%, and 6..13 would cover 88.5%.
	if lo, hi := medianCI(20); lo != 5 || hi != 14 {
		t.Errorf("medianCI(20) = %d, %d; want 5, 14", lo, hi)
	}
	for n := 1; n < 6; n++ {
		if lo, hi := medianCI(n); lo != 0 || hi != n-1 {
			t.Errorf("medianCI(%d) = %d, %d; want the extremes", n, lo, hi)
		}
	}
}
