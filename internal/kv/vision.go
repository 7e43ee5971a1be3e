package kv

import (
	"fmt"
	"sort"
	"strconv"
	"strings"
)

// Vision is how a multimodal model's encoder output is sized, the number
// an encoder-cache transfer moves: the vision tower turns an image into a
// patch grid [t, h, w]; merging Merge x Merge neighbouring patches gives
// t*h*w/Merge² tokens, each one LLM input embedding of HiddenSize
// elements of DType. vLLM's EC connector stores one embedding vector per
// block, so the block is HiddenSize x dtype bytes and an image takes as
// many blocks as it has tokens.
type Vision struct {
	Name        string `json:"name"`
	HFName      string `json:"hf_name"` // the model name an engine reports (compatibility hash)
	HiddenSize  int    `json:"hidden_size"`
	DType       DType  `json:"dtype"`
	Merge       int    `json:"spatial_merge_size"`
	DefaultGrid Grid   `json:"default_grid"`
	Source      string `json:"source"`
}

// Grid is a vision patch grid [t, h, w] (vLLM's image_grid_thw).
type Grid struct{ T, H, W int }

func (g Grid) String() string { return fmt.Sprintf("%dx%dx%d", g.T, g.H, g.W) }

// ParseGrid reads "1x44x80" or "[1,44,80]".
func ParseGrid(s string) (Grid, error) {
	t := strings.TrimSpace(s)
	t = strings.TrimSuffix(strings.TrimPrefix(t, "["), "]")
	parts := strings.FieldsFunc(t, func(r rune) bool { return r == 'x' || r == 'X' || r == ',' })
	if len(parts) != 3 {
		return Grid{}, fmt.Errorf("grid %q: want T x H x W, e.g. 1x44x80", s)
	}
	var v [3]int
	for i, p := range parts {
		n, err := strconv.Atoi(strings.TrimSpace(p))
		if err != nil || n <= 0 || n > 1<<16 {
			return Grid{}, fmt.Errorf("grid %q: %q is not a positive whole number", s, p)
		}
		v[i] = n
	}
	return Grid{v[0], v[1], v[2]}, nil
}

// The presets' numbers: hidden_size and torch_dtype of each model's
// published HuggingFace config.json and its vision config's
// spatial_merge_size; qwen3.5-4b is the model of llm-d/llm-d#2535, whose
// log shows one [1, 44, 80] image as 880 blocks of 5,120 bytes.
var visionPresets = map[string]Vision{
	"qwen3.5-4b":    {Name: "qwen3.5-4b", HFName: "Qwen/Qwen3.5-4B", HiddenSize: 2560, DType: BF16, Merge: 2, DefaultGrid: Grid{1, 44, 80}},
	"qwen2.5-vl-7b": {Name: "qwen2.5-vl-7b", HFName: "Qwen/Qwen2.5-VL-7B-Instruct", HiddenSize: 3584, DType: BF16, Merge: 2, DefaultGrid: Grid{1, 44, 80}},
	"qwen2-vl-7b":   {Name: "qwen2-vl-7b", HFName: "Qwen/Qwen2-VL-7B-Instruct", HiddenSize: 3584, DType: BF16, Merge: 2, DefaultGrid: Grid{1, 44, 80}},
	// LLaVA-1.5 at 336 px: a 24 x 24 grid of 14-px patches, no merge.
	"llava-1.5-7b": {Name: "llava-1.5-7b", HFName: "llava-hf/llava-1.5-7b-hf", HiddenSize: 4096, DType: FP16, Merge: 1, DefaultGrid: Grid{1, 24, 24}},
}

// DefaultVisionModel is the model `bench ec` uses when none is named.
const DefaultVisionModel = "qwen3.5-4b"

// VisionPreset returns a catalogue entry.
func VisionPreset(name string) (Vision, error) {
	v, ok := visionPresets[strings.ToLower(strings.TrimSpace(name))]
	if !ok {
		return Vision{}, fmt.Errorf("unknown vision model %q; presets: %s", name, strings.Join(VisionPresets(), ", "))
	}
	v.Source = "preset"
	return v, nil
}

// VisionPresets lists the catalogue's names, sorted.
func VisionPresets() []string {
	names := make([]string, 0, len(visionPresets))
	for n := range visionPresets {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

// Validate checks the geometry.
func (v Vision) Validate() error {
	switch {
	case v.HiddenSize <= 0:
		return fmt.Errorf("hidden size must be > 0 (got %d)", v.HiddenSize)
	case v.DType.Bytes() == 0:
		return fmt.Errorf("unknown dtype %q", v.DType)
	case v.Merge <= 0:
		return fmt.Errorf("spatial merge size must be > 0 (got %d)", v.Merge)
	case v.HiddenSize > maxVisionHidden:
		return fmt.Errorf("hidden size %d is implausibly large (limit %d)", v.HiddenSize, maxVisionHidden)
	}
	return nil
}

// BlockBytes is one embedding vector: hidden size x element size.
func (v Vision) BlockBytes() int { return v.HiddenSize * v.DType.Bytes() }

// Tokens is the number of embeddings an image of grid g becomes.
func (v Vision) Tokens(g Grid) (int, error) {
	if g.T <= 0 || g.H <= 0 || g.W <= 0 {
		return 0, fmt.Errorf("grid %v: every dimension must be > 0", g)
	}
	if g.H%v.Merge != 0 || g.W%v.Merge != 0 {
		return 0, fmt.Errorf("grid %v: h and w must be multiples of the spatial merge size %d", g, v.Merge)
	}
	return g.T * g.H * g.W / (v.Merge * v.Merge), nil
}

// maxVisionHidden bounds the hidden size as Model.Validate bounds its
// dimensions, so that one embedding's bytes stay a small number.
const maxVisionHidden = 1 << 20

// EmbeddingBytes is the size of an image's encoder output.
func (v Vision) EmbeddingBytes(g Grid) (int64, error) {
	n, err := v.Tokens(g)
	if err != nil {
		return 0, err
	}
	if v.HiddenSize <= 0 || v.DType.Bytes() == 0 {
		return 0, nil // Validate's to report: not an overflow
	}
	b, ok := mulChecked(int64(n), int64(v.HiddenSize), int64(v.DType.Bytes()))
	if !ok {
		return 0, fmt.Errorf("grid %v of hidden size %d: the embedding overflows a 64-bit byte count", g, v.HiddenSize)
	}
	return b, nil
}
