package ecbench

import (
	"fmt"
	"io"
	"sort"
	"strings"
	"time"

	"github.com/nixlctl/nixlctl/internal/report"
	"github.com/nixlctl/nixlctl/internal/runcore"
)

// WriteMarkdown is the text's headline and tables for a report.
func (res *ECResult) WriteMarkdown(w io.Writer) error {
	fmt.Fprintf(w, "**bench ec** %s, %s over %s (%s), %d consumers\n\n", res.Config.Model, res.Config.Direction,
		res.Env.Backend, res.Env.BackendVersion, res.Config.Consumers)
	if p := runcore.PathLine(res.NetPath); p != "" {
		fmt.Fprintf(w, "path: %s\n\n", p)
	}
	if err := report.WriteTables(w, (*report.Table).WriteMarkdown, ecLatencyTable(res.Summary), ecSummaryTable(res)); err != nil {
		return err
	}
	report.WriteMarkdownWarnings(w, res.Warnings)
	return nil
}

// WriteText says what ran, per-stage latency percentiles, outcomes,
// bandwidth against memcpy of the same bytes, and the cache and failure
// counters.
func (res *ECResult) WriteText(w io.Writer) error {
	c, s := res.Config, res.Summary
	who := "consumer READs"
	if c.Direction == "write" {
		who = "producer WRITEs"
	}
	fmt.Fprintf(w, "bench ec: %s (hidden %d x %s = %s B blocks), %s over %s (%s), producer %s, %d consumers\n",
		c.Model, c.HiddenSize, c.DType, report.Int(int64(c.BlockBytes)), who, res.Env.Backend, res.Env.BackendVersion, c.Producer, c.Consumers)
	if s.Transport != "" {
		fmt.Fprintf(w, "transport: %s\n", s.Transport)
	}
	if p := runcore.PathLine(res.NetPath); p != "" {
		fmt.Fprintf(w, "path: %s\n", p)
	}
	var imgs []string
	for i, g := range c.Grids {
		imgs = append(imgs, fmt.Sprintf("grid %s = %s blocks = %s B", g, report.Int(int64(c.ImageBlocks[i])), report.Int(c.ImageBytes[i])))
	}
	fmt.Fprintf(w, "images: %s\n", strings.Join(imgs, "; "))
	fmt.Fprintf(w, "workload: %d requests x %d images over %d unique (zipf s=%g), encode %s%s, ack timeout %s\n",
		c.Requests, c.ImagesPerRequest, c.UniqueImages, c.ZipfS, report.Duration(msDur(c.EncodeTimeMS)),
		map[bool]string{true: " (overlapped)", false: ""}[c.Overlap], report.Duration(msDur(c.AckTimeoutMS)))
	fmt.Fprintf(w, "regions: producer %s (%s blocks), consumer %s (%s blocks) each\n\n",
		report.Bytes(int64(c.ProducerRegion)), report.Int(int64(c.ProducerBlocks)), report.Bytes(int64(c.ConsumerRegion)), report.Int(int64(c.ConsumerBlocks)))

	if err := report.WriteTables(w, (*report.Table).WriteText, ecLatencyTable(s), ecSummaryTable(res)); err != nil {
		return err
	}
	fmt.Fprintln(w)
	fmt.Fprintf(w, "consumer cache: %d evictions, %d pinned skips, %d exhausted; producer cache: %d evictions, %d pinned skips\n",
		s.Evictions, s.PinnedSkips, s.Exhausted, s.ProducerEvictions, s.ProducerPinnedSkips)
	fmt.Fprintf(w, "NOT_READY retries %d, stale acks %d, quarantined %d, producer restarts seen %d; an OK ack is %s (the producer's mem descriptor rides in every one)\n",
		s.NotReadyRetries, s.StaleAcks, s.Quarantined, s.ProducerReloads, report.Bytes(int64(s.AckBytes)))
	if len(s.FailuresByStatus) > 0 {
		fmt.Fprintf(w, "failures by status: %s\n", statusList(s.FailuresByStatus))
	}
	report.WriteWarnings(w, res.Warnings)
	return nil
}

func msDur(ms float64) time.Duration { return time.Duration(ms * 1e6) }

func speedup(x float64) string {
	if x == 0 {
		return "-"
	}
	return report.Float(x) + "x"
}

func statusList(m map[string]int64) string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var parts []string
	for _, k := range keys {
		parts = append(parts, fmt.Sprintf("%s %d", k, m[k]))
	}
	return strings.Join(parts, ", ")
}

// WriteCSV writes the run as one row.
func (res *ECResult) WriteCSV(w io.Writer) error {
	t := &report.Table{}
	for _, c := range []string{"backend", "direction", "model", "block_bytes", "requests", "images", "transfers", "hits", "failed",
		"hit_rate", "bytes", "latency_ms_p50", "latency_ms_p90", "latency_ms_p99", "latency_ms_max", "ack_ms_p50", "ack_ms_p99",
		"transfer_ms_p50", "transfer_ms_p99", "hit_latency_ms_p50", "transfer_gbps", "memcpy_gbps", "efficiency", "warm_speedup",
		"evictions", "pinned_skips", "producer_evictions", "not_ready_retries", "failures_by_status"} {
		t.Columns = append(t.Columns, report.Column{Name: c})
	}
	s, c := res.Summary, res.Config
	g := func(x float64) string { return fmt.Sprintf("%.6g", x) }
	t.AddRow(res.Env.Backend, c.Direction, c.Model, fmt.Sprint(c.BlockBytes), fmt.Sprint(s.Requests), fmt.Sprint(s.Images),
		fmt.Sprint(s.Transfers), fmt.Sprint(s.Hits), fmt.Sprint(s.Failed), g(s.HitRate), fmt.Sprint(s.Bytes),
		g(s.LatencyMS.P50), g(s.LatencyMS.P90), g(s.LatencyMS.P99), g(s.LatencyMS.Max), g(s.AckMS.P50), g(s.AckMS.P99),
		g(s.TransferMS.P50), g(s.TransferMS.P99), g(s.HitLatencyMS.P50), g(s.TransferGBps), g(res.Reference.MemcpyGBps),
		g(res.Reference.Efficiency), g(s.WarmSpeedup), fmt.Sprint(s.Evictions), fmt.Sprint(s.PinnedSkips),
		fmt.Sprint(s.ProducerEvictions), fmt.Sprint(s.NotReadyRetries), statusList(s.FailuresByStatus))
	return t.WriteCSV(w)
}

func init() {
	report.RegisterKind(func() report.Result { return new(ECResult) }, "bench ec")
}

// Render implements report.Result. vLLM's nixl_* metrics describe KV
// transfers, not the encoder cache: -o prom is its metrics as plain gauges.
func (res *ECResult) Render(w io.Writer, f report.Format) error { return report.Write(w, f, res) }

// Metrics implements report.Result: the efficiency against memcpy of the
// same bytes (stable, the gate's default), transfer bandwidth and the cold
// latency percentiles, tied to the cold latency histogram; hits and
// failures beside them.
func (res *ECResult) Metrics() []report.Metric {
	s := res.Summary
	cold, _ := runcore.DecodeHist(s.Histogram)
	var out []report.Metric
	m := func(key, unit string, v float64, better report.Better, stable bool, dist *report.Histogram) {
		out = append(out, report.Metric{Key: key, Value: v, Unit: unit, Better: better, Stable: stable, Dist: dist})
	}
	if res.Reference.MemcpyGBps > 0 {
		m("efficiency", "ratio", res.Reference.Efficiency, report.HigherIsBetter, true, cold)
	}
	m("transfer_gbps", "GB/s", s.TransferGBps, report.HigherIsBetter, false, cold)
	m("cold_gbps", "GB/s", s.ColdGBps, report.HigherIsBetter, false, cold)
	for _, q := range []struct {
		k string
		v float64
	}{{"p50", s.LatencyMS.P50}, {"p90", s.LatencyMS.P90}, {"p99", s.LatencyMS.P99}, {"p999", s.LatencyMS.P999}, {"max", s.LatencyMS.Max}} {
		m("latency_ms."+q.k, "ms", q.v, report.LowerIsBetter, false, cold)
	}
	m("hit_latency_ms.p50", "ms", s.HitLatencyMS.P50, report.LowerIsBetter, false, nil)
	m("hit_latency_ms.p99", "ms", s.HitLatencyMS.P99, report.LowerIsBetter, false, nil)
	m("failed", "images", float64(s.Failed), report.LowerIsBetter, false, nil)
	return out
}

// Figure implements report.Plottable: the cold transfer latency's
// histogram and CDF.
func (res *ECResult) Figure() (report.Figure, error) {
	cold, err := runcore.DecodeHist(res.Summary.Histogram)
	if err != nil {
		return report.Figure{}, err
	}
	title := fmt.Sprintf("bench ec %s: %s, %d images, %d consumers", res.Config.Direction, res.Config.Model, res.Summary.Images, res.Config.Consumers)
	return report.LatencyFigure(title, time.Millisecond, report.LatencySeries{Label: "cold transfer (request -> blocks in place)", Hist: cold})
}

func ecLatencyTable(s ECSummary) *report.Table {
	lat := &report.Table{Columns: []report.Column{{Name: "Stage"}, {Name: "Count", Align: report.Right}, {Name: "p50", Align: report.Right},
		{Name: "p90", Align: report.Right}, {Name: "p99", Align: report.Right}, {Name: "p99.9", Align: report.Right}, {Name: "max", Align: report.Right}}}
	row := func(name string, p report.Percentiles) {
		d := func(x float64) string { return report.Duration(msDur(x)) }
		lat.AddRow(name, report.Int(p.Count), d(p.P50), d(p.P90), d(p.P99), d(p.P999), d(p.Max))
	}
	row("cold transfer (req -> blocks in place)", s.LatencyMS)
	row("  ack (XferReq -> XferAck)", s.AckMS)
	row("  transfer", s.TransferMS)
	row("warm hit (local cache)", s.HitLatencyMS)
	return lat
}

func ecSummaryTable(res *ECResult) *report.Table {
	s := res.Summary
	sum := &report.Table{Columns: []report.Column{{Name: "Images"}, {Name: "Transfers", Align: report.Right}, {Name: "Hits", Align: report.Right},
		{Name: "Failed", Align: report.Right}, {Name: "Hit rate", Align: report.Right}, {Name: "Bytes moved", Align: report.Right},
		{Name: "Transfer GB/s", Align: report.Right}, {Name: "memcpy GB/s", Align: report.Right}, {Name: "Efficiency", Align: report.Right},
		{Name: "Warm speed-up", Align: report.Right}}}
	sum.AddRow(report.Int(int64(s.Images)), report.Int(int64(s.Transfers)), report.Int(int64(s.Hits)), report.Int(int64(s.Failed)),
		fmt.Sprintf("%.1f%%", 100*s.HitRate), report.Bytes(s.Bytes), report.Float(s.TransferGBps), report.Float(res.Reference.MemcpyGBps),
		fmt.Sprintf("%.2f", res.Reference.Efficiency), speedup(s.WarmSpeedup))
	return sum
}
