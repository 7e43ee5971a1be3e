package main

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"

	"github.com/spf13/cobra"

	"github.com/nixlctl/nixlctl/internal/errkind"
	"github.com/nixlctl/nixlctl/internal/htmlreport"
	"github.com/nixlctl/nixlctl/internal/plots"
	"github.com/nixlctl/nixlctl/internal/report"
)

func newReportCmd(a *app) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "report",
		Short: "Show and compare saved results",
		Long: `Read results that measuring commands wrote (-o json > FILE, or --save DIR) and
render them again, or lay several side by side. See docs/reports.md.`,
	}
	cmd.AddCommand(newReportShowCmd(a), newReportCompareCmd(a), newReportHTMLCmd(a))
	return cmd
}

type reportShowOptions struct {
	Plot string `mapstructure:"plot"`
}

func newReportShowCmd(a *app) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "show FILE|DIR",
		Short: "Render a saved result as a table, JSON, CSV, Markdown, prom or a plot",
		Long: `Render a saved result again in any output format (-o table|json|csv|markdown|prom)
and, with --plot, draw it. FILE is a result written with -o json; DIR one written
with --save. When the result links a records file that is present, the summary
is recomputed from the records (so an edited or filtered records file gives its
own summary); a missing records file leaves the stored summary as it was.
The directory of a --save run that was killed holds the provisional result
written when it started and the records it streamed until then: it shows as a
partial run ("partial": true), recomputed from those records, a last line cut
mid-way skipped.`,
		Example: `  nixlctl report show run1/
  nixlctl report show result.json -o markdown
  nixlctl report show run1/ --plot latency.svg -o prom`,
		Args: exactArgs(1, "report show needs one result file or directory"),
		RunE: boundArgs(func(ctx context.Context, args []string, o reportShowOptions) error {
			return runReportShow(ctx, a, args[0], o)
		}),
	}
	cmd.Flags().String("plot", "", "draw the result into this .png or .svg file")
	return cmd
}

// exactArgs is cobra.ExactArgs with a message of our own, marked as bad
// input.
func exactArgs(n int, msg string) cobra.PositionalArgs {
	return func(_ *cobra.Command, args []string) error {
		if len(args) != n {
			return errkind.BadInputf("%s (got %d arguments)", msg, len(args))
		}
		return nil
	}
}

func loadResult(path string) (*report.Loaded, error) {
	l, err := report.Load(path)
	if err != nil {
		return nil, errkind.BadInput(err)
	}
	return l, nil
}

// loadResults loads several results (report compare, report html),
// saying each one's notes with its path.
func loadResults(a *app, paths []string) ([]report.Result, error) {
	var results []report.Result
	for _, p := range paths {
		l, err := loadResult(p)
		if err != nil {
			return nil, err
		}
		for _, n := range l.Notes {
			fmt.Fprintf(a.io.ErrOut, "note: %s: %s\n", p, n)
		}
		results = append(results, l.Result)
	}
	return results, nil
}

func runReportShow(_ context.Context, a *app, path string, o reportShowOptions) error {
	if o.Plot != "" {
		if _, err := plots.FormatOf(o.Plot); err != nil {
			return errkind.BadInput(err)
		}
		if err := checkOutputFile("plot", o.Plot, ""); err != nil {
			return err
		}
	}
	l, err := loadResult(path)
	if err != nil {
		return err
	}
	for _, n := range l.Notes {
		fmt.Fprintf(a.io.ErrOut, "note: %s\n", n)
	}
	// What the gate would refuse it for, said here too: a result with
	// nothing measured rendered as a quiet run of zeros.
	for _, p := range report.Problems(l.Result) {
		fmt.Fprintf(a.io.ErrOut, "note: the run had a problem: %s\n", p)
	}
	if l.FromRecords {
		a.log.Info("summary recomputed from the records", "records", l.Result.Header().RecordsFile.Path)
	}
	if o.Plot != "" {
		pl, ok := l.Result.(report.Plottable)
		if !ok {
			return errkind.BadInputf("--plot: %s results have nothing to plot", l.Result.Header().Command)
		}
		fig, err := pl.Figure()
		if err == nil {
			err = plots.Save(o.Plot, fig)
		}
		if err != nil {
			return fmt.Errorf("--plot %s: %w", o.Plot, err)
		}
	}
	return a.render(l.Result)
}

type reportCompareOptions struct {
	Metrics []string `mapstructure:"metric"`
	HTML    string   `mapstructure:"html"`
}

func newReportCompareCmd(a *app) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "compare A B [C...]",
		Short: "Lay results side by side with changes and a noise judgement",
		Long: `Lay two or more results of the same command side by side: every metric of the
first (or those named with --metric), its value in each result, the change
against the first, and a noise test on the latency histograms behind the metric:
a Mann-Whitney U test computed exactly on the histogram buckets, reporting
"slower" or "faster" only when p < 0.01 and Cliff's |delta| >= 0.147 (a change
that is both unlikely to be chance and not negligible), else "same". The test
sees the distribution of request latencies; a change in a ratio whose
distribution is "same" came from its reference (memcpy) or is noise.`,
		Example: `  nixlctl report compare base/ new/
  nixlctl report compare a.json b.json c.json --metric efficiency --metric latency_us.p99 -o markdown`,
		Args: func(_ *cobra.Command, args []string) error {
			if len(args) < 2 {
				return errkind.BadInputf("report compare needs at least two results (got %d)", len(args))
			}
			return nil
		},
		RunE: boundArgs(a.runReportCompare),
	}
	cmd.Flags().StringArray("metric", nil, "compare only this metric key (repeatable): efficiency, bandwidth_gbps, handoff_latency_ms.p99, ...")
	cmd.Flags().String("html", "", "also write the comparison as one self-contained HTML page (each metric's runs as points) to this .html file")
	return cmd
}

func (a *app) runReportCompare(_ context.Context, paths []string, o reportCompareOptions) error {
	if o.HTML != "" {
		if err := checkHTMLFile("html", o.HTML, ""); err != nil {
			return err
		}
	}
	results, err := loadResults(a, paths)
	if err != nil {
		return err
	}
	c, err := report.Compare(runLabels(paths), results, o.Metrics)
	if err != nil {
		return errkind.BadInput(err)
	}
	if err := c.Render(a.io.Out, a.format); err != nil {
		return errkind.BadInput(err)
	}
	if o.HTML != "" {
		page, err := htmlreport.BuildCompare(runLabels(paths), results, o.Metrics, version)
		if err != nil {
			return errkind.BadInput(err)
		}
		return writePage("html", o.HTML, page)
	}
	return nil
}

// runLabels names each result by its file or directory name, or by the
// path as given when those collide.
func runLabels(paths []string) []string {
	labels := make([]string, len(paths))
	seen := map[string]int{}
	for i, p := range paths {
		b := filepath.Base(strings.TrimSuffix(p, "/"))
		if b == "result.json" {
			b = filepath.Base(filepath.Dir(p))
		}
		labels[i] = b
		seen[b]++
	}
	for i, p := range paths {
		if seen[labels[i]] > 1 {
			labels[i] = p
		}
	}
	return labels
}
