package probe

import (
	"fmt"
	"io"

	"github.com/nixlctl/nixlctl/internal/report"
)

// probe ucx-leak is a result kind like the benchmarks': --save, report
// show|compare, gate (a configuration that turns LEAK is a regression)
// and --plot (RSS over time per configuration with its fitted line).

func init() {
	report.RegisterKind(func() report.Result { return new(LeakResult) }, "probe ucx-leak")
}

// Render implements report.Result.
func (res *LeakResult) Render(w io.Writer, f report.Format) error { return report.Write(w, f, res) }

// Series names a configuration: "ucx UCX_MEM_MMAP_HOOK_MODE=none".
func (cr ConfigResult) Series() string { return cr.Backend + " " + cr.Label }

// Metrics implements report.Result. Per configuration that ran: "leak",
// 1 when the verdict is LEAK, else 0 (Stable, so gate compares it by
// default: from 0 to 1 is a regression whatever the allowance), and the
// fitted RSS slope and growth.
func (res *LeakResult) Metrics() []report.Metric {
	var out []report.Metric
	for _, cr := range res.Configs {
		if cr.Verdict == Skipped || cr.Verdict == Failed {
			continue
		}
		leak := 0.0
		if cr.Verdict == Leak {
			leak = 1
		}
		out = append(out,
			report.Metric{Key: "leak", Series: cr.Series(), Value: leak, Better: report.LowerIsBetter, Stable: true},
			report.Metric{Key: "slope_mb_per_min", Series: cr.Series(), Value: cr.SlopeMBPerMin, Unit: "MB/min", Better: report.LowerIsBetter},
			report.Metric{Key: "growth_mb", Series: cr.Series(), Value: cr.GrowthMB, Unit: "MB", Better: report.LowerIsBetter},
		)
	}
	return out
}

// Problems implements report.HealthReporter: a configuration that could
// not run to the end, or an interrupted probe. A LEAK verdict is what the
// probe found, not a failure of the run (the gate judges it).
func (res *LeakResult) Problems() []string {
	var p []string
	for _, cr := range res.Configs {
		if cr.Verdict == Failed && !cr.Interrupted {
			p = append(p, fmt.Sprintf("%s did not run to the end: %s", cr.Series(), cr.Error))
		}
	}
	if res.Interrupted {
		p = append(p, "interrupted")
	}
	return p
}

// Figure implements report.Plottable: the receiver's RSS over time, one
// line per configuration, with its fitted line dashed in the same colour
// over the fitted window.
func (res *LeakResult) Figure() (report.Figure, error) {
	p := report.Panel{Title: "receiver RSS", XLabel: "seconds", YLabel: "RSS (MB)"}
	n := 0
	for _, cr := range res.Configs {
		if len(cr.Samples) == 0 {
			continue
		}
		n++
		l := report.Line{Label: fmt.Sprintf("%s: %s", cr.Series(), cr.Verdict), Color: n}
		for _, s := range cr.Samples {
			l.X = append(l.X, s.T)
			l.Y = append(l.Y, float64(s.RSS)/MB)
		}
		p.Lines = append(p.Lines, l)
		if f := cr.RSSFit; f.Samples >= 2 {
			y := func(t float64) float64 { return f.Intercept + f.Slope*t/60 }
			p.Lines = append(p.Lines, report.Line{Label: fmt.Sprintf("fit %+.2f MB/min (R² %.2f)", cr.SlopeMBPerMin, cr.R2),
				X: []float64{f.FromS, f.ToS}, Y: []float64{y(f.FromS), y(f.ToS)}, Style: report.Dashed, Color: n})
		}
	}
	if n == 0 {
		return report.Figure{}, fmt.Errorf("no configuration has samples to plot")
	}
	return report.Figure{Title: "probe ucx-leak", Panels: []report.Panel{p}}, nil
}
