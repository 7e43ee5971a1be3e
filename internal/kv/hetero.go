package kv

import (
	"errors"
	"fmt"
)

// Chunk is one contiguous piece of a block that moves between two ranks:
// Length bytes at SrcOffset inside the source block land at DstOffset
// inside the destination block. One chunk is one transfer descriptor.
type Chunk struct {
	SrcOffset int64 `json:"src_offset"`
	DstOffset int64 `json:"dst_offset"`
	Length    int64 `json:"length"`
}

// BlockChunks lists the descriptors that carry the KV heads `slice` from a
// block laid out for `src` heads into a block laid out for `dst` heads.
// Equal layouts give one chunk per block; a head slice is one chunk per K/V
// part with HND and one per token and part with NHD. Adjacent pieces are
// merged, so a whole-block copy is always a single chunk.
func (s Spec) BlockChunks(src, dst, slice HeadRange) []Chunk {
	s = s.withDefaults()
	if s.Model.IsMLA() {
		b := s.BlockBytes(HeadRange{0, 1})
		return []Chunk{{0, 0, b}}
	}
	hb := s.headBytes()
	bs := int64(s.BlockSize)
	parts := 1
	if s.Layout == FlashInfer {
		parts = 2
	}
	srcPart := bs * int64(src.Len()) * hb
	dstPart := bs * int64(dst.Len()) * hb
	var out []Chunk
	add := func(c Chunk) {
		if n := len(out); n > 0 {
			last := &out[n-1]
			if last.SrcOffset+last.Length == c.SrcOffset && last.DstOffset+last.Length == c.DstOffset {
				last.Length += c.Length
				return
			}
		}
		out = append(out, c)
	}
	for p := 0; p < parts; p++ {
		srcBase, dstBase := int64(p)*srcPart, int64(p)*dstPart
		if s.Order == HND {
			add(Chunk{
				SrcOffset: srcBase + int64(slice.Start-src.Start)*bs*hb,
				DstOffset: dstBase + int64(slice.Start-dst.Start)*bs*hb,
				Length:    int64(slice.Len()) * bs * hb,
			})
			continue
		}
		for t := int64(0); t < bs; t++ {
			add(Chunk{
				SrcOffset: srcBase + t*int64(src.Len())*hb + int64(slice.Start-src.Start)*hb,
				DstOffset: dstBase + t*int64(dst.Len())*hb + int64(slice.Start-dst.Start)*hb,
				Length:    int64(slice.Len()) * hb,
			})
		}
	}
	return out
}

// TransferPlan says, for a prefill deployed with one TP size and a decode
// with another, which prefill ranks each decode rank reads which heads
// from, and how many completion notifications each prefill rank waits for.
// It follows vLLM's NIXL connector: a decode rank with more ranks than the
// prefill reads a head slice of one prefill rank; with fewer, it reads from
// each of the prefill ranks in its group, skipping ranks that replicate a
// head already read; MLA latents are read whole from one rank and the rest
// of the group only gets a notification.
type TransferPlan struct {
	PrefillTP int           `json:"prefill_tp"`
	DecodeTP  int           `json:"decode_tp"`
	Decode    []DecodeReads `json:"decode_ranks"`
	Consumers []int         `json:"consumers_per_prefill_rank"` // notifications each prefill rank expects
	Prefill   Spec          `json:"-"`
	DecodeS   Spec          `json:"-"`
}

// DecodeReads is what one decode rank reads.
type DecodeReads struct {
	Rank       int          `json:"rank"`
	Heads      HeadRange    `json:"heads"`
	Reads      []SourceRead `json:"reads"`
	NotifyOnly []int        `json:"notify_only,omitempty"` // prefill ranks told "done" without a read
}

// SourceRead is one decode rank's read from one prefill rank.
type SourceRead struct {
	PrefillRank int       `json:"prefill_rank"`
	Heads       HeadRange `json:"heads"`
	Chunks      []Chunk   `json:"chunks"` // per block per region
}

// Plan builds the transfer plan between a prefill spec and a decode spec.
// Everything but TP (and the decode's own choices of block size) must be
// the same on both sides.
func Plan(prefill, decode Spec) (TransferPlan, error) {
	var err error
	if prefill, err = prefill.Normalize(); err != nil {
		return TransferPlan{}, fmt.Errorf("prefill: %w", err)
	}
	if decode, err = decode.Normalize(); err != nil {
		return TransferPlan{}, fmt.Errorf("decode: %w", err)
	}
	switch {
	case prefill.BlockSize != decode.BlockSize:
		return TransferPlan{}, fmt.Errorf("prefill block size %d differs from decode block size %d", prefill.BlockSize, decode.BlockSize)
	case prefill.Layout != decode.Layout || prefill.Order != decode.Order:
		return TransferPlan{}, fmt.Errorf("prefill layout %s/%s differs from decode layout %s/%s", prefill.Layout, prefill.Order, decode.Layout, decode.Order)
	case prefill.DType != decode.DType:
		return TransferPlan{}, fmt.Errorf("prefill kv dtype %s differs from decode kv dtype %s", prefill.DType, decode.DType)
	case prefill.PP != decode.PP:
		return TransferPlan{}, errors.New("prefill and decode must use the same pp size")
	}
	p, d := prefill.TP, decode.TP
	if p%d != 0 && d%p != 0 {
		return TransferPlan{}, fmt.Errorf("prefill tp %d and decode tp %d must divide one another", p, d)
	}
	plan := TransferPlan{PrefillTP: p, DecodeTP: d, Consumers: make([]int, p), Prefill: prefill, DecodeS: decode}
	for rank := 0; rank < d; rank++ {
		dr := DecodeReads{Rank: rank, Heads: decode.Heads(d, rank)}
		var candidates []int
		if d >= p {
			candidates = []int{rank * p / d}
		} else {
			k := p / d
			for i := 0; i < k; i++ {
				candidates = append(candidates, rank*k+i)
			}
		}
		if prefill.Model.IsMLA() {
			src := candidates[0]
			dr.Reads = []SourceRead{{PrefillRank: src, Heads: HeadRange{0, 1},
				Chunks: prefill.BlockChunks(HeadRange{0, 1}, HeadRange{0, 1}, HeadRange{0, 1})}}
			plan.Consumers[src]++
			for _, other := range candidates[1:] {
				dr.NotifyOnly = append(dr.NotifyOnly, other)
				plan.Consumers[other]++
			}
			plan.Decode = append(plan.Decode, dr)
			continue
		}
		used := map[int]bool{}
		for h := dr.Heads.Start; h < dr.Heads.End; h++ {
			src := -1
			for _, c := range candidates {
				if prefill.Heads(p, c).Contains(h) {
					src = c
					break
				}
			}
			if src < 0 {
				return TransferPlan{}, fmt.Errorf("decode rank %d needs kv head %d that no prefill rank in its group holds", rank, h)
			}
			if n := len(dr.Reads); n > 0 && dr.Reads[n-1].PrefillRank == src && dr.Reads[n-1].Heads.End == h {
				dr.Reads[n-1].Heads.End++
			} else {
				dr.Reads = append(dr.Reads, SourceRead{PrefillRank: src, Heads: HeadRange{h, h + 1}})
			}
			used[src] = true
		}
		for i := range dr.Reads {
			rd := &dr.Reads[i]
			rd.Chunks = prefill.BlockChunks(prefill.Heads(p, rd.PrefillRank), dr.Heads, rd.Heads)
		}
		for _, c := range candidates {
			if used[c] {
				plan.Consumers[c]++
			} else {
				// A replica this rank did not read from still holds the
				// request's blocks: tell it, so it can free them.
				dr.NotifyOnly = append(dr.NotifyOnly, c)
				plan.Consumers[c]++
			}
		}
		plan.Decode = append(plan.Decode, dr)
	}
	return plan, nil
}

// DescriptorsPerBlock is how many descriptors one decode rank posts per
// block per region.
func (r DecodeReads) DescriptorsPerBlock() int {
	n := 0
	for _, rd := range r.Reads {
		n += len(rd.Chunks)
	}
	return n
}

// BytesPerBlock is what one decode rank receives per block per region.
func (r DecodeReads) BytesPerBlock() int64 {
	var b int64
	for _, rd := range r.Reads {
		for _, c := range rd.Chunks {
			b += c.Length
		}
	}
	return b
}

// VLLMTPRefusal is vLLM's reason text for the TP pairs it refuses: its
// NIXL worker asserts, when it handshakes with prefill
// (base_worker.py, _validate_remote_agent_handshake), that a model that
// is neither MLA nor Mamba does not read with P_TP > D_TP from a prefill
// whose KV heads are replicated (its TP above the number of KV heads).
const VLLMTPRefusal = "num_kv_heads > tp_size with P_TP > D_TP not supported for non-mamba"

// VLLMRefusesTP reports whether vLLM refuses to hand KV over from
// prefill to decode at these TP sizes (VLLMTPRefusal): a non-MLA model,
// prefill TP above decode TP, and prefill TP above the KV heads. nixlctl
// can plan it (it reads the replicas once); vLLM cannot.
func VLLMRefusesTP(prefill, decode Spec) bool {
	m := prefill.Model
	return !m.IsMLA() && prefill.TP > decode.TP && prefill.TP > m.NumKVHeads
}
