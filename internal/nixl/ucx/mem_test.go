package ucx

import (
	"errors"
	"strings"
	"testing"

	"github.com/nixlctl/nixlctl/internal/nixl"
)

// Debian's UCX has no CUDA transports: VRAM is refused up front with an
// error callers can test for and a way out in the text.
func TestVRAMRefused(t *testing.T) {
	a, err := New(nixl.Config{Name: "vram"})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	vram := nixl.NewBuffer(1<<40, 4096, nixl.VRAM, 0, "cuda", nil, nil) // never dereferenced
	if err := a.RegisterMem(vram); !errors.Is(err, nixl.ErrMemType) || !strings.Contains(err.Error(), "--backend cuda-ipc") {
		t.Errorf("register VRAM: %v", err)
	}
	if _, err := a.(nixl.Allocator).AllocMem(4096, nixl.VRAM); !errors.Is(err, nixl.ErrMemType) {
		t.Errorf("allocate VRAM: %v", err)
	}
}
