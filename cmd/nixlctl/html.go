package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/spf13/cobra"

	"github.com/nixlctl/nixlctl/internal/errkind"
	"github.com/nixlctl/nixlctl/internal/htmlreport"
)

// checkHTMLFile refuses, before any measuring, an --html path that is not
// an .html file or cannot be written.
func checkHTMLFile(flag, path, saveDir string) error {
	switch strings.ToLower(filepath.Ext(path)) {
	case ".html", ".htm":
	default:
		return errkind.BadInputf("--%s %s: want an .html file", flag, path)
	}
	return checkOutputFile(flag, path, saveDir)
}

// writePage renders the page in memory first, so a failure leaves no
// half-written file.
func writePage(flag, path string, p *htmlreport.Page) error {
	var b bytes.Buffer
	if err := p.Write(&b); err != nil {
		return fmt.Errorf("--%s %s: %w", flag, path, err)
	}
	if err := os.WriteFile(path, b.Bytes(), 0o644); err != nil {
		return fmt.Errorf("--%s %s: %w", flag, path, err)
	}
	return nil
}

type reportHTMLOptions struct {
	Out     string   `mapstructure:"out"`
	Metrics []string `mapstructure:"metric"`
}

const reportHTMLLong = `Write saved results as one self-contained HTML page to share: it loads
nothing (its style, script and charts are inside the file), so it opens offline
and from a CI artifact, and it prints.

One RESULT (a file written with -o json, or a --save directory) gives that
run's page: its header (command, versions, the backend and transport actually
used, placement) with its warnings first, then what its kind measured:
bench pull|push|sglang: the latency of each stage as CDFs (log scale when the
values span more than a decade) and a histogram, GB/s over time, the per-pair
matrices of an xPyD run, and failures by reason with an example each;
bench xfer: bandwidth, efficiency and latency against block size per batch,
with the reference copy dashed; probe ucx-leak: RSS over time per
configuration with its fitted line and verdict; lease-chaos: the scenario table,
the simulator's sweep (dead GB·s and premature frees against the lease) and
the lease timelines. Every page ends with all of the result's metrics.

Two or more RESULTs give the page of report compare: the runs' headers, each
metric side by side with its change and noise test, and each metric's runs as
points (every run of a --repeat result), as report compare --html does;
gate --html writes the gate's page.

The page is drawn from the result's data, its records included when the
result links a records file that is present (as report show reads them);
nothing is run again. Hover a point or bar for its values; click a legend
entry to hide or show its series. The page goes to stdout unless --out names
a file.`

func newReportHTMLCmd(a *app) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "html RESULT [RESULT...]",
		Short: "Write results as one self-contained HTML page (charts, tables, warnings)",
		Long:  reportHTMLLong,
		Example: `  nixlctl report html run1/ --out run1.html
  nixlctl report html push-a/ push-b/ --metric efficiency_vs_memcpy --out compare.html`,
		Args: func(_ *cobra.Command, args []string) error {
			if len(args) < 1 {
				return errkind.BadInputf("report html needs one result, or several to compare (got none)")
			}
			return nil
		},
		RunE: boundArgs(a.runReportHTML),
	}
	cmd.Flags().String("out", "", "write the page to this .html file (default: stdout)")
	cmd.Flags().StringArray("metric", nil, "with several results: compare only this metric key (repeatable)")
	return cmd
}

func (a *app) runReportHTML(_ context.Context, paths []string, o reportHTMLOptions) error {
	if o.Out != "" {
		if err := checkHTMLFile("out", o.Out, ""); err != nil {
			return err
		}
	}
	if len(paths) == 1 && len(o.Metrics) > 0 {
		return errkind.BadInputf("--metric selects metrics to compare: give two results or more")
	}
	results, err := loadResults(a, paths)
	if err != nil {
		return err
	}
	var page *htmlreport.Page
	if len(results) == 1 {
		page, err = htmlreport.Build(results[0], version)
	} else {
		page, err = htmlreport.BuildCompare(runLabels(paths), results, o.Metrics, version)
		if err != nil {
			err = errkind.BadInput(err)
		}
	}
	if err != nil {
		return err
	}
	if o.Out == "" {
		return page.Write(a.io.Out)
	}
	return writePage("out", o.Out, page)
}
