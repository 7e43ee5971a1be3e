package main

import (
	"fmt"
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
			if a.format == report.FormatJSON {
				return report.WriteJSON(a.io.Out, v)
			}
			_, err := fmt.Fprintf(a.io.Out, "nixlctl %s (%s, %s/%s)\n", v.Nixlctl, v.Go, v.OS, v.Arch)
			return err
		},
	}
}
