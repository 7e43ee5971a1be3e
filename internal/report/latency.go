package report

import (
	"encoding/base64"
	"fmt"
	"time"

	"github.com/HdrHistogram/hdrhistogram-go"
)

// Histogram records durations with three significant figures from 1 ns to
// one hour in bounded memory, and merges with others (one per worker, or
// per run for comparisons). Not safe for concurrent use.
type Histogram struct {
	h        *hdrhistogram.Histogram
	overflow int64 // values above an hour, counted rather than lost
}

// NewHistogram returns an empty histogram.
func NewHistogram() *Histogram {
	return &Histogram{h: hdrhistogram.New(1, int64(time.Hour), 3)}
}

// Record adds one duration (values below 1 ns count as 1 ns).
func (h *Histogram) Record(d time.Duration) {
	v := int64(d)
	if v < 1 {
		v = 1
	}
	if err := h.h.RecordValue(v); err != nil {
		h.overflow++
		_ = h.h.RecordValue(h.h.HighestTrackableValue())
	}
}

// Count is the number of recorded values.
func (h *Histogram) Count() int64 { return h.h.TotalCount() }

// Merge adds another histogram's values.
func (h *Histogram) Merge(o *Histogram) {
	h.h.Merge(o.h)
	h.overflow += o.overflow
}

// Percentiles summarise a histogram in one unit.
type Percentiles struct {
	Count int64   `json:"count"`
	Min   float64 `json:"min"`
	Mean  float64 `json:"mean"`
	P50   float64 `json:"p50"`
	P90   float64 `json:"p90"`
	P99   float64 `json:"p99"`
	P999  float64 `json:"p999"`
	Max   float64 `json:"max"`
}

// In summarises the histogram in the given unit (time.Microsecond gives
// microseconds). An empty histogram gives zeros.
func (h *Histogram) In(unit time.Duration) Percentiles {
	u := float64(unit)
	if h.h.TotalCount() == 0 {
		return Percentiles{}
	}
	return Percentiles{
		Count: h.h.TotalCount(),
		Min:   float64(h.h.Min()) / u,
		Mean:  h.h.Mean() / u,
		P50:   float64(h.h.ValueAtPercentile(50)) / u,
		P90:   float64(h.h.ValueAtPercentile(90)) / u,
		P99:   float64(h.h.ValueAtPercentile(99)) / u,
		P999:  float64(h.h.ValueAtPercentile(99.9)) / u,
		Max:   float64(h.h.Max()) / u,
	}
}

// Encode serialises the histogram (compressed HdrHistogram V2, base64),
// for results that others merge or compare later.
func (h *Histogram) Encode() (string, error) {
	b, err := h.h.Encode(hdrhistogram.V2CompressedEncodingCookieBase)
	if err != nil {
		return "", err
	}
	return base64.StdEncoding.EncodeToString(b), nil
}

// DecodeHistogram parses Encode's output.
func DecodeHistogram(s string) (*Histogram, error) {
	b, err := base64.StdEncoding.DecodeString(s)
	if err != nil {
		return nil, fmt.Errorf("histogram: %w", err)
	}
	h, err := hdrhistogram.Decode(b)
	if err != nil {
		return nil, fmt.Errorf("histogram: %w", err)
	}
	return &Histogram{h: h}, nil
}

// Bar is one bucket of a histogram: Count values in [From, To] (ns).
type Bar struct {
	From, To int64
	Count    int64
}

// Bars lists the non-empty buckets in increasing order. Buckets are as
// wide as the histogram's resolution (three significant figures).
func (h *Histogram) Bars() []Bar {
	var out []Bar
	for _, b := range h.h.Distribution() {
		if b.Count > 0 {
			out = append(out, Bar{From: b.From, To: b.To, Count: b.Count})
		}
	}
	return out
}

// CDF is the histogram's CDF as steps, one per non-empty bucket: its
// upper end in unit, with the fraction of values at or below it. nil for
// an empty or nil histogram. The figures and the HTML report both draw it.
func (h *Histogram) CDF(unit time.Duration) (xs, ps []float64) {
	if h == nil || h.Count() == 0 {
		return nil, nil
	}
	var cum float64
	n := float64(h.Count())
	for _, b := range h.Bars() {
		cum += float64(b.Count)
		xs, ps = append(xs, float64(b.To)/float64(unit)), append(ps, cum/n)
	}
	return xs, ps
}

// Quantile returns the value at quantile q in [0, 1], in unit.
func (h *Histogram) Quantile(q float64, unit time.Duration) float64 {
	return float64(h.h.ValueAtPercentile(q*100)) / float64(unit)
}
