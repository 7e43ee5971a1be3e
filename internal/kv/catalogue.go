package kv

import (
	"fmt"
	"sort"
	"strings"
)

// The presets carry the numbers of each model's published HuggingFace
// config.json (num_hidden_layers, num_attention_heads, num_key_value_heads,
// head_dim or hidden_size / heads, torch_dtype, MLA ranks, sliding window,
// max_position_embeddings).
var presets = map[string]Model{
	"llama-3.2-1b":    ctx(gqa("llama-3.2-1b", 16, 32, 8, 64, 2048), 131072),
	"llama-3.2-3b":    ctx(gqa("llama-3.2-3b", 28, 24, 8, 128, 3072), 131072),
	"llama-3.1-8b":    ctx(gqa("llama-3.1-8b", 32, 32, 8, 128, 4096), 131072),
	"llama-3.1-70b":   ctx(gqa("llama-3.1-70b", 80, 64, 8, 128, 8192), 131072),
	"llama-3.3-70b":   ctx(gqa("llama-3.3-70b", 80, 64, 8, 128, 8192), 131072),
	"llama-3.1-405b":  ctx(gqa("llama-3.1-405b", 126, 128, 8, 128, 16384), 131072),
	"mistral-7b":      ctx(gqa("mistral-7b", 32, 32, 8, 128, 4096), 32768),
	"qwen3-8b":        ctx(gqa("qwen3-8b", 36, 32, 8, 128, 4096), 40960),
	"qwen3-32b":       ctx(gqa("qwen3-32b", 64, 64, 8, 128, 5120), 40960),
	"qwen3-30b-a3b":   ctx(gqa("qwen3-30b-a3b", 48, 32, 4, 128, 2048), 40960),
	"qwen3-235b-a22b": ctx(gqa("qwen3-235b-a22b", 94, 64, 4, 128, 4096), 40960),
	"deepseek-r1":     ctx(mla("deepseek-r1", 61, 128, 7168), 163840),
	"deepseek-v3":     ctx(mla("deepseek-v3", 61, 128, 7168), 163840),
	"kimi-k2":         ctx(mla("kimi-k2", 61, 64, 7168), 131072),
	"gpt-oss-20b":     ctx(alternatingSliding(gqa("gpt-oss-20b", 24, 64, 8, 64, 2880), 128), 131072),
	"gpt-oss-120b":    ctx(alternatingSliding(gqa("gpt-oss-120b", 36, 64, 8, 64, 2880), 128), 131072),
}

// DefaultModel is the model commands use when none is named.
const DefaultModel = "llama-3.1-8b"

func gqa(name string, layers, heads, kvHeads, headDim, hidden int) Model {
	return Model{Name: name, Source: "preset", NumLayers: layers, NumAttentionHeads: heads,
		NumKVHeads: kvHeads, HeadDim: headDim, HiddenSize: hidden, DType: BF16}
}

// mla builds a DeepSeek-style model: kv_lora_rank 512 and qk_rope_head_dim
// 64 for every model in this family so far.
func mla(name string, layers, heads, hidden int) Model {
	return Model{Name: name, Source: "preset", NumLayers: layers, NumAttentionHeads: heads,
		NumKVHeads: 1, HeadDim: 512 + 64, HiddenSize: hidden, DType: BF16,
		MLA: &MLA{KVLoraRank: 512, QKRopeHeadDim: 64}}
}

// ctx sets max_position_embeddings.
func ctx(m Model, maxPositions int) Model {
	m.MaxPositions = maxPositions
	return m
}

// alternatingSliding marks even layers sliding-window and odd layers full,
// as gpt-oss's layer_types do.
func alternatingSliding(m Model, window int) Model {
	m.SlidingWindow = window
	m.LayerTypes = make([]LayerKind, m.NumLayers)
	for i := range m.LayerTypes {
		if i%2 == 0 {
			m.LayerTypes[i] = SlidingAttention
		} else {
			m.LayerTypes[i] = FullAttention
		}
	}
	return m
}

// PresetNames lists the catalogue, sorted.
func PresetNames() []string {
	names := make([]string, 0, len(presets))
	for n := range presets {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

// Preset returns a copy of the named preset. Names are case-insensitive and
// may use '_' or '.' for '-' ("Llama_3.1_70B" finds llama-3.1-70b).
func Preset(name string) (Model, error) {
	key := strings.ToLower(strings.TrimSpace(name))
	key = strings.ReplaceAll(key, "_", "-")
	key = strings.TrimPrefix(key, "meta-llama/")
	key = strings.TrimPrefix(key, "meta-")
	key = strings.TrimSuffix(key, "-instruct")
	m, ok := presets[key]
	if !ok {
		return Model{}, fmt.Errorf("unknown model %q; presets: %s (or pass --model-config path/to/config.json)",
			name, strings.Join(PresetNames(), ", "))
	}
	m.LayerTypes = append([]LayerKind(nil), m.LayerTypes...)
	if m.MLA != nil {
		c := *m.MLA
		m.MLA = &c
	}
	return m, nil
}
