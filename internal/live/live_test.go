package live

import (
	"io"
	"math"
	"strings"
	"sync"
	"testing"
	"time"
)

// fakeClock is a settable clock.
type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *fakeClock) now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *fakeClock) add(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

func TestStatsRequests(t *testing.T) {
	t.Parallel()
	clk := &fakeClock{t: time.Unix(100, 0)}
	st := NewStats(clk.now)
	Emit(st, Start{Title: "bench pull", Total: 4, Unit: "requests"})
	Emit(nil, Start{}) // a nil sink is fine
	st.Emit(Request{Bytes: 1e9, Latency: time.Millisecond, OK: true, Warmup: true})
	for range 2 {
		clk.add(RateInterval)
		st.Emit(Request{Bytes: 1e9, Latency: 4 * time.Millisecond, OK: true})
	}
	st.Emit(Request{OK: false})
	st.Emit(Warning{Text: "w"})
	st.Emit(Warning{Text: "w"})
	clk.add(RateInterval)
	s := st.Snapshot()
	if s.Done != 4 || s.OK != 2 || s.Failed != 1 || s.Warmup != 1 || s.Bytes != 2e9 || s.Fraction() != 1 || len(s.Warnings) != 1 {
		t.Fatalf("%+v", s)
	}
	// 1 GB in each of the 2nd and 3rd intervals, nothing in the 1st.
	per := 1 / RateInterval.Seconds()
	if len(s.Rate) != 3 || s.Rate[0] != 0 || s.Rate[1] != per || s.Rate[2] != per || s.AvgGBps != 2/(3*RateInterval.Seconds()) {
		t.Errorf("rates %v avg %v", s.Rate, s.AvgGBps)
	}
	if math.Abs(s.Latency.P50-4) > 0.01 || s.Latency.Count != 2 {
		t.Errorf("latency %+v", s.Latency)
	}
}

func TestStatsPointsAndGauges(t *testing.T) {
	t.Parallel()
	st := NewStats(nil)
	st.Emit(Start{Title: "bench xfer", Total: 2, Unit: "points"})
	st.Emit(Point{Label: "WRITE 4 KiB x 1", Bytes: 2e9, Elapsed: time.Second, P50: time.Microsecond, P99: 3 * time.Microsecond, OK: true})
	st.Emit(Point{Label: "WRITE 8 KiB x 1", Bytes: 4e9, Elapsed: time.Second, OK: true})
	st.Emit(Gauge{Series: "RSS a", At: time.Second, Value: 10, Unit: "MB"})
	st.Emit(Gauge{Series: "RSS a", At: 2 * time.Second, Value: 12, Unit: "MB"})
	st.Emit(Fit{Series: "RSS a", Slope: 2, Unit: "MB/s", R2: 1})
	s := st.Snapshot()
	if s.CurGBps != 4 || s.AvgGBps != 3 || len(s.Points) != 2 || len(s.Gauges) != 1 || s.Gauges[0].Last() != 12 || s.Gauges[0].Fit.Slope != 2 {
		t.Errorf("%+v", s)
	}
}

// Progress in a log: silent before the delay, then one line per tenth.
func TestProgressLines(t *testing.T) {
	t.Parallel()
	clk := &fakeClock{t: time.Unix(0, 0)}
	var b strings.Builder
	p := newProgress(&b, false, time.Second, clk.now)
	p.Emit(Start{Title: "bench push", Total: 20, Unit: "requests"})
	p.Emit(Request{Bytes: 1, Latency: time.Millisecond, OK: true})
	if b.Len() != 0 {
		t.Fatalf("printed before the delay: %q", b.String())
	}
	clk.add(2 * time.Second)
	for range 19 {
		p.Emit(Request{Bytes: 1 << 20, Latency: 2 * time.Millisecond, OK: true})
	}
	p.Close()
	p.Close()
	lines := strings.Split(strings.TrimSpace(b.String()), "\n")
	if len(lines) != 10 || !strings.HasPrefix(lines[0], "bench push [##------------------] 2/20 requests") ||
		!strings.Contains(lines[9], "20/20 requests") || !strings.Contains(lines[9], "p50 2.00 ms") {
		t.Errorf("%d lines:\n%s", len(lines), b.String())
	}
}

// Before the first complete rate interval there is no current rate: the
// line shows the average alone, not "0 B/s now" beside it.
func TestLineWithoutACompleteInterval(t *testing.T) {
	t.Parallel()
	clk := &fakeClock{t: time.Unix(0, 0)}
	st := NewStats(clk.now)
	st.Emit(Start{Title: "bench pull", Total: 10, Unit: "requests"})
	clk.add(RateInterval / 2)
	st.Emit(Request{Bytes: 1e9, Latency: time.Millisecond, OK: true})
	line := Line(st.Snapshot(), 10)
	if strings.Contains(line, "now") || !strings.Contains(line, "avg") {
		t.Errorf("half an interval in: %q", line)
	}
	clk.add(RateInterval)
	if line := Line(st.Snapshot(), 10); !strings.Contains(line, " now, ") {
		t.Errorf("one interval in: %q", line)
	}
}

func TestSparkline(t *testing.T) {
	t.Parallel()
	if got := Sparkline([]float64{0, 1, 2, 4, 8}, 5); got != "▁▂▃▅█" {
		t.Errorf("%q", got)
	}
	if got := Sparkline([]float64{1, 2, 3}, 2); got != "▆█" {
		t.Errorf("keeps the last values: %q", got)
	}
	if Sparkline(nil, 3) != "" || Sparkline([]float64{1}, 0) != "" {
		t.Error("empty")
	}
}

// BenchmarkProgressEmitRequest is the cost a non-terminal progress bar
// adds to every finished request of a long run (a handoff driver sends
// one per request while its endpoints copy): it must not walk the
// latency histogram each time (184 µs with 10,000 latencies recorded
// when it did, 0.12 µs now).
func BenchmarkProgressEmitRequest(b *testing.B) {
	p := newProgress(io.Discard, false, 0, nil)
	p.Emit(Start{Title: "bench", Total: 1 << 40, Unit: "requests"})
	for i := range 10000 {
		p.Emit(Request{OK: true, Bytes: 1 << 28, Latency: time.Duration(i+1) * time.Microsecond})
	}
	for i := 0; b.Loop(); i++ {
		p.Emit(Request{OK: true, Bytes: 1 << 28, Latency: time.Duration(i%10000+1) * time.Microsecond})
	}
}
