package plots

import (
	"fmt"
	"math"
	"strconv"

	"gonum.org/v1/plot"
)

// logTicks marks a log axis. Base 2 puts ticks on powers of two (labelled
// as sizes when bytes is set: 4K, 1M), thinned to at most about eight
// labels so they never overlap. Base 10 puts them on 1, 2 and 5 times
// powers of ten when the axis spans three decades or less, else on powers
// of ten only; gonum's own LogTicks labels nothing on an axis inside one
// decade.
type logTicks struct {
	base2, bytes bool
}

func (t logTicks) Ticks(min, max float64) []plot.Tick {
	if min <= 0 || max <= min {
		return nil
	}
	var ticks []plot.Tick
	if t.base2 {
		lo, hi := int(math.Floor(math.Log2(min))), int(math.Ceil(math.Log2(max)))
		step := max1((hi-lo)/8 + 1)
		for e := lo; e <= hi; e++ {
			v := math.Ldexp(1, e)
			if v < min || v > max {
				continue
			}
			label := ""
			if (e-lo)%step == 0 {
				label = t.label2(v)
			}
			ticks = append(ticks, plot.Tick{Value: v, Label: label})
		}
		return ticks
	}
	lo, hi := int(math.Floor(math.Log10(min))), int(math.Ceil(math.Log10(max)))
	mults := []float64{1}
	if hi-lo <= 3 {
		mults = []float64{1, 2, 5}
	}
	for e := lo; e <= hi; e++ {
		for m := 1; m <= 9; m++ {
			v := float64(m) * math.Pow(10, float64(e))
			if v < min*(1-1e-9) || v > max*(1+1e-9) {
				continue
			}
			label := ""
			for _, k := range mults {
				if float64(m) == k {
					label = short(v)
				}
			}
			ticks = append(ticks, plot.Tick{Value: v, Label: label})
		}
	}
	return ticks
}

func max1(n int) int {
	if n < 1 {
		return 1
	}
	return n
}

func (t logTicks) label2(v float64) string {
	if !t.bytes {
		return short(v)
	}
	n := int64(v)
	for _, u := range []struct {
		s string
		b int64
	}{{"G", 1 << 30}, {"M", 1 << 20}, {"K", 1 << 10}} {
		if n >= u.b && n%u.b == 0 {
			return fmt.Sprintf("%d%s", n/u.b, u.s)
		}
	}
	return strconv.FormatInt(n, 10)
}

// short prints a tick value without trailing zeros or exponents for the
// ranges latencies and sizes take.
func short(v float64) string {
	switch av := math.Abs(v); {
	case av >= 1e6:
		return strconv.FormatFloat(v, 'g', 3, 64)
	case av >= 1:
		// Six significant digits: 1.2, not 1.2000000000000002 (a tick
		// accumulated in floating point).
		return strconv.FormatFloat(v, 'g', 6, 64)
	}
	return strconv.FormatFloat(v, 'g', 3, 64)
}

// linTicks is gonum's default linear ticker with labels in shortest form
// ("350", not "350.00"), and integer-only labels for counts.
type linTicks struct{ integer bool }

func (t linTicks) Ticks(min, max float64) []plot.Tick {
	if t.integer && max-min >= 1 && max-min <= 1e6 {
		// Whole steps of 1, 2 or 5 times a power of ten, about five labels.
		step := 1.0
		for _, m := range []float64{1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 1e4, 1e5} {
			if (max-min)/m <= 6 {
				step = m
				break
			}
		}
		var ts []plot.Tick
		for v := math.Ceil(min/step) * step; v <= max; v += step {
			ts = append(ts, plot.Tick{Value: v, Label: short(v)})
		}
		return ts
	}
	ts := plot.DefaultTicks{}.Ticks(min, max)
	for i := range ts {
		if ts[i].Label == "" {
			continue
		}
		if t.integer && ts[i].Value != math.Trunc(ts[i].Value) {
			ts[i].Label = ""
			continue
		}
		ts[i].Label = short(ts[i].Value)
	}
	return ts
}
