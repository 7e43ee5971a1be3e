package nixl

import (
	"errors"
	"fmt"
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
