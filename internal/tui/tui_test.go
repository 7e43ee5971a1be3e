package tui

import (
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/nixlctl/nixlctl/internal/testkit"

	tea "charm.land/bubbletea/v2"

	"github.com/nixlctl/nixlctl/internal/live"
	"github.com/nixlctl/nixlctl/internal/report"
)

// fakeClock is a settable clock for live.Stats.
type fakeClock struct{ t time.Time }

func (c *fakeClock) now() time.Time { return c.t }

func update(t *testing.T, m Model, msg tea.Msg) (Model, tea.Cmd) {
	t.Helper()
	next, cmd := m.Update(msg)
	return next.(Model), cmd
}

// TestModelUpdates drives the model as a run would: events into a Stats,
// ticks into the model, keys from the user.
func TestModelUpdates(t *testing.T) {
	t.Parallel()
	clk := &fakeClock{t: time.Unix(0, 0)}
	st := live.NewStats(clk.now)
	interrupted := 0
	m := New(st, func() { interrupted++ })
	if m.Init() == nil {
		t.Fatal("Init should start the ticker")
	}
	m, _ = update(t, m, tea.WindowSizeMsg{Width: 120, Height: 30})

	st.Emit(live.Start{Title: "bench push", Total: 10, Unit: "requests"})
	st.Emit(live.Phase{Text: "measuring"})
	st.Emit(live.Request{Bytes: 1 << 20, Latency: time.Millisecond, OK: true, Warmup: true})
	for i := range 4 {
		clk.t = clk.t.Add(300 * time.Millisecond)
		st.Emit(live.Request{Bytes: 256 << 20, Latency: time.Duration(2+i) * time.Millisecond, OK: true})
	}
	st.Emit(live.Request{Latency: time.Second, OK: false})
	st.Emit(live.Warning{Text: "TCP fallback: RMA is emulated over TCP active messages"})
	st.Emit(live.Gauge{Series: "leases held", At: time.Second, Value: 3, Unit: "leases"})
	st.Emit(live.Gauge{Series: "RSS default", At: time.Second, Value: 310, Unit: "MB"})
	st.Emit(live.Fit{Series: "RSS default", Slope: 0.4, Unit: "MB/min", R2: 0.97})
	clk.t = clk.t.Add(time.Second)

	m, cmd := update(t, m, TickMsg(clk.t))
	if cmd == nil {
		t.Error("a tick should schedule the next one")
	}
	v := m.Render()
	for _, want := range []string{"bench push", "6/10 requests", "GB/s now", "avg", "p50 3.00 ms", "p99 5.00 ms",
		"ok 4", "failed 1", "warm-up 1", "TCP fallback", "leases held", "RSS default", "slope +0.4 MB/min (R² 0.97)", "measuring"} {
		if !strings.Contains(v, want) {
			t.Errorf("view lacks %q:\n%s", want, v)
		}
	}
	if !strings.ContainsAny(v, "▁▂▃▄▅▆▇█") {
		t.Errorf("no sparkline:\n%s", v)
	}

	// First Ctrl-C stops the run (once), the view says so; a second
	// aborts and quits.
	m, cmd = update(t, m, tea.KeyPressMsg{Code: 'c', Mod: tea.ModCtrl})
	if interrupted != 1 || cmd != nil || !strings.Contains(m.Render(), "stopping") {
		t.Fatalf("first Ctrl-C: interrupted %d, cmd %v\n%s", interrupted, cmd, m.Render())
	}
	m, _ = update(t, m, tea.KeyPressMsg{Code: 'q', Text: "q"})
	if interrupted != 1 || m.Aborted {
		t.Fatal("q after Ctrl-C should change nothing")
	}
	m, cmd = update(t, m, tea.KeyPressMsg{Code: 'c', Mod: tea.ModCtrl})
	if !m.Aborted || cmd == nil {
		t.Fatal("second Ctrl-C should abort and quit")
	}
	if m.View().Content != "" {
		t.Error("a finished view should be empty so the results replace it")
	}
}

// A sweep shows per-point rates and the last point's percentiles; the
// run's end quits the program.
func TestModelSweepAndDone(t *testing.T) {
	t.Parallel()
	m := New(nil, nil)
	m, _ = update(t, m, SnapshotMsg(live.Snapshot{Title: "bench xfer WRITE", Total: 4, Done: 2, OK: 2, Unit: "points",
		Rate: []float64{1, 4}, CurGBps: 4, AvgGBps: 2.5, Points: []string{"WRITE 4 KiB x 1", "WRITE 8 KiB x 1"},
		Latency: report.Percentiles{P50: 0.012, P99: 0.030}}))
	v := m.Render()
	for _, want := range []string{"2/4 points", "4.00 GB/s now", "2.50 GB/s avg", "p50 12.0 µs  p99 30.0 µs (WRITE 8 KiB x 1)"} {
		if !strings.Contains(v, want) {
			t.Errorf("view lacks %q:\n%s", want, v)
		}
	}
	m, cmd := update(t, m, DoneMsg{})
	if cmd == nil || m.Aborted {
		t.Error("DoneMsg should quit without aborting")
	}
}

// The whole program runs headless, as in CI: no input (so no terminal is
// opened or queried), output into a buffer; the run's end quits it.
func TestProgramHeadless(t *testing.T) {
	t.Parallel()
	st := live.NewStats(nil)
	st.Emit(live.Start{Title: "bench pull", Total: 2, Unit: "requests"})
	st.Emit(live.Request{Bytes: 1 << 20, Latency: time.Millisecond, OK: true})
	out := &syncWriter{}
	p := tea.NewProgram(New(st, nil), tea.WithInput(nil), tea.WithOutput(out),
		tea.WithWindowSize(100, 20), tea.WithoutSignalHandler())
	done := make(chan tea.Model, 1)
	go func() {
		m, err := p.Run()
		if err != nil {
			t.Error(err)
		}
		done <- m
	}()
	// DoneMsg only once a frame shows the run: the program has polled its
	// source and drawn while the run was going on.
	waitFor(t, "a frame showing the run's title", func() bool { return strings.Contains(out.String(), "bench pull") })
	p.Send(DoneMsg{})
	select {
	case m := <-done:
		if m.(Model).Aborted {
			t.Error("a finished run is not an abort")
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the program did not quit on DoneMsg")
	}
}

// syncWriter serialises writes and reads: the program writes from its own
// goroutine while the test reads.
type syncWriter = testkit.SyncBuffer

// waitFor polls cond until it holds, so a test waits only as long as the
// program needs, and fails naming what never happened.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	testkit.WaitFor(t, 0, what, cond, nil)
}

// The view names the log its run's stderr goes to and shows its last
// whole lines, without the control characters that would move the cursor.
func TestLogPane(t *testing.T) {
	t.Parallel()
	path := t.TempDir() + "/run.log"
	m := New(nil, nil).WithLog(path)
	m, _ = update(t, m, TickMsg(time.Now())) // no file yet: just the path
	if v := m.Render(); !strings.Contains(v, path) {
		t.Fatalf("view lacks the log path:\n%s", v)
	}
	lines := "one\ntwo\n\n\x1b[2Jthree\tx\nfour\nfive, still being writ"
	if err := os.WriteFile(path, []byte(lines), 0o644); err != nil {
		t.Fatal(err)
	}
	m, _ = update(t, m, TickMsg(time.Now()))
	v := m.Render()
	for _, want := range []string{path, "two", "[2Jthree x", "four"} {
		if !strings.Contains(v, want) {
			t.Errorf("view lacks %q:\n%s", want, v)
		}
	}
	if strings.Contains(v, "one") || strings.Contains(v, "five") || strings.Contains(v, "\x1b[2J") {
		t.Errorf("view shows more than the last %d lines, or their escapes:\n%q", logTailLines, v)
	}
}

// A log longer than the window read shows its last lines, not the
// window's cut first one.
func TestTailLinesWindow(t *testing.T) {
	t.Parallel()
	path := t.TempDir() + "/run.log"
	var b strings.Builder
	for i := range 500 {
		fmt.Fprintf(&b, "line %03d %s\n", i, strings.Repeat("x", 20))
	}
	if err := os.WriteFile(path, []byte(b.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	got := tailLines(path, 200)
	if len(got) == 0 || !strings.HasPrefix(got[len(got)-1], "line 499 ") {
		t.Fatalf("tail ends %q, want line 499", got[len(got)-1:])
	}
	for _, l := range got {
		if !strings.HasPrefix(l, "line ") {
			t.Errorf("a cut line in the tail: %q", l)
		}
	}
}
