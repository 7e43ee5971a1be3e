package engine

import (
	"context"
	"fmt"
	"sync"
	"testing"

	"github.com/nixlctl/nixlctl/internal/kv"
	"github.com/nixlctl/nixlctl/internal/nixl"
	_ "github.com/nixlctl/nixlctl/internal/nixl/capi"
)

// handoffOnce moves one request from p to d in p's protocol and fails the
// test unless every byte arrived (the engines verify tags in full).
func handoffOnce(t *testing.T, proto Protocol, p, d *Engine, rec *evRecorder, i, tokens int) LoadReply {
	t.Helper()
	ctx := context.Background()
	id, key := fmt.Sprintf("cmpl-%d-0", i), uint64(500+i)
	var lr LoadReply
	switch proto {
	case ProtoPull:
		pr, err := p.pre.Prefill(ctx, PrefillRequest{ID: id, Tokens: tokens, Key: key})
		if err != nil {
			t.Fatal(err)
		}
		lr, _ = d.dec.Load(ctx, LoadRequest{ID: id, Tokens: tokens, Key: key, Params: pr.Params})
		waitFreed(t, rec, "consumed")
	case ProtoPush:
		host, port, _ := splitEndpoint(p.side.Endpoint())
		coords := TransferParams{DoRemotePrefill: true, RemoteEngineID: p.cfg.EngineID, RemoteHost: host, RemotePort: port, TPSize: p.cfg.TP, PPSize: 1}
		if _, err := p.pre.Prefill(ctx, PrefillRequest{ID: id, Tokens: tokens, Key: key}); err != nil {
			t.Fatal(err)
		}
		lr, _ = d.dec.Load(ctx, LoadRequest{ID: id, Tokens: tokens, Key: key, Params: coords})
		waitFreed(t, rec, "pushed")
	case ProtoSGLang:
		room := uint64(1<<40 + i)
		var wg sync.WaitGroup
		var perr error
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, perr = p.sgl.prefill(ctx, PrefillRequest{ID: id, Tokens: tokens, Key: room, Room: room, ChunkTokens: 64})
		}()
		lr, _ = d.dec.Load(ctx, LoadRequest{ID: id, Tokens: tokens, Key: room, Room: room, Bootstrap: p.sgl.bootstrapAddr})
		wg.Wait()
		if perr != nil {
			t.Fatalf("request %d: prefill: %v", i, perr)
		}
	}
	if lr.Error != "" || lr.CorruptBlocks != 0 {
		t.Fatalf("request %d (%d tokens): %s (corrupt %d: %s)", i, tokens, lr.Error, lr.CorruptBlocks, lr.Corrupt)
	}
	return lr
}

// readPairs is how many (local rank, remote rank) pairs move KV under the
// TP plan: one prepared remote list each.
func readPairs(t *testing.T, p, d *Engine) int {
	t.Helper()
	plan, err := kv.Plan(p.spec, d.spec)
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, dr := range plan.Decode {
		n += len(dr.Reads)
	}
	return n
}

// Requests are made by index into lists prepared once per (local rank,
// remote agent, layout), as vLLM's make_prepped_xfer path: later requests
// prepare nothing, and hetero TP and layouts with many chunks per block
// still move exactly the right bytes.
func TestPreppedListsOncePerAgent(t *testing.T) {
	nhd := func(c *Config) { c.Order = kv.NHD }
	sliding := func(c *Config) {
		m, _ := kv.Preset("gpt-oss-20b")
		m.NumLayers, m.LayerTypes = 2, m.LayerTypes[:2] // one sliding layer, one full
		c.Model = m
	}
	for _, tc := range []struct {
		name  string
		proto Protocol
		tps   [2]int
		mut   func(*Config)
	}{
		{"pull-1-1", ProtoPull, [2]int{1, 1}, nil},
		{"pull-2-1", ProtoPull, [2]int{2, 1}, nil},
		{"pull-1-2", ProtoPull, [2]int{1, 2}, nil},
		{"pull-2-1-nhd", ProtoPull, [2]int{2, 1}, nhd},
		{"pull-1-2-nhd", ProtoPull, [2]int{1, 2}, nhd},
		{"pull-sliding", ProtoPull, [2]int{1, 1}, sliding},
		{"push-1-1", ProtoPush, [2]int{1, 1}, nil},
		{"push-2-1", ProtoPush, [2]int{2, 1}, nil},
		{"push-1-2-nhd", ProtoPush, [2]int{1, 2}, nhd},
		{"sglang-1-1", ProtoSGLang, [2]int{1, 1}, nil},
		{"sglang-2-1", ProtoSGLang, [2]int{2, 1}, nil},
		{"sglang-1-2", ProtoSGLang, [2]int{1, 2}, nil},
	} {
		for _, backend := range []string{"ucx", "nixl"} {
			t.Run(backend+"/"+tc.name, func(t *testing.T) {
				if b, ok := nixl.Lookup(backend); !ok {
					t.Skipf("backend %s is not built in", backend)
				} else if ok, why := b.Available(); !ok {
					t.Skipf("backend %s unavailable: %s", backend, why)
				}
				mut := func(c *Config) {
					c.Backend = backend
					if tc.mut != nil {
						tc.mut(c)
					}
				}
				p, d, rec := engines(t, tc.proto, tc.tps[0], tc.tps[1], mut)
				// The engine that posts: decode READs, prefill WRITEs.
				poster := p
				if tc.proto == ProtoPull {
					poster = d
				}
				var made int64
				for i, tokens := range []int{300, 100, 16, 1, 200} {
					lr := handoffOnce(t, tc.proto, p, d, rec, i, tokens)
					if tc.proto == ProtoPull && lr.Descriptors > lr.LogicalDescriptors {
						t.Errorf("request %d: %d descriptors posted of %d logical", i, lr.Descriptors, lr.LogicalDescriptors)
					}
					if i == 0 {
						made = poster.prep.made.Load()
					} else if got := poster.prep.made.Load(); got != made {
						t.Fatalf("request %d prepared lists again: %d made, %d after the first", i, got, made)
					}
				}
				c := poster.prep
				c.mu.Lock()
				nl, nr := len(c.local), len(c.remote)
				c.mu.Unlock()
				if want := readPairs(t, p, d); nr != want {
					t.Errorf("%d remote lists prepared, want one per reading pair: %d", nr, want)
				}
				if nl == 0 || nl > nr || made != int64(nl+nr) {
					t.Errorf("%d lists made for %d local and %d remote", made, nl, nr)
				}
			})
		}
	}
}

// --no-merge posts one descriptor per block and region, which made-by-index
// requests cannot promise: it keeps building descriptors per request.
func TestNoMergeBuildsPerRequest(t *testing.T) {
	p, d, rec := engines(t, ProtoPull, 1, 1, func(c *Config) { c.Merge = false })
	lr := handoffOnce(t, ProtoPull, p, d, rec, 0, 320)
	// 2 layers x K,V = 4 regions x 20 blocks, nothing merged.
	if lr.Descriptors != 80 || lr.LogicalDescriptors != 80 {
		t.Errorf("descriptors %d posted of %d logical, want 80 of 80", lr.Descriptors, lr.LogicalDescriptors)
	}
	if n := d.prep.made.Load(); n != 0 {
		t.Errorf("%d lists prepared with --no-merge", n)
	}
}

// Lists go back to the agent when the engine closes: a backend that
// counts them (NIXL) would otherwise leak a prepared list per peer.
func TestPreppedListsReleasedOnClose(t *testing.T) {
	p, d, rec := engines(t, ProtoPull, 2, 1, nil)
	handoffOnce(t, ProtoPull, p, d, rec, 0, 100)
	var lists []*preppedList
	d.prep.mu.Lock()
	for _, l := range d.prep.local {
		lists = append(lists, l)
	}
	for _, l := range d.prep.remote {
		lists = append(lists, l)
	}
	d.prep.mu.Unlock()
	d.prep.close()
	for _, l := range lists {
		if l.dl != nil {
			t.Errorf("list of %d descriptors kept after close", len(l.descs))
		}
	}
	if len(d.prep.local)+len(d.prep.remote) != 0 {
		t.Error("cache not emptied")
	}
}
