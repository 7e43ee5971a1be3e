package blocktag

import "testing"

func TestTags(t *testing.T) {
	t.Parallel()
	for _, n := range []int{0, 1, 7, 8, 9, 4096, 4099} {
		b := make([]byte, n)
		key := Key(7, 3, uint64(n))
		Fill(b, key)
		if m := Check(b, key); m != nil {
			t.Fatalf("%d bytes: %v", n, m)
		}
		if n == 0 {
			continue
		}
		if Check(b, Key(7, 3, uint64(n)+1)) == nil {
			t.Errorf("%d bytes: another block's key passed", n)
		}
		b[n-1] ^= 1
		if m := Check(b, key); m == nil || m.Offset > n-1 {
			t.Errorf("%d bytes: flipped last byte not caught: %v", n, m)
		}
	}
	if Key(1, 2) == Key(2, 1) {
		t.Error("key must depend on order")
	}
}

func BenchmarkFillTags(b *testing.B) {
	buf := make([]byte, 1<<20)
	b.SetBytes(int64(len(buf)))
	for i := 0; i < b.N; i++ {
		Fill(buf, uint64(i))
	}
}

func BenchmarkCheckTags(b *testing.B) {
	buf := make([]byte, 1<<20)
	Fill(buf, 5)
	b.SetBytes(int64(len(buf)))
	for i := 0; i < b.N; i++ {
		if Check(buf, 5) != nil {
			b.Fatal("mismatch")
		}
	}
}
