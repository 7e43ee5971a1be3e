package nixltest

import (
	"testing"

	"github.com/nixlctl/nixlctl/internal/nixl"
)

// BenchmarkPostWait measures one request's full cycle (post, poll to
// completion, telemetry) for one descriptor, in process, per op and size.
func BenchmarkPostWait(b *testing.B) {
	for _, op := range []nixl.Op{nixl.Write, nixl.Read} {
		for _, size := range []int{8, 4 << 10, 64 << 10, 1 << 20} {
			b.Run(op.String()+"/"+sizeName(size), func(b *testing.B) {
				init, _ := nixl.Open("ucx", nixl.Config{Name: "i"})
				target, _ := nixl.Open("ucx", nixl.Config{Name: "t"})
				defer init.Close()
				defer target.Close()
				ib, _ := init.(nixl.Allocator).AllocMem(size, nixl.DRAM)
				tb, _ := target.(nixl.Allocator).AllocMem(size, nixl.DRAM)
				md, _ := target.LocalMD()
				remote, err := init.LoadRemoteMD(md)
				if err != nil {
					b.Fatal(err)
				}
				r, err := init.CreateXferReq(op, nixl.DRAM, []nixl.Desc{ib.Desc(0, size)}, nixl.DRAM, []nixl.Desc{tb.Desc(0, size)}, remote, nil)
				if err != nil {
					b.Fatal(err)
				}
				b.SetBytes(int64(size))
				b.ResetTimer()
				for i := 0; i < b.N; i++ {
					st, err := init.PostXferReq(r)
					for st == nixl.InProgress {
						st, err = init.XferStatus(r)
					}
					if st != nixl.Done {
						b.Fatal(err)
					}
					_ = init.Telemetry(r)
				}
			})
		}
	}
}

func sizeName(n int) string {
	switch {
	case n >= 1<<20:
		return itoa(n>>20) + "M"
	case n >= 1<<10:
		return itoa(n>>10) + "K"
	}
	return itoa(n)
}

func itoa(n int) string {
	s := ""
	for {
		s = string(rune('0'+n%10)) + s
		n /= 10
		if n == 0 {
			return s
		}
	}
}
