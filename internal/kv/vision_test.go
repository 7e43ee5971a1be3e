package kv

import (
	"strings"
	"testing"
)

// The llm-d#2535 example: one [1, 44, 80] image on Qwen3.5-4B is 880
// blocks of 5,120 bytes, 4,505,600 bytes in all.
func TestVisionQwen35Example(t *testing.T) {
	t.Parallel()
	v, err := VisionPreset("qwen3.5-4b")
	if err != nil {
		t.Fatal(err)
	}
	g, err := ParseGrid("[1,44,80]")
	if err != nil {
		t.Fatal(err)
	}
	n, err := v.Tokens(g)
	if err != nil || n != 880 {
		t.Fatalf("tokens %d %v", n, err)
	}
	if v.BlockBytes() != 5120 {
		t.Errorf("block %d", v.BlockBytes())
	}
	if b, _ := v.EmbeddingBytes(g); b != 4505600 {
		t.Errorf("embedding %d bytes", b)
	}
}

func TestVisionPresetsAndGrids(t *testing.T) {
	t.Parallel()
	// LLaVA-1.5: 576 tokens of 4096 fp16 = 4,718,592 bytes (the "~4.7 MB"
	// of vLLM's EC metrics notes).
	v, _ := VisionPreset("llava-1.5-7b")
	if b, _ := v.EmbeddingBytes(v.DefaultGrid); b != 4718592 {
		t.Errorf("llava %d", b)
	}
	q, _ := VisionPreset("Qwen2.5-VL-7B")
	if b, _ := q.EmbeddingBytes(Grid{1, 44, 80}); b != 880*7168 {
		t.Errorf("qwen2.5-vl %d", b)
	}
	for _, p := range VisionPresets() {
		v, _ := VisionPreset(p)
		if err := v.Validate(); err != nil {
			t.Errorf("%s: %v", p, err)
		}
		if _, err := v.Tokens(v.DefaultGrid); err != nil {
			t.Errorf("%s default grid: %v", p, err)
		}
	}
	if _, err := VisionPreset("gpt-4v"); err == nil || !strings.Contains(err.Error(), "qwen3.5-4b") {
		t.Errorf("unknown preset: %v", err)
	}
	if g, err := ParseGrid("2X28x28"); err != nil || g != (Grid{2, 28, 28}) {
		t.Errorf("parse %v %v", g, err)
	}
	for _, bad := range []string{"", "1x2", "1x0x4", "axbxc", "1x2x3x4", "-1x2x2"} {
		if _, err := ParseGrid(bad); err == nil {
			t.Errorf("grid %q accepted", bad)
		}
	}
	if _, err := q.Tokens(Grid{1, 43, 80}); err == nil {
		t.Error("odd h with merge 2 accepted")
	}
	if err := (Vision{HiddenSize: 1, DType: "x", Merge: 1}).Validate(); err == nil {
		t.Error("bad dtype accepted")
	}
	if err := (Vision{HiddenSize: 1 << 62, DType: FP32, Merge: 1}).Validate(); err == nil {
		t.Error("a hidden size whose embedding bytes wrap accepted")
	}
	big := Vision{HiddenSize: 1 << 20, DType: FP32, Merge: 1}
	if b, err := big.EmbeddingBytes(Grid{1 << 16, 1 << 16, 1 << 16}); err == nil {
		t.Errorf("2^48 embeddings of 4 MiB: %d bytes, want an overflow error", b)
	}
}
