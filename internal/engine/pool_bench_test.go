package engine

import (
	"context"
	"testing"

	"github.com/nixlctl/nixlctl/internal/kv"
	"github.com/nixlctl/nixlctl/internal/nixl"
)

// The tag work per request of llama-3.1-8b's shape (32 layers, 8 KV heads,
// 16-token blocks), 128 blocks: HND has a piece per head per block, NHD
// (SGLang's token-major layout) one per head per token, 16 times as many.
func benchPool(b *testing.B, order kv.CacheOrder) (*Pool, []int) {
	m, err := kv.Preset("llama-3.1-8b")
	if err != nil {
		b.Fatal(err)
	}
	spec, err := kv.Spec{Model: m, BlockSize: 16, TP: 1, Order: order}.Normalize()
	if err != nil {
		b.Fatal(err)
	}
	const n = 128
	buf, err := nixl.AllocDRAM(int(PoolBytes(spec, 0, 0, n)), false)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { buf.Free() })
	p, err := NewPool(spec, 0, 0, n, buf)
	if err != nil {
		b.Fatal(err)
	}
	blocks := make([]int, n)
	for i := range blocks {
		blocks[i] = i
	}
	return p, blocks
}

func BenchmarkPoolTags(b *testing.B) {
	for _, order := range []kv.CacheOrder{kv.HND, kv.NHD} {
		p, blocks := benchPool(b, order)
		tokens := len(blocks) * 16
		b.Run(string(order)+"/fill", func(b *testing.B) {
			for b.Loop() {
				p.Fill(7, blocks, 0, tokens, Sparse)
			}
		})
		b.Run(string(order)+"/fill-same-layout", func(b *testing.B) {
			for b.Loop() {
				_ = p.FillFor(context.Background(), 7, blocks, 0, tokens, Sparse, true)
			}
		})
		b.Run(string(order)+"/check", func(b *testing.B) {
			p.Fill(7, blocks, 0, tokens, Sparse)
			for b.Loop() {
				if bad, err := p.Check(7, blocks, 0, tokens, Sparse); bad != 0 {
					b.Fatal(err)
				}
			}
		})
		b.Run(string(order)+"/poison", func(b *testing.B) {
			for b.Loop() {
				p.Poison(blocks)
			}
		})
	}
}

// BenchmarkPoolTagsCold is BenchmarkPoolTags on memory that is not in any
// cache, as in a handoff, where the copy has just streamed gigabytes
// through: each request's 128 blocks come from a 2 GiB pool in turn, more
// than the L3 caches of the machines it runs on.
func BenchmarkPoolTagsCold(b *testing.B) {
	m, err := kv.Preset("llama-3.1-8b")
	if err != nil {
		b.Fatal(err)
	}
	for _, order := range []kv.CacheOrder{kv.HND, kv.NHD} {
		spec, err := kv.Spec{Model: m, BlockSize: 16, TP: 1, Order: order}.Normalize()
		if err != nil {
			b.Fatal(err)
		}
		const per, sets = 128, 8
		buf, err := nixl.AllocDRAM(int(PoolBytes(spec, 0, 0, per*sets)), false)
		if err != nil {
			b.Fatal(err)
		}
		p, err := NewPool(spec, 0, 0, per*sets, buf)
		if err != nil {
			b.Fatal(err)
		}
		reqs := make([][]int, sets)
		for s := range reqs {
			for i := range per {
				reqs[s] = append(reqs[s], s*per+i)
			}
		}
		for _, same := range []bool{false, true} {
			name := string(order) + "/fill"
			if same {
				name += "-same-layout"
			}
			b.Run(name, func(b *testing.B) {
				s := 0
				for b.Loop() {
					_ = p.FillFor(context.Background(), uint64(s), reqs[s], 0, per*16, Sparse, same)
					s = (s + 1) % sets
				}
			})
		}
		b.Run(string(order)+"/check", func(b *testing.B) {
			s := 0
			for b.Loop() {
				if bad, err := p.Check(uint64(s), reqs[s], 0, per*16, Sparse); bad != 0 {
					b.Fatal(err)
				}
				s = (s + 1) % sets
			}
		})
		buf.Free()
	}
}
