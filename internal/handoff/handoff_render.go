package handoff

import (
	"encoding/json"
	"fmt"
	"io"
	"sort"
	"strings"
	"time"

	"github.com/nixlctl/nixlctl/internal/engine"
	"github.com/nixlctl/nixlctl/internal/report"
	"github.com/nixlctl/nixlctl/internal/runcore"
)

// WriteText renders a `bench pull|push|sglang` result: what ran, the
// stages' percentiles, the outcome and the pairs.
func (res *HandoffResult) WriteText(w io.Writer) error {
	s := res.Summary
	c := res.Config
	fmt.Fprintf(w, "bench %s: %s, %v tokens (%v), %s, %v-token blocks, %v blocks, over %s %s (%v), endpoints %v\n",
		res.Protocol, res.Model, c.ISL.label(), c.KVDType, c.parallelLabel(), c.BlockSize, c.Fragmentation,
		res.Backend, res.Env.BackendVersion, c.DRAMAlloc, c.Endpoints)
	if r := c.Rendezvous; r != nil {
		fmt.Fprintf(w, "rendezvous: %s\n", r.label())
	}
	if res.Env.Transport != "" {
		fmt.Fprintf(w, "transport: %s\n", res.Env.Transport)
	}
	if p := runcore.PathLine(res.NetPath); p != "" {
		fmt.Fprintf(w, "path: %s\n", p)
	}
	if h := hostsLine(res); h != "" {
		fmt.Fprintf(w, "hosts: %s\n", h)
	}
	load := loadLabel(c)
	fmt.Fprintf(w, "%d requests (%v warm-up left out), %s, prefix hit %v\n\n", s.Requests, c.Warmup, load, c.PrefixHit)
	if err := report.WriteTables(w, (*report.Table).WriteText, handoffTables(res)...); err != nil {
		return err
	}
	report.WriteWarnings(w, res.Warnings)
	return nil
}

// WriteMarkdown is the text's tables under a shorter headline, for a
// report.
func (res *HandoffResult) WriteMarkdown(w io.Writer) error {
	c := res.Config
	fmt.Fprintf(w, "**bench %s** %s, %v tokens, %s, over %s %s\n\n", res.Protocol, res.Model, c.ISL.label(),
		c.parallelLabel(), res.Backend, res.Env.BackendVersion)
	if p := runcore.PathLine(res.NetPath); p != "" {
		fmt.Fprintf(w, "path: %s\n\n", p)
	}
	if h := hostsLine(res); h != "" {
		fmt.Fprintf(w, "hosts: %s\n\n", h)
	}
	if err := report.WriteTables(w, (*report.Table).WriteMarkdown, handoffTables(res)...); err != nil {
		return err
	}
	report.WriteMarkdownWarnings(w, res.Warnings)
	return nil
}

// handoffTables are the tables of a handoff's text and Markdown pages.
func handoffTables(res *HandoffResult) []*report.Table {
	return append([]*report.Table{stageTable(res.Summary), resultTable(res)}, pairTables(res)...)
}

func stageTable(s HandoffSummary) *report.Table {
	t := &report.Table{Columns: []report.Column{{Name: "Stage (ms)"}, {Name: "p50", Align: report.Right}, {Name: "p90", Align: report.Right},
		{Name: "p99", Align: report.Right}, {Name: "p99.9", Align: report.Right}, {Name: "max", Align: report.Right}, {Name: "mean", Align: report.Right}}}
	row := func(name string, p report.Percentiles) {
		if p.Count == 0 {
			return
		}
		t.AddRow(name, report.Float(p.P50), report.Float(p.P90), report.Float(p.P99), report.Float(p.P999), report.Float(p.Max), report.Float(p.Mean))
	}
	row("registration (decode -> prefill)", s.RegRTTMS)
	row("KV ready -> posted", s.FinishToPostMS)
	row("post", s.PostMS)
	row("transfer", s.TransferMS)
	row("done -> decode ready", s.CompletionMS)
	row("handoff (KV ready -> decode ready)", s.HandoffLatencyMS)
	return t
}

func resultTable(res *HandoffResult) *report.Table {
	s := res.Summary
	k := &report.Table{Columns: []report.Column{{Name: "Result"}, {Name: "Value", Align: report.Right}}}
	k.AddRow("requests ok / failed", fmt.Sprintf("%d / %d", s.Requests-s.Failed, s.Failed))
	if len(s.FailuresByReason) > 0 {
		k.AddRow("failures by reason", strings.TrimSuffix(strings.TrimPrefix(runcore.ByReason(s.FailuresByReason), " ("), ")"))
		for _, reason := range runcore.ReasonOrder(s.FailuresByReason) {
			if ex, ok := s.FailureExamples[reason]; ok && ex != reason {
				k.AddRow("  first: "+reason, ex)
			}
		}
	}
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
		if sp := s.EfficiencyXferSpread; sp != nil {
			row := fmt.Sprintf("%.2f (p10-p90 %.2f-%.2f)", sp.Median, sp.P10, sp.P90)
			k.AddRow(fmt.Sprintf("efficiency vs bench xfer (%d rounds)", sp.N), row)
			if s.RoundIdleFraction >= 0.005 {
				// What the rounds' handoff rates left out, put back.
				k.AddRow("  over the rounds' whole span", fmt.Sprintf("%.2f (no handoff outstanding %.0f%% of it)", s.SpanEfficiencyXfer, 100*s.RoundIdleFraction))
			}
		} else {
			k.AddRow("efficiency vs bench xfer", fmt.Sprintf("%.2f", s.EfficiencyXfer))
		}
	}
	if s.LimitGBps > 0 {
		k.AddRow("host limit (UCX shared memory)", report.GBps(s.LimitGBps*1e9))
		k.AddRow("efficiency vs host limit", fmt.Sprintf("%.2f", s.EfficiencyLimit))
	}
	k.AddRow("blocks still held after the run", report.Int(s.LeakedBlocks))
	p, d := res.Prefill, res.Decode
	k.AddRow("expired leases (prefill)", report.Int(p.ExpiredLeases))
	if l := p.Leases; l != nil && l.HeartbeatIDs > 0 {
		// Upstream push heartbeats name ids prefill holds no lease for
		// (vLLM #53095): every one unknown, none renewed.
		k.AddRow("heartbeat ids renewed / unknown (prefill)", fmt.Sprintf("%d / %d of %d", l.Renewed, l.UnknownRenewals, l.HeartbeatIDs))
	}
	if d.RegTimeouts > 0 {
		what := "registration watchdog fired (decode)"
		if res.Config.Protocol == engine.ProtoSGLang {
			what = "waiting timeout fired (decode)"
		}
		k.AddRow(what, report.Int(d.RegTimeouts))
	}
	if d.SGLHeartbeats > 0 {
		k.AddRow("/health heartbeats failed / sent (decode)", fmt.Sprintf("%d / %d", d.SGLHeartbeatFailures, d.SGLHeartbeats))
	}
	if d.SGLPrefillsLost > 0 {
		k.AddRow("prefills given up on / rooms failed (decode)", fmt.Sprintf("%d / %d", d.SGLPrefillsLost, d.SGLRoomsFailed))
	}
	k.AddRow("failed transfers / notifications", fmt.Sprintf("%d / %d", p.FailedTransfers+d.FailedTransfers, p.FailedNotifs+d.FailedNotifs))
	k.AddRow("unknown-request / malformed messages", fmt.Sprintf("%d / %d", p.UnknownNotifs+d.UnknownNotifs, p.MalformedNotifs+d.MalformedNotifs+p.MalformedControl+d.MalformedControl))
	return k
}

// loadLabel says how requests arrived.
func loadLabel(c HandoffConfig) string {
	if c.ISL.Dist == ISLTrace {
		return "open loop, arrivals from the trace"
	}
	if c.Rate > 0 {
		return fmt.Sprintf("open loop, %.3g requests/s (Poisson)", c.Rate)
	}
	return fmt.Sprintf("closed loop, concurrency %v", c.Concurrency)
}

func (isl ISL) label() string {
	switch isl.Dist {
	case ISLUniform:
		return fmt.Sprintf("uniform %d-%d", isl.Min, isl.Max)
	case ISLNormal:
		return fmt.Sprintf("normal %.0f±%.0f in [%d, %d]", isl.Mean, isl.Std, isl.Min, isl.Max)
	case ISLTrace:
		return "trace"
	}
	return fmt.Sprint(isl.Fixed)
}

// WriteCSV writes a row per request.
func (res *HandoffResult) WriteCSV(w io.Writer) error {
	t := &report.Table{}
	for _, c := range []string{"index", "id", "isl", "prefix_tokens", "blocks", "descriptors", "bytes", "first_handshake", "handshake_ms",
		"registration_rtt_ms", "finish_to_post_ms", "post_ms", "transfer_ms", "completion_to_ready_ms", "handoff_ms", "corrupt_blocks", "error"} {
		t.Columns = append(t.Columns, report.Column{Name: c})
	}
	// xPyD: which pair served each request.
	xpyd := len(res.Config.PrefillEngines)*len(res.Config.DecodeEngines) > 1
	if xpyd {
		t.Columns = append(t.Columns, report.Column{Name: "prefill"}, report.Column{Name: "decode"})
	}
	recs := append([]HandoffRecord(nil), res.Records...)
	sort.Slice(recs, func(i, j int) bool { return recs[i].Index < recs[j].Index })
	g := func(x float64) string { return fmt.Sprintf("%.6g", x) }
	for _, r := range recs {
		row := []string{fmt.Sprint(r.Index), r.ID, fmt.Sprint(r.ISL), fmt.Sprint(r.PrefixTokens), fmt.Sprint(r.Blocks), fmt.Sprint(r.Descriptors),
			fmt.Sprint(r.Bytes), fmt.Sprint(r.FirstHandshake), g(r.HandshakeMS), g(r.RegRTTMS), g(r.FinishToPostMS), g(r.PostMS),
			g(r.TransferMS), g(r.CompletionMS), g(r.HandoffMS), fmt.Sprint(r.CorruptBlocks), r.Error}
		if xpyd {
			row = append(row, fmt.Sprint(r.Prefill), fmt.Sprint(r.Decode))
		}
		t.AddRow(row...)
	}
	return t.WriteCSV(w)
}

func init() {
	report.RegisterKind(func() report.Result { return new(HandoffResult) }, "bench pull", "bench push", "bench sglang")
}

// Render implements report.Result.
func (res *HandoffResult) Render(w io.Writer, f report.Format) error { return report.Write(w, f, res) }

// Metrics implements report.Result. The efficiency ratios are stable
// (the gate's default); latency metrics carry their stage's histogram,
// throughput metrics the handoff histogram.
func (res *HandoffResult) Metrics() []report.Metric {
	s := res.Summary
	hand, _ := runcore.DecodeHist(s.Histogram)
	var out []report.Metric
	m := func(key, unit string, v float64, better report.Better, stable bool, dist *report.Histogram) {
		out = append(out, report.Metric{Key: key, Value: v, Unit: unit, Better: better, Stable: stable, Dist: dist})
	}
	// With an interleaved reference, the ratio against it is the one to
	// gate on: memcpy is measured once, at setup, so the host's speed can
	// differ between it and the handoff (a 2.7x swing on the project's VMs).
	interleaved := s.EfficiencyXferSpread != nil
	if s.MemcpyGBps > 0 {
		m("efficiency_vs_memcpy", "ratio", s.EfficiencyMemcpy, report.HigherIsBetter, !interleaved, hand)
	}
	if s.XferGBps > 0 {
		m("efficiency_vs_xfer", "ratio", s.EfficiencyXfer, report.HigherIsBetter, true, hand)
	}
	if s.SpanEfficiencyXfer > 0 {
		m("span_efficiency_vs_xfer", "ratio", s.SpanEfficiencyXfer, report.HigherIsBetter, true, hand)
	}
	if s.LimitGBps > 0 {
		m("efficiency_vs_limit", "ratio", s.EfficiencyLimit, report.HigherIsBetter, false, hand)
	}
	m("bandwidth_gbps", "GB/s", s.BandwidthGBps, report.HigherIsBetter, false, hand)
	m("requests_per_s", "1/s", s.RequestsPerS, report.HigherIsBetter, false, hand)
	m("transfer_gbps_p50", "GB/s", s.TransferGBps, report.HigherIsBetter, false, nil)
	pcts := func(key string, p report.Percentiles, dist *report.Histogram) {
		if p.Count == 0 {
			return
		}
		m(key+".p50", "ms", p.P50, report.LowerIsBetter, false, dist)
		m(key+".p90", "ms", p.P90, report.LowerIsBetter, false, dist)
		m(key+".p99", "ms", p.P99, report.LowerIsBetter, false, dist)
		m(key+".p999", "ms", p.P999, report.LowerIsBetter, false, dist)
		m(key+".max", "ms", p.Max, report.LowerIsBetter, false, dist)
	}
	pcts("handoff_latency_ms", s.HandoffLatencyMS, hand)
	for _, st := range []struct {
		key string
		p   report.Percentiles
	}{{"transfer_ms", s.TransferMS}, {"post_ms", s.PostMS}, {"finish_to_post_ms", s.FinishToPostMS},
		{"completion_to_ready_ms", s.CompletionMS}, {"registration_rtt_ms", s.RegRTTMS}} {
		d, _ := runcore.DecodeHist(s.StageHistograms[st.key])
		pcts(st.key, st.p, d)
	}
	m("failed", "requests", float64(s.Failed), report.LowerIsBetter, false, nil)
	m("corrupt_blocks", "blocks", float64(s.CorruptBlocks), report.LowerIsBetter, false, nil)
	m("leaked_blocks", "blocks", float64(s.LeakedBlocks), report.LowerIsBetter, false, nil)
	return out
}

// Figure implements report.Plottable: the handoff latency's histogram and
// CDF, from the records when loaded, else from the stored histogram.
func (res *HandoffResult) Figure() (report.Figure, error) {
	ser := report.LatencySeries{Label: "handoff (KV ready -> decode ready)"}
	xfer := report.LatencySeries{Label: "transfer (posted -> data in place)"}
	for _, r := range res.Records {
		if r.Warmup || r.Error != "" {
			continue
		}
		ser.Values = append(ser.Values, r.HandoffMS)
		if r.TransferMS > 0 {
			xfer.Values = append(xfer.Values, r.TransferMS)
		}
	}
	if len(ser.Values) == 0 {
		var err error
		if ser.Hist, err = runcore.DecodeHist(res.Summary.Histogram); err != nil {
			return report.Figure{}, err
		}
		if xfer.Hist, err = runcore.DecodeHist(res.Summary.StageHistograms["transfer_ms"]); err != nil {
			return report.Figure{}, err
		}
	}
	title := fmt.Sprintf("bench %s: %s, %s tokens, %s, %d requests", res.Protocol, res.Model, res.Config.ISL.label(),
		res.Config.parallelLabel(), res.Summary.Requests)
	series := []report.LatencySeries{ser}
	if len(xfer.Values) > 0 || (xfer.Hist != nil && xfer.Hist.Count() > 0) {
		series = append(series, xfer)
	}
	fig, err := report.LatencyFigure(title, time.Millisecond, series...)
	if err != nil {
		return fig, err
	}
	// xPyD: the pair matrices as heatmaps under the distributions.
	if n, m := pairDims(res); n*m > 1 {
		var rows, cols []string
		for p := 0; p < n; p++ {
			rows = append(rows, engineName("prefill", p, n))
		}
		for d := 0; d < m; d++ {
			cols = append(cols, engineName("decode", d, m))
		}
		heat := func(title string, v func(PairSummary) (float64, bool), highIsGood bool) report.Panel {
			return report.Panel{Title: title, XLabel: "decode", YLabel: "prefill",
				Heatmap: &report.Heatmap{Rows: rows, Cols: cols, Values: pairMatrix(res, v), HighIsGood: highIsGood}}
		}
		fig.Panels = append(fig.Panels, heat("GB/s per pair (over its active time)", pairGBps, true),
			heat("handoff p99 per pair (ms)", pairP99, false))
		fig.Columns = 2
		fig.Title += fmt.Sprintf(", %d prefill x %d decode (%s)", n, m, res.Config.Router)
	}
	return fig, nil
}

// WriteProm implements report.PromExporter: every measured request that
// moved data is one transfer (its transfer and post times, bytes and
// descriptors), and the engines' own counters give the failure and
// expiry counters. vLLM observes one transfer per NIXL handle, i.e. per
// TP rank pair; a record sums a request's ranks, so with TP > 1 counts are
// per request, not per handle.
func (res *HandoffResult) WriteProm(w io.Writer) error {
	if len(res.Records) == 0 && res.Summary.Requests > 0 {
		return fmt.Errorf("-o prom needs the per-request records: run with --records FILE or --save DIR, or show a saved result whose records file is present")
	}
	v := report.NewVLLMTransfers(map[string]string{"source": "nixlctl", "command": res.Command, "model_name": res.Model, "backend": res.Backend})
	ms := func(x float64) time.Duration { return time.Duration(x * 1e6) }
	for _, r := range res.Records {
		if r.Warmup || r.Error != "" || r.TransferMS <= 0 {
			continue
		}
		v.Observe(ms(r.TransferMS), ms(r.PostMS), r.Bytes, r.Descriptors)
	}
	p, d := res.Prefill, res.Decode
	v.FailedTransfers = float64(p.FailedTransfers + d.FailedTransfers)
	v.FailedNotifs = float64(p.FailedNotifs + d.FailedNotifs)
	v.ExpiredKV = float64(p.ExpiredLeases)
	return v.Write(w)
}

// handoffRecordsHeader is the first line of a records file.
type handoffRecordsHeader struct {
	Schema    string    `json:"schema"`
	Command   string    `json:"command"`
	Protocol  string    `json:"protocol"`
	StartedAt time.Time `json:"started_at"`
}

func (res *HandoffResult) recordsHeader() handoffRecordsHeader {
	return handoffRecordsHeader{Schema: report.RecordsSchema, Command: res.Command, Protocol: res.Protocol, StartedAt: res.StartedAt}
}

// WriteRecords implements report.RecordsKeeper: a header line, then one
// JSON line per request.
func (res *HandoffResult) WriteRecords(w io.Writer) (int, error) {
	enc := json.NewEncoder(w)
	if err := enc.Encode(res.recordsHeader()); err != nil {
		return 0, err
	}
	for _, r := range res.Records {
		if err := enc.Encode(r); err != nil {
			return 0, err
		}
	}
	return len(res.Records), nil
}

// ReadRecords implements report.RecordsKeeper: it loads a records file of
// the same command and recomputes the summary from it, keeping what does
// not come from records (the memcpy and bench xfer references, blocks
// still held).
func (res *HandoffResult) ReadRecords(r io.Reader) error {
	recs, err := ReadHandoffRecords(r, res.Command)
	if err != nil {
		return err
	}
	old := res.Summary
	s := SummarizeHandoff(recs, old.MemcpyGBps)
	s.XferGBps, s.LeakedBlocks = old.XferGBps, old.LeakedBlocks
	if n, m := len(res.Config.PrefillEngines), len(res.Config.DecodeEngines); n*m > 1 {
		s.Pairs = SummarizePairs(recs, n, m)
	}
	if len(old.Rounds) > 0 {
		// The rounds' references are not in the records: keep them, and
		// recompute the handoff's side of each round.
		var refs []roundRefs
		for _, r := range old.Rounds {
			for len(refs) < r.Round {
				refs = append(refs, roundRefs{})
			}
			refs[r.Round-1] = roundRefs{xfer: r.XferGBps, limit: r.LimitGBps, cpuNS: r.CPUNSPerStep, touchMS: r.TouchMS}
		}
		summarizeRounds(&s, recs, refs)
	} else if s.XferGBps > 0 {
		s.EfficiencyXfer = s.BandwidthGBps / s.XferGBps
	}
	res.Records, res.Summary = recs, s
	return nil
}

// ReadHandoffRecords reads a records file written by bench pull, push or
// sglang; command, when set, must match its header. A last line cut
// mid-way (a run killed while writing it) is left out: records stream to
// disk as a run goes (report.ReadRecordLines).
func ReadHandoffRecords(r io.Reader, command string) ([]HandoffRecord, error) {
	lines, err := report.ReadRecordLines(r)
	if err != nil {
		return nil, err
	}
	var h handoffRecordsHeader
	if err := json.Unmarshal(lines.Header, &h); err != nil {
		return nil, fmt.Errorf("records: the first line is not a %s header", report.RecordsSchema)
	}
	if command != "" && h.Command != command {
		return nil, fmt.Errorf("records are from %q, the result from %q", h.Command, command)
	}
	recs := make([]HandoffRecord, 0, len(lines.Records))
	for i, b := range lines.Records {
		var rec HandoffRecord
		if err := json.Unmarshal(b, &rec); err != nil {
			return nil, fmt.Errorf("record %d: %v", i+1, err)
		}
		recs = append(recs, rec)
	}
	return recs, nil
}

// hostsLine says where the endpoints ran and how their clocks were
// related, when that is news: some endpoint was not on the driver's
// clock ("" when every one shared it, as children on one host do).
func hostsLine(res *HandoffResult) string {
	estimated := false
	for _, e := range res.Endpoints {
		estimated = estimated || !e.Clock.SameClock
	}
	if !estimated {
		return ""
	}
	parts := make([]string, 0, len(res.Endpoints))
	for _, e := range res.Endpoints {
		where := e.Hostname
		if e.Addr != "" {
			where += " " + e.Addr
		}
		clock := "the driver's clock"
		if !e.Clock.SameClock {
			clock = "clock " + e.Clock.Text
		}
		parts = append(parts, fmt.Sprintf("%s on %s (%s)", e.Role, where, clock))
	}
	return strings.Join(parts, ", ") + "; " + res.Placement
}

// parallelLabel is "TP p -> d", with the pipeline stages when there are.
func (c HandoffConfig) parallelLabel() string {
	if c.PP > 1 {
		return fmt.Sprintf("TP %d -> %d, PP %d", c.PrefillTP, c.DecodeTP, c.PP)
	}
	return fmt.Sprintf("TP %d -> %d", c.PrefillTP, c.DecodeTP)
}

// pairTables renders an xPyD run's pairs as matrices, prefill rows by
// decode columns: requests (failed), GB/s over each pair's active time,
// and handoff p99. None with one pair.
func pairTables(res *HandoffResult) []*report.Table {
	n, m := pairDims(res)
	if n*m <= 1 {
		return nil
	}
	matrix := func(corner string, cell func(PairSummary) string) *report.Table {
		t := &report.Table{Columns: []report.Column{{Name: corner}}}
		for d := 0; d < m; d++ {
			t.Columns = append(t.Columns, report.Column{Name: engineName("decode", d, m), Align: report.Right})
		}
		for p := 0; p < n; p++ {
			row := []string{engineName("prefill", p, n)}
			for d := 0; d < m; d++ {
				row = append(row, cell(res.Summary.Pairs[p*m+d]))
			}
			t.AddRow(row...)
		}
		return t
	}
	num := func(v func(PairSummary) (float64, bool)) func(PairSummary) string {
		return func(p PairSummary) string {
			if x, ok := v(p); ok {
				return report.Float(x)
			}
			return "-"
		}
	}
	return []*report.Table{
		matrix("requests (failed)", func(p PairSummary) string { return fmt.Sprintf("%d (%d)", p.Requests, p.Failed) }),
		matrix("GB/s (pair active)", num(pairGBps)),
		matrix("handoff p99 (ms)", num(pairP99)),
	}
}
