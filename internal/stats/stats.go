// Package stats holds the project's one median, its quantiles and its
// empirical CDF: plain functions of a []float64, with no imports beyond
// the standard library, so that every package that sums up numbers (the
// bench's summaries, --repeat, gate, the HTML report, cpuspeed) calls the
// same definitions and agrees on one set of numbers.
package stats

import (
	"math"
	"slices"
)

// Median is the middle of xs, the mean of the two middle values for an
// even count (the conventional definition, and Quantile's at 0.5); 0 for
// none. xs is not changed.
func Median(xs []float64) float64 {
	return Quantile(xs, 0.5)
}

// Quantile is the q-quantile of xs (q in [0, 1]) by linear interpolation
// between the closest ranks (type 7, as numpy's and R's default); 0 for
// none. xs is not changed.
func Quantile(xs []float64, q float64) float64 {
	n := len(xs)
	if n == 0 {
		return 0
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	h := q * float64(n-1)
	lo := int(math.Floor(h))
	if lo >= n-1 {
		return s[n-1]
	}
	return s[lo] + (h-float64(lo))*(s[lo+1]-s[lo])
}

// ECDF is the empirical CDF of sorted values as steps: each distinct
// value once, with the fraction of values at or below it. nil for none.
func ECDF(sorted []float64) (xs, ps []float64) {
	m := len(sorted)
	for i, v := range sorted {
		if i+1 < m && sorted[i+1] == v {
			continue // one step per distinct value
		}
		xs, ps = append(xs, v), append(ps, float64(i+1)/float64(m))
	}
	return xs, ps
}
