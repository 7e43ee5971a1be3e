package probe

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/vmihailenco/msgpack/v5"

	"github.com/nixlctl/nixlctl/internal/engine"
	"github.com/nixlctl/nixlctl/internal/errkind"
	"github.com/nixlctl/nixlctl/internal/kv"
	"github.com/nixlctl/nixlctl/internal/report"
	"github.com/nixlctl/nixlctl/internal/runcore"
	"github.com/nixlctl/nixlctl/internal/sidechannel"
	"github.com/nixlctl/nixlctl/internal/testkit"
)

func TestParseTarget(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ proto, in, want, err string }{
		{ProtoVLLM, "127.0.0.1:5600", "tcp://127.0.0.1:5600", ""},
		{ProtoVLLM, "tcp://prefill-0:5601", "tcp://prefill-0:5601", ""},
		{ProtoVLLM, "[::1]:5600", "tcp://[::1]:5600", ""},
		{ProtoSGLang, "http://10.0.0.2:8998/", "10.0.0.2:8998", ""},
		{ProtoSGLang, "10.0.0.2:8998", "10.0.0.2:8998", ""},
		{ProtoVLLM, "", "", "no target"},
		{ProtoVLLM, "tcp://", "", "no target"},
		{ProtoVLLM, "127.0.0.1", "", "want HOST:PORT"},
		{ProtoVLLM, "127.0.0.1:0", "", `port "0" is not a port`},
		{ProtoVLLM, "127.0.0.1:70000", "", `port "70000" is not a port`},
		{ProtoVLLM, "127.0.0.1:http", "", `port "http" is not a port`},
		{ProtoVLLM, ":5600", "", "no host"},
		{ProtoVLLM, "http://h:1", "", "want HOST:PORT or tcp://HOST:PORT"},
		{ProtoSGLang, "tcp://h:1", "", "want HOST:PORT or http://HOST:PORT"},
		{"mooncake", "h:1", "", `--protocol "mooncake": want vllm or sglang`},
	} {
		got, err := ParseTarget(tc.proto, tc.in)
		if tc.err == "" {
			if err != nil || got != tc.want {
				t.Errorf("%s %q: %q %v, want %q", tc.proto, tc.in, got, err, tc.want)
			}
			continue
		}
		if err == nil || !strings.Contains(err.Error(), tc.err) || !errkind.IsBadInput(err) {
			t.Errorf("%s %q: %v, want bad input %q", tc.proto, tc.in, err, tc.err)
		}
	}
}

// startEngine runs one of nixlctl's prefill engines in this process.
func startEngine(t *testing.T, proto engine.Protocol, tp int, mut func(*engine.Config)) engine.SetupReply {
	t.Helper()
	m, err := kv.Preset("llama-3.1-8b")
	if err != nil {
		t.Fatal(err)
	}
	m.NumLayers = 2
	cfg := engine.Config{Role: engine.RolePrefill, Backend: "ucx", Protocol: proto, Model: m, BlockSize: 16, NumBlocks: 32, TP: tp, EngineID: "prefill-probe", Knobs: engine.Knobs{DRAMAlloc: "mmap", Lease: runcore.Duration(10 * time.Second), RegTimeout: runcore.Duration(10 * time.Second)}}
	if mut != nil {
		mut(&cfg)
	}
	e, err := engine.NewEngine(context.Background(), cfg, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(e.Close)
	return e.Setup()
}

// Against nixlctl's own vLLM-style prefill: everything its handshake
// says comes out, and the compatibility check compares with the hash vLLM
// computes from the factors.
func TestProbeVLLMAgainstEngine(t *testing.T) {
	factors := `{"vllm_version": "0.11.1", "nixl_connector_version": 12, "model": "meta-llama/Llama-3.1-8B-Instruct", "dtype": "torch.bfloat16", "num_kv_heads": 8, "head_size": 128, "num_hidden_layers": 32, "attn_backend_name": "FLASH_ATTN", "cache_dtype": "auto", "is_hma_enabled": false, "speculative_config": null, "transfer_mode": "pull"}`
	const hash = "c5d032bc3fabbf32974fde0fbafa3cd4b7657e9c703fcab1739f79d71df8230f"
	s := startEngine(t, engine.ProtoPull, 2, func(c *engine.Config) { c.CompatFactors = json.RawMessage(factors) })
	res, err := RunSideChannel(context.Background(), SideChannelOptions{Protocol: ProtoVLLM, Target: s.SideChannel, Timeout: 5 * time.Second,
		OneRank: true, TPRank: 1, WantHash: hash, HashFrom: "--compat-factors f.json"})
	if err != nil {
		t.Fatal(err)
	}
	h := res.VLLM
	if h.EngineID != "prefill-probe" || h.CompatHash != hash || h.CompatMatch == nil || !*h.CompatMatch || h.TPSize != 2 || h.TPRank != 1 ||
		h.KVCacheLayout != "HND" || h.BlockSize != 16 || h.NumBlocks != 32 || h.Regions == 0 || len(h.BlockLens) != h.Regions ||
		h.AgentName == "" || h.AgentBlobFormat != "nixlctl ucx" || h.RTTMs <= 0 || h.MetadataBytes == 0 || h.Backend != "ucx" {
		t.Errorf("%+v", h)
	}
	// Same host, same clock: the offset is within the round trip.
	if h.ClockOffsetMs > h.RTTMs+1 || h.ClockOffsetMs < -h.RTTMs-1 {
		t.Errorf("clock offset %.3f ms with a %.3f ms round trip", h.ClockOffsetMs, h.RTTMs)
	}
	var out strings.Builder
	if err := report.Write(&out, report.FormatTable, res); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"engine id prefill-probe", "agent prefill-probe-tp1 (nixlctl ucx blob,", "compat check matches --compat-factors f.json",
		"TP size 2", "KV layout HND, 16-token blocks, 32 blocks", "block lengths 16384 B ×4"} {
		if !strings.Contains(squash(out.String()), want) {
			t.Errorf("table lacks %q:\n%s", want, out.String())
		}
	}

	// A hash that differs is reported and fails the check.
	res, err = RunSideChannel(context.Background(), SideChannelOptions{Protocol: ProtoVLLM, Target: s.SideChannel, Timeout: 5 * time.Second,
		WantHash: strings.Repeat("0", 64), HashFrom: "--compat-hash"})
	if !errkind.IsCheckFailed(err) || res == nil || res.VLLM == nil || *res.VLLM.CompatMatch {
		t.Errorf("mismatch: %v %+v", err, res)
	}
	// A rank the engine does not have: no reply, as from vLLM's listener.
	if _, err := RunSideChannel(context.Background(), SideChannelOptions{Protocol: ProtoVLLM, Target: s.SideChannel, Timeout: 300 * time.Millisecond,
		OneRank: true, TPRank: 5}); err == nil || !strings.Contains(err.Error(), "no reply within") {
		t.Errorf("unknown rank: %v", err)
	}
}

// squash collapses runs of spaces, so tests do not depend on column widths.
func squash(s string) string {
	lines := strings.Split(s, "\n")
	for i, l := range lines {
		lines[i] = strings.Join(strings.Fields(l), " ")
	}
	return strings.Join(lines, "\n")
}

// fakePeer is a misbehaving vLLM side channel: a ZMQ ROUTER that answers
// get_meta_msg with whatever reply gives (nil: never answers).
func fakePeer(t *testing.T, reply func() [][]byte) string {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	r, err := sidechannel.ListenRouter(ctx, "tcp://127.0.0.1:0", func([][]byte) ([][]byte, error) { return reply(), nil }, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cancel(); r.Wait() })
	return r.Endpoint()
}

func TestProbeVLLMFakePeers(t *testing.T) {
	mp := func(v any) []byte { b, _ := msgpack.Marshal(v); return b }
	ts := mp(1.5)
	payload := func(md map[string]any) []byte {
		return mp(map[string]any{"compatibility_hash": "h", "agent_metadata_bytes": mp(md)})
	}
	good := map[string]any{"engine_id": "e", "agent_metadata": []byte("x"), "kv_caches_base_addr": []any{4096}, "device_id": 0,
		"num_blocks": 8, "block_lens": []any{64}, "block_strides": []any{64}, "kv_cache_layout": "NHD", "block_size": 16,
		"ssm_sizes": []any{0, 0}, "attn_backend_name": "FLASH_ATTN", "physical_blocks_per_logical_kv_block": 1}
	with := func(k string, v any) map[string]any {
		m := map[string]any{}
		for a, b := range good {
			m[a] = b
		}
		m[k] = v
		return m
	}
	full := payload(good)
	for _, tc := range []struct {
		name  string
		reply [][]byte
		want  string
	}{
		{"garbage", [][]byte{[]byte("GET / HTTP/1.1\r\n"), ts}, "NixlHandshakePayload: not msgpack"},
		{"truncated msgpack", [][]byte{full[:len(full)-5], ts}, "NixlHandshakePayload: not msgpack: truncated"},
		{"one frame", [][]byte{full}, "reply: 1 frames, want 2"},
		{"wrong type", [][]byte{payload(with("num_blocks", "eight")), ts}, "NixlAgentMetadata.num_blocks: want int, got str"},
		{"null list", [][]byte{payload(with("ssm_sizes", nil)), ts}, "NixlAgentMetadata.ssm_sizes: null"},
		{"timestamp a map", [][]byte{full, mp(map[string]any{})}, "timestamp: want a float"},
		{"never answers", nil, "no reply within 300ms"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ep := fakePeer(t, func() [][]byte { return tc.reply })
			start := time.Now()
			res, err := RunSideChannel(context.Background(), SideChannelOptions{Protocol: ProtoVLLM, Target: ep, Timeout: 300 * time.Millisecond})
			if err == nil || !strings.Contains(err.Error(), tc.want) || res != nil {
				t.Fatalf("got %v (%+v), want %q", err, res, tc.want)
			}
			if errkind.IsBadInput(err) {
				t.Errorf("%v is not the user's fault", err)
			}
			if time.Since(start) > 3*time.Second {
				t.Errorf("took %v with a 300ms timeout", time.Since(start))
			}
		})
	}
	// The well-formed fake reads, with what it did not say left out.
	res, err := RunSideChannel(context.Background(), SideChannelOptions{Protocol: ProtoVLLM, Target: fakePeer(t, func() [][]byte { return [][]byte{full, ts} }),
		Timeout: time.Second})
	if err != nil || res.VLLM.TPSize != 0 || res.VLLM.AgentBlobFormat != "opaque" || len(res.Ranks) != 1 ||
		!strings.HasPrefix(res.Discovery, "rank (0, 0) only: vLLM's handshake does not carry the TP size") {
		t.Errorf("%v %+v", err, res)
	}
}

func TestAgentName(t *testing.T) {
	t.Parallel()
	classic := append([]byte("nixlSerDes|Agent"), 5, 0, 0, 0, 0, 0, 0, 0)
	classic = append(classic, "abcde|Conn..."...)
	if n, f := AgentName(classic); n != "abcde" || f != "NIXL" {
		t.Errorf("classic NIXL blob: %q %q", n, f)
	}
	if n, f := AgentName(append([]byte("nixlSerDes|Agent"), 0xff, 0xff)); n != "" || f != "NIXL (name not read)" {
		t.Errorf("short NIXL blob: %q %q", n, f)
	}
	if n, f := AgentName([]byte("whatever")); n != "" || f != "opaque" {
		t.Errorf("opaque: %q %q", n, f)
	}
}

// Against nixlctl's own SGLang prefill (TP 2): the server info, both
// ranks, health, and /query_dp_ranks.
func TestProbeSGLangAgainstEngine(t *testing.T) {
	s := startEngine(t, engine.ProtoSGLang, 2, nil)
	res, err := RunSideChannel(context.Background(), SideChannelOptions{Protocol: ProtoSGLang, Target: s.Bootstrap, Timeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	b := res.SGLang
	if b.Health != "OK" || b.Info == nil || b.Info.AttnTPSize != 2 || b.Info.DPSize != 1 || b.Info.PageSize == nil || *b.Info.PageSize != 16 ||
		!b.Info.FollowBootstrapRoom || b.Info.PrefillHTTPPort != nil || len(b.Ranks) != 2 || b.Ranks[1].TPRank != 1 || b.Ranks[1].RankPort == 0 ||
		b.QueryDPRanks != "ok" {
		t.Errorf("%+v %+v", b, b.Info)
	}
	var out strings.Builder
	if err := report.Write(&out, report.FormatTable, res); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"health OK", "attn tp 2, attn cp 1, dp 1, pp 1", "query_dp_ranks ok", "ranks (GET /route per rank)"} {
		if !strings.Contains(squash(out.String()), want) {
			t.Errorf("table lacks %q:\n%s", want, out.String())
		}
	}
}

// fakeBootstrap is a misbehaving SGLang bootstrap server.
func fakeBootstrap(t *testing.T, info string, rank func(q string) (int, string)) string {
	t.Helper()
	mux := http.NewServeMux()
	mux.HandleFunc("/health", func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("OK")) })
	mux.HandleFunc("/route", func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Query().Get("target_tp_rank") == "-1" {
			if info == "hang" {
				time.Sleep(2 * time.Second)
			}
			if info == "503" {
				http.Error(w, "Prefill server not fully registered yet (1 workers registered).", http.StatusServiceUnavailable)
				return
			}
			_, _ = w.Write([]byte(info))
			return
		}
		code, body := rank(r.URL.RawQuery)
		w.WriteHeader(code)
		_, _ = w.Write([]byte(body))
	})
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	return srv.Listener.Addr().String()
}

func TestProbeSGLangFakePeers(t *testing.T) {
	const info = `{"attn_tp_size": 1, "attn_cp_size": 1, "dp_size": 1, "pp_size": 2, "page_size": 64, "kv_cache_dtype": "auto", "follow_bootstrap_room": false, "enable_dsa_cache_layer_split": false, "prefill_http_port": 30000}`
	okRank := func(string) (int, string) { return 200, `{"rank_ip": "10.0.0.3", "rank_port": 41000}` }
	for _, tc := range []struct {
		name, info string
		rank       func(string) (int, string)
		want       string
	}{
		{"not ready", "503", okRank, "still registering"},
		{"garbage info", "<html>", okRank, "PrefillServerInfo: not JSON"},
		{"size a string", strings.Replace(info, `"attn_tp_size": 1`, `"attn_tp_size": "1"`, 1), okRank, "PrefillServerInfo.attn_tp_size: want an integer, got string"},
		{"zero dp", strings.Replace(info, `"dp_size": 1`, `"dp_size": 0`, 1), okRank, "PrefillServerInfo.dp_size: 0 out of range"},
		{"no follow", strings.Replace(info, `"follow_bootstrap_room": false, `, ``, 1), okRank, "PrefillServerInfo.follow_bootstrap_room: missing"},
		{"missing rank", info, func(q string) (int, string) {
			if strings.Contains(q, "target_pp_rank=1") {
				return 404, "Bootstrap info not found"
			}
			return okRank(q)
		}, "rank dp 0, cp 0, tp 0, pp 1: GET /route answered 404"},
		{"port a string", info, func(string) (int, string) { return 200, `{"rank_ip": "10.0.0.3", "rank_port": "41000"}` }, "PrefillRankInfo.rank_port: want an integer, got string"},
		{"hangs", "hang", okRank, "no answer within 300ms"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			addr := fakeBootstrap(t, tc.info, tc.rank)
			_, err := RunSideChannel(context.Background(), SideChannelOptions{Protocol: ProtoSGLang, Target: addr, Timeout: 300 * time.Millisecond})
			testkit.WantErr(t, err, tc.want)
		})
	}
	// A server without /query_dp_ranks, whose prefill does not follow the
	// room: listed, with a note.
	res, err := RunSideChannel(context.Background(), SideChannelOptions{Protocol: ProtoSGLang, Target: fakeBootstrap(t, info, okRank), Timeout: time.Second})
	if err != nil || len(res.SGLang.Ranks) != 2 || !strings.HasPrefix(res.SGLang.QueryDPRanks, "404") || len(res.Notes) != 1 {
		t.Errorf("%v %+v", err, res)
	}
	// Nothing listening: an error, not a hang.
	_, err = RunSideChannel(context.Background(), SideChannelOptions{Protocol: ProtoSGLang, Target: "127.0.0.1:1", Timeout: time.Second})
	if err == nil || !strings.Contains(err.Error(), "GET http://127.0.0.1:1/health") {
		t.Errorf("nothing listening: %v", err)
	}
}

func ExampleParseTarget() {
	ep, _ := ParseTarget(ProtoVLLM, "prefill-0:5600")
	fmt.Println(ep)
	// Output: tcp://prefill-0:5600
}

// FuzzReadPrefillInfo: no bootstrap reply makes the readers panic, and
// what they accept is usable by a decode.
func FuzzReadPrefillInfo(f *testing.F) {
	f.Add([]byte(`{"attn_tp_size": 2, "attn_cp_size": 1, "dp_size": 1, "pp_size": 1, "page_size": 16, "kv_cache_dtype": "bf16", "follow_bootstrap_room": true, "enable_dsa_cache_layer_split": false, "prefill_http_port": null}`))
	f.Add([]byte(`{"rank_ip": "127.0.0.1", "rank_port": 40000}`))
	f.Add([]byte(`{"attn_tp_size": 1e3, "page_size": -1, "rank_port": 99999999999999999999}`))
	f.Add([]byte(`[{}] {}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		if info, err := ReadPrefillServerInfo(b); err == nil {
			if info.AttnTPSize < 1 || info.AttnCPSize < 1 || info.DPSize < 1 || info.PPSize < 1 || (info.PageSize != nil && *info.PageSize < 1) {
				t.Fatalf("accepted %+v", info)
			}
		}
		if ip, port, err := ReadPrefillRankInfo(b); err == nil && (ip == "" || port < 1 || port > 65535) {
			t.Fatalf("accepted %q:%d", ip, port)
		}
	})
}

// Every rank of nixlctl's own TP 2 prefill, found from its metadata, on
// one REQ socket; then the verdict on decodes it accepts and refuses.
func TestProbeVLLMEveryRankOfEngine(t *testing.T) {
	s := startEngine(t, engine.ProtoPull, 2, nil)
	m, _ := kv.Preset("llama-3.1-8b")
	m.NumLayers = 2 // as startEngine deploys it
	res, err := RunSideChannel(context.Background(), SideChannelOptions{Protocol: ProtoVLLM, Target: s.SideChannel, Timeout: 5 * time.Second,
		Decode: &DecodeSpec{Model: &m, TP: 4}})
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Ranks) != 2 || res.Ranks[1].TPRank != 1 || res.Ranks[1].AgentName != "prefill-probe-tp1" || res.VLLM != res.Ranks[0] ||
		res.Discovery != "nixlctl metadata: tp 2, pp 1" || res.ClockOffsetMs == nil || res.Ranks[0].RegisteredBytes != 4*32*16384 {
		t.Fatalf("%+v", res)
	}
	if a := res.Accept; a == nil || !a.Accepted || a.Verdict != "a decode with tp=4, block 16, HND would be accepted (not checked: compatibility hash)" {
		t.Errorf("%+v", res.Accept)
	}
	for _, f := range []report.Format{report.FormatTable, report.FormatMarkdown} {
		var out strings.Builder
		if err := report.Write(&out, f, res); err != nil {
			t.Fatal(err)
		}
		for _, want := range []string{"ranks asked | nixlctl metadata: tp 2, pp 1", "prefill-probe-tp1", "tp ratio", "tp_ratio 2",
			"would be accepted (not checked: compatibility hash)"} {
			if f == report.FormatTable {
				want = strings.ReplaceAll(want, " | ", " ")
			}
			if !strings.Contains(squash(out.String()), want) {
				t.Errorf("%s lacks %q:\n%s", f, want, out.String())
			}
		}
	}
	var csv strings.Builder
	if err := report.Write(&csv, report.FormatCSV, res); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"\nranks asked,\"nixlctl metadata: tp 2, pp 1\"\n", "\nrank pp 0 tp 1,\"engine prefill-probe, agent prefill-probe-tp1, 4 regions,",
		"\ncheck tp ratio,\"ok (prefill 2, decode 4): tp_ratio 2:", "\nverdict,\"a decode with tp=4, block 16, HND would be accepted"} {
		if !strings.Contains(csv.String(), want) {
			t.Errorf("csv lacks %q:\n%s", want, csv.String())
		}
	}
	// A decode block smaller than the prefill's: refused, the reason first.
	res, err = RunSideChannel(context.Background(), SideChannelOptions{Protocol: ProtoVLLM, Target: s.SideChannel, Timeout: 5 * time.Second,
		Decode: &DecodeSpec{Model: &m, TP: 2, BlockSize: 8}})
	if !errkind.IsCheckFailed(err) || !strings.Contains(err.Error(), "would be refused: block size: prefill block 16 larger than decode block 8") ||
		res == nil || res.Accept == nil || res.Accept.Accepted {
		t.Errorf("%v %+v", err, res)
	}
}

// Every rank of a real PP 2 x TP 2 prefill, found from nixlctl's metadata:
// four agents asked in vLLM's order (pp outer), each stage holding one of
// the two layers (K and V: 2 regions).
func TestProbeVLLMEveryRankOfPipelinedEngine(t *testing.T) {
	s := startEngine(t, engine.ProtoPull, 2, func(c *engine.Config) { c.PP = 2 })
	res, err := RunSideChannel(context.Background(), SideChannelOptions{Protocol: ProtoVLLM, Target: s.SideChannel, Timeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if res.Discovery != "nixlctl metadata: tp 2, pp 2" || len(res.Ranks) != 4 {
		t.Fatalf("discovery %q, %d ranks", res.Discovery, len(res.Ranks))
	}
	agents := map[string]bool{}
	for i, r := range res.Ranks {
		if r.PPRank != i/2 || r.TPRank != i%2 {
			t.Errorf("rank %d asked as pp %d tp %d, want pp %d tp %d", i, r.PPRank, r.TPRank, i/2, i%2)
		}
		if n := r.Regions; n != 2 {
			t.Errorf("pp %d tp %d: %d regions, want 2 (one layer, K and V)", r.PPRank, r.TPRank, n)
		}
		agents[r.AgentName] = true
	}
	if len(agents) != 4 {
		t.Errorf("agents %v: want four distinct", agents)
	}
}

// fakeVLLMEngine is a fake vLLM side channel of PP 2 x TP 2 over real ZMQ:
// it answers get_meta_msg for the ranks it has, records the order it was
// asked in, and, as vLLM's listener does for a rank it lacks, never answers
// anything else. extra adds nixlctl's metadata extension.
type fakeVLLMEngine struct {
	ep    string
	mu    chan struct{}
	asked []string
}

func startFakeVLLMEngine(t *testing.T, extra bool) *fakeVLLMEngine {
	t.Helper()
	m, _ := kv.Preset("llama-3.1-8b")
	spec := kv.Spec{Model: m, TP: 2, PP: 2}
	f := &fakeVLLMEngine{mu: make(chan struct{}, 1)}
	ranks := map[[2]int][]byte{}
	for pp := 0; pp < 2; pp++ {
		for tp := 0; tp < 2; tp++ {
			r := spec.Rank(tp, pp)
			md := sidechannel.AgentMetadata{EngineID: "fake-vllm", AgentMetadata: []byte("opaque"), NumBlocks: 8, KVCacheLayout: "HND",
				BlockSize: 16, AttnBackendName: "FLASH_ATTN", PhysicalBlocksPerLogical: 1, DCPSize: 1, PCPSize: 1}
			for i, reg := range r.Regions {
				md.KVCachesBaseAddr = append(md.KVCachesBaseAddr, uint64(1<<30+i<<20))
				md.BlockLens = append(md.BlockLens, reg.BlockBytes)
				md.BlockStrides = append(md.BlockStrides, reg.BlockBytes)
			}
			if extra {
				md.Nixlctl = &sidechannel.Extra{Backend: "fake", TPRank: tp, TPSize: 2, PPRank: pp, PPSize: 2}
			}
			b, err := sidechannel.EncodeAgentMetadata(md.Wire())
			if err != nil {
				t.Fatal(err)
			}
			if ranks[[2]int{pp, tp}], err = sidechannel.EncodeHandshakePayload("fakehash", b); err != nil {
				t.Fatal(err)
			}
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	r, err := sidechannel.ListenRouter(ctx, "tcp://127.0.0.1:0", func(frames [][]byte) ([][]byte, error) {
		pp, tp, err := sidechannel.DecodeGetMeta(frames[0])
		if err != nil {
			return nil, err
		}
		f.mu <- struct{}{}
		f.asked = append(f.asked, fmt.Sprintf("%d/%d", pp, tp))
		<-f.mu
		payload, ok := ranks[[2]int{pp, tp}]
		if !ok {
			return nil, fmt.Errorf("unknown rank pp %d tp %d", pp, tp) // vLLM's KeyError: no reply
		}
		return [][]byte{payload, sidechannel.EncodeClock(1)}, nil
	}, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cancel(); r.Wait() })
	f.ep = r.Endpoint()
	return f
}

func (f *fakeVLLMEngine) order() string {
	f.mu <- struct{}{}
	defer func() { <-f.mu }()
	return strings.Join(f.asked, " ")
}

func TestProbeVLLMEveryRankFake(t *testing.T) {
	m, _ := kv.Preset("llama-3.1-8b")
	other := m
	other.Name, other.HeadDim = "head-96", 96
	for _, tc := range []struct {
		name      string
		extra     bool
		o         SideChannelOptions
		asked     string
		discovery string
		err       string
	}{
		{"nixlctl metadata", true, SideChannelOptions{}, "0/0 0/1 1/0 1/1", "nixlctl metadata: tp 2, pp 2", ""},
		{"vLLM, given", false, SideChannelOptions{TP: 2, PP: 2}, "0/0 0/1 1/0 1/1", "given: tp 2, pp 2", ""},
		{"vLLM, TP inferred, PP not", false, SideChannelOptions{Model: &m, KVDType: kv.BF16}, "0/0",
			"inferred from rank 0's block_len 16384 B and llama-3.1-8b with a bf16 cache: tp 2; but 32 regions do not cover llama-3.1-8b's 32 layers (pp > 1, or another model whose blocks look alike): only rank (0, 0) asked; give --pp, or --tp and --pp$", ""},
		{"vLLM, TP inferred, cache dtype not given", false, SideChannelOptions{Model: &m, PP: 2}, "0/0 1/0",
			"given: pp 2; tp inferred from rank 0's block_len 16384 B and llama-3.1-8b with a bf16 cache: tp 2 (tp 1 with an fp8 cache: only tp rank 0, which exists either way, is asked; give --kv-dtype or --tp)$", ""},
		{"vLLM, PP given, TP inferred", false, SideChannelOptions{Model: &m, KVDType: kv.BF16, PP: 2}, "0/0 0/1 1/0 1/1",
			"given: pp 2; tp inferred from rank 0's block_len 16384 B and llama-3.1-8b with a bf16 cache: tp 2$", ""},
		{"vLLM, TP given, PP not", false, SideChannelOptions{Model: &m, TP: 2}, "0/0 0/1",
			"given: tp 2; pp unknown, only pp rank 0 asked (give --pp)$", ""},
		{"vLLM, nothing to go by", false, SideChannelOptions{}, "0/0", "rank (0, 0) only: vLLM's handshake does not carry the TP size", ""},
		{"vLLM, another model", false, SideChannelOptions{Model: &other}, "0/0", "rank (0, 0) only: TP not inferred: block_len 16384 B is not a whole number of head-96's KV heads", ""},
		{"one rank", true, SideChannelOptions{OneRank: true, PPRank: 1, TPRank: 1}, "1/1", "one rank (--pp-rank 1, --tp-rank 1)", ""},
		{"a rank that does not answer", false, SideChannelOptions{TP: 3}, "0/0 0/1 0/2", "given: tp 3; pp unknown, only pp rank 0 asked (give --pp)",
			"no reply within 300ms (nothing answered get_meta_msg for pp 0, tp 2"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := startFakeVLLMEngine(t, tc.extra)
			o := tc.o
			o.Protocol, o.Target, o.Timeout = ProtoVLLM, f.ep, 300*time.Millisecond
			start := time.Now()
			res, err := RunSideChannel(context.Background(), o)
			if tc.err == "" && err != nil || tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)) {
				t.Fatalf("err %v, want %q", err, tc.err)
			}
			if time.Since(start) > 3*time.Second {
				t.Errorf("took %v", time.Since(start))
			}
			if got := f.order(); got != tc.asked {
				t.Errorf("asked %s, want %s", got, tc.asked)
			}
			if want, whole := strings.CutSuffix(tc.discovery, "$"); res == nil || !strings.HasPrefix(res.Discovery, want) || whole && res.Discovery != want {
				t.Fatalf("%+v, want discovery %q", res, tc.discovery)
			}
			if tc.err != "" {
				return
			}
			if want := strings.Count(tc.asked, "/"); len(res.Ranks) != want {
				t.Errorf("%d ranks, want %d", len(res.Ranks), want)
			}
			fastest := res.Ranks[0]
			for _, r := range res.Ranks {
				if r.RTTMs < fastest.RTTMs {
					fastest = r
				}
			}
			if res.ClockOffsetMs == nil || *res.ClockOffsetMs != fastest.ClockOffsetMs || res.ClockRank != fmt.Sprintf("pp %d, tp %d", fastest.PPRank, fastest.TPRank) {
				t.Errorf("clock offset from %s, want the fastest round trip's (pp %d, tp %d)", res.ClockRank, fastest.PPRank, fastest.TPRank)
			}
			for i, r := range res.Ranks {
				if got := fmt.Sprintf("%d/%d", r.PPRank, r.TPRank); got != strings.Fields(tc.asked)[i] || r.Regions != 32 || r.RegisteredBytes != 32*8*16384 {
					t.Errorf("rank %d: %s, %d regions, %d B", i, got, r.Regions, r.RegisteredBytes)
				}
			}
		})
	}
}
