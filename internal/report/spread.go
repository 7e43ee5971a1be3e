package report

import (
	"math"
	"slices"

	"github.com/nixlctl/nixlctl/internal/stats"
)

// Spread describes several measurements of one number: its runs or
// rounds. CILow and CIHigh bound the median with at least 95% confidence
// (the order statistics a binomial count gives, as benchstat does); with
// fewer than 6 values no such interval exists and they are the extremes.
type Spread struct {
	N      int     `json:"n"`
	Min    float64 `json:"min"`
	P10    float64 `json:"p10"`
	Median float64 `json:"median"`
	P90    float64 `json:"p90"`
	Max    float64 `json:"max"`
	CILow  float64 `json:"ci95_low"`
	CIHigh float64 `json:"ci95_high"`
	// MaxOverMin is Max / Min (0 when Min is not positive): how far apart
	// the extremes are.
	MaxOverMin float64 `json:"max_over_min,omitempty"`
}

// SpreadOf sums up xs; the zero Spread for none.
func SpreadOf(xs []float64) Spread {
	n := len(xs)
	if n == 0 {
		return Spread{}
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	sp := Spread{N: n, Min: s[0], Max: s[n-1], P10: stats.Quantile(s, 0.1), Median: stats.Quantile(s, 0.5), P90: stats.Quantile(s, 0.9)}
	lo, hi := medianCI(n)
	sp.CILow, sp.CIHigh = s[lo], s[hi]
	if sp.Min > 0 {
		sp.MaxOverMin = sp.Max / sp.Min
	}
	return sp
}

// medianCI returns the ranks (0-based) of the order statistics that bound
// the median of n values with at least 95% confidence: the largest k with
// 1 - 2 P(B <= k) >= 0.95 for B ~ Binomial(n, 1/2) gives [x(k), x(n-1-k)]
// (x(k) lies above the median only when k or fewer values do). Below 6
// values even the extremes do not reach 95%, and they are returned.
func medianCI(n int) (lo, hi int) {
	lo, hi = 0, n-1
	term := math.Pow(0.5, float64(n)) // P(B = k), from k = 0
	below := 0.0                      // P(B <= k)
	for k := 0; k < n/2; k++ {
		below += term
		if 1-2*below < 0.95 {
			break
		}
		lo, hi = k, n-1-k
		term = term * float64(n-k) / float64(k+1)
	}
	return lo, hi
}
