package bench

import (
	"fmt"
	"io"
	"sort"

	"github.com/nixlctl/nixlctl/internal/report"
)

// WriteHandoff renders a `bench pull|push|sglang` result.
func WriteHandoff(w io.Writer, f report.Format, res *HandoffResult) error {
	switch f {
	case report.FormatJSON:
		return report.WriteJSON(w, res)
	case report.FormatCSV:
		return handoffCSV(res).WriteCSV(w)
	}
	s := res.Summary
	c := res.Config
	fmt.Fprintf(w, "bench %s: %s, %v tokens (%v), TP %v -> %v, %v-token blocks, %v blocks, over %s %s (%v), endpoints %v\n",
		res.Protocol, res.Model, islLabel(c["isl"]), c["kv_dtype"], c["prefill_tp"], c["decode_tp"], c["block_size"], c["fragmentation"],
		res.Backend, res.Env.BackendVersion, c["dram_alloc"], c["endpoints"])
	if res.Env.Transport != "" {
		fmt.Fprintf(w, "transport: %s\n", res.Env.Transport)
	}
	load := fmt.Sprintf("closed loop, concurrency %v", c["concurrency"])
	if r, _ := c["rate"].(float64); r > 0 {
		load = fmt.Sprintf("open loop, %.3g requests/s (Poisson)", r)
	}
	fmt.Fprintf(w, "%d requests (%v warm-up left out), %s, prefix hit %v\n\n", s.Requests, c["warmup"], load, c["prefix_hit"])
	t := &report.Table{Columns: []report.Column{{Name: "Stage (ms)"}, {Name: "p50", Align: report.Right}, {Name: "p90", Align: report.Right},
		{Name: "p99", Align: report.Right}, {Name: "p99.9", Align: report.Right}, {Name: "max", Align: report.Right}, {Name: "mean", Align: report.Right}}}
	row := func(name string, p report.Percentiles) {
		if p.Count == 0 {
			return
		}
		t.AddRow(name, report.Float(p.P50), report.Float(p.P90), report.Float(p.P99), report.Float(p.P999), report.Float(p.Max), report.Float(p.Mean))
	}
	row("registration round trip", s.RegRTTMS)
	row("KV ready -> posted", s.FinishToPostMS)
	row("post", s.PostMS)
	row("transfer", s.TransferMS)
	row("done -> decode ready", s.CompletionMS)
	row("handoff (KV ready -> decode ready)", s.HandoffLatencyMS)
	if err := t.WriteText(w); err != nil {
		return err
	}
	fmt.Fprintln(w)
	k := &report.Table{Columns: []report.Column{{Name: "Result"}, {Name: "Value", Align: report.Right}}}
	k.AddRow("requests ok / failed", fmt.Sprintf("%d / %d", s.Requests-s.Failed, s.Failed))
	k.AddRow("corrupt blocks", report.Int(int64(s.CorruptBlocks)))
	k.AddRow("bytes moved", report.Bytes(s.Bytes))
	k.AddRow("bandwidth (aggregate)", report.GBps(s.BandwidthGBps*1e9))
	k.AddRow("per-request transfer (p50)", report.GBps(s.TransferGBps*1e9))
	k.AddRow("requests/s", report.Float(s.RequestsPerS))
	k.AddRow("descriptors per request (logical)", fmt.Sprintf("%s (%s)", report.Int(int64(s.DescriptorsPerReq+0.5)), report.Int(int64(s.LogicalDescsReq+0.5))))
	k.AddRow("handshake first / steady (ms)", fmt.Sprintf("%s / %s", report.Float(s.FirstHandshakeMS), report.Float(s.SteadyHandshakeMS)))
	k.AddRow("memcpy reference", report.GBps(s.MemcpyGBps*1e9))
	k.AddRow("efficiency vs memcpy", fmt.Sprintf("%.2f", s.EfficiencyMemcpy))
	if s.XferGBps > 0 {
		k.AddRow("bench xfer, same bytes", report.GBps(s.XferGBps*1e9))
		k.AddRow("efficiency vs bench xfer", fmt.Sprintf("%.2f", s.EfficiencyXfer))
	}
	k.AddRow("blocks still held after the run", report.Int(s.LeakedBlocks))
	p, d := res.Prefill, res.Decode
	k.AddRow("expired leases (prefill)", report.Int(p.ExpiredLeases))
	k.AddRow("failed transfers / notifications", fmt.Sprintf("%d / %d", p.FailedTransfers+d.FailedTransfers, p.FailedNotifs+d.FailedNotifs))
	k.AddRow("unknown-request / malformed messages", fmt.Sprintf("%d / %d", p.UnknownNotifs+d.UnknownNotifs, p.MalformedNotifs+d.MalformedNotifs+p.MalformedControl+d.MalformedControl))
	if err := k.WriteText(w); err != nil {
		return err
	}
	for _, warn := range res.Warnings {
		fmt.Fprintf(w, "WARNING: %s\n", warn)
	}
	return nil
}

func islLabel(v any) string {
	isl, ok := v.(ISL)
	if !ok {
		return fmt.Sprint(v)
	}
	switch isl.Dist {
	case "uniform":
		return fmt.Sprintf("uniform %d-%d", isl.Min, isl.Max)
	case "normal":
		return fmt.Sprintf("normal %.0f±%.0f in [%d, %d]", isl.Mean, isl.Std, isl.Min, isl.Max)
	case "trace":
		return "trace"
	}
	return fmt.Sprint(isl.Fixed)
}

func handoffCSV(res *HandoffResult) *report.Table {
	t := &report.Table{}
	for _, c := range []string{"index", "id", "isl", "prefix_tokens", "blocks", "descriptors", "bytes", "first_handshake", "handshake_ms",
		"registration_rtt_ms", "finish_to_post_ms", "post_ms", "transfer_ms", "completion_to_ready_ms", "handoff_ms", "corrupt_blocks", "error"} {
		t.Columns = append(t.Columns, report.Column{Name: c})
	}
	recs := append([]HandoffRecord(nil), res.Records...)
	sort.Slice(recs, func(i, j int) bool { return recs[i].Index < recs[j].Index })
	g := func(x float64) string { return fmt.Sprintf("%.6g", x) }
	for _, r := range recs {
		t.AddRow(fmt.Sprint(r.Index), r.ID, fmt.Sprint(r.ISL), fmt.Sprint(r.PrefixTokens), fmt.Sprint(r.Blocks), fmt.Sprint(r.Descriptors),
			fmt.Sprint(r.Bytes), fmt.Sprint(r.FirstHandshake), g(r.HandshakeMS), g(r.RegRTTMS), g(r.FinishToPostMS), g(r.PostMS),
			g(r.TransferMS), g(r.CompletionMS), g(r.HandoffMS), fmt.Sprint(r.CorruptBlocks), r.Error)
	}
	return t
}
