package handoff

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/nixlctl/nixlctl/internal/ctl"
	"github.com/nixlctl/nixlctl/internal/engine"
	"github.com/nixlctl/nixlctl/internal/live"
	"github.com/nixlctl/nixlctl/internal/mono"
	"github.com/nixlctl/nixlctl/internal/runcore"
	"github.com/nixlctl/nixlctl/internal/xferbench"
)

// roundOf is request i's round of the interleaved reference (0 without
// rounds, and for the warm-up).
func (h *handoff) roundOf(i int) int {
	if h.rounds == nil || i < h.o.Warmup {
		return 0
	}
	return (i - h.o.Warmup) / h.rounds.size
}

// finished streams request i's record (o.Records) when it is final, else
// leaves it in unstreamed until collectFreed or streamRest does. A record
// is final once prefill's release of its blocks is known, since that fills
// the release reason and, for a push whose release came late, the WRITE
// stages (applyFreed). Streaming the final record, rather than streaming
// at once and appending a fix-up line for readers to merge, keeps the file
// one line per request, which every reader (older nixlctl included)
// already counts right; the price is that a kill loses the few records
// still waiting for their release. SGLang's prefill reports no releases,
// so its records are final when their requests finish.
func (h *handoff) finished(i int) {
	if h.o.Records == nil {
		return
	}
	h.mu.Lock()
	r := &h.records[i]
	f, ok := h.freed[r.ID]
	switch {
	case ok:
		h.applyFreed(r, f)
	case h.o.Protocol != engine.ProtoSGLang: // SGLang's prefill reports no releases: final now
		h.unstreamed[r.ID] = i
		h.mu.Unlock()
		return
	}
	rec := *r
	h.mu.Unlock()
	_ = h.o.Records.Record(rec)
}

// streamRest streams the records still waiting for a release at the end
// of the run, as drainFreed left them (final now), in request order.
func (h *handoff) streamRest() {
	if h.o.Records == nil {
		return
	}
	h.mu.Lock()
	pos := make([]int, 0, len(h.unstreamed))
	for _, i := range h.unstreamed {
		pos = append(pos, i)
	}
	clear(h.unstreamed)
	sort.Ints(pos)
	recs := make([]HandoffRecord, len(pos))
	for k, i := range pos {
		recs[k] = h.records[i]
	}
	h.mu.Unlock()
	for _, r := range recs {
		_ = h.o.Records.Record(r)
	}
}

// applyFreed completes a finished request's record with prefill's release
// of its blocks. Applying it twice changes nothing.
func (h *handoff) applyFreed(r *HandoffRecord, f engine.FreedEvent) {
	r.Freed = engine.FreedReason(f.Reason)
	// A push whose release came after the request's own short wait gets
	// its WRITE stages now.
	if h.o.Protocol == engine.ProtoPush && r.Error == "" && r.Bytes == 0 && f.Bytes > 0 {
		r.applyPushFreed(f)
	}
}

// collectFreed reads one prefill's releases (every request id is the
// run's own, so one map serves every prefill).
func (h *handoff) collectFreed(pe *Endpoint) {
	pe.rpc.EachEvent(func(ev ctl.Event) {
		if ev.Name != "freed" {
			return
		}
		var f engine.FreedEvent
		if json.Unmarshal(ev.Data, &f) != nil {
			return
		}
		f.OnClock(pe.toDriver)
		h.mu.Lock()
		h.freed[f.RouterID] = f
		ch := h.waiting[f.RouterID]
		delete(h.waiting, f.RouterID)
		var final *HandoffRecord // a finished record this release completes
		if i, ok := h.unstreamed[f.RouterID]; ok {
			delete(h.unstreamed, f.RouterID)
			h.applyFreed(&h.records[i], f)
			rec := h.records[i]
			final = &rec
		}
		h.mu.Unlock()
		if ch != nil {
			ch <- f
		}
		if final != nil {
			_ = h.o.Records.Record(*final)
		}
	})
}

// waitFreed waits (bounded) for prefill to report a request's release.
func (h *handoff) waitFreed(ctx context.Context, id string, d time.Duration) (engine.FreedEvent, bool) {
	h.mu.Lock()
	if f, ok := h.freed[id]; ok {
		h.mu.Unlock()
		return f, true
	}
	ch := make(chan engine.FreedEvent, 1)
	h.waiting[id] = ch
	h.mu.Unlock()
	select {
	case f := <-ch:
		return f, true
	case <-ctx.Done():
		// The run stopped: drainFreed applies what still comes.
	case <-time.After(d):
	}
	h.mu.Lock()
	delete(h.waiting, id)
	h.mu.Unlock()
	return engine.FreedEvent{}, false
}

// drainFreed waits up to d for vLLM prefill's release of every request
// that did not fail, and applies the releases to the records. SGLang's
// prefill reports no releases (its blocks go back when the transfer
// ends): waiting for them cost every SGLang run the whole 2 s.
func (h *handoff) drainFreed(d time.Duration) {
	if h.o.Protocol == engine.ProtoSGLang {
		return
	}
	deadline := time.Now().Add(d)
	for time.Now().Before(deadline) {
		h.mu.Lock()
		all := true
		for i := range h.records {
			if _, ok := h.freed[h.records[i].ID]; !ok && h.records[i].Error == "" {
				all = false
			}
		}
		h.mu.Unlock()
		if all {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	for i := range h.records {
		r := &h.records[i]
		if f, ok := h.freed[r.ID]; ok {
			h.applyFreed(r, f)
		}
	}
}

func (h *handoff) run(ctx context.Context) error {
	o := h.o
	isls, arrivals := h.draws()
	n := len(isls)
	// Grown as requests finish (record): a run asked for a million
	// requests, to go on until it is stopped, zeroed hundreds of MB up
	// front and scanned them all when it stopped (half a second after
	// its decode was killed, under the race detector).
	h.records = make([]HandoffRecord, 0, min(n, 1024))
	h.start = mono.Now()
	live.Emit(o.Live, live.Start{Title: "bench " + o.Protocol.String(), Total: n, Unit: "requests"})
	live.Emit(o.Live, live.Phase{Text: "measuring"})
	var wg sync.WaitGroup
	var firstErr error
	var errMu sync.Mutex
	runOne := func(i int) {
		defer wg.Done()
		if err := h.request(ctx, i, isls[i]); err != nil {
			errMu.Lock()
			firstErr = err
			errMu.Unlock()
		}
	}
	if arrivals != nil {
		h.openLoop(ctx, arrivals, &wg, runOne)
	} else {
		h.closedLoop(ctx, n, &wg, runOne)
	}
	wg.Wait()
	if h.rounds != nil && arrivals == nil && n > o.Warmup {
		h.rounds.between(ctx, h.roundOf(n-1), true)
	}
	h.end = mono.Now()
	h.compactRecords()
	if ctx.Err() != nil {
		return ctx.Err()
	}
	return firstErr
}

// draws are the run's prompt lengths and, for an open loop, their
// arrival times: from the trace, else drawn (from o.Seed) with Poisson
// arrivals at o.Rate; nil arrivals is a closed loop.
func (h *handoff) draws() (isls []int, arrivals []time.Duration) {
	o := h.o
	if len(o.Trace) > 0 {
		isls, arrivals = make([]int, len(o.Trace)), make([]time.Duration, len(o.Trace))
		for i, e := range o.Trace {
			isls[i], arrivals[i] = e.ISL, time.Duration(e.Arrival*float64(time.Second))
		}
		return isls, arrivals
	}
	rng := rand.New(rand.NewPCG(o.Seed, 0x15e))
	isls = make([]int, o.Requests+o.Warmup)
	for i := range isls {
		isls[i] = o.ISL.Draw(rng)
	}
	if o.Rate > 0 {
		arrivals = Arrivals(len(isls), o.Rate, rng)
	}
	return isls, arrivals
}

// request runs request i (isl tokens) on the pair the router picks and
// records it; it returns the context's error when the run was stopped
// under it.
func (h *handoff) request(ctx context.Context, i, isl int) error {
	o := h.o
	p, d, ok := h.router.pick()
	if !ok {
		// Drained: no pair of live engines is left; the watcher ends
		// the run, and this request was never sent.
		return nil
	}
	r := h.one(ctx, i, isl, p, d)
	if r.Error != "" && h.lost != nil {
		// Before the next request goes out: an engine whose channel
		// is gone ends the run (or is drained) now.
		if h.pes[p].rpc.Lost() {
			h.lost("prefill", p)
		}
		if h.des[d].rpc.Lost() {
			h.lost("decode", d)
		}
	}
	h.router.done(p, d)
	var death *endpointDeath
	if r.Error != "" && errors.As(context.Cause(ctx), &death) {
		r.Error = "stopped: " + death.Error() // not the context's "canceled"
	}
	r.Warmup = i < o.Warmup
	r.Round = h.roundOf(i)
	h.mu.Lock()
	if i >= len(h.records) {
		h.records = append(h.records, make([]HandoffRecord, i+1-len(h.records))...)
	}
	h.records[i] = r
	h.mu.Unlock()
	h.finished(i)
	live.Emit(o.Live, live.Request{Bytes: r.Bytes, Latency: time.Duration(r.HandoffMS * 1e6),
		OK: r.Error == "" && r.CorruptBlocks == 0, Warmup: r.Warmup})
	if r.Error != "" && ctx.Err() != nil {
		return ctx.Err()
	}
	return nil
}

// openLoop starts request i at arrivals[i] whatever is in flight, up to
// the open loop's cap (a late slot delays the arrival, counted).
func (h *handoff) openLoop(ctx context.Context, arrivals []time.Duration, wg *sync.WaitGroup, runOne func(int)) {
	t0 := time.Now()
	slots := make(chan struct{}, h.o.openLoopCap())
	for i := 0; i < len(arrivals) && ctx.Err() == nil; i++ {
		if d := time.Until(t0.Add(arrivals[i])); d > 0 {
			select {
			case <-time.After(d):
			case <-ctx.Done():
			}
		}
		select {
		case slots <- struct{}{}:
		default:
			h.arrivalsDelayed++
			select {
			case slots <- struct{}{}:
			case <-ctx.Done():
			}
		}
		if ctx.Err() != nil {
			break
		}
		wg.Add(1)
		go func() {
			defer func() { <-slots }()
			runOne(i)
		}()
	}
}

// closedLoop keeps o.Concurrency requests in flight: the warm-up first,
// alone, and with interleaved references each round's after the round.
func (h *handoff) closedLoop(ctx context.Context, n int, wg *sync.WaitGroup, runOne func(int)) {
	o := h.o
	next := make(chan int)
	for w := 0; w < min(o.Concurrency, n); w++ { // no idle workers past the requests
		go func() {
			for i := range next {
				runOne(i)
			}
		}()
	}
	for i := 0; i < n; i++ {
		if o.Warmup > 0 && i == o.Warmup {
			wg.Wait() // warm-up first, alone
		}
		if h.rounds != nil && i > o.Warmup && h.roundOf(i) != h.roundOf(i-1) {
			wg.Wait() // the round's requests are done: its reference runs alone
			h.rounds.between(ctx, h.roundOf(i-1), false)
		}
		wg.Add(1)
		select {
		case next <- i:
		case <-ctx.Done():
			wg.Done()
		}
		if ctx.Err() != nil {
			break
		}
	}
	close(next)
}

// compactRecords drops the slots of requests never sent (a stopped run)
// and moves the records still to be streamed with the rest.
func (h *handoff) compactRecords() {
	h.mu.Lock()
	defer h.mu.Unlock()
	kept := h.records[:0]
	for _, r := range h.records {
		if r.ID != "" {
			kept = append(kept, r)
		}
	}
	h.records = kept
	for pos, r := range h.records {
		if _, ok := h.unstreamed[r.ID]; ok {
			h.unstreamed[r.ID] = pos
		}
	}
}

// settlePrefill polls prefill's stats until the calls the run gave up on
// have returned (up to busy), then until its blocks are back (up to
// blocksBack more), and returns the last stats.
func settlePrefill(ctx context.Context, pe *Endpoint, blocksBack, busy time.Duration) (engine.Stats, error) {
	busyEnd := time.Now().Add(busy)
	var settle time.Time
	var last engine.Stats
	for {
		// A fresh struct each time: Stats leaves zero counters out
		// (in_flight is omitempty), so decoding into the last answer
		// would keep its in_flight once the calls are done, and the wait
		// would run to busyEnd whatever prefill says.
		var st engine.Stats
		if err := pe.rpc.Call(ctx, "stats", nil, &st); err != nil {
			return last, err
		}
		last = st
		if st.InFlight > 0 && time.Now().Before(busyEnd) {
			time.Sleep(50 * time.Millisecond)
			continue
		}
		if settle.IsZero() {
			settle = time.Now().Add(blocksBack)
		}
		if st.BlocksInUse == 0 || time.Now().After(settle) {
			return st, nil
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// one runs one request through the protocol, as the router would.
func (h *handoff) one(ctx context.Context, i, isl, p, d int) HandoffRecord {
	o := h.o
	pe, de, psetup := h.pes[p], h.des[d], h.psetups[p]
	id := fmt.Sprintf("cmpl-%06d-0", i)
	key := o.Seed<<20 ^ uint64(i+1)
	prefix := int(float64(isl) * o.PrefixHit)
	rec := HandoffRecord{Index: i, ID: id, Prefill: p, Decode: d, ISL: isl, PrefixTokens: prefix, TStart: mono.Now()}
	var pr engine.PrefillReply
	var lr engine.LoadReply
	var perr, derr error
	switch o.Protocol {
	case engine.ProtoPull:
		perr = pe.rpc.Call(ctx, "prefill", engine.PrefillRequest{ID: id, Tokens: isl, Key: key, CheckTP: h.dtp[d]}, &pr)
		if perr == nil {
			derr = de.rpc.Call(ctx, "load", engine.LoadRequest{ID: id, Tokens: isl, PrefixTokens: prefix, Key: key, Params: pr.Params}, &lr)
		}
	case engine.ProtoPush:
		host, port, _ := runcore.SplitHostPort(psetup.SideChannel)
		coords := engine.TransferParams{DoRemotePrefill: true, RemoteEngineID: psetup.EngineID, RemoteRequestID: id,
			RemoteHost: host, RemotePort: port, TPSize: psetup.TP, PPSize: max(psetup.PP, 1), TransferMode: "push"}
		var wg sync.WaitGroup
		wg.Add(1)
		go func() {
			defer wg.Done()
			derr = de.rpc.Call(ctx, "load", engine.LoadRequest{ID: id, Tokens: isl, PrefixTokens: prefix, Key: key, Params: coords}, &lr)
		}()
		perr = pe.rpc.Call(ctx, "prefill", engine.PrefillRequest{ID: id, Tokens: isl, Key: key, CheckTP: h.dtp[d]}, &pr)
		wg.Wait()
	case engine.ProtoSGLang:
		room := rand.Uint64() >> 1 // 63 bits, as the router draws it
		var wg sync.WaitGroup
		wg.Add(1)
		go func() {
			defer wg.Done()
			derr = de.rpc.Call(ctx, "load", engine.LoadRequest{ID: id, Tokens: isl, PrefixTokens: prefix, Key: key, Room: room, Bootstrap: psetup.Bootstrap,
				Foreign: o.Bootstrap != ""}, &lr)
		}()
		perr = pe.rpc.Call(ctx, "prefill", engine.PrefillRequest{ID: id, Tokens: isl, Key: key, CheckTP: h.dtp[d], Room: room, ChunkTokens: o.ChunkTokens}, &pr)
		wg.Wait()
	}
	// Every stamp onto the driver's clock before anything subtracts
	// stamps of two processes (a no-op on one host).
	pr.OnClock(pe.toDriver)
	lr.OnClock(de.toDriver)
	switch {
	case perr != nil:
		rec.Error = "prefill: " + perr.Error()
	case derr != nil:
		rec.Error = "decode: " + derr.Error()
	case lr.Error != "":
		rec.Error = "decode: " + lr.Error
	}
	if o.Protocol == engine.ProtoPull && perr == nil && derr == nil && strings.Contains(lr.Error, engine.ErrHandshake.Error()) {
		h.abortUnread(ctx, pe, pr.RequestID)
	}
	rec.Blocks, rec.Descriptors, rec.LogicalDescs, rec.Bytes = lr.Blocks, lr.Descriptors, lr.LogicalDescriptors, lr.Bytes
	rec.FirstHandshake, rec.HandshakeMS, rec.CorruptBlocks = lr.FirstHandshake, lr.HandshakeMS, lr.CorruptBlocks
	if lr.Corrupt != "" && rec.Error == "" {
		rec.Error = "corrupt: " + lr.Corrupt
	}
	rec.TFinish, rec.TReady = pr.TFinish, lr.TReady
	ms := stageMS
	rec.PrefillMS = ms(pr.TStart, pr.TFinish)
	rec.HandoffMS = ms(pr.TFinish, lr.TReady)
	rec.CompletionMS = ms(lr.TXferDone, lr.TReady)
	switch o.Protocol {
	case engine.ProtoPull:
		rec.FinishToPostMS = ms(pr.TFinish, lr.TPostStart)
		rec.PostMS = ms(lr.TPostStart, lr.TPostEnd)
		rec.TransferMS = ms(lr.TPostEnd, lr.TXferDone)
	case engine.ProtoPush:
		// The WRITE is prefill's: its stage times come with the release
		// (or, when that comes late, at the end of the run: drainFreed).
		rec.tRegSent, rec.tXferDone = lr.TRegSent, lr.TXferDone
		// A failed request has no release to wait for (a dead decode
		// never sends the completion that triggers it): waiting cost
		// every run whose decode died 3 s.
		if rec.Error == "" {
			if f, ok := h.waitFreed(ctx, id, 3*time.Second); ok {
				rec.applyPushFreed(f)
			}
		}
	case engine.ProtoSGLang:
		rec.RegRTTMS = ms(lr.TRegSent, pr.TBootstrapped)
		rec.FinishToPostMS = ms(max(pr.TFinish, pr.TBootstrapped), pr.TPostStart)
		// Both ends on prefill's clock: the WRITEs posted, and done
		// (sendRoom returns when they are).
		rec.TransferMS = ms(pr.TPostStart, pr.TSent)
		rec.Descriptors, rec.LogicalDescs = pr.Descriptors, pr.LogicalDescs
		rec.Bytes = int64(lr.Blocks) * h.o.Spec.BlockBytesAllRanks(h.dtp[d])
	}
	return rec
}

// abortUnread tells a prefill that nobody will read a request's blocks: its
// decode could not handshake with it. A router does the same, and without
// it the blocks stay held for a whole lease, so that one unreachable path
// turned into dozens of "out of KV blocks" failures that hid the cause.
func (h *handoff) abortUnread(ctx context.Context, pe *Endpoint, id string) {
	actx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	var ar engine.AbortReply
	if err := pe.rpc.Call(actx, "abort", engine.AbortRequest{ID: id}, &ar); err != nil {
		h.o.Log.Debug("aborting unread blocks at prefill", "request", id, "err", err)
	}
}

// xferReference runs `bench xfer` on the same bytes: one point with the
// run's mean descriptor size and count, as many in flight as the run had.
func (h *handoff) xferReference(ctx context.Context, backend string, res *HandoffResult) (float64, error) {
	s := res.Summary
	if s.DescriptorsPerReq < 1 || s.BytesPerRequest <= 0 {
		return 0, nil
	}
	batch := int(s.DescriptorsPerReq + 0.5)
	block := int(s.BytesPerRequest / float64(batch))
	block = max(8, block/8*8)
	xo := h.referenceOptions(backend, block, batch, h.o.DRAMAlloc)
	// Ten rounds of the pipeline and at least 4 GB, so it runs full for
	// nearly all of the timed phase: with three rounds (12 requests of
	// 256 MiB at depth 4) the ramp at both ends made the reference read
	// 1.3-3.7 GB/s for the same work and the handoff 2.4x "faster" than
	// it. One round of warm-up fills the pipeline first.
	xo.NumIter = max(10*xo.PipelineDepth, min(400, int(4e9/float64(block*batch))+1))
	// Over a pool's worth of memory, as the handoff's requests were
	// (the endpoints are gone: their pools' memory is free again).
	span := h.referenceSpan(int64(xo.TotalBufferSize), 2, runcore.MemAvailable())
	if span > 0 {
		xo.TotalBufferSize, xo.Spread = runcore.ByteSize(span), true
	}
	xr, err := xferbench.RunXfer(ctx, xo)
	if err != nil {
		return 0, err
	}
	if xr.Failure != "" {
		return 0, errors.New(xr.Failure)
	}
	if len(xr.Points) == 0 {
		return 0, nil
	}
	res.Config.XferReference = &XferReference{Op: xo.Op.String(), BlockSize: block, BatchSize: batch, PipelineDepth: xo.PipelineDepth, Iterations: xo.NumIter, Polling: "paced",
		Target: h.o.XferTarget, SpanBytes: span}
	return xr.Points[0].BandwidthGBps, nil
}

// endpointDeath is why a run stopped when an endpoint died.
type endpointDeath struct{ role, why string }

// String is "decode (signal: killed)".
func (e *endpointDeath) String() string { return e.role + " (" + e.why + ")" }

func (e *endpointDeath) Error() string { return "the " + e.String() + " endpoint died" }
