package probe

import (
	"fmt"
	"io"
	"strings"

	"github.com/nixlctl/nixlctl/internal/report"
)

// WriteText renders a `probe ucx-leak` result with a row per
// configuration; JSON is the result itself (samples included).
func (res *LeakResult) WriteText(w io.Writer) error {
	c := res.Config
	plural := "s"
	if len(res.Configs) == 1 {
		plural = ""
	}
	fmt.Fprintf(w, "probe ucx-leak: %d configuration%s on libucp %s; the receiver sampled every %s for %s (first %gs warm-up)\n",
		len(res.Configs), plural, c.UCXLibrary, report.Seconds(c.IntervalS), report.Seconds(c.DurationS), res.Thresholds.WarmupS)
	fmt.Fprintf(w, "traffic: %s, %d tokens per request: %s descriptors, %s per request, %s requests a second\n",
		c.Model, c.Tokens, report.Int(int64(c.DescriptorsPerRequest)), report.Bytes(c.BytesPerRequest), rateLabel(c.Rate))
	seen := map[string]bool{}
	for _, cr := range res.Configs {
		if cr.Transport != "" && !seen[cr.Backend+cr.Transport] {
			seen[cr.Backend+cr.Transport] = true
			fmt.Fprintf(w, "transport (%s): %s\n", cr.Backend, cr.Transport)
		}
	}
	fmt.Fprintln(w)
	if err := leakTable(res).WriteText(w); err != nil {
		return err
	}
	fmt.Fprintln(w)
	for i, cr := range res.Configs {
		fmt.Fprintf(w, "%d. %s %s: %s: %s\n", i+1, cr.Backend, cr.Label, cr.Verdict, cr.Reason)
	}
	fmt.Fprintf(w, "\nRecommendation: %s\n", res.Recommendation)
	if len(res.Notes) > 0 {
		fmt.Fprintln(w)
		for _, n := range res.Notes {
			fmt.Fprintf(w, "note: %s\n", n)
		}
	}
	report.WriteWarnings(w, res.Warnings)
	return nil
}

// axisValue is a configuration's value of one matrix variable, with the
// library's own value for "default" when it is known.
func axisValue(res *LeakResult, cr ConfigResult, key string) string {
	if v, ok := cr.Env[key]; ok {
		return v
	}
	if d, ok := res.Config.LibraryDefaults[key]; ok {
		return "default (" + d + ")"
	}
	return "default"
}

func leakTable(res *LeakResult) *report.Table {
	t := &report.Table{Columns: []report.Column{{Name: "#", Align: report.Right}, {Name: "Backend"}}}
	for _, a := range res.Config.Matrix {
		t.Columns = append(t.Columns, report.Column{Name: a.Key})
	}
	for _, c := range []string{"Verdict", "Slope (MB/min)", "R²", "RSS growth (MB)", "VmData Δ (MB)", "Maps Δ", "FDs Δ", "Requests", "Samples"} {
		al := report.Right
		if c == "Verdict" {
			al = report.Left
		}
		t.Columns = append(t.Columns, report.Column{Name: c, Align: al})
	}
	for i, cr := range res.Configs {
		row := []string{fmt.Sprint(i + 1), cr.Backend}
		for _, a := range res.Config.Matrix {
			if cr.Verdict == Skipped {
				row = append(row, "-")
				continue
			}
			row = append(row, axisValue(res, cr, a.Key))
		}
		if cr.Verdict == Skipped || (cr.Verdict == Failed && len(cr.Samples) == 0) {
			row = append(row, cr.Verdict)
			t.AddRow(row...)
			continue
		}
		row = append(row, cr.Verdict, fmt.Sprintf("%.2f", cr.SlopeMBPerMin), fmt.Sprintf("%.2f", cr.R2), fmt.Sprintf("%.2f", cr.GrowthMB),
			fmt.Sprintf("%.1f", cr.VmDataGrowthMB), fmt.Sprintf("%+d", cr.MapsGrowth), fmt.Sprintf("%+d", cr.FDsGrowth),
			report.Int(cr.Sender.Requests), fmt.Sprint(len(cr.Samples)))
		t.AddRow(row...)
	}
	return t
}

// WriteMarkdown is the text's table alone.
func (res *LeakResult) WriteMarkdown(w io.Writer) error { return leakTable(res).WriteMarkdown(w) }

// WriteCSV writes a row per configuration.
func (res *LeakResult) WriteCSV(w io.Writer) error {
	t := &report.Table{}
	cols := []string{"config", "backend"}
	for _, a := range res.Config.Matrix {
		cols = append(cols, a.Key)
	}
	cols = append(cols, "verdict", "slope_mb_per_min", "r2", "growth_mb", "vmdata_growth_mb", "maps_growth", "fds_growth",
		"requests", "bytes", "transfer_errors", "churn_ops", "samples", "transport", "reason")
	for _, c := range cols {
		t.Columns = append(t.Columns, report.Column{Name: c})
	}
	g := func(x float64) string { return fmt.Sprintf("%.6g", x) }
	for i, cr := range res.Configs {
		row := []string{fmt.Sprint(i + 1), cr.Backend}
		for _, a := range res.Config.Matrix {
			v, ok := cr.Env[a.Key]
			switch {
			case cr.Verdict == Skipped:
				v = ""
			case !ok:
				v = "default"
			}
			row = append(row, v)
		}
		row = append(row, cr.Verdict, g(cr.SlopeMBPerMin), g(cr.R2), g(cr.GrowthMB), g(cr.VmDataGrowthMB), fmt.Sprint(cr.MapsGrowth),
			fmt.Sprint(cr.FDsGrowth), fmt.Sprint(cr.Sender.Requests), fmt.Sprint(cr.Sender.Bytes), fmt.Sprint(cr.Sender.Errors),
			fmt.Sprint(cr.Receiver.ChurnOps), fmt.Sprint(len(cr.Samples)), cr.Transport, strings.ReplaceAll(cr.Reason, "\n", " "))
		t.AddRow(row...)
	}
	return t.WriteCSV(w)
}
