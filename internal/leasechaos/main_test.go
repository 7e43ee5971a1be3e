package leasechaos

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"testing"

	"github.com/nixlctl/nixlctl/internal/ctl"
	"github.com/nixlctl/nixlctl/internal/engine"
	"github.com/nixlctl/nixlctl/internal/kv"
	_ "github.com/nixlctl/nixlctl/internal/nixl/ucx"
)

// TestMain lets this test binary double as lease-chaos's prefill and
// decode (NIXLCTL_BENCH_TEST_CHILD=1 with serve's arguments: ROLE --stdio).
func TestMain(m *testing.M) {
	if os.Getenv("NIXLCTL_BENCH_TEST_CHILD") == "1" {
		log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelError}))
		if i := slices.Index(os.Args, "--stdio"); i < 1 || !slices.Contains([]string{"prefill", "decode"}, os.Args[i-1]) {
			fmt.Fprintf(os.Stderr, "child: want serve's arguments ROLE --stdio, got %q\n", os.Args[1:])
			os.Exit(2)
		}
		if err := ctl.ServeStdio(context.Background(), engine.EndpointRole(log, engine.SideChannelHost{})); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// smallModel is llama-3.1-8b cut to four layers: real shapes, small pools.
func smallModel(t *testing.T) kv.Model {
	t.Helper()
	m, err := kv.Preset("llama-3.1-8b")
	if err != nil {
		t.Fatal(err)
	}
	m.NumLayers = 4
	return m
}
