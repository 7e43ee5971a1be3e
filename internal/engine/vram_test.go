package engine

import (
	"context"
	"fmt"
	"sync"
	"testing"

	"github.com/nixlctl/nixlctl/internal/nixl"
	"github.com/nixlctl/nixlctl/internal/nixl/cuda/cudatest"
	_ "github.com/nixlctl/nixlctl/internal/nixl/cudaipc"
)

// KV pools in GPU memory, moved between processes' GPUs by cuda-ipc (the
// tests' fake driver where there is no GPU): pull and push, hetero TP,
// every byte verified through device-to-host copies.
func TestHandoffInVRAM(t *testing.T) {
	cudatest.Require(t)
	for _, proto := range []Protocol{ProtoPull, ProtoPush} {
		for _, tps := range [][2]int{{1, 1}, {2, 1}} {
			t.Run(fmt.Sprintf("%s/%d-%d", proto, tps[0], tps[1]), func(t *testing.T) {
				p, d, rec := engines(t, proto, tps[0], tps[1], func(c *Config) { c.Backend, c.Mem = "cuda-ipc", nixl.VRAM })
				if p.ranks[0].buf.Mem != nixl.VRAM {
					t.Fatal("pool is not in VRAM")
				}
				ctx := context.Background()
				host, port, _ := splitEndpoint(p.side.Endpoint())
				coords := TransferParams{RemoteEngineID: p.cfg.EngineID, RemoteHost: host, RemotePort: port, TPSize: tps[0]}
				var lr LoadReply
				var wg sync.WaitGroup
				if proto == ProtoPush {
					wg.Add(1)
					go func() {
						defer wg.Done()
						lr, _ = d.dec.Load(ctx, LoadRequest{ID: "v", Tokens: 100, Key: 3, Params: coords})
					}()
				}
				pr, err := p.pre.Prefill(ctx, PrefillRequest{ID: "v", Tokens: 100, Key: 3})
				if err != nil {
					t.Fatal(err)
				}
				if proto == ProtoPull {
					lr, _ = d.dec.Load(ctx, LoadRequest{ID: "v", Tokens: 100, Key: 3, Params: pr.Params})
				}
				wg.Wait()
				if lr.Error != "" || lr.CorruptBlocks != 0 {
					t.Fatalf("%s (corrupt %d: %s)", lr.Error, lr.CorruptBlocks, lr.Corrupt)
				}
				waitFreed(t, rec, map[Protocol]FreedReason{ProtoPull: FreedConsumed, ProtoPush: FreedPushed}[proto])
				// Poisoned after the free: the same request no longer verifies.
				if bad, _ := p.ranks[0].pool.Check(3, pr.Params.RemoteBlockIDs, 0, 100, Full); bad == 0 {
					t.Error("freed VRAM blocks still hold the request's tags")
				}
			})
		}
	}
}
