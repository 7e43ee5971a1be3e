package engine

import (
	"context"
	"slices"
	"testing"

	"github.com/nixlctl/nixlctl/internal/kv"
	"github.com/nixlctl/nixlctl/internal/nixl"
)

func TestAllocator(t *testing.T) {
	a := NewBlockAllocator(10, false, 1)
	x, _ := a.Alloc(4)
	y, _ := a.Alloc(3)
	if x[0] != 0 || x[3] != 3 || y[0] != 4 {
		t.Fatalf("contiguous first fit: %v %v", x, y)
	}
	if err := a.Free(x); err != nil {
		t.Fatal(err)
	}
	if err := a.Free(x); err == nil {
		t.Error("double free accepted")
	}
	z, _ := a.Alloc(5) // no run of 5: 0-3 and 7-9 free -> lowest ids
	if len(z) != 5 || a.InUse() != 8 {
		t.Fatalf("fallback: %v, in use %d", z, a.InUse())
	}
	if _, err := a.Alloc(3); err == nil {
		t.Error("over-allocation accepted")
	}
	s := NewBlockAllocator(1000, true, 2)
	blocks, _ := s.Alloc(100)
	seen := map[int]bool{}
	runs := 0
	for i, b := range blocks {
		if seen[b] {
			t.Fatalf("block %d handed out twice", b)
		}
		seen[b] = true
		if i > 0 && b == blocks[i-1]+1 {
			runs++
		}
	}
	if runs > 20 {
		t.Errorf("scattered allocation is mostly contiguous (%d adjacent pairs)", runs)
	}
}

func pool(t *testing.T, spec kv.Spec, tp, blocks int) *Pool {
	t.Helper()
	spec, _ = spec.Normalize()
	buf, err := nixl.AllocDRAM(int(PoolBytes(spec, tp, 0, blocks)), false)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { buf.Free() })
	p, err := NewPool(spec, tp, 0, blocks, buf)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// Tags written by prefill ranks of one TP size verify on decode ranks of
// another once the plan's chunks have been copied: the head-slice
// bookkeeping is right.
func TestPoolTagsAcrossTPPlans(t *testing.T) {
	m, _ := kv.Preset("llama-3.1-8b")
	m.NumLayers = 2
	for _, order := range []kv.CacheOrder{kv.HND, kv.NHD} {
		for _, tps := range [][2]int{{1, 1}, {1, 2}, {2, 1}, {4, 2}} {
			for _, v := range []Verify{Sparse, Full} {
				ps := kv.Spec{Model: m, TP: tps[0], BlockSize: 4, Order: order}
				ds := kv.Spec{Model: m, TP: tps[1], BlockSize: 4, Order: order}
				plan, err := kv.Plan(ps, ds)
				if err != nil {
					t.Fatal(err)
				}
				const tokens = 10 // 3 blocks
				var pp []*Pool
				for r := 0; r < tps[0]; r++ {
					p := pool(t, ps, r, 8)
					p.Fill(42, []int{5, 1, 6}, 0, tokens, v)
					pp = append(pp, p)
				}
				for d, reads := range plan.Decode {
					dp := pool(t, ds, d, 8)
					local := []int{2, 3, 7}
					for _, rd := range reads.Reads {
						src := pp[rd.PrefillRank]
						for i := range dp.Rank.Regions {
							for j, rb := range []int{5, 1, 6} {
								for _, c := range rd.Chunks {
									s := src.Buf.Bytes()[src.BlockAddr(i, rb)-src.Buf.Addr+uint64(c.SrcOffset):][:c.Length]
									copy(dp.Buf.Bytes()[dp.BlockAddr(i, local[j])-dp.Buf.Addr+uint64(c.DstOffset):], s)
								}
							}
						}
					}
					if bad, err := dp.Check(42, local, 0, tokens, v); bad != 0 {
						t.Fatalf("%s %v d%d: %d bad: %v", order, tps, d, bad, err)
					}
					if bad, _ := dp.Check(43, local, 0, tokens, v); bad == 0 {
						t.Fatalf("another request's key verified")
					}
					dp.Poison(local[:1])
					if bad, _ := dp.Check(42, local, 0, tokens, v); bad != len(dp.Rank.Regions) {
						t.Fatalf("poisoned block: %d bad, want one per region", bad)
					}
				}
			}
		}
	}
}

// Tags written for a checker of the same layout (FillFor) verify, and a
// block from another request or a poisoned one still fails, with every
// layout's rows.
func TestPoolFillForSameLayout(t *testing.T) {
	m, _ := kv.Preset("llama-3.1-8b")
	m.NumLayers = 2
	for _, order := range []kv.CacheOrder{kv.HND, kv.NHD} {
		p := pool(t, kv.Spec{Model: m, BlockSize: 16, Order: order}, 0, 24)
		blocks := make([]int, 24)
		for i := range blocks {
			blocks[i] = 23 - i
		}
		tokens := 24*16 - 5
		ctx := context.Background()
		if err := p.FillFor(ctx, 7, blocks, 0, tokens, Sparse, true); err != nil {
			t.Fatal(err)
		}
		if bad, err := p.Check(7, blocks, 0, tokens, Sparse); bad != 0 {
			t.Fatalf("%s: %d bad (%v)", order, bad, err)
		}
		if bad, _ := p.Check(8, blocks, 0, tokens, Sparse); bad != len(blocks)*len(p.Rank.Regions) {
			t.Errorf("%s: another key: %d bad of %d", order, bad, len(blocks)*len(p.Rank.Regions))
		}
		p.Poison(blocks[4:6])
		if bad, _ := p.Check(7, blocks, 0, tokens, Sparse); bad != 2*len(p.Rank.Regions) {
			t.Errorf("%s: two poisoned blocks: %d bad", order, bad)
		}
	}
}

// TestPoolSparseWordsAreWhatCheckReads: the word list the fast check and
// the same-layout fill use holds exactly the words checkRowEnds reads, so
// the fast pass misses nothing the per-row check would catch. Every listed
// word, flipped alone, fails its one block; a byte next to each, flipped,
// fails none.
func TestPoolSparseWordsAreWhatCheckReads(t *testing.T) {
	m, _ := kv.Preset("llama-3.1-8b")
	m.NumLayers = 2
	for _, order := range []kv.CacheOrder{kv.HND, kv.NHD} {
		p := pool(t, kv.Spec{Model: m, BlockSize: 16, Order: order}, 0, 12)
		blocks := []int{5, 2, 9, 0}
		tokens := len(blocks)*16 - 3
		if err := p.FillFor(context.Background(), 7, blocks, 0, tokens, Sparse, true); err != nil {
			t.Fatal(err)
		}
		list := func(chunk int) (words []tagWord, chunks int) {
			ok := p.sparseWordChunks(chunk, false, 7, blocks, 0, tokens, nil, func(c []tagWord) bool {
				words, chunks = append(words, c...), chunks+1
				return true
			})
			if !ok || len(words) == 0 {
				t.Fatalf("%s: %d words, ok %v", order, len(words), ok)
			}
			return words, chunks
		}
		words, _ := list(tagChunk)
		if small, chunks := list(5); chunks < 2 || !slices.Equal(small, words) {
			t.Fatalf("%s: in chunks of 5, %d chunks list %d words, want the %d of one chunk", order, chunks, len(small), len(words))
		}
		// Four words a row, as checkRowEnds reads: none left out.
		rows := 0
		var scratch [3][]piece
		p.eachBlock(7, blocks, 0, tokens, func(_, logical int, _ uint64, _ int64) bool {
			rows += len(p.sparseRows(7, logical, &scratch))
			return true
		})
		if len(words) != 4*rows {
			t.Fatalf("%s: %d words for %d rows, want 4 a row", order, len(words), rows)
		}
		data := p.Buf.Bytes()
		listed := map[int64]bool{}
		for _, w := range words {
			listed[w.off] = true
		}
		for i, w := range words {
			data[w.off] ^= 1
			if checkWords(data, words) {
				t.Fatalf("%s: word %d at %d flipped, checkWords passes", order, i, w.off)
			}
			if bad, _ := p.Check(7, blocks, 0, tokens, Sparse); bad != 1 {
				t.Fatalf("%s: word %d at %d flipped: %d bad blocks, want 1", order, i, w.off, bad)
			}
			data[w.off] ^= 1
			if next := w.off + 8; !listed[next] {
				data[next] ^= 1
				if bad, err := p.Check(7, blocks, 0, tokens, Sparse); bad != 0 {
					t.Fatalf("%s: the word after word %d flipped: %d bad (%v), want 0: sparse reads only listed words", order, i, bad, err)
				}
				data[next] ^= 1
			}
		}
	}
}

func TestPoolSlidingWindowTail(t *testing.T) {
	m, _ := kv.Preset("gpt-oss-20b") // window 128, layer 0 sliding
	m.NumLayers, m.LayerTypes = 2, m.LayerTypes[:2]
	p := pool(t, kv.Spec{Model: m, BlockSize: 16}, 0, 40)
	blocks := make([]int, 20) // 320 tokens
	for i := range blocks {
		blocks[i] = i
	}
	p.Fill(7, blocks, 0, 320, Sparse)
	if bad, err := p.Check(7, blocks, 0, 320, Sparse); bad != 0 {
		t.Fatal(err)
	}
	// The sliding layer keeps only the last 8 blocks (tokens 192..319):
	// poisoning an early block only breaks the full-attention layer.
	if keep := p.Spec.BlocksFor(kv.SlidingAttention, 320); keep != 8 {
		t.Fatalf("window keeps %d blocks", keep)
	}
	p.Poison(blocks[:1])
	if bad, _ := p.Check(7, blocks, 0, 320, Sparse); bad != 2 { // K and V of the full layer
		t.Fatalf("%d bad regions, want 2", bad)
	}
}

// Sparse checks of token-major blocks sample three tokens a block, four
// words each, and still count every kind of corrupt block: one from
// another request, a torn tail, a poisoned (freed) block, and a head slice
// or a token position that is wrong in every block, whichever it is. Full
// checks catch a single wrong byte anywhere.
func TestPoolSparseNHDCatchesCorruption(t *testing.T) {
	m, _ := kv.Preset("llama-3.1-8b")
	m.NumLayers = 2
	const bs, nblocks = 16, 32
	for _, layout := range []kv.AttnLayout{kv.FlashAttn, kv.FlashInfer} {
		p := pool(t, kv.Spec{Model: m, BlockSize: bs, Order: kv.NHD, Layout: layout}, 0, nblocks)
		if len(p.rows) != bs {
			t.Fatalf("%s: %d token rows, want %d", layout, len(p.rows), bs)
		}
		blocks := make([]int, nblocks)
		for i := range blocks {
			blocks[i] = i
		}
		tokens := nblocks * bs
		data := p.Buf.Bytes()
		region0 := func(b int) []byte { // block b of region 0
			return data[p.BlockAddr(0, b)-p.Buf.Addr:][:p.BlockLen(0)]
		}
		rowBytes := int64(m.NumKVHeads * m.HeadDim * 2)
		for _, v := range []Verify{Sparse, Full} {
			check := func(what string, want int) {
				t.Helper()
				if bad, err := p.Check(7, blocks, 0, tokens, v); bad != want {
					t.Errorf("%s %v, %s: %d bad blocks, want %d (%v)", layout, v, what, bad, want, err)
				}
			}
			refill := func() { p.Fill(7, blocks, 0, tokens, v) }
			refill()
			check("intact", 0)
			// Block 3 holds another request's KV.
			p.Fill(8, blocks[3:4], 3, tokens, v)
			check("another request's block", len(p.Rank.Regions))
			refill()
			// Block 5 swapped with block 6 (misplaced blocks).
			tmp := append([]byte(nil), region0(5)...)
			copy(region0(5), region0(6))
			copy(region0(6), tmp)
			check("two swapped blocks", 2)
			refill()
			// A torn copy: block 9's last token is stale.
			region0(9)[len(region0(9))-1] ^= 0xff
			region0(9)[int64(len(region0(9)))-rowBytes] ^= 0xff
			check("torn tail", 1)
			refill()
			// Head 3 of every token of every block came from head 2 (a
			// head-slice descriptor error repeats over blocks): sparse
			// checks one moving piece a row, so it catches the error once
			// in every row's length of blocks; full catches every block.
			hb := int64(m.HeadDim * 2)
			for _, b := range blocks {
				for tok := int64(0); tok < bs; tok++ {
					copy(region0(b)[tok*rowBytes+3*hb:][:hb], region0(b)[tok*rowBytes+2*hb:][:hb])
				}
			}
			if bad, err := p.Check(7, blocks, 0, tokens, v); bad < nblocks/len(p.rows[0]) || v == Full && bad != nblocks {
				t.Errorf("%s %v, head 3 wrong in every block: %d bad of %d (%v)", layout, v, bad, nblocks, err)
			}
			refill()
			// One block's head 3 wrong: full catches it; sparse only when
			// its moving piece is there (not asserted).
			for tok := int64(0); tok < bs; tok++ {
				copy(region0(11)[tok*rowBytes+3*hb:][:hb], region0(11)[tok*rowBytes+2*hb:][:hb])
			}
			if v == Full {
				check("wrong head slice in one block", 1)
			}
			refill()
			// A freed (poisoned) block read late.
			p.Poison(blocks[13:14])
			check("poisoned block", len(p.Rank.Regions))
			refill()
			// One token position wrong in every block of region 0:
			// sparse catches it in every BlockSize-2 blocks at least,
			// whichever position it is.
			for tok := int64(0); tok < bs; tok++ {
				for _, b := range blocks {
					region0(b)[tok*rowBytes] ^= 1
				}
				bad, _ := p.Check(7, blocks, 0, tokens, v)
				if bad < nblocks/(bs-2) || (v == Full || tok == 0 || tok == bs-1) && bad != nblocks {
					t.Errorf("%s %v: token %d wrong in every block: %d bad of %d", layout, v, tok, bad, nblocks)
				}
				refill()
			}
			if v == Full {
				// One byte anywhere.
				region0(17)[5*rowBytes+rowBytes/2+3] ^= 1
				check("one byte", 1)
				refill()
			}
		}
	}
}

// Sparse checks of head-major (HND) blocks read four words a block and
// still count a block from another request, two swapped blocks, a torn
// tail, a poisoned block, and a head slice wrong in every block (within a
// row's length of blocks); one head wrong in one block is full's job.
func TestPoolSparseHNDCatchesCorruption(t *testing.T) {
	m, _ := kv.Preset("llama-3.1-8b")
	m.NumLayers = 2
	const nblocks = 32
	p := pool(t, kv.Spec{Model: m, BlockSize: 16, Order: kv.HND}, 0, nblocks)
	blocks := make([]int, nblocks)
	for i := range blocks {
		blocks[i] = i
	}
	tokens := nblocks * 16
	data := p.Buf.Bytes()
	region0 := func(b int) []byte { return data[p.BlockAddr(0, b)-p.Buf.Addr:][:p.BlockLen(0)] }
	hb := int(p.pieces[0].len) // one head's slice of a block
	heads := len(p.pieces)
	for _, same := range []bool{false, true} { // checked by a rank of another layout, or of this one
		fill := func(key uint64, bs []int, start int, v Verify) {
			if err := p.FillFor(context.Background(), key, bs, start, tokens, v, same); err != nil {
				t.Fatal(err)
			}
		}
		for _, tc := range []struct {
			name     string
			v        Verify
			corrupt  func()
			min, max int
		}{
			{"intact", Sparse, func() {}, 0, 0},
			{"another request's block", Sparse, func() { fill(8, blocks[3:4], 3, Sparse) }, len(p.Rank.Regions), len(p.Rank.Regions)},
			{"two swapped blocks", Sparse, func() {
				tmp := append([]byte(nil), region0(5)...)
				copy(region0(5), region0(6))
				copy(region0(6), tmp)
			}, 2, 2},
			{"torn tail", Sparse, func() { b := region0(9); b[len(b)-1] ^= 0xff }, 1, 1},
			{"poisoned block", Sparse, func() { p.Poison(blocks[13:14]) }, len(p.Rank.Regions), len(p.Rank.Regions)},
			{"head 3 wrong in every block", Sparse, func() {
				for _, b := range blocks {
					copy(region0(b)[3*hb:][:hb], region0(b)[2*hb:][:hb])
				}
			}, nblocks / heads, nblocks},
			{"head 3 wrong in one block", Full, func() { copy(region0(11)[3*hb:][:hb], region0(11)[2*hb:][:hb]) }, 1, 1},
			{"one byte in the middle", Full, func() { region0(17)[hb+hb/2] ^= 1 }, 1, 1},
		} {
			fill(7, blocks, 0, tc.v)
			tc.corrupt()
			if bad, err := p.Check(7, blocks, 0, tokens, tc.v); bad < tc.min || bad > tc.max {
				t.Errorf("%s (%v, same layout %v): %d bad blocks, want %d..%d (%v)", tc.name, tc.v, same, bad, tc.min, tc.max, err)
			}
		}
	}
}
