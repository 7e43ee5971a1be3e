package handoff

import (
	"context"
	"encoding/json"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/nixlctl/nixlctl/internal/engine"
	"github.com/nixlctl/nixlctl/internal/errkind"
	"github.com/nixlctl/nixlctl/internal/runcore/runcoretest"
)

// fakeSGLangPrefill stands for a real SGLang prefill server: nixlctl's
// SGLang prefill engine (its bootstrap server registering
// prefill_http_port) behind an HTTP API that takes the router's
// /generate with the room, as SGLang's does. It returns the bootstrap URL
// and counts the legs.
func fakeSGLangPrefill(t *testing.T) (string, *atomic.Int64) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	eng, err := engine.NewEngine(context.Background(), engine.Config{Role: engine.RolePrefill, Backend: "ucx", Protocol: engine.ProtoSGLang,
		Model: runcoretest.SmallModel(t), BlockSize: 16, NumBlocks: 256, EngineID: "sglang-prefill",
		SideChannel: "tcp://127.0.0.1:0", Advertise: "127.0.0.1", SGLPrefillHTTPPort: ln.Addr().(*net.TCPAddr).Port, Knobs: engine.Knobs{DRAMAlloc: engine.AllocMmap, Verify: engine.Sparse}}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	legs := new(atomic.Int64)
	mux := http.NewServeMux()
	mux.HandleFunc("POST /generate", func(w http.ResponseWriter, r *http.Request) {
		var req struct {
			InputIDs      []int  `json:"input_ids"`
			BootstrapHost string `json:"bootstrap_host"`
			BootstrapPort int    `json:"bootstrap_port"`
			BootstrapRoom uint64 `json:"bootstrap_room"`
			RID           string `json:"rid"`
		}
		if err := json.NewDecoder(r.Body).Decode(&req); err != nil || len(req.InputIDs) == 0 || req.BootstrapHost == "" || req.BootstrapPort == 0 {
			http.Error(w, "bad generate request", http.StatusBadRequest)
			return
		}
		if _, err := eng.Prefill(r.Context(), engine.PrefillRequest{ID: req.RID, Tokens: len(req.InputIDs), Key: 99, Room: req.BootstrapRoom}); err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		legs.Add(1)
		_, _ = w.Write([]byte(`{"text": "", "meta_info": {}}`))
	})
	srv := &http.Server{Handler: mux}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close(); eng.Close() })
	return "http://" + eng.Setup().Bootstrap, legs
}

// TestHandoffExternalSGLangPrefill: bench sglang --bootstrap sends every
// prefill leg to the external prefill's HTTP API with the room, and
// nixlctl's decode receives the KV through the external bootstrap
// server; the bytes are not nixlctl's tags, so they are not verified.
func TestHandoffExternalSGLangPrefill(t *testing.T) {
	boot, legs := fakeSGLangPrefill(t)
	o := handoffOpts(t, engine.ProtoSGLang, 1, 1)
	o.Inproc, o.Bootstrap, o.ChunkTokens, o.Requests = true, boot, 0, 4
	res, err := RunHandoff(context.Background(), o)
	if err != nil {
		t.Fatal(err)
	}
	if s := res.Summary; s.Requests != 4 || s.Failed != 0 || s.CorruptBlocks != 0 || s.Bytes <= 0 {
		for _, r := range res.Records {
			t.Log(r.Error)
		}
		t.Fatalf("summary %+v", s)
	}
	if n := legs.Load(); n != 5 { // and the warm-up's
		t.Errorf("%d prefill legs reached the external prefill, want 5", n)
	}
	if res.Config.SGLBootstrap != boot {
		t.Errorf("config.sglang_bootstrap %q, want %q", res.Config.SGLBootstrap, boot)
	}
}

func TestBootstrapValidate(t *testing.T) {
	base := handoffOpts(t, engine.ProtoSGLang, 1, 1)
	base.Inproc, base.ChunkTokens, base.Bootstrap = true, 0, "http://127.0.0.1:8998"
	if err := base.Validate(); err != nil {
		t.Fatalf("a valid --bootstrap: %v", err)
	}
	for _, tc := range []struct {
		name, url string
		mut       func(*HandoffOptions)
		field     string
		msg       string
	}{
		{"https", "https://h:1", nil, "Bootstrap", "want http://HOST:PORT"},
		{"no port", "http://h", nil, "Bootstrap", "SGLang's default bootstrap port is 8998"},
		{"path", "http://h:1/route", nil, "Bootstrap", "without a path"},
		{"bare host:port", "h:1", nil, "Bootstrap", "want http://HOST:PORT"},
		{"port 0", "http://h:0", nil, "Bootstrap", "out of range"},
		{"with --prefill", "", func(o *HandoffOptions) { o.Prefill = "x:1" }, "Prefill", "the run's one prefill"},
		{"with --prefills", "", func(o *HandoffOptions) { o.Prefills = 2 }, "Prefills", "the run's one prefill"},
		{"with --chunk-tokens", "", func(o *HandoffOptions) { o.ChunkTokens = 64 }, "ChunkTokens", "chunks, computes and caches by itself"},
		{"with --prefix-hit", "", func(o *HandoffOptions) { o.PrefixHit = 0.5 }, "PrefixHit", "by itself"},
		{"with --xfer-reference", "", func(o *HandoffOptions) { o.XferRef = true }, "XferRef", "by itself"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := base
			if tc.url != "" {
				o.Bootstrap = tc.url
			}
			if tc.mut != nil {
				tc.mut(&o)
			}
			err := o.Validate()
			if !errkind.IsBadInput(err) || !strings.Contains(err.Error(), tc.msg) || !strings.Contains(err.Error(), tc.field) {
				t.Errorf("Validate() = %v, want %s: %q", err, tc.field, tc.msg)
			}
		})
	}
	o := handoffOpts(t, engine.ProtoPull, 1, 1)
	o.Bootstrap = "http://h:1"
	runcoretest.CheckIgnored(t, "bench pull with --bootstrap", o.Ignored(), []string{"Bootstrap"}, nil)
}
