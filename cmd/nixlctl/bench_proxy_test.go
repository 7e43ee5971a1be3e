package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nixlctl/nixlctl/internal/testkit"
)

// smallModelConfig is a 2-layer llama: 128 KiB blocks, so a hundred
// requests move little on a busy machine.
const smallModelConfig = `{"architectures":["LlamaForCausalLM"],"model_type":"llama","num_hidden_layers":2,"num_attention_heads":8,"num_key_value_heads":8,"hidden_size":1024,"head_dim":128,"max_position_embeddings":4096,"torch_dtype":"bfloat16","vocab_size":32000}`

// startServe runs a serve command in this process until the test ends,
// once its stderr says ready.
func startServe(t *testing.T, ready string, args ...string) *syncBuffer {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	errOut := &syncBuffer{}
	done := make(chan int, 1)
	go func() {
		done <- run(ctx, &ioStreams{In: strings.NewReader(""), Out: io.Discard, ErrOut: errOut}, args)
	}()
	t.Cleanup(func() {
		cancel()
		select {
		case <-done:
		case <-time.After(20 * time.Second):
			t.Errorf("%s did not stop 20 s after the interrupt", args[:2])
		}
	})
	deadline := time.Now().Add(20 * time.Second)
	for !strings.Contains(errOut.String(), ready) {
		select {
		case code := <-done:
			t.Fatalf("%s exited %d: %s", args[:2], code, errOut.String())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s not up after 20 s: %s", args[:2], errOut.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
	return errOut
}

// fakeToyProxy does what vLLM's toy_proxy_server.py does with a
// completion (tests/v1/kv_connector/nixl_integration): the prefill leg with
// do_remote_decode, max_tokens 1 and stream false, under a request id of its
// own, then the client's request with the prefill's kv_transfer_params to
// the decode, whose answer goes back as it came.
func fakeToyProxy(t *testing.T, prefill, decode string) (*httptest.Server, *atomic.Int64) {
	var n atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPost || r.URL.Path != "/v1/completions" {
			http.NotFound(w, r)
			return
		}
		var req map[string]any
		if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		id := fmt.Sprintf("fake-proxy-%d", n.Add(1))
		leg := map[string]any{}
		for k, v := range req {
			leg[k] = v
		}
		leg["kv_transfer_params"] = map[string]any{"do_remote_decode": true, "do_remote_prefill": false,
			"remote_engine_id": nil, "remote_block_ids": nil, "remote_host": nil, "remote_port": nil}
		leg["stream"], leg["max_tokens"] = false, 1
		post := func(base string, body any) (*http.Response, error) {
			b, _ := json.Marshal(body)
			pr, _ := http.NewRequestWithContext(r.Context(), http.MethodPost, base+"/v1/completions", bytes.NewReader(b))
			pr.Header.Set("Content-Type", "application/json")
			pr.Header.Set("X-Request-Id", id)
			return http.DefaultClient.Do(pr)
		}
		resp, err := post(prefill, leg)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadGateway)
			return
		}
		var ans struct {
			KVP json.RawMessage `json:"kv_transfer_params"`
		}
		err = json.NewDecoder(resp.Body).Decode(&ans)
		resp.Body.Close()
		if err != nil || resp.StatusCode != http.StatusOK {
			http.Error(w, fmt.Sprintf("prefill: HTTP %d %v", resp.StatusCode, err), http.StatusBadGateway)
			return
		}
		req["kv_transfer_params"] = ans.KVP
		resp, err = post(decode, req)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadGateway)
			return
		}
		defer resp.Body.Close()
		w.Header().Set("Content-Type", resp.Header.Get("Content-Type"))
		w.WriteHeader(resp.StatusCode)
		_, _ = io.Copy(w, resp.Body)
	}))
	t.Cleanup(srv.Close)
	return srv, &n
}

// TestBenchProxyFakeToyProxy (issue 26): a stand-in prefill and a
// stand-in decode behind a proxy that does what vLLM's toy proxy does;
// bench proxy sends 100 requests through it, none fails, the decode reads
// and checks every block the prefill legs held, the prefill frees them
// all, and the latency splits into the prefill leg, the handoff and the
// decode leg.
func TestBenchProxyFakeToyProxy(t *testing.T) {
	cfg := filepath.Join(t.TempDir(), "small.json")
	if err := os.WriteFile(cfg, []byte(smallModelConfig), 0o644); err != nil {
		t.Fatal(err)
	}
	side, papi, dapi := testkit.FreeAddr(t), testkit.FreeAddr(t), testkit.FreeAddr(t)
	common := []string{"--backend", "ucx", "--num-blocks", "256", "--model-config", cfg, "--served-model-name", "small"}
	startServe(t, "API http://", append([]string{"serve", "prefill", "--side-channel", side, "--http", papi, "--engine-id", "prefill-standin"}, common...)...)
	startServe(t, "API http://", append([]string{"serve", "decode", "--http", dapi, "--engine-id", "decode-standin"}, common...)...)
	proxy, legs := fakeToyProxy(t, "http://"+papi, "http://"+dapi)

	code, out, stderr := runCLI(t, nil, "bench", "proxy", "--proxy", proxy.URL, "--prefill", "http://"+papi, "--decode", "http://"+dapi,
		"--requests", "100", "--concurrency", "4", "--isl", "100", "--model", "small", "-o", "json")
	if code != exitOK {
		t.Fatalf("bench proxy: exit %d\n%s\n%s", code, out, stderr)
	}
	var res struct {
		Summary struct {
			Requests, OK, Failed, Split int
			BlocksChecked               int64                 `json:"blocks_checked"`
			BlocksExpected              int64                 `json:"blocks_expected"`
			E2E                         struct{ P50 float64 } `json:"e2e_ms"`
			Handoff                     struct{ Count int }   `json:"kv_handoff_ms"`
			Problems                    []string
			StandIns                    []struct {
				Role                     string
				Served, Failed, Rejected int64
				BlocksRead               int64 `json:"blocks_read"`
				CorruptBlocks            int64 `json:"corrupt_blocks"`
				BlocksHeld               int64 `json:"blocks_held"`
			} `json:"stand_ins"`
		}
		Records []struct {
			PrefillMS *float64 `json:"prefill_leg_ms"`
			HandoffMS *float64 `json:"kv_handoff_ms"`
			DecodeMS  *float64 `json:"decode_leg_ms"`
			E2EMS     float64  `json:"e2e_ms"`
		}
	}
	if err := json.Unmarshal([]byte(out), &res); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	s := res.Summary
	// 100 tokens: 7 blocks of 16 each.
	if s.Requests != 100 || s.OK != 100 || s.Failed != 0 || len(s.Problems) != 0 || s.BlocksChecked != 700 {
		t.Errorf("summary %+v", s)
	}
	if s.Split != 100 || s.Handoff.Count != 100 || s.E2E.P50 <= 0 {
		t.Errorf("split %d, handoff count %d, e2e p50 %v: want all 100 split", s.Split, s.Handoff.Count, s.E2E.P50)
	}
	for _, si := range s.StandIns {
		if si.Served != 100 || si.Failed != 0 || si.Rejected != 0 || si.BlocksHeld != 0 || (si.Role == "decode" && si.BlocksRead != 700) {
			t.Errorf("stand-in %+v", si)
		}
	}
	if legs.Load() != 100 {
		t.Errorf("the proxy saw %d requests", legs.Load())
	}
	for i, r := range res.Records {
		if r.PrefillMS == nil || r.HandoffMS == nil || r.DecodeMS == nil {
			t.Errorf("record %d has no split", i)
			continue
		}
		if sum := *r.PrefillMS + *r.HandoffMS + *r.DecodeMS; sum < r.E2EMS*0.99 || sum > r.E2EMS*1.01+0.1 {
			t.Errorf("record %d: split sums to %.3f ms, e2e %.3f ms", i, sum, r.E2EMS)
		}
	}
}

// TestStandinDecodeRefuses: bad kv_transfer_params get a 400 that names
// what is wrong, and each is counted as refused.
func TestStandinDecodeRefuses(t *testing.T) {
	cfg := filepath.Join(t.TempDir(), "small.json")
	if err := os.WriteFile(cfg, []byte(smallModelConfig), 0o644); err != nil {
		t.Fatal(err)
	}
	side, papi, dapi := testkit.FreeAddr(t), testkit.FreeAddr(t), testkit.FreeAddr(t)
	common := []string{"--backend", "ucx", "--num-blocks", "64", "--model-config", cfg}
	startServe(t, "API http://", append([]string{"serve", "prefill", "--side-channel", side, "--http", papi, "--engine-id", "p0"}, common...)...)
	startServe(t, "API http://", append([]string{"serve", "decode", "--http", dapi}, common...)...)
	host, port, _ := strings.Cut(side, ":")
	for _, tc := range []struct{ name, kvp, want string }{
		{"none", `null`, "serves only decode legs"},
		{"not a decode leg", `{"do_remote_decode":true}`, `"do_remote_prefill" is not true`},
		{"missing", `{"do_remote_prefill":true,"remote_engine_id":"p0"}`, "lack remote_request_id, remote_block_ids, remote_host, remote_port, tp_size"},
		{"unknown engine", `{"do_remote_prefill":true,"remote_engine_id":"nope","remote_request_id":"x-12345678","remote_block_ids":[[0]],"remote_host":"` + host + `","remote_port":` + port + `,"tp_size":1,"remote_num_tokens":16}`,
			`prefill engine "nope"`},
	} {
		resp, err := http.Post("http://"+dapi+"/v1/completions", "application/json", strings.NewReader(`{"prompt":[1,2,3],"kv_transfer_params":`+tc.kvp+`}`))
		if err != nil {
			t.Fatal(err)
		}
		var e struct{ Message string }
		_ = json.NewDecoder(resp.Body).Decode(&e)
		resp.Body.Close()
		if resp.StatusCode != http.StatusBadRequest || !strings.Contains(e.Message, tc.want) {
			t.Errorf("%s: HTTP %d %q; want 400 and %q", tc.name, resp.StatusCode, e.Message, tc.want)
		}
	}
	resp, err := http.Get("http://" + dapi + "/nixlctl/stats")
	if err != nil {
		t.Fatal(err)
	}
	var st struct {
		API struct{ Requests, Rejected int64 } `json:"api"`
	}
	_ = json.NewDecoder(resp.Body).Decode(&st)
	resp.Body.Close()
	if st.API.Requests != 4 || st.API.Rejected != 4 {
		t.Errorf("stats %+v: want 4 requests, 4 refused", st.API)
	}
}
