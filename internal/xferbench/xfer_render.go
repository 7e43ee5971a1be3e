package xferbench

import (
	"fmt"
	"io"
	"strings"

	"github.com/nixlctl/nixlctl/internal/report"
	"github.com/nixlctl/nixlctl/internal/runcore"
)

// WriteText has nixlbench's columns, then measured request percentiles,
// descriptor rate and the efficiency against the reference copy of the
// same pattern in the same run (memcpy; device-to-device copies for VRAM).
func (res *XferResult) WriteText(w io.Writer) error {
	c := res.Config
	fmt.Fprintf(w, "bench xfer: %s %s->%s over %s (%s), target %s, initiator buffer %s, target buffer %s, %s\n",
		c.Op, seg(c.InitiatorSeg, c.InitiatorDevice), seg(c.TargetSeg, c.TargetDevice), res.Env.Backend, res.Env.BackendVersion,
		c.Target, c.InitiatorAlloc, c.TargetAlloc, report.Bytes(int64(c.TotalBufferSize)))
	if res.Env.CUDA != "" && res.Env.CUDA != res.Env.BackendVersion {
		fmt.Fprintf(w, "cuda: %s\n", res.Env.CUDA)
	}
	if res.Env.UCX != "" && res.Env.UCX != res.Env.BackendVersion {
		fmt.Fprintf(w, "ucx: libucp %s\n", res.Env.UCX)
	}
	if res.Env.Transport != "" {
		fmt.Fprintf(w, "transport: %s\n", res.Env.Transport)
	}
	if p := runcore.PathLine(res.NetPath); p != "" {
		fmt.Fprintf(w, "path: %s\n", p)
	}
	if c.Shape != "" {
		fmt.Fprintf(w, "shape: %s\n", c.Shape)
	}
	progress := ""
	if c.Progress != "" {
		progress = ", progress " + c.Progress
	}
	fmt.Fprintf(w, "iterations %d (+%d warm-up), pipeline depth %d, descriptors %s, notification per request: %v%s\n\n",
		c.NumIter, c.WarmupIter, c.PipelineDepth, c.DescOrder, c.Notif, progress)
	if err := xferTable(res).WriteText(w); err != nil {
		return err
	}
	report.WriteWarnings(w, res.Warnings)
	return nil
}

func us(x float64) string { return report.Float(x) }

// seg names a memory side, with its GPU for VRAM.
func seg(mem string, dev *int) string {
	if dev == nil {
		return mem
	}
	return fmt.Sprintf("%s(GPU %d)", mem, *dev)
}

// refColumn heads the reference bandwidth column by what was measured.
func refColumn(ref string) string {
	switch ref {
	case "cuda-d2d":
		return "D2D GB/s"
	case "cuda-h2d":
		return "H2D GB/s"
	case "cuda-d2h":
		return "D2H GB/s"
	}
	return "memcpy GB/s"
}

func xferTable(res *XferResult) *report.Table {
	cols := []string{"Block Size (B)", "Batch Size", "B/W (GB/Sec)", "Avg Lat. (us)", "Avg Prep (us)", "P99 Prep (us)",
		"Avg Post (us)", "P99 Post (us)", "Avg Tx (us)", "P99 Tx (us)", "p50 (us)", "p99 (us)", "p99.9 (us)",
		"Descs/s", "Post ns/desc", refColumn(res.Config.Reference), "Efficiency"}
	check := false
	for _, p := range res.Points {
		check = check || p.Consistency != ""
	}
	if check {
		cols = append(cols, "Check")
	}
	t := &report.Table{}
	for _, c := range cols {
		t.Columns = append(t.Columns, report.Column{Name: c, Align: report.Right})
	}
	if check {
		t.Columns[len(t.Columns)-1].Align = report.Left
	}
	for _, p := range res.Points {
		row := []string{fmt.Sprint(p.BlockSize), fmt.Sprint(p.BatchSize), fmt.Sprintf("%.3f", p.BandwidthGBps),
			us(p.AvgLatUS), us(p.PrepUS.Mean), us(p.PrepUS.P99), us(p.PostUS.Mean), us(p.PostUS.P99),
			us(p.TxUS.Mean), us(p.TxUS.P99), us(p.LatencyUS.P50), us(p.LatencyUS.P99), us(p.LatencyUS.P999),
			report.Int(int64(p.DescriptorsPerS)), us(p.PostNSPerDesc), fmt.Sprintf("%.2f", p.MemcpyGBps), fmt.Sprintf("%.2f", p.Efficiency)}
		if check {
			row = append(row, strings.SplitN(p.Consistency, ";", 2)[0])
		}
		t.AddRow(row...)
	}
	return t
}

// WriteCSV writes a row per point.
func (res *XferResult) WriteCSV(w io.Writer) error {
	t := &report.Table{}
	for _, c := range []string{"backend", "op", "block_size", "batch_size", "iterations", "bandwidth_gbps", "avg_lat_us",
		"prep_us_mean", "prep_us_p99", "post_us_mean", "post_us_p99", "tx_us_mean", "tx_us_p99",
		"latency_us_p50", "latency_us_p90", "latency_us_p99", "latency_us_p999", "latency_us_max",
		"descriptors_per_s", "post_ns_per_desc", "memcpy_gbps", "efficiency", "consistency", "reference"} {
		t.Columns = append(t.Columns, report.Column{Name: c})
	}
	g := func(x float64) string { return fmt.Sprintf("%.6g", x) }
	for _, p := range res.Points {
		t.AddRow(p.Backend, p.Op, fmt.Sprint(p.BlockSize), fmt.Sprint(p.BatchSize), fmt.Sprint(p.Iterations),
			g(p.BandwidthGBps), g(p.AvgLatUS), g(p.PrepUS.Mean), g(p.PrepUS.P99), g(p.PostUS.Mean), g(p.PostUS.P99),
			g(p.TxUS.Mean), g(p.TxUS.P99), g(p.LatencyUS.P50), g(p.LatencyUS.P90), g(p.LatencyUS.P99), g(p.LatencyUS.P999),
			g(p.LatencyUS.Max), g(p.DescriptorsPerS), g(p.PostNSPerDesc), g(p.MemcpyGBps), g(p.Efficiency), p.Consistency, res.Config.Reference)
	}
	return t.WriteCSV(w)
}

// WriteMarkdown is the text's table under a shorter headline, for a
// report.
func (res *XferResult) WriteMarkdown(w io.Writer) error {
	c := res.Config
	fmt.Fprintf(w, "**bench xfer** %s %s->%s over %s (%s), target %s\n\n", c.Op, c.InitiatorSeg, c.TargetSeg, res.Env.Backend,
		res.Env.BackendVersion, c.Target)
	if p := runcore.PathLine(res.NetPath); p != "" {
		fmt.Fprintf(w, "path: %s\n\n", p)
	}
	if err := xferTable(res).WriteMarkdown(w); err != nil {
		return err
	}
	report.WriteMarkdownWarnings(w, res.Warnings)
	return nil
}

func init() {
	report.RegisterKind(func() report.Result { return new(XferResult) }, "bench xfer")
}

// Render implements report.Result.
func (res *XferResult) Render(w io.Writer, f report.Format) error { return report.Write(w, f, res) }

// Metrics implements report.Result: per point, the efficiency against
// memcpy (stable across machines, the gate's default), bandwidth and the
// request latency percentiles, each tied to the point's latency histogram.
func (res *XferResult) Metrics() []report.Metric {
	var out []report.Metric
	for _, p := range res.Points {
		dist, _ := runcore.DecodeHist(p.Histogram)
		m := func(key, unit string, v float64, better report.Better, stable bool) {
			out = append(out, report.Metric{Key: key, Series: p.Series(), Value: v, Unit: unit, Better: better, Stable: stable, Dist: dist})
		}
		if p.MemcpyGBps > 0 {
			m("efficiency", "ratio", p.Efficiency, report.HigherIsBetter, true)
		}
		m("bandwidth_gbps", "GB/s", p.BandwidthGBps, report.HigherIsBetter, false)
		m("latency_us.p50", "µs", p.LatencyUS.P50, report.LowerIsBetter, false)
		m("latency_us.p90", "µs", p.LatencyUS.P90, report.LowerIsBetter, false)
		m("latency_us.p99", "µs", p.LatencyUS.P99, report.LowerIsBetter, false)
		m("latency_us.p999", "µs", p.LatencyUS.P999, report.LowerIsBetter, false)
		m("latency_us.max", "µs", p.LatencyUS.Max, report.LowerIsBetter, false)
		m("descriptors_per_s", "1/s", p.DescriptorsPerS, report.HigherIsBetter, false)
		m("post_ns_per_desc", "ns", p.PostNSPerDesc, report.LowerIsBetter, false)
		out = append(out, report.Metric{Key: "memcpy_gbps", Series: p.Series(), Value: p.MemcpyGBps, Unit: "GB/s", Better: report.HigherIsBetter})
	}
	return out
}

// Figure implements report.Plottable: bandwidth and p99 latency against
// block size, one line per batch size.
func (res *XferResult) Figure() (report.Figure, error) {
	var pts []report.SweepPoint
	for _, p := range res.Points {
		pts = append(pts, report.SweepPoint{Block: p.BlockSize, Batch: p.BatchSize, GBps: p.BandwidthGBps,
			P50US: p.LatencyUS.P50, P99US: p.LatencyUS.P99, EfficiencyPct: p.Efficiency * 100})
	}
	title := fmt.Sprintf("bench xfer %s %s->%s over %s", res.Config.Op, res.Config.InitiatorSeg, res.Config.TargetSeg, res.Env.Backend)
	if res.Env.Transport != "" {
		title += " (" + shortTransport(res.Env.Transport) + ")"
	}
	return report.SweepFigure(title, pts)
}

// shortTransport keeps a plot title to one line: the RMA path, without
// the lanes and error mode that follow it.
func shortTransport(t string) string {
	t, _, _ = strings.Cut(t, ";")
	if r := []rune(t); len(r) > 40 {
		return string(r[:39]) + "…"
	}
	return t
}

// WriteProm implements report.PromExporter: every timed request of every
// point as one vLLM transfer (its tx and post times from the point's
// histograms; bytes block x batch; descriptors batch). A failed transfer
// ends a sweep with an error, so the failure counters stay 0.
func (res *XferResult) WriteProm(w io.Writer) error {
	v := report.NewVLLMTransfers(map[string]string{"source": "nixlctl", "command": res.Command, "backend": res.Env.Backend})
	for _, p := range res.Points {
		tx, err := runcore.DecodeHist(p.TxHistogram)
		if err != nil {
			return err
		}
		post, err := runcore.DecodeHist(p.PostHistogram)
		if err != nil {
			return err
		}
		if tx == nil || post == nil {
			return fmt.Errorf("point %s has no tx/post histograms (a result from an older nixlctl): cannot write prom", p.Series())
		}
		v.ObserveHistograms(tx, post, int64(p.BlockSize)*int64(p.BatchSize), p.BatchSize)
	}
	return v.Write(w)
}
