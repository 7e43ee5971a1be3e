// Package live carries a run's progress from the runners to whatever
// shows it while the run goes on: the stderr progress bar (Progress), the
// terminal UI (internal/tui), or a test. Runners emit typed events to a
// Sink given in their options and never know who listens; this package has
// no terminal dependency.
//
// A runner that measures requests emits Start once, then Request per
// finished request; a sweep emits Point per finished point; probes and
// chaos runs emit Gauge samples (RSS per configuration, leases held) and a
// Fit per fitted line. Phase and Warning say what is going on.
package live

import "time"

// Event is one thing that happened during a run.
type Event interface{ event() }

// Start says what the run will do. Total counts Unit ("requests",
// "points", "samples"); 0 when unknown.
type Start struct {
	Title string
	Total int
	Unit  string
}

// Phase names the stage the run is in ("starting endpoints", "memcpy
// reference").
type Phase struct{ Text string }

// Request is one finished request or transfer.
type Request struct {
	Bytes   int64
	Latency time.Duration
	OK      bool
	Warmup  bool // left out of the summary; counts as progress only
}

// Point is one finished point of a sweep (bench xfer's block x batch).
type Point struct {
	Label    string
	Bytes    int64
	Elapsed  time.Duration // the timed phase
	Requests int
	P50, P99 time.Duration
	OK       bool
}

// Gauge is one sample of a named quantity over time: RSS of one probe
// configuration, leases held.
type Gauge struct {
	Series string
	At     time.Duration // since the run started
	Value  float64
	Unit   string
}

// Fit is a straight line fitted to a gauge series (RSS growth). Slope is
// in Unit, which the emitter picks for reading ("MB/min": 2.5 means 2.5
// MB per minute); R2 is the fit's coefficient of determination.
type Fit struct {
	Series string
	Slope  float64
	Unit   string
	R2     float64
}

// Warning is something that degrades the run.
type Warning struct{ Text string }

func (Start) event()   {}
func (Phase) event()   {}
func (Request) event() {}
func (Point) event()   {}
func (Gauge) event()   {}
func (Fit) event()     {}
func (Warning) event() {}

// Sink receives events. Runners call Emit from any goroutine, in the
// middle of measuring: implementations must be safe for concurrent use
// and return quickly (Stats only takes a mutex).
type Sink interface{ Emit(Event) }

// Emit sends e to s when s is not nil, so runners need no nil checks.
func Emit(s Sink, e Event) {
	if s != nil {
		s.Emit(e)
	}
}

// Func adapts a function to a Sink.
type Func func(Event)

// Emit implements Sink.
func (f Func) Emit(e Event) { f(e) }
