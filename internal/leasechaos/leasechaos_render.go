package leasechaos

import (
	"fmt"
	"io"
	"strings"

	"github.com/nixlctl/nixlctl/internal/leasesim"
	"github.com/nixlctl/nixlctl/internal/report"
)

func init() {
	report.RegisterKind(func() report.Result { return new(LeaseChaosResult) }, "lease-chaos")
}

// Render implements report.Result.
func (res *LeaseChaosResult) Render(w io.Writer, f report.Format) error {
	return report.Write(w, f, res)
}

// Metrics implements report.Result: per scenario, whether it passed (the
// gate's default: a scenario that passed and now fails is a regression),
// premature frees, dead GB·s and reclaim latency.
func (res *LeaseChaosResult) Metrics() []report.Metric {
	var out []report.Metric
	for _, r := range res.Scenarios {
		pass := 0.0
		if r.Passed {
			pass = 1
		}
		out = append(out,
			report.Metric{Key: "passed", Series: r.Series(), Value: pass, Better: report.HigherIsBetter, Stable: true},
			report.Metric{Key: "premature_frees", Series: r.Series(), Value: float64(r.PrematureFrees), Better: report.LowerIsBetter},
			report.Metric{Key: "dead_block_gb_s", Series: r.Series(), Value: r.DeadBlockGBs, Unit: "GB·s", Better: report.LowerIsBetter},
			report.Metric{Key: "reclaim_latency_s.p99", Series: r.Series(), Value: r.ReclaimLatencyS.P99, Unit: "s", Better: report.LowerIsBetter})
	}
	return out
}

// Figure implements report.Plottable: each scenario's leases over time
// (one row per lease, coloured by how it ended) and the number held.
func (res *LeaseChaosResult) Figure() (report.Figure, error) {
	var fig report.Figure
	for _, r := range res.Scenarios {
		if r.Timeline == nil || len(r.Timeline.Leases) == 0 {
			continue
		}
		var spans []report.LeaseSpan
		for _, l := range r.Timeline.Leases {
			spans = append(spans, report.LeaseSpan{ID: fmt.Sprintf("req %d", l.Request), Start: l.Start, End: l.End, Outcome: l.Outcome})
		}
		f, err := report.LeaseTimelineFigure("", spans)
		if err != nil {
			continue
		}
		verdict := "PASS"
		if !r.Passed {
			verdict = "FAIL"
		}
		for i := range f.Panels {
			f.Panels[i].Title = fmt.Sprintf("%s (%s): %s", r.Series(), verdict, f.Panels[i].Title)
		}
		fig.Panels = append(fig.Panels, f.Panels...)
	}
	if len(fig.Panels) == 0 {
		return report.Figure{}, fmt.Errorf("no lease timelines to plot")
	}
	fig.Title = fmt.Sprintf("lease-chaos (%s): lease %s", res.Mode, res.Config.Lease)
	fig.Columns = 2 // a scenario a row: its leases, then the number held
	return fig, nil
}

// WriteMarkdown is the text's table with the expectations as a list, for
// a report.
func (res *LeaseChaosResult) WriteMarkdown(w io.Writer) error {
	fmt.Fprintf(w, "**lease-chaos** %s\n\n", leaseHeadline(res))
	if err := leaseTable(res).WriteMarkdown(w); err != nil {
		return err
	}
	fmt.Fprintln(w)
	for _, r := range res.Scenarios {
		fmt.Fprintf(w, "- **%s** %s: %s\n", verdict(r), r.Series(), r.Expectation)
	}
	if res.Traffic != nil {
		fmt.Fprintln(w, "\n```")
		writeTraffic(w, res.Traffic)
		fmt.Fprintln(w, "```")
	}
	if res.Sweep != nil {
		fmt.Fprintln(w)
		if err := res.Sweep.Table().WriteMarkdown(w); err != nil {
			return err
		}
		fmt.Fprintf(w, "\n%s\n", res.Sweep.Recommendation)
	}
	report.WriteMarkdownWarnings(w, res.Warnings)
	return nil
}

// WriteText renders a lease-chaos result: one line per scenario and
// policy with its verdict and numbers, then what each one checked.
func (res *LeaseChaosResult) WriteText(w io.Writer) error {
	fmt.Fprintf(w, "lease-chaos: %s\n\n", leaseHeadline(res))
	if len(res.Scenarios) > 0 {
		if err := leaseTable(res).WriteText(w); err != nil {
			return err
		}
		fmt.Fprintln(w)
		for _, r := range res.Scenarios {
			fmt.Fprintf(w, "%s  %-34s %s\n", verdict(r), r.Series()+":", r.Expectation)
			fmt.Fprintf(w, "      %-34s %s\n", "", r.Outcome)
			for _, e := range r.Errors {
				fmt.Fprintf(w, "      %-34s error: %s\n", "", e)
			}
		}
		fmt.Fprintf(w, "\n%d passed, %d failed\n", res.Passed, res.Failed)
	}
	if res.Traffic != nil {
		fmt.Fprintln(w)
		writeTraffic(w, res.Traffic)
	}
	if res.Sweep != nil {
		fmt.Fprintln(w)
		if err := res.Sweep.Table().WriteText(w); err != nil {
			return err
		}
	}
	if res.Mode == "sim" && res.SimulatedRequests > 0 {
		fmt.Fprintf(w, "\nsimulated %s requests in %s of wall time\n", report.Int(int64(res.SimulatedRequests)), report.Seconds(res.WallSeconds))
	}
	report.WriteWarnings(w, res.Warnings)
	return nil
}

// writeTraffic says what the long simulated run did.
func writeTraffic(w io.Writer, t *leasesim.TrafficResult) {
	fmt.Fprintf(w, "traffic (virtual time): %s requests, policy %s, lease %s (timeout %s), reaper %s\n", report.Int(int64(t.SimulatedRequests)),
		t.Policy, report.Seconds(t.LeaseS), report.Seconds(t.TimeoutS), t.Reaper)
	fmt.Fprintf(w, "  simulated %s in %s of wall time (%s events)%s\n", report.Seconds(t.SimulatedSeconds), report.Seconds(t.WallSeconds),
		report.Int(t.Events), map[bool]string{true: ", STOPPED AT THE HORIZON", false: ""}[t.Truncated])
	fmt.Fprintf(w, "  completed %s, failed %s (recomputed %s), lost with a decode %s (%d crashes)\n", report.Int(int64(t.Completed)),
		report.Int(int64(t.Failed)), report.Int(int64(t.Recomputed)), report.Int(int64(t.Lost)), t.Crashes)
	fmt.Fprintf(w, "  leases expired %s, premature frees %s, expired but held (max) %d, dead KV %s GB·s\n", report.Int(int64(t.ExpiredLeases)),
		report.Int(int64(t.PrematureFrees)), t.MaxExpiredUnreleased, report.Float(t.DeadBlockGBs))
	fmt.Fprintf(w, "  reclaim (last heartbeat -> free) p50 %s p99 %s; crash -> free p50 %s p99 %s\n", report.Seconds(t.ReclaimLatencyS.P50),
		report.Seconds(t.ReclaimLatencyS.P99), report.Seconds(t.DeathToFreeS.P50), report.Seconds(t.DeathToFreeS.P99))
	fmt.Fprintf(w, "  heartbeats %s sent, %s lost: %s msg/s, %s B/s; queue wait mean %s, max %s\n", report.Int(t.HeartbeatsSent),
		report.Int(t.HeartbeatsLost), report.Float(t.HeartbeatMsgsPerS), report.Float(t.HeartbeatBytesPerS),
		report.Seconds(t.MeanQueueWaitS), report.Seconds(t.MaxQueueWaitS))
}

func verdict(r leasesim.ScenarioResult) string {
	if r.Passed {
		return "PASS"
	}
	return "FAIL"
}

func leaseHeadline(res *LeaseChaosResult) string {
	var parts []string
	if res.Mode == "real" {
		parts = append(parts, fmt.Sprintf("real prefill and decode processes, %s over %s (%s)", res.Protocol, res.Env.Backend, res.Env.BackendVersion))
	} else {
		parts = append(parts, "virtual-time simulation of the same state machines")
	}
	parts = append(parts, fmt.Sprintf("%s, %v tokens a request", res.Model, res.Config.ISL))
	if len(res.Scenarios) > 0 {
		r := res.Scenarios[0]
		// The lease policy's numbers, also when only the fixed policy ran.
		parts = append(parts, fmt.Sprintf("lease %s (heartbeat every %s, extension %s), fixed timeout %s, reaper %s",
			report.Seconds(r.LeaseS), report.Seconds(r.LeaseS/6), report.Seconds(r.LeaseS*2/3), report.Seconds(r.TimeoutS), r.Reaper))
	}
	return strings.Join(parts, "; ")
}

func leaseTable(res *LeaseChaosResult) *report.Table {
	t := &report.Table{Columns: []report.Column{{Name: "scenario"}, {Name: "policy"}, {Name: "result"}, {Name: "done", Align: report.Right},
		{Name: "expired", Align: report.Right}, {Name: "premature", Align: report.Right}, {Name: "caught", Align: report.Right},
		{Name: "expired held", Align: report.Right}, {Name: "dead GB·s", Align: report.Right}, {Name: "reclaim p50", Align: report.Right},
		{Name: "reclaim p99", Align: report.Right}, {Name: "fault->free max", Align: report.Right}, {Name: "max queue wait", Align: report.Right},
		{Name: "heartbeats sent/lost/applied", Align: report.Right}}}
	sec := func(p report.Percentiles, v float64) string {
		if p.Count == 0 {
			return "-"
		}
		return report.Seconds(v)
	}
	for _, r := range res.Scenarios {
		pol := r.Policy
		if r.Reaper == "head-only" {
			pol += " (head-only)"
		}
		t.AddRow(r.Scenario, pol, verdict(r), fmt.Sprintf("%d/%d", r.Completed, r.Requests), fmt.Sprint(r.ExpiredLeases),
			fmt.Sprint(r.PrematureFrees), fmt.Sprint(r.LateReadsDetected), fmt.Sprint(r.ExpiredUnreleased),
			report.Float(r.DeadBlockGBs), sec(r.ReclaimLatencyS, r.ReclaimLatencyS.P50), sec(r.ReclaimLatencyS, r.ReclaimLatencyS.P99),
			sec(r.DeathToFreeS, r.DeathToFreeS.Max), report.Seconds(r.MaxQueueWaitS),
			fmt.Sprintf("%d/%d/%d", r.HeartbeatsSent, r.HeartbeatsLost, r.HeartbeatsRecvd))
	}
	return t
}

// WriteCSV writes a row per scenario and policy.
func (res *LeaseChaosResult) WriteCSV(w io.Writer) error {
	t := &report.Table{}
	for _, c := range []string{"mode", "scenario", "policy", "reaper", "passed", "requests", "completed", "failed", "recomputed", "aborted",
		"lost", "expired_leases", "premature_frees", "late_reads_detected", "corrupt_accepted", "expired_unreleased", "dead_block_gb_s",
		"reclaim_latency_s_p50", "reclaim_latency_s_p99", "death_to_free_s_max", "max_queue_wait_s", "heartbeats_sent",
		"heartbeats_lost", "heartbeats_received", "leaked_blocks", "lease_s", "timeout_s", "seconds", "expectation"} {
		t.Columns = append(t.Columns, report.Column{Name: c})
	}
	g := func(x float64) string { return fmt.Sprintf("%.6g", x) }
	for _, r := range res.Scenarios {
		t.AddRow(r.Mode, r.Scenario, r.Policy, r.Reaper, fmt.Sprint(r.Passed), fmt.Sprint(r.Requests), fmt.Sprint(r.Completed),
			fmt.Sprint(r.Failed), fmt.Sprint(r.Recomputed), fmt.Sprint(r.Aborted), fmt.Sprint(r.Lost), fmt.Sprint(r.ExpiredLeases),
			fmt.Sprint(r.PrematureFrees), fmt.Sprint(r.LateReadsDetected), fmt.Sprint(r.CorruptAccepted), fmt.Sprint(r.ExpiredUnreleased),
			g(r.DeadBlockGBs), g(r.ReclaimLatencyS.P50), g(r.ReclaimLatencyS.P99), g(r.DeathToFreeS.Max), g(r.MaxQueueWaitS),
			fmt.Sprint(r.HeartbeatsSent), fmt.Sprint(r.HeartbeatsLost), fmt.Sprint(r.HeartbeatsRecvd), fmt.Sprint(r.LeakedBlocks),
			g(r.LeaseS), g(r.TimeoutS), g(r.Seconds), r.Expectation)
	}
	return t.WriteCSV(w)
}
