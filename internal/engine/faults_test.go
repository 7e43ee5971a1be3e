package engine

import (
	"bytes"
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nixlctl/nixlctl/internal/kv"
	"github.com/nixlctl/nixlctl/internal/runcore"
	"github.com/nixlctl/nixlctl/internal/sidechannel"
)

// waitStat polls a counter until it reaches want.
func waitStat(t *testing.T, what string, get func() int64, want int64) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for get() < want {
		if time.Now().After(deadline) {
			t.Fatalf("%s: %d, want %d", what, get(), want)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// A peer sending garbage gets counted, logged events; the engine keeps
// serving real requests.
func TestMalformedAndUnknownNotifications(t *testing.T) {
	p, d, rec := engines(t, ProtoPush, 1, 1, nil)
	ctx := context.Background()
	// Give decode's agent prefill's metadata so it can talk to it.
	host, port, _ := splitEndpoint(p.side.Endpoint())
	params := TransferParams{RemoteEngineID: p.cfg.EngineID, RemoteHost: host, RemotePort: port, TPSize: 1}
	if _, _, err := d.handshake(ctx, p.cfg.EngineID, params.SideEndpoint(), []int{0}, [][2]int{{0, 0}}); err != nil {
		t.Fatal(err)
	}
	re := d.remotes[p.cfg.EngineID]
	name := re.agentName(0, 0)
	a := d.ranks[0].agent
	good, _ := msgpackMarshal(map[string]any{"request_id": "r-01234567", "decode_engine_id": "d", "decode_port": 1, "decode_tp_size": 1, "local_block_ids": []int{1}})
	for _, m := range []string{
		"PUSH_REG:\xc1\xc1",                      // not msgpack
		"PUSH_REG:" + string(good[:len(good)/2]), // truncated
		"PUSH_REG:" + string(good[:0]),           // empty
		"hello",                                  // no colon
		"req:notanumber",                         // bad count
		"req:0",                                  // zero consumers
		"req:-3",
		"",
	} {
		if err := a.SendNotif(name, []byte(m)); err != nil {
			t.Fatal(err)
		}
	}
	waitStat(t, "malformed", func() int64 { return p.Stats().MalformedNotifs }, 8)
	// Well-formed, but for requests nobody has.
	_ = a.SendNotif(name, []byte("cmpl-ghost-01234567:1"))
	waitStat(t, "unknown", func() int64 { return p.Stats().UnknownNotifs }, 1)
	// A registration for a request prefill never saw stays parked, harmless.
	_ = a.SendNotif(name, append([]byte("PUSH_REG:"), good...))
	// And the engines still work.
	var lr LoadReply
	done := make(chan struct{})
	go func() {
		lr, _ = d.dec.Load(ctx, LoadRequest{ID: "real", Tokens: 64, Key: 9, Params: params})
		close(done)
	}()
	if _, err := p.pre.Prefill(ctx, PrefillRequest{ID: "real", Tokens: 64, Key: 9}); err != nil {
		t.Fatal(err)
	}
	<-done
	if lr.Error != "" || lr.CorruptBlocks != 0 {
		t.Fatalf("after garbage: %+v", lr)
	}
	waitFreed(t, rec, "pushed")
}

func TestCompatibilityMismatchRefused(t *testing.T) {
	p, _, _ := engines(t, ProtoPull, 1, 1, nil)
	cfg := Config{Role: RoleDecode, Backend: "ucx", Protocol: ProtoPull, Model: testModel(), KVDType: kv.FP8, BlockSize: 16,
		NumBlocks: 16, EngineID: "decode-fp8", Knobs: Knobs{DRAMAlloc: "mmap"}}
	d, err := NewEngine(context.Background(), cfg, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	pr, err := p.pre.Prefill(context.Background(), PrefillRequest{ID: "x", Tokens: 32, Key: 1})
	if err != nil {
		t.Fatal(err)
	}
	lr, _ := d.dec.Load(context.Background(), LoadRequest{ID: "x", Tokens: 32, Key: 1, Params: pr.Params})
	if !strings.Contains(lr.Error, "incompatible KV layout") {
		t.Fatalf("fp8 decode against bf16 prefill: %q", lr.Error)
	}
	if d.Stats().HandshakeFails != 1 || d.Stats().BlocksInUse != 0 {
		t.Errorf("decode after: %+v", d.Stats())
	}
}

func TestSGLangInboxGarbage(t *testing.T) {
	p, _, _ := engines(t, ProtoSGLang, 1, 1, nil)
	push, err := sidechannel.DialPush(p.sgl.ranks[0].inbox.Endpoint(), time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer push.Close()
	for _, frames := range [][][]byte{
		{[]byte("hello")},
		{[]byte(sidechannel.SGLGuard)},
		{[]byte(sidechannel.SGLGuard), []byte("None"), []byte("ip")},                // truncated registration
		{[]byte(sidechannel.SGLGuard), []byte("12"), []byte("ip"), []byte("99999")}, // truncated transfer info
		{[]byte("ABORT"), []byte("not-a-room")},
		sidechannel.SGLTransferInfo{Room: 5, DecodeIP: "h", DecodePort: 1, AgentName: "stranger", RequiredDst: 1}.Encode(), // unregistered agent
	} {
		if err := push.Send(frames); err != nil {
			t.Fatal(err)
		}
	}
	waitStat(t, "malformed control", func() int64 { return p.Stats().MalformedControl }, 6)
}

func TestUnknownRemoteBlocksRefused(t *testing.T) {
	p, d, _ := engines(t, ProtoPull, 1, 1, nil)
	pr, _ := p.pre.Prefill(context.Background(), PrefillRequest{ID: "x", Tokens: 32, Key: 1})
	pr.Params.RemoteBlockIDs = []int{0, 1 << 20} // a block the peer does not have
	lr, _ := d.dec.Load(context.Background(), LoadRequest{ID: "x", Tokens: 32, Key: 1, Params: pr.Params})
	if !strings.Contains(lr.Error, "outside the peer's") {
		t.Fatalf("bogus block id: %q", lr.Error)
	}
	if d.Stats().BlocksInUse != 0 {
		t.Error("decode kept blocks of a refused request")
	}
}

func TestPushWatchdogAndHeartbeat(t *testing.T) {
	clk := newFakeClock()
	p, d, rec := engines(t, ProtoPush, 1, 1, func(c *Config) {
		c.Clock, c.RegTimeout, c.Lease, c.RegWatchdog = clk, runcore.Duration(300*time.Millisecond), runcore.Duration(600*time.Millisecond), WatchdogFail
	})
	host, port, _ := splitEndpoint(p.side.Endpoint())
	params := TransferParams{RemoteEngineID: p.cfg.EngineID, RemoteHost: host, RemotePort: port, TPSize: 1}
	// Decode registers for a request prefill never runs: the watchdog fails it.
	loaded := loadAsync(d, LoadRequest{ID: "lonely", Tokens: 64, Key: 1, Params: params})
	waitWaiting(t, d)
	d.dec.watchdog(clk.Advance(300 * time.Millisecond))
	if lr := <-loaded; !strings.Contains(lr.Error, "watchdog") || d.Stats().RegTimeouts != 1 || d.Stats().BlocksInUse != 0 {
		t.Fatalf("watchdog: %q %+v", lr.Error, d.Stats())
	}
	// Prefill runs a request nobody registers for: the lease frees it, and
	// heartbeats keep it alive past the lease first.
	pr, _ := p.pre.Prefill(context.Background(), PrefillRequest{ID: "orphan", Tokens: 64, Key: 2})
	for i := 0; i < 5; i++ {
		now := clk.Advance(200 * time.Millisecond)
		p.pre.onHeartbeat([]string{pr.RequestID, "unknown-id"})
		p.pre.step(now)
	}
	if p.Stats().BlocksInUse == 0 {
		t.Fatal("heartbeats did not keep the lease alive")
	}
	p.pre.step(clk.Advance(600 * time.Millisecond))
	ev := waitFreed(t, rec, "expired")
	if ev.ID != pr.RequestID || p.Stats().ExpiredLeases != 1 {
		t.Errorf("expired %+v", ev)
	}
}

// A PUSH_REG whose payload nests without end is refused, not a stack
// overflow that kills prefill.
func TestDecodePushRegDeepNesting(t *testing.T) {
	if _, _, err := DecodePushReg(bytes.Repeat([]byte{0x91}, 20<<20)); err == nil || !strings.Contains(err.Error(), "nested deeper") {
		t.Errorf("%v", err)
	}
}

func FuzzDecodePushReg(f *testing.F) {
	good, _ := msgpackMarshal(map[string]any{"request_id": "r", "decode_engine_id": "d", "decode_port": 7, "decode_tp_size": 2, "local_block_ids": [][]int{{1, 2}}})
	f.Add(good)
	f.Fuzz(func(t *testing.T, b []byte) {
		r, ids, err := DecodePushReg(b)
		if err == nil && (r.RequestID == "" || r.DecodeTPSize <= 0 || slicesAnyNeg(ids)) {
			t.Fatalf("accepted %+v %v", r, ids)
		}
	})
}

func slicesAnyNeg(xs []int) bool {
	for _, x := range xs {
		if x < 0 {
			return true
		}
	}
	return false
}

func FuzzParseCompletion(f *testing.F) {
	f.Add("cmpl-1-0-abcdef01:2")
	f.Add("a:b:3")
	f.Fuzz(func(t *testing.T, s string) {
		id, n, ok := parseCompletion(s)
		if ok && (id == "" || n <= 0 || fmt.Sprintf("%s:%d", id, n) != s) {
			t.Fatalf("%q -> %q %d", s, id, n)
		}
	})
}

// A decode that hashes vLLM's factors (--compat-factors) refuses a prefill
// whose hash differs, like a real engine; with NoCompatCheck
// (enforce_handshake_compat=false) it reads anyway.
func TestCompatFactorsAndNoCheck(t *testing.T) {
	factors := []byte(`{"vllm_version": "0.11.1", "nixl_connector_version": 12, "model": "meta-llama/Llama-3.1-8B-Instruct", "dtype": "torch.bfloat16",
		"num_kv_heads": 8, "head_size": 128, "num_hidden_layers": 32, "attn_backend_name": "FLASH_ATTN", "cache_dtype": "auto",
		"is_hma_enabled": false, "speculative_config": null, "transfer_mode": "pull"}`)
	p, _, _ := engines(t, ProtoPull, 1, 1, nil)
	for _, tc := range []struct {
		name    string
		noCheck bool
		refused bool
	}{{"checked", false, true}, {"not checked", true, false}} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := Config{Role: RoleDecode, Backend: "ucx", Protocol: ProtoPull, Model: testModel(), BlockSize: 16,
				NumBlocks: 16, EngineID: "decode-" + tc.name, CompatFactors: factors, NoCompatCheck: tc.noCheck, Merge: true, Knobs: Knobs{DRAMAlloc: "mmap", Verify: Full, Lease: runcore.Duration(10 * time.Second), RegTimeout: runcore.Duration(10 * time.Second)}}
			d, err := NewEngine(context.Background(), cfg, nil, nil)
			if err != nil {
				t.Fatal(err)
			}
			defer d.Close()
			if d.Setup().CompatHash != "c5d032bc3fabbf32974fde0fbafa3cd4b7657e9c703fcab1739f79d71df8230f" {
				t.Fatalf("advertised %s, not the hash vLLM computes from the factors", d.Setup().CompatHash)
			}
			pr, err := p.pre.Prefill(context.Background(), PrefillRequest{ID: "c-" + tc.name, Tokens: 32, Key: 1})
			if err != nil {
				t.Fatal(err)
			}
			lr, _ := d.dec.Load(context.Background(), LoadRequest{ID: "c-" + tc.name, Tokens: 32, Key: 1, Params: pr.Params})
			if refused := strings.Contains(lr.Error, "incompatible KV layout"); refused != tc.refused {
				t.Fatalf("refused %v (error %q), want %v", refused, lr.Error, tc.refused)
			}
			if !tc.refused && (lr.Error != "" || lr.CorruptBlocks != 0) {
				t.Errorf("unchecked read: %+v", lr)
			}
		})
	}
}
