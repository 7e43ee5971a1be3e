package live

import (
	"fmt"
	"io"
	"math"
	"strings"
	"sync"
	"time"

	"github.com/nixlctl/nixlctl/internal/report"
)

// ProgressDelay is how long a run goes before Progress shows anything:
// short runs print their result and nothing else.
const ProgressDelay = 2 * time.Second

// Progress is the progress bar of runs without the terminal UI, written to
// stderr. On a terminal it redraws one line in place; elsewhere (CI logs)
// it prints a line at each tenth of the run. It is a Sink: give it to a
// runner's options, and Close it when the run returns.
type Progress struct {
	*Stats
	w      io.Writer
	tty    bool
	delay  time.Duration
	mu     sync.Mutex
	shown  bool // a TTY line is on screen
	tenths int  // last tenth printed (non-TTY)
	stop   chan struct{}
	done   chan struct{}
}

// NewProgress writes progress to w; tty says whether w is a terminal.
func NewProgress(w io.Writer, tty bool) *Progress {
	return newProgress(w, tty, ProgressDelay, nil)
}

func newProgress(w io.Writer, tty bool, delay time.Duration, now func() time.Time) *Progress {
	p := &Progress{Stats: NewStats(now), w: w, tty: tty, delay: delay, stop: make(chan struct{}), done: make(chan struct{})}
	if tty {
		go p.redraw()
	} else {
		close(p.done)
	}
	return p
}

// Emit implements Sink.
func (p *Progress) Emit(e Event) {
	p.Stats.Emit(e)
	if p.tty {
		return
	}
	switch e.(type) {
	case Request, Point:
		// Once a tenth of the run, not once a request: a Snapshot walks
		// the latency histogram, and a handoff driver that took one per
		// request spent 0.6% of a core on it (perf, 999 Hz: 17 samples
		// in 3 s) while the endpoints' copies wanted every cycle.
		elapsed, fraction := p.progress()
		if elapsed < p.delay || fraction <= 0 {
			return
		}
		tenth := int(10 * fraction)
		p.mu.Lock()
		defer p.mu.Unlock()
		if tenth > p.tenths {
			p.tenths = tenth
			fmt.Fprintln(p.w, Line(p.Snapshot(), 20))
		}
	}
}

func (p *Progress) redraw() {
	defer close(p.done)
	t := time.NewTicker(200 * time.Millisecond)
	defer t.Stop()
	for {
		select {
		case <-p.stop:
			return
		case <-t.C:
			s := p.Snapshot()
			if s.Elapsed < p.delay {
				continue
			}
			p.mu.Lock()
			fmt.Fprintf(p.w, "\r\x1b[K%s", Line(s, 24))
			p.shown = true
			p.mu.Unlock()
		}
	}
}

// Close stops redrawing and clears the line, so results print on a clean
// terminal. Safe to call more than once.
func (p *Progress) Close() {
	p.mu.Lock()
	select {
	case <-p.stop:
	default:
		close(p.stop)
	}
	p.mu.Unlock()
	<-p.done
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.shown {
		fmt.Fprint(p.w, "\r\x1b[K")
		p.shown = false
	}
}

// Line renders a snapshot as one line with a bar of width cells:
//
//	bench push [######------] 45/100 requests  1.21 GB/s now, 1.10 GB/s avg  p50 2.10 ms  p99 4.31 ms  failed 1
func Line(s Snapshot, width int) string {
	var b strings.Builder
	if s.Title != "" {
		b.WriteString(s.Title + " ")
	}
	if s.Total > 0 {
		fill := int(math.Round(s.Fraction() * float64(width)))
		fmt.Fprintf(&b, "[%s%s] %d/%d %s", strings.Repeat("#", fill), strings.Repeat("-", width-fill), s.Done, s.Total, s.Unit)
	} else {
		fmt.Fprintf(&b, "%d %s", s.Done, s.Unit)
	}
	switch {
	case s.AvgGBps > 0 && len(s.Rate) == 0:
		// No complete interval yet: "0 GB/s now" beside a positive
		// average read as a stall.
		fmt.Fprintf(&b, "  %s avg", report.GBps(s.AvgGBps*1e9))
	case s.AvgGBps > 0:
		fmt.Fprintf(&b, "  %s now, %s avg", report.GBps(s.CurGBps*1e9), report.GBps(s.AvgGBps*1e9))
	}
	if s.Latency.P50 > 0 {
		fmt.Fprintf(&b, "  p50 %s  p99 %s", report.Seconds(s.Latency.P50/1e3), report.Seconds(s.Latency.P99/1e3))
	}
	if s.Failed > 0 {
		fmt.Fprintf(&b, "  failed %d", s.Failed)
	}
	if len(s.Warnings) > 0 {
		fmt.Fprintf(&b, "  warnings %d", len(s.Warnings))
	}
	if s.Phase != "" && s.Done < s.Total {
		fmt.Fprintf(&b, "  (%s)", s.Phase)
	}
	return b.String()
}

var sparkRunes = []rune("▁▂▃▄▅▆▇█")

// Sparkline draws the last width values as block characters scaled from 0
// to the largest shown (empty cells as spaces when there are fewer).
func Sparkline(values []float64, width int) string {
	if width <= 0 {
		return ""
	}
	if len(values) > width {
		values = values[len(values)-width:]
	}
	hi := 0.0
	for _, v := range values {
		hi = math.Max(hi, v)
	}
	var b strings.Builder
	for _, v := range values {
		i := 0
		if hi > 0 && v > 0 {
			i = int(math.Round(v / hi * float64(len(sparkRunes)-1)))
		}
		b.WriteRune(sparkRunes[min(max(i, 0), len(sparkRunes)-1)])
	}
	return b.String()
}
