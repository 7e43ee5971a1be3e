package report

import (
	"bytes"
	"encoding/json"
	"testing"

	"github.com/nixlctl/nixlctl/internal/golden"
	"github.com/nixlctl/nixlctl/internal/kv"
)

func analyses(t *testing.T, model string, tp, decodeTP int, tokens ...int) []kv.Analysis {
	t.Helper()
	m, err := kv.Preset(model)
	if err != nil {
		t.Fatal(err)
	}
	var out []kv.Analysis
	for _, n := range tokens {
		a, err := kv.Analyze(kv.Spec{Model: m, TP: tp}, n, decodeTP)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, a)
	}
	return out
}

func TestKVLayoutGolden(t *testing.T) {
	t.Parallel()
	tests := []struct {
		file   string
		format Format
		as     []kv.Analysis
	}{
		{"kv_layout_sweep.txt", FormatTable, analyses(t, "llama-3.1-70b", 1, 0, 1024, 4096, 8192, 32768, 131072)},
		{"kv_layout_gptoss.txt", FormatTable, analyses(t, "gpt-oss-120b", 2, 0, 4096)},
		{"kv_layout_hetero.txt", FormatTable, analyses(t, "qwen3-235b-a22b", 8, 2, 4096)},
		{"kv_layout_sweep.csv", FormatCSV, analyses(t, "deepseek-r1", 8, 0, 1024, 8192)},
	}
	for _, tc := range tests {
		var b bytes.Buffer
		if err := WriteKVLayout(&b, tc.format, tc.as); err != nil {
			t.Fatal(err)
		}
		golden.Check(t, tc.file, b.Bytes())
	}
}

func TestKVLayoutJSONShape(t *testing.T) {
	t.Parallel()
	var one, many bytes.Buffer
	if err := WriteKVLayout(&one, FormatJSON, analyses(t, "llama-3.1-8b", 1, 0, 4096)); err != nil {
		t.Fatal(err)
	}
	if err := WriteKVLayout(&many, FormatJSON, analyses(t, "llama-3.1-8b", 1, 0, 1024, 4096)); err != nil {
		t.Fatal(err)
	}
	var obj map[string]any
	if err := json.Unmarshal(one.Bytes(), &obj); err != nil {
		t.Fatalf("single token count must be one object: %v", err)
	}
	for _, k := range []string{"model", "tokens", "bytes_per_token", "bytes_per_token_per_rank", "bytes_per_request",
		"blocks_per_request", "regions_per_rank", "descriptors_per_request", "bytes_per_descriptor"} {
		if _, ok := obj[k]; !ok {
			t.Errorf("JSON lacks top-level %q", k)
		}
	}
	var arr []map[string]any
	if err := json.Unmarshal(many.Bytes(), &arr); err != nil || len(arr) != 2 {
		t.Fatalf("a sweep must be an array of 2: %v", err)
	}
	if err := WriteKVLayout(&one, FormatJSON, nil); err == nil {
		t.Error("empty input should be an error")
	}
}
