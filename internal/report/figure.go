package report

import (
	"fmt"
	"math"
	"sort"
	"time"

	"github.com/nixlctl/nixlctl/internal/stats"
)

// Figure is a picture described as plain data: panels side by side, each
// with lines, a histogram or timeline spans. internal/plots draws it with
// gonum/plot; keeping the description here lets runners and result types
// say what to draw without importing a plotting library.
type Figure struct {
	Title  string
	Panels []Panel
	// Columns is how many panels go in a row (0: all in one row).
	Columns int
}

// Scale is an axis scale.
type Scale int

// Scales. Log scales need positive values; the renderer clamps the rest.
const (
	Linear Scale = iota
	Log2
	Log10
)

// Panel is one plot.
type Panel struct {
	Title, XLabel, YLabel string
	XScale, YScale        Scale
	YMin                  *float64 // pin the axis start (e.g. 0 for bandwidth)
	Lines                 []Line
	Bars                  *Bars
	Spans                 []Span // a timeline: one row per distinct Row, in order of appearance
	// Heatmap, when set, is the whole panel: a matrix of cells (the
	// lines, bars, spans and scales are not drawn with it).
	Heatmap *Heatmap
}

// Heatmap is a matrix of values drawn as coloured cells, each labelled
// with its value: Rows from the top, Cols from the left.
type Heatmap struct {
	Rows, Cols []string
	Values     [][]float64 // [row][col]; NaN: no value (a blank cell)
	Format     string      // the cells' labels, e.g. "%.2f" (default: three significant digits, no exponent up to 1e7)
	// HighIsGood colours high values cool and low ones hot (bandwidth);
	// otherwise high is hot (latency).
	HighIsGood bool
}

// LineStyle says how a line is drawn.
type LineStyle int

// Line styles.
const (
	Solid  LineStyle = iota
	Dashed           // fitted lines, references
	Steps            // counts over time
)

// Line is one series of (X, Y) points.
type Line struct {
	Label  string
	X, Y   []float64
	Style  LineStyle
	Points bool // mark each point (sweeps with few points)
	// Color picks the palette entry, counting from 1, so a fitted line
	// can share its series' colour; 0 takes the line's position.
	Color int
}

// Bars is a histogram: Counts[i] values fell in [Edges[i], Edges[i+1]).
type Bars struct {
	Label  string
	Edges  []float64
	Counts []float64
}

// Span is one interval on a timeline row, e.g. a lease from grant to
// release. Class groups spans by outcome (released, expired, failed) and
// picks the colour.
type Span struct {
	Row        string
	Start, End float64
	Class      string
}

// LatencySeries is one distribution to plot: raw values (records) when
// there are some, else a histogram.
type LatencySeries struct {
	Label  string
	Values []float64 // in the figure's unit
	Hist   *Histogram
}

// LatencyFigure draws distributions as a histogram (the first series) and
// CDFs (all of them), in unit (time.Millisecond: values in ms).
func LatencyFigure(title string, unit time.Duration, series ...LatencySeries) (Figure, error) {
	name := unitName(unit)
	hist := Panel{Title: "Histogram", XLabel: "latency (" + name + ")", YLabel: "requests"}
	cdf := Panel{Title: "CDF", XLabel: "latency (" + name + ")", YLabel: "fraction of requests ≤ x", YMin: ptr(0)}
	var lo, hi float64 = math.Inf(1), 0
	var points [][2][]float64
	for _, s := range series {
		xs, ps := s.cdf(unit)
		if len(xs) == 0 {
			continue
		}
		lo, hi = math.Min(lo, xs[0]), math.Max(hi, xs[len(xs)-1])
		points = append(points, [2][]float64{xs, ps})
		cdf.Lines = append(cdf.Lines, Line{Label: s.Label, X: xs, Y: ps, Style: Steps})
	}
	if len(points) == 0 {
		return Figure{}, fmt.Errorf("no latencies to plot")
	}
	// A log axis when the values span more than a decade, so a tail
	// does not squash the body into one bar.
	if lo > 0 && hi/lo > 10 {
		hist.XScale, cdf.XScale = Log10, Log10
	}
	hist.Bars = series[0].bars(unit, lo, hi, hist.XScale == Log10)
	hist.Bars.Label = series[0].Label
	return Figure{Title: title, Panels: []Panel{hist, cdf}}, nil
}

func ptr(f float64) *float64 { return &f }

func unitName(u time.Duration) string {
	switch u {
	case time.Nanosecond:
		return "ns"
	case time.Microsecond:
		return "µs"
	case time.Millisecond:
		return "ms"
	case time.Second:
		return "s"
	}
	return u.String()
}

// cdf returns sorted values and the fraction of values at or below each.
func (s LatencySeries) cdf(unit time.Duration) (xs, ps []float64) {
	if len(s.Values) > 0 {
		v := append([]float64(nil), s.Values...)
		sort.Float64s(v)
		return stats.ECDF(v)
	}
	return s.Hist.CDF(unit)
}

// bars bins the series into about 40 bins between lo and hi, log-spaced
// when log is set.
func (s LatencySeries) bars(unit time.Duration, lo, hi float64, log bool) *Bars {
	const n = 40
	if hi <= lo {
		lo, hi = lo*0.9, lo*1.1+1e-9
	}
	edges := make([]float64, n+1)
	for i := range edges {
		f := float64(i) / n
		if log {
			edges[i] = lo * math.Pow(hi/lo, f)
		} else {
			edges[i] = lo + (hi-lo)*f
		}
	}
	edges[n] = math.Nextafter(hi, math.Inf(1))
	counts := make([]float64, n)
	add := func(x, c float64) {
		i := sort.SearchFloat64s(edges, x)
		if i < len(edges) && edges[i] == x {
			i++ // edges[i-1] <= x < edges[i]
		}
		counts[min(max(i-1, 0), n-1)] += c
	}
	if len(s.Values) > 0 {
		for _, x := range s.Values {
			add(x, 1)
		}
	} else if s.Hist != nil {
		for _, b := range s.Hist.Bars() {
			add((float64(b.From)+float64(b.To))/2/float64(unit), float64(b.Count))
		}
	}
	return &Bars{Edges: edges, Counts: counts}
}

// SweepPoint is one point of a block x batch sweep, for SweepFigure.
type SweepPoint struct {
	Block, Batch  int
	GBps          float64
	P50US, P99US  float64
	EfficiencyPct float64
}

// SweepFigure draws a bench xfer sweep: bandwidth against block size, one
// line per batch size, and the p99 latency likewise.
func SweepFigure(title string, pts []SweepPoint) (Figure, error) {
	if len(pts) == 0 {
		return Figure{}, fmt.Errorf("no sweep points to plot")
	}
	byBatch := map[int][]SweepPoint{}
	var batches []int
	for _, p := range pts {
		if _, ok := byBatch[p.Batch]; !ok {
			batches = append(batches, p.Batch)
		}
		byBatch[p.Batch] = append(byBatch[p.Batch], p)
	}
	sort.Ints(batches)
	bw := Panel{Title: "Bandwidth", XLabel: "block size (bytes)", YLabel: "GB/s", XScale: Log2, YMin: ptr(0)}
	lat := Panel{Title: "Request latency p99", XLabel: "block size (bytes)", YLabel: "p99 (µs)", XScale: Log2, YScale: Log10}
	for _, b := range batches {
		ps := byBatch[b]
		sort.Slice(ps, func(i, j int) bool { return ps[i].Block < ps[j].Block })
		var x, y, l []float64
		for _, p := range ps {
			x, y, l = append(x, float64(p.Block)), append(y, p.GBps), append(l, p.P99US)
		}
		label := fmt.Sprintf("batch %d", b)
		bw.Lines = append(bw.Lines, Line{Label: label, X: x, Y: y, Points: true})
		lat.Lines = append(lat.Lines, Line{Label: label, X: x, Y: l, Points: true})
	}
	return Figure{Title: title, Panels: []Panel{bw, lat}}, nil
}

// RSSSeries is one configuration of a memory probe: resident set size
// over time, and the straight line fitted to it.
type RSSSeries struct {
	Label     string
	Seconds   []float64 // since the start
	RSSMB     []float64
	Intercept float64 // MB at t = 0 of the fit
	SlopeMBs  float64 // MB per second; 0 with Fitted false draws no line
	Fitted    bool
}

// RSSFigure draws RSS over time per configuration with the fitted lines
// dashed (probe ucx-leak).
func RSSFigure(title string, series []RSSSeries) (Figure, error) {
	p := Panel{Title: "Resident set size", XLabel: "time (s)", YLabel: "RSS (MB)"}
	for i, s := range series {
		if len(s.Seconds) == 0 || len(s.Seconds) != len(s.RSSMB) {
			continue
		}
		p.Lines = append(p.Lines, Line{Label: s.Label, X: s.Seconds, Y: s.RSSMB, Color: i + 1})
		if s.Fitted {
			t0, t1 := s.Seconds[0], s.Seconds[len(s.Seconds)-1]
			p.Lines = append(p.Lines, Line{
				Label: fmt.Sprintf("%s fit: %+.3g MB/min", s.Label, s.SlopeMBs*60),
				X:     []float64{t0, t1}, Y: []float64{s.Intercept + s.SlopeMBs*t0, s.Intercept + s.SlopeMBs*t1}, Style: Dashed, Color: i + 1})
		}
	}
	if len(p.Lines) == 0 {
		return Figure{}, fmt.Errorf("no RSS samples to plot")
	}
	return Figure{Title: title, Panels: []Panel{p}}, nil
}

// LeaseSpan is one lease on a timeline: granted at Start, released (or
// expired, or failed) at End, seconds since the run started.
type LeaseSpan struct {
	ID         string
	Start, End float64
	Outcome    string // released, expired, failed, ...
}

// LeaseTimelineFigure draws leases as spans (one row each, coloured by
// outcome) above the number held over time (lease-chaos).
func LeaseTimelineFigure(title string, leases []LeaseSpan) (Figure, error) {
	if len(leases) == 0 {
		return Figure{}, fmt.Errorf("no leases to plot")
	}
	tl := Panel{Title: "Leases", XLabel: "time (s)", YLabel: "lease"}
	type ev struct {
		t float64
		d int
	}
	var evs []ev
	for _, l := range leases {
		tl.Spans = append(tl.Spans, Span{Row: l.ID, Start: l.Start, End: l.End, Class: l.Outcome})
		evs = append(evs, ev{l.Start, 1}, ev{l.End, -1})
	}
	sort.Slice(evs, func(i, j int) bool { return evs[i].t < evs[j].t || evs[i].t == evs[j].t && evs[i].d < evs[j].d })
	held := Line{Label: "held", Style: Steps}
	n := 0
	for _, e := range evs {
		n += e.d
		held.X, held.Y = append(held.X, e.t), append(held.Y, float64(n))
	}
	count := Panel{Title: "Leases held", XLabel: "time (s)", YLabel: "held", YMin: ptr(0), Lines: []Line{held}}
	return Figure{Title: title, Panels: []Panel{tl, count}}, nil
}
