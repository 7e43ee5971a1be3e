package sidechannel

import (
	"strings"
	"testing"
)

// The hashes below are what CPython 3.11 computes for these factors with
// vLLM's rule, sha256(json.dumps(factors, sort_keys=True)): computed by
// Python, not by this package's encoder.
func TestParseCompatFactorsMatchesPython(t *testing.T) {
	const base = `"vllm_version": "0.11.1", "nixl_connector_version": 12, "model": "meta-llama/Llama-3.1-8B-Instruct", "dtype": "torch.bfloat16", "num_kv_heads": 8, "head_size": 128, "num_hidden_layers": 32, "attn_backend_name": "FLASH_ATTN", "cache_dtype": "auto", "is_hma_enabled": false, `
	for _, tc := range []struct{ name, json, hash string }{
		{"no speculative decoding", `{` + base + `"speculative_config": null, "transfer_mode": "pull"}`,
			"c5d032bc3fabbf32974fde0fbafa3cd4b7657e9c703fcab1739f79d71df8230f"},
		{"EAGLE, an int and a float", `{` + base + `"speculative_config": {"method": "eagle", "model": "x/y", "revision": null, "code_revision": null, "parallel_drafting": false, "kv_cache_dtype": "auto", "auxiliary_layer_ids": [1, 2.5]}, "transfer_mode": "pull"}`,
			"1d12936448ee790ea8cc1e0503903713b3db6b00f28bf73a2d1803ae5a39d797"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, got, err := ParseCompatFactors([]byte(tc.json))
			if err != nil {
				t.Fatal(err)
			}
			if got != tc.hash {
				t.Errorf("hash %s, Python's %s", got, tc.hash)
			}
		})
	}
}

func TestParseCompatFactorsRefuses(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{`[1]`, "want a JSON object"},
		{`null`, "got null"},
		{`{"vllm_version": "x"}`, `"nixl_connector_version" missing`},
		{`{` + strings.Repeat(" ", 0) + `"vllm_version": "x", "nixl_connector_version": 12, "model": "m", "dtype": "d", "num_kv_heads": 1, "head_size": 1, "num_hidden_layers": 1, "attn_backend_name": "a", "cache_dtype": "c", "is_hma_enabled": false, "speculative_config": null, "transfer_mode": "pull", "tp_size": 2}`, `"tp_size" is not one of vLLM's`},
	} {
		if _, _, err := ParseCompatFactors([]byte(tc.in)); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want %q", tc.in, err, tc.want)
		}
	}
}

// TestParseECCompatFactors: a vLLM EC peer's factors as it hashes them,
// hash pinned from CPython 3.11:
// sha256(json.dumps(["0.11.1","Qwen/Qwen2.5-VL-7B-Instruct","torch.bfloat16",7168], separators=(",",":"))).
func TestParseECCompatFactors(t *testing.T) {
	t.Parallel()
	f, err := ParseECCompatFactors([]byte(`{"vllm_version": "0.11.1", "model": "Qwen/Qwen2.5-VL-7B-Instruct", "dtype": "torch.bfloat16", "block_size_bytes": 7168}`))
	if err != nil {
		t.Fatal(err)
	}
	if h := f.Hash(); h != "ac82d7fa5bd65640e8a1ff86bae1d6bcd5f5a1f17433fef0839472ba961ea06c" {
		t.Errorf("hash %s, Python's ac82d7fa...", h)
	}
	for _, bad := range []string{`[]`, `null`, `{"vllm_version": "1", "model": "m", "dtype": "torch.bfloat16"}`,
		`{"vllm_version": "1", "model": "m", "dtype": "torch.bfloat16", "block_size_bytes": 1.5}`,
		`{"vllm_version": null, "model": "m", "dtype": "torch.bfloat16", "block_size_bytes": 1}`,
		`{"vllm_version": "1", "model": "m", "dtype": "torch.bfloat16", "block_size_bytes": 1, "extra": 2}`} {
		if _, err := ParseECCompatFactors([]byte(bad)); err == nil {
			t.Errorf("%s accepted", bad)
		}
	}
}
