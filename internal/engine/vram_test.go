package engine

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/nixlctl/nixlctl/internal/nixl"
	"github.com/nixlctl/nixlctl/internal/nixl/cuda/cudatest"
	_ "github.com/nixlctl/nixlctl/internal/nixl/cudaipc"
)

// The tests' CUDA driver is chosen before anything loads CUDA (the fake
// where there is no GPU; NIXLCTL_TEST_CUDA picks): without it this
// package's VRAM test skipped on every host without an NVIDIA driver.
var _ = cudatest.MustSetup()

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
				if got := d.Stats().TagWork; !strings.HasPrefix(got, "the caller's thread") {
					t.Errorf("decode's tag work with VRAM pools: %q, want the caller's thread", got)
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
				// Blocks every reader confirmed are freed as they are (nobody
				// reads them again); a free nobody confirmed poisons them,
				// through the same staged device copies.
				blocks := pr.Params.RemoteBlockIDs
				if bad, err := p.ranks[0].pool.Check(3, blocks, 0, 100, Full); bad != 0 {
					t.Fatalf("prefill's VRAM blocks lost their tags before a poison: %v", err)
				}
				p.ranks[0].pool.Poison(blocks)
				if bad, _ := p.ranks[0].pool.Check(3, blocks, 0, 100, Full); bad == 0 {
					t.Error("poisoned VRAM blocks still hold the request's tags")
				}
			})
		}
	}
}
