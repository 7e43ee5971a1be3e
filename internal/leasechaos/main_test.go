package leasechaos

import (
	"errors"
	"log/slog"
	"os"
	"slices"
	"testing"

	"github.com/nixlctl/nixlctl/internal/ctl"
	"github.com/nixlctl/nixlctl/internal/engine"
	_ "github.com/nixlctl/nixlctl/internal/nixl/ucx"
	"github.com/nixlctl/nixlctl/internal/runcore/runcoretest"
)

// TestMain lets this test binary double as lease-chaos's prefill and
// decode (serve's arguments: ROLE --stdio).
func TestMain(m *testing.M) {
	runcoretest.ServeChildIfAsked(func(args []string, log *slog.Logger) (ctl.Role, error) {
		if i := slices.Index(args, "--stdio"); i < 1 || !slices.Contains([]string{"prefill", "decode"}, args[i-1]) {
			return nil, errors.New("want serve's arguments ROLE --stdio")
		}
		return engine.EndpointRole(log, engine.SideChannelHost{}), nil
	})
	os.Exit(m.Run())
}
