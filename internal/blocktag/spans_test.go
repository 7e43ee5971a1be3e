package blocktag

import (
	"strings"
	"testing"

	"github.com/nixlctl/nixlctl/internal/nixl"
	"github.com/nixlctl/nixlctl/internal/nixl/cuda"
	"github.com/nixlctl/nixlctl/internal/nixl/cuda/cudatest"
)

// The CUDA driver for these tests (the fake one on machines without a GPU),
// chosen before any test runs.
var _ = cudatest.MustSetup()

// The same calls tag and verify host and device memory; a block written
// to the wrong place is caught either way. Not parallel: it lowers the
// package's stageLimit.
func TestSpanTags(t *testing.T) {
	allocs := map[string]func(size int) (*nixl.Buffer, error){
		"DRAM": func(size int) (*nixl.Buffer, error) { return nixl.AllocDRAM(size, false) },
		"VRAM": func(size int) (*nixl.Buffer, error) { return cuda.Alloc(0, size) },
	}
	for _, mem := range []string{"DRAM", "VRAM"} {
		t.Run(mem, func(t *testing.T) {
			if mem == "VRAM" {
				cudatest.Require(t)
			}
			old := stageLimit
			stageLimit = 10000 // several staged chunks, and spans larger than one
			defer func() { stageLimit = old }()
			const size = 1 << 20
			b, err := allocs[mem](size)
			if err != nil {
				t.Fatal(err)
			}
			defer b.Free()
			spans := []nixl.Span{{Off: 0, Len: 4096}, {Off: 65536, Len: 30000}, {Off: 8192, Len: 4096}, {Off: size - 5, Len: 5}, {Off: 12288, Len: 4096}}
			key := func(i int) uint64 { return Key(5, uint64(i)) }
			if err := FillSpans(b, spans, key); err != nil {
				t.Fatal(err)
			}
			c, err := CheckSpans(b, spans, key)
			if err != nil || c.Bad != 0 {
				t.Fatalf("%+v %v", c, err)
			}
			// Swap two spans' contents: both are misplaced blocks now.
			swapped := []nixl.Span{spans[2], spans[4]}
			if err := FillSpans(b, swapped, func(i int) uint64 { return key(4 - 2*i) }); err != nil {
				t.Fatal(err)
			}
			c, err = CheckSpans(b, spans, key)
			if err != nil || c.Bad != 2 || !strings.HasPrefix(c.First, "span 2 at offset 8192: tag mismatch at byte 0") {
				t.Fatalf("after a swap: %+v %v", c, err)
			}
			if err := FillSpans(b, []nixl.Span{{Off: size - 4, Len: 8}}, key); err == nil {
				t.Error("a span past the end was filled")
			}
			if _, err := CheckSpans(b, []nixl.Span{{Off: -1, Len: 1}}, key); err == nil {
				t.Error("a negative offset was checked")
			}
		})
	}
}

func TestAllocSeg(t *testing.T) {
	t.Parallel()
	b, err := cuda.AllocSeg(nil, nixl.DRAM, 0, 4096, "mmap", false)
	if err != nil || b.Mem != nixl.DRAM || b.Alloc != "mmap" {
		t.Fatalf("%+v %v", b, err)
	}
	b.Free()
	v, err := cuda.AllocSeg(nil, nixl.VRAM, 0, 4096, "", false)
	if ok, why := cuda.Available(); !ok {
		if err == nil || !strings.Contains(err.Error(), why) {
			t.Fatalf("VRAM without a driver: %v (want the reason %q)", err, why)
		}
		return
	}
	if err != nil || v.Mem != nixl.VRAM || v.Alloc != "cuda" {
		t.Fatalf("%+v %v", v, err)
	}
	v.Free()
}
