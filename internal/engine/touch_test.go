package engine

import "testing"

// TouchPools reads every rank's whole pool, and leaves its bytes as they
// were (a read, not a write: a block another process is reading keeps
// its tags).
func TestTouchPoolsReadsEveryRank(t *testing.T) {
	p, _, _ := engines(t, ProtoPull, 2, 1, nil)
	var want int64
	for _, rk := range p.ranks {
		want += int64(len(rk.pool.Buf.Bytes()))
	}
	first := p.ranks[1].pool.Buf.Bytes()
	first[touchStride] = 0x5a
	r := p.TouchPools()
	if r.Bytes != want || want == 0 || r.NS <= 0 {
		t.Fatalf("touched %d bytes in %d ns; want %d bytes", r.Bytes, r.NS, want)
	}
	if first[touchStride] != 0x5a {
		t.Errorf("touch changed a byte: %#x", first[touchStride])
	}
}
