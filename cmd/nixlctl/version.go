package main

import (
	"fmt"
	"io"
	"runtime"

	"github.com/spf13/cobra"

	"github.com/nixlctl/nixlctl/internal/report"
)

// versionInfo writes every -o format, as every other command: -o csv or
// prom printed the table's plain line, which no CSV reader or Prometheus
// scrape parses.
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
			return report.Write(a.io.Out, a.format, versionInfo{Nixlctl: version, Go: runtime.Version(), OS: runtime.GOOS, Arch: runtime.GOARCH})
		},
	}
}

func (v versionInfo) WriteText(w io.Writer) error { return v.line(w, "nixlctl %s (%s, %s/%s)\n") }

func (v versionInfo) WriteCSV(w io.Writer) error {
	return v.line(w, "nixlctl,go,os,arch\n%s,%s,%s,%s\n")
}

func (v versionInfo) WriteMarkdown(w io.Writer) error {
	return v.line(w, "| nixlctl | go | os | arch |\n|---|---|---|---|\n| %s | %s | %s | %s |\n")
}

// WriteProm is the usual build-info gauge: always 1, the facts as labels.
func (v versionInfo) WriteProm(w io.Writer) error {
	return v.line(w, "# HELP nixlctl_build_info nixlctl's version and toolchain.\n# TYPE nixlctl_build_info gauge\nnixlctl_build_info{version=%q,go=%q,os=%q,arch=%q} 1\n")
}

func (v versionInfo) line(w io.Writer, format string) error {
	_, err := fmt.Fprintf(w, format, v.Nixlctl, v.Go, v.OS, v.Arch)
	return err
}
