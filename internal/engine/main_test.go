package engine

import (
	"fmt"
	"os"
	"testing"

	"github.com/nixlctl/nixlctl/internal/nixl/cuda/cudatest"
)

func TestMain(m *testing.M) {
	_, cleanup, err := cudatest.Setup()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	code := m.Run()
	cleanup()
	os.Exit(code)
}
