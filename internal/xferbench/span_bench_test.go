package xferbench

import (
	"fmt"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"
)

// BenchmarkCopyOverSpan copies 4 MiB requests between two buffers of span
// bytes a side, in 8 KiB pieces through a 512 KiB ring as UCX's emulated
// RMA does, walking the buffers as Spread does: how much slower a copy
// gets the more memory it walks, which is why the handoffs' reference
// walks a pool's worth (Spread). Both buffers are advised for THP, as
// --dram-alloc thp pools are. Run it alone:
//
//	go test -run '^$' -bench CopyOverSpan -benchtime 8x ./internal/xferbench
func BenchmarkCopyOverSpan(b *testing.B) {
	const req, piece = 4 << 20, 8 << 10
	ring := make([]byte, 64*piece)
	for _, span := range []int{1 << 30, 2 << 30, 4 << 30} {
		b.Run(fmt.Sprintf("span=%dGiB", span>>30), func(b *testing.B) {
			src, dst := mapTHP(b, span), mapTHP(b, span)
			for i := range src {
				src[i], dst[i] = 1, 2 // resident, as a used pool is
			}
			b.SetBytes(int64(span))
			b.ResetTimer()
			for range b.N {
				for off := 0; off < span; off += req {
					for p := 0; p < req; p += piece {
						slot := ring[(p/piece)%64*piece:][:piece]
						copy(slot, src[off+p:off+p+piece])
						copy(dst[off+p:off+p+piece], slot)
					}
				}
			}
		})
	}
}

func mapTHP(b *testing.B, n int) []byte {
	m, err := syscall.Mmap(-1, 0, n, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_PRIVATE|syscall.MAP_ANON)
	if err != nil {
		b.Skipf("mmap %d bytes: %v", n, err)
	}
	b.Cleanup(func() { _ = syscall.Munmap(m) })
	_ = syscall.Madvise(m, unix.MADV_HUGEPAGE)
	return m
}
