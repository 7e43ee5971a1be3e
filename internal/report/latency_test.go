package report

import (
	"math"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
)

func TestHistogramPercentiles(t *testing.T) {
	t.Parallel()
	h := NewHistogram()
	for i := 1; i <= 1000; i++ {
		h.Record(time.Duration(i) * time.Microsecond)
	}
	got := h.In(time.Microsecond)
	want := Percentiles{Count: 1000, Min: 1, Mean: 500.5, P50: 500, P90: 900, P99: 990, P999: 999, Max: 1000}
	// Three significant figures: allow 0.1% relative error.
	approx := cmp.Comparer(func(a, b float64) bool { return math.Abs(a-b) <= 0.001*math.Max(math.Abs(a), math.Abs(b))+1e-9 })
	if diff := cmp.Diff(want, got, approx); diff != "" {
		t.Error(diff)
	}
	o := NewHistogram()
	o.Record(time.Hour * 2) // past the range: clamped, counted
	h.Merge(o)
	if h.Count() != 1001 || h.overflow != 1 {
		t.Errorf("merge: count %d overflow %d", h.Count(), h.overflow)
	}
	enc, err := h.Encode()
	if err != nil {
		t.Fatal(err)
	}
	back, err := DecodeHistogram(enc)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(h.In(time.Microsecond), back.In(time.Microsecond), cmpopts.EquateApprox(0, 1e-9)); diff != "" {
		t.Error(diff)
	}
	if (NewHistogram().In(time.Second) != Percentiles{}) {
		t.Error("empty histogram should summarise to zeros")
	}
	if _, err := DecodeHistogram("!!"); err == nil {
		t.Error("bad encoding accepted")
	}
}

func TestHistogramCDF(t *testing.T) {
	var none *Histogram
	if xs, ps := none.CDF(time.Millisecond); xs != nil || ps != nil {
		t.Errorf("nil histogram: %v %v", xs, ps)
	}
	if xs, ps := NewHistogram().CDF(time.Millisecond); xs != nil || ps != nil {
		t.Errorf("empty histogram: %v %v", xs, ps)
	}
	h := NewHistogram()
	for _, d := range []time.Duration{time.Millisecond, time.Millisecond, 3 * time.Millisecond, 10 * time.Millisecond} {
		h.Record(d)
	}
	xs, ps := h.CDF(time.Millisecond)
	if len(xs) != 3 || len(ps) != 3 {
		t.Fatalf("%d steps (%v %v), want one per distinct bucket: 3", len(xs), xs, ps)
	}
	for i, want := range []struct{ x, p float64 }{{1, 0.5}, {3, 0.75}, {10, 1}} {
		// A bucket's upper end: within the histogram's three significant figures.
		if math.Abs(xs[i]-want.x)/want.x > 1e-3 || ps[i] != want.p {
			t.Errorf("step %d: %v at %v, want about %v at %v", i, xs[i], ps[i], want.x, want.p)
		}
	}
}
