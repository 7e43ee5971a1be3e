package kv

import (
	"errors"
	"fmt"
)

// LayerKind says how one attention layer keeps its cache.
type LayerKind string

// Layer kinds. A sliding-window layer only needs the last SlidingWindow
// tokens of the cache; the engines free (and do not transfer) older blocks.
const (
	FullAttention    LayerKind = "full_attention"
	SlidingAttention LayerKind = "sliding_attention"
)

// MLA holds the multi-head latent attention sizes (DeepSeek-V2/V3/R1,
// Kimi-K2): each layer caches one compressed latent of KVLoraRank values
// plus the decoupled RoPE key of QKRopeHeadDim values per token, shared by
// all heads, so the cache is the same on every tensor-parallel rank.
type MLA struct {
	KVLoraRank    int `json:"kv_lora_rank"`
	QKRopeHeadDim int `json:"qk_rope_head_dim"`
}

// Model is the part of a model's architecture that decides its KV cache.
type Model struct {
	Name              string      `json:"name"`
	Source            string      `json:"source"` // "preset" or the config.json path
	NumLayers         int         `json:"num_layers"`
	NumAttentionHeads int         `json:"num_attention_heads"`
	NumKVHeads        int         `json:"num_kv_heads"`
	HeadDim           int         `json:"head_dim"`
	HiddenSize        int         `json:"hidden_size,omitempty"`
	DType             DType       `json:"dtype"`
	MLA               *MLA        `json:"mla,omitempty"`
	SlidingWindow     int         `json:"sliding_window,omitempty"`
	LayerTypes        []LayerKind `json:"layer_types,omitempty"` // nil: every layer is full attention
	// MaxPositions is config.json's max_position_embeddings, the context
	// length vLLM derives its default max_model_len from (0: unknown). Not
	// part of the KV geometry, so not in results.
	MaxPositions int `json:"-"`
}

// IsMLA reports whether the model caches an MLA latent instead of K and V.
func (m Model) IsMLA() bool { return m.MLA != nil }

// LayerKindOf returns the kind of global layer i.
func (m Model) LayerKindOf(i int) LayerKind {
	if i < len(m.LayerTypes) {
		return m.LayerTypes[i]
	}
	return FullAttention
}

// NumSlidingLayers counts the sliding-window layers.
func (m Model) NumSlidingLayers() int {
	n := 0
	for i := 0; i < m.NumLayers; i++ {
		if m.LayerKindOf(i) == SlidingAttention {
			n++
		}
	}
	return n
}

// TokenValuesPerLayer is the number of cache elements one token adds to one
// layer across all KV heads: 2 x kv_heads x head_dim for K and V, or the
// latent plus RoPE key for MLA.
func (m Model) TokenValuesPerLayer() int {
	if m.IsMLA() {
		return m.MLA.KVLoraRank + m.MLA.QKRopeHeadDim
	}
	return 2 * m.NumKVHeads * m.HeadDim
}

// BytesPerToken is the whole model's cache for one token in dtype d: the
// familiar layers x 2 x kv_heads x head_dim x bytes (MLA: layers x
// (kv_lora_rank + rope dim) x bytes). Sliding-window layers count in full
// here; they only differ in how many tokens they keep.
func (m Model) BytesPerToken(d DType) int64 {
	return int64(m.NumLayers) * int64(m.TokenValuesPerLayer()) * int64(d.Bytes())
}

// Validate checks that the architecture is complete and self-consistent.
func (m Model) Validate() error {
	var errs []error
	bad := func(format string, a ...any) { errs = append(errs, fmt.Errorf(format, a...)) }
	if m.NumLayers <= 0 {
		bad("num_hidden_layers must be > 0 (got %d)", m.NumLayers)
	}
	if m.NumAttentionHeads <= 0 {
		bad("num_attention_heads must be > 0 (got %d)", m.NumAttentionHeads)
	}
	if m.IsMLA() {
		if m.MLA.KVLoraRank <= 0 {
			bad("kv_lora_rank must be > 0 (got %d)", m.MLA.KVLoraRank)
		}
		if m.MLA.QKRopeHeadDim < 0 {
			bad("qk_rope_head_dim must be >= 0 (got %d)", m.MLA.QKRopeHeadDim)
		}
	} else {
		if m.NumKVHeads <= 0 {
			bad("num_key_value_heads must be > 0 (got %d)", m.NumKVHeads)
		}
		if m.HeadDim <= 0 {
			bad("head_dim must be > 0 (got %d)", m.HeadDim)
		}
		if m.NumKVHeads > 0 && m.NumAttentionHeads > 0 && m.NumAttentionHeads%m.NumKVHeads != 0 {
			bad("num_attention_heads (%d) is not a multiple of num_key_value_heads (%d)", m.NumAttentionHeads, m.NumKVHeads)
		}
	}
	const maxDim = 1 << 20 // keeps every product we form far inside int64
	for _, f := range []struct {
		name string
		v    int
	}{{"num_hidden_layers", m.NumLayers}, {"num_attention_heads", m.NumAttentionHeads},
		{"num_key_value_heads", m.NumKVHeads}, {"head_dim", m.HeadDim}, {"sliding_window", m.SlidingWindow}} {
		if f.v > maxDim {
			bad("%s = %d is implausibly large (limit %d)", f.name, f.v, maxDim)
		}
	}
	if m.IsMLA() && (m.MLA.KVLoraRank > maxDim || m.MLA.QKRopeHeadDim > maxDim) {
		bad("MLA ranks %d/%d are implausibly large (limit %d)", m.MLA.KVLoraRank, m.MLA.QKRopeHeadDim, maxDim)
	}
	if m.DType.Bytes() == 0 {
		bad("unknown dtype %q", m.DType)
	}
	// At the widest dtype, so that a valid model stays valid whatever
	// cache dtype a deployment picks.
	if len(errs) == 0 {
		if err := m.checkCacheFits(int64(FP32.Bytes()), 1); err != nil {
			errs = append(errs, err)
		}
	}
	if m.LayerTypes != nil && len(m.LayerTypes) != m.NumLayers {
		bad("layer_types has %d entries but num_hidden_layers is %d", len(m.LayerTypes), m.NumLayers)
	}
	for i, k := range m.LayerTypes {
		if k != FullAttention && k != SlidingAttention {
			bad("layer_types[%d] = %q: want full_attention or sliding_attention", i, k)
			break
		}
	}
	if m.NumSlidingLayers() > 0 && m.SlidingWindow <= 0 {
		bad("layer_types has sliding_attention layers but sliding_window is %d", m.SlidingWindow)
	}
	if m.SlidingWindow < 0 {
		bad("sliding_window must be >= 0 (got %d)", m.SlidingWindow)
	}
	if len(errs) == 0 {
		return nil
	}
	if m.Name != "" {
		return fmt.Errorf("model %s: %w", m.Name, errors.Join(errs...))
	}
	return errors.Join(errs...)
}

// checkCacheFits refuses a model whose cache for MaxTokens tokens (rounded
// up to the largest block), at elemBytes per value and copied on up to
// replicas ranks, does not fit in an int64 byte count. Every size the
// package derives is at most that product, so this one check keeps them
// all from wrapping. The fields are each bounded, but not their product.
func (m Model) checkCacheFits(elemBytes int64, replicas int) error {
	if _, ok := mulChecked(int64(m.NumLayers), int64(m.TokenValuesPerLayer()), elemBytes, MaxTokens+MaxBlockSize, int64(replicas)); ok {
		return nil
	}
	shape := fmt.Sprintf("num_hidden_layers %d x 2 x num_key_value_heads %d x head_dim %d", m.NumLayers, m.NumKVHeads, m.HeadDim)
	if m.IsMLA() {
		shape = fmt.Sprintf("num_hidden_layers %d x (kv_lora_rank %d + qk_rope_head_dim %d)", m.NumLayers, m.MLA.KVLoraRank, m.MLA.QKRopeHeadDim)
	}
	on := ""
	if replicas > 1 {
		on = fmt.Sprintf(" on %d ranks", replicas)
	}
	return fmt.Errorf("%s x %d B per value: the cache of %d tokens%s overflows a 64-bit byte count", shape, elemBytes, MaxTokens, on)
}
