package probe

import (
	"math"
	"math/rand/v2"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
)

// series makes samples every dt seconds for n samples: RSS = base +
// slope MB/min * t + noise (uniform, ±noise MB).
func series(n int, dt, base, slopeMBPerMin, noise float64, seed uint64) []Sample {
	rng := rand.New(rand.NewPCG(seed, 1))
	out := make([]Sample, n)
	for i := range out {
		t := float64(i) * dt
		mb := base + slopeMBPerMin*t/60 + noise*(2*rng.Float64()-1)
		out[i] = Sample{T: t, RSS: int64(mb * MB), VmData: int64(2 * mb * MB), Maps: 100, FDs: 20}
	}
	return out
}

func TestFitRecoversKnownSlope(t *testing.T) {
	approx := cmpopts.EquateApprox(0.05, 0.5) // 5% or 0.5 MB/min
	for _, tc := range []struct {
		name  string
		slope float64
		noise float64
	}{
		{"seed's 400 MB/min, noisy", 400, 20},
		{"30 MB/min", 30, 2},
		{"shrinking", -12, 1},
		{"exact", 60, 0},
	} {
		s := series(61, 1, 300, tc.slope, tc.noise, 7)
		f := FitRSS(s, 10)
		if f.Samples != 51 || f.FromS != 10 || f.ToS != 60 {
			t.Errorf("%s: window %d samples %g..%gs, want 51 samples 10..60s", tc.name, f.Samples, f.FromS, f.ToS)
		}
		if d := cmp.Diff(tc.slope, f.Slope, approx); d != "" {
			t.Errorf("%s: slope (-want +got):\n%s", tc.name, d)
		}
		if d := cmp.Diff(tc.slope*50/60, f.FitGrowth, approx); d != "" {
			t.Errorf("%s: fitted growth (-want +got):\n%s", tc.name, d)
		}
	}
}

func TestVerdicts(t *testing.T) {
	th := DefaultThresholds
	tests := []struct {
		name string
		s    []Sample
		want string
	}{
		{"steady leak", series(61, 1, 300, 30, 1, 1), Leak},
		{"seed's leak", series(61, 1, 300, 400, 20, 2), Leak},
		{"flat and noisy", series(61, 1, 300, 0, 3, 3), Stable},
		{"flat and quiet", series(61, 1, 300, 0, 0, 4), Stable},
		{"shrinking", series(61, 1, 300, -20, 1, 5), Stable},
		{"too short", series(8, 1, 300, 100, 0, 6), Inconclusive},
		{"noisy growth", series(61, 1, 300, 6, 40, 7), Inconclusive},
		{"slow growth over a long run", series(601, 1, 300, 1, 0.2, 8), Inconclusive},
	}
	for _, tc := range tests {
		f := FitRSS(tc.s, th.WarmupS)
		got, why := th.Verdict(f)
		if got != tc.want {
			t.Errorf("%s: %s (%s), want %s; fit %+v", tc.name, got, why, tc.want, f)
		}
	}
	// A one-off step is not a steady leak, however well a line fits it.
	step := series(61, 1, 300, 0, 0.1, 9)
	for i := range step {
		if step[i].T >= 35 {
			step[i].RSS += 60 * MB
		}
	}
	if got, why := th.Verdict(FitRSS(step, th.WarmupS)); got == Leak {
		t.Errorf("a step was called a leak: %s", why)
	}
}

func TestFitDegenerate(t *testing.T) {
	if f := FitRSS(nil, 0); f.Samples != 0 || f.Slope != 0 {
		t.Errorf("empty: %+v", f)
	}
	one := []Sample{{T: 20, RSS: 5e6}}
	if f := FitRSS(one, 10); f.Samples != 1 || f.Slope != 0 {
		t.Errorf("one sample: %+v", f)
	}
	flat := series(20, 1, 100, 0, 0, 1)
	f := FitRSS(flat, 0)
	if math.IsNaN(f.R2) || math.IsNaN(f.Slope) || f.Slope != 0 {
		t.Errorf("flat: %+v", f)
	}
}
