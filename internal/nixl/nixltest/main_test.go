package nixltest

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"testing"

	"github.com/nixlctl/nixlctl/internal/ctl"
	"github.com/nixlctl/nixlctl/internal/xfertarget"
)

func TestMain(m *testing.M) {
	if os.Getenv("NIXLTEST_TARGET") == "1" {
		log := slog.New(slog.NewTextHandler(os.Stderr, nil))
		if err := ctl.ServeStdio(context.Background(), xfertarget.Role(log)); err != nil {
			fmt.Fprintln(os.Stderr, "target:", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}
