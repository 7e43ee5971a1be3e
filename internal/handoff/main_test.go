package handoff

import (
	"errors"
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

// TestMain lets this test binary double as the endpoint child processes:
// an xfer target when "target" is among its arguments, else an engine
// endpoint.
func TestMain(m *testing.M) {
	runcoretest.ServeChildIfAsked(func(args []string, log *slog.Logger) (ctl.Role, error) {
		if slices.Contains(args, "target") {
			return xfertarget.Role(log), nil
		}
		// The role comes before --stdio, as serve takes it.
		if i := slices.Index(args, "--stdio"); i >= 0 && !slices.Contains([]string{"prefill", "decode"}, args[max(i-1, 0)]) {
			return nil, errors.New("want serve's arguments ROLE --stdio")
		}
		return engine.EndpointRole(log, engine.SideChannelHost{}), nil
	})
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
