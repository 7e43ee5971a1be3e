package engine

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nixlctl/nixlctl/internal/kv"
	_ "github.com/nixlctl/nixlctl/internal/nixl/ucx"
	"github.com/nixlctl/nixlctl/internal/pushmatch"
	"github.com/nixlctl/nixlctl/internal/runcore"
	"github.com/vmihailenco/msgpack/v5"
)

type evRecorder struct {
	mu  sync.Mutex
	evs []FreedEvent
	ch  chan FreedEvent
}

func (r *evRecorder) emit(name string, data any) {
	if name != "freed" {
		return
	}
	ev := data.(FreedEvent)
	r.mu.Lock()
	r.evs = append(r.evs, ev)
	r.mu.Unlock()
	select {
	case r.ch <- ev:
	default:
	}
}

func testModel() kv.Model {
	m, _ := kv.Preset("llama-3.1-8b") // 8 KV heads: TP up to 8 splits heads
	m.NumLayers = 2
	return m
}

func engines(t *testing.T, proto Protocol, ptp, dtp int, mut func(*Config)) (*Engine, *Engine, *evRecorder) {
	t.Helper()
	base := Config{Backend: "ucx", Protocol: proto, Model: testModel(), BlockSize: 16, NumBlocks: 64, Merge: true, Knobs: Knobs{DRAMAlloc: "mmap", Verify: Full, Lease: runcore.Duration(10 * time.Second), RegTimeout: runcore.Duration(10 * time.Second)}}
	if mut != nil {
		mut(&base)
	}
	pc, dc := base, base
	pc.Role, pc.TP, pc.EngineID = RolePrefill, ptp, "prefill-e"
	dc.Role, dc.TP, dc.EngineID = RoleDecode, dtp, "decode-e"
	rec := &evRecorder{ch: make(chan FreedEvent, 64)}
	p, err := NewEngine(context.Background(), pc, nil, rec.emit)
	if err != nil {
		t.Fatal(err)
	}
	d, err := NewEngine(context.Background(), dc, nil, nil)
	if err != nil {
		p.Close()
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close(); p.Close() })
	return p, d, rec
}

func waitFreed(t *testing.T, rec *evRecorder, want FreedReason) FreedEvent {
	t.Helper()
	select {
	case ev := <-rec.ch:
		if ev.Reason != want {
			t.Fatalf("blocks freed for %q, want %q", ev.Reason, want)
		}
		return ev
	case <-time.After(15 * time.Second):
		t.Fatalf("prefill never freed the blocks (%s)", want)
	}
	return FreedEvent{}
}

func TestPullAcrossTP(t *testing.T) {
	for _, tps := range [][2]int{{1, 1}, {2, 1}, {1, 2}, {4, 2}} {
		t.Run(fmt.Sprintf("%d-%d", tps[0], tps[1]), func(t *testing.T) {
			p, d, rec := engines(t, ProtoPull, tps[0], tps[1], nil)
			ctx := context.Background()
			for i, tokens := range []int{100, 16, 1} {
				pr, err := p.pre.Prefill(ctx, PrefillRequest{ID: fmt.Sprintf("req-%d", i), Tokens: tokens, Key: uint64(1000 + i)})
				if err != nil {
					t.Fatal(err)
				}
				lr, _ := d.dec.Load(ctx, LoadRequest{ID: fmt.Sprintf("req-%d", i), Tokens: tokens, Key: uint64(1000 + i), Params: pr.Params})
				if lr.Error != "" || lr.CorruptBlocks != 0 {
					t.Fatalf("tokens %d: %s (corrupt %d: %s)", tokens, lr.Error, lr.CorruptBlocks, lr.Corrupt)
				}
				if lr.FirstHandshake != (i == 0) {
					t.Errorf("request %d: first handshake %v", i, lr.FirstHandshake)
				}
				if lr.TXferDone < lr.TPostStart || lr.TReady < lr.TXferDone || lr.TPostStart < lr.TArrive || lr.TPostEnd < lr.TPostStart {
					t.Errorf("stage times out of order: %+v", lr)
				}
				ev := waitFreed(t, rec, "consumed")
				if ev.ID != pr.RequestID {
					t.Errorf("freed %s, want %s", ev.ID, pr.RequestID)
				}
			}
			if st := p.Stats(); st.BlocksInUse != 0 || st.UnknownNotifs != 0 || st.MalformedNotifs != 0 {
				t.Errorf("prefill after: %+v", st)
			}
			if st := d.Stats(); st.BlocksInUse != 0 {
				t.Errorf("decode leaked blocks: %+v", st)
			}
		})
	}
}

func TestPullPrefixHitAndScattered(t *testing.T) {
	p, d, rec := engines(t, ProtoPull, 1, 1, func(c *Config) { c.Scattered = true })
	ctx := context.Background()
	pr, _ := p.pre.Prefill(ctx, PrefillRequest{ID: "a", Tokens: 160, Key: 5})
	lr, _ := d.dec.Load(ctx, LoadRequest{ID: "a", Tokens: 160, PrefixTokens: 64, Key: 5, Params: pr.Params})
	if lr.Error != "" || lr.CorruptBlocks != 0 || lr.Blocks != 6 {
		t.Fatalf("prefix hit: %+v", lr)
	}
	waitFreed(t, rec, "consumed")
	// A full hit reads nothing but still tells prefill to free.
	pr, _ = p.pre.Prefill(ctx, PrefillRequest{ID: "b", Tokens: 32, Key: 6})
	lr, _ = d.dec.Load(ctx, LoadRequest{ID: "b", Tokens: 32, PrefixTokens: 32, Key: 6, Params: pr.Params})
	if lr.Error != "" || lr.Blocks != 0 || lr.Descriptors != 0 {
		t.Fatalf("full hit: %+v", lr)
	}
	waitFreed(t, rec, "consumed")
	// Scattered blocks: descriptors do not merge.
	pr, _ = p.pre.Prefill(ctx, PrefillRequest{ID: "c", Tokens: 320, Key: 7})
	lr, _ = d.dec.Load(ctx, LoadRequest{ID: "c", Tokens: 320, Key: 7, Params: pr.Params})
	if lr.Error != "" || lr.CorruptBlocks != 0 || lr.Descriptors < lr.LogicalDescriptors/2 {
		t.Fatalf("scattered: %+v", lr)
	}
	waitFreed(t, rec, "consumed")
}

func TestPullMergesContiguousBlocks(t *testing.T) {
	p, d, rec := engines(t, ProtoPull, 1, 1, nil)
	ctx := context.Background()
	pr, _ := p.pre.Prefill(ctx, PrefillRequest{ID: "a", Tokens: 320, Key: 5})
	lr, _ := d.dec.Load(ctx, LoadRequest{ID: "a", Tokens: 320, Key: 5, Params: pr.Params})
	// 2 layers x K,V = 4 regions x 20 blocks = 80 logical descriptors; with
	// both block tables contiguous each region is one run.
	if lr.LogicalDescriptors != 80 || lr.Descriptors != 4 {
		t.Fatalf("descriptors %d posted of %d logical", lr.Descriptors, lr.LogicalDescriptors)
	}
	waitFreed(t, rec, "consumed")
}

func TestPushBothArrivalOrders(t *testing.T) {
	for _, tps := range [][2]int{{1, 1}, {2, 1}, {1, 2}, {4, 2}} {
		t.Run(fmt.Sprintf("%d-%d", tps[0], tps[1]), func(t *testing.T) {
			p, d, rec := engines(t, ProtoPush, tps[0], tps[1], nil)
			ctx := context.Background()
			host, port, _ := splitEndpoint(p.side.Endpoint())
			coords := TransferParams{DoRemotePrefill: true, RemoteEngineID: p.cfg.EngineID, RemoteHost: host, RemotePort: port, TPSize: tps[0], PPSize: 1}
			for i, order := range []string{"blocks-first", "registration-first"} {
				id := fmt.Sprintf("cmpl-%d-0", i)
				tokens, key := 100+i*50, uint64(77+i)
				var lr LoadReply
				var wg sync.WaitGroup
				load := func() {
					defer wg.Done()
					lr, _ = d.dec.Load(ctx, LoadRequest{ID: id, Tokens: tokens, Key: key, Params: coords})
				}
				if order == "blocks-first" {
					if _, err := p.pre.Prefill(ctx, PrefillRequest{ID: id, Tokens: tokens, Key: key}); err != nil {
						t.Fatal(err)
					}
					wg.Add(1)
					go load()
				} else {
					wg.Add(1)
					go load()
					waitFor(t, "the registration to land first", func() bool {
						p.pre.mu.Lock()
						defer p.pre.mu.Unlock()
						for r := range p.ranks {
							if !p.pre.push.Parked(r, id) {
								return false
							}
						}
						return true
					})
					if _, err := p.pre.Prefill(ctx, PrefillRequest{ID: id, Tokens: tokens, Key: key}); err != nil {
						t.Fatal(err)
					}
				}
				wg.Wait()
				if lr.Error != "" || lr.CorruptBlocks != 0 {
					t.Fatalf("%s: %s (corrupt %d: %s)", order, lr.Error, lr.CorruptBlocks, lr.Corrupt)
				}
				ev := waitFreed(t, rec, "pushed")
				// Prefill and decode gave the router id different suffixes:
				// matching went through the base id.
				if pushmatch.BaseRequestID(ev.ID) != id || pushmatch.BaseRequestID(lr.RequestID) != id || ev.ID == lr.RequestID {
					t.Errorf("ids: prefill %s decode %s", ev.ID, lr.RequestID)
				}
			}
			if st := p.Stats(); st.BlocksInUse != 0 || st.MalformedNotifs != 0 {
				t.Errorf("prefill after: %+v", st)
			}
		})
	}
}

func TestPushReg(t *testing.T) {
	if pushmatch.BaseRequestID("cmpl-abc-0-1a2b3c4d") != "cmpl-abc-0" || pushmatch.BaseRequestID("cmpl-abc-0") != "cmpl-abc-0" || pushmatch.BaseRequestID("x-1A2B3C4D") != "x-1A2B3C4D" {
		t.Error("BaseRequestID")
	}
	good := map[string]any{"request_id": "r-0a0a0a0a", "decode_engine_id": "d", "decode_host": "h", "decode_port": 1,
		"decode_tp_size": 2, "local_block_ids": []any{[]any{1, 2, 3}}, "remote_engine_id": "p"}
	b, _ := jsonToMsgpack(good)
	if _, ids, err := DecodePushReg(b); err != nil || len(ids) != 3 {
		t.Fatalf("good: %v %v", ids, err)
	}
	good["local_block_ids"] = []any{4, 5}
	b, _ = jsonToMsgpack(good)
	if _, ids, err := DecodePushReg(b); err != nil || len(ids) != 2 {
		t.Fatalf("flat list: %v %v", ids, err)
	}
	for k, v := range map[string]any{"decode_tp_size": 0, "local_block_ids": "x", "decode_port": -1, "request_id": ""} {
		bad := map[string]any{}
		for kk, vv := range good {
			bad[kk] = vv
		}
		bad[k] = v
		b, _ = jsonToMsgpack(bad)
		if _, _, err := DecodePushReg(b); err == nil {
			t.Errorf("%s=%v accepted", k, v)
		}
	}
	if _, _, err := DecodePushReg([]byte("\xc1garbage")); err == nil || !strings.Contains(err.Error(), "PUSH_REG") {
		t.Errorf("garbage: %v", err)
	}
}

func jsonToMsgpack(v map[string]any) ([]byte, error) { return msgpackMarshal(v) }

func msgpackMarshal(v any) ([]byte, error) { return msgpack.Marshal(v) }

func TestSGLangAcrossTP(t *testing.T) {
	for _, tps := range [][2]int{{1, 1}, {2, 1}, {1, 2}, {4, 2}} {
		t.Run(fmt.Sprintf("%d-%d", tps[0], tps[1]), func(t *testing.T) {
			p, d, _ := engines(t, ProtoSGLang, tps[0], tps[1], nil)
			ctx := context.Background()
			for i, tc := range []struct{ tokens, prefix, chunk int }{{100, 0, 32}, {160, 48, 64}, {16, 0, 0}} {
				room := uint64(1<<40 + i)
				var wg sync.WaitGroup
				var pr PrefillReply
				var perr error
				wg.Add(1)
				go func() {
					defer wg.Done()
					pr, perr = p.sgl.prefill(ctx, PrefillRequest{ID: "r", Tokens: tc.tokens, Key: room, Room: room, ChunkTokens: tc.chunk})
				}()
				lr, _ := d.dec.Load(ctx, LoadRequest{ID: "r", Tokens: tc.tokens, PrefixTokens: tc.prefix, Key: room, Room: room, Bootstrap: p.sgl.bootstrapAddr})
				wg.Wait()
				if perr != nil || lr.Error != "" || lr.CorruptBlocks != 0 {
					t.Fatalf("%+v: prefill %v, decode %s (corrupt %d: %s)", tc, perr, lr.Error, lr.CorruptBlocks, lr.Corrupt)
				}
				if pr.TSent < pr.TBootstrapped || lr.TReady < lr.TRegSent {
					t.Errorf("stages out of order: %+v %+v", pr, lr)
				}
			}
			if st := p.Stats(); st.BlocksInUse != 0 || st.MalformedControl != 0 {
				t.Errorf("prefill after: %+v", st)
			}
			if st := d.Stats(); st.BlocksInUse != 0 || st.MalformedNotifs != 0 || st.UnknownNotifs != 0 {
				t.Errorf("decode after: %+v", st)
			}
		})
	}
}

// A prefill whose caller gives up (the driver cancels its calls when the
// decode dies) stops filling and gives its blocks back at once. Its fill
// used to run to the end whatever the context said: on a loaded host a
// long prompt's hundreds of MB of tags kept the call in flight, and its
// blocks held, for seconds after the run had stopped.
func TestPrefillCancelledStopsFilling(t *testing.T) {
	m := testModel()
	m.NumLayers = 32 // 2048 tokens: 128 blocks of 64 regions, 256 MiB of tags
	const tokens = 2048
	for _, tc := range []struct {
		name   string
		cancel func(context.CancelFunc)
	}{
		{"before", func(c context.CancelFunc) { c() }},
		{"during", func(c context.CancelFunc) { time.AfterFunc(time.Millisecond, c) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, err := NewEngine(context.Background(), Config{Role: RolePrefill, Backend: "ucx", Protocol: ProtoPull, Model: m,
				BlockSize: 16, NumBlocks: 160, EngineID: "prefill-c", Knobs: Knobs{DRAMAlloc: "mmap", Verify: Full, Lease: runcore.Duration(10 * time.Second)}}, nil, nil)
			if err != nil {
				t.Fatal(err)
			}
			defer p.Close()
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			tc.cancel(cancel)
			_, err = p.pre.Prefill(ctx, PrefillRequest{ID: "cmpl-c-0", Tokens: tokens, Key: 9})
			if err != context.Canceled {
				t.Fatalf("Prefill = %v, want %v", err, context.Canceled)
			}
			if n := p.alloc.InUse(); n != 0 || p.pre.leases.Len() != 0 {
				t.Errorf("%d blocks and %d leases held after the cancel", n, p.pre.leases.Len())
			}
			// A fresh contiguous allocator gave the request blocks 0..127:
			// the fill stopped, so (most of) them were never written.
			blocks := make([]int, tokens/16)
			for i := range blocks {
				blocks[i] = i
			}
			if bad, _ := p.ranks[0].pool.Check(9, blocks, 0, tokens, Full); bad == 0 {
				t.Errorf("the cancelled request's blocks were filled to the end")
			}
		})
	}
}

// A decode that cannot reach the prefill never reads its blocks; the
// router's abort gives them back at once instead of at the lease's end,
// and a request a decode already read is left to its lease.
func TestPrefillAbortUnread(t *testing.T) {
	p, d, rec := engines(t, ProtoPull, 1, 1, nil)
	ctx := context.Background()
	pr, err := p.pre.Prefill(ctx, PrefillRequest{ID: "cmpl-a-0", Tokens: 100, Key: 7})
	if err != nil {
		t.Fatal(err)
	}
	if p.Stats().BlocksInUse == 0 {
		t.Fatal("the prefill holds no blocks")
	}
	role := newRole(p)
	if ok, err := role.Abort(pr.RequestID); !ok || err != nil {
		t.Fatalf("Abort(%s) = %v, %v; want the unread request aborted", pr.RequestID, ok, err)
	}
	if ev := waitFreed(t, rec, FreedFailed); ev.ID != pr.RequestID {
		t.Errorf("freed %s, want %s", ev.ID, pr.RequestID)
	}
	if st := p.Stats(); st.BlocksInUse != 0 || st.LeasesHeld != 0 || st.Aborted != 1 {
		t.Errorf("after the abort: %d blocks in use, %d leases, %d aborted", st.BlocksInUse, st.LeasesHeld, st.Aborted)
	}
	if ok, _ := role.Abort(pr.RequestID); ok {
		t.Error("a second abort of the same request succeeded")
	}

	// Read by a decode: consumed, and then not abortable.
	pr, err = p.pre.Prefill(ctx, PrefillRequest{ID: "cmpl-a-1", Tokens: 100, Key: 8})
	if err != nil {
		t.Fatal(err)
	}
	if lr, _ := d.dec.Load(ctx, LoadRequest{ID: "cmpl-a-1", Tokens: 100, Key: 8, Params: pr.Params}); lr.Error != "" {
		t.Fatal(lr.Error)
	}
	waitFreed(t, rec, FreedConsumed)
	if ok, _ := role.Abort(pr.RequestID); ok {
		t.Error("aborted a request its decode had read")
	}
}
