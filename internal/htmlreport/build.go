// Package htmlreport writes a result, or several side by side, as one
// self-contained HTML page: the run's header with its warnings first,
// charts drawn as inline SVG from the result's own data (its per-request
// records when loaded), and every number in tables that carry the exact
// value. Nothing is fetched when the page opens (no CDN, no fonts) and
// nothing is run again to build it, so a page from a CI artifact shows
// what that run measured, offline, and prints.
//
// It sits beside internal/plots (PNG/SVG files for --plot): both draw the
// report.Figure descriptions result kinds give, but a page also lays out
// tables, hover values and toggles, which a picture cannot.
package htmlreport

import (
	"fmt"
	"math"
	"sort"
	"strings"
	"time"

	"github.com/nixlctl/nixlctl/internal/ecbench"
	"github.com/nixlctl/nixlctl/internal/handoff"
	"github.com/nixlctl/nixlctl/internal/leasechaos"
	"github.com/nixlctl/nixlctl/internal/probe"
	"github.com/nixlctl/nixlctl/internal/report"
	"github.com/nixlctl/nixlctl/internal/xferbench"
)

// Build makes the page of one result, from its records too when they are
// loaded (report.Load, or a run's result in memory).
func Build(res report.Result, version string) (*Page, error) {
	h := res.Header()
	p := &Page{Title: "nixlctl " + h.Command, Kind: h.Command, Generator: version}
	p.Subtitle = subtitle(h)
	for _, w := range h.Warnings {
		p.Warnings = append(p.Warnings, Warning{Text: w})
	}
	p.Runs = []RunHeader{runHeader("", res)}
	var err error
	switch r := res.(type) {
	case *handoff.HandoffResult:
		err = handoffSections(p, r)
	case *xferbench.XferResult:
		err = xferSections(p, r)
	case *probe.LeakResult:
		err = leakSections(p, r)
	case *leasechaos.LeaseChaosResult:
		err = leaseSections(p, r)
	default:
		err = figureSections(p, res)
	}
	if err != nil {
		return nil, err
	}
	if h.Repeats != nil && len(h.Repeats.Metrics) > 0 {
		p.Sections = append(p.Sections, repeatsSection(h.Repeats))
	}
	p.Sections = append(p.Sections, metricsSection("", res))
	return p, nil
}

func subtitle(h *report.Meta) string {
	s := fmt.Sprintf("%s, %s on %s", h.StartedAt.UTC().Format("2006-01-02 15:04:05 MST"), report.Seconds(h.Seconds), h.Host.Name)
	if h.Partial {
		s += " — a partial run (it did not finish)"
	}
	return s
}

// placement is where a kind's endpoints ran, for the kinds that record it.
func placement(res report.Result) string {
	switch r := res.(type) {
	case *handoff.HandoffResult:
		return r.Placement
	case *xferbench.XferResult:
		return r.Placement
	case *ecbench.ECResult:
		return r.Placement
	}
	return ""
}

// runHeader lists what ran, where and with what, as the result says it:
// the backend and transport are the ones actually used.
func runHeader(label string, res report.Result) RunHeader {
	h := res.Header()
	rh := RunHeader{Label: label}
	add := func(k, v, field string, mono bool) {
		if v != "" {
			rh.Rows = append(rh.Rows, KV{Key: k, Value: v, Field: field, Mono: mono})
		}
	}
	add("command", h.Command, "command", false)
	if len(h.Args) > 0 {
		add("command line", "nixlctl "+strings.Join(h.Args, " "), "args", true)
	}
	add("nixlctl", h.Version, "nixlctl_version", false)
	add("started", h.StartedAt.UTC().Format(time.RFC3339), "started_at", false)
	add("duration", report.Seconds(h.Seconds), "duration_s", false)
	backend := h.Env.Backend
	if h.Env.BackendVersion != "" {
		backend += " " + h.Env.BackendVersion
	}
	add("backend (used)", backend, "environment.backend", false)
	add("UCX", h.Env.UCX, "environment.ucx", false)
	add("NIXL", h.Env.NIXL, "environment.nixl", false)
	add("CUDA", h.Env.CUDA, "environment.cuda", false)
	add("transport (used)", h.Env.Transport, "environment.transport", true)
	add("placement", placement(res), "placement", false)
	host := fmt.Sprintf("%s (%s/%s, kernel %s, %d CPUs, %s memory, %s)", h.Host.Name, h.Host.OS, h.Host.Arch, h.Host.Kernel,
		h.Host.CPUs, report.Bytes(int64(h.Host.MemBytes)), h.Host.Go)
	add("host", host, "host", false)
	if h.Env.NvidiaDriver != "" || len(h.Env.GPUs) > 0 {
		var gpus []string
		for _, g := range h.Env.GPUs {
			gpus = append(gpus, fmt.Sprintf("%d: %s", g.Index, g.Name))
		}
		add("NVIDIA", strings.TrimSpace(h.Env.NvidiaDriver+" "+strings.Join(gpus, ", ")), "environment.gpus", false)
	}
	if len(h.Env.Vars) > 0 {
		keys := make([]string, 0, len(h.Env.Vars))
		for k := range h.Env.Vars {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		var kv []string
		for _, k := range keys {
			kv = append(kv, k+"="+h.Env.Vars[k])
		}
		add("settings", strings.Join(kv, " "), "environment.vars", true)
	}
	if rf := h.RecordsFile; rf != nil {
		add("records", fmt.Sprintf("%s (%d records)", rf.Path, rf.Count), "records_file", false)
	}
	if h.Partial {
		add("partial", "yes: the run did not finish", "partial", false)
	}
	return rh
}

// metricsSection is every number Metrics gives, each cell named by the
// metric so the page can be read back and checked.
func metricsSection(run string, res report.Result) Section {
	t := &Table{ID: "metrics", Caption: "Every metric (what report compare and gate see)",
		Head: numHead([]string{"metric", "value", "unit", "better", "gated by default"}, 1)}
	t.Head[2].Num, t.Head[3].Num, t.Head[4].Num = false, false, false
	for _, m := range res.Metrics() {
		stable := ""
		if m.Stable {
			stable = "yes"
		}
		t.Rows = append(t.Rows, []Cell{text(m.Name()), metricCell(run, m.Name(), m.Value, num(m.Value)), text(m.Unit), text(m.Better.String()), text(stable)})
	}
	return Section{ID: "all-metrics", Title: "All metrics", Blocks: []Block{tableBlock(t)}}
}

// repeatsSection shows a --repeat N result's runs: each metric's values
// as points, so the spread is seen and not only the median.
func repeatsSection(r *report.Repeats) Section {
	s := Section{ID: "repeats", Title: fmt.Sprintf("Over %d runs (--repeat)", r.N)}
	s.Blocks = append(s.Blocks, para(fmt.Sprintf("This result is run %d of %d, the one at the median of %s. Each point below is one run.", r.Representative, r.N, r.Main)))
	var cs []chart
	for i, m := range r.Metrics {
		if i >= 24 {
			s.Blocks = append(s.Blocks, para(fmt.Sprintf("The first 24 of %d metrics are drawn; every one is in the table below.", len(r.Metrics))))
			break
		}
		cs = append(cs, stripChart(fmt.Sprintf("rep%d", i), m.Name+unitSuffix(m.Unit), []string{"runs"}, [][]float64{m.Values}, nil))
	}
	s.Blocks = append(s.Blocks, charts(cs...))
	return s
}

func unitSuffix(u string) string {
	if u == "" || u == "ratio" {
		return ""
	}
	return " (" + u + ")"
}

// figureSections is the page of a kind without a builder of its own: the
// result's own figure (--plot's), if it has one.
func figureSections(p *Page, res report.Result) error {
	pl, ok := res.(report.Plottable)
	if !ok {
		return nil
	}
	fig, err := pl.Figure()
	if err != nil {
		p.Sections = append(p.Sections, Section{ID: "charts", Title: "Charts", Blocks: []Block{para("Nothing to draw: " + err.Error())}})
		return nil //nolint:nilerr // a result with nothing to draw still has a page
	}
	p.Sections = append(p.Sections, Section{ID: "charts", Title: orDefault(fig.Title, "Charts"), Blocks: []Block{charts(figureCharts("fig", fig)...)}})
	return nil
}

func figureCharts(id string, fig report.Figure) []chart {
	var out []chart
	for i, pn := range fig.Panels {
		out = append(out, renderPanel(fmt.Sprintf("%s%d", id, i), pn))
	}
	return out
}

// fromReportTable turns a formatted report.Table into an HTML one.
func fromReportTable(id string, rt *report.Table) *Table {
	t := &Table{ID: id, Caption: rt.Title}
	for _, c := range rt.Columns {
		t.Head = append(t.Head, Cell{Text: c.Name, Num: c.Align == report.Right})
	}
	for _, r := range rt.Rows {
		row := make([]Cell, len(rt.Columns))
		for i := range rt.Columns {
			if i < len(r) {
				row[i] = Cell{Text: r[i], Num: rt.Columns[i].Align == report.Right}
			}
		}
		t.Rows = append(t.Rows, row)
	}
	return t
}

func ptr(f float64) *float64 { return &f }

// cdfLine is one distribution's CDF at fixed quantile points.
func cdfLine(label string, values []float64, color int) report.Line {
	v := append([]float64(nil), values...)
	sort.Float64s(v)
	xs, ps := quantilePoints(v, 200)
	return report.Line{Label: label, X: xs, Y: ps, Style: report.Steps, Color: color}
}

// histCDFLine is a stored histogram's CDF (ns buckets, drawn in ms), for
// results whose records are not loaded.
func histCDFLine(label string, h *report.Histogram, color int) report.Line {
	l := report.Line{Label: label, Style: report.Steps, Color: color}
	l.X, l.Y = h.CDF(time.Millisecond)
	if len(l.X) > 300 {
		// Keep every k-th step and the last: a CDF needs no more to read.
		k := len(l.X) / 300
		var x, y []float64
		for i := 0; i < len(l.X); i += k {
			x, y = append(x, l.X[i]), append(y, l.Y[i])
		}
		x, y = append(x, l.X[len(l.X)-1]), append(y, l.Y[len(l.Y)-1])
		l.X, l.Y = x, y
	}
	return l
}

// logIfWide picks a log axis when values span more than a decade.
func logIfWide(lines []report.Line) report.Scale {
	lo, hi := math.Inf(1), 0.0
	for _, l := range lines {
		for _, x := range l.X {
			if x > 0 {
				lo, hi = math.Min(lo, x), math.Max(hi, x)
			}
		}
	}
	if lo > 0 && hi/lo > 10 {
		return report.Log10
	}
	return report.Linear
}
