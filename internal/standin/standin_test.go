package standin

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/nixlctl/nixlctl/internal/engine"
	"github.com/nixlctl/nixlctl/internal/kv"
	"github.com/nixlctl/nixlctl/internal/nixl"
	_ "github.com/nixlctl/nixlctl/internal/nixl/capi"
	_ "github.com/nixlctl/nixlctl/internal/nixl/ucx"
	"github.com/nixlctl/nixlctl/internal/runcore"
)

func testModel() kv.Model {
	m, _ := kv.Preset("llama-3.1-8b")
	m.NumLayers = 2
	return m
}

// standIn starts a real prefill engine (UCX) behind the API on loopback.
func standIn(t *testing.T, backend string, o Options) (*Server, *engine.Engine, string) {
	t.Helper()
	cfg := engine.Config{Role: engine.RolePrefill, Backend: backend, Protocol: engine.ProtoPull, Model: testModel(),
		BlockSize: 16, NumBlocks: 64,
		EngineID: "standin-prefill", SideChannel: "tcp://127.0.0.1:0", Knobs: engine.Knobs{DRAMAlloc: "mmap", Verify: engine.Full, Lease: runcore.Duration(30 * time.Second)}}
	o.ServedModel = "llama-3.1-8b"
	return serveOnLoopback(t, cfg, CheckConfig, func(eng *engine.Engine) *Server { return New(eng, o, nil) })
}

// servable is a stand-in: the prefill's Server or the decode's
// DecodeServer.
type servable interface {
	Serve(context.Context, net.Listener) error
}

// serveOnLoopback checks cfg as the CLI does (check), starts its engine
// and serves the stand-in that stand makes of it on loopback until the
// test ends, when Serve must return nil. It returns the stand-in, its
// engine and its base URL.
func serveOnLoopback[S servable](t *testing.T, cfg engine.Config, check func(engine.Config) error, stand func(*engine.Engine) S) (S, *engine.Engine, string) {
	t.Helper()
	if err := check(cfg); err != nil {
		t.Fatal(err)
	}
	eng, err := engine.NewEngine(context.Background(), cfg, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := stand(eng)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Serve(ctx, ln) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Serve: %v", err)
		}
		eng.Close()
	})
	return s, eng, "http://" + ln.Addr().String()
}

func post(t *testing.T, url, reqID, body string) (int, map[string]json.RawMessage) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, url, strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	if reqID != "" {
		req.Header.Set("X-Request-Id", reqID)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	var m map[string]json.RawMessage
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatalf("response %q: %v", b, err)
	}
	return resp.StatusCode, m
}

// TestDecodeReadsFromStandIn plays vLLM's proxy and decode against the
// stand-in with nothing but the wire between them: the prefill leg over
// HTTP, kv_transfer_params as the proxy forwards them, the decode's own
// handshake on the side channel, READs, and the completion notification
// that frees the blocks. With the nixl backend the handshake carries NIXL's
// own agent blob, which the decode's NIXL agent loads (skipped where NIXL
// cannot run, docs/backends.md).
func TestDecodeReadsFromStandIn(t *testing.T) {
	for _, backend := range []string{"ucx", "nixl"} {
		t.Run(backend, func(t *testing.T) {
			if _, err := nixl.Resolve(backend); err != nil {
				t.Skip(err)
			}
			decodeReadsFromStandIn(t, backend)
		})
	}
}

func decodeReadsFromStandIn(t *testing.T, backend string) {
	s, pre, base := standIn(t, backend, Options{})
	dec, err := engine.NewEngine(context.Background(), engine.Config{Role: engine.RoleDecode, Backend: backend,
		Protocol: engine.ProtoPull, Model: testModel(), BlockSize: 16, NumBlocks: 64, EngineID: "real-decode", Knobs: engine.Knobs{DRAMAlloc: "mmap", Verify: engine.Full}}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer dec.Close()

	ids := make([]int, 100) // 100 tokens: 7 blocks of 16
	body, _ := json.Marshal(map[string]any{"model": "llama-3.1-8b", "prompt": ids, "max_tokens": 1, "stream": false,
		"kv_transfer_params": map[string]any{"do_remote_decode": true, "do_remote_prefill": false,
			"remote_engine_id": nil, "remote_block_ids": nil, "remote_host": nil, "remote_port": nil}})
	code, m := post(t, base+"/v1/completions", "req-1", string(body))
	if code != http.StatusOK {
		t.Fatalf("status %d: %s", code, m["message"])
	}
	var p engine.TransferParams
	if err := json.Unmarshal(m["kv_transfer_params"], &p); err != nil {
		t.Fatalf("kv_transfer_params: %v", err)
	}
	if !p.DoRemotePrefill || p.RemoteEngineID != "standin-prefill" || len(p.RemoteBlockIDs) != 7 || p.RemoteNumTokens != 100 {
		t.Fatalf("kv_transfer_params = %+v", p)
	}
	if !bytes.Contains(m["kv_transfer_params"], []byte(`"remote_block_ids":[[`)) {
		t.Errorf("remote_block_ids not one list per KV-cache group: %s", m["kv_transfer_params"])
	}
	if n := pre.Stats().BlocksInUse; n != 7 {
		t.Fatalf("stand-in holds %d blocks after the prefill leg, want 7", n)
	}
	rep, err := dec.Load(context.Background(), engine.LoadRequest{ID: "req-1", Tokens: 100, Key: TagKey("req-1"), Params: p})
	if err != nil || rep.Error != "" {
		t.Fatalf("decode: %v %s", err, rep.Error)
	}
	if rep.CorruptBlocks != 0 || rep.Blocks != 7 || rep.Bytes == 0 {
		t.Fatalf("decode read %d blocks, %d bytes, %d corrupt", rep.Blocks, rep.Bytes, rep.CorruptBlocks)
	}
	deadline := time.Now().Add(10 * time.Second)
	for pre.Stats().BlocksInUse != 0 {
		if time.Now().After(deadline) {
			t.Fatalf("stand-in still holds %d blocks 10 s after the decode's notification", pre.Stats().BlocksInUse)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if c := s.Counts(); c.Served != 1 || c.Rejected != 0 || c.Failed != 0 {
		t.Errorf("counts = %+v", c)
	}
	// The decode's handshake was served by the stand-in's side channel
	// (issue 26: the stand-in reported 0 handshakes after serving some).
	if st := pre.Stats(); st.HandshakesServed != 1 {
		t.Errorf("stand-in counted %d handshakes served, want 1", st.HandshakesServed)
	}
}

func TestStandInRefuses(t *testing.T) {
	s, pre, base := standIn(t, "ucx", Options{})
	for _, tc := range []struct {
		name, path, body, want string
	}{
		{"not json", "/v1/completions", "{", "request body"},
		{"no kv_transfer_params", "/v1/completions", `{"prompt":[1,2,3]}`, "serves only prefill legs"},
		{"not a prefill leg", "/v1/completions", `{"prompt":[1,2],"kv_transfer_params":{"do_remote_decode":false}}`, "serves only prefill legs"},
		{"no prompt", "/v1/completions", `{"kv_transfer_params":{"do_remote_decode":true}}`, `no "prompt"`},
		{"batch", "/v1/completions", `{"prompt":[[1],[2]],"kv_transfer_params":{"do_remote_decode":true}}`, "batch of 2"},
		{"empty ids", "/v1/completions", `{"prompt":[],"kv_transfer_params":{"do_remote_decode":true}}`, "prompt of 0 tokens"},
		{"object prompt", "/v1/completions", `{"prompt":{"a":1},"kv_transfer_params":{"do_remote_decode":true}}`, "neither text nor token ids"},
		{"no messages", "/v1/chat/completions", `{"messages":[],"kv_transfer_params":{"do_remote_decode":true}}`, "non-empty list"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, m := post(t, base+tc.path, "", tc.body)
			var msg string
			_ = json.Unmarshal(m["message"], &msg)
			if code != http.StatusBadRequest || !strings.Contains(msg, tc.want) {
				t.Errorf("status %d, message %q; want 400 and %q", code, msg, tc.want)
			}
		})
	}
	if n := pre.Stats().BlocksInUse; n != 0 {
		t.Errorf("%d blocks held after refused requests", n)
	}
	if c := s.Counts(); c.Rejected != 8 || c.Served != 0 {
		t.Errorf("counts = %+v", c)
	}
}

func TestTextPromptTokens(t *testing.T) {
	for _, tc := range []struct {
		name   string
		o      Options
		prompt string
		want   int
	}{
		{"bytes bound", Options{}, `"hello world"`, 11 + textSpecialTokens},
		{"fixed", Options{PromptTokens: 500}, `"hello world"`, 500},
		{"ids exact", Options{PromptTokens: 500}, `[5,6,7]`, 3},
		{"one of a batch", Options{}, `[[5,6,7,8]]`, 4},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := &api{o: tc.o}
			got, err := s.promptTokens(json.RawMessage(tc.prompt))
			if err != nil || got != tc.want {
				t.Errorf("promptTokens(%s) = %d, %v; want %d", tc.prompt, got, err, tc.want)
			}
		})
	}
}

func TestCheckConfig(t *testing.T) {
	for _, cfg := range []engine.Config{
		{Role: engine.RoleDecode, Protocol: engine.ProtoPull, SideChannel: "tcp://127.0.0.1:5600"},
		{Role: engine.RolePrefill, Protocol: engine.ProtoPush, SideChannel: "tcp://127.0.0.1:5600"},
		{Role: engine.RolePrefill, Protocol: engine.ProtoSGLang, SideChannel: "tcp://127.0.0.1:5600"},
		{Role: engine.RolePrefill, Protocol: engine.ProtoPull},
	} {
		if CheckConfig(cfg) == nil {
			t.Errorf("CheckConfig(%+v) accepted", cfg)
		}
	}
}

// FuzzPromptTokens: whatever a client sends as prompt or messages, the
// count is an error or within 1..MaxTokens, never a panic.
func FuzzPromptTokens(f *testing.F) {
	for _, seed := range []string{`"hi"`, `[1,2,3]`, `[[1]]`, `["a"]`, `{}`, `null`, `[[1],[2]]`, `[{"role":"user","content":"x"}]`, `[1e400]`, `[-1]`} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, p string) {
		s := &Server{}
		for _, count := range []func(json.RawMessage) (int, error){s.promptTokens, s.chatTokens} {
			n, err := count(json.RawMessage(p))
			if err == nil && (n < 1 || n > kv.MaxTokens) {
				t.Fatalf("%q counted as %d tokens", p, n)
			}
		}
	})
}

// TestStandInAPIAsVLLM (issue 26): /v1/models reports the model's
// max_model_len (it said kv.MaxTokens), a generated completion id is
// cmpl-<hex> (it read cmpl-cmpl-<hex>), "stream": true is refused rather
// than answered as if false, and a prompt over max_model_len is refused.
func TestStandInAPIAsVLLM(t *testing.T) {
	m := testModel()
	if m.MaxPositions != 131072 {
		t.Fatalf("llama-3.1-8b max_position_embeddings %d, want 131072", m.MaxPositions)
	}
	_, pre, base := standIn(t, "ucx", Options{MaxModelLen: 64})
	resp, err := http.Get(base + "/v1/models")
	if err != nil {
		t.Fatal(err)
	}
	var models struct {
		Data []struct {
			MaxModelLen int `json:"max_model_len"`
		} `json:"data"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&models); err != nil || len(models.Data) != 1 || models.Data[0].MaxModelLen != 64 {
		t.Errorf("/v1/models: %+v, %v; want max_model_len 64", models, err)
	}
	resp.Body.Close()

	leg := `{"prompt":[1,2,3],"kv_transfer_params":{"do_remote_decode":true}`
	code, m1 := post(t, base+"/v1/completions", "", leg+`}`)
	var id string
	_ = json.Unmarshal(m1["id"], &id)
	if code != http.StatusOK || !strings.HasPrefix(id, "cmpl-") || strings.HasPrefix(id, "cmpl-cmpl-") || len(id) != len("cmpl-")+16 {
		t.Errorf("status %d, id %q: want cmpl-<16 hex>", code, id)
	}
	for _, tc := range []struct{ name, body, want string }{
		{"stream", leg + `,"stream":true}`, `"stream": true is not served`},
		{"over max_model_len", `{"prompt":[` + strings.Repeat("1,", 64) + `1],"kv_transfer_params":{"do_remote_decode":true}}`, "maximum context length is 64 tokens. However, your request has 65 input tokens"},
	} {
		code, m := post(t, base+"/v1/completions", "", tc.body)
		var msg string
		_ = json.Unmarshal(m["message"], &msg)
		if code != http.StatusBadRequest || !strings.Contains(msg, tc.want) {
			t.Errorf("%s: status %d, %q; want 400 and %q", tc.name, code, msg, tc.want)
		}
	}
	if n := pre.Stats().BlocksInUse; n != 1 {
		t.Errorf("%d blocks held, want the one leg's 1", n)
	}
}
