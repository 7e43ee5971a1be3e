package sidechannel

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/vmihailenco/msgpack/v5"
	"go.uber.org/goleak"
)

func TestPyJSONMatchesPython(t *testing.T) {
	t.Parallel()
	// Pinned from CPython 3.11: json.dumps(f, sort_keys=True) and its sha256.
	f := map[string]any{"vllm_version": "nixlctl-dev", "nixl_connector_version": 12, "model": "llama-3.1-8b",
		"dtype": "bfloat16", "num_kv_heads": 8, "head_size": 128, "num_hidden_layers": 32, "attn_backend_name": "FLASH_ATTN",
		"cache_dtype": "auto", "is_hma_enabled": false, "speculative_config": nil, "transfer_mode": "pull",
		"note": "é\u2603\U0001F600\"\\\n", "x": []any{1, 2.5, 3.0}}
	want := `{"attn_backend_name": "FLASH_ATTN", "cache_dtype": "auto", "dtype": "bfloat16", "head_size": 128, "is_hma_enabled": false, "model": "llama-3.1-8b", "nixl_connector_version": 12, "note": "\u00e9\u2603\ud83d\ude00\"\\\n", "num_hidden_layers": 32, "num_kv_heads": 8, "speculative_config": null, "transfer_mode": "pull", "vllm_version": "nixlctl-dev", "x": [1, 2.5, 3.0]}`
	got, err := PyJSON(f)
	if err != nil || got != want {
		t.Fatalf("PyJSON:\n got %s\nwant %s (%v)", got, want, err)
	}
	h, _ := CompatHash(f)
	if h != "75d5db0e0df26965f0a485470d8665581009a7d6d58a206a80394503b27c0804" {
		t.Errorf("hash %s", h)
	}
}

func sampleMeta() AgentMetadata {
	return AgentMetadata{EngineID: "prefill-0", AgentMetadata: []byte("blob"), KVCachesBaseAddr: []uint64{1 << 40, 2 << 40},
		NumBlocks: 100, BlockLens: []int64{4096, 4096}, BlockStrides: []int64{4096, 4096}, KVCacheLayout: "HND", BlockSize: 16,
		AttnBackendName: "FLASH_ATTN", PhysicalBlocksPerLogical: 1, DCPSize: 1, PCPSize: 1,
		Nixlctl: &Extra{Backend: "ucx", TPRank: 1, TPSize: 2, PPSize: 1}}
}

// serveMeta serves sampleMeta as rank (pp, tp) of a handshake for hash on
// a loopback port, with ctx for the test's requests. When the test ends
// the server is stopped and waited for, and then any goroutine left
// behind fails the test.
func serveMeta(t *testing.T, hash string, pp, tp int) (context.Context, *HandshakeServer) {
	t.Helper()
	t.Cleanup(func() { goleak.VerifyNone(t) })
	ctx, cancel := context.WithCancel(context.Background())
	s, err := ServeHandshake(ctx, "tcp://127.0.0.1:0", hash, nil)
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	t.Cleanup(func() { cancel(); s.Wait() })
	if err := s.Set(pp, tp, sampleMeta()); err != nil {
		t.Fatal(err)
	}
	return ctx, s
}

func TestHandshakeRoundTrip(t *testing.T) {
	ctx, s := serveMeta(t, "hash-a", 0, 1)
	h, err := FetchAgentMetadata(ctx, s.Endpoint(), 0, 1, "hash-a", 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	// The server sends the wire form (empty lists, not nulls), so that is
	// what comes back.
	if diff := cmp.Diff(sampleMeta().Wire(), h.Meta); diff != "" {
		t.Error(diff)
	}
	if h.RTT <= 0 || h.ClockOffset.Abs() > h.RTT {
		t.Errorf("same host: offset %v should be within the RTT %v", h.ClockOffset, h.RTT)
	}
	_, err = FetchAgentMetadata(ctx, s.Endpoint(), 0, 1, "hash-b", 5*time.Second)
	if !errors.Is(err, ErrIncompatible) {
		t.Errorf("mismatched hash: %v", err)
	}
	// A rank the engine lacks gets no reply, as from vLLM's listener
	// (whose lookup raises): an error map in place of the payload made a
	// vLLM decode report a missing compatibility_hash.
	_, err = FetchAgentMetadata(ctx, s.Endpoint(), 0, 7, "hash-a", 300*time.Millisecond)
	if err == nil || !strings.Contains(err.Error(), "no reply within") {
		t.Errorf("unknown rank: %v", err)
	}
	if n := s.UnknownRanks(); n != 1 {
		t.Errorf("unknown-rank requests counted: %d, want 1", n)
	}
	// The two metadata replies count as served handshakes (the second was
	// refused by the client, not the server); the unknown rank does not.
	if n := s.Served(); n != 2 {
		t.Errorf("handshakes served: %d, want 2", n)
	}
	// Garbage gets no answer and is counted.
	if _, err := Request(ctx, s.Endpoint(), [][]byte{[]byte("garbage")}, 300*time.Millisecond); err == nil {
		t.Error("garbage request was answered")
	}
	if n, _ := s.Errors(); n < 2 {
		t.Errorf("errors counted: %d", n)
	}
	if _, err := FetchAgentMetadata(ctx, "tcp://127.0.0.1:1", 0, 0, "h", 200*time.Millisecond); err == nil {
		t.Error("nobody listening: want a timeout error")
	}
}

func TestDecodeGetMetaVariants(t *testing.T) {
	t.Parallel()
	b, _ := msgpack.Marshal([]any{[]byte("get_meta_msg"), 0, 3})
	if pp, tp, err := DecodeGetMeta(b); err != nil || pp != 0 || tp != 3 {
		t.Errorf("v12: %d %d %v", pp, tp, err)
	}
	b, _ = msgpack.Marshal([]any{[]byte("get_meta_msg"), 2})
	if pp, tp, err := DecodeGetMeta(b); err != nil || pp != 0 || tp != 2 {
		t.Errorf("v2 two-element form: %d %d %v", pp, tp, err)
	}
	b, _ = msgpack.Marshal([]any{"hello", 0, 1})
	if _, tp, err := DecodeGetMeta(b); err == nil || tp != 1 {
		t.Errorf("wrong message name should be reported but keep ranks: %d %v", tp, err)
	}
	for _, bad := range [][]byte{nil, {0xc1}, []byte("x")} {
		if _, _, err := DecodeGetMeta(bad); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
	b, _ = msgpack.Marshal([]any{[]byte("get_meta_msg"), -1, 0})
	if _, _, err := DecodeGetMeta(b); err == nil {
		t.Error("negative rank accepted")
	}
}

func FuzzDecodeGetMeta(f *testing.F) {
	b, _ := EncodeGetMeta(1, 2)
	f.Add(b)
	f.Fuzz(func(t *testing.T, data []byte) {
		pp, tp, err := DecodeGetMeta(data)
		if err == nil && (pp < 0 || tp < 0) {
			t.Fatal("negative ranks accepted")
		}
	})
}

func FuzzDecodeHandshakeReply(f *testing.F) {
	md, _ := msgpack.Marshal(sampleMeta())
	p, _ := msgpack.Marshal(&HandshakePayload{CompatibilityHash: "h", AgentMetadataBytes: md})
	f.Add(p, tsFrame())
	f.Fuzz(func(t *testing.T, payload, ts []byte) {
		m, _, err := DecodeHandshakeReply([][]byte{payload, ts}, "h")
		if err == nil && (m.EngineID == "" || m.NumBlocks <= 0 || len(m.BlockLens) != len(m.KVCachesBaseAddr)) {
			t.Fatalf("accepted incomplete metadata %+v", m)
		}
	})
}

func TestPyJSONCompactMatchesPython(t *testing.T) {
	t.Parallel()
	// Pinned from CPython 3.11: json.dumps(f, separators=(",", ":")) and
	// its sha256, the encoder-cache connector's form.
	f := []any{"nixlctl-dev", "mod\u00e9l\U0001F600\"\\", "float16", 7168, nil, true, 2.5, 3.0}
	want := `["nixlctl-dev","mod\u00e9l\ud83d\ude00\"\\","float16",7168,null,true,2.5,3.0]`
	got, err := PyJSONCompact(f)
	if err != nil || got != want {
		t.Fatalf("PyJSONCompact:\n got %s\nwant %s (%v)", got, want, err)
	}
	// sha256(json.dumps(["0.27.0","Qwen/Qwen3.5-4B","bfloat16",5120], separators=(",",":")))
	if h := ECCompatHash("0.27.0", "Qwen/Qwen3.5-4B", "bfloat16", 5120); h != "aa61f54a206839d037fa53a6030c86f403c488b2bfc780406a18d10bd258a4d9" {
		t.Errorf("EC compat hash %s", h)
	}
	if m, _ := PyJSONCompact(map[string]any{"b": 1, "a": []any{}}); m != `{"a":[],"b":1}` {
		t.Errorf("compact map: %s", m)
	}
}

func TestAsyncRouterDeferredReplies(t *testing.T) {
	defer goleak.VerifyNone(t)
	ctx, cancel := context.WithCancel(context.Background())
	r, err := ListenAsyncRouter(ctx, "tcp://127.0.0.1:0", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { cancel(); r.Wait() }()
	d, err := DialDealerWith(r.Endpoint(), ECDealerOptions)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	for _, s := range []string{"one", "two"} {
		if err := d.Send([][]byte{[]byte(s)}); err != nil {
			t.Fatal(err)
		}
	}
	var got []Msg
	for len(got) < 2 {
		select {
		case m := <-r.In():
			got = append(got, m)
		case <-time.After(5 * time.Second):
			t.Fatal("no request arrived")
		}
	}
	if !got[0].Delim || string(got[0].Frames[0]) != "one" {
		t.Fatalf("first message %+v", got[0])
	}
	// Answer out of order, from another goroutine.
	errc := make(chan error, 2)
	go func() { errc <- r.Reply(got[1], [][]byte{[]byte("re-two")}) }()
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
	if err := r.Reply(got[0], [][]byte{[]byte("re-one")}); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"re-two", "re-one"} {
		frames, err := d.Recv(ctx, 5*time.Second)
		if err != nil || len(frames) != 1 || string(frames[0]) != want {
			t.Fatalf("reply %q: %q %v", want, frames, err)
		}
	}
	cancel()
	r.Wait()
	if err := r.Reply(got[0], nil); !errors.Is(err, ErrRouterClosed) {
		t.Errorf("reply after stop: %v", err)
	}
	if _, ok := <-r.In(); ok {
		t.Error("In still open after stop")
	}
}

// One REQ socket carries several requests in turn, as vLLM's handshake
// client asks every rank on one; after a request that got no reply it
// refuses to send rather than breaking REQ's alternation.
func TestReqConnSeveralRequests(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	r, err := ListenRouter(ctx, "tcp://127.0.0.1:0", func(frames [][]byte) ([][]byte, error) {
		if string(frames[0]) == "silence" {
			return nil, nil
		}
		return [][]byte{append([]byte("re:"), frames[0]...)}, nil
	}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { cancel(); r.Wait() }()
	c, err := DialReq(r.Endpoint())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	for _, m := range []string{"a", "b", "c"} {
		got, err := c.Request(ctx, [][]byte{[]byte(m)}, 2*time.Second)
		if err != nil || len(got) != 1 || string(got[0]) != "re:"+m {
			t.Fatalf("%s: %q %v", m, got, err)
		}
	}
	if _, err := c.Request(ctx, [][]byte{[]byte("silence")}, 200*time.Millisecond); err == nil || !strings.Contains(err.Error(), "no reply within 200ms") {
		t.Fatalf("silence: %v", err)
	}
	if _, err := c.Request(ctx, [][]byte{[]byte("d")}, time.Second); err == nil || !strings.Contains(err.Error(), "cannot send") {
		t.Fatalf("after silence: %v", err)
	}
}
