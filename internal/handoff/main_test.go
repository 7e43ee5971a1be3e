package handoff

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/nixlctl/nixlctl/internal/ctl"
	"github.com/nixlctl/nixlctl/internal/engine"
	"github.com/nixlctl/nixlctl/internal/nixl/cuda/cudatest"
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

// ISLDist parses itself, naming the valid values
// when they cannot.
func TestISLDistParses(t *testing.T) {
	for _, tc := range []struct {
		dst     interface{ UnmarshalText([]byte) error }
		in      string
		want    any
		wantErr string
	}{
		{new(ISLDist), "normal", ISLNormal, ""},
		{new(ISLDist), "trace", ISLTrace, ""},
		{new(ISLDist), "Fixed", nil, "fixed, uniform, normal, trace"},
		{new(ISLDist), "", nil, "fixed, uniform, normal, trace"},
	} {
		err := tc.dst.UnmarshalText([]byte(tc.in))
		if tc.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) || !strings.Contains(err.Error(), fmt.Sprintf("%q", tc.in)) {
				t.Errorf("%T %q: %v, want an error naming %s", tc.dst, tc.in, err, tc.wantErr)
			}
			continue
		}
		got := reflect.ValueOf(tc.dst).Elem().Interface()
		if err != nil || got != tc.want {
			t.Errorf("%T %q: %v, %v; want %v", tc.dst, tc.in, got, err, tc.want)
		}
	}
}
