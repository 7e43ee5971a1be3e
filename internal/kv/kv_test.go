package kv

import (
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func mustPreset(t *testing.T, name string) Model {
	t.Helper()
	m, err := Preset(name)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// Published per-token sizes: layers x 2 x kv_heads x head_dim x bytes, MLA
// layers x (512 + 64) x bytes.
func TestBytesPerTokenEveryPreset(t *testing.T) {
	t.Parallel()
	want := map[string]int64{ // bf16
		"llama-3.2-1b":    32768,
		"llama-3.2-3b":    114688,
		"llama-3.1-8b":    131072,
		"llama-3.1-70b":   327680,
		"llama-3.3-70b":   327680,
		"llama-3.1-405b":  516096,
		"mistral-7b":      131072,
		"qwen3-8b":        147456,
		"qwen3-32b":       262144,
		"qwen3-30b-a3b":   98304,
		"qwen3-235b-a22b": 192512,
		"deepseek-r1":     70272,
		"deepseek-v3":     70272,
		"kimi-k2":         70272,
		"gpt-oss-20b":     49152,
		"gpt-oss-120b":    73728,
	}
	if len(want) != len(PresetNames()) {
		t.Fatalf("test pins %d presets, catalogue has %d: %v", len(want), len(PresetNames()), PresetNames())
	}
	for name, bf16 := range want {
		m := mustPreset(t, name)
		if err := m.Validate(); err != nil {
			t.Errorf("%s: %v", name, err)
		}
		if got := m.BytesPerToken(BF16); got != bf16 {
			t.Errorf("%s bf16: got %d, want %d", name, got, bf16)
		}
		if got := m.BytesPerToken(FP8); got != bf16/2 {
			t.Errorf("%s fp8: got %d, want %d", name, got, bf16/2)
		}
		if got := m.BytesPerToken(FP32); got != bf16*2 {
			t.Errorf("%s fp32: got %d, want %d", name, got, bf16*2)
		}
	}
}

func TestPresetLookupIsForgiving(t *testing.T) {
	t.Parallel()
	for _, n := range []string{"Llama-3.1-70B", "llama_3.1_70b", "meta-llama/Llama-3.1-70B-Instruct"} {
		if m, err := Preset(n); err != nil || m.Name != "llama-3.1-70b" {
			t.Errorf("Preset(%q) = %v, %v", n, m.Name, err)
		}
	}
	_, err := Preset("gpt-5")
	if err == nil || !strings.Contains(err.Error(), "llama-3.1-70b") || !strings.Contains(err.Error(), `"gpt-5"`) {
		t.Errorf("unknown model error should name it and list presets: %v", err)
	}
}

func TestPresetIsACopy(t *testing.T) {
	t.Parallel()
	m := mustPreset(t, "gpt-oss-20b")
	m.LayerTypes[0] = FullAttention
	m2 := mustPreset(t, "gpt-oss-20b")
	if m2.LayerTypes[0] != SlidingAttention {
		t.Fatal("mutating a preset's layer types changed the catalogue")
	}
}

func TestPerRankSplit(t *testing.T) {
	t.Parallel()
	tests := []struct {
		model        string
		tp           int
		heads        int // KV heads per rank
		replicas     int
		perRankBF16  int64 // bytes per token per rank
		allRanksBF16 int64
	}{
		{"llama-3.1-70b", 1, 8, 1, 327680, 327680},
		{"llama-3.1-70b", 2, 4, 1, 163840, 327680},
		{"llama-3.1-70b", 4, 2, 1, 81920, 327680},
		{"llama-3.1-70b", 8, 1, 1, 40960, 327680},
		// Qwen3-235B has 4 KV heads: at TP 8 each head lives on two ranks,
		// never half a head per rank.
		{"qwen3-235b-a22b", 1, 4, 1, 192512, 192512},
		{"qwen3-235b-a22b", 2, 2, 1, 96256, 192512},
		{"qwen3-235b-a22b", 4, 1, 1, 48128, 192512},
		{"qwen3-235b-a22b", 8, 1, 2, 48128, 385024},
		// MLA latents are replicated on every rank.
		{"deepseek-r1", 1, 1, 1, 70272, 70272},
		{"deepseek-r1", 2, 1, 2, 70272, 140544},
		{"deepseek-r1", 4, 1, 4, 70272, 281088},
		{"deepseek-r1", 8, 1, 8, 70272, 562176},
		{"gpt-oss-120b", 8, 1, 1, 9216, 73728},
	}
	for _, tc := range tests {
		s := Spec{Model: mustPreset(t, tc.model), TP: tc.tp}
		a, err := Analyze(s, 1024, 0)
		if err != nil {
			t.Fatalf("%s tp%d: %v", tc.model, tc.tp, err)
		}
		got := []int64{int64(a.HeadsPerRank), int64(a.HeadReplicas), a.BytesPerTokenPerRank, a.BytesPerTokenAllRanks}
		want := []int64{int64(tc.heads), int64(tc.replicas), tc.perRankBF16, tc.allRanksBF16}
		if diff := cmp.Diff(want, got); diff != "" {
			t.Errorf("%s tp%d [heads replicas perRank allRanks] (-want +got):\n%s", tc.model, tc.tp, diff)
		}
	}
}

func TestHeadsNeverSplitBelowOne(t *testing.T) {
	t.Parallel()
	s := Spec{Model: mustPreset(t, "qwen3-235b-a22b"), TP: 8}
	var got []HeadRange
	for r := 0; r < 8; r++ {
		got = append(got, s.Heads(8, r))
	}
	want := []HeadRange{{0, 1}, {0, 1}, {1, 2}, {1, 2}, {2, 3}, {2, 3}, {3, 4}, {3, 4}}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Error(diff)
	}
}

func TestPipelineSplit(t *testing.T) {
	t.Parallel()
	tests := []struct {
		layers, pp int
		want       []int
	}{
		{80, 1, []int{80}},
		{80, 4, []int{20, 20, 20, 20}},
		{61, 4, []int{15, 15, 16, 15}}, // vLLM gives the remainder to the stages before the last
		{61, 8, []int{7, 7, 8, 8, 8, 8, 8, 7}},
		{126, 4, []int{31, 32, 32, 31}},
	}
	for _, tc := range tests {
		got := stageLayerCounts(tc.layers, tc.pp)
		if diff := cmp.Diff(tc.want, got); diff != "" {
			t.Errorf("%d layers / pp%d (-want +got):\n%s", tc.layers, tc.pp, diff)
		}
	}
	s := Spec{Model: mustPreset(t, "deepseek-r1"), PP: 4}
	if got := s.StageLayers(2); got[0] != 30 || len(got) != 16 {
		t.Errorf("stage 2 layers = %v", got)
	}
	if s.LargestStage() != 2 {
		t.Errorf("largest stage %d", s.LargestStage())
	}
	a, err := Analyze(s, 16, 0)
	if err != nil {
		t.Fatal(err)
	}
	if a.BytesPerTokenPerRank != 16*1152 || a.RegionsPerRank != 16 {
		t.Errorf("largest stage: %d B/token, %d regions", a.BytesPerTokenPerRank, a.RegionsPerRank)
	}
}

// vLLM's FlashAttention layout registers K and V of every layer as separate
// regions and sends one descriptor per block per region.
func TestDescriptorCountsFlashAttention(t *testing.T) {
	t.Parallel()
	tests := []struct {
		model        string
		tokens, bs   int
		tp, pp       int
		layout       AttnLayout
		blocks, regs int
		descs        int
		bytesPerDesc int64
		requestBytes int64
		perRankBytes int64
	}{
		// 70B, TP1, 4096 tokens: 256 blocks x 160 regions of 16x8x128x2 B.
		{"llama-3.1-70b", 4096, 16, 1, 1, FlashAttn, 256, 160, 40960, 32768, 4096 * 327680, 4096 * 327680},
		// TP8: each rank one head, 4 KiB per block per region.
		{"llama-3.1-70b", 4096, 16, 8, 1, FlashAttn, 256, 160, 40960, 4096, 4096 * 327680, 4096 * 40960},
		// Partial last block is sent whole.
		{"llama-3.1-8b", 1000, 16, 1, 1, FlashAttn, 63, 64, 4032, 32768, 63 * 16 * 131072, 63 * 16 * 131072},
		// FlashInfer: half the regions, twice the block.
		{"llama-3.1-8b", 1024, 16, 1, 1, FlashInfer, 64, 32, 2048, 65536, 1024 * 131072, 1024 * 131072},
		// Block size 64 cuts descriptors by 4.
		{"llama-3.1-70b", 4096, 64, 1, 1, FlashAttn, 64, 160, 10240, 131072, 4096 * 327680, 4096 * 327680},
		// MLA: one latent region per layer.
		{"deepseek-r1", 4096, 64, 8, 1, FlashAttn, 64, 61, 3904, 64 * 1152, 4096 * 70272, 4096 * 70272},
	}
	for _, tc := range tests {
		s := Spec{Model: mustPreset(t, tc.model), BlockSize: tc.bs, TP: tc.tp, PP: tc.pp, Layout: tc.layout}
		a, err := Analyze(s, tc.tokens, 0)
		if err != nil {
			t.Fatal(err)
		}
		got := []int64{int64(a.BlocksPerRequest), int64(a.RegionsPerRank), int64(a.DescriptorsPerRequest), a.BytesPerDescriptor, a.BytesPerRequest, a.BytesPerRequestPerRank}
		want := []int64{int64(tc.blocks), int64(tc.regs), int64(tc.descs), tc.bytesPerDesc, tc.requestBytes, tc.perRankBytes}
		if diff := cmp.Diff(want, got); diff != "" {
			t.Errorf("%s %d tok bs%d tp%d %s [blocks regions descs B/desc B/req B/req/rank] (-want +got):\n%s",
				tc.model, tc.tokens, tc.bs, tc.tp, tc.layout, diff)
		}
		if int64(a.DescriptorsPerRequest)*a.BytesPerDescriptor != a.BytesPerRequestPerRank {
			t.Errorf("%s: descriptors x size != bytes per rank", tc.model)
		}
	}
}

func TestSlidingWindowBlocks(t *testing.T) {
	t.Parallel()
	s := Spec{Model: mustPreset(t, "gpt-oss-120b")} // window 128, block 16
	tests := []struct{ tokens, full, sliding int }{
		{1, 1, 1},
		{128, 8, 8},
		{129, 9, 9}, // tokens 1..128 span blocks 0..8
		{130, 9, 9},
		{144, 9, 8},
		{4096, 256, 8},
		{4097, 257, 9},
	}
	for _, tc := range tests {
		if got := s.BlocksFor(FullAttention, tc.tokens); got != tc.full {
			t.Errorf("%d tokens full: %d, want %d", tc.tokens, got, tc.full)
		}
		if got := s.BlocksFor(SlidingAttention, tc.tokens); got != tc.sliding {
			t.Errorf("%d tokens sliding: %d, want %d", tc.tokens, got, tc.sliding)
		}
	}
	a, err := Analyze(s, 4096, 0)
	if err != nil {
		t.Fatal(err)
	}
	// 18 full layers x 256 blocks + 18 sliding x 8, K and V each.
	if want := 2 * (18*256 + 18*8); a.DescriptorsPerRequest != want {
		t.Errorf("descriptors %d, want %d", a.DescriptorsPerRequest, want)
	}
	s.KeepFullWindow = true
	b, _ := Analyze(s, 4096, 0)
	if want := 2 * 36 * 256; b.DescriptorsPerRequest != want {
		t.Errorf("without window trimming: descriptors %d, want %d", b.DescriptorsPerRequest, want)
	}
	if b.BytesPerRequest != 4096*73728 {
		t.Errorf("full window bytes %d", b.BytesPerRequest)
	}
}

func TestBlockChunks(t *testing.T) {
	t.Parallel()
	m := mustPreset(t, "llama-3.1-8b") // 8 KV heads, head_dim 128
	hb := int64(128 * 2)
	tests := []struct {
		name            string
		spec            Spec
		src, dst, slice HeadRange
		want            []Chunk
	}{
		{"whole block", Spec{Model: m, BlockSize: 16}, HeadRange{0, 8}, HeadRange{0, 8}, HeadRange{0, 8},
			[]Chunk{{0, 0, 16 * 8 * hb}}},
		{"HND slice of a larger source", Spec{Model: m, BlockSize: 16}, HeadRange{0, 8}, HeadRange{4, 8}, HeadRange{4, 8},
			[]Chunk{{16 * 4 * hb, 0, 16 * 4 * hb}}},
		{"HND into half of a larger destination", Spec{Model: m, BlockSize: 16}, HeadRange{2, 4}, HeadRange{0, 4}, HeadRange{2, 4},
			[]Chunk{{0, 16 * 2 * hb, 16 * 2 * hb}}},
		{"flashinfer slice: K and V halves", Spec{Model: m, BlockSize: 16, Layout: FlashInfer}, HeadRange{0, 8}, HeadRange{0, 4}, HeadRange{0, 4},
			[]Chunk{{0, 0, 16 * 4 * hb}, {16 * 8 * hb, 16 * 4 * hb, 16 * 4 * hb}}},
		{"flashinfer whole block merges", Spec{Model: m, BlockSize: 4, Layout: FlashInfer}, HeadRange{0, 8}, HeadRange{0, 8}, HeadRange{0, 8},
			[]Chunk{{0, 0, 2 * 4 * 8 * hb}}},
	}
	for _, tc := range tests {
		if diff := cmp.Diff(tc.want, tc.spec.BlockChunks(tc.src, tc.dst, tc.slice)); diff != "" {
			t.Errorf("%s (-want +got):\n%s", tc.name, diff)
		}
	}
	// NHD: one piece per token.
	nhd := Spec{Model: m, BlockSize: 16, Order: NHD}
	got := nhd.BlockChunks(HeadRange{0, 8}, HeadRange{4, 8}, HeadRange{4, 8})
	if len(got) != 16 || got[1].SrcOffset != 8*hb+4*hb || got[1].DstOffset != 4*hb || got[1].Length != 4*hb {
		t.Errorf("NHD slice chunks: %+v", got[:2])
	}
	if len(nhd.BlockChunks(HeadRange{0, 8}, HeadRange{0, 8}, HeadRange{0, 8})) != 1 {
		t.Error("NHD whole block should be one chunk")
	}
}

func TestPlanHeterogeneousTP(t *testing.T) {
	t.Parallel()
	type read struct {
		Src   int
		Heads HeadRange
		N     int // chunks per block
	}
	tests := []struct {
		name      string
		model     string
		p, d      int
		reads     [][]read // per decode rank
		consumers []int
	}{
		{"1->2 head slices", "llama-3.1-8b", 1, 2,
			[][]read{{{0, HeadRange{0, 4}, 1}}, {{0, HeadRange{4, 8}, 1}}}, []int{2}},
		{"2->1 two sources", "llama-3.1-8b", 2, 1,
			[][]read{{{0, HeadRange{0, 4}, 1}, {1, HeadRange{4, 8}, 1}}}, []int{1, 1}},
		{"4->2", "llama-3.1-8b", 4, 2,
			[][]read{{{0, HeadRange{0, 2}, 1}, {1, HeadRange{2, 4}, 1}}, {{2, HeadRange{4, 6}, 1}, {3, HeadRange{6, 8}, 1}}}, []int{1, 1, 1, 1}},
		// 4 KV heads, prefill TP8 replicates each head twice: decode reads
		// each head once and only notifies the replica.
		{"8->2 replicated heads", "qwen3-235b-a22b", 8, 2,
			[][]read{{{0, HeadRange{0, 1}, 1}, {2, HeadRange{1, 2}, 1}}, {{4, HeadRange{2, 3}, 1}, {6, HeadRange{3, 4}, 1}}},
			[]int{1, 1, 1, 1, 1, 1, 1, 1}},
		{"2->8 replicated on decode", "qwen3-235b-a22b", 2, 8,
			[][]read{{{0, HeadRange{0, 1}, 1}}, {{0, HeadRange{0, 1}, 1}}, {{0, HeadRange{1, 2}, 1}}, {{0, HeadRange{1, 2}, 1}},
				{{1, HeadRange{2, 3}, 1}}, {{1, HeadRange{2, 3}, 1}}, {{1, HeadRange{3, 4}, 1}}, {{1, HeadRange{3, 4}, 1}}},
			[]int{4, 4}},
		{"MLA 4->2 reads once", "deepseek-r1", 4, 2,
			[][]read{{{0, HeadRange{0, 1}, 1}}, {{2, HeadRange{0, 1}, 1}}}, []int{1, 1, 1, 1}},
	}
	for _, tc := range tests {
		m := mustPreset(t, tc.model)
		plan, err := Plan(Spec{Model: m, TP: tc.p}, Spec{Model: m, TP: tc.d})
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		var got [][]read
		for _, dr := range plan.Decode {
			var rs []read
			for _, r := range dr.Reads {
				rs = append(rs, read{r.PrefillRank, r.Heads, len(r.Chunks)})
			}
			got = append(got, rs)
		}
		if diff := cmp.Diff(tc.reads, got); diff != "" {
			t.Errorf("%s reads (-want +got):\n%s", tc.name, diff)
		}
		if diff := cmp.Diff(tc.consumers, plan.Consumers); diff != "" {
			t.Errorf("%s consumers (-want +got):\n%s", tc.name, diff)
		}
	}
	if _, err := Plan(Spec{Model: mustPreset(t, "llama-3.1-8b"), TP: 2}, Spec{Model: mustPreset(t, "llama-3.1-8b"), TP: 3}); err == nil {
		t.Error("tp 2 -> 3 should be refused")
	}
}

func TestAnalyzeHetero(t *testing.T) {
	t.Parallel()
	s := Spec{Model: mustPreset(t, "llama-3.1-70b"), TP: 1}
	a, err := Analyze(s, 4096, 2)
	if err != nil {
		t.Fatal(err)
	}
	if a.Hetero == nil || len(a.Hetero.Ranks) != 2 {
		t.Fatalf("hetero section missing: %+v", a.Hetero)
	}
	r := a.Hetero.Ranks[1]
	if r.DescriptorsPerRequest != 256*160 || r.BytesPerDescriptor != 16*4*256 || r.Heads != "4-7" {
		t.Errorf("decode rank 1: %+v", r)
	}
	nhd := s
	nhd.Order = NHD
	b, _ := Analyze(nhd, 4096, 2)
	if got := b.Hetero.Ranks[0].DescriptorsPerRequest; got != 256*160*16 {
		t.Errorf("NHD head slices should need a descriptor per token: %d", got)
	}
}

func TestSpecErrors(t *testing.T) {
	t.Parallel()
	tests := []struct {
		spec Spec
		want string
	}{
		{Spec{Model: mustPreset(t, "llama-3.1-70b"), TP: 3}, "tp 3 does not divide num_attention_heads 64"},
		{Spec{Model: mustPreset(t, "qwen3-235b-a22b"), TP: 16, PP: 1}, ""},
		{Spec{Model: mustPreset(t, "llama-3.1-8b"), TP: 0, PP: 40}, "pp 40 is larger than num_hidden_layers 32"},
		{Spec{Model: mustPreset(t, "llama-3.1-8b"), BlockSize: -1}, "block size must be between 1"},
		{Spec{Model: mustPreset(t, "llama-3.1-8b"), DType: "fp4"}, "unknown kv dtype"},
		{Spec{Model: Model{Name: "x", NumLayers: 2, NumAttentionHeads: 48, NumKVHeads: 6, HeadDim: 64, DType: BF16}, TP: 4}, "tp 4 does not divide num_key_value_heads 6"},
		{Spec{Model: Model{Name: "x", NumLayers: 2, NumAttentionHeads: 48, NumKVHeads: 6, HeadDim: 64, DType: BF16}, TP: 8}, "not a multiple"},
	}
	for _, tc := range tests {
		err := tc.spec.Validate()
		if tc.want == "" {
			if err != nil {
				t.Errorf("%+v: unexpected %v", tc.spec.TP, err)
			}
			continue
		}
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("want error containing %q, got %v", tc.want, err)
		}
	}
	if _, err := Analyze(Spec{Model: mustPreset(t, "llama-3.1-8b")}, 0, 0); err == nil || !strings.Contains(err.Error(), "tokens must be") {
		t.Errorf("tokens 0: %v", err)
	}
}

func TestParseTokens(t *testing.T) {
	t.Parallel()
	got, err := ParseTokens("1024, 4096,8k,128K")
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]int{1024, 4096, 8192, 131072}, got); diff != "" {
		t.Error(diff)
	}
	for _, bad := range []string{"", "0", "-3", "abc", "4096x", "1.5k", ",",
		"65537k", "65M",
		// 18014398509481985 x 1024 wraps to 1024 in 64 bits.
		"18014398509481985k", "9223372036854775807M"} {
		if got, err := ParseTokens(bad); err == nil {
			t.Errorf("ParseTokens(%q) = %v, should fail", bad, got)
		}
	}
	if got, err := ParseTokens("64M"); err != nil || got[0] != MaxTokens {
		t.Errorf("ParseTokens(64M) = %v, %v: the limit itself is accepted", got, err)
	}
}

// Each dimension is bounded on its own; their product must be too, or the
// byte counts wrap (2^20 layers x 2^20 heads x 2^20 head_dim went
// negative).
func TestCacheSizeOverflowRefused(t *testing.T) {
	t.Parallel()
	huge := Model{Name: "huge", NumLayers: 1 << 20, NumAttentionHeads: 1 << 20, NumKVHeads: 1 << 20, HeadDim: 1 << 20, DType: FP32}
	tests := []struct {
		name string
		spec Spec
		want string
	}{
		{"model", Spec{Model: huge}, "num_hidden_layers 1048576 x 2 x num_key_value_heads 1048576 x head_dim 1048576"},
		// Would fit at the model's 1 byte per value: refused all the same,
		// since --kv-dtype may widen it.
		{"any kv dtype", Spec{Model: Model{Name: "w", NumLayers: 1 << 14, NumAttentionHeads: 1 << 10, NumKVHeads: 1 << 10,
			HeadDim: 1 << 10, DType: FP8}}, "x 4 B per value"},
		// Fits on one rank, not replicated on 1024.
		{"replicated on every rank", Spec{Model: Model{Name: "r", NumLayers: 1 << 10, NumAttentionHeads: 1024, NumKVHeads: 1, HeadDim: 1 << 20,
			DType: BF16}, TP: 1024}, "on 1024 ranks overflows"},
		{"mla", Spec{Model: Model{Name: "m", NumLayers: 1 << 20, NumAttentionHeads: 8, NumKVHeads: 1, HeadDim: 1 << 20, DType: FP32,
			MLA: &MLA{KVLoraRank: 1 << 19, QKRopeHeadDim: 1 << 19}}}, "kv_lora_rank 524288 + qk_rope_head_dim 524288"},
	}
	for _, tc := range tests {
		err := tc.spec.Validate()
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: want error containing %q, got %v", tc.name, tc.want, err)
		}
		if _, err := Analyze(tc.spec, 4096, 0); err == nil {
			t.Errorf("%s: Analyze accepted it", tc.name)
		}
	}
}

func TestMulChecked(t *testing.T) {
	t.Parallel()
	tests := []struct {
		in   []int64
		want int64
		ok   bool
	}{
		{nil, 1, true},
		{[]int64{1 << 31, 1 << 31}, 1 << 62, true},
		{[]int64{1 << 31, 1 << 32}, 0, false},
		{[]int64{3, 1 << 62}, 0, false},
		{[]int64{0, -1}, 0, false},
		{[]int64{0, 1 << 62, 1 << 62}, 0, true},
	}
	for _, tc := range tests {
		got, ok := mulChecked(tc.in...)
		if got != tc.want || ok != tc.ok {
			t.Errorf("mulChecked(%v) = %d, %v; want %d, %v", tc.in, got, ok, tc.want, tc.ok)
		}
	}
}

func TestParseDType(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]DType{"bfloat16": BF16, "torch.float16": FP16, "FP8": FP8, "fp8_e4m3": FP8, "float32": FP32} {
		if got, err := ParseDType(in); err != nil || got != want {
			t.Errorf("ParseDType(%q) = %v, %v", in, got, err)
		}
	}
	if _, err := ParseDType("int4"); err == nil || !strings.Contains(err.Error(), "fp8, bf16") {
		t.Errorf("int4: %v", err)
	}
}

// The TP pairs vLLM refuses: non-MLA, P_TP > D_TP, P_TP > KV heads.
func TestVLLMRefusesTP(t *testing.T) {
	gqa4 := Model{Name: "g", NumLayers: 2, NumAttentionHeads: 32, NumKVHeads: 4, HeadDim: 128, DType: BF16}
	mla := Model{Name: "m", NumLayers: 2, NumAttentionHeads: 8, NumKVHeads: 1, HeadDim: 576, DType: BF16, MLA: &MLA{KVLoraRank: 512, QKRopeHeadDim: 64}}
	for _, tc := range []struct {
		m      Model
		p, d   int
		refuse bool
	}{
		{gqa4, 8, 4, true},    // 4 heads replicated over 8 prefill ranks, read by fewer
		{gqa4, 8, 2, true},    //
		{gqa4, 4, 2, false},   // heads split, not replicated: vLLM plans it
		{gqa4, 4, 8, false},   // decode TP above prefill's
		{gqa4, 8, 8, false},   // equal TP
		{gqa4, 16, 8, true},   //
		{mla, 8, 4, false},    // MLA reads one replica
		{mla, 2, 1, false},    //
		{gqa4, 2, 1, false},   //
		{gqa4, 16, 16, false}, //
	} {
		p, d := Spec{Model: tc.m, TP: tc.p}, Spec{Model: tc.m, TP: tc.d}
		if got := VLLMRefusesTP(p, d); got != tc.refuse {
			t.Errorf("%s heads %d mla %v: prefill tp %d -> decode tp %d: refused %v, want %v", tc.m.Name, tc.m.NumKVHeads, tc.m.IsMLA(), tc.p, tc.d, got, tc.refuse)
		}
	}
}
