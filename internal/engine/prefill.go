package engine

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"sync"
	"time"

	"github.com/vmihailenco/msgpack/v5"

	"github.com/nixlctl/nixlctl/internal/kv"
	"github.com/nixlctl/nixlctl/internal/lease"
	"github.com/nixlctl/nixlctl/internal/mono"
	"github.com/nixlctl/nixlctl/internal/nixl"
	"github.com/nixlctl/nixlctl/internal/pushmatch"
	"github.com/nixlctl/nixlctl/internal/sidechannel"
)

// preq is a finished request whose blocks prefill keeps for its consumers.
type preq struct {
	id, router string
	key        uint64
	tokens     int
	blocks     []int
	tFinish    int64
	bytes      int64 // what the blocks weigh on all ranks
	// pull: completion notifications per rank, and how many each expects.
	seen, want []int
	rankDone   []bool
}

// PushReg is the registration decode sends prefill in push mode
// ("PUSH_REG:" + msgpack map with vLLM's keys).
type PushReg struct {
	RequestID      string `msgpack:"request_id"`
	DecodeEngineID string `msgpack:"decode_engine_id"`
	DecodeHost     string `msgpack:"decode_host"`
	DecodePort     int    `msgpack:"decode_port"`
	DecodeTPSize   int    `msgpack:"decode_tp_size"`
	LocalBlockIDs  any    `msgpack:"local_block_ids"` // [[ids...]] per KV group, or a flat list
	RemoteEngineID string `msgpack:"remote_engine_id"`
	RemoteHost     string `msgpack:"remote_host"`
	RemotePort     int    `msgpack:"remote_port"`
	RemoteTPSize   int    `msgpack:"remote_tp_size"`
	RemotePPSize   int    `msgpack:"remote_pp_size"`
}

// PushRegPrefix opens a push registration notification (vLLM's
// PUSH_REG_NOTIF_PREFIX).
const PushRegPrefix = "PUSH_REG:"

// EncodePushReg builds the notification decode sends every prefill rank:
// the prefix, then the registration as msgspec encodes the dict (a map of
// the 11 keys in vLLM's order, local_block_ids one list per KV-cache group).
func EncodePushReg(r PushReg) ([]byte, error) {
	var b bytes.Buffer
	b.WriteString(PushRegPrefix)
	e := msgpack.NewEncoder(&b)
	e.UseCompactInts(true) // msgspec writes every int in its smallest form
	if err := e.Encode(&r); err != nil {
		return nil, err
	}
	return b.Bytes(), nil
}

// DecodePushReg parses a PUSH_REG payload and normalises the block ids
// (one KV group as a list of lists, or a flat list).
func DecodePushReg(b []byte) (PushReg, []int, error) {
	var r PushReg
	if err := sidechannel.CheckMsgpack(b); err != nil {
		return r, nil, fmt.Errorf("PUSH_REG: not msgpack: %w", err)
	}
	if err := msgpack.Unmarshal(b, &r); err != nil {
		return r, nil, fmt.Errorf("PUSH_REG: %w", err)
	}
	if r.RequestID == "" || r.DecodeEngineID == "" || r.DecodeTPSize <= 0 || r.DecodeTPSize > 1024 || r.DecodePort <= 0 || r.DecodePort > 65535 {
		return r, nil, fmt.Errorf("PUSH_REG: incomplete registration (request %q, engine %q, tp %d, port %d)", r.RequestID, r.DecodeEngineID, r.DecodeTPSize, r.DecodePort)
	}
	ids, err := flattenBlockIDs(r.LocalBlockIDs)
	if err != nil {
		return r, nil, fmt.Errorf("PUSH_REG local_block_ids: %w", err)
	}
	return r, ids, nil
}

func flattenBlockIDs(v any) ([]int, error) {
	list, ok := v.([]any)
	if !ok {
		return nil, fmt.Errorf("want a list, got %T", v)
	}
	if len(list) > 0 {
		if inner, ok := list[0].([]any); ok {
			if len(list) != 1 {
				return nil, fmt.Errorf("%d KV groups; this endpoint has one", len(list))
			}
			list = inner
		}
	}
	out := make([]int, 0, len(list))
	for _, x := range list {
		n, ok := sidechannel.AsInt(x)
		if !ok || n < 0 {
			return nil, fmt.Errorf("block id %v is not a non-negative integer", x)
		}
		out = append(out, n)
	}
	return out, nil
}

type prefillState struct {
	e  *Engine
	mu sync.Mutex
	// leases holds every finished request until its consumers are done
	// or its lease expires; heartbeats wait in hbPending for the next
	// step, as vLLM reads notifications once per engine step.
	leases       *lease.Table
	hbPending    [][]string
	expiredHeld  int
	expiredHeldM int
	// reqs by prefill id; byBase by the id without its suffix, so that
	// with fixed push heartbeat keys a heartbeat with decode's id finds
	// its lease.
	reqs   map[string]*preq
	byBase map[string]*preq
	// push (nil otherwise): the matcher, and per rank the handshakes
	// done for its owner to post, the owner's WRITEs in flight and the
	// channel that wakes the owner.
	push       *pushmatch.Matcher[PushReg]
	handshaken [][]pushHandshake
	writes     []map[string][]nixl.XferReq // owner-only: no lock
	wake       []chan struct{}
}

func newPrefillState(e *Engine) *prefillState {
	s := &prefillState{e: e, reqs: map[string]*preq{}, byBase: map[string]*preq{}, leases: lease.NewTable(e.cfg.LeaseConfig())}
	for range e.ranks {
		s.wake = append(s.wake, make(chan struct{}, 1))
	}
	if e.cfg.Protocol == ProtoPush {
		s.push = pushmatch.NewMatcher[PushReg](len(e.ranks), int64(e.cfg.Lease))
		s.handshaken = make([][]pushHandshake, len(e.ranks))
		for range e.ranks {
			s.writes = append(s.writes, map[string][]nixl.XferReq{})
		}
	}
	return s
}

func (s *prefillState) wakeRank(r int) {
	select {
	case s.wake[r] <- struct{}{}:
	default:
	}
}

// allocWait bounds how long a prefill request waits for blocks that
// releases still pending will free (decode's READs done but not yet
// reported; leases running out): a closed loop starts its next request
// when decode is ready, which can be before prefill hears of it, and with
// a pool sized for the load that race failed requests "out of KV blocks"
// on busy hosts (issue 29 reports 92 of 2000 in one pull run; here the
// interleaved reference's test lost the last 4 of its 36 requests).
const allocWait = 5 * time.Second

// Prefill allocates the request's blocks, "computes" them (writes their
// tags, and waits out the modelled compute time), arms the lease and
// returns what decode needs.
func (s *prefillState) Prefill(ctx context.Context, r PrefillRequest) (PrefillReply, error) {
	e := s.e
	if r.Tokens <= 0 || r.Tokens > kv.MaxTokens {
		return PrefillReply{}, fmt.Errorf("tokens must be between 1 and %d", kv.MaxTokens)
	}
	e.c.requests.Add(1)
	t0 := mono.Now()
	n := e.spec.BlocksFor(kv.FullAttention, r.Tokens)
	blocks, waited, err := e.alloc.AllocWait(ctx, n, allocWait)
	if waited {
		e.c.allocWaits.Add(1)
	}
	if err != nil {
		return PrefillReply{}, err
	}
	var wg sync.WaitGroup
	for _, rk := range e.ranks {
		wg.Add(1)
		go func() {
			defer wg.Done()
			e.onHarness(func() { _ = rk.pool.FillFor(ctx, r.Key, blocks, 0, r.Tokens, e.cfg.Verify, r.CheckTP == e.spec.TP) })
		}()
	}
	wg.Wait()
	if err := ctx.Err(); err != nil {
		// The router gave up on this request (the run stopped): the fill
		// stopped there, nobody will read these blocks, so they go back
		// now, not at a lease's end.
		_ = e.alloc.Free(blocks)
		return PrefillReply{}, err
	}
	if e.cfg.PrefillPerToken > 0 {
		want := time.Duration(r.Tokens) * time.Duration(e.cfg.PrefillPerToken)
		if left := want - mono.Since(t0); left > 0 {
			select {
			case <-time.After(left):
			case <-ctx.Done():
				_ = e.alloc.Free(blocks)
				return PrefillReply{}, ctx.Err()
			}
		}
	}
	q := &preq{id: r.ID + "-" + randHex(4), router: r.ID, key: r.Key, tokens: r.Tokens, blocks: blocks, tFinish: mono.Now()}
	for _, rk := range e.ranks {
		for i := range rk.pool.Rank.Regions {
			q.bytes += rk.pool.BlockLen(i) * int64(len(blocks))
		}
	}
	q.seen, q.want, q.rankDone = make([]int, len(e.ranks)), make([]int, len(e.ranks)), make([]bool, len(e.ranks))
	var matched []int
	s.mu.Lock()
	s.reqs[q.id] = q
	s.byBase[pushmatch.BaseRequestID(q.id)] = q
	s.leases.Grant(q.id, q.bytes, e.now())
	if s.push != nil {
		matched = s.push.Finished(q.id)
	}
	s.mu.Unlock()
	for _, r := range matched {
		s.wakeRank(r) // the registration came first: its owner can start
	}
	host, port := e.advertised(e.side.Endpoint())
	return PrefillReply{RequestID: q.id, Blocks: n, TStart: t0, TFinish: q.tFinish, Params: TransferParams{
		DoRemotePrefill: true, RemoteBlockIDs: blocks, RemoteEngineID: e.cfg.EngineID, RemoteRequestID: q.id,
		RemoteHost: host, RemotePort: port, TPSize: e.spec.TP, PPSize: e.spec.PP, RemoteNumTokens: r.Tokens, TransferMode: string(e.cfg.Protocol)}}, nil
}

// onConsumed counts a pull-mode completion notification "<id>:<n>": the
// rank frees when n consumers reported, the request when all ranks did.
func (s *prefillState) onConsumed(rk *rank, from, id string, n int) {
	s.mu.Lock()
	q := s.reqs[id]
	if q == nil {
		s.mu.Unlock()
		s.e.c.unknown.Add(1)
		s.e.log.Warn("potentially invalid KV blocks for unrecognized request; they may have expired", "request", id, "from", from)
		return
	}
	if q.rankDone[rk.idx] {
		s.mu.Unlock()
		s.e.c.duplicate.Add(1)
		return
	}
	q.seen[rk.idx]++
	q.want[rk.idx] = n
	if q.seen[rk.idx] >= n {
		q.rankDone[rk.idx] = true
	}
	all := true
	for _, d := range q.rankDone {
		all = all && d
	}
	s.mu.Unlock()
	if all {
		s.free(q, "consumed", nil)
	}
}

// onHeartbeat queues a heartbeat for the next step, which extends the
// leases it names (LeaseTable.Renew: never shorter, unknown ids ignored).
func (s *prefillState) onHeartbeat(ids []string) {
	s.e.c.heartbeats.Add(1)
	s.mu.Lock()
	s.hbPending = append(s.hbPending, ids)
	s.mu.Unlock()
}

// HeartbeatEvent is prefill applying one heartbeat (lease-chaos timelines).
type HeartbeatEvent struct {
	T       int64 `json:"t"`
	IDs     int   `json:"ids"`
	Renewed int   `json:"renewed"`
	// Unknown: ids prefill holds no lease for (vLLM ignores them; in
	// upstream push mode that is every id, vLLM #53095).
	Unknown int `json:"unknown,omitempty"`
}

// LeaseSample is prefill's lease table at one step (lease-chaos).
type LeaseSample struct {
	T           int64 `json:"t"`
	Held        int   `json:"held"`
	HeldBytes   int64 `json:"held_bytes"`
	ExpiredHeld int   `json:"expired_held"`
}

// renewIDs maps heartbeat ids to the leases' ids. Upstream looks them up
// exactly (an id it does not hold is ignored, counted as an unknown
// renewal): in push mode decode heartbeats the router's id and prefill
// leases its own suffixed one, so nothing renews (vLLM #53095). With
// fixed push keys an id prefill does not hold is matched by base id, as
// PUSH_REG is.
func (s *prefillState) renewIDs(ids []string) []string {
	if s.e.cfg.Protocol != ProtoPush || s.e.cfg.PushHeartbeatKeys != HBKeysFixed {
		return ids
	}
	out := make([]string, 0, len(ids))
	for _, id := range ids {
		if _, ok := s.reqs[id]; !ok {
			if q := s.byBase[pushmatch.BaseRequestID(id)]; q != nil {
				id = q.id
			}
		}
		out = append(out, id)
	}
	return out
}

func (s *prefillState) stats(st *Stats) {
	s.mu.Lock()
	defer s.mu.Unlock()
	ls := s.leases.Stats()
	st.Leases = &ls
	st.LeasesHeld = s.leases.Len()
	st.ExpiredUnreleased, st.ExpiredUnreleasedMax = s.expiredHeld, s.expiredHeldM
}

// free releases a request's blocks once (poisoning them when no reader
// confirmed, so a late reader is caught) and reports why.
// reaped is the lease the reaper already took out of the table (nil:
// release it here).
func (s *prefillState) free(q *preq, reason FreedReason, reaped *lease.Lease) {
	s.mu.Lock()
	if s.reqs[q.id] != q {
		s.mu.Unlock()
		return
	}
	delete(s.reqs, q.id)
	ev := FreedEvent{ID: q.id, RouterID: q.router, Reason: reason, Blocks: len(q.blocks), TFinish: q.tFinish, TFreed: mono.Now(), HeldBytes: q.bytes}
	l := reaped
	if l == nil {
		l, _ = s.leases.Release(q.id)
	}
	if l != nil {
		ev.TLastRenew, ev.Renewals, ev.TDeadline = l.LastRenew, l.Renewals, l.Deadline
	}
	if s.byBase[pushmatch.BaseRequestID(q.id)] == q {
		delete(s.byBase, pushmatch.BaseRequestID(q.id))
	}
	for _, n := range q.seen {
		ev.Consumers += n
	}
	if s.push != nil {
		if pq := s.push.Forget(q.id); pq != nil {
			for _, st := range pq.Ranks {
				ev.TRegReceived = max(ev.TRegReceived, st.TReg)
				if ev.TPostStart == 0 || (st.Post.TStart != 0 && st.Post.TStart < ev.TPostStart) {
					ev.TPostStart = st.Post.TStart
				}
				ev.TPostEnd = max(ev.TPostEnd, st.Post.TEnd)
				ev.TWriteDone = max(ev.TWriteDone, st.TDone)
				ev.Descriptors += st.Post.Descs
				ev.LogicalDescs += st.Post.Logical
				ev.Bytes += st.Post.Bytes
				ev.Failed = ev.Failed || st.Failed
			}
		}
	}
	s.mu.Unlock()
	if reason == FreedExpired || reason == FreedFailed {
		// Only a free no reader confirmed can have a late reader. After
		// every consumer said it had read them (or every WRITE from them
		// finished) nobody reads these blocks again, and poisoning them
		// costs a cache line per piece: on a host whose copy is bound by
		// memory, with the checks, a quarter of the handoff's bandwidth.
		for _, rk := range s.e.ranks {
			rk.pool.Poison(q.blocks)
		}
	}
	if err := s.e.alloc.Free(q.blocks); err != nil {
		s.e.log.Error("freeing blocks", "request", q.id, "err", err)
	}
	if reason == "expired" {
		s.e.c.expired.Add(1)
		s.e.log.Warn("releasing expired KV blocks", "request", q.id, "retrieved_by", ev.Consumers)
	}
	s.e.emit("freed", ev)
}

// abortUnread frees request id's blocks if no consumer reported reading
// any of them (see prefillRole.Abort).
func (s *prefillState) abortUnread(id string) bool {
	s.mu.Lock()
	q := s.reqs[id]
	read := false
	if q != nil {
		for _, n := range q.seen {
			read = read || n > 0
		}
	}
	s.mu.Unlock()
	if q == nil || read {
		return false
	}
	s.e.c.aborted.Add(1)
	s.e.log.Info("aborting unread KV blocks", "request", id, "blocks", len(q.blocks))
	s.free(q, FreedFailed, nil)
	return true
}

// reaper is the lease half of prefill's engine step: apply the heartbeats
// that arrived since the last step, then free the requests whose lease
// expired (the whole table, or head-only as vLLM did before PR #50789).
func (s *prefillState) reaper() {
	defer s.e.wg.Done()
	t := time.NewTicker(s.e.cfg.Step)
	defer t.Stop()
	for {
		select {
		case <-s.e.ctx.Done():
			return
		case <-t.C:
		}
		s.step(s.e.now())
	}
}

func (s *prefillState) step(now int64) {
	events := s.e.cfg.LeaseEvents
	type expiry struct {
		q *preq
		l *lease.Lease
	}
	var hbs []HeartbeatEvent
	var expired []expiry
	s.mu.Lock()
	for _, ids := range s.hbPending {
		unknown := s.leases.Stats().UnknownRenewals
		n := s.leases.Renew(s.renewIDs(ids), now)
		if events {
			hbs = append(hbs, HeartbeatEvent{T: now, IDs: len(ids), Renewed: n, Unknown: int(s.leases.Stats().UnknownRenewals - unknown)})
		}
	}
	s.hbPending = s.hbPending[:0]
	for _, l := range s.leases.Reap(now) {
		if q := s.reqs[l.ID]; q != nil {
			expired = append(expired, expiry{q, l})
		}
	}
	// What the reaper left behind past its deadline (the head-only leak);
	// the ones reaped above are counted as held until they are freed.
	n, _ := s.leases.ExpiredHeld(now)
	s.expiredHeld = n
	s.expiredHeldM = max(s.expiredHeldM, n)
	var sample LeaseSample
	if events {
		sample = LeaseSample{T: now, Held: s.leases.Len() + len(expired), HeldBytes: s.leases.HeldBytes(), ExpiredHeld: n}
		for _, x := range expired {
			sample.HeldBytes += x.q.bytes
		}
	}
	s.mu.Unlock()
	for _, h := range hbs {
		s.e.emit("heartbeat", h)
	}
	for _, x := range expired {
		s.free(x.q, "expired", x.l)
	}
	if events {
		s.e.emit("leases", sample)
	}
}

// --- push ------------------------------------------------------------
//
// Each rank has one owner goroutine (its notification loop) that drives
// the push: it takes matches from the matcher, starts their handshakes
// off the goroutine, posts the WRITEs when a handshake comes back, and
// polls them. Only the owner posts and polls a rank's WRITEs.

// pushHandshake is a handshake's result, handed back to the rank's owner.
type pushHandshake struct {
	job     pushmatch.Job[PushReg]
	plan    kv.TransferPlan
	targets []int // decode ranks this prefill rank writes to
	re      *remoteEngine
	err     error
}

// onPushReg takes a decode registration, in either order with the
// request's finished blocks.
func (s *prefillState) onPushReg(rk *rank, from string, payload []byte) {
	reg, blocks, err := DecodePushReg(payload)
	if err != nil {
		s.e.badNotif(err.Error(), from, string(payload))
		return
	}
	if s.push == nil {
		s.e.badNotif("PUSH_REG received by an engine not in push mode", from, reg.RequestID)
		return
	}
	s.mu.Lock()
	s.push.Register(rk.idx, reg.RequestID, reg, blocks, s.e.now())
	s.mu.Unlock()
	// The owner (this goroutine) takes a match right after its notifications.
}

// pushPending says whether rank r's owner must poll: WRITEs in flight.
func (s *prefillState) pushPending(r int) bool {
	if s.push == nil {
		return false
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.push.Writing(r)
}

// pushStep is the owner's work for one rank: start the matches, post the
// WRITEs of the handshakes that came back, and collect finished WRITEs.
func (s *prefillState) pushStep(rk *rank) {
	if s.push == nil {
		return
	}
	s.mu.Lock()
	jobs := s.push.Take(rk.idx, s.e.now())
	done := s.handshaken[rk.idx]
	s.handshaken[rk.idx] = nil
	s.mu.Unlock()
	for _, j := range jobs {
		s.startHandshake(rk, j)
	}
	for _, h := range done {
		s.postWrites(rk, h)
	}
	s.pollWrites(rk)
}

// startHandshake plans which decode ranks this rank writes to and, unless
// an earlier request did, shakes hands with the decode engine off the
// owner goroutine (it may take a round trip); the result goes back to the
// owner, which posts.
func (s *prefillState) startHandshake(rk *rank, j pushmatch.Job[PushReg]) {
	e := s.e
	reg := j.Reg
	dspec := e.spec
	dspec.TP = reg.DecodeTPSize
	plan, err := kv.Plan(e.spec, dspec)
	if err != nil {
		s.failPush(rk, j.ID, fmt.Errorf("decode tp %d: %w", reg.DecodeTPSize, err))
		return
	}
	h := pushHandshake{job: j, plan: plan}
	var pairs []lpair
	for d, dr := range plan.Decode {
		for _, rd := range dr.Reads {
			if rd.PrefillRank == rk.tp {
				h.targets = append(h.targets, d)
				pairs = append(pairs, lpair{rk.idx, rkey{rk.pp, d}}) // the decode rank of this stage
			}
		}
	}
	endpoint := "tcp://" + net.JoinHostPort(reg.DecodeHost, strconv.Itoa(reg.DecodePort))
	if h.re = e.shakenRanks(reg.DecodeEngineID, endpoint, pairs); h.re != nil {
		s.postWrites(rk, h) // the usual case: hands were shaken for an earlier request
		return
	}
	e.wg.Add(1) // the owner is counted, so the group is not at zero here
	go func() {
		defer e.wg.Done()
		_, h.re, h.err = e.handshakeRanks(e.ctx, reg.DecodeEngineID, endpoint, stageRanks(rk.pp, h.targets), pairs)
		s.mu.Lock()
		s.handshaken[rk.idx] = append(s.handshaken[rk.idx], h)
		s.mu.Unlock()
		s.wakeRank(rk.idx)
	}()
}

// postWrites posts one rank's WRITEs for a request into the decode ranks
// it serves, on the owner goroutine.
func (s *prefillState) postWrites(rk *rank, h pushHandshake) {
	e := s.e
	id, reg := h.job.ID, h.job.Reg
	if h.err != nil {
		s.failPush(rk, id, h.err)
		return
	}
	s.mu.Lock()
	q := s.reqs[id]
	ok, pin := s.push.Handshaken(id, rk.idx)
	if ok && pin {
		// Blocks under a WRITE cannot be freed until it ends (they are
		// still being read): the reaper passes them by meanwhile.
		s.leases.Pin(id, true)
	}
	s.mu.Unlock()
	if !ok || q == nil {
		return // freed while the handshake ran
	}
	// Decode may hold a prefix already: send only the tail it allocated.
	dblocks := h.job.Blocks
	src := q.blocks
	if len(dblocks) < len(src) {
		src = src[len(src)-len(dblocks):]
	}
	if len(dblocks) > len(src) {
		s.failPush(rk, id, fmt.Errorf("decode registered %d blocks for a %d-block request", len(dblocks), len(src)))
		return
	}
	start := len(q.blocks) - len(src)
	notif := completionNotif(reg.RequestID, e.spec.TP)
	chunks := make([][]kv.Chunk, len(h.targets))
	pps := make([]*preppedPair, len(h.targets))
	var prepErr error
	for i, d := range h.targets {
		for _, rd := range h.plan.Decode[d].Reads {
			if rd.PrefillRank == rk.tp {
				chunks[i] = rd.Chunks
			}
		}
		// Prepared once per decode agent (vLLM: at handshake), outside
		// the post time.
		if prepErr == nil && len(src) > 0 {
			rm := h.re.stageMeta(rkey{rk.pp, d})
			pps[i], prepErr = e.prepped(rk, h.re.stageAgent(rk.idx, rkey{rk.pp, d}), rm, remoteMem(rm, rk.buf.Mem), chunks[i], true)
		}
	}
	post := pushmatch.Post{TStart: mono.Now()}
	var writes []nixl.XferReq
	for i, d := range h.targets {
		if prepErr != nil {
			e.log.Warn("push failed", "request", id, "rank", rk.idx, "err", prepErr)
			post.Failed = true
			break
		}
		rm := h.re.stageMeta(rkey{rk.pp, d})
		x, ml, err := e.makeMove(rk, nixl.Write, pps[i], h.re.stageAgent(rk.idx, rkey{rk.pp, d}), rm, remoteMem(rm, rk.buf.Mem), moveOpts{Chunks: chunks[i],
			LocalBlocks: src, RemoteBlocks: dblocks, LogicalStart: start, Tokens: q.tokens, LocalIsPrefill: true, Merge: e.cfg.Merge}, notif)
		if le := (layoutError{}); errors.As(err, &le) {
			e.log.Warn("push failed", "request", id, "rank", rk.idx, "err", err)
			post.Failed = true
			break
		}
		if err == nil {
			var st nixl.Status
			if st, err = rk.agent.PostXferReq(x); st == nixl.Failed && err == nil {
				err = fmt.Errorf("post failed")
			}
			if err != nil {
				_ = rk.agent.ReleaseXferReq(x)
			}
		}
		if err != nil {
			// vLLM drops a failed WRITE on the floor: decode is not told
			// and finds out from its watchdog; the lease frees our blocks.
			e.c.failedXfers.Add(1)
			e.log.Warn("push WRITE failed", "request", id, "decode_rank", d, "err", err)
			post.Failed = true
			continue
		}
		writes = append(writes, x)
		post.Descs += ml.descs
		post.Logical += ml.logical
		post.Bytes += ml.bytes
	}
	post.Writes, post.TEnd = len(writes), mono.Now()
	if len(writes) > 0 {
		s.writes[rk.idx][id] = writes
	}
	s.mu.Lock()
	end := s.pushEndLocked(id, s.push.Posted(id, rk.idx, post, mono.Now()))
	s.mu.Unlock()
	s.ended(q, end)
}

// pollWrites collects a rank's finished WRITEs (owner goroutine); when
// every rank's writes for a request are done the blocks go back to the pool.
func (s *prefillState) pollWrites(rk *rank) {
	for id, writes := range s.writes[rk.idx] {
		var done, failed int
		for _, x := range writes {
			st, err := rk.agent.XferStatus(x)
			switch st {
			case nixl.Done:
				done++
			case nixl.Failed:
				failed++
				s.e.c.failedXfers.Add(1)
				s.e.log.Warn("push WRITE failed", "request", id, "err", err)
			}
		}
		if done+failed < len(writes) {
			continue
		}
		for _, x := range writes {
			_ = rk.agent.ReleaseXferReq(x)
		}
		delete(s.writes[rk.idx], id)
		s.mu.Lock()
		q := s.reqs[id]
		end := s.pushEndLocked(id, s.push.WritesDone(id, rk.idx, failed > 0, mono.Now()))
		s.mu.Unlock()
		s.ended(q, end)
	}
}

// pushEndLocked unpins the lease when no rank writes any more, under the
// same lock as the transition that said so (another rank may pin next).
func (s *prefillState) pushEndLocked(id string, end pushmatch.End) pushmatch.End {
	if end.Unpin {
		s.leases.Pin(id, false)
	}
	return end
}

// ended frees a request whose every rank pushed. With a failed WRITE the
// blocks wait for the lease, as in vLLM.
func (s *prefillState) ended(q *preq, end pushmatch.End) {
	if q != nil && end.Free {
		s.free(q, "pushed", nil)
	}
}

func (s *prefillState) failPush(rk *rank, id string, err error) {
	s.e.log.Warn("push failed", "request", id, "rank", rk.idx, "err", err)
	s.mu.Lock()
	q := s.reqs[id]
	end := s.pushEndLocked(id, s.push.Fail(id, rk.idx))
	s.mu.Unlock()
	s.ended(q, end)
}
