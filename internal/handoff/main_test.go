package handoff

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"testing"

	"github.com/nixlctl/nixlctl/internal/ctl"
	"github.com/nixlctl/nixlctl/internal/engine"
	"github.com/nixlctl/nixlctl/internal/nixl/cuda/cudatest"
	"github.com/nixlctl/nixlctl/internal/runcore/runcoretest"
	"github.com/nixlctl/nixlctl/internal/xfertarget"
)

func TestMain(m *testing.M) {
	// This test binary doubles as the endpoint child processes: an xfer
	// target when "target" is among its arguments, else an engine endpoint.
	if os.Getenv("NIXLCTL_BENCH_TEST_CHILD") == "1" {
		log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelError}))
		role := engine.EndpointRole(log, engine.SideChannelHost{})
		if slices.Contains(os.Args, "target") {
			role = xfertarget.Role(log)
		}
		// The role comes before --stdio, as serve takes it.
		if i := slices.Index(os.Args, "--stdio"); i >= 0 && !slices.Contains([]string{"prefill", "decode", "target"}, os.Args[max(i-1, 0)]) {
			fmt.Fprintf(os.Stderr, "child: want serve's arguments ROLE --stdio, got %q\n", os.Args[1:])
			os.Exit(2)
		}
		if err := ctl.ServeStdio(context.Background(), role); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// The CUDA driver for the VRAM runs (the fake one on machines without a
// GPU), chosen before any test runs; target children inherit the choice.
var _ = cudatest.MustSetup()

// ISLDist parses itself, naming the valid values when it cannot.
func TestISLDistParses(t *testing.T) {
	runcoretest.CheckEnumParses(t, []runcoretest.EnumCase{
		{Dst: new(ISLDist), In: "normal", Want: ISLNormal},
		{Dst: new(ISLDist), In: "trace", Want: ISLTrace},
		{Dst: new(ISLDist), In: "Fixed", WantErr: "fixed, uniform, normal, trace"},
		{Dst: new(ISLDist), In: "", WantErr: "fixed, uniform, normal, trace"},
	})
}
