package engine

import (
	"context"
	"fmt"
	"testing"

	"github.com/nixlctl/nixlctl/internal/nixl"
	_ "github.com/nixlctl/nixlctl/internal/nixl/capi"
)

// TestPullTransferStageNotNegative: a pull's transfer stage runs from the
// end of the last post to the data in place, both read off the reading
// agent's telemetry. They used to be a goroutine's stamp after its posts
// (and notifications) against the telemetry's completion: a READ that
// landed inside the post, which NIXL's backend does for every small one
// and whose microsecond stamps round down, came out negative on every
// request, and the ucx backend's now and then under load.
func TestPullTransferStageNotNegative(t *testing.T) {
	for _, backend := range []string{"ucx", "nixl"} {
		for _, tps := range [][2]int{{1, 1}, {4, 2}} {
			t.Run(fmt.Sprintf("%s/%d-%d", backend, tps[0], tps[1]), func(t *testing.T) {
				if _, err := nixl.Resolve(backend); err != nil {
					t.Skip(err)
				}
				p, d, rec := engines(t, ProtoPull, tps[0], tps[1], func(c *Config) { c.Backend = backend })
				ctx := context.Background()
				for i := range 20 {
					id := fmt.Sprintf("req-%d", i)
					tokens := 1 + i*7
					pr, err := p.pre.Prefill(ctx, PrefillRequest{ID: id, Tokens: tokens, Key: uint64(i)})
					if err != nil {
						t.Fatal(err)
					}
					lr, _ := d.dec.Load(ctx, LoadRequest{ID: id, Tokens: tokens, Key: uint64(i), Params: pr.Params})
					if lr.Error != "" || lr.CorruptBlocks != 0 {
						t.Fatalf("%s: %s (corrupt %d)", id, lr.Error, lr.CorruptBlocks)
					}
					if lr.TXferDone < lr.TPostEnd || lr.TPostEnd < lr.TPostStart {
						t.Errorf("%s: post %d..%d, data in place %d: transfer stage %d ns", id, lr.TPostStart, lr.TPostEnd,
							lr.TXferDone, lr.TXferDone-lr.TPostEnd)
					}
					waitFreed(t, rec, "consumed")
				}
			})
		}
	}
}
