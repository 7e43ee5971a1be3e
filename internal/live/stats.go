package live

import (
	"sync"
	"time"

	"github.com/nixlctl/nixlctl/internal/report"
)

// RateInterval is the width of one bandwidth sample of a request stream
// (one sparkline cell).
const RateInterval = time.Second

// curWindow is how many RateIntervals the current bandwidth averages.
const curWindow = 4

const maxHistory = 120 // sparkline cells and gauge samples kept per series

// Stats folds events into what a display shows. Safe for concurrent use:
// runners Emit, a display takes Snapshots.
type Stats struct {
	mu       sync.Mutex
	now      func() time.Time
	began    time.Time // NewStats: the run's elapsed time counts from here
	start    time.Time // Start: rate intervals count from here
	s        Snapshot
	lat      *report.Histogram
	buckets  []int64 // bytes per RateInterval since start
	ptBytes  int64
	ptTime   time.Duration
	gaugeIdx map[string]int
}

// Snapshot is the state of a run at one moment. Slices are copies.
type Snapshot struct {
	Title, Unit, Phase string
	Total              int // of Unit; 0 unknown
	Done               int // finished units, warm-up included
	OK, Failed         int // measured requests or points
	Warmup             int
	Elapsed            time.Duration
	Bytes              int64 // moved by measured requests
	CurGBps, AvgGBps   float64
	// Rate is the bandwidth history, oldest first: GB/s per RateInterval
	// for requests, per point for sweeps.
	Rate []float64
	// Latency summarises measured request latencies (for a sweep: the
	// last point's p50 and p99 only).
	Latency  report.Percentiles // in milliseconds
	Warnings []string
	Gauges   []GaugeSeries
	Points   []string // labels of finished sweep points
}

// GaugeSeries is one gauge's history.
type GaugeSeries struct {
	Name   string
	Unit   string
	At     []time.Duration
	Values []float64
	Fit    *Fit
}

// Last is the latest value (0 when empty).
func (g GaugeSeries) Last() float64 {
	if len(g.Values) == 0 {
		return 0
	}
	return g.Values[len(g.Values)-1]
}

// Fraction is Done/Total in [0, 1] (0 when the total is unknown).
func (s Snapshot) Fraction() float64 {
	if s.Total <= 0 {
		return 0
	}
	return min(1, float64(s.Done)/float64(s.Total))
}

// NewStats starts empty; now is the clock (nil: time.Now).
func NewStats(now func() time.Time) *Stats {
	if now == nil {
		now = time.Now
	}
	t := now()
	return &Stats{now: now, began: t, start: t, lat: report.NewHistogram(), gaugeIdx: map[string]int{}}
}

// Emit implements Sink.
func (st *Stats) Emit(e Event) {
	st.mu.Lock()
	defer st.mu.Unlock()
	s := &st.s
	switch e := e.(type) {
	case Start:
		s.Title, s.Total, s.Unit = e.Title, e.Total, e.Unit
		st.start = st.now()
	case Phase:
		s.Phase = e.Text
	case Request:
		s.Done++
		if e.Warmup {
			s.Warmup++
			return
		}
		if !e.OK {
			s.Failed++
			return
		}
		s.OK++
		s.Bytes += e.Bytes
		if e.Latency > 0 { // outcomes without a latency (lease-chaos scenarios) count, but are not timed
			st.lat.Record(e.Latency)
		}
		i := int(st.now().Sub(st.start) / RateInterval)
		for len(st.buckets) <= i {
			st.buckets = append(st.buckets, 0)
		}
		st.buckets[i] += e.Bytes
	case Point:
		s.Done++
		if !e.OK {
			s.Failed++
			return
		}
		s.OK++
		s.Bytes += e.Bytes
		st.ptBytes += e.Bytes
		st.ptTime += e.Elapsed
		if e.Elapsed > 0 {
			s.Rate = appendBounded(s.Rate, float64(e.Bytes)/e.Elapsed.Seconds()/1e9)
		}
		s.Points = append(s.Points, e.Label)
		s.Latency = report.Percentiles{Count: int64(e.Requests), P50: ms(e.P50), P99: ms(e.P99)}
	case Gauge:
		i, ok := st.gaugeIdx[e.Series]
		if !ok {
			i = len(s.Gauges)
			st.gaugeIdx[e.Series] = i
			s.Gauges = append(s.Gauges, GaugeSeries{Name: e.Series, Unit: e.Unit})
		}
		g := &s.Gauges[i]
		g.At = appendBoundedDur(g.At, e.At)
		g.Values = appendBounded(g.Values, e.Value)
	case Fit:
		for i := range s.Gauges {
			if s.Gauges[i].Name == e.Series {
				f := e
				s.Gauges[i].Fit = &f
			}
		}
	case Warning:
		for _, w := range s.Warnings {
			if w == e.Text {
				return
			}
		}
		s.Warnings = append(s.Warnings, e.Text)
	}
}

func ms(d time.Duration) float64 { return float64(d) / 1e6 }

func appendBounded(xs []float64, x float64) []float64 {
	xs = append(xs, x)
	if len(xs) > maxHistory {
		xs = xs[len(xs)-maxHistory:]
	}
	return xs
}

func appendBoundedDur(xs []time.Duration, x time.Duration) []time.Duration {
	xs = append(xs, x)
	if len(xs) > maxHistory {
		xs = xs[len(xs)-maxHistory:]
	}
	return xs
}

// progress is the part of a Snapshot that decides whether a progress
// line is due: cheap enough for every request, where a Snapshot walks the
// latency histogram for its percentiles.
func (st *Stats) progress() (elapsed time.Duration, fraction float64) {
	st.mu.Lock()
	defer st.mu.Unlock()
	return st.now().Sub(st.began), st.s.Fraction()
}

// Snapshot returns the current state.
func (st *Stats) Snapshot() Snapshot {
	st.mu.Lock()
	defer st.mu.Unlock()
	s := st.s
	s.Elapsed = st.now().Sub(st.began)
	sinceStart := st.now().Sub(st.start)
	s.Warnings = append([]string(nil), s.Warnings...)
	s.Points = append([]string(nil), s.Points...)
	s.Gauges = make([]GaugeSeries, len(st.s.Gauges))
	for i, g := range st.s.Gauges {
		g.At = append([]time.Duration(nil), g.At...)
		g.Values = append([]float64(nil), g.Values...)
		s.Gauges[i] = g
	}
	if st.ptTime > 0 { // a sweep: rates per point
		s.Rate = append([]float64(nil), s.Rate...)
		s.AvgGBps = float64(st.ptBytes) / st.ptTime.Seconds() / 1e9
		if len(s.Rate) > 0 {
			s.CurGBps = s.Rate[len(s.Rate)-1]
		}
		return s
	}
	// A request stream: complete intervals only, so the last cell is not
	// a partial one that always reads low.
	full := int(sinceStart / RateInterval)
	full = min(full, len(st.buckets))
	from := max(0, full-maxHistory)
	s.Rate = make([]float64, 0, full-from)
	for _, b := range st.buckets[from:full] {
		s.Rate = append(s.Rate, float64(b)/RateInterval.Seconds()/1e9)
	}
	// "Now" is the last few complete intervals: requests that take longer
	// than one interval would otherwise make it flicker to zero.
	if n := len(s.Rate); n > 0 {
		w := min(n, curWindow)
		for _, r := range s.Rate[n-w:] {
			s.CurGBps += r / float64(w)
		}
	}
	if sinceStart > 0 {
		s.AvgGBps = float64(s.Bytes) / sinceStart.Seconds() / 1e9
	}
	if st.lat.Count() > 0 {
		s.Latency = st.lat.In(time.Millisecond)
	}
	return s
}
