package bench

import (
	"fmt"
	"io"
	"strings"

	"github.com/nixlctl/nixlctl/internal/report"
)

// WriteXfer renders a `bench xfer` result. The table has nixlbench's
// columns, then measured request percentiles, descriptor rate and the
// efficiency against the reference copy of the same pattern in the same
// run (memcpy; device-to-device copies for VRAM).
func WriteXfer(w io.Writer, f report.Format, res *XferResult) error {
	switch f {
	case report.FormatJSON:
		return report.WriteJSON(w, res)
	case report.FormatCSV:
		return xferCSV(res).WriteCSV(w)
	}
	c := res.Config
	fmt.Fprintf(w, "bench xfer: %s %s->%s over %s (%s), target %s, initiator buffer %s, target buffer %s, %s\n",
		c.Op, seg(c.InitiatorSeg, c.InitiatorDevice), seg(c.TargetSeg, c.TargetDevice), res.Env.Backend, res.Env.BackendVersion,
		c.Target, c.InitiatorAlloc, c.TargetAlloc, report.Bytes(int64(c.TotalBufferSize)))
	if res.Env.CUDA != "" && res.Env.CUDA != res.Env.BackendVersion {
		fmt.Fprintf(w, "cuda: %s\n", res.Env.CUDA)
	}
	if res.Env.Transport != "" {
		fmt.Fprintf(w, "transport: %s\n", res.Env.Transport)
	}
	if c.Shape != "" {
		fmt.Fprintf(w, "shape: %s\n", c.Shape)
	}
	fmt.Fprintf(w, "iterations %d (+%d warm-up), pipeline depth %d, descriptors %s, notification per request: %v\n\n",
		c.NumIter, c.WarmupIter, c.PipelineDepth, c.DescOrder, c.Notif)
	if err := xferTable(res).WriteText(w); err != nil {
		return err
	}
	for _, warn := range res.Warnings {
		fmt.Fprintf(w, "WARNING: %s\n", warn)
	}
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

func xferCSV(res *XferResult) *report.Table {
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
	return t
}
