package main

import (
	"fmt"
	"io"
	"runtime"

	"github.com/spf13/cobra"

	"github.com/nixlctl/nixlctl/internal/report"
)

type versionInfo struct {
	Nixlctl string `json:"nixlctl"`
	Go      string `json:"go"`
	OS      string `json:"os"`
	Arch    string `json:"arch"`
}

func newVersionCmd(a *app) *cobra.Command {
	return &cobra.Command{
		Use:   "version",
		Short: "Print nixlctl's version",
		Long:  "Print the nixlctl version and the Go toolchain it was built with.",
		Args:  cobra.NoArgs,
		RunE: func(*cobra.Command, []string) error {
			v := versionInfo{Nixlctl: version, Go: runtime.Version(), OS: runtime.GOOS, Arch: runtime.GOARCH}
			// Every -o format, as every other command: -o csv or prom
			// printed the table's plain line, which no CSV reader or
			// Prometheus scrape parses.
			line := func(format string) func(io.Writer) error {
				return func(w io.Writer) error {
					_, err := fmt.Fprintf(w, format, v.Nixlctl, v.Go, v.OS, v.Arch)
					return err
				}
			}
			return report.Render(a.io.Out, a.format, report.Renderings{
				JSON:     v,
				CSV:      line("nixlctl,go,os,arch\n%s,%s,%s,%s\n"),
				Markdown: line("| nixlctl | go | os | arch |\n|---|---|---|---|\n| %s | %s | %s | %s |\n"),
				// The usual build-info gauge: always 1, the facts as labels.
				Prom: line("# HELP nixlctl_build_info nixlctl's version and toolchain.\n# TYPE nixlctl_build_info gauge\nnixlctl_build_info{version=%q,go=%q,os=%q,arch=%q} 1\n"),
				Text: line("nixlctl %s (%s, %s/%s)\n"),
			})
		},
	}
}
