package engine

import (
	"context"
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
	// push: per rank, the registration that matched and the writes posted.
	push []*pushRank
}

type pushRank struct {
	reg        *PushReg
	tReg       int64
	waiting    bool // handshake with the decode engine in progress
	writes     []pushWrite
	posted     int
	done       int
	failed     bool
	tPostStart int64
	tPostEnd   int64
	tDone      int64
	descs      int
	logical    int
	bytes      int64
}

type pushWrite struct {
	agent nixl.Agent
	req   nixl.XferReq
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

// DecodePushReg parses a PUSH_REG payload and normalises the block ids
// (one KV group as a list of lists, or a flat list).
func DecodePushReg(b []byte) (PushReg, []int, error) {
	var r PushReg
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
		n, ok := asInt(x)
		if !ok || n < 0 {
			return nil, fmt.Errorf("block id %v is not a non-negative integer", x)
		}
		out = append(out, n)
	}
	return out, nil
}

func asInt(v any) (int, bool) {
	switch x := v.(type) {
	case int8:
		return int(x), true
	case int16:
		return int(x), true
	case int32:
		return int(x), true
	case int64:
		return int(x), x == int64(int(x))
	case uint8:
		return int(x), true
	case uint16:
		return int(x), true
	case uint32:
		return int(x), true
	case uint64:
		return int(x), x < 1<<31
	}
	return 0, false
}

type pendingReg struct {
	reg    PushReg
	blocks []int
	t      int64
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
	// reqs by prefill id; byRouter maps the base id to prefill ids so a
	// registration finds its request whatever suffix decode gave it.
	reqs      map[string]*preq
	byBase    map[string]*preq
	regs      []map[string]pendingReg // per rank: registrations not matched yet, by base id
	wake      []chan struct{}
	unmatched []int // per rank: staged requests without a matched registration
}

func newPrefillState(e *Engine) *prefillState {
	s := &prefillState{e: e, reqs: map[string]*preq{}, byBase: map[string]*preq{}, leases: lease.NewTable(e.cfg.LeaseConfig())}
	for range e.ranks {
		s.regs = append(s.regs, map[string]pendingReg{})
		s.wake = append(s.wake, make(chan struct{}, 1))
		s.unmatched = append(s.unmatched, 0)
	}
	return s
}

func (s *prefillState) wakeRank(r int) {
	select {
	case s.wake[r] <- struct{}{}:
	default:
	}
}

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
	blocks, err := e.alloc.Alloc(n)
	if err != nil {
		return PrefillReply{}, err
	}
	var wg sync.WaitGroup
	for _, rk := range e.ranks {
		wg.Add(1)
		go func() { defer wg.Done(); rk.pool.Fill(r.Key, blocks, 0, r.Tokens, e.cfg.Verify) }()
	}
	wg.Wait()
	if e.cfg.PrefillPerToken > 0 {
		want := time.Duration(r.Tokens) * e.cfg.PrefillPerToken
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
	if e.cfg.Protocol == ProtoPush {
		q.push = make([]*pushRank, len(e.ranks))
		for i := range q.push {
			q.push[i] = &pushRank{}
		}
	}
	s.mu.Lock()
	s.reqs[q.id] = q
	s.byBase[BaseRequestID(q.id)] = q
	s.leases.Grant(q.id, q.bytes, q.tFinish)
	if q.push != nil {
		for i := range e.ranks {
			s.unmatched[i]++
		}
	}
	s.mu.Unlock()
	if q.push != nil {
		for i := range e.ranks {
			s.wakeRank(i)
		}
	}
	host, port, _ := splitEndpoint(e.side.Endpoint())
	return PrefillReply{RequestID: q.id, Blocks: n, TStart: t0, TFinish: q.tFinish, Params: TransferParams{
		DoRemotePrefill: true, RemoteBlockIDs: blocks, RemoteEngineID: e.cfg.EngineID, RemoteRequestID: q.id,
		RemoteHost: host, RemotePort: port, TPSize: e.spec.TP, PPSize: 1, RemoteNumTokens: r.Tokens, TransferMode: e.cfg.Protocol}}, nil
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
}

// LeaseSample is prefill's lease table at one step (lease-chaos).
type LeaseSample struct {
	T           int64 `json:"t"`
	Held        int   `json:"held"`
	HeldBytes   int64 `json:"held_bytes"`
	ExpiredHeld int   `json:"expired_held"`
}

// renewIDs maps heartbeat ids to the leases' ids: prefill's own id, or in
// push mode the id decode knows (the router's, without prefill's suffix).
func (s *prefillState) renewIDs(ids []string) []string {
	out := make([]string, 0, len(ids))
	for _, id := range ids {
		if _, ok := s.reqs[id]; !ok {
			if q := s.byBase[BaseRequestID(id)]; q != nil {
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

// free releases a request's blocks once (poisoning them, so a late reader
// is caught) and reports why.
// reaped is the lease the reaper already took out of the table (nil:
// release it here).
func (s *prefillState) free(q *preq, reason string, reaped *lease.Lease) {
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
	if s.byBase[BaseRequestID(q.id)] == q {
		delete(s.byBase, BaseRequestID(q.id))
	}
	for _, n := range q.seen {
		ev.Consumers += n
	}
	if q.push != nil {
		for i, pr := range q.push {
			if pr.reg == nil && !pr.failed {
				s.unmatched[i]--
			}
			ev.TRegReceived = max(ev.TRegReceived, pr.tReg)
			if ev.TPostStart == 0 || (pr.tPostStart != 0 && pr.tPostStart < ev.TPostStart) {
				ev.TPostStart = pr.tPostStart
			}
			ev.TPostEnd = max(ev.TPostEnd, pr.tPostEnd)
			ev.TWriteDone = max(ev.TWriteDone, pr.tDone)
			ev.Descriptors += pr.descs
			ev.LogicalDescs += pr.logical
			ev.Bytes += pr.bytes
			ev.Failed = ev.Failed || pr.failed
		}
	}
	s.mu.Unlock()
	for _, rk := range s.e.ranks {
		rk.pool.Poison(q.blocks)
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
		s.step(mono.Now())
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
		n := s.leases.Renew(s.renewIDs(ids), now)
		if events {
			hbs = append(hbs, HeartbeatEvent{T: now, IDs: len(ids), Renewed: n})
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

// onPushReg takes a decode registration, in either order with the
// request's finished blocks.
func (s *prefillState) onPushReg(rk *rank, from string, payload []byte) {
	reg, blocks, err := DecodePushReg(payload)
	if err != nil {
		s.e.badNotif(err.Error(), from, string(payload))
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	key := BaseRequestID(reg.RequestID)
	if q := s.match(reg.RequestID); q != nil && q.push[rk.idx].reg != nil {
		return // the same registration from another decode rank: one is enough
	}
	if _, dup := s.regs[rk.idx][key]; dup {
		return
	}
	s.regs[rk.idx][key] = pendingReg{reg: reg, blocks: blocks, t: mono.Now()}
}

// match finds the prefill request a decode request id belongs to: the
// exact id first, then the id without its random suffix.
func (s *prefillState) match(decodeID string) *preq {
	if q := s.reqs[decodeID]; q != nil {
		return q
	}
	return s.byBase[BaseRequestID(decodeID)]
}

func (s *prefillState) pushPending(r int) bool {
	if s.e.cfg.Protocol != ProtoPush {
		return false
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.unmatched[r] > 0 {
		return true
	}
	for _, q := range s.reqs {
		if pr := q.push[r]; pr.posted > pr.done {
			return true
		}
	}
	return false
}

// pushStep is the writer's work for one rank: match registrations with
// finished requests, post the WRITEs of matched ones, and collect finished
// WRITEs. It runs on the rank's notification goroutine, which owns the
// rank's notifications and WRITE submission.
func (s *prefillState) pushStep(rk *rank) {
	if s.e.cfg.Protocol != ProtoPush {
		return
	}
	type job struct {
		q   *preq
		reg pendingReg
	}
	var jobs []job
	var polls []*preq
	s.mu.Lock()
	for key, pr := range s.regs[rk.idx] {
		q := s.match(pr.reg.RequestID)
		if q == nil {
			if mono.Since(pr.t) > s.e.cfg.Lease {
				delete(s.regs[rk.idx], key) // its request is long gone
			}
			continue
		}
		delete(s.regs[rk.idx], key)
		p := q.push[rk.idx]
		p.reg, p.tReg = &pr.reg, pr.t
		s.unmatched[rk.idx]--
		jobs = append(jobs, job{q, pr})
	}
	for _, q := range s.reqs {
		if p := q.push[rk.idx]; p.posted > p.done {
			polls = append(polls, q)
		}
	}
	s.mu.Unlock()
	for _, j := range jobs {
		s.startWrites(rk, j.q, j.reg)
	}
	for _, q := range polls {
		s.pollWrites(rk, q)
	}
}

// startWrites posts one rank's WRITEs for a matched request into the
// decode ranks this prefill rank serves; the handshake with the decode
// engine runs off this goroutine.
func (s *prefillState) startWrites(rk *rank, q *preq, pr pendingReg) {
	e := s.e
	reg := pr.reg
	dspec := e.spec
	dspec.TP = reg.DecodeTPSize
	plan, err := kv.Plan(e.spec, dspec)
	if err != nil {
		s.failPush(rk, q, fmt.Errorf("decode tp %d: %w", reg.DecodeTPSize, err))
		return
	}
	var targets []int // decode ranks this rank writes to
	var pairs [][2]int
	for d, dr := range plan.Decode {
		for _, rd := range dr.Reads {
			if rd.PrefillRank == rk.idx {
				targets = append(targets, d)
				pairs = append(pairs, [2]int{rk.idx, d})
			}
		}
	}
	endpoint := "tcp://" + net.JoinHostPort(reg.DecodeHost, strconv.Itoa(reg.DecodePort))
	s.mu.Lock()
	p := q.push[rk.idx]
	if p.waiting {
		s.mu.Unlock()
		return
	}
	p.waiting = true
	s.mu.Unlock()
	// The handshake may take a round trip; don't hold the writer.
	go func() {
		_, re, err := e.handshake(e.ctx, reg.DecodeEngineID, endpoint, targets, pairs)
		s.mu.Lock()
		p.waiting = false
		s.mu.Unlock()
		if err != nil {
			s.failPush(rk, q, err)
			return
		}
		s.postWrites(rk, q, reg, plan, targets, re, pr.blocks)
	}()
}

func (s *prefillState) postWrites(rk *rank, q *preq, reg PushReg, plan kv.TransferPlan, targets []int, re *remoteEngine, dblocks []int) {
	e := s.e
	// Decode may hold a prefix already: send only the tail it allocated.
	src := q.blocks
	if len(dblocks) < len(src) {
		src = src[len(src)-len(dblocks):]
	}
	if len(dblocks) > len(src) {
		s.failPush(rk, q, fmt.Errorf("decode registered %d blocks for a %d-block request", len(dblocks), len(src)))
		return
	}
	start := len(q.blocks) - len(src)
	notif := []byte(fmt.Sprintf("%s:%d", reg.RequestID, e.spec.TP))
	s.mu.Lock()
	p := q.push[rk.idx]
	s.mu.Unlock()
	t0 := mono.Now()
	var writes []pushWrite
	var descs, logical int
	var bytes int64
	for _, d := range targets {
		var chunks []kv.Chunk
		for _, rd := range plan.Decode[d].Reads {
			if rd.PrefillRank == rk.idx {
				chunks = rd.Chunks
			}
		}
		ml, err := buildMoves(rk.pool, re.meta(d), moveOpts{Chunks: chunks, LocalBlocks: src, RemoteBlocks: dblocks,
			LogicalStart: start, Tokens: q.tokens, LocalIsPrefill: true, Merge: e.cfg.Merge})
		if err != nil {
			s.failPush(rk, q, err)
			return
		}
		mem := rk.buf.Mem
		x, err := rk.agent.CreateXferReq(nixl.Write, mem, ml.local, remoteMem(re.meta(d), mem), ml.remote, re.agentName(rk.idx, d), notif)
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
			e.log.Warn("push WRITE failed", "request", q.id, "decode_rank", d, "err", err)
			s.mu.Lock()
			p.failed = true
			s.mu.Unlock()
			continue
		}
		writes = append(writes, pushWrite{agent: rk.agent, req: x})
		descs += len(ml.local)
		logical += ml.logical
		bytes += ml.bytes
	}
	s.mu.Lock()
	p.writes = append(p.writes, writes...)
	p.posted += len(writes)
	if len(writes) > 0 {
		// Blocks under a WRITE cannot be freed until it ends (they are
		// still being read): the reaper passes them by meanwhile.
		s.leases.Pin(q.id, true)
	}
	p.tPostStart, p.tPostEnd = t0, mono.Now()
	p.descs, p.logical, p.bytes = descs, logical, bytes
	s.mu.Unlock()
	s.wakeRank(rk.idx)
}

// pollWrites collects a rank's finished WRITEs; when every rank's writes
// for a request are done the blocks go back to the pool.
func (s *prefillState) pollWrites(rk *rank, q *preq) {
	s.mu.Lock()
	p := q.push[rk.idx]
	writes := append([]pushWrite(nil), p.writes...)
	s.mu.Unlock()
	var done, failed int
	for _, w := range writes {
		st, err := w.agent.XferStatus(w.req)
		switch st {
		case nixl.Done:
			done++
		case nixl.Failed:
			failed++
			s.e.c.failedXfers.Add(1)
			s.e.log.Warn("push WRITE failed", "request", q.id, "err", err)
		}
	}
	if done+failed < len(writes) {
		return
	}
	for _, w := range writes {
		_ = w.agent.ReleaseXferReq(w.req)
	}
	s.mu.Lock()
	p.writes = nil
	p.done = p.posted
	p.tDone = mono.Now()
	p.failed = p.failed || failed > 0
	all := true
	anyFailed := false
	inFlight := false
	for _, pr := range q.push {
		all = all && pr.reg != nil && pr.posted > 0 && pr.done == pr.posted
		anyFailed = anyFailed || pr.failed
		inFlight = inFlight || pr.posted > pr.done
	}
	if !inFlight {
		s.leases.Pin(q.id, false)
	}
	s.mu.Unlock()
	if all && !anyFailed {
		s.free(q, "pushed", nil)
	}
	// With a failed WRITE the blocks wait for the lease, as in vLLM.
}

func (s *prefillState) failPush(rk *rank, q *preq, err error) {
	s.e.log.Warn("push failed", "request", q.id, "rank", rk.idx, "err", err)
	s.mu.Lock()
	q.push[rk.idx].failed = true
	s.mu.Unlock()
}
