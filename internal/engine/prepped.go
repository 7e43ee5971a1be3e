package engine

import (
	"encoding/binary"
	"fmt"
	"hash/maphash"
	"sync"
	"sync/atomic"

	"github.com/nixlctl/nixlctl/internal/kv"
	"github.com/nixlctl/nixlctl/internal/nixl"
	"github.com/nixlctl/nixlctl/internal/sidechannel"
)

// vLLM's NixlConnector prepares its descriptor lists once (prep_xfer_dlist:
// one local list per handle key, one per remote agent at handshake time)
// and posts each request with make_prepped_xfer by descriptor index, so
// its nixl_post_time is index bookkeeping plus the post. Building and
// preparing lists per request puts a cost vLLM does not pay on every
// request's critical path; the cache here is how nixlctl pays it once.

// maxPrepped bounds one prepared list. A peer that does not say how many
// blocks it has (an SGLang decode without dst_num_slots) or a model with
// very many descriptors per block would make lists too large to keep;
// those requests build their own descriptors instead.
const maxPrepped = 1 << 22

// rankKey names a local rank in the cache. A plain TP index today; with
// pipeline parallelism it becomes the (pp, tp) pair, and nothing else here
// changes.
type rankKey = int

// layoutKey tells prepared lists apart that share a rank and remote agent:
// the TP plan's chunk layout (vLLM keys its split local handles by
// (tp_ratio, remote block size) for the same reason) and the memory they
// cover, hashed so the per-request lookup stays cheap.
type layoutKey struct {
	mem  nixl.MemType
	hash uint64
}

type localPrepKey struct {
	rank   rankKey
	layout layoutKey
}

type remotePrepKey struct {
	rank   rankKey
	agent  string
	layout layoutKey
}

// preppedList is one prepared list, made by the first request that needs
// it while later ones wait on once.
type preppedList struct {
	once  sync.Once
	agent nixl.Agent
	dl    nixl.Dlist
	descs []nixl.Desc
	// blocks per region and chunks per block: descriptor index =
	// (region*blocks + block)*chunks + chunk, vLLM's region-major order
	// with the TP plan's chunks innermost.
	blocks, chunks int
	// cont[region*chunks + c] says whether chunk c starts where the one
	// before it ends (chunk 0: the previous block's last chunk), so the
	// per-request loop counts merged runs without reading descriptors.
	cont []bool
	err  error
}

// setCont fills cont from the list's first two blocks of each region.
func (l *preppedList) setCont(regions int) {
	l.cont = make([]bool, regions*l.chunks)
	for i := 0; i < regions; i++ {
		first := i * l.blocks * l.chunks
		for c := 0; c < l.chunks; c++ {
			at := first + c
			if c == 0 {
				at += l.chunks // block 1's chunk 0, after block 0's last
			}
			if at < (i+1)*l.blocks*l.chunks {
				l.cont[i*l.chunks+c] = contiguous(l.descs, at)
			}
		}
	}
}

// preppedPair is what a request needs to be made by index.
type preppedPair struct {
	local, remote *preppedList
}

// preppedCache holds an engine's prepared lists until the engine closes or
// the remote agent goes away.
type preppedCache struct {
	seed   maphash.Seed
	mu     sync.Mutex
	local  map[localPrepKey]*preppedList
	remote map[remotePrepKey]*preppedList
	// made counts lists prepared: tests check it grows per remote agent,
	// not per request.
	made atomic.Int64
}

func newPreppedCache() *preppedCache {
	return &preppedCache{seed: maphash.MakeSeed(), local: map[localPrepKey]*preppedList{}, remote: map[remotePrepKey]*preppedList{}}
}

// sides returns the chunk offsets on the local and remote side.
func chunkSides(c kv.Chunk, localIsPrefill bool) (lo, ro int64) {
	if localIsPrefill {
		return c.SrcOffset, c.DstOffset
	}
	return c.DstOffset, c.SrcOffset
}

// pair returns the prepared lists for moving chunks between local rank rk
// and a remote agent with metadata rm, preparing them the first time. It
// returns nil (and no error) when the lists would be too large to keep.
func (c *preppedCache) pair(rk *rank, agent string, rm sidechannel.AgentMetadata, rmem nixl.MemType, chunks []kv.Chunk, localIsPrefill bool) (*preppedPair, error) {
	lp := rk.pool
	regions := lp.Rank.Regions
	if len(rm.KVCachesBaseAddr) != len(regions) || len(rm.BlockLens) != len(regions) {
		return nil, fmt.Errorf("peer has %d regions, this rank %d: layouts differ", len(rm.KVCachesBaseAddr), len(regions))
	}
	n := len(regions) * len(chunks)
	if n == 0 || rm.NumBlocks <= 0 || lp.NumBlocks*n > maxPrepped || rm.NumBlocks > maxPrepped/n {
		return nil, nil
	}
	var lh, rh maphash.Hash
	lh.SetSeed(c.seed)
	rh.SetSeed(c.seed)
	var b [8]byte
	put := func(h *maphash.Hash, v uint64) {
		binary.LittleEndian.PutUint64(b[:], v)
		_, _ = h.Write(b[:])
	}
	for _, ch := range chunks {
		lo, ro := chunkSides(ch, localIsPrefill)
		put(&lh, uint64(lo))
		put(&lh, uint64(ch.Length))
		put(&rh, uint64(ro))
		put(&rh, uint64(ch.Length))
	}
	put(&rh, uint64(rm.NumBlocks))
	for i := range rm.KVCachesBaseAddr {
		put(&rh, rm.KVCachesBaseAddr[i])
		put(&rh, uint64(rm.BlockLens[i]))
	}
	lk := localPrepKey{rank: rk.idx, layout: layoutKey{mem: rk.buf.Mem, hash: lh.Sum64()}}
	rkey := remotePrepKey{rank: rk.idx, agent: agent, layout: layoutKey{mem: rmem, hash: rh.Sum64()}}
	c.mu.Lock()
	l := c.local[lk]
	if l == nil {
		l = &preppedList{agent: rk.agent}
		c.local[lk] = l
	}
	r := c.remote[rkey]
	if r == nil {
		r = &preppedList{agent: rk.agent}
		c.remote[rkey] = r
	}
	c.mu.Unlock()
	l.once.Do(func() {
		l.blocks, l.chunks = lp.NumBlocks, len(chunks)
		l.descs = make([]nixl.Desc, 0, lp.NumBlocks*n)
		for i, reg := range regions {
			for blk := 0; blk < lp.NumBlocks; blk++ {
				base := lp.BlockAddr(i, blk)
				for _, ch := range chunks {
					lo, _ := chunkSides(ch, localIsPrefill)
					if lo+ch.Length > reg.BlockBytes {
						l.err = fmt.Errorf("chunk %+v does not fit local blocks of %d bytes", ch, reg.BlockBytes)
						return
					}
					l.descs = append(l.descs, nixl.Desc{Addr: base + uint64(lo), Len: uint64(ch.Length)})
				}
			}
		}
		l.setCont(len(regions))
		l.dl, l.err = rk.agent.PrepXferDlist("", rk.buf.Mem, l.descs)
		c.made.Add(1)
	})
	r.once.Do(func() {
		r.blocks, r.chunks = rm.NumBlocks, len(chunks)
		r.descs = make([]nixl.Desc, 0, rm.NumBlocks*n)
		for i := range regions {
			rlen := uint64(rm.BlockLens[i])
			for blk := 0; blk < rm.NumBlocks; blk++ {
				base := rm.KVCachesBaseAddr[i] + uint64(blk)*rlen
				for _, ch := range chunks {
					_, ro := chunkSides(ch, localIsPrefill)
					if uint64(ro)+uint64(ch.Length) > rlen {
						r.err = fmt.Errorf("chunk %+v does not fit the peer's blocks of %d bytes", ch, rlen)
						return
					}
					r.descs = append(r.descs, nixl.Desc{Addr: base + uint64(ro), Len: uint64(ch.Length)})
				}
			}
		}
		r.setCont(len(regions))
		r.dl, r.err = rk.agent.PrepXferDlist(agent, rmem, r.descs)
		c.made.Add(1)
	})
	if l.err != nil {
		return nil, l.err
	}
	if r.err != nil {
		// Forget the failure: a reloaded peer may be prepared next time.
		c.mu.Lock()
		if c.remote[rkey] == r {
			delete(c.remote, rkey)
		}
		c.mu.Unlock()
		return nil, r.err
	}
	return &preppedPair{local: l, remote: r}, nil
}

// prepped returns rk's prepared lists for a remote agent (nil: build per
// request). --no-merge keeps the per-request path, since made-by-index
// requests merge contiguous runs whatever the caller asks.
func (e *Engine) prepped(rk *rank, agent string, rm sidechannel.AgentMetadata, rmem nixl.MemType, chunks []kv.Chunk, localIsPrefill bool) (*preppedPair, error) {
	if !e.cfg.Merge {
		return nil, nil
	}
	return e.prep.pair(rk, agent, rm, rmem, chunks, localIsPrefill)
}

// dropAgents releases the remote lists prepared for the given agents of
// local rank rk (a peer engine replaced at a new endpoint).
func (c *preppedCache) dropAgents(rk rankKey, agents map[string]bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for k, l := range c.remote {
		if k.rank == rk && agents[k.agent] {
			l.release()
			delete(c.remote, k)
		}
	}
}

// dropPrepped releases the remote lists prepared for a peer engine's
// agents.
func (e *Engine) dropPrepped(re *remoteEngine) {
	re.mu.Lock()
	byRank := map[rankKey]map[string]bool{}
	for pr, name := range re.loaded {
		if byRank[pr.local] == nil {
			byRank[pr.local] = map[string]bool{}
		}
		byRank[pr.local][name] = true
	}
	re.mu.Unlock()
	for rk, names := range byRank {
		e.prep.dropAgents(rk, names)
	}
}

// close releases every list; the agents are still open.
func (c *preppedCache) close() {
	c.mu.Lock()
	defer c.mu.Unlock()
	for k, l := range c.local {
		l.release()
		delete(c.local, k)
	}
	for k, l := range c.remote {
		l.release()
		delete(c.remote, k)
	}
}

func (l *preppedList) release() {
	// A list still being prepared is the preparer's to finish; Do waits.
	l.once.Do(func() {})
	if l.dl != nil {
		_ = l.agent.ReleaseDlist(l.dl)
		l.dl = nil
	}
}

// layoutError is a request whose blocks do not fit the two sides' layouts,
// found before anything was made: push gives up on the request at once,
// while a request the agent failed to make only loses that WRITE.
type layoutError struct{ error }

func (e layoutError) Unwrap() error { return e.error }

// moveStats is what one request's move posted.
type moveStats struct {
	descs, logical int // after merging contiguous runs, and before
	bytes          int64
}

// moveScratch is one request's index lists (MakeXferReq copies them) and
// run counts, recycled: they are thousands of entries per request.
type moveScratch struct{ li, ri, starts []int }

var scratchPool = sync.Pool{New: func() any { return new(moveScratch) }}

// makeMove makes the request that moves o's blocks between rk and the
// remote agent: by index into pp's prepared lists, or, with pp nil, from
// descriptors built for this request alone (lists too large to keep, or
// --no-merge, whose point is that nothing merges).
func (e *Engine) makeMove(rk *rank, op nixl.Op, pp *preppedPair, agent string, rm sidechannel.AgentMetadata, rmem nixl.MemType, o moveOpts, notif []byte) (nixl.XferReq, moveStats, error) {
	if pp == nil || len(o.LocalBlocks) == 0 {
		// An empty request (a notification riding on no bytes) is made
		// the plain way: not every backend makes one from no indices.
		ml, err := buildMoves(rk.pool, rm, o)
		if err != nil {
			return nil, moveStats{}, layoutError{err}
		}
		x, err := rk.agent.CreateXferReq(op, rk.buf.Mem, ml.local, rmem, ml.remote, agent, notif)
		return x, moveStats{descs: len(ml.local), logical: ml.logical, bytes: ml.bytes}, err
	}
	var st moveStats
	lp := rk.pool
	if len(o.LocalBlocks) != len(o.RemoteBlocks) {
		return nil, st, layoutError{fmt.Errorf("%d local blocks for %d remote blocks", len(o.LocalBlocks), len(o.RemoteBlocks))}
	}
	L, R := pp.local, pp.remote
	sc := scratchPool.Get().(*moveScratch)
	defer scratchPool.Put(sc)
	// starts[j] counts the pairs up to j that do not continue the pair
	// before them in both block tables: with whole blocks contiguous in
	// their regions, a region's runs come out of it without a loop.
	n := len(o.LocalBlocks)
	starts := sc.starts[:0]
	acc := 0
	for j, lb := range o.LocalBlocks {
		rb := o.RemoteBlocks[j]
		if uint(rb) >= uint(R.blocks) {
			return nil, st, layoutError{fmt.Errorf("remote block %d outside the peer's %d blocks", rb, R.blocks)}
		}
		if uint(lb) >= uint(L.blocks) {
			return nil, st, layoutError{fmt.Errorf("local block %d outside this rank's %d blocks", lb, L.blocks)}
		}
		if j == 0 || lb != o.LocalBlocks[j-1]+1 || rb != o.RemoteBlocks[j-1]+1 {
			acc++
		}
		starts = append(starts, acc)
	}
	sc.starts = starts
	nc := L.chunks
	need := len(lp.Rank.Regions) * n * nc
	li, ri := sc.li[:0], sc.ri[:0]
	if cap(li) < need {
		li, ri = make([]int, 0, need), make([]int, 0, need)
	}
	var perBlock int64
	for _, ch := range o.Chunks {
		perBlock += ch.Length
	}
	total := o.LogicalStart + n
	for i, reg := range lp.Rank.Regions {
		j0 := max(0, total-lp.Spec.BlocksFor(reg.Kind, o.Tokens)-o.LogicalStart)
		if j0 >= n {
			continue
		}
		lcc, rcc := L.cont[i*nc:(i+1)*nc], R.cont[i*nc:(i+1)*nc]
		st.bytes += perBlock * int64(n-j0)
		// The region's first index may continue the last one posted
		// (the previous region's), if memory runs on across them.
		l, r := (i*L.blocks+o.LocalBlocks[j0])*nc, (i*R.blocks+o.RemoteBlocks[j0])*nc
		if k := len(li); k > 0 && l == li[k-1]+1 && r == ri[k-1]+1 && contiguous(L.descs, l) && contiguous(R.descs, r) {
			st.descs--
		}
		if nc == 1 {
			// One whole block per index: NIXL's runs are the block
			// tables' runs where blocks follow one another in memory.
			if lcc[0] && rcc[0] {
				st.descs += starts[n-1] - starts[j0] + 1
			} else {
				st.descs += n - j0
			}
			lbase, rbase := i*L.blocks, i*R.blocks
			for j := j0; j < n; j++ {
				li, ri = append(li, lbase+o.LocalBlocks[j]), append(ri, rbase+o.RemoteBlocks[j])
			}
			continue
		}
		// Several chunks per block (a TP head slice): chunk c continues
		// chunk c-1 where the layout says so, chunk 0 the previous block's
		// last where the block tables and the layout both do.
		for j := j0; j < n; j++ {
			lb, rb := o.LocalBlocks[j], o.RemoteBlocks[j]
			l0, r0 := (i*L.blocks+lb)*nc, (i*R.blocks+rb)*nc
			for c := 0; c < nc; c++ {
				var run bool
				switch {
				case c > 0:
					run = lcc[c] && rcc[c]
				case j > j0:
					run = starts[j] == starts[j-1] && lcc[0] && rcc[0]
				}
				if !run {
					st.descs++
				}
				li, ri = append(li, l0+c), append(ri, r0+c)
			}
		}
	}
	sc.li, sc.ri = li, ri
	st.logical = len(li)
	x, err := rk.agent.MakeXferReq(op, L.dl, li, R.dl, ri, notif)
	return x, st, err
}

// contiguous says whether descriptor i starts where descriptor i-1 ends.
func contiguous(d []nixl.Desc, i int) bool {
	return i > 0 && d[i-1].Addr+d[i-1].Len == d[i].Addr
}
