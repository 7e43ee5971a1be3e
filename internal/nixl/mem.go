package nixl

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Buffer is memory that transfers use: an address range plus how it was
// allocated, so results can say so.
type Buffer struct {
	Addr  uint64
	Len   int
	Mem   MemType
	Dev   uint32
	Alloc string // "mmap", "mmap+hugetlb", "ucx", "cuda", ...

	data []byte       // host view for DRAM
	free func() error // releases the memory
}

// NewBuffer wraps memory allocated elsewhere; free (may be nil) releases it.
func NewBuffer(addr uint64, n int, mem MemType, dev uint32, alloc string, host []byte, free func() error) *Buffer {
	return &Buffer{Addr: addr, Len: n, Mem: mem, Dev: dev, Alloc: alloc, data: host, free: free}
}

// Span is a piece of a buffer: Len bytes at offset Off. Helpers that work
// on host and device memory alike (tag fill and verify, reference copies)
// take spans, since device memory has no slice to cut.
type Span struct{ Off, Len int }

// Bytes is the host view of a DRAM buffer (nil for device memory).
func (b *Buffer) Bytes() []byte { return b.data }

// Desc returns the descriptor of [off, off+n) of the buffer.
func (b *Buffer) Desc(off, n int) Desc {
	return Desc{Addr: b.Addr + uint64(off), Len: uint64(n), Dev: b.Dev}
}

// CheckSpans returns an error naming the first span that does not lie
// inside the buffer.
func (b *Buffer) CheckSpans(spans []Span) error {
	for i, s := range spans {
		if s.Off < 0 || s.Len < 0 || s.Off > b.Len || s.Len > b.Len-s.Off {
			return fmt.Errorf("span %d (%d+%d) outside the %d-byte buffer", i, s.Off, s.Len, b.Len)
		}
	}
	return nil
}

// Contains reports whether d lies inside the buffer.
func (b *Buffer) Contains(d Desc) bool {
	return d.Addr >= b.Addr && d.Len <= uint64(b.Len) && d.Addr-b.Addr <= uint64(b.Len)-d.Len
}

// Free releases the memory; the buffer must no longer be registered.
func (b *Buffer) Free() error {
	if b.free == nil {
		return nil
	}
	f := b.free
	b.free, b.data = nil, nil
	return f()
}

// LendBuffer readies an agent that lends one buffer to its peers (a
// benchmark's target): it allocates the buffer (alloc), registers it and
// returns it with the agent's metadata, what a peer loads to reach it. On
// failure it frees the buffer and closes a, which the caller must not
// use again: an agent without its buffer has nothing to serve.
func LendBuffer(a Agent, alloc func() (*Buffer, error)) (*Buffer, []byte, error) {
	buf, err := alloc()
	if err != nil {
		a.Close()
		return nil, nil, err
	}
	if err := a.RegisterMem(buf); err != nil {
		buf.Free()
		a.Close()
		return nil, nil, err
	}
	md, err := a.LocalMD()
	if err != nil {
		// Deregistered before it is freed, as Free asks: the memory
		// must not go back while the agent still describes it.
		a.DeregisterMem(buf)
		buf.Free()
		a.Close()
		return nil, nil, err
	}
	return buf, md, nil
}

// AllocDRAM maps size bytes of anonymous, page-aligned, pre-faulted
// memory, like a serving engine's own KV pool. With hugePages it asks for
// 2 MiB pages and fails (naming the sysctl) if none are reserved.
func AllocDRAM(size int, hugePages bool) (*Buffer, error) {
	if size <= 0 {
		return nil, fmt.Errorf("buffer size must be > 0 (got %d)", size)
	}
	flags := unix.MAP_PRIVATE | unix.MAP_ANONYMOUS | unix.MAP_POPULATE
	alloc := "mmap"
	if hugePages {
		const huge = 2 << 20
		size = (size + huge - 1) / huge * huge
		flags |= unix.MAP_HUGETLB
		alloc = "mmap+hugetlb"
	}
	data, err := unix.Mmap(-1, 0, size, unix.PROT_READ|unix.PROT_WRITE, flags)
	if err != nil {
		if hugePages && errors.Is(err, unix.ENOMEM) {
			return nil, fmt.Errorf("mmap %d bytes of huge pages: %w (reserve some with sysctl vm.nr_hugepages)", size, err)
		}
		return nil, fmt.Errorf("mmap %d bytes: %w", size, err)
	}
	return &Buffer{
		Addr: uint64(uintptr(unsafe.Pointer(&data[0]))), Len: size, Mem: DRAM, Alloc: alloc, data: data,
		free: func() error { return unix.Munmap(data) },
	}, nil
}

// THPEnabledPath is the kernel's transparent huge page mode.
const THPEnabledPath = "/sys/kernel/mm/transparent_hugepage/enabled"

// AllocDRAMTHP maps size bytes of anonymous memory advised for
// transparent huge pages (MADV_HUGEPAGE) and then populates it: as
// PyTorch's CPU allocator maps a large tensor with
// C10_THP_MEM_ALLOC_ENABLE=1, and as every anonymous mapping is backed on
// a host whose THP mode is "always". The kernel gives what huge pages it
// can; the buffer's Alloc says how much of it they back. On the
// project's VMs this halves or better what a page costs on its first
// touch after the host reclaimed it (a 1 GiB read 41-57 ms after 1 s
// idle and 74-79 ms after 5 s, against 120-203 and 256-375 ms with 4 KiB
// pages, four runs each; see engine.TouchPools).
func AllocDRAMTHP(size int) (*Buffer, error) {
	if size <= 0 {
		return nil, fmt.Errorf("buffer size must be > 0 (got %d)", size)
	}
	if mode, err := THPMode(THPEnabledPath); err == nil && mode == "never" {
		return nil, fmt.Errorf("--dram-alloc thp: transparent huge pages are off on this host (%s: never); use mmap, or enable madvise", THPEnabledPath)
	}
	data, err := unix.Mmap(-1, 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		return nil, fmt.Errorf("mmap %d bytes: %w", size, err)
	}
	if err := unix.Madvise(data, unix.MADV_HUGEPAGE); err != nil {
		_ = unix.Munmap(data)
		return nil, fmt.Errorf("madvise(MADV_HUGEPAGE) on %d bytes: %w", size, err)
	}
	// Pre-faulted as the mmap pools are (MAP_POPULATE), after the advice
	// so that the faults take huge pages; kernels before 5.14 lack
	// MADV_POPULATE_WRITE, and get a write to each page instead.
	if err := unix.Madvise(data, unix.MADV_POPULATE_WRITE); err != nil {
		for i := 0; i < len(data); i += 4096 {
			data[i] = 0
		}
	}
	addr := uint64(uintptr(unsafe.Pointer(&data[0])))
	alloc := "mmap+thp"
	if huge, err := anonHugeBytes("/proc/self/smaps", addr); err == nil {
		alloc = fmt.Sprintf("mmap+thp (%d%% in huge pages)", huge*100/int64(size))
	}
	return &Buffer{
		Addr: addr, Len: size, Mem: DRAM, Alloc: alloc, data: data,
		free: func() error { return unix.Munmap(data) },
	}, nil
}

// THPMode reads the kernel's transparent huge page mode from path (the
// bracketed word of "always [madvise] never").
func THPMode(path string) (string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return "", err
	}
	s := string(b)
	i, j := strings.IndexByte(s, '['), strings.IndexByte(s, ']')
	if i < 0 || j < i {
		return "", fmt.Errorf("%s: no mode in %q", path, strings.TrimSpace(s))
	}
	return s[i+1 : j], nil
}

// anonHugeBytes reads, from a smaps file, the AnonHugePages of the
// mapping that starts at addr.
func anonHugeBytes(path string, addr uint64) (int64, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, err
	}
	start := strconv.FormatUint(addr, 16) + "-"
	in := false
	for line := range strings.Lines(string(b)) {
		// A mapping's header starts with its range ("7f..-7f.. rw-p"),
		// its fields with a key ("AnonHugePages:").
		if first, _, _ := strings.Cut(line, " "); strings.Contains(first, "-") && !strings.HasSuffix(first, ":") {
			in = strings.HasPrefix(line, start)
			continue
		}
		if in {
			if v, ok := strings.CutPrefix(line, "AnonHugePages:"); ok {
				kb, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
				return kb << 10, err
			}
		}
	}
	return 0, fmt.Errorf("no mapping at %#x in %s", addr, path)
}

// HostSlice views n bytes at addr as a slice. The memory must be outside
// the Go heap (mmap, C or UCX allocations) and stay mapped while the slice
// is used.
func HostSlice(addr uint64, n int) []byte {
	if n == 0 {
		return nil
	}
	return unsafe.Slice((*byte)(foreignPointer(addr)), n)
}

// foreignPointer turns the address of memory the Go runtime does not
// manage into a pointer. (Converting through uintptr would be the usual
// spelling, which vet rightly flags for Go memory.)
func foreignPointer(addr uint64) unsafe.Pointer {
	return *(*unsafe.Pointer)(unsafe.Pointer(&addr))
}
