package engine

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"sync"
	"syscall"
	"time"

	"github.com/nixlctl/nixlctl/internal/kv"
	"github.com/nixlctl/nixlctl/internal/lease"
	"github.com/nixlctl/nixlctl/internal/mono"
	"github.com/nixlctl/nixlctl/internal/nixl"
	"github.com/nixlctl/nixlctl/internal/pushmatch"
)

type decodeState struct {
	e  *Engine
	mu sync.Mutex
	// push: the completions each request waits for and its watchdog, and
	// per request the channel closed when they are in or it fired.
	waits    *pushmatch.Waits
	waitDone map[string]chan struct{}

	// tracker heartbeats the prefill engines of every request from its
	// arrival to its KV (pull and push; nil for SGLang); hb is the state
	// of the handshakes heartbeats need, by prefill engine.
	tracker *lease.HeartbeatTracker
	hb      map[string]*hbPeer
	// The scheduler: with slots > 0, requests past the running ones wait
	// in queue, first come first served.
	slots   int
	running int
	queue   []*waiter
}

type hbPeer struct {
	ready, busy bool
	failedAt    int64
}

type waiter struct {
	router string
	ready  chan struct{} // closed when the request gets a slot
	abort  chan struct{} // closed when the router aborts it
	done   bool          // got a slot or was aborted (under mu)
}

func newDecodeState(e *Engine) *decodeState {
	s := &decodeState{e: e, waits: pushmatch.NewWaits(), waitDone: map[string]chan struct{}{}, hb: map[string]*hbPeer{}, slots: e.cfg.DecodeSlots}
	if e.cfg.Protocol != ProtoSGLang {
		s.tracker = lease.NewHeartbeatTracker(e.cfg.LeaseConfig().HeartbeatInterval())
	}
	return s
}

// errAborted: the router aborted a request while it waited for a slot.
var errAborted = errors.New("aborted while queued")

// Load receives one request's KV with the engine's protocol and reports
// the stages. Failures come back in LoadReply.Error with the timings so far.
func (s *decodeState) Load(ctx context.Context, r LoadRequest) (LoadReply, error) {
	e := s.e
	e.c.requests.Add(1)
	rep := LoadReply{RequestID: r.ID + "-" + randHex(4), TArrive: mono.Now()}
	// Heartbeats start on arrival, not when the request is scheduled:
	// the wait in the queue is what they are for.
	s.track(rep.RequestID, r.Params)
	err := s.acquire(ctx, r.ID)
	scheduled := err == nil
	if scheduled {
		if s.slots > 0 {
			rep.TScheduled = mono.Now()
		}
		switch e.cfg.Protocol {
		case ProtoPull:
			err = s.pull(ctx, r, &rep)
		case ProtoPush:
			err = s.push(ctx, r, &rep)
		case ProtoSGLang:
			err = e.sgl.load(ctx, r, &rep)
		}
	}
	s.untrack(rep.RequestID) // the KV is in, failed, or the request was aborted
	if scheduled {
		s.releaseAfter(e.cfg.DecodeHold)
	}
	if err != nil {
		rep.Error = err.Error()
	}
	return rep, nil
}

// track heartbeats a request's prefill engine from now on, keyed by
// remote_request_id as upstream does: prefill's own id in pull mode, the
// router's in push mode (which prefill never finds: vLLM #53095). With
// fixed push keys decode heartbeats its own id instead, as its PUSH_REG
// names it, and prefill matches it by base id.
func (s *decodeState) track(local string, p TransferParams) {
	if s.tracker == nil || p.RemoteEngineID == "" || p.RemoteRequestID == "" {
		return
	}
	key := p.RemoteRequestID
	if s.e.cfg.Protocol == ProtoPush && s.e.cfg.PushHeartbeatKeys == HBKeysFixed {
		key = local
	}
	s.mu.Lock()
	s.tracker.Track(local, lease.HeartbeatTarget{EngineID: p.RemoteEngineID, Endpoint: p.SideEndpoint(), TPSize: p.TPSize, PPSize: p.PPSize}, key)
	s.mu.Unlock()
}

func (s *decodeState) untrack(local string) {
	if s.tracker == nil {
		return
	}
	s.mu.Lock()
	s.tracker.Stop(local)
	s.mu.Unlock()
}

// acquire waits for a decode slot (none needed without slots).
func (s *decodeState) acquire(ctx context.Context, router string) error {
	if s.slots <= 0 {
		return nil
	}
	s.mu.Lock()
	if s.running < s.slots && len(s.queue) == 0 {
		s.running++
		s.mu.Unlock()
		s.queued(router)
		return nil
	}
	w := &waiter{router: router, ready: make(chan struct{}), abort: make(chan struct{})}
	s.queue = append(s.queue, w)
	s.mu.Unlock()
	s.queued(router)
	select {
	case <-w.ready:
		return nil
	case <-w.abort:
		return errAborted
	case <-ctx.Done():
		s.mu.Lock()
		defer s.mu.Unlock()
		if w.done { // got the slot meanwhile: give it back
			select {
			case <-w.ready:
				s.handOffLocked()
			default:
			}
			return ctx.Err()
		}
		w.done = true
		s.removeLocked(w)
		return ctx.Err()
	}
}

// queued tells lease-chaos that a request took its place in the queue
// (or a slot), so the next one can be sent without overtaking it.
func (s *decodeState) queued(router string) {
	if s.e != nil && s.e.cfg.LeaseEvents {
		s.e.emit("queued", DecodeEvent{RouterID: router, T: mono.Now()})
	}
}

func (s *decodeState) removeLocked(w *waiter) {
	for i, x := range s.queue {
		if x == w {
			s.queue = append(s.queue[:i], s.queue[i+1:]...)
			return
		}
	}
}

// handOffLocked passes a freed slot to the first waiter, or frees it.
func (s *decodeState) handOffLocked() {
	for len(s.queue) > 0 {
		w := s.queue[0]
		s.queue = s.queue[1:]
		if w.done {
			continue
		}
		w.done = true
		close(w.ready)
		return
	}
	s.running--
}

// releaseAfter gives the slot back once the request has decoded for hold.
func (s *decodeState) releaseAfter(hold time.Duration) {
	if s.slots <= 0 {
		return
	}
	release := func() {
		s.mu.Lock()
		s.handOffLocked()
		s.mu.Unlock()
	}
	if hold <= 0 {
		release()
		return
	}
	time.AfterFunc(hold, release)
}

// Abort takes a request out of decode's queue (vLLM: the request finishes
// as aborted, and its heartbeats stop). A request that already has a slot
// is not aborted.
func (s *decodeState) Abort(router string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, w := range s.queue {
		if w.router == router && !w.done {
			w.done = true
			s.removeLocked(w)
			close(w.abort)
			s.e.c.aborted.Add(1)
			return true
		}
	}
	return false
}

// crashPoint SIGKILLs this process when the request is lease-chaos's
// CrashAt: its transfer was just posted (READs in flight, or the push
// registration on its way), so the crash lands inside the transfer every
// time, not only when a signal from outside happens to. The event goes
// out first (a pipe write is done before the process dies).
func (s *decodeState) crashPoint(router string) {
	if s.e.cfg.CrashAt == "" || s.e.cfg.CrashAt != router {
		return
	}
	s.e.emit("crashing", DecodeEvent{RouterID: router, T: mono.Now()})
	if err := syscall.Kill(os.Getpid(), syscall.SIGKILL); err != nil {
		s.e.log.Error("lease-chaos crash point: cannot kill this process", "err", err)
		return
	}
	select {} // the process is being killed; SIGKILL cannot be caught
}

func (s *decodeState) stats(st *Stats) {
	s.mu.Lock()
	defer s.mu.Unlock()
	st.Queued = len(s.queue)
}

// stepLoop is decode's engine step: send the heartbeats that are due,
// and (push) fire the registration watchdogs past their deadline.
func (s *decodeState) stepLoop(heartbeats bool) {
	e := s.e
	defer e.wg.Done()
	t := time.NewTicker(e.cfg.Step)
	defer t.Stop()
	for {
		select {
		case <-e.ctx.Done():
			return
		case <-t.C:
		}
		if heartbeats {
			s.heartbeatStep(e.now())
		}
		if e.cfg.Protocol == ProtoPush {
			s.watchdog(e.now())
		}
	}
}

// heartbeatStep sends the batches that are due to every rank of their
// prefill engine. An engine decode has not shaken hands with yet gets a
// handshake started in the background and its batch a step after it is
// done (vLLM's proactive handshake).
func (s *decodeState) heartbeatStep(now int64) {
	e := s.e
	s.mu.Lock()
	batches := s.tracker.Due(now)
	var send []lease.HeartbeatBatch
	retry := false
	for _, b := range batches {
		p := s.hb[b.Target.EngineID]
		if p == nil {
			p = &hbPeer{}
			s.hb[b.Target.EngineID] = p
		}
		switch {
		case p.ready:
			send = append(send, b)
		case p.busy:
			retry = true
		case p.failedAt != 0 && now-p.failedAt < int64(e.cfg.LeaseConfig().HeartbeatInterval()):
			// The engine did not answer lately: try again at the next interval.
		default:
			p.busy, retry = true, true
			go s.heartbeatHandshake(b.Target, p)
		}
	}
	if retry {
		s.tracker.Retry()
	}
	s.mu.Unlock()
	for _, b := range send {
		s.sendHeartbeat(b)
	}
}

func (s *decodeState) heartbeatHandshake(t lease.HeartbeatTarget, p *hbPeer) {
	e := s.e
	ranks, pairs := e.everyRemoteRank(t.PPSize, t.TPSize)
	_, _, err := e.handshakeRanks(e.ctx, t.EngineID, t.Endpoint, ranks, pairs)
	s.mu.Lock()
	defer s.mu.Unlock()
	p.busy = false
	if err != nil {
		p.failedAt = e.now()
		e.log.Debug("heartbeat handshake failed", "engine", t.EngineID, "err", err)
		return
	}
	p.ready, p.failedAt = true, 0
}

// sendHeartbeat sends one batch from every local rank to every (pp, tp)
// rank of the prefill engine (a rank that gets it twice just renews twice).
func (s *decodeState) sendHeartbeat(b lease.HeartbeatBatch) {
	e := s.e
	e.remotesMu.Lock()
	re := e.remotes[b.Target.EngineID]
	e.remotesMu.Unlock()
	if re == nil {
		s.mu.Lock()
		if p := s.hb[b.Target.EngineID]; p != nil {
			p.ready = false // forgotten after a failure: shake hands again
		}
		s.mu.Unlock()
		return
	}
	msg := b.Message()
	remotes, _ := e.everyRemoteRank(b.Target.PPSize, b.Target.TPSize)
	for _, rk := range e.ranks {
		for _, pr := range remotes {
			name := re.stageAgent(rk.idx, pr)
			if name == "" {
				continue
			}
			if err := rk.agent.SendNotif(name, msg); err != nil {
				e.c.failedNotifs.Add(1)
				e.log.Debug("heartbeat not sent", "engine", b.Target.EngineID, "err", err)
				continue
			}
			e.c.heartbeatsSent.Add(1)
		}
	}
}

// localShare allocates decode's blocks for the part of the request it
// does not hold yet: the remote block list is end-trimmed to it.
func (s *decodeState) localShare(r LoadRequest) (local []int, start, total int, err error) {
	bs := s.e.spec.BlockSize
	total = s.e.spec.BlocksFor(kv.FullAttention, r.Tokens)
	start = min(r.PrefixTokens/bs, total)
	local, err = s.e.alloc.Alloc(total - start)
	return local, start, total, err
}

// release frees decode's blocks without poisoning them: nobody reads
// decode's blocks but decode, and its next request's check of them uses
// that request's key, which stale tags of this one fail already.
func (s *decodeState) release(blocks []int) {
	if err := s.e.alloc.Free(blocks); err != nil {
		s.e.log.Error("freeing blocks", "err", err)
	}
}

func (s *decodeState) verify(r LoadRequest, local []int, start int, rep *LoadReply) {
	for _, rk := range s.e.ranks {
		var bad int
		var first error
		s.e.onHarness(func() { bad, first = rk.pool.Check(r.Key, local, start, r.Tokens, s.e.cfg.Verify) })
		rep.CorruptBlocks += bad
		if first != nil && rep.Corrupt == "" {
			rep.Corrupt = fmt.Sprintf("rank %s: %v", rk, first)
		}
	}
}

func (s *decodeState) plan(p TransferParams) (kv.TransferPlan, error) {
	if p.TPSize <= 0 {
		return kv.TransferPlan{}, fmt.Errorf("transfer params: tp_size %d", p.TPSize)
	}
	if pp := max(p.PPSize, 1); pp != s.e.spec.PP {
		// vLLM's pull reads each decode stage's layers from the prefill
		// stage that holds the same layers: with unequal pp no stage does.
		return kv.TransferPlan{}, fmt.Errorf("prefill has pp %d and this decode pp %d: both sides must have the same pipeline stages, as vLLM's NIXL connector reads stage k's layers from stage k", pp, s.e.spec.PP)
	}
	ps := s.e.spec
	ps.TP = p.TPSize
	return kv.Plan(ps, s.e.spec)
}

// pull is vLLM's default: decode READs prefill's blocks, attaching
// "<prefill request id>:<consumers>" so prefill can free them.
func (s *decodeState) pull(ctx context.Context, r LoadRequest, rep *LoadReply) error {
	e := s.e
	crashing := e.cfg.CrashAt != "" && e.cfg.CrashAt == r.ID // lease-chaos: this process dies after posting
	p := r.Params
	if p.RemoteRequestID == "" || p.RemoteEngineID == "" {
		return errors.New("transfer params lack the remote request or engine id")
	}
	plan, err := s.plan(p)
	if err != nil {
		return err
	}
	local, start, total, err := s.localShare(r)
	if err != nil {
		return err
	}
	defer s.release(local)
	if len(p.RemoteBlockIDs) != total {
		return fmt.Errorf("prefill sent %d block ids for a %d-block request", len(p.RemoteBlockIDs), total)
	}
	remote := p.RemoteBlockIDs[start:]
	rep.Blocks = len(local)
	sources, pairs := e.pullPeers(plan)
	took, re, err := e.handshakeRanks(ctx, p.RemoteEngineID, p.SideEndpoint(), sources, pairs)
	if err != nil {
		return err
	}
	rep.HandshakeMS, rep.FirstHandshake = float64(took)/1e6, took > 0
	results := make([]pullResult, len(e.ranks))
	leg := pullLeg{r: r, plan: plan, re: re, local: local, remote: remote, start: start, crashing: crashing}
	var wg sync.WaitGroup
	for _, rk := range e.ranks {
		wg.Go(func() { s.pullRank(ctx, rk, &leg, &results[rk.idx]) })
	}
	wg.Wait()
	rep.TReady = mono.Now()
	for _, res := range results {
		rep.TReady = max(rep.TReady, res.done) // seen no earlier than it happened
		if res.err != nil {
			return res.err
		}
		if rep.TPostStart == 0 || res.postStart < rep.TPostStart {
			rep.TPostStart = res.postStart
		}
		rep.TPostEnd = max(rep.TPostEnd, res.postEnd)
		rep.TXferDone = max(rep.TXferDone, res.done)
		rep.Descriptors += res.descs
		rep.LogicalDescriptors += res.logical
		rep.Bytes += res.bytes
	}
	s.verify(r, local, start, rep)
	return nil
}

// pullLeg is what every rank's share of a pull READ needs to know.
type pullLeg struct {
	r             LoadRequest
	plan          kv.TransferPlan
	re            *remoteEngine
	local, remote []int // the blocks, from the first one not a prefix hit
	start         int   // the logical block local[0] is
	crashing      bool  // lease-chaos: this process dies after posting
}

// pullResult is one rank's share of a pull: its posts' and completion's
// stamps and what it moved.
type pullResult struct {
	postStart, postEnd, done int64
	descs, logical           int
	bytes                    int64
	err                      error
}

// pullRank READs rank rk's share of the request from the prefill ranks
// the plan gives it (or only notifies those with nothing to read), and
// waits for the READs.
func (s *decodeState) pullRank(ctx context.Context, rk *rank, leg *pullLeg, res *pullResult) {
	e := s.e
	r, p, plan, re, local, remote, start, crashing := leg.r, leg.r.Params, leg.plan, leg.re, leg.local, leg.remote, leg.start, leg.crashing
	dr := plan.Decode[rk.tp]
	var reqs []nixl.XferReq
	defer func() {
		for _, x := range reqs {
			_ = rk.agent.ReleaseXferReq(x)
		}
	}()
	// The lists are prepared the first time this rank reads from
	// that agent (vLLM: at handshake), outside the post time.
	pps := make([]*preppedPair, len(dr.Reads))
	for i, rd := range dr.Reads {
		if len(local) == 0 {
			break
		}
		src := rkey{rk.pp, rd.PrefillRank}
		rm := re.stageMeta(src)
		if pps[i], res.err = e.prepped(rk, re.stageAgent(rk.idx, src), rm, remoteMem(rm, rk.buf.Mem), rd.Chunks, false); res.err != nil {
			return
		}
	}
	res.postStart = mono.Now()
	for i, rd := range dr.Reads {
		notif := completionNotif(p.RemoteRequestID, plan.Consumers[rd.PrefillRank])
		src := rkey{rk.pp, rd.PrefillRank} // the stage holding this rank's layers
		name := re.stageAgent(rk.idx, src)
		if len(local) == 0 { // full prefix hit: nothing to read, say so
			if err := rk.agent.SendNotif(name, notif); err != nil {
				e.c.failedNotifs.Add(1)
				res.err = err
			}
			continue
		}
		if crashing {
			// lease-chaos's crash lands inside this transfer: a
			// decode that dies mid-READ never reports the KV
			// consumed, but a notification travelling with a small
			// READ could finish (and be counted) before the
			// self-kill lands.
			notif = nil
		}
		rm := re.stageMeta(src)
		x, ml, err := e.makeMove(rk, nixl.Read, pps[i], name, rm, remoteMem(rm, rk.buf.Mem), moveOpts{Chunks: rd.Chunks, LocalBlocks: local,
			RemoteBlocks: remote, LogicalStart: start, Tokens: r.Tokens, Merge: e.cfg.Merge}, notif)
		if err != nil {
			res.err = err
			return
		}
		reqs = append(reqs, x)
		if st, err := rk.agent.PostXferReq(x); st == nixl.Failed {
			e.c.failedXfers.Add(1)
			res.err = fmt.Errorf("post READ: %w", err)
			return
		}
		res.descs += ml.descs
		res.logical += ml.logical
		res.bytes += ml.bytes
	}
	for _, o := range dr.NotifyOnly {
		if crashing {
			break
		}
		if err := rk.agent.SendNotif(re.stageAgent(rk.idx, rkey{rk.pp, o}), completionNotif(p.RemoteRequestID, plan.Consumers[o])); err != nil {
			e.c.failedNotifs.Add(1)
		}
	}
	res.postEnd = mono.Now()
	var telPostEnd int64 // the last post's end, on the telemetry's clock
	if rk.idx == 0 {
		s.crashPoint(r.ID)
	}
	for _, x := range reqs {
		if err := rk.waits.Wait(ctx, x, 0); err != nil {
			e.c.failedXfers.Add(1)
			res.err = err
			return
		}
		if t := rk.agent.Telemetry(x); t.Done() > 0 {
			res.done = max(res.done, t.Done())
			telPostEnd = max(telPostEnd, t.Start+int64(t.PostDuration))
		}
	}
	if res.done == 0 {
		res.done = mono.Now()
	} else if telPostEnd > 0 {
		// Both ends of the transfer stage from the agent's own
		// telemetry: a READ can land before this goroutine's
		// stamp after its posts (and NIXL's microsecond stamps
		// round down), which made the stage negative.
		res.postEnd = telPostEnd
	}
}

// push is the NixlPushConnector: decode registers its pre-allocated
// blocks with every prefill rank (PUSH_REG) and waits for the completion
// notifications of the WRITEs, or for its registration watchdog.
func (s *decodeState) push(ctx context.Context, r LoadRequest, rep *LoadReply) error {
	e := s.e
	p := r.Params
	plan, err := s.plan(p)
	if err != nil {
		return err
	}
	local, _, _, err := s.localShare(r)
	if err != nil {
		return err
	}
	rep.Blocks = len(local)
	// Notification-only handshake: every decode rank talks to every
	// prefill (pp, tp) rank.
	remotes, pairs := e.everyRemoteRank(p.PPSize, p.TPSize)
	took, re, err := e.handshakeRanks(ctx, p.RemoteEngineID, p.SideEndpoint(), remotes, pairs)
	if err != nil {
		s.release(local)
		return err
	}
	rep.HandshakeMS, rep.FirstHandshake = float64(took)/1e6, took > 0
	host, port := e.advertised(e.side.Endpoint())
	reg := PushReg{RequestID: rep.RequestID, DecodeEngineID: e.cfg.EngineID, DecodeHost: host, DecodePort: port,
		DecodeTPSize: e.spec.TP, LocalBlockIDs: [][]int{local}, RemoteEngineID: p.RemoteEngineID, RemoteHost: p.RemoteHost,
		RemotePort: p.RemotePort, RemoteTPSize: p.TPSize, RemotePPSize: max(p.PPSize, 1)}
	msg, err := EncodePushReg(reg)
	if err != nil {
		s.release(local)
		return err
	}
	want := make([]int, len(e.ranks))
	for _, rk := range e.ranks {
		// One WRITE (and notification) per prefill rank of this stage that serves this rank.
		want[rk.idx] = len(plan.Decode[rk.tp].Reads)
	}
	id, done := rep.RequestID, make(chan struct{})
	s.mu.Lock()
	s.waits.Add(id, want, e.now(), int64(e.cfg.RegTimeout))
	s.waitDone[id] = done
	s.mu.Unlock()
	rep.TRegSent = mono.Now()
	sent := 0
	for _, rk := range e.ranks {
		for _, pr := range remotes {
			if err := rk.agent.SendNotif(re.stageAgent(rk.idx, pr), msg); err != nil {
				e.c.failedNotifs.Add(1)
				e.log.Warn("PUSH_REG not sent", "request", id, "prefill_pp", pr.pp, "prefill_tp", pr.tp, "err", err)
				continue
			}
			sent++
		}
	}
	s.crashPoint(r.ID)
	var waitErr error
	if sent == 0 {
		waitErr = errors.New("no prefill rank took the registration")
	} else {
		select {
		case <-done:
		case <-ctx.Done():
			waitErr = ctx.Err()
		}
	}
	s.mu.Lock()
	if waitErr == nil && s.waits.Expired(id) {
		waitErr = fmt.Errorf("registration watchdog: no push completion within %v", e.cfg.RegTimeout)
	}
	rep.TXferDone = s.waits.Remove(id)
	delete(s.waitDone, id)
	s.mu.Unlock()
	rep.TReady = mono.Now()
	if waitErr == nil {
		s.verify(r, local, s.startOf(r), rep)
	}
	s.release(local)
	return waitErr
}

func (s *decodeState) startOf(r LoadRequest) int {
	return min(r.PrefixTokens/s.e.spec.BlockSize, s.e.spec.BlocksFor(kv.FullAttention, r.Tokens))
}

// onPushDone counts a WRITE's completion notification "<id>:<n>".
func (s *decodeState) onPushDone(rk *rank, from, id string, _ int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	// The completion's time is a stage time joined with prefill's: the
	// real clock, not the engine's.
	switch s.waits.Completion(id, rk.idx, mono.Now()) {
	case pushmatch.CompletionUnknown:
		s.e.c.unknown.Add(1)
		s.e.log.Warn("completion for an unknown request (late, or after the watchdog)", "request", id, "from", from)
	case pushmatch.CompletionDuplicate:
		s.e.c.duplicate.Add(1)
	case pushmatch.CompletionComplete:
		close(s.waitDone[id])
	}
}

// watchdog fires the registration watchdog of the push requests past
// their deadline (decode's engine step). Upstream (drop) only drops the
// registration and logs: the request keeps waiting for its WRITEs, until
// they come or the router gives up on it. fail ends it with an error.
func (s *decodeState) watchdog(now int64) {
	fail := s.e.cfg.RegWatchdog == WatchdogFail
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, id := range s.waits.Expire(now, fail) {
		s.e.c.regTimeouts.Add(1)
		if fail {
			close(s.waitDone[id])
			continue
		}
		s.e.log.Warn("push registration watchdog expired; dropping the registration (the request keeps waiting)",
			"request", id, "timeout", s.e.cfg.RegTimeout)
	}
}

// pullPeers lists the prefill ranks decode handshakes, in vLLM's order
// (itertools.product over the prefill stages and the target TP ranks), and
// which local rank talks to which: decode rank (pp, tp) to the ranks of
// stage pp its plan reads from or notifies.
func (e *Engine) pullPeers(plan kv.TransferPlan) ([]rkey, []lpair) {
	var targets []int
	for _, dr := range plan.Decode {
		for _, rd := range dr.Reads {
			if !slices.Contains(targets, rd.PrefillRank) {
				targets = append(targets, rd.PrefillRank)
			}
		}
		for _, o := range dr.NotifyOnly {
			if !slices.Contains(targets, o) {
				targets = append(targets, o)
			}
		}
	}
	var sources []rkey
	for pp := 0; pp < e.spec.PP; pp++ {
		for _, t := range targets {
			sources = append(sources, rkey{pp, t})
		}
	}
	var pairs []lpair
	for _, rk := range e.ranks {
		dr := plan.Decode[rk.tp]
		for _, rd := range dr.Reads {
			pairs = append(pairs, lpair{rk.idx, rkey{rk.pp, rd.PrefillRank}})
		}
		for _, o := range dr.NotifyOnly {
			pairs = append(pairs, lpair{rk.idx, rkey{rk.pp, o}})
		}
	}
	return sources, pairs
}

// everyRemoteRank is every (pp, tp) rank of a peer with those sizes, in
// vLLM's order, each paired with every local rank: heartbeats and push
// registrations go to all of them.
func (e *Engine) everyRemoteRank(pp, tp int) ([]rkey, []lpair) {
	var ranks []rkey
	var pairs []lpair
	for p := 0; p < max(pp, 1); p++ {
		for t := 0; t < max(tp, 1); t++ {
			ranks = append(ranks, rkey{p, t})
			for _, rk := range e.ranks {
				pairs = append(pairs, lpair{rk.idx, rkey{p, t}})
			}
		}
	}
	return ranks, pairs
}
