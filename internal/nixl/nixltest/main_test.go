package nixltest

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"testing"

	"github.com/nixlctl/nixlctl/internal/engine"
	"github.com/nixlctl/nixlctl/internal/nixl/cuda/cudatest"
)

func TestMain(m *testing.M) {
	if os.Getenv("NIXLTEST_TARGET") == "1" {
		log := slog.New(slog.NewTextHandler(os.Stderr, nil))
		if err := engine.ServeXferTarget(context.Background(), os.Stdin, os.Stdout, log); err != nil {
			fmt.Fprintln(os.Stderr, "target:", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	// The target children inherit the CUDA driver chosen here (the fake on
	// machines without a GPU), through the environment.
	_, cleanup, err := cudatest.Setup()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	code := m.Run()
	cleanup()
	os.Exit(code)
}
