package kv

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strings"
)

// ParseHFConfig builds a Model from the bytes of a HuggingFace config.json.
// name labels the model in results (usually the file path).
//
// Read: num_hidden_layers, num_attention_heads, num_key_value_heads
// (default: num_attention_heads), head_dim (default: hidden_size /
// num_attention_heads), torch_dtype (or dtype), kv_lora_rank and
// qk_rope_head_dim (MLA), sliding_window, use_sliding_window and
// layer_types. Multimodal configs that keep the language model under
// "text_config" are read from there.
func ParseHFConfig(name string, data []byte) (Model, error) {
	fields, err := decodeObject(data)
	if err != nil {
		return Model{}, fmt.Errorf("%s: %w", name, err)
	}
	if _, ok := fields["num_hidden_layers"]; !ok {
		if raw, ok := fields["text_config"]; ok {
			inner, err := decodeObject(raw)
			if err != nil {
				return Model{}, fmt.Errorf("%s: text_config: %w", name, err)
			}
			// dtype often lives only at the top level.
			for _, k := range []string{"torch_dtype", "dtype"} {
				if _, ok := inner[k]; !ok {
					if v, ok := fields[k]; ok {
						inner[k] = v
					}
				}
			}
			fields = inner
		}
	}
	m, err := modelFromFields(fields)
	if err != nil {
		return Model{}, fmt.Errorf("%s: %w", name, err)
	}
	m.Name = name
	m.Source = name
	if err := m.Validate(); err != nil {
		return Model{}, fmt.Errorf("%s: %w", name, err)
	}
	return m, nil
}

func decodeObject(data []byte) (map[string]json.RawMessage, error) {
	var fields map[string]json.RawMessage
	dec := json.NewDecoder(bytes.NewReader(data))
	if err := dec.Decode(&fields); err != nil {
		return nil, fmt.Errorf("not a JSON object: %w", err)
	}
	if fields == nil {
		return nil, errors.New("not a JSON object")
	}
	return fields, nil
}

func modelFromFields(f map[string]json.RawMessage) (Model, error) {
	var m Model
	var err error
	if m.NumLayers, err = requiredInt(f, "num_hidden_layers"); err != nil {
		return m, err
	}
	if m.NumAttentionHeads, err = requiredInt(f, "num_attention_heads"); err != nil {
		return m, err
	}
	if m.HiddenSize, _, err = optionalInt(f, "hidden_size"); err != nil {
		return m, err
	}

	dtypeName, ok, err := optionalString(f, "torch_dtype")
	if err != nil {
		return m, err
	}
	if !ok {
		if dtypeName, ok, err = optionalString(f, "dtype"); err != nil {
			return m, err
		}
	}
	if !ok {
		return m, errors.New("missing torch_dtype (pass --kv-dtype to set the cache dtype)")
	}
	if m.DType, err = ParseDType(dtypeName); err != nil {
		return m, fmt.Errorf("torch_dtype: %w", err)
	}

	rank, isMLA, err := optionalInt(f, "kv_lora_rank")
	if err != nil {
		return m, err
	}
	if isMLA && rank > 0 {
		rope, ok, err := optionalInt(f, "qk_rope_head_dim")
		if err != nil {
			return m, err
		}
		if !ok {
			return m, errors.New("kv_lora_rank is set (MLA) but qk_rope_head_dim is missing")
		}
		m.MLA = &MLA{KVLoraRank: rank, QKRopeHeadDim: rope}
		m.NumKVHeads, m.HeadDim = 1, rank+rope
	} else {
		kvHeads, ok, err := optionalInt(f, "num_key_value_heads")
		if err != nil {
			return m, err
		}
		if !ok || kvHeads == 0 {
			kvHeads = m.NumAttentionHeads
		}
		m.NumKVHeads = kvHeads
		headDim, ok, err := optionalInt(f, "head_dim")
		if err != nil {
			return m, err
		}
		if !ok || headDim == 0 {
			if m.HiddenSize <= 0 {
				return m, errors.New("missing head_dim and hidden_size: cannot derive the head size")
			}
			if m.NumAttentionHeads <= 0 || m.HiddenSize%m.NumAttentionHeads != 0 {
				return m, fmt.Errorf("hidden_size %d is not divisible by num_attention_heads %d: set head_dim", m.HiddenSize, m.NumAttentionHeads)
			}
			headDim = m.HiddenSize / m.NumAttentionHeads
		}
		m.HeadDim = headDim
	}

	// Validate bounds every dimension at 1<<20; the layer count is checked
	// here too, before a list of that many layers is made below (2^31
	// layers cost 6-9 s of CPU and 2 GiB before Validate refused them).
	if m.NumLayers > 1<<20 {
		return m, fmt.Errorf("num_hidden_layers = %d is implausibly large (limit %d)", m.NumLayers, 1<<20)
	}
	// Not KV geometry: an odd value is left unknown, not refused.
	if maxPos, _, err := optionalInt(f, "max_position_embeddings"); err == nil && maxPos > 0 && maxPos <= MaxTokens {
		m.MaxPositions = maxPos
	}
	window, _, err := optionalInt(f, "sliding_window")
	if err != nil {
		return m, err
	}
	useSliding := true
	if raw, ok := f["use_sliding_window"]; ok && !isNull(raw) {
		if err := json.Unmarshal(raw, &useSliding); err != nil {
			return m, fmt.Errorf("use_sliding_window: want true or false, got %s", clip(raw))
		}
	}
	if raw, ok := f["layer_types"]; ok && !isNull(raw) {
		var names []string
		if err := json.Unmarshal(raw, &names); err != nil {
			return m, fmt.Errorf("layer_types: want a list of strings, got %s", clip(raw))
		}
		m.LayerTypes = make([]LayerKind, len(names))
		for i, n := range names {
			switch n {
			case "full_attention", "attention", "global", "full":
				m.LayerTypes[i] = FullAttention
			case "sliding_attention", "sliding_window", "local", "sliding":
				m.LayerTypes[i] = SlidingAttention
			default:
				return m, fmt.Errorf("layer_types[%d] = %q: only attention layers are modelled (full_attention, sliding_attention)", i, n)
			}
		}
		if len(names) != m.NumLayers {
			return m, fmt.Errorf("layer_types has %d entries but num_hidden_layers is %d", len(names), m.NumLayers)
		}
	}
	if useSliding && window > 0 {
		m.SlidingWindow = window
		if m.LayerTypes == nil {
			// A window without layer_types (Mistral-7B-v0.1) applies to every layer.
			m.LayerTypes = make([]LayerKind, m.NumLayers)
			for i := range m.LayerTypes {
				m.LayerTypes[i] = SlidingAttention
			}
		}
	} else if m.LayerTypes != nil {
		// Sliding layers with the window switched off behave as full attention.
		for i := range m.LayerTypes {
			m.LayerTypes[i] = FullAttention
		}
	}
	if m.NumLayers > 0 && m.LayerTypes != nil && m.NumSlidingLayers() == 0 {
		m.LayerTypes = nil
	}
	return m, nil
}

func isNull(raw json.RawMessage) bool { return strings.TrimSpace(string(raw)) == "null" }

func requiredInt(f map[string]json.RawMessage, key string) (int, error) {
	v, ok, err := optionalInt(f, key)
	if err != nil {
		return 0, err
	}
	if !ok {
		return 0, fmt.Errorf("missing %s", key)
	}
	return v, nil
}

// optionalInt reads an integer field; 4096 and 4096.0 are accepted, null and
// absence both mean "not set".
func optionalInt(f map[string]json.RawMessage, key string) (int, bool, error) {
	raw, ok := f[key]
	if !ok || isNull(raw) {
		return 0, false, nil
	}
	var x float64
	if err := json.Unmarshal(raw, &x); err != nil {
		return 0, false, fmt.Errorf("%s: want an integer, got %s", key, clip(raw))
	}
	if x != math.Trunc(x) || x < 0 {
		return 0, false, fmt.Errorf("%s: want a non-negative integer, got %s", key, clip(raw))
	}
	if x > math.MaxInt32 {
		return 0, false, fmt.Errorf("%s: %s is implausibly large (limit %d)", key, clip(raw), math.MaxInt32)
	}
	return int(x), true, nil
}

func optionalString(f map[string]json.RawMessage, key string) (string, bool, error) {
	raw, ok := f[key]
	if !ok || isNull(raw) {
		return "", false, nil
	}
	var s string
	if err := json.Unmarshal(raw, &s); err != nil {
		return "", false, fmt.Errorf("%s: want a string, got %s", key, clip(raw))
	}
	return s, true, nil
}

func clip(raw json.RawMessage) string {
	s := strings.TrimSpace(string(raw))
	if len(s) > 40 {
		s = s[:40] + "..."
	}
	return s
}
