package engine

import (
	"context"
	"encoding/binary"
	"fmt"
	"sort"
	"sync"

	"github.com/nixlctl/nixlctl/internal/blocktag"
	"github.com/nixlctl/nixlctl/internal/kv"
	"github.com/nixlctl/nixlctl/internal/nixl"
)

// Pool is one rank's paged KV cache: every region (a layer's K, V, K|V or
// MLA latent) is NumBlocks blocks of the region's block size, laid out one
// region after another in one registered buffer, as an engine's cache
// tensors are.
type Pool struct {
	Spec      kv.Spec
	Rank      kv.RankLayout
	NumBlocks int
	Buf       *nixl.Buffer
	base      []uint64 // per region
	pieces    []piece  // tag pieces of one block (same for every region)
	// rows holds, for token-major (NHD) layouts, each token's pieces of a
	// block (one per head and K|V part) in memory order; nil for HND and
	// MLA, whose pieces span all of a block's tokens.
	rows [][]piece
}

// piece is a contiguous part of a block holding one KV head's values (all
// of a block's tokens with HND, one token with NHD), or the whole block for
// MLA. Tags are per piece, so a head slice moved between ranks of
// different TP sizes is checked at its own place on both sides.
type piece struct {
	off, len int64
	head     int // global KV head (0 for MLA)
	part     int // 0 = K (or latent), 1 = V inside a K|V block
	token    int // -1 when the piece spans all tokens
	// salt is the piece's share of its key, the same in every block:
	// computed once, so a piece's key costs one mix, not four (token-major
	// layouts have a piece per head per token: a million per request).
	salt uint64
}

// NewPool lays out and registers a rank's pool of numBlocks blocks in buf,
// which must be large enough (PoolBytes).
func NewPool(spec kv.Spec, tpRank, ppRank, numBlocks int, buf *nixl.Buffer) (*Pool, error) {
	spec, err := spec.Normalize()
	if err != nil {
		return nil, err
	}
	r := spec.Rank(tpRank, ppRank)
	p := &Pool{Spec: spec, Rank: r, NumBlocks: numBlocks, Buf: buf}
	var off uint64
	for _, reg := range r.Regions {
		p.base = append(p.base, buf.Addr+off)
		off += uint64(numBlocks) * uint64(reg.BlockBytes)
	}
	if off > uint64(buf.Len) {
		return nil, fmt.Errorf("pool of %d blocks needs %d bytes, buffer has %d", numBlocks, off, buf.Len)
	}
	p.pieces = blockPieces(spec, r.Heads)
	// Walk pieces in memory order: token-major pieces of one head lie a
	// token row apart, and visiting them head by head strides the block.
	sort.Slice(p.pieces, func(i, j int) bool { return p.pieces[i].off < p.pieces[j].off })
	for i := range p.pieces {
		pc := &p.pieces[i]
		pc.salt = blocktag.Key(uint64(pc.head), uint64(pc.part), uint64(pc.token+1))
	}
	if spec.Order == kv.NHD && !spec.Model.IsMLA() {
		p.rows = make([][]piece, spec.BlockSize)
		for _, pc := range p.pieces {
			p.rows[pc.token] = append(p.rows[pc.token], pc)
		}
	}
	return p, nil
}

// PoolBytes is the buffer size a rank's pool of numBlocks blocks needs.
func PoolBytes(spec kv.Spec, tpRank, ppRank, numBlocks int) int64 {
	r := spec.Rank(tpRank, ppRank)
	var n int64
	for _, reg := range r.Regions {
		n += int64(numBlocks) * reg.BlockBytes
	}
	return n
}

// RegionBase is the address of region i's block 0.
func (p *Pool) RegionBase(i int) uint64 { return p.base[i] }

// BlockLen is region i's block size.
func (p *Pool) BlockLen(i int) int64 { return p.Rank.Regions[i].BlockBytes }

// BlockAddr is the address of block b of region i.
func (p *Pool) BlockAddr(i, b int) uint64 { return p.base[i] + uint64(b)*uint64(p.BlockLen(i)) }

func blockPieces(spec kv.Spec, heads kv.HeadRange) []piece {
	m := spec.Model
	if m.IsMLA() {
		return []piece{{off: 0, len: spec.BlockBytes(heads), token: -1}}
	}
	hb := int64(m.HeadDim) * int64(spec.DType.Bytes())
	bs := int64(spec.BlockSize)
	parts := 1
	if spec.Layout == kv.FlashInfer {
		parts = 2
	}
	partBytes := bs * int64(heads.Len()) * hb
	var out []piece
	for part := 0; part < parts; part++ {
		for h := heads.Start; h < heads.End; h++ {
			rel := int64(h - heads.Start)
			if spec.Order == kv.HND {
				out = append(out, piece{off: int64(part)*partBytes + rel*bs*hb, len: bs * hb, head: h, part: part, token: -1})
				continue
			}
			for t := int64(0); t < bs; t++ {
				out = append(out, piece{off: int64(part)*partBytes + t*int64(heads.Len())*hb + rel*hb, len: hb, head: h, part: part, token: int(t)})
			}
		}
	}
	return out
}

// blockKey names one block of one request: the request's key, the region's
// layer and part, and the block's logical position in the request.
func blockKey(reqKey uint64, reg kv.Region, logical int) uint64 {
	part := uint64(0)
	if reg.Part == kv.PartV {
		part = 1
	}
	return blocktag.Key(reqKey, uint64(reg.Layer), part, uint64(logical))
}

func pieceKey(bk uint64, pc piece) uint64 {
	return blocktag.Key(bk ^ pc.salt)
}

// Verify says how much of each block tags cover. Sparse writes the first
// and last word of every piece of HND and MLA blocks; token-major (NHD)
// blocks have a piece per head per token (a million a request), so Sparse
// tags there only the pieces of three of a block's tokens, every head of
// each: the first, the last, and one in between that moves on from block
// to block (sparseRows). A sparse check reads four of those words per row
// (checkRowEnds). That catches a misplaced, stale or torn block in every
// block, and a head-slice or token-position error that repeats across
// blocks; Full writes and checks every word of every piece.
type Verify int

// Verification depths.
const (
	Sparse Verify = iota
	Full
)

// Fill writes the request's tags into blocks (the request's blocks in
// order, logicalStart being the logical index of blocks[0]) of every region,
// limited for each region to the blocks that region keeps (sliding
// windows keep only the tail).
func (p *Pool) Fill(reqKey uint64, blocks []int, logicalStart, tokens int, v Verify) {
	_ = p.FillCtx(context.Background(), reqKey, blocks, logicalStart, tokens, v)
}

// FillCtx is Fill that stops between blocks once ctx ends and then
// returns its error, the blocks written only in part. A long prompt is
// hundreds of MB of tags: a prefill whose caller gave up (the run
// stopped, its decode died) must not hold its blocks, and count as in
// flight, for the seconds the rest of the fill takes on a loaded host.
func (p *Pool) FillCtx(ctx context.Context, reqKey uint64, blocks []int, logicalStart, tokens int, v Verify) error {
	return p.FillFor(ctx, reqKey, blocks, logicalStart, tokens, v, false)
}

// FillFor is FillCtx that, told the blocks will be checked by ranks laid
// out as this one (the same TP size, so the same pieces), writes of sparse
// tags only the words those checks read (checkRowEnds): four a row instead
// of two a piece, which on two cores was a tenth of the handoff's
// bandwidth. A check by ranks of another TP size reads other pieces, so
// without sameLayout every piece gets its ends.
func (p *Pool) FillFor(ctx context.Context, reqKey uint64, blocks []int, logicalStart, tokens int, v Verify, sameLayout bool) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if p.Buf.Mem == nixl.VRAM {
		// Device memory: full tags, written through staged host copies
		// (one call: not stopped part way).
		spans, keys, _ := p.pieceSpans(reqKey, blocks, logicalStart, tokens)
		_ = blocktag.FillSpans(p.Buf, spans, func(i int) uint64 { return keys[i] })
		return ctx.Err()
	}
	data := p.Buf.Bytes()
	if data == nil {
		return ctx.Err()
	}
	done := ctx.Done() // nil for a context that never ends: no check
	stopped := func() bool {
		select {
		case <-done:
			return true
		default:
			return false
		}
	}
	// Both depths without a call per piece: token-major layouts have a
	// million pieces a request, and the endpoints' CPU is the limit on
	// small machines.
	if v != Full && (sameLayout || p.rows == nil) {
		// The words a same-layout check reads, or every piece's ends
		// where pieces are pages apart (HND, MLA; cold, 128 blocks:
		// 4.2 -> 2.8 ms). A token-major row's pieces are next to each
		// other, and listing them cost more than it saved (5.9 -> 6.3 ms).
		var stop func() bool
		if done != nil {
			stop = stopped
		}
		p.sparseWordChunks(tagChunk, !sameLayout, reqKey, blocks, logicalStart, tokens, stop, func(words []tagWord) bool {
			fillWords(data, words)
			return true
		})
		return ctx.Err()
	}
	// Sparse tags cover a sample of a token-major block's rows
	// (sparseRows); full tags every piece.
	fill := blocktag.FillEnds
	if v == Full {
		fill = blocktag.Fill
	}
	var rows [3][]piece
	all := [][]piece{p.pieces}
	p.eachBlock(reqKey, blocks, logicalStart, tokens, func(_, logical int, bk uint64, off int64) bool {
		if done != nil && stopped() {
			return false
		}
		sample := all
		if v != Full {
			sample = p.sparseRows(reqKey, logical, &rows)
		}
		for _, row := range sample {
			for k := range row {
				pc := &row[k]
				fill(data[off+pc.off:off+pc.off+pc.len], blocktag.Key(bk^pc.salt))
			}
		}
		return true
	})
	return ctx.Err()
}

// sparseRows lists the pieces a sparse tag covers in a request's logical
// block, in memory order, using rows for storage: every piece, except
// with token-major layouts, where it is the pieces of the block's first
// and last token and of one token in between that moves on by one per
// logical block (from a point the request's key picks), so any run of
// BlockSize-2 blocks checks every middle position. First and last catch
// a block from elsewhere and a torn copy; every head of each catches a
// wrong head slice; the moving one catches a per-token descriptor error
// that repeats over blocks, at 3/16 of the tag work of every token.
func (p *Pool) sparseRows(reqKey uint64, logical int, rows *[3][]piece) [][]piece {
	n := len(p.rows)
	switch {
	case p.rows == nil:
		rows[0] = p.pieces
		return rows[:1]
	case n <= 3:
		return p.rows
	}
	mid := 1 + int((reqKey>>1+uint64(logical))%uint64(n-2))
	rows[0], rows[1], rows[2] = p.rows[0], p.rows[mid], p.rows[n-1]
	return rows[:]
}

// rowEnds picks the pieces a sparse check reads of one row of a block:
// the first word of the first piece and the last word of the last piece,
// which a block from elsewhere, a stale or a truncated block fails; and
// both end words of a moving piece, one that moves on by one per logical
// block (from a point the request's key picks), which a per-head or
// per-piece descriptor error fails within a row's length of blocks, since
// such an error repeats over blocks. Four words a row, against a word per
// 4 KiB and two a piece before: on a host where the copy itself is bound
// by memory, those cache lines cost the handoff a quarter of its
// bandwidth. --verify full reads every word.
func rowEnds(row []piece, reqKey uint64, logical int) (first, last, moving *piece) {
	n := len(row)
	return &row[0], &row[n-1], &row[int((reqKey>>9+uint64(logical))%uint64(n))]
}

// checkRowEnds reads what a sparse check reads of one row of a block
// (block holds the block and what follows; rowEnds says which words) and
// returns the first piece that fails. Check calls it only to describe a
// failure checkWords found.
func checkRowEnds(block []byte, row []piece, bk, reqKey uint64, logical int) (*piece, *blocktag.Mismatch) {
	if len(row) == 0 {
		return nil, nil
	}
	at := func(pc *piece) []byte { return block[pc.off : pc.off+pc.len] }
	first, last, mv := rowEnds(row, reqKey, logical)
	if m := blocktag.CheckFirst(at(first), blocktag.Key(bk^first.salt)); m != nil {
		return first, m
	}
	if m := blocktag.CheckLast(at(last), blocktag.Key(bk^last.salt)); m != nil {
		return last, m
	}
	key := blocktag.Key(bk ^ mv.salt)
	if m := blocktag.CheckFirst(at(mv), key); m != nil {
		return mv, m
	}
	if m := blocktag.CheckLast(at(mv), key); m != nil {
		return mv, m
	}
	return nil, nil
}

// tagWord is one word of a sparse tag: where it is in the pool and what
// it holds.
type tagWord struct {
	off  int64
	want uint64
}

// tagChunk is how many words are listed before they are touched: enough
// misses to keep in flight, in 64 KiB of list that stays in L2 (a 2048-token
// request of an 8B model has 32,768 words; a 128k-token request of a
// 70B model, with 80 layers to 32, 160 times as many).
const tagChunk = 4096

// tagWordsPool recycles the chunks.
var tagWordsPool = sync.Pool{New: func() any { s := make([]tagWord, 0, tagChunk+256); return &s }}

// appendRowEnds lists the words rowEnds picks of one row of the block at
// off: what checkRowEnds reads, and what a same-layout fill writes.
func appendRowEnds(words []tagWord, off int64, row []piece, bk, reqKey uint64, logical int) []tagWord {
	if len(row) == 0 {
		return words
	}
	first, last, mv := rowEnds(row, reqKey, logical)
	if first.len >= 8 {
		words = append(words, tagWord{off + first.off, blocktag.FirstWord(blocktag.Key(bk ^ first.salt))})
	}
	if last.len >= 8 {
		words = append(words, tagWord{off + last.off + last.len - 8, blocktag.LastWord(blocktag.Key(bk^last.salt), last.len)})
	}
	if mv.len >= 8 {
		key := blocktag.Key(bk ^ mv.salt)
		words = append(words, tagWord{off + mv.off, blocktag.FirstWord(key)}, tagWord{off + mv.off + mv.len - 8, blocktag.LastWord(key, mv.len)})
	}
	return words
}

// appendPieceEnds lists both end words of every piece of a row (what
// blocktag.FillEnds writes): a fill for a check by ranks of another TP
// size, which read other pieces' ends.
func appendPieceEnds(words []tagWord, off int64, row []piece, bk uint64) []tagWord {
	for k := range row {
		pc := &row[k]
		if pc.len < 8 {
			continue
		}
		key := blocktag.Key(bk ^ pc.salt)
		words = append(words, tagWord{off + pc.off, blocktag.FirstWord(key)}, tagWord{off + pc.off + pc.len - 8, blocktag.LastWord(key, pc.len)})
	}
	return words
}

// sparseWordChunks lists the words of the request's sparse tags, block by
// block (with allEnds, both ends of every piece of a tagged row, else the
// four a check reads), and hands them to touch a chunk (about chunk words)
// at a time; it stops when touch or stop (nil: never) says so, and reports
// whether every word was handed over.
//
// The words are listed first and touched after, in a loop that does
// nothing else (fillWords, checkWords): each word is a cache miss on a
// page of its own once the copy has streamed gigabytes through the
// caches, and a loop of independent loads or stores keeps many misses in
// flight, where working out each word's block, key and piece between two
// misses kept one or two. BenchmarkPoolTagsCold (2048 tokens of an 8B
// model, HND, on this 2-core VM): check 2.3 -> 0.8 ms, fill 1.4 -> 0.9 ms.
func (p *Pool) sparseWordChunks(chunk int, allEnds bool, reqKey uint64, blocks []int, logicalStart, tokens int, stop func() bool, touch func([]tagWord) bool) bool {
	wp := tagWordsPool.Get().(*[]tagWord)
	defer tagWordsPool.Put(wp)
	words := (*wp)[:0]
	var rows [3][]piece
	ok := true
	p.eachBlock(reqKey, blocks, logicalStart, tokens, func(_, logical int, bk uint64, off int64) bool {
		if stop != nil && stop() {
			ok = false
			return false
		}
		for _, row := range p.sparseRows(reqKey, logical, &rows) {
			if allEnds {
				words = appendPieceEnds(words, off, row, bk)
			} else {
				words = appendRowEnds(words, off, row, bk, reqKey, logical)
			}
		}
		if len(words) >= chunk {
			if !touch(words) {
				ok = false
				return false
			}
			words = words[:0]
		}
		return true
	})
	if ok && len(words) > 0 {
		ok = touch(words)
	}
	*wp = words[:0]
	return ok
}

// fillWords writes the listed words.
func fillWords(data []byte, words []tagWord) {
	for _, w := range words {
		binary.LittleEndian.PutUint64(data[w.off:], w.want)
	}
}

// checkWords reports whether every listed word holds what it should.
func checkWords(data []byte, words []tagWord) bool {
	for _, w := range words {
		if binary.LittleEndian.Uint64(data[w.off:]) != w.want {
			return false
		}
	}
	return true
}

// eachBlock calls f for every (region, request block) the request holds
// there (sliding-window regions keep only the tail), with the block's key
// and its offset in the pool; f returns false to stop.
func (p *Pool) eachBlock(reqKey uint64, blocks []int, logicalStart, tokens int, f func(region, logical int, bk uint64, off int64) bool) {
	for i, reg := range p.Rank.Regions {
		keep := p.Spec.BlocksFor(reg.Kind, tokens) // blocks this region holds for the whole request
		total := logicalStart + len(blocks)
		for j, b := range blocks {
			logical := logicalStart + j
			if logical < total-keep {
				continue // outside a sliding window
			}
			if !f(i, logical, blockKey(reqKey, reg, logical), int64(p.BlockAddr(i, b)-p.Buf.Addr)) {
				return
			}
		}
	}
}

// Check verifies the tags Fill wrote and returns how many blocks (region
// blocks) were wrong, with the first mismatch.
func (p *Pool) Check(reqKey uint64, blocks []int, logicalStart, tokens int, v Verify) (bad int, first error) {
	if p.Buf.Mem == nixl.VRAM {
		spans, keys, owners := p.pieceSpans(reqKey, blocks, logicalStart, tokens)
		seen := map[[2]int]bool{}
		err := blocktag.VisitSpans(p.Buf, spans, func(i int) uint64 { return keys[i] }, func(i int, _ nixl.Span, m *blocktag.Mismatch) {
			if !seen[owners[i]] {
				seen[owners[i]] = true
				bad++
				if first == nil {
					reg := p.Rank.Regions[owners[i][0]]
					first = fmt.Errorf("layer %d %s, logical block %d: %w", reg.Layer, reg.Part, owners[i][1], m)
				}
			}
		})
		if err != nil && first == nil {
			first, bad = err, bad+1
		}
		return bad, first
	}
	onBad := func(region, block int, err error) {
		bad++ // each (region, block) at most once
		if first == nil {
			reg := p.Rank.Regions[region]
			first = fmt.Errorf("layer %d %s, logical block %d: %w", reg.Layer, reg.Part, block, err)
		}
	}
	if v != Full {
		// Sparse, without a call per piece (see Fill).
		data := p.Buf.Bytes()
		if data == nil {
			return 0, nil
		}
		if p.sparseWordChunks(tagChunk, false, reqKey, blocks, logicalStart, tokens, nil, func(words []tagWord) bool { return checkWords(data, words) }) {
			return 0, nil
		}
		// Something is wrong: find which blocks, and describe the first.
		var rows [3][]piece
		p.eachBlock(reqKey, blocks, logicalStart, tokens, func(i, logical int, bk uint64, off int64) bool {
			for _, row := range p.sparseRows(reqKey, logical, &rows) {
				if pc, m := checkRowEnds(data[off:], row, bk, reqKey, logical); m != nil {
					onBad(i, logical, fmt.Errorf("piece at +%d (head %d) holds another block's data: %w", pc.off, pc.head, m))
					break
				}
			}
			return true
		})
		return bad, first
	}
	p.walk(reqKey, blocks, logicalStart, tokens, func(b []byte, key uint64) bool {
		return blocktag.Check(b, key) == nil
	}, func(region, block int, err error) {
		bad++ // walk reports each (region, block) at most once
		if first == nil {
			reg := p.Rank.Regions[region]
			first = fmt.Errorf("layer %d %s, logical block %d: %w", reg.Layer, reg.Part, block, err)
		}
	})
	return bad, first
}

// Poison overwrites the tag words of blocks so a late reader of freed
// blocks sees garbage, not stale-but-valid data.
func (p *Pool) Poison(blocks []int) {
	if p.Buf.Mem == nixl.VRAM {
		var spans []nixl.Span
		for i := range p.Rank.Regions {
			for _, b := range blocks {
				spans = append(spans, nixl.Span{Off: int(p.BlockAddr(i, b) - p.Buf.Addr), Len: int(p.BlockLen(i))})
			}
		}
		_ = blocktag.FillSpans(p.Buf, spans, func(int) uint64 { return 0xdeadbeef })
		return
	}
	data := p.Buf.Bytes()
	if data == nil {
		return
	}
	// Each piece's first word: every check (sparse and full) starts
	// there, so a read of the freed block after this fails on every piece
	// it copied, at half the cache lines of poisoning every tag word. With
	// token-major layouts, the pieces of the first and last token only:
	// every check covers both (sparseRows; full checks every piece), and
	// a read of any heads of a block moves those heads' pieces of both, so
	// a read of the freed block still fails, at 1/8 of the cache lines.
	poison := [][]piece{p.pieces}
	if n := len(p.rows); n > 0 {
		poison = [][]piece{p.rows[0], p.rows[n-1]}
	}
	for i := range p.Rank.Regions {
		for _, b := range blocks {
			off := int64(p.BlockAddr(i, b) - p.Buf.Addr)
			for _, row := range poison {
				for k := range row {
					if pc := &row[k]; pc.len >= 8 {
						binary.LittleEndian.PutUint64(data[off+pc.off:], 0xdeadbeefdeadbeef)
					}
				}
			}
		}
	}
}

// pieceSpans lists the pieces walk would visit, with their tag keys and
// owning (region, logical block).
func (p *Pool) pieceSpans(reqKey uint64, blocks []int, logicalStart, tokens int) (spans []nixl.Span, keys []uint64, owners [][2]int) {
	for i, reg := range p.Rank.Regions {
		keep := p.Spec.BlocksFor(reg.Kind, tokens)
		total := logicalStart + len(blocks)
		for j, b := range blocks {
			logical := logicalStart + j
			if logical < total-keep {
				continue
			}
			bk := blockKey(reqKey, reg, logical)
			off := int64(p.BlockAddr(i, b) - p.Buf.Addr)
			for _, pc := range p.pieces {
				spans = append(spans, nixl.Span{Off: int(off + pc.off), Len: int(pc.len)})
				keys = append(keys, pieceKey(bk, pc))
				owners = append(owners, [2]int{i, logical})
			}
		}
	}
	return spans, keys, owners
}

// walk visits every piece of every block the request keeps in every region.
func (p *Pool) walk(reqKey uint64, blocks []int, logicalStart, tokens int, visit func(b []byte, key uint64) bool, onBad ...func(region, block int, err error)) {
	data := p.Buf.Bytes()
	if data == nil {
		return
	}
	p.eachBlock(reqKey, blocks, logicalStart, tokens, func(i, logical int, bk uint64, off int64) bool {
		for k := range p.pieces {
			pc := &p.pieces[k]
			if !visit(data[off+pc.off:off+pc.off+pc.len], blocktag.Key(bk^pc.salt)) && len(onBad) > 0 {
				onBad[0](i, logical, fmt.Errorf("piece at +%d (head %d) holds another block's data", pc.off, pc.head))
				break
			}
		}
		return true
	})
}
