package main

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nixlctl/nixlctl/internal/engine"
	"github.com/nixlctl/nixlctl/internal/kv"
	"github.com/nixlctl/nixlctl/internal/runcore"
)

// The acceptance verdict end to end: a real TP 2 prefill engine of this
// process (llama-3.1-8b's shape cut to 2 layers, given to --model as a
// config.json), asked by the CLI about decodes it accepts (exit 0) and
// refuses (exit 1, the reason on stderr, the checks on stdout).
func TestProbeSideChannelVerdictCLI(t *testing.T) {
	m, err := kv.Preset("llama-3.1-8b")
	if err != nil {
		t.Fatal(err)
	}
	m.NumLayers = 2
	e, err := engine.NewEngine(context.Background(), engine.Config{Role: engine.RolePrefill, Backend: "ucx", Protocol: engine.ProtoPull,
		Model: m, BlockSize: 16, NumBlocks: 16, TP: 2, EngineID: "prefill-cli", Knobs: engine.Knobs{DRAMAlloc: "mmap", Lease: runcore.Duration(10 * time.Second), RegTimeout: runcore.Duration(10 * time.Second)}}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(e.Close)
	sc := e.Setup().SideChannel
	cfg := filepath.Join(t.TempDir(), "config.json")
	if err := os.WriteFile(cfg, []byte(`{"num_hidden_layers": 2, "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128, "hidden_size": 4096, "torch_dtype": "bfloat16"}`), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name     string
		args     []string
		code     int
		accepted bool
		verdict  string
	}{
		{"head split", []string{"--decode-tp", "4"}, exitOK, true, "a decode with tp=4, block 16, HND would be accepted (not checked: compatibility hash)"},
		{"gather", []string{"--decode-tp", "1"}, exitOK, true, "a decode with tp=1, block 16, HND would be accepted"},
		{"bigger decode block", []string{"--decode-block-size", "32"}, exitOK, true, "a decode with tp=2, block 32, HND would be accepted"},
		// vLLM asserts equal block sizes when prefill TP > decode TP
		// (base_worker.py, _validate_remote_agent_handshake).
		{"gather with a bigger decode block", []string{"--decode-tp", "1", "--decode-block-size", "32"}, exitFailure, false,
			"a decode with tp=1, block 32, HND would be refused: block size: block_size_ratio 2 with prefill tp 2 > decode tp 1"},
		{"NHD head split", []string{"--decode-tp", "4", "--decode-layout", "nhd"}, exitFailure, false,
			"would be refused: head split layout: prefill tp 2 and decode tp 4 split blocks by heads, which needs HND"},
		{"smaller block", []string{"--decode-block-size", "8"}, exitFailure, false,
			"a decode with tp=2, block 8, HND would be refused: block size: prefill block 16 larger than decode block 8 is not supported"},
		{"fp8 decode", []string{"--decode-tp", "2", "--kv-dtype", "fp8"}, exitFailure, false,
			"would be refused: block_len: prefill rank (pp 0, tp 0) region 0 holds 16384 B a block; a decode with config.json, fp8, tp 2, block 16 expects 8192 B"},
		{"hash", []string{"--compat-hash", strings.Repeat("ab", 32)}, exitFailure, false,
			"would be refused: compatibility hash: hashes differ, and the hash alone cannot tell which factor"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.verdict = strings.ReplaceAll(tc.verdict, "with config.json", "with "+cfg) // a config's model is named by its path
			code, stdout, stderr := runCLI(t, nil, append([]string{"probe", "sidechannel", sc, "--model", cfg, "-o", "json"}, tc.args...)...)
			if code != tc.code {
				t.Fatalf("exit %d, want %d\n%s", code, tc.code, stderr)
			}
			var res struct {
				Ranks []struct {
					TPRank    int    `json:"tp_rank"`
					AgentName string `json:"agent_name"`
				} `json:"vllm_ranks"`
				Discovery string `json:"vllm_rank_discovery"`
				Accept    struct {
					Accepted bool   `json:"accepted"`
					Verdict  string `json:"verdict"`
					Checks   []struct {
						Check string `json:"check"`
						OK    *bool  `json:"ok"`
					} `json:"checks"`
				} `json:"acceptance"`
			}
			if err := json.Unmarshal([]byte(stdout), &res); err != nil {
				t.Fatalf("%v\n%s", err, stdout)
			}
			if len(res.Ranks) != 2 || res.Ranks[1].AgentName != "prefill-cli-tp1" || res.Discovery != "nixlctl metadata: tp 2, pp 1" ||
				len(res.Accept.Checks) != 7 || res.Accept.Accepted != tc.accepted || !strings.Contains(res.Accept.Verdict, tc.verdict) {
				t.Errorf("%+v", res)
			}
			if !tc.accepted && !strings.Contains(stderr, tc.verdict) {
				t.Errorf("stderr lacks the verdict:\n%s", stderr)
			}
		})
	}
}
