package stats

import (
	"math"
	"slices"
	"testing"
)

func TestMedianAndQuantile(t *testing.T) {
	ten := []float64{1, 2, 3, 4, 5, 6, 7, 8, 9, 10}
	for _, tc := range []struct {
		name   string
		xs     []float64
		q, got float64
	}{
		{"empty", nil, 0.5, 0},
		{"empty, any q", []float64{}, 0.99, 0},
		{"one", []float64{3}, 0.5, 3},
		{"one, high q", []float64{3}, 0.9, 3},
		{"odd: the middle", []float64{5, 1, 3}, 0.5, 3},
		{"even: the mean of the middle two", []float64{4, 1, 3, 2}, 0.5, 2.5},
		{"even, not the upper middle", []float64{1, 9, 2, 8}, 0.5, 5},
		{"two", []float64{1, 2}, 0.5, 1.5},
		{"ties", []float64{2, 2, 2, 7}, 0.5, 2},
		{"negative", []float64{-3, -1, -2}, 0.5, -2},
		{"p10", ten, 0.1, 1.9},
		{"p90", ten, 0.9, 9.1},
		{"min", ten, 0, 1},
		{"max", []float64{1, 2}, 1, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			in := slices.Clone(tc.xs)
			v := Quantile(tc.xs, tc.q)
			if math.IsNaN(v) || math.Abs(v-tc.got) > 1e-12 {
				t.Errorf("Quantile(%v, %v) = %v, want %v", tc.xs, tc.q, v, tc.got)
			}
			if tc.q == 0.5 {
				if m := Median(tc.xs); m != v {
					t.Errorf("Median(%v) = %v, Quantile at 0.5 %v", tc.xs, m, v)
				}
			}
			if !slices.Equal(in, tc.xs) {
				t.Errorf("the input changed: %v, was %v", tc.xs, in)
			}
		})
	}
}

func TestECDF(t *testing.T) {
	for _, tc := range []struct {
		name   string
		sorted []float64
		xs, ps []float64
	}{
		{"empty", nil, nil, nil},
		{"one", []float64{4}, []float64{4}, []float64{1}},
		{"distinct", []float64{1, 2, 3, 4}, []float64{1, 2, 3, 4}, []float64{0.25, 0.5, 0.75, 1}},
		{"ties: one step per value", []float64{1, 2, 2, 3}, []float64{1, 2, 3}, []float64{0.25, 0.75, 1}},
		{"all equal", []float64{5, 5}, []float64{5}, []float64{1}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			xs, ps := ECDF(tc.sorted)
			if !slices.Equal(xs, tc.xs) || !slices.Equal(ps, tc.ps) {
				t.Errorf("ECDF(%v) = %v, %v; want %v, %v", tc.sorted, xs, ps, tc.xs, tc.ps)
			}
		})
	}
}
