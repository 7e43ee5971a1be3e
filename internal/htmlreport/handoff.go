package htmlreport

import (
	"fmt"
	"math"
	"sort"
	"time"

	"github.com/nixlctl/nixlctl/internal/handoff"
	"github.com/nixlctl/nixlctl/internal/report"
)

// handoffStage is one stage of a request's handoff as records and the
// summary name it.
type handoffStage struct {
	key, label string
	get        func(handoff.HandoffRecord) float64
	pct        func(handoff.HandoffSummary) report.Percentiles
}

var handoffStages = []handoffStage{
	{"handoff_latency_ms", "handoff (KV ready → decode ready)", func(r handoff.HandoffRecord) float64 { return r.HandoffMS },
		func(s handoff.HandoffSummary) report.Percentiles { return s.HandoffLatencyMS }},
	{"registration_rtt_ms", "registration RTT (push)", func(r handoff.HandoffRecord) float64 { return r.RegRTTMS },
		func(s handoff.HandoffSummary) report.Percentiles { return s.RegRTTMS }},
	{"finish_to_post_ms", "KV ready → transfer posted", func(r handoff.HandoffRecord) float64 { return r.FinishToPostMS },
		func(s handoff.HandoffSummary) report.Percentiles { return s.FinishToPostMS }},
	{"post_ms", "post", func(r handoff.HandoffRecord) float64 { return r.PostMS },
		func(s handoff.HandoffSummary) report.Percentiles { return s.PostMS }},
	{"transfer_ms", "transfer (posted → data in place)", func(r handoff.HandoffRecord) float64 { return r.TransferMS },
		func(s handoff.HandoffSummary) report.Percentiles { return s.TransferMS }},
	{"completion_to_ready_ms", "data in place → decode ready", func(r handoff.HandoffRecord) float64 { return r.CompletionMS },
		func(s handoff.HandoffSummary) report.Percentiles { return s.CompletionMS }},
}

// measured are the records of the timed phase (warm-up left out).
func measured(recs []handoff.HandoffRecord) []handoff.HandoffRecord {
	var out []handoff.HandoffRecord
	for _, r := range recs {
		if !r.Warmup {
			out = append(out, r)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Index < out[j].Index })
	return out
}

func handoffSections(p *Page, res *handoff.HandoffResult) error {
	s := res.Summary
	recs := measured(res.Records)
	p.FromRecords = len(recs) > 0
	p.Title = fmt.Sprintf("nixlctl %s: %s, %d requests", res.Command, res.Model, s.Requests)

	// The answer first: how fast, how many failed.
	key := &Table{ID: "headline", Head: numHead([]string{"requests", "failed", "GB/s", "vs memcpy", "handoff p50 (ms)", "handoff p99 (ms)", "transfer p50 (ms)"}, 0)}
	row := []Cell{
		metricCell("", "$.summary.requests", float64(s.Requests), report.Int(int64(s.Requests))),
		metricCell("", "failed", float64(s.Failed), report.Int(int64(s.Failed))),
		metricCell("", "bandwidth_gbps", s.BandwidthGBps, num(s.BandwidthGBps)),
		metricCell("", "$.summary.efficiency_vs_memcpy", s.EfficiencyMemcpy, num(s.EfficiencyMemcpy)),
		metricCell("", "handoff_latency_ms.p50", s.HandoffLatencyMS.P50, num(s.HandoffLatencyMS.P50)),
		metricCell("", "handoff_latency_ms.p99", s.HandoffLatencyMS.P99, num(s.HandoffLatencyMS.P99)),
		metricCell("", "transfer_ms.p50", s.TransferMS.P50, num(s.TransferMS.P50)),
	}
	if s.Failed > 0 {
		row[1].Class = "bad"
	}
	key.Rows = [][]Cell{row}
	cfg := res.Config
	p.Sections = append(p.Sections, Section{ID: "summary", Title: "Summary", Blocks: []Block{
		para(fmt.Sprintf("%s protocol, %s, ISL %s tokens, concurrency %d, %s of KV per request.", res.Protocol, res.Model,
			islText(cfg.ISL), cfg.Concurrency, report.Bytes(int64(s.BytesPerRequest)))),
		tableBlock(key),
	}})

	// Per-stage latency distributions.
	var lines []report.Line
	stagesT := &Table{ID: "stages", Caption: "Stage latencies (ms)", Head: numHead([]string{"stage", "count", "p50", "p90", "p99", "p99.9", "max"}, 1)}
	var handoffValues []float64
	for i, st := range handoffStages {
		pc := st.pct(s)
		if pc.Count == 0 {
			continue
		}
		var vs []float64
		for _, r := range recs {
			if r.Error == "" {
				vs = append(vs, st.get(r))
			}
		}
		if i == 0 {
			handoffValues = vs
		}
		if len(vs) > 0 {
			lines = append(lines, cdfLine(st.label, vs, i+1))
		} else if i == 0 {
			h, _ := report.DecodeHistogram(s.Histogram)
			lines = append(lines, histCDFLine(st.label, h, i+1))
		} else if enc := s.StageHistograms[st.key]; enc != "" {
			h, _ := report.DecodeHistogram(enc)
			lines = append(lines, histCDFLine(st.label, h, i+1))
		}
		stagesT.Rows = append(stagesT.Rows, []Cell{text(st.label), metricCell("", "$.summary."+st.key+".count", float64(pc.Count), report.Int(int64(pc.Count))),
			metricCell("", st.key+".p50", pc.P50, num(pc.P50)), metricCell("", st.key+".p90", pc.P90, num(pc.P90)),
			metricCell("", st.key+".p99", pc.P99, num(pc.P99)), metricCell("", st.key+".p999", pc.P999, num(pc.P999)),
			metricCell("", st.key+".max", pc.Max, num(pc.Max))})
	}
	lat := Section{ID: "latency", Title: "Latency by stage"}
	var cs []chart
	hs := report.LatencySeries{Label: handoffStages[0].label, Values: handoffValues}
	if len(handoffValues) == 0 {
		hs.Hist, _ = report.DecodeHistogram(s.Histogram)
	}
	if fig, err := report.LatencyFigure("", time.Millisecond, hs); err == nil {
		h := fig.Panels[0]
		h.Title = "Handoff latency histogram"
		cs = append(cs, renderPanel("hist", h))
	}
	if len(lines) > 0 {
		cdf := report.Panel{Title: "CDF per stage", XLabel: "latency (ms)", YLabel: "fraction of requests ≤ x", YMin: ptr(0), Lines: lines, XScale: logIfWide(lines)}
		cs = append(cs, renderPanel("cdf", cdf))
	}
	if len(cs) > 0 {
		lat.Blocks = append(lat.Blocks, charts(cs...))
	}
	src := "from the per-request records (CDFs at up to 200 quantile points with the slowest 1% value by value)"
	if len(recs) == 0 {
		src = "from the result's stored histograms (its records file was not loaded)"
	}
	lat.Blocks = append(lat.Blocks, para("Distributions "+src+"; successful requests only. Click a legend entry to hide or show its stage."), tableBlock(stagesT))
	p.Sections = append(p.Sections, lat)

	if ch, ok := bandwidthOverTime(recs, s.BandwidthGBps); ok {
		p.Sections = append(p.Sections, Section{ID: "bandwidth", Title: "Bandwidth over time", Blocks: []Block{
			charts(ch),
			para("Bytes of the requests that became ready in each interval, over the interval; the dashed line is the run's average. Time runs from the first measured request's start."),
		}})
	}

	if len(s.Pairs) > 0 {
		p.Sections = append(p.Sections, pairsSection(res))
	}
	p.Sections = append(p.Sections, failuresSection(s, recs))
	return nil
}

func islText(d handoff.ISL) string {
	if d.Dist == "" || string(d.Dist) == "fixed" {
		return report.Int(int64(d.Fixed))
	}
	return fmt.Sprintf("%s %d–%d", d.Dist, d.Min, d.Max)
}

// bandwidthOverTime bins the ready requests' bytes by when they became
// ready: at most 120 intervals whatever the number of requests.
func bandwidthOverTime(recs []handoff.HandoffRecord, avg float64) (chart, bool) {
	var t0, t1 int64 = math.MaxInt64, 0
	n := 0
	for _, r := range recs {
		if r.Error != "" || r.TReady == 0 || r.TStart == 0 {
			continue
		}
		t0, t1 = min(t0, r.TStart), max(t1, r.TReady)
		n++
	}
	if n < 2 || t1 <= t0 {
		return chart{}, false
	}
	span := float64(t1-t0) / 1e9
	// About 60 intervals, but wide enough for three requests each on
	// average, so a short run reads as a rate and not as single arrivals.
	width := niceWidth(math.Max(span/60, span*3/float64(n)))
	bins := int(math.Ceil(span/width)) + 1
	bytes := make([]float64, bins)
	for _, r := range recs {
		if r.Error != "" || r.TReady == 0 || r.TStart == 0 {
			continue
		}
		i := int(float64(r.TReady-t0) / 1e9 / width)
		bytes[min(i, bins-1)] += float64(r.Bytes)
	}
	l := report.Line{Label: fmt.Sprintf("GB/s per %s", report.Seconds(width)), Style: report.Steps}
	for i, b := range bytes {
		l.X, l.Y = append(l.X, float64(i)*width), append(l.Y, b/width/1e9)
	}
	// Close the last step at its interval's end.
	l.X, l.Y = append(l.X, float64(bins)*width), append(l.Y, l.Y[len(l.Y)-1])
	ref := report.Line{Label: fmt.Sprintf("average %s GB/s", num(avg)), X: []float64{0, float64(bins) * width}, Y: []float64{avg, avg}, Style: report.Dashed, Color: 5}
	pn := report.Panel{Title: "GB/s over time", XLabel: "time (s)", YLabel: "GB/s", YMin: ptr(0), Lines: []report.Line{l, ref}}
	return renderPanel("bw", pn), true
}

// niceWidth rounds an interval up to 1, 2 or 5 times a power of ten
// seconds, at least 10 ms.
func niceWidth(w float64) float64 {
	w = math.Max(w, 0.01)
	mag := math.Pow(10, math.Floor(math.Log10(w)))
	for _, m := range []float64{1, 2, 5, 10} {
		if m*mag >= w {
			return m * mag
		}
	}
	return 10 * mag
}

// pairsSection shows an xPyD run's (prefill, decode) pairs as matrices
// and a table.
func pairsSection(res *handoff.HandoffResult) Section {
	s := Section{ID: "pairs", Title: "Per pair (xPyD)"}
	if fig, err := res.Figure(); err == nil {
		var cs []chart
		for i, pn := range fig.Panels {
			if pn.Heatmap != nil {
				cs = append(cs, renderPanel(fmt.Sprintf("pair%d", i), pn))
			}
		}
		if len(cs) > 0 {
			s.Blocks = append(s.Blocks, charts(cs...))
		}
	}
	t := &Table{ID: "pairs-table", Head: numHead([]string{"prefill", "decode", "requests", "failed", "GB/s (active)", "active s", "handoff p50 (ms)", "handoff p99 (ms)"}, 2)}
	for i, pr := range res.Summary.Pairs {
		path := fmt.Sprintf("$.summary.pairs[%d].", i)
		t.Rows = append(t.Rows, []Cell{text(fmt.Sprintf("prefill-%d", pr.Prefill)), text(fmt.Sprintf("decode-%d", pr.Decode)),
			metricCell("", path+"requests", float64(pr.Requests), report.Int(int64(pr.Requests))),
			metricCell("", path+"failed", float64(pr.Failed), report.Int(int64(pr.Failed))),
			metricCell("", path+"active_bandwidth_gbps", pr.ActiveGBps, num(pr.ActiveGBps)),
			metricCell("", path+"active_seconds", pr.ActiveSeconds, num(pr.ActiveSeconds)),
			metricCell("", path+"handoff_latency_ms.p50", pr.HandoffLatencyMS.P50, num(pr.HandoffLatencyMS.P50)),
			metricCell("", path+"handoff_latency_ms.p99", pr.HandoffLatencyMS.P99, num(pr.HandoffLatencyMS.P99))})
	}
	s.Blocks = append(s.Blocks, tableBlock(t))
	return s
}

// failuresSection counts failures by reason with one request that failed
// so, from the records when they are loaded.
func failuresSection(s handoff.HandoffSummary, recs []handoff.HandoffRecord) Section {
	sec := Section{ID: "failures", Title: "Failures"}
	if len(s.FailuresByReason) == 0 {
		sec.Blocks = append(sec.Blocks, Block{Para: fmt.Sprintf("No request failed (%d measured).", s.Requests), Class: "ok"})
		return sec
	}
	type reason struct {
		text string
		n    int
	}
	var rs []reason
	for k, n := range s.FailuresByReason {
		rs = append(rs, reason{k, n})
	}
	sort.Slice(rs, func(i, j int) bool { return rs[i].n > rs[j].n || rs[i].n == rs[j].n && rs[i].text < rs[j].text })
	examples := map[string]handoff.HandoffRecord{}
	for _, r := range recs {
		reason := ""
		switch {
		case r.Error != "":
			reason = handoff.FailureReason(r.Error)
		case r.CorruptBlocks > 0:
			reason = "corrupt blocks"
		default:
			continue
		}
		if _, ok := examples[reason]; !ok {
			examples[reason] = r
		}
	}
	t := &Table{ID: "failures-table", Head: []Cell{text("reason"), {Text: "requests", Num: true}, text("example")}}
	for _, r := range rs {
		ex := "(records not loaded)"
		if e, ok := examples[r.text]; ok {
			msg := e.Error
			if msg == "" {
				msg = fmt.Sprintf("%d corrupt blocks", e.CorruptBlocks)
			}
			ex = fmt.Sprintf("request %d (%s): %s", e.Index, e.ID, msg)
		} else if e, ok := s.FailureExamples[r.text]; ok {
			ex = "first: " + e
		} else if len(recs) > 0 {
			ex = "(no record has this reason)"
		}
		t.Rows = append(t.Rows, []Cell{text(r.text), metricCell("", "$.summary.failures_by_reason["+r.text+"]", float64(r.n), report.Int(int64(r.n))), {Text: ex, Class: "mono"}})
	}
	sec.Blocks = append(sec.Blocks, Block{Para: fmt.Sprintf("%d of %d requests failed.", s.Failed, s.Requests), Class: "bad"}, tableBlock(t))
	return sec
}
