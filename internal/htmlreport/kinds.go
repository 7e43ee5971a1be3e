package htmlreport

import (
	"fmt"
	"sort"

	"github.com/nixlctl/nixlctl/internal/leasechaos"
	"github.com/nixlctl/nixlctl/internal/probe"
	"github.com/nixlctl/nixlctl/internal/report"
	"github.com/nixlctl/nixlctl/internal/xferbench"
)

// xferSections draws a bench xfer sweep: bandwidth (with the same-run
// reference copy dashed), efficiency and latency against block size, one
// line per batch size, and every point in a table.
func xferSections(p *Page, res *xferbench.XferResult) error {
	cfg := res.Config
	p.Title = fmt.Sprintf("nixlctl bench xfer: %s %s → %s, %d points", cfg.Op, cfg.InitiatorSeg, cfg.TargetSeg, len(res.Points))
	ref := orDefault(cfg.Reference, "memcpy")
	byBatch := map[int][]xferbench.XferPoint{}
	var batches []int
	for _, pt := range res.Points {
		if _, ok := byBatch[pt.BatchSize]; !ok {
			batches = append(batches, pt.BatchSize)
		}
		byBatch[pt.BatchSize] = append(byBatch[pt.BatchSize], pt)
	}
	sort.Ints(batches)
	bw := report.Panel{Title: "Bandwidth", XLabel: "block size", YLabel: "GB/s", XScale: report.Log2, YMin: ptr(0)}
	eff := report.Panel{Title: "Efficiency (bandwidth / " + ref + ")", XLabel: "block size", YLabel: "ratio", XScale: report.Log2, YMin: ptr(0)}
	lat := report.Panel{Title: "Request latency", XLabel: "block size", YLabel: "µs", XScale: report.Log2, YScale: report.Log10}
	for i, b := range batches {
		pts := byBatch[b]
		sort.Slice(pts, func(i, j int) bool { return pts[i].BlockSize < pts[j].BlockSize })
		var x, gb, refs, e, p50, p99 []float64
		for _, pt := range pts {
			x = append(x, float64(pt.BlockSize))
			gb, refs, e = append(gb, pt.BandwidthGBps), append(refs, pt.MemcpyGBps), append(e, pt.Efficiency)
			p50, p99 = append(p50, pt.LatencyUS.P50), append(p99, pt.LatencyUS.P99)
		}
		c := i + 1
		label := fmt.Sprintf("batch %d", b)
		bw.Lines = append(bw.Lines, report.Line{Label: label, X: x, Y: gb, Points: true, Color: c})
		if hasRef(pts) {
			bw.Lines = append(bw.Lines, report.Line{Label: label + ": " + ref + " reference", X: x, Y: refs, Style: report.Dashed, Points: true, Color: c})
		}
		eff.Lines = append(eff.Lines, report.Line{Label: label, X: x, Y: e, Points: true, Color: c})
		lat.Lines = append(lat.Lines, report.Line{Label: label + " p50", X: x, Y: p50, Points: true, Color: c},
			report.Line{Label: label + " p99", X: x, Y: p99, Style: report.Dashed, Points: true, Color: c})
	}
	cs := []chart{renderPanel("bw", bw)}
	if hasRef(res.Points) {
		cs = append(cs, renderPanel("eff", eff))
	}
	cs = append(cs, renderPanel("lat", lat))
	t := &Table{ID: "points", Caption: "Sweep points", Head: numHead([]string{"op", "block", "batch", "iterations", "GB/s", ref + " GB/s", "efficiency", "p50 µs", "p99 µs", "max µs", "transport"}, 1)}
	t.Head[len(t.Head)-1].Num = false
	for _, pt := range res.Points {
		s := pt.Series()
		t.Rows = append(t.Rows, []Cell{text(pt.Op), numCell(report.Bytes(int64(pt.BlockSize))), numCell(report.Int(int64(pt.BatchSize))),
			numCell(report.Int(int64(pt.Iterations))),
			metricCell("", "bandwidth_gbps["+s+"]", pt.BandwidthGBps, num(pt.BandwidthGBps)),
			metricCell("", "memcpy_gbps["+s+"]", pt.MemcpyGBps, num(pt.MemcpyGBps)),
			metricCell("", "efficiency["+s+"]", pt.Efficiency, num(pt.Efficiency)),
			metricCell("", "latency_us.p50["+s+"]", pt.LatencyUS.P50, num(pt.LatencyUS.P50)),
			metricCell("", "latency_us.p99["+s+"]", pt.LatencyUS.P99, num(pt.LatencyUS.P99)),
			metricCell("", "latency_us.max["+s+"]", pt.LatencyUS.Max, num(pt.LatencyUS.Max)),
			{Text: pt.Transport, Class: "mono"}})
	}
	p.Sections = append(p.Sections, Section{ID: "sweep", Title: "Sweep", Blocks: []Block{
		para(fmt.Sprintf("Each point: %d timed iterations after %d warm-up, pipeline depth %d. The dashed bandwidth lines are the %s reference measured in the same run on the same bytes; efficiency divides by it.",
			cfg.NumIter, cfg.WarmupIter, cfg.PipelineDepth, ref)),
		charts(cs...), tableBlock(t)}})
	return nil
}

// hasRef says whether the sweep measured its reference copy (a sweep run
// without one has zeros there, which must not be drawn as a reference).
func hasRef(pts []xferbench.XferPoint) bool {
	for _, p := range pts {
		if p.MemcpyGBps > 0 {
			return true
		}
	}
	return false
}

// leakSections draws probe ucx-leak's RSS over time per configuration
// with its fitted line, and each configuration's verdict.
func leakSections(p *Page, res *probe.LeakResult) error {
	p.Title = fmt.Sprintf("nixlctl probe ucx-leak: %d configurations", len(res.Configs))
	sec := Section{ID: "rss", Title: "Receiver memory over time"}
	if res.Recommendation != "" {
		sec.Blocks = append(sec.Blocks, Block{Para: res.Recommendation, Class: "recommend"})
	}
	if fig, err := res.Figure(); err == nil {
		sec.Blocks = append(sec.Blocks, charts(figureCharts("rss", fig)...))
	}
	t := &Table{ID: "configs", Caption: "Verdict per configuration", Head: numHead([]string{"configuration", "verdict", "slope MB/min", "R²", "growth MB", "maps", "fds", "why"}, 2)}
	t.Head[len(t.Head)-1].Num = false
	for i, cr := range res.Configs {
		path := fmt.Sprintf("$.configs[%d].", i)
		v := text(cr.Verdict)
		v.Class = "verdict-" + verdictClass(cr.Verdict)
		t.Rows = append(t.Rows, []Cell{text(cr.Series()), v,
			metricCell("", path+"slope_mb_per_min", cr.SlopeMBPerMin, num(cr.SlopeMBPerMin)),
			metricCell("", path+"r2", cr.R2, num(cr.R2)),
			metricCell("", path+"growth_mb", cr.GrowthMB, num(cr.GrowthMB)),
			metricCell("", path+"maps_growth", float64(cr.MapsGrowth), report.Int(int64(cr.MapsGrowth))),
			metricCell("", path+"fds_growth", float64(cr.FDsGrowth), report.Int(int64(cr.FDsGrowth))),
			text(joinNonEmpty(cr.Reason, cr.Error))})
	}
	sec.Blocks = append(sec.Blocks, tableBlock(t))
	for _, n := range res.Notes {
		sec.Blocks = append(sec.Blocks, Block{Para: n, Class: "note"})
	}
	p.Sections = append(p.Sections, sec)
	return nil
}

func joinNonEmpty(a, b string) string {
	switch {
	case a == "":
		return b
	case b == "":
		return a
	}
	return a + "; " + b
}

// verdictClass maps the probe's and gate's verdict words onto the page's
// three colours.
func verdictClass(v string) string {
	switch v {
	case "pass", "improvement", probe.Stable:
		return "pass"
	case "noise", probe.Inconclusive, probe.Skipped:
		return "noise"
	}
	return "regression"
}

// leaseSections shows lease-chaos's scenario table, the simulator's
// sweep as the recommendation curve (dead GB·s and premature frees
// against the lease), and each scenario's lease timeline.
func leaseSections(p *Page, res *leasechaos.LeaseChaosResult) error {
	p.Title = fmt.Sprintf("nixlctl lease-chaos (%s): %d passed, %d failed", res.Mode, res.Passed, res.Failed)
	t := &Table{ID: "scenarios", Caption: "Scenarios", Head: numHead([]string{"scenario", "policy", "verdict", "requests", "completed", "failed", "premature frees", "expired", "dead GB·s", "reclaim p99 s", "outcome"}, 3)}
	t.Head[len(t.Head)-1].Num = false
	for i, r := range res.Scenarios {
		path := fmt.Sprintf("$.scenarios[%d].", i)
		v := Cell{Text: "PASS", Class: "verdict-pass"}
		if !r.Passed {
			v = Cell{Text: "FAIL", Class: "verdict-regression"}
		}
		t.Rows = append(t.Rows, []Cell{text(r.Scenario), text(r.Policy), v,
			metricCell("", path+"requests", float64(r.Requests), report.Int(int64(r.Requests))),
			metricCell("", path+"completed", float64(r.Completed), report.Int(int64(r.Completed))),
			metricCell("", path+"failed", float64(r.Failed), report.Int(int64(r.Failed))),
			metricCell("", path+"premature_frees", float64(r.PrematureFrees), report.Int(int64(r.PrematureFrees))),
			metricCell("", path+"expired_leases", float64(r.ExpiredLeases), report.Int(int64(r.ExpiredLeases))),
			metricCell("", path+"dead_block_gb_s", r.DeadBlockGBs, num(r.DeadBlockGBs)),
			metricCell("", path+"reclaim_latency_s.p99", r.ReclaimLatencyS.P99, num(r.ReclaimLatencyS.P99)),
			{Text: r.Outcome, Class: "note"}})
	}
	exp := &Table{ID: "expectations", Caption: "What each scenario checks", Collapsed: true, Head: head("scenario", "policy", "expectation")}
	for _, r := range res.Scenarios {
		exp.Rows = append(exp.Rows, []Cell{text(r.Scenario), text(r.Policy), text(r.Expectation)})
	}
	p.Sections = append(p.Sections, Section{ID: "scenarios", Title: "Scenarios", Blocks: []Block{tableBlock(t), tableBlock(exp)}})

	if sw := res.Sweep; sw != nil && len(sw.Rows) > 0 {
		sec := Section{ID: "sweep", Title: "Lease duration sweep (simulator)"}
		if sw.Recommendation != "" {
			sec.Blocks = append(sec.Blocks, Block{Para: sw.Recommendation, Class: "recommend"})
		}
		dead := report.Panel{Title: "Dead blocks against the lease", XLabel: "lease (s)", YLabel: "dead GB·s", XScale: report.Log10, YMin: ptr(0)}
		frees := report.Panel{Title: "Premature frees and expiries against the lease", XLabel: "lease (s)", YLabel: "count", XScale: report.Log10, YMin: ptr(0)}
		var x, d, pf, ex []float64
		var fixed []float64
		for _, r := range sw.Rows {
			if r.LeaseS > 0 {
				x, d, pf, ex = append(x, r.LeaseS), append(d, r.DeadBlockGBs), append(pf, float64(r.PrematureFrees)), append(ex, float64(r.ExpiredLeases))
			} else {
				fixed = append(fixed, r.DeadBlockGBs, r.TimeoutS)
			}
		}
		dead.Lines = append(dead.Lines, report.Line{Label: "lease", X: x, Y: d, Points: true, Color: 1})
		if len(fixed) == 2 && len(x) > 0 {
			dead.Lines = append(dead.Lines, report.Line{Label: "fixed " + report.Seconds(fixed[1]) + " timeout", X: []float64{x[0], x[len(x)-1]}, Y: []float64{fixed[0], fixed[0]}, Style: report.Dashed, Color: 5})
		}
		if sw.Best >= 0 && sw.Best < len(sw.Rows) {
			b := sw.Rows[sw.Best]
			dead.Lines = append(dead.Lines, report.Line{Label: "recommended: " + b.Name(), X: []float64{b.LeaseS}, Y: []float64{b.DeadBlockGBs}, Points: true, Color: 3})
		}
		frees.Lines = append(frees.Lines, report.Line{Label: "premature frees", X: x, Y: pf, Points: true, Color: 4},
			report.Line{Label: "expired leases", X: x, Y: ex, Points: true, Color: 2})
		sec.Blocks = append(sec.Blocks, charts(renderPanel("sweep-dead", dead), renderPanel("sweep-frees", frees)))
		st := fromReportTable("sweep-table", sw.Table())
		for i, r := range sw.Rows {
			// The dead GB·s column carries the row's exact value.
			for j, h := range st.Head {
				if h.Text == "dead GB·s" && j < len(st.Rows[i]) {
					st.Rows[i][j] = metricCell("", fmt.Sprintf("$.sweep.rows[%d].dead_block_gb_s", i), r.DeadBlockGBs, st.Rows[i][j].Text)
				}
			}
		}
		sec.Blocks = append(sec.Blocks, tableBlock(st))
		p.Sections = append(p.Sections, sec)
	}

	if fig, err := res.Figure(); err == nil {
		spans := 0
		for _, pn := range fig.Panels {
			spans += len(pn.Spans)
		}
		sec := Section{ID: "timelines", Title: "Lease timelines"}
		if spans <= 3000 {
			sec.Blocks = append(sec.Blocks, para("Each lease from grant to free, coloured by how it ended, and the number held; hover a bar for its times."),
				charts(figureCharts("tl", fig)...))
		} else {
			sec.Blocks = append(sec.Blocks, para(fmt.Sprintf("%d leases: too many to draw on a page; --plot draws them.", spans)))
		}
		p.Sections = append(p.Sections, sec)
	}
	return nil
}
