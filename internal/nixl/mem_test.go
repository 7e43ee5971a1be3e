package nixl

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// thp buffers are populated, writable, and say how much of them huge
// pages back; where the host turned THP off the error says so.
func TestAllocDRAMTHP(t *testing.T) {
	const size = 8 << 20
	b, err := AllocBuffer(nil, size, "thp", false)
	if mode, _ := THPMode(THPEnabledPath); mode == "never" {
		if err == nil || !strings.Contains(err.Error(), "never") {
			t.Fatalf("THP off: got %v, want an error naming it", err)
		}
		return
	}
	if err != nil {
		t.Fatal(err)
	}
	defer b.Free()
	data := b.Bytes()
	if len(data) != size || b.Mem != DRAM || !strings.HasPrefix(b.Alloc, "mmap+thp (") {
		t.Fatalf("buffer of %d bytes, %v, alloc %q", len(data), b.Mem, b.Alloc)
	}
	data[0], data[size-1] = 1, 2
	if data[0] != 1 || data[size-1] != 2 {
		t.Fatal("the buffer did not keep what was written")
	}
}

func TestTHPModeAndSmaps(t *testing.T) {
	dir := t.TempDir()
	write := func(name, s string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	for in, want := range map[string]string{"always [madvise] never\n": "madvise", "[always] madvise never": "always", "always madvise [never]": "never"} {
		if got, err := THPMode(write("enabled", in)); err != nil || got != want {
			t.Errorf("THPMode(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	if _, err := THPMode(write("enabled", "garbage")); err == nil {
		t.Error("a mode file without a bracketed mode parsed")
	}
	smaps := write("smaps", `55d0c0a00000-55d0c0a21000 rw-p 00000000 00:00 0                          [heap]
Size:                132 kB
AnonHugePages:         0 kB
7f0000000000-7f0000800000 rw-p 00000000 00:00 0 
Size:               8192 kB
Rss:                8192 kB
AnonHugePages:      6144 kB
VmFlags: rd wr mr mw me ac sd hg
7f0000800000-7f0000a00000 rw-p 00000000 00:00 0 
AnonHugePages:      2048 kB
`)
	if got, err := anonHugeBytes(smaps, 0x7f0000000000); err != nil || got != 6144<<10 {
		t.Errorf("anonHugeBytes = %d, %v; want %d", got, err, 6144<<10)
	}
	if _, err := anonHugeBytes(smaps, 0x7f0000100000); err == nil {
		t.Error("an address that starts no mapping was found")
	}
}
