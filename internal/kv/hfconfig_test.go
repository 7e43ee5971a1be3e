package kv

import (
	"fmt"
	"reflect"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestParseHFConfig(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		json string
		want Model
	}{
		{"llama: head_dim from hidden_size", `{"num_hidden_layers": 80, "num_attention_heads": 64, "num_key_value_heads": 8,
			"hidden_size": 8192, "torch_dtype": "bfloat16", "rope_theta": 500000.0}`,
			Model{NumLayers: 80, NumAttentionHeads: 64, NumKVHeads: 8, HeadDim: 128, HiddenSize: 8192, DType: BF16}},
		{"MHA: kv heads default to attention heads", `{"num_hidden_layers": 12, "num_attention_heads": 12, "hidden_size": 768, "torch_dtype": "float16"}`,
			Model{NumLayers: 12, NumAttentionHeads: 12, NumKVHeads: 12, HeadDim: 64, HiddenSize: 768, DType: FP16}},
		{"qwen3: explicit head_dim, dtype key", `{"num_hidden_layers": 36, "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128,
			"hidden_size": 4096, "dtype": "bfloat16", "sliding_window": 4096, "use_sliding_window": false}`,
			Model{NumLayers: 36, NumAttentionHeads: 32, NumKVHeads: 8, HeadDim: 128, HiddenSize: 4096, DType: BF16}},
		{"deepseek MLA", `{"num_hidden_layers": 61, "num_attention_heads": 128, "num_key_value_heads": 128, "kv_lora_rank": 512,
			"qk_rope_head_dim": 64, "qk_nope_head_dim": 128, "v_head_dim": 128, "hidden_size": 7168, "torch_dtype": "bfloat16"}`,
			Model{NumLayers: 61, NumAttentionHeads: 128, NumKVHeads: 1, HeadDim: 576, HiddenSize: 7168, DType: BF16,
				MLA: &MLA{KVLoraRank: 512, QKRopeHeadDim: 64}}},
		{"gpt-oss layer_types", `{"num_hidden_layers": 4, "num_attention_heads": 64, "num_key_value_heads": 8, "head_dim": 64,
			"hidden_size": 2880, "torch_dtype": "bfloat16", "sliding_window": 128,
			"layer_types": ["sliding_attention", "full_attention", "sliding_attention", "full_attention"]}`,
			Model{NumLayers: 4, NumAttentionHeads: 64, NumKVHeads: 8, HeadDim: 64, HiddenSize: 2880, DType: BF16, SlidingWindow: 128,
				LayerTypes: []LayerKind{SlidingAttention, FullAttention, SlidingAttention, FullAttention}}},
		{"mistral v0.1: window on every layer", `{"num_hidden_layers": 2, "num_attention_heads": 32, "num_key_value_heads": 8,
			"hidden_size": 4096, "torch_dtype": "bfloat16", "sliding_window": 4096}`,
			Model{NumLayers: 2, NumAttentionHeads: 32, NumKVHeads: 8, HeadDim: 128, HiddenSize: 4096, DType: BF16, SlidingWindow: 4096,
				LayerTypes: []LayerKind{SlidingAttention, SlidingAttention}}},
		{"multimodal text_config", `{"torch_dtype": "bfloat16", "vision_config": {"hidden_size": 1280},
			"text_config": {"num_hidden_layers": 28, "num_attention_heads": 28, "num_key_value_heads": 4, "hidden_size": 3584}}`,
			Model{NumLayers: 28, NumAttentionHeads: 28, NumKVHeads: 4, HeadDim: 128, HiddenSize: 3584, DType: BF16}},
		{"integral floats", `{"num_hidden_layers": 2.0, "num_attention_heads": 8, "head_dim": 64, "torch_dtype": "float32"}`,
			Model{NumLayers: 2, NumAttentionHeads: 8, NumKVHeads: 8, HeadDim: 64, DType: FP32}},
	}
	for _, tc := range tests {
		got, err := ParseHFConfig("cfg.json", []byte(tc.json))
		if err != nil {
			t.Errorf("%s: %v", tc.name, err)
			continue
		}
		tc.want.Name, tc.want.Source = "cfg.json", "cfg.json"
		if diff := cmp.Diff(tc.want, got); diff != "" {
			t.Errorf("%s (-want +got):\n%s", tc.name, diff)
		}
	}
}

func TestParseHFConfigMatchesPresets(t *testing.T) {
	t.Parallel()
	m, err := ParseHFConfig("c", []byte(`{"num_hidden_layers": 80, "num_attention_heads": 64, "num_key_value_heads": 8, "hidden_size": 8192, "torch_dtype": "bfloat16"}`))
	if err != nil {
		t.Fatal(err)
	}
	if m.BytesPerToken(BF16) != mustPreset(t, "llama-3.1-70b").BytesPerToken(BF16) {
		t.Error("config.json and preset disagree")
	}
}

func TestParseHFConfigErrors(t *testing.T) {
	t.Parallel()
	tests := []struct{ json, want string }{
		{``, "not a JSON object"},
		{`[1,2]`, "not a JSON object"},
		{`null`, "not a JSON object"},
		{`{"num_attention_heads": 8, "head_dim": 64, "torch_dtype": "bf16"}`, "missing num_hidden_layers"},
		{`{"num_hidden_layers": 2, "head_dim": 64, "torch_dtype": "bf16"}`, "missing num_attention_heads"},
		{`{"num_hidden_layers": 2, "num_attention_heads": 8, "head_dim": 64}`, "missing torch_dtype"},
		{`{"num_hidden_layers": 2, "num_attention_heads": 8, "torch_dtype": "bf16"}`, "missing head_dim and hidden_size"},
		{`{"num_hidden_layers": "two", "num_attention_heads": 8, "head_dim": 64, "torch_dtype": "bf16"}`, `num_hidden_layers: want an integer, got "two"`},
		{`{"num_hidden_layers": 2.5, "num_attention_heads": 8, "head_dim": 64, "torch_dtype": "bf16"}`, "want a non-negative integer"},
		{`{"num_hidden_layers": -2, "num_attention_heads": 8, "head_dim": 64, "torch_dtype": "bf16"}`, "want a non-negative integer"},
		{`{"num_hidden_layers": 0, "num_attention_heads": 8, "head_dim": 64, "torch_dtype": "bf16"}`, "num_hidden_layers must be > 0"},
		{`{"num_hidden_layers": 2, "num_attention_heads": 8, "head_dim": 64, "torch_dtype": "int4"}`, "unknown dtype"},
		{`{"num_hidden_layers": 2, "num_attention_heads": 8, "num_key_value_heads": 3, "head_dim": 64, "torch_dtype": "bf16"}`, "not a multiple of num_key_value_heads"},
		{`{"num_hidden_layers": 2, "num_attention_heads": 8, "hidden_size": 100, "torch_dtype": "bf16"}`, "not divisible"},
		{`{"num_hidden_layers": 2, "num_attention_heads": 8, "head_dim": 64, "torch_dtype": "bf16", "kv_lora_rank": 512}`, "qk_rope_head_dim is missing"},
		{`{"num_hidden_layers": 2, "num_attention_heads": 8, "head_dim": 64, "torch_dtype": "bf16", "sliding_window": 8, "layer_types": ["full_attention"]}`, "layer_types has 1 entries"},
		{`{"num_hidden_layers": 1, "num_attention_heads": 8, "head_dim": 64, "torch_dtype": "bf16", "layer_types": ["mamba"]}`, `layer_types[0] = "mamba"`},
		{`{"num_hidden_layers": 1, "num_attention_heads": 8, "head_dim": 64, "torch_dtype": "bf16", "layer_types": "full"}`, "want a list of strings"},
		{`{"num_hidden_layers": 99999999, "num_attention_heads": 8, "head_dim": 64, "torch_dtype": "bf16"}`, "implausibly large"},
		// Refused before a layer list of that length is made (a sliding
		// window without layer_types applies to every layer).
		{`{"num_hidden_layers": 2147483647, "num_attention_heads": 8, "head_dim": 64, "torch_dtype": "bf16", "sliding_window": 4096}`, "num_hidden_layers = 2147483647 is implausibly large"},
		{`{"num_hidden_layers": 1048576, "num_attention_heads": 1048576, "num_key_value_heads": 1048576, "head_dim": 1048576, "torch_dtype": "float32"}`,
			"overflows a 64-bit byte count"},
		{`{"num_hidden_layers": 1099511627776, "num_attention_heads": 8, "head_dim": 64, "torch_dtype": "bf16"}`, "num_hidden_layers: 1099511627776 is implausibly large"},
	}
	for _, tc := range tests {
		_, err := ParseHFConfig("cfg.json", []byte(tc.json))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s\n  want error containing %q, got %v", tc.json, tc.want, err)
			continue
		}
		if !strings.HasPrefix(err.Error(), "cfg.json: ") {
			t.Errorf("error should name the file: %v", err)
		}
	}
}

func FuzzParseHFConfig(f *testing.F) {
	f.Add([]byte(`{"num_hidden_layers": 80, "num_attention_heads": 64, "num_key_value_heads": 8, "hidden_size": 8192, "torch_dtype": "bfloat16"}`))
	f.Add([]byte(`{"num_hidden_layers": 61, "num_attention_heads": 128, "kv_lora_rank": 512, "qk_rope_head_dim": 64, "hidden_size": 7168, "torch_dtype": "bfloat16"}`))
	f.Add([]byte(`{"num_hidden_layers": 2, "num_attention_heads": 8, "head_dim": 64, "torch_dtype": "bf16", "sliding_window": 8, "layer_types": ["sliding_attention","full_attention"]}`))
	f.Add([]byte(`{"text_config": {"num_hidden_layers": 1}}`))
	f.Add([]byte(`{}`))
	f.Add([]byte(`{"num_hidden_layers": 1048576, "num_attention_heads": 1048576, "num_key_value_heads": 1048576, "head_dim": 1048576, "torch_dtype": "float32"}`))
	f.Add([]byte(`{"num_hidden_layers": 16384, "num_attention_heads": 1024, "num_key_value_heads": 1024, "head_dim": 1024, "torch_dtype": "fp8"}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		m, err := ParseHFConfig("fuzz", data)
		if err != nil {
			return
		}
		if err := m.Validate(); err != nil {
			t.Fatalf("accepted a config that does not validate: %v", err)
		}
		// Anything accepted must size without panicking, and never to a
		// negative (wrapped) byte or descriptor count, even at the widest
		// dtype and the most tokens.
		for _, tp := range []int{1, 2, 8} {
			for _, tokens := range []int{4096, MaxTokens} {
				a, err := Analyze(Spec{Model: m, TP: tp, DType: FP32, Layout: FlashInfer}, tokens, 0)
				if err != nil {
					if !strings.Contains(err.Error(), "tp") {
						t.Fatalf("analyze: %v", err)
					}
					continue
				}
				if f := negativeField(reflect.ValueOf(a), "Analysis"); f != "" {
					t.Fatalf("%s is negative for %d tokens at tp %d: %+v", f, tokens, tp, m)
				}
				if a.BytesPerRequest < a.BytesPerToken {
					t.Fatalf("bytes per request %d below bytes per token %d", a.BytesPerRequest, a.BytesPerToken)
				}
			}
		}
		if m.BytesPerToken(BF16) <= 0 {
			t.Fatalf("non-positive bytes per token for %+v", m)
		}
	})
}

// negativeField names the first negative integer or float in v, walking
// structs, slices and pointers.
func negativeField(v reflect.Value, path string) string {
	switch v.Kind() {
	case reflect.Int, reflect.Int64, reflect.Int32:
		if v.Int() < 0 {
			return path
		}
	case reflect.Float64:
		if v.Float() < 0 {
			return path
		}
	case reflect.Pointer:
		if !v.IsNil() {
			return negativeField(v.Elem(), path)
		}
	case reflect.Slice:
		for i := range v.Len() {
			if f := negativeField(v.Index(i), fmt.Sprintf("%s[%d]", path, i)); f != "" {
				return f
			}
		}
	case reflect.Struct:
		for i := range v.NumField() {
			if f := negativeField(v.Field(i), path+"."+v.Type().Field(i).Name); f != "" {
				return f
			}
		}
	}
	return ""
}
