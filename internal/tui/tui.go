// Package tui is the live terminal view of a measuring run, a bubbletea v2
// model. It polls a live.Stats snapshot on a timer instead of receiving
// every event, so runners never block on the screen and the view can start
// late (the CLI starts it once a run has gone on for a few seconds).
//
// It shows progress, the current and average bandwidth with a sparkline,
// latency percentiles, failures and warnings, and one line per gauge series
// (leases held for lease-chaos, RSS per configuration with its fitted
// slope for probe ucx-leak): emitting live.Gauge and live.Fit events is
// all such a command needs to do.
package tui

import (
	"fmt"
	"os"
	"strings"
	"time"

	"charm.land/bubbles/v2/progress"
	tea "charm.land/bubbletea/v2"
	"charm.land/lipgloss/v2"

	"github.com/nixlctl/nixlctl/internal/live"
	"github.com/nixlctl/nixlctl/internal/report"
)

// Source is where the model reads the run's state: a *live.Stats.
type Source interface{ Snapshot() live.Snapshot }

// Refresh is how often the view polls its source.
const Refresh = 250 * time.Millisecond

// Messages the model understands beyond bubbletea's own.
type (
	// TickMsg asks the model to poll its source again.
	TickMsg time.Time
	// SnapshotMsg replaces the state (tests drive the model with it).
	SnapshotMsg live.Snapshot
	// DoneMsg says the run returned: the view takes a last snapshot and
	// quits.
	DoneMsg struct{}
)

// Model is the bubbletea model.
type Model struct {
	src       Source
	interrupt func()
	snap      live.Snapshot
	width     int
	bar       progress.Model
	stopping  bool // asked the run to stop
	// Aborted is set by a second Ctrl-C: the caller exits at once.
	Aborted bool
	done    bool
	logPath string   // where the run's stderr goes while the view is up
	logTail []string // its last lines, read on each tick
}

// logTailLines is how many of the log's last lines the view shows.
const logTailLines = 3

// WithLog names the file the run's stderr goes to while the view is up
// (lines printed to the terminal would be drawn over it); the view shows
// the path and the file's last few lines.
func (m Model) WithLog(path string) Model {
	m.logPath = path
	return m
}

// New returns a model reading src; interrupt is called on the first
// Ctrl-C (or q) and should stop the run the way SIGINT does, so the run
// still returns its results.
func New(src Source, interrupt func()) Model {
	bar := progress.New(progress.WithWidth(30), progress.WithoutPercentage(), progress.WithFillCharacters('█', '░'))
	return Model{src: src, interrupt: interrupt, width: 80, bar: bar}
}

func tick() tea.Cmd {
	return tea.Tick(Refresh, func(t time.Time) tea.Msg { return TickMsg(t) })
}

// Init implements tea.Model.
func (m Model) Init() tea.Cmd {
	return tick()
}

// Update implements tea.Model.
func (m Model) Update(msg tea.Msg) (tea.Model, tea.Cmd) {
	switch msg := msg.(type) {
	case tea.WindowSizeMsg:
		m.width = msg.Width
		m.bar.SetWidth(max(10, min(40, m.width-50)))
	case TickMsg:
		if m.src != nil {
			m.snap = m.src.Snapshot()
		}
		if m.logPath != "" {
			m.logTail = tailLines(m.logPath, logTailLines)
		}
		if m.done {
			return m, nil
		}
		return m, tick()
	case SnapshotMsg:
		m.snap = live.Snapshot(msg)
	case DoneMsg:
		if m.src != nil {
			m.snap = m.src.Snapshot()
		}
		m.done = true
		return m, tea.Quit
	case tea.KeyPressMsg:
		switch msg.String() {
		case "ctrl+c", "q":
			if m.stopping && msg.String() == "ctrl+c" {
				m.Aborted = true
				m.done = true
				return m, tea.Quit
			}
			if !m.stopping {
				m.stopping = true
				if m.interrupt != nil {
					m.interrupt()
				}
			}
		}
	}
	return m, nil
}

var (
	titleStyle = lipgloss.NewStyle().Bold(true)
	labelStyle = lipgloss.NewStyle().Faint(true)
	badStyle   = lipgloss.NewStyle().Foreground(lipgloss.Color("1")).Bold(true)
	warnStyle  = lipgloss.NewStyle().Foreground(lipgloss.Color("3"))
	sparkStyle = lipgloss.NewStyle().Foreground(lipgloss.Color("6"))
)

// View implements tea.Model. Once done it is empty: the results the
// command prints next replace the live view.
func (m Model) View() tea.View {
	if m.done {
		return tea.NewView("")
	}
	return tea.NewView(m.Render())
}

// Render is the view's text (View wraps it).
func (m Model) Render() string {
	s := m.snap
	var b strings.Builder
	label := func(l string) string { return labelStyle.Render(fmt.Sprintf("%-12s", l)) }
	title := s.Title
	if title == "" {
		title = "nixlctl"
	}
	fmt.Fprintf(&b, "%s  %s\n", titleStyle.Render(title), labelStyle.Render(s.Elapsed.Truncate(100*time.Millisecond).String()))
	if s.Total > 0 {
		fmt.Fprintf(&b, "%s%s %d/%d %s\n", label("progress"), m.bar.ViewAs(s.Fraction()), s.Done, s.Total, s.Unit)
	} else if s.Unit != "" {
		fmt.Fprintf(&b, "%s%d %s\n", label("progress"), s.Done, s.Unit)
	}
	if s.AvgGBps > 0 || anyPositive(s.Rate) { // runs that move no bytes (lease-chaos) have no bandwidth line
		spark := live.Sparkline(s.Rate, max(10, min(60, m.width-50)))
		now := report.GBps(s.CurGBps*1e9) + " now  "
		if len(s.Rate) == 0 {
			now = "" // no complete interval yet (see live.Line)
		}
		fmt.Fprintf(&b, "%s%s%s avg  %s\n", label("bandwidth"), now, report.GBps(s.AvgGBps*1e9), sparkStyle.Render(spark))
	}
	if l := s.Latency; l.P50 > 0 {
		ms := func(x float64) string { return report.Seconds(x / 1e3) }
		if l.P90 > 0 {
			fmt.Fprintf(&b, "%sp50 %s  p90 %s  p99 %s  p99.9 %s  max %s\n", label("latency"), ms(l.P50), ms(l.P90), ms(l.P99), ms(l.P999), ms(l.Max))
		} else { // a sweep: the last point's
			last := ""
			if n := len(s.Points); n > 0 {
				last = " (" + s.Points[n-1] + ")"
			}
			fmt.Fprintf(&b, "%sp50 %s  p99 %s%s\n", label("latency"), ms(l.P50), ms(l.P99), last)
		}
	}
	if s.OK+s.Failed+s.Warmup > 0 {
		failed := fmt.Sprintf("failed %d", s.Failed)
		if s.Failed > 0 {
			failed = badStyle.Render(failed)
		}
		line := fmt.Sprintf("ok %d  %s", s.OK, failed)
		if s.Warmup > 0 {
			line += fmt.Sprintf("  warm-up %d", s.Warmup)
		}
		fmt.Fprintf(&b, "%s%s\n", label(s.Unit), line)
	}
	for _, g := range s.Gauges {
		spark := live.Sparkline(g.Values, max(10, min(40, m.width-60)))
		line := fmt.Sprintf("%s %s %s", sparkStyle.Render(spark), report.Float(g.Last()), g.Unit)
		if g.Fit != nil {
			line += fmt.Sprintf("  slope %+.3g %s (R² %.2f)", g.Fit.Slope, g.Fit.Unit, g.Fit.R2)
		}
		fmt.Fprintf(&b, "%s%s\n", label(trim(g.Name, 12)), line)
	}
	for _, w := range s.Warnings {
		fmt.Fprintf(&b, "%s%s\n", label("warning"), warnStyle.Render(trim(w, max(20, m.width-14))))
	}
	if m.logPath != "" {
		fmt.Fprintf(&b, "%s%s\n", label("log"), labelStyle.Render(m.logPath))
		for _, l := range m.logTail {
			fmt.Fprintf(&b, "%s%s\n", label(""), labelStyle.Render(trim(l, max(20, m.width-14))))
		}
	}
	switch {
	case m.stopping:
		fmt.Fprintf(&b, "%s\n", warnStyle.Render("stopping: finishing what is in flight, then printing the results (Ctrl-C again exits at once)"))
	default:
		phase := s.Phase
		if phase != "" {
			phase += " · "
		}
		fmt.Fprintf(&b, "%s\n", labelStyle.Render(phase+"q or Ctrl-C stops and prints the results"))
	}
	return b.String()
}

// tailLines is the last n non-empty whole lines of the file at path,
// from its last 4 KiB; none when it cannot be read. A line still being
// written (children's lines arrive through a pipe, in pieces) waits for
// its newline, and the window's cut first line is left out.
func tailLines(path string, n int) []string {
	f, err := os.Open(path)
	if err != nil {
		return nil
	}
	defer f.Close()
	const window = 4 << 10
	buf := make([]byte, window)
	off := int64(0)
	if st, err := f.Stat(); err == nil && st.Size() > window {
		off = st.Size() - window
	}
	k, _ := f.ReadAt(buf, off)
	text := string(buf[:k])
	text = text[:strings.LastIndexByte(text, '\n')+1]
	if off > 0 {
		text = text[strings.IndexByte(text, '\n')+1:]
	}
	var lines []string
	for _, l := range strings.Split(text, "\n") {
		// Tabs and escapes would move the cursor inside the view.
		l = strings.Map(func(r rune) rune {
			if r == '\t' {
				return ' '
			}
			if r < ' ' || r == 0x7f {
				return -1
			}
			return r
		}, l)
		if strings.TrimSpace(l) != "" {
			lines = append(lines, l)
		}
	}
	return lines[max(0, len(lines)-n):]
}

func anyPositive(xs []float64) bool {
	for _, x := range xs {
		if x > 0 {
			return true
		}
	}
	return false
}

func trim(s string, n int) string {
	r := []rune(s)
	if len(r) <= n {
		return s
	}
	return string(r[:n-1]) + "…"
}
