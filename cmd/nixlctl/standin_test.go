package main

import (
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nixlctl/nixlctl/internal/testkit"
)

// TestStandinCLI runs serve prefill --side-channel as a user would: the
// API answers a proxy's prefill leg with kv_transfer_params naming the
// side channel, probe sidechannel decodes the handshake there and finds the
// hash --compat-factors gives, and an interrupt stops it with a summary.
func TestStandinCLI(t *testing.T) {
	dir := t.TempDir()
	factors := dir + "/factors.json"
	if err := os.WriteFile(factors, []byte(`{"vllm_version": "0.11.0", "nixl_connector_version": 12, "model": "m", "dtype": "torch.bfloat16", "num_kv_heads": 8, "head_size": 128, "num_hidden_layers": 32, "attn_backend_name": "FLASH_ATTN", "cache_dtype": "auto", "is_hma_enabled": false, "speculative_config": null, "transfer_mode": "pull"}`), 0o644); err != nil {
		t.Fatal(err)
	}
	side, api := testkit.FreeAddr(t), testkit.FreeAddr(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var errOut syncBuffer
	done := make(chan int, 1)
	go func() {
		done <- run(ctx, &ioStreams{In: strings.NewReader(""), Out: io.Discard, ErrOut: &errOut}, []string{"serve", "prefill",
			"--side-channel", side, "--http", api, "--backend", "ucx", "--num-blocks", "64", "--engine-id", "standin-cli",
			"--compat-factors", factors})
	}()
	deadline := time.Now().Add(20 * time.Second)
	for !strings.Contains(errOut.String(), "API http://") {
		select {
		case code := <-done:
			t.Fatalf("stand-in exited %d: %s", code, errOut.String())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("stand-in not up after 20 s: %s", errOut.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
	if !strings.Contains(errOut.String(), "warning: --backend ucx") {
		t.Errorf("no warning that a vLLM decode cannot load the ucx blob: %s", errOut.String())
	}
	resp, err := http.Post("http://"+api+"/v1/completions", "application/json",
		strings.NewReader(`{"prompt":[1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17],"kv_transfer_params":{"do_remote_decode":true}}`))
	if err != nil {
		t.Fatal(err)
	}
	var body struct {
		KVP struct {
			BlockIDs [][]int `json:"remote_block_ids"`
			EngineID string  `json:"remote_engine_id"`
			Host     string  `json:"remote_host"`
			Port     int     `json:"remote_port"`
		} `json:"kv_transfer_params"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&body); err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("status %d, %v", resp.StatusCode, err)
	}
	resp.Body.Close()
	if got := net.JoinHostPort(body.KVP.Host, strconv.Itoa(body.KVP.Port)); got != side || body.KVP.EngineID != "standin-cli" || len(body.KVP.BlockIDs) != 1 || len(body.KVP.BlockIDs[0]) != 2 {
		t.Errorf("kv_transfer_params = %+v, want side channel %s, engine standin-cli, 2 blocks in one group", body.KVP, side)
	}
	code, out, stderr := runCLI(t, nil, "probe", "sidechannel", side, "--compat-factors", factors, "-o", "json")
	if code != exitOK || !strings.Contains(out, `"engine_id": "standin-cli"`) {
		t.Errorf("probe sidechannel: exit %d\n%s\n%s", code, out, stderr)
	}
	// /v1/models reports the model's context (max_position_embeddings),
	// not nixlctl's token bound.
	resp, err = http.Get("http://" + api + "/v1/models")
	if err != nil {
		t.Fatal(err)
	}
	models, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if !strings.Contains(string(models), `"max_model_len":131072`) {
		t.Errorf("/v1/models: %s, want llama-3.1-8b's max_model_len 131072", models)
	}
	// The probe's handshakes were served by the stand-in: its stats and
	// summary count them (issue 26: both said 0 after three).
	resp, err = http.Get("http://" + api + "/nixlctl/stats")
	if err != nil {
		t.Fatal(err)
	}
	var stats struct {
		Engine struct {
			Served int64 `json:"handshakes_served"`
		} `json:"engine"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&stats); err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if stats.Engine.Served < 1 {
		t.Errorf("/nixlctl/stats: %d handshakes served after the probe's", stats.Engine.Served)
	}
	cancel()
	select {
	case code := <-done:
		if code != exitOK {
			t.Errorf("exit %d after the interrupt: %s", code, errOut.String())
		}
	case <-time.After(20 * time.Second):
		t.Fatal("stand-in did not stop 20 s after the interrupt")
	}
	if !strings.Contains(errOut.String(), "1 legs served, 0 refused, 0 failed") {
		t.Errorf("no summary: %s", errOut.String())
	}
	if want := strconv.FormatInt(stats.Engine.Served, 10) + " handshakes served"; !strings.Contains(errOut.String(), want) {
		t.Errorf("summary does not say %q: %s", want, errOut.String())
	}
}
