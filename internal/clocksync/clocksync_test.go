package clocksync

import (
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// ping builds the sample a ping would produce given the true offset and the
// delays on each leg; t0 is on the driver's clock.
func ping(t0, theta, there, proc, back int64, oneReading bool) Sample {
	t1 := t0 + there + theta
	s := Sample{T0: t0, T1: t1, T2: t1 + proc, T3: t0 + there + proc + back}
	if oneReading {
		s.T2 = 0
	}
	return s
}

func TestEstimateExact(t *testing.T) {
	// θ ∈ [T2-T3, T1-T0] = [930, 1050]: midpoint 990, half-width 60, and the
	// 10 ns the endpoint spent is not part of the round trip.
	got, err := Estimate([]Sample{{T0: 100, T1: 1150, T2: 1160, T3: 230}})
	if err != nil {
		t.Fatal(err)
	}
	want := Offset{Nanos: 990, Uncertainty: 60, RTT: 120, Samples: 1}
	if d := cmp.Diff(want, got); d != "" {
		t.Error(d)
	}
	// An odd round trip rounds the bound up, never leaving the truth out.
	got, err = Estimate([]Sample{{T0: 1, T1: 1, T3: 4}})
	if err != nil {
		t.Fatal(err)
	}
	if lo, hi := got.Nanos-int64(got.Uncertainty), got.Nanos+int64(got.Uncertainty); lo > -3 || hi < 0 {
		t.Errorf("bound [%d, %d] misses [-3, 0]", lo, hi)
	}
}

// Synthetic pings with a known offset and jittered, asymmetric delays: the
// estimate must hold the truth within its uncertainty, and the winner must
// be the ping with the lowest round trip.
func TestEstimateKnownOffset(t *testing.T) {
	const uptime = 5 * int64(time.Hour) // keeps a -1 h endpoint clock positive
	for _, tc := range []struct {
		name       string
		theta      int64
		oneReading bool
	}{
		{"zero", 0, false},
		{"plus one hour", int64(time.Hour), false},
		{"minus one hour", -int64(time.Hour), false},
		{"plus one hour, one reading", int64(time.Hour), true},
		{"minus one hour, one reading", -int64(time.Hour), true},
		{"37 ms", 37 * int64(time.Millisecond), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rng := rand.New(rand.NewPCG(1, uint64(tc.theta)))
			var samples []Sample
			bestRTT := int64(-1)
			t0 := uptime
			for range 16 {
				// 30 µs base each way, plus exponential queueing up to ms.
				there := 30_000 + int64(rng.ExpFloat64()*200_000)
				back := 30_000 + int64(rng.ExpFloat64()*200_000)
				proc := int64(rng.IntN(50_000))
				s := ping(t0, tc.theta, there, proc, back, tc.oneReading)
				samples = append(samples, s)
				rtt := there + back
				if tc.oneReading {
					rtt += proc
				}
				if bestRTT < 0 || rtt < bestRTT {
					bestRTT = rtt
				}
				t0 = s.T3 + int64(time.Millisecond)
			}
			got, err := Estimate(samples)
			if err != nil {
				t.Fatal(err)
			}
			if off := got.Nanos - tc.theta; off < -int64(got.Uncertainty) || off > int64(got.Uncertainty) {
				t.Errorf("estimate %d is %d ns from the truth %d, outside ±%v", got.Nanos, off, tc.theta, got.Uncertainty)
			}
			if got.RTT != time.Duration(bestRTT) {
				t.Errorf("RTT %v, want the lowest %v", got.RTT, time.Duration(bestRTT))
			}
			if got.Uncertainty != time.Duration((bestRTT+1)/2) {
				t.Errorf("uncertainty %v, want half the lowest round trip %v", got.Uncertainty, time.Duration(bestRTT)/2)
			}
			if got.Samples != 16 || got.SameClock {
				t.Errorf("Samples %d SameClock %v", got.Samples, got.SameClock)
			}
			// An endpoint reading at the truth maps back onto the driver's
			// clock within the uncertainty.
			if d := got.ToDriver(uptime+tc.theta) - uptime; d < -int64(got.Uncertainty) || d > int64(got.Uncertainty) {
				t.Errorf("ToDriver off by %d ns", d)
			}
		})
	}
}

// A slow ping whose midpoint is far off must lose to a fast one.
func TestEstimateLowestRTTWins(t *testing.T) {
	const theta = 1_000_000
	slow := ping(10_000_000, theta, 5_000_000, 0, 100_000, false) // 5 ms one way: midpoint 2.45 ms off
	fast := ping(20_000_000, theta, 40_000, 10_000, 60_000, false)
	for _, order := range [][]Sample{{slow, fast}, {fast, slow}} {
		got, err := Estimate(order)
		if err != nil {
			t.Fatal(err)
		}
		want := Offset{Nanos: theta - 10_000, Uncertainty: 50_000, RTT: 100_000, Samples: 2}
		if d := cmp.Diff(want, got); d != "" {
			t.Error(d)
		}
	}
}

func TestEstimateRejects(t *testing.T) {
	good := Sample{T0: 100, T1: 200, T2: 210, T3: 300}
	for _, tc := range []struct {
		name    string
		samples []Sample
		want    string
	}{
		{"empty", nil, "no samples"},
		{"received before sent", []Sample{good, {T0: 300, T1: 200, T3: 100}}, "sample 1: negative round trip"},
		{"replied before received", []Sample{{T0: 100, T1: 210, T2: 200, T3: 300}}, "negative processing time"},
		{"processing longer than the round trip", []Sample{{T0: 100, T1: 1000, T2: 1300, T3: 300}}, "negative round trip"},
		{"negative reading", []Sample{{T0: -5, T1: 200, T3: 300}}, "t0=-5 is negative"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Estimate(tc.samples)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err %v, want it to mention %q", err, tc.want)
			}
		})
	}
}

func TestSameClockOffset(t *testing.T) {
	o := SameClockOffset()
	if o.Nanos != 0 || !o.SameClock || o.ToDriver(12345) != 12345 {
		t.Errorf("%+v", o)
	}
	if o.String() != "same clock" {
		t.Errorf("String %q", o.String())
	}
	got := Offset{Nanos: int64(time.Hour), Uncertainty: 45 * time.Microsecond, RTT: 90 * time.Microsecond, Samples: 16}.String()
	if want := "+1h0m0s ±45µs (rtt 90µs, 16 samples)"; got != want {
		t.Errorf("String %q, want %q", got, want)
	}
}

// The estimate takes an endpoint's readings off the wire: whatever they
// are, it must not panic, and an accepted estimate must be self-consistent.
// Seeds built from a true offset must also hold that truth.
func FuzzEstimate(f *testing.F) {
	f.Add(int64(1e12), int64(3.6e12), int64(30_000), int64(5_000), int64(90_000), false)
	f.Add(int64(5e12), int64(-3.6e12), int64(1), int64(0), int64(1), true)
	f.Add(int64(0), int64(0), int64(0), int64(0), int64(0), false)
	f.Fuzz(func(t *testing.T, t0, theta, there, proc, back int64, raw bool) {
		var s Sample
		if raw {
			s = Sample{T0: t0, T1: theta, T2: there, T3: back}
		} else {
			if t0 < 0 || there < 0 || proc < 0 || back < 0 || t0 > 1<<61 || there > 1<<58 || proc > 1<<58 || back > 1<<58 ||
				theta > 1<<60 || theta < -t0 {
				t.Skip()
			}
			s = ping(t0, theta, there, proc, back, false)
			if s.T1 == 0 {
				t.Skip() // T2 would read as absent
			}
		}
		got, err := Estimate([]Sample{s})
		if err != nil {
			if !raw {
				t.Fatalf("a causal ping %+v was rejected: %v", s, err)
			}
			return
		}
		if got.RTT < 0 || got.Uncertainty < 0 || 2*got.Uncertainty < got.RTT || 2*got.Uncertainty > got.RTT+1 {
			t.Fatalf("inconsistent %+v from %+v", got, s)
		}
		if !raw {
			if d := got.Nanos - theta; d < -int64(got.Uncertainty) || d > int64(got.Uncertainty) {
				t.Fatalf("truth %d outside %v from %+v", theta, got, s)
			}
		}
	})
}
