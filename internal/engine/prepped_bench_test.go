package engine

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/nixlctl/nixlctl/internal/kv"
	"github.com/nixlctl/nixlctl/internal/nixl"
	"github.com/nixlctl/nixlctl/internal/sidechannel"
)

// moveRig is a decode rank holding a prefill rank's metadata, without the
// side channel: what makeMove needs and nothing else.
type moveRig struct {
	d      *Engine
	rk     *rank
	name   string
	rm     sidechannel.AgentMetadata
	chunks []kv.Chunk
}

func newMoveRig(tb testing.TB, backend string, m kv.Model, ptp, dtp int, order kv.CacheOrder) *moveRig {
	tb.Helper()
	if be, ok := nixl.Lookup(backend); !ok {
		tb.Skipf("backend %s is not built in", backend)
	} else if ok, why := be.Available(); !ok {
		tb.Skipf("backend %s unavailable: %s", backend, why)
	}
	cfg := Config{Backend: backend, Protocol: ProtoPull, Model: m, BlockSize: 16, NumBlocks: 512, Merge: true, Order: order, Knobs: Knobs{DRAMAlloc: "mmap"}}
	pc, dc := cfg, cfg
	pc.Role, pc.EngineID, pc.TP = RolePrefill, "p", ptp
	dc.Role, dc.EngineID, dc.TP = RoleDecode, "d", dtp
	p, err := NewEngine(tb.Context(), pc, nil, nil)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(p.Close)
	d, err := NewEngine(tb.Context(), dc, nil, nil)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(d.Close)
	plan, err := kv.Plan(p.spec, d.spec)
	if err != nil {
		tb.Fatal(err)
	}
	rd := plan.Decode[0].Reads[0]
	src := p.ranks[rd.PrefillRank]
	md, err := src.agent.LocalMD()
	if err != nil {
		tb.Fatal(err)
	}
	g := &moveRig{d: d, rk: d.ranks[0], chunks: rd.Chunks, rm: sidechannel.AgentMetadata{NumBlocks: src.pool.NumBlocks}}
	if g.name, err = g.rk.agent.LoadRemoteMD(md); err != nil {
		tb.Fatal(err)
	}
	for i := range src.pool.Rank.Regions {
		g.rm.KVCachesBaseAddr = append(g.rm.KVCachesBaseAddr, src.pool.RegionBase(i))
		g.rm.BlockLens = append(g.rm.BlockLens, src.pool.BlockLen(i))
	}
	return g
}

func (g *moveRig) pair(tb testing.TB) *preppedPair {
	pp, err := g.d.prepped(g.rk, g.name, g.rm, nixl.DRAM, g.chunks, false)
	if err != nil || pp == nil {
		tb.Fatalf("prepare: %v", err)
	}
	return pp
}

// The descriptor count a request reports is what the ucx backend, merging
// as NIXL does, really posts, whatever the block tables and chunk layout.
func TestMakeMoveCountsWhatIsPosted(t *testing.T) {
	m := testModel()
	for _, tc := range []struct {
		ptp, dtp int
		order    kv.CacheOrder
	}{{1, 1, kv.HND}, {1, 2, kv.HND}, {2, 1, kv.HND}, {1, 2, kv.NHD}} {
		t.Run(fmt.Sprintf("%d-%d-%s", tc.ptp, tc.dtp, tc.order), func(t *testing.T) {
			g := newMoveRig(t, "ucx", m, tc.ptp, tc.dtp, tc.order)
			pp := g.pair(t)
			rng := rand.New(rand.NewPCG(1, 2))
			for i := 0; i < 50; i++ {
				n := 1 + rng.IntN(40)
				// Runs of random length at random places, so both
				// contiguous and broken tables occur; the last block of
				// the pool sits next to the next region's first.
				local, remote := make([]int, n), make([]int, n)
				for j := range local {
					if j > 0 && rng.IntN(3) > 0 && local[j-1] < 511 && remote[j-1] < 511 {
						local[j], remote[j] = local[j-1]+1, remote[j-1]+1
					} else {
						local[j], remote[j] = rng.IntN(512), rng.IntN(512)
					}
				}
				if i%10 == 0 {
					local[n-1], remote[n-1] = 511, 511
					local[0], remote[0] = 0, 0
				}
				o := moveOpts{Chunks: g.chunks, LocalBlocks: local, RemoteBlocks: remote, Tokens: 16 * n, Merge: true}
				x, st, err := g.d.makeMove(g.rk, nixl.Read, pp, g.name, g.rm, nixl.DRAM, o, nil)
				if err != nil {
					t.Fatal(err)
				}
				if x.Descs() != st.descs || x.Bytes() != st.bytes {
					t.Fatalf("tables %v -> %v: counted %d descriptors of %d bytes, ucx posts %d of %d", local, remote, st.descs, st.bytes, x.Descs(), x.Bytes())
				}
				ml, err := buildMoves(g.rk.pool, g.rm, o)
				if err != nil {
					t.Fatal(err)
				}
				if st.logical != ml.logical || st.bytes != ml.bytes {
					t.Errorf("logical %d, %d bytes; built per request: %d, %d", st.logical, st.bytes, ml.logical, ml.bytes)
				}
				_ = g.rk.agent.ReleaseXferReq(x)
			}
			// Blocks outside either pool are the caller's error, named.
			if _, _, err := g.d.makeMove(g.rk, nixl.Read, pp, g.name, g.rm, nixl.DRAM, moveOpts{Chunks: g.chunks, LocalBlocks: []int{0}, RemoteBlocks: []int{512}, Tokens: 16}, nil); err == nil {
				t.Error("remote block 512 of 512 accepted")
			}
		})
	}
}

// BenchmarkMakeMove is the per-request cost the post time measures for one
// rank's READ of a 2048-token llama-3.1-8b request (128 blocks x 64
// regions): by index into prepared lists, and built per request, on each
// backend that can run here.
func BenchmarkMakeMove(b *testing.B) {
	m, _ := kv.Preset("llama-3.1-8b")
	for _, bm := range [][2]string{{"ucx", "prepped"}, {"ucx", "per-request"}, {"nixl", "prepped"}, {"nixl", "per-request"}} {
		backend, mode := bm[0], bm[1]
		b.Run(backend+"/"+mode, func(b *testing.B) {
			g := newMoveRig(b, backend, m, 1, 1, kv.HND)
			var pp *preppedPair
			if mode == "prepped" {
				pp = g.pair(b)
			}
			blocks := make([]int, 128)
			for i := range blocks {
				blocks[i] = 100 + i
			}
			o := moveOpts{Chunks: g.chunks, LocalBlocks: blocks, RemoteBlocks: blocks, Tokens: 2048, Merge: true}
			for b.Loop() {
				x, st, err := g.d.makeMove(g.rk, nixl.Read, pp, g.name, g.rm, nixl.DRAM, o, nil)
				if err != nil || st.descs != 64 {
					b.Fatal(err, st)
				}
				_ = g.rk.agent.ReleaseXferReq(x)
			}
		})
	}
}
