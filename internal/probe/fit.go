package probe

import (
	"fmt"
	"math"

	"gonum.org/v1/gonum/stat"
)

// MB is the unit of leak rates and growth: 10^6 bytes, as in "400 MB/min".
const MB = 1e6

// Verdicts of one configuration.
const (
	Leak         = "LEAK"
	Stable       = "STABLE"
	Inconclusive = "INCONCLUSIVE"
	Skipped      = "SKIPPED" // the configuration could not run here (a backend missing)
	Failed       = "ERROR"   // it started but broke; see the error
)

// Thresholds decide a verdict from a fit of RSS over time. The result
// carries them, so a verdict can be checked against its numbers.
type Thresholds struct {
	// Samples before WarmupS seconds are not fitted: start-up (agent
	// creation, registration, wire-up, the first churn) grows RSS once.
	WarmupS float64 `json:"warmup_s"`
	// LEAK: the slope is at least LeakSlope MB/min, the line explains the
	// series (R² >= LeakR2), and each half of the window grows at least
	// at half LeakSlope, so that a single step is not called a leak.
	LeakSlope float64 `json:"leak_slope_mb_per_min"`
	LeakR2    float64 `json:"leak_r2"`
	// STABLE: the slope is below StableSlope MB/min and the fitted growth
	// over the window below StableGrowth MB.
	StableSlope  float64 `json:"stable_slope_mb_per_min"`
	StableGrowth float64 `json:"stable_growth_mb"`
	// Fewer samples than MinSamples after the warm-up are INCONCLUSIVE.
	MinSamples int `json:"min_samples"`
}

// DefaultThresholds are documented in docs/probe.md.
var DefaultThresholds = Thresholds{WarmupS: 10, LeakSlope: 2, LeakR2: 0.9, StableSlope: 2, StableGrowth: 4, MinSamples: 6}

// Fit is a least-squares line through one series after the warm-up.
type Fit struct {
	Samples   int     `json:"samples"` // points fitted
	FromS     float64 `json:"from_s"`  // first fitted sample's time
	ToS       float64 `json:"to_s"`    // last fitted sample's time
	Slope     float64 `json:"slope_per_min"`
	Intercept float64 `json:"intercept"`
	R2        float64 `json:"r2"`
	// Growth is the series' last fitted value minus its first (raw, not
	// fitted); FitGrowth is slope x window.
	Growth    float64 `json:"growth"`
	FitGrowth float64 `json:"fit_growth"`
	// Half slopes: the first and the second half of the window fitted
	// on their own.
	FirstHalfSlope  float64 `json:"first_half_slope_per_min"`
	SecondHalfSlope float64 `json:"second_half_slope_per_min"`
}

// FitSeries fits y(t) (t in seconds, slope per minute) over the samples
// at or after warmup seconds. NaN R² (a perfectly flat series) becomes 0:
// a line explains none of a series that does not vary.
func FitSeries(samples []Sample, warmup float64, y func(Sample) float64) Fit {
	var xs, ys []float64
	for _, s := range samples {
		if s.T >= warmup {
			xs = append(xs, s.T/60)
			ys = append(ys, y(s))
		}
	}
	f := Fit{Samples: len(xs)}
	if len(xs) < 2 {
		return f
	}
	f.FromS, f.ToS = xs[0]*60, xs[len(xs)-1]*60
	f.Intercept, f.Slope = stat.LinearRegression(xs, ys, nil, false)
	f.R2 = stat.RSquared(xs, ys, nil, f.Intercept, f.Slope)
	if math.IsNaN(f.R2) || math.IsInf(f.R2, 0) {
		f.R2 = 0
	}
	if math.IsNaN(f.Slope) || math.IsInf(f.Slope, 0) {
		f.Slope, f.Intercept = 0, ys[0]
	}
	f.Growth = ys[len(ys)-1] - ys[0]
	f.FitGrowth = f.Slope * (xs[len(xs)-1] - xs[0])
	h := len(xs) / 2
	if h >= 2 && len(xs)-h >= 2 {
		_, f.FirstHalfSlope = stat.LinearRegression(xs[:h], ys[:h], nil, false)
		_, f.SecondHalfSlope = stat.LinearRegression(xs[h:], ys[h:], nil, false)
	}
	return f
}

// FitRSS fits RSS in MB.
func FitRSS(samples []Sample, warmup float64) Fit {
	return FitSeries(samples, warmup, func(s Sample) float64 { return float64(s.RSS) / MB })
}

// Verdict judges an RSS fit (in MB and MB/min) and says why.
func (th Thresholds) Verdict(f Fit) (string, string) {
	if f.Samples < th.MinSamples {
		return Inconclusive, fmt.Sprintf("only %d samples after the %gs warm-up (need %d): run longer or sample more often", f.Samples, th.WarmupS, th.MinSamples)
	}
	if f.Slope >= th.LeakSlope && f.R2 >= th.LeakR2 {
		if f.FirstHalfSlope >= th.LeakSlope/2 && f.SecondHalfSlope >= th.LeakSlope/2 {
			return Leak, fmt.Sprintf("RSS grows steadily: %.3g MB/min (R² %.2f >= %.2f, both halves >= %.3g MB/min)", f.Slope, f.R2, th.LeakR2, th.LeakSlope/2)
		}
		return Inconclusive, fmt.Sprintf("RSS rose %.3g MB/min but not in both halves of the run (%.3g then %.3g MB/min): a step, not a steady leak? run longer",
			f.Slope, f.FirstHalfSlope, f.SecondHalfSlope)
	}
	if f.Slope < th.StableSlope && f.FitGrowth < th.StableGrowth {
		return Stable, fmt.Sprintf("slope %.3g MB/min < %g and fitted growth %.3g MB < %g over %.0fs", f.Slope, th.StableSlope, f.FitGrowth, th.StableGrowth, f.ToS-f.FromS)
	}
	if f.Slope >= th.LeakSlope {
		return Inconclusive, fmt.Sprintf("RSS rose %.3g MB/min but noisily (R² %.2f < %.2f): run longer", f.Slope, f.R2, th.LeakR2)
	}
	return Inconclusive, fmt.Sprintf("slow growth: %.3g MB/min, %.3g MB over %.0fs, below the leak threshold: run longer", f.Slope, f.FitGrowth, f.ToS-f.FromS)
}
