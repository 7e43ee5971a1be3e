package report

import (
	"fmt"
	"math"
	"sort"
)

// Shift compares two latency distributions A (before) and B (after) with
// a Mann-Whitney U test computed exactly on their histogram buckets (every
// value of a bucket stands at the bucket; equal buckets are ties), so no
// samples need to be kept or resampled.
type Shift struct {
	NA, NB int64
	// Delta is Cliff's delta, P(b > a) - P(b < a) for a random pair: +1
	// when every B value is slower, 0 when neither is, -1 when every B is
	// faster.
	Delta float64
	Z     float64 // normal approximation of U with the tie correction
	P     float64 // two-sided
	// Overlap says whether the p50..p99 ranges of A and B overlap.
	Overlap bool
}

// Thresholds of the noise judgement: a shift is real when it is unlikely
// to be chance (p < 0.01) and not negligible in size (|delta| >= 0.147,
// the lower bound of a "small" Cliff's delta after Romano et al. 2006).
const (
	ShiftAlpha    = 0.01
	ShiftMinDelta = 0.147
)

// CompareDists tests whether b is shifted against a. Either being empty
// gives a zero Shift with P = 1.
func CompareDists(a, b *Histogram) Shift {
	s := Shift{P: 1}
	if a == nil || b == nil || a.Count() == 0 || b.Count() == 0 {
		return s
	}
	s.NA, s.NB = a.Count(), b.Count()
	type cell struct{ a, b float64 }
	cells := map[int64]*cell{}
	for _, x := range a.Bars() {
		cells[x.From] = &cell{a: float64(x.Count)}
	}
	for _, x := range b.Bars() {
		if c, ok := cells[x.From]; ok {
			c.b = float64(x.Count)
		} else {
			cells[x.From] = &cell{b: float64(x.Count)}
		}
	}
	keys := make([]int64, 0, len(cells))
	for k := range cells {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool { return keys[i] < keys[j] })
	na, nb := float64(s.NA), float64(s.NB)
	var u, aBelow, ties float64 // u: pairs with b > a, ties counted half
	for _, k := range keys {
		c := cells[k]
		u += c.b * (aBelow + c.a/2)
		aBelow += c.a
		t := c.a + c.b
		ties += t*t*t - t
	}
	s.Delta = 2*u/(na*nb) - 1
	n := na + nb
	variance := na * nb / 12 * ((n + 1) - ties/(n*(n-1)))
	if variance > 0 {
		s.Z = (u - na*nb/2) / math.Sqrt(variance)
		s.P = math.Erfc(math.Abs(s.Z) / math.Sqrt2)
	}
	a50, a99 := a.Quantile(0.50, 1), a.Quantile(0.99, 1)
	b50, b99 := b.Quantile(0.50, 1), b.Quantile(0.99, 1)
	s.Overlap = a50 <= b99 && b50 <= a99
	return s
}

// Real reports whether the shift is both significant and not negligible.
func (s Shift) Real() bool { return s.P < ShiftAlpha && math.Abs(s.Delta) >= ShiftMinDelta }

// Slower reports a real shift towards higher latency.
func (s Shift) Slower() bool { return s.Real() && s.Delta > 0 }

// Faster reports a real shift towards lower latency.
func (s Shift) Faster() bool { return s.Real() && s.Delta < 0 }

// String is a short verdict: "slower (p<0.001, δ=+0.81)", "same (p=0.42)".
func (s Shift) String() string {
	if s.NA == 0 || s.NB == 0 {
		return "-"
	}
	p := fmt.Sprintf("p=%.2g", s.P)
	if s.P < 0.001 {
		p = "p<0.001"
	}
	switch {
	case !s.Real():
		return fmt.Sprintf("same (%s, δ=%+.2f)", p, s.Delta)
	case s.Delta > 0:
		return fmt.Sprintf("slower (%s, δ=%+.2f)", p, s.Delta)
	}
	return fmt.Sprintf("faster (%s, δ=%+.2f)", p, s.Delta)
}
