package kv

import (
	"errors"
	"fmt"
	"strings"
)

// AttnLayout is how an attention backend arranges K and V in memory, which
// decides how many regions a rank registers per layer.
type AttnLayout string

// Attention layouts.
const (
	// FlashAttn is vLLM's FlashAttention-style cache: one [2, blocks, ...]
	// tensor per layer whose K and V halves are registered as two regions.
	FlashAttn AttnLayout = "flash-attn"
	// FlashInfer keeps K and V together inside each block: one region per
	// layer whose blocks are twice as large.
	FlashInfer AttnLayout = "flashinfer"
)

// ParseAttnLayout accepts flash-attn (fa) and flashinfer (fi).
func ParseAttnLayout(s string) (AttnLayout, error) {
	switch strings.ToLower(strings.TrimSpace(s)) {
	case "flash-attn", "flash_attn", "flashattn", "fa", "":
		return FlashAttn, nil
	case "flashinfer", "flash-infer", "fi":
		return FlashInfer, nil
	}
	return "", fmt.Errorf("unknown layout %q (want flash-attn or flashinfer)", s)
}

// CacheOrder is the order of heads and tokens inside a block.
type CacheOrder string

// Orders. vLLM's NIXL connector forces HND so that a head slice is one
// contiguous range of a block; with NHD a slice is one piece per token.
const (
	HND CacheOrder = "HND"
	NHD CacheOrder = "NHD"
)

// ParseCacheOrder accepts HND and NHD in any case.
func ParseCacheOrder(s string) (CacheOrder, error) {
	switch strings.ToUpper(strings.TrimSpace(s)) {
	case "HND", "":
		return HND, nil
	case "NHD":
		return NHD, nil
	}
	return "", fmt.Errorf("unknown kv cache layout %q (want HND or NHD)", s)
}

// Part is what a region holds.
type Part string

// Region contents.
const (
	PartK      Part = "K"
	PartV      Part = "V"
	PartKV     Part = "KV"
	PartLatent Part = "latent"
)

// Spec is a model's cache as one engine deploys it.
type Spec struct {
	Model     Model
	DType     DType // cache dtype; empty means the model's dtype
	BlockSize int   // tokens per block
	Layout    AttnLayout
	Order     CacheOrder
	TP, PP    int
	// KeepFullWindow makes sliding-window layers hold (and transfer) every
	// token, as when the engine runs without its hybrid allocator.
	KeepFullWindow bool
}

// Limits keep every size we compute inside int64 and every loop short.
const (
	MaxParallel  = 1024
	MaxBlockSize = 1 << 16
	MaxTokens    = 1 << 26
)

// withDefaults fills zero values with the engines' defaults.
func (s Spec) withDefaults() Spec {
	if s.DType == "" {
		s.DType = s.Model.DType
	}
	if s.BlockSize == 0 {
		s.BlockSize = 16
	}
	if s.Layout == "" {
		s.Layout = FlashAttn
	}
	if s.Order == "" {
		s.Order = HND
	}
	if s.TP == 0 {
		s.TP = 1
	}
	if s.PP == 0 {
		s.PP = 1
	}
	return s
}

// Normalize returns the spec with defaults applied and checks it.
func (s Spec) Normalize() (Spec, error) {
	s = s.withDefaults()
	return s, s.Validate()
}

// Validate checks that the model can be deployed this way.
func (s Spec) Validate() error {
	s = s.withDefaults()
	if err := s.Model.Validate(); err != nil {
		return err
	}
	var errs []error
	bad := func(format string, a ...any) { errs = append(errs, fmt.Errorf(format, a...)) }
	if s.DType.Bytes() == 0 {
		bad("unknown kv dtype %q (want one of fp8, bf16, fp16, fp32)", s.DType)
	}
	if s.BlockSize < 1 || s.BlockSize > MaxBlockSize {
		bad("block size must be between 1 and %d tokens (got %d)", MaxBlockSize, s.BlockSize)
	}
	if s.TP < 1 || s.TP > MaxParallel {
		bad("tp must be between 1 and %d (got %d)", MaxParallel, s.TP)
	}
	if s.PP < 1 || s.PP > MaxParallel {
		bad("pp must be between 1 and %d (got %d)", MaxParallel, s.PP)
	}
	if len(errs) > 0 {
		return errors.Join(errs...)
	}
	m := s.Model
	if m.NumAttentionHeads%s.TP != 0 {
		bad("tp %d does not divide num_attention_heads %d", s.TP, m.NumAttentionHeads)
	}
	if !m.IsMLA() {
		switch {
		case s.TP <= m.NumKVHeads && m.NumKVHeads%s.TP != 0:
			bad("tp %d does not divide num_key_value_heads %d", s.TP, m.NumKVHeads)
		case s.TP > m.NumKVHeads && s.TP%m.NumKVHeads != 0:
			bad("tp %d is larger than num_key_value_heads %d but not a multiple of it (each rank must hold whole replicated heads)", s.TP, m.NumKVHeads)
		}
	}
	if s.PP > m.NumLayers {
		bad("pp %d is larger than num_hidden_layers %d", s.PP, m.NumLayers)
	}
	// The cache dtype may be wider than the model's, and tensor parallelism
	// replicates heads: check the product with both.
	if err := m.checkCacheFits(int64(s.DType.Bytes()), s.TP); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// StageLayers returns the global layer indices of pipeline stage ppRank,
// split as vLLM does: equal shares, the remainder going one layer each to
// the stages just before the last.
func (s Spec) StageLayers(ppRank int) []int {
	s = s.withDefaults()
	counts := stageLayerCounts(s.Model.NumLayers, s.PP)
	start := 0
	for i := 0; i < ppRank; i++ {
		start += counts[i]
	}
	layers := make([]int, counts[ppRank])
	for i := range layers {
		layers[i] = start + i
	}
	return layers
}

func stageLayerCounts(layers, pp int) []int {
	counts := make([]int, pp)
	for i := range counts {
		counts[i] = layers / pp
	}
	for i := 2; i < layers%pp+2; i++ {
		counts[pp-i]++
	}
	return counts
}

// HeadRange is the half-open range [Start, End) of KV heads a rank holds.
type HeadRange struct{ Start, End int }

// Len is the number of heads.
func (h HeadRange) Len() int { return h.End - h.Start }

// Contains reports whether head i is in the range.
func (h HeadRange) Contains(i int) bool { return i >= h.Start && i < h.End }

// Heads returns the KV heads tensor-parallel rank `rank` of `tp` holds: a
// 1/tp share, or one whole head replicated on tp/kv_heads ranks when there
// are fewer heads than ranks. MLA latents are whole on every rank.
func (s Spec) Heads(tp, rank int) HeadRange {
	m := s.Model
	if m.IsMLA() {
		return HeadRange{0, 1}
	}
	if tp <= m.NumKVHeads {
		per := m.NumKVHeads / tp
		return HeadRange{rank * per, (rank + 1) * per}
	}
	h := rank * m.NumKVHeads / tp
	return HeadRange{h, h + 1}
}

// HeadReplicas is how many tensor-parallel ranks hold each head (1 when
// heads are split, tp for MLA).
func (s Spec) HeadReplicas() int {
	s = s.withDefaults()
	if s.Model.IsMLA() {
		return s.TP
	}
	if s.TP > s.Model.NumKVHeads {
		return s.TP / s.Model.NumKVHeads
	}
	return 1
}

// Region is one registered memory region of a rank: one layer's K, V, K|V
// or MLA latent tensor, divided into blocks of BlockBytes.
type Region struct {
	Layer      int       `json:"layer"`
	Part       Part      `json:"part"`
	Kind       LayerKind `json:"kind"`
	BlockBytes int64     `json:"block_bytes"`
}

// RankLayout is what one (tp rank, pp rank) holds.
type RankLayout struct {
	TPRank  int       `json:"tp_rank"`
	PPRank  int       `json:"pp_rank"`
	Layers  []int     `json:"layers"`
	Heads   HeadRange `json:"heads"`
	Regions []Region  `json:"regions"`
	// BytesPerToken is this rank's cache for one token over its layers.
	BytesPerToken int64 `json:"bytes_per_token"`
}

// headBytes is one head's K (or V) values for one token.
func (s Spec) headBytes() int64 { return int64(s.Model.HeadDim) * int64(s.DType.Bytes()) }

// BlockBytes is the size of one block of one region on a rank holding
// `heads` heads.
func (s Spec) BlockBytes(heads HeadRange) int64 {
	s = s.withDefaults()
	bs := int64(s.BlockSize)
	if s.Model.IsMLA() {
		return bs * int64(s.Model.TokenValuesPerLayer()) * int64(s.DType.Bytes())
	}
	b := bs * int64(heads.Len()) * s.headBytes()
	if s.Layout == FlashInfer {
		b *= 2
	}
	return b
}

// Rank lays out one rank's regions.
func (s Spec) Rank(tpRank, ppRank int) RankLayout {
	s = s.withDefaults()
	r := RankLayout{TPRank: tpRank, PPRank: ppRank, Layers: s.StageLayers(ppRank), Heads: s.Heads(s.TP, tpRank)}
	block := s.BlockBytes(r.Heads)
	for _, l := range r.Layers {
		kind := s.Model.LayerKindOf(l)
		switch {
		case s.Model.IsMLA():
			r.Regions = append(r.Regions, Region{Layer: l, Part: PartLatent, Kind: kind, BlockBytes: block})
		case s.Layout == FlashInfer:
			r.Regions = append(r.Regions, Region{Layer: l, Part: PartKV, Kind: kind, BlockBytes: block})
		default:
			r.Regions = append(r.Regions,
				Region{Layer: l, Part: PartK, Kind: kind, BlockBytes: block},
				Region{Layer: l, Part: PartV, Kind: kind, BlockBytes: block})
		}
	}
	for _, reg := range r.Regions {
		r.BytesPerToken += reg.BlockBytes / int64(s.BlockSize)
	}
	return r
}

// LargestStage is the pipeline stage with the most layers (the one whose
// transfers take longest).
func (s Spec) LargestStage() int {
	s = s.withDefaults()
	counts := stageLayerCounts(s.Model.NumLayers, s.PP)
	best := 0
	for i, c := range counts {
		if c > counts[best] {
			best = i
		}
	}
	return best
}

// BlocksFor is how many blocks a layer of `kind` holds for a request of
// `tokens` tokens: all of them for full attention, only those overlapping
// the last SlidingWindow tokens for a sliding layer.
func (s Spec) BlocksFor(kind LayerKind, tokens int) int {
	s = s.withDefaults()
	if tokens <= 0 {
		return 0
	}
	bs := s.BlockSize
	if kind != SlidingAttention || s.KeepFullWindow || s.Model.SlidingWindow <= 0 {
		return (tokens + bs - 1) / bs
	}
	first := tokens - s.Model.SlidingWindow
	if first < 0 {
		first = 0
	}
	return (tokens-1)/bs - first/bs + 1
}

// RankRequest is one rank's share of a request.
type RankRequest struct {
	Descriptors int   // one per block per region
	Bytes       int64 // whole blocks
}

// RankRequest sizes one rank's share of a request of `tokens` tokens.
func (s Spec) RankRequest(r RankLayout, tokens int) RankRequest {
	var out RankRequest
	for _, reg := range r.Regions {
		n := s.BlocksFor(reg.Kind, tokens)
		out.Descriptors += n
		out.Bytes += int64(n) * reg.BlockBytes
	}
	return out
}

// RequestBytes is the whole model's cache for a request, counting whole
// blocks and each head once (no tensor-parallel replication).
func (s Spec) RequestBytes(tokens int) int64 {
	s = s.withDefaults()
	perLayerBlock := int64(s.BlockSize) * int64(s.Model.TokenValuesPerLayer()) * int64(s.DType.Bytes())
	var total int64
	for l := 0; l < s.Model.NumLayers; l++ {
		total += int64(s.BlocksFor(s.Model.LayerKindOf(l), tokens)) * perLayerBlock
	}
	return total
}

// BlockBytesAllRanks is what one block weighs on all ranks of an engine,
// every TP rank of every pipeline stage.
func (s Spec) BlockBytesAllRanks(tp int) int64 {
	s.TP = tp
	var b int64
	for pp := 0; pp < max(s.PP, 1); pp++ {
		for r := 0; r < tp; r++ {
			for _, reg := range s.Rank(r, pp).Regions {
				b += reg.BlockBytes
			}
		}
	}
	return b
}
