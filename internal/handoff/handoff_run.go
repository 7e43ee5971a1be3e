package handoff

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nixlctl/nixlctl/internal/cpuspeed"
	"github.com/nixlctl/nixlctl/internal/ctl"
	"github.com/nixlctl/nixlctl/internal/engine"
	"github.com/nixlctl/nixlctl/internal/hostload"
	"github.com/nixlctl/nixlctl/internal/live"
	"github.com/nixlctl/nixlctl/internal/netpath"
	"github.com/nixlctl/nixlctl/internal/nixl"
	"github.com/nixlctl/nixlctl/internal/rendezvous"
	"github.com/nixlctl/nixlctl/internal/report"
	"github.com/nixlctl/nixlctl/internal/runcore"
)

// RunHandoff runs one handoff benchmark in phases: validate and size,
// start the endpoints (handoffFleet), run the requests while watching the
// endpoints, settle what they hold, and judge the result. On cancellation
// it returns what finished.
func RunHandoff(ctx context.Context, o HandoffOptions) (*HandoffResult, error) {
	if o.Log == nil {
		o.Log = slog.New(slog.DiscardHandler)
	}
	if err := o.Validate(); err != nil {
		return nil, err
	}
	o.usesTrace()
	spec, _ := o.Spec.Normalize()
	o.Spec = spec
	backend, err := nixl.Resolve(o.Backend)
	if err != nil {
		return nil, err
	}
	if err := o.checkLocalVRAM(); err != nil {
		return nil, err
	}
	res := &HandoffResult{Meta: report.NewMeta("bench "+o.Protocol.String(), o.Version), Protocol: o.Protocol.String(), Backend: backend.Name, Model: spec.Model.Name}
	runcore.RecordBackend(&res.Meta, backend.Name, backend.Version())
	var rdv *RendezvousInfo
	var drv *rendezvous.Driver
	if o.Rendezvous != "" {
		// Closed after the endpoints (defers run last first): that ends
		// the members' registrations, and they exit.
		var info *RendezvousInfo
		drv, info, err = o.meetRendezvous(ctx)
		if drv != nil {
			defer drv.Close()
		}
		if err != nil {
			return nil, err
		}
		rdv = info
	}
	f := &handoffFleet{}
	f.pslots, f.dslots = o.engines()
	blocks := o.fitPools(res, f.pslots, f.dslots)
	if o.Warmup == WarmupPoolPass {
		o.Warmup = o.poolPass(blocks)
	}
	res.Config = o.config(blocks)
	res.Config.PoolSizedFor = o.poolSizedFor()
	res.Config.Rendezvous = rdv
	for _, w := range append(append([]string(nil), o.Warnings...), o.notUpstream()...) {
		res.Warn(w)
	}
	live.Emit(o.Live, live.Phase{Text: "starting endpoints"})
	defer func() {
		if drv != nil {
			drv.Ending()
		}
		o.Log.Debug("phase: closing endpoints")
		f.close()
		o.Log.Debug("phase: endpoints closed")
	}()
	if err := f.start(ctx, &o, backend.Name, blocks); err != nil {
		return nil, err
	}
	for _, ep := range f.all() {
		res.Endpoints = append(res.Endpoints, ep.info)
	}
	res.Placement = placementAll(f.pes, f.des)
	if o.remote() {
		if err := f.checkAdverts(ctx); err != nil {
			return nil, err
		}
	}
	if o.OnStart != nil {
		o.OnStart(f.pes[0], f.des[0])
	}
	psetup, dsetup := f.psetups[0], f.dsetups[0]
	res.Config.PoolBytesPerEngine, res.Config.Alloc = psetup.PoolBytes, psetup.Alloc
	res.Config.CompatHash = psetup.CompatHash
	h := newHandoff(&o, f)
	if o.Records != nil {
		// The provisional result a kill leaves (--save) recomputes its
		// efficiency from this.
		res.Summary.MemcpyGBps = dsetup.MemcpyGBps
		if err := o.Records.Begin(res, res.recordsHeader()); err != nil {
			return nil, fmt.Errorf("records: %w", err)
		}
	}
	for _, pe := range f.pes {
		go h.collectFreed(pe)
	}
	defer func() {
		if h.rounds != nil {
			h.rounds.close()
		}
	}()
	// Calls the run gave up on may still be finishing when it returns:
	// they are cancelled with it, at the end.
	runCtx, stopRun := context.WithCancelCause(ctx)
	defer stopRun(nil)
	died, path, runErr := h.runWatched(ctx, runCtx, stopRun, f, res, backend.Name)
	o.Log.Debug("phase: requests ended", "died", died)
	h.settle(ctx, f, res, died)
	o.Log.Debug("phase: settled")
	res.Summary = SummarizeHandoff(h.records, dsetup.MemcpyGBps)
	res.Summary.LeakedBlocks = res.Prefill.BlocksInUse + res.Decode.BlocksInUse
	res.NetPath = path.Verdicts(handoffPairBytes(h.records, len(f.pes)), res.Warn)
	if o.remote() {
		for _, w := range path.TCPChoiceWarnings(res.Env.Transport) {
			res.Warn(w)
		}
	}
	h.judge(res, f)
	o.Log.Debug("phase: judged")
	h.measureReference(ctx, f, res, backend.Name, runErr)
	for _, w := range res.Warnings {
		live.Emit(o.Live, live.Warning{Text: w})
	}
	res.Finish()
	if runErr != nil && ctx.Err() != nil {
		res.Interrupted = true
		res.Warn("interrupted: the run stopped early")
	}
	return res, runErr
}

// fitPools is the blocks per engine: the workload's (poolBlocks), cut to
// keep every local engine's pool in this host's memory under half of what
// is available (open loops and traces size for 64 requests of the longest
// prompt, which can be more than the machine has), with a warning.
func (o *HandoffOptions) fitPools(res *HandoffResult, pslots, dslots []EngineSlot) int {
	blocks := o.poolBlocks()
	if o.NumBlocks != 0 || o.Mem == nixl.VRAM {
		return blocks
	}
	var per int64
	for _, s := range slices.Concat(pslots, dslots) {
		if s.Local() {
			per += o.Spec.BlockBytesAllRanks(s.TP)
		}
	}
	if avail := runcore.MemAvailable(); avail > 0 && per > 0 {
		if limit := int(avail / 2 / per); blocks > limit {
			res.Warn(fmt.Sprintf("KV pools cut from %d to %d blocks per engine to fit half of the %s of memory available (--num-blocks sets them)",
				blocks, limit, report.Bytes(avail)))
			blocks = max(limit, 1)
		}
	}
	return blocks
}

// newHandoff is the runner of the requests over a started fleet.
func newHandoff(o *HandoffOptions, f *handoffFleet) *handoff {
	h := &handoff{o: o, pes: f.pes, des: f.des, psetups: f.psetups, dtp: make([]int, len(f.dslots)), router: newRouter(o.Router, len(f.pes), len(f.des)),
		freed: map[string]engine.FreedEvent{}, waiting: map[string]chan engine.FreedEvent{}, unstreamed: map[string]int{}}
	for i, s := range f.dslots {
		h.dtp[i] = s.TP
	}
	return h
}

// runWatched runs the requests while it watches every endpoint's control
// channel (deathWatch) and the network path's counters, with the CPU's
// speed read before and after. A death the result reports (and the CLI
// fails the run on) is not also returned as the run's error, unless the
// run was interrupted.
func (h *handoff) runWatched(ctx, runCtx context.Context, stopRun context.CancelCauseFunc, f *handoffFleet, res *HandoffResult, backend string) (died bool, path *runcore.PathWatch, runErr error) {
	o := h.o
	deaths := h.watchDeaths(runCtx, stopRun, f)
	defer deaths.stop()
	path = runcore.WatchPath(ctx, o.remote(), f.pathEnds()...)
	if o.XferRef && o.Rate == 0 && len(o.Trace) == 0 && (!o.remote() || o.XferTarget != "") {
		h.rounds = &interleave{h: h, backend: backend, size: roundsFor(o.Requests, o.Concurrency, o.XferRounds)}
	}
	h.load = hostload.NewRecorder(f.sameHostPIDs()...)
	h.readCPU()
	runErr = h.run(runCtx)
	h.readCPU()
	deaths.stop()
	path.Stop(ctx)
	if w, d := deaths.outcome(runCtx); d != "" {
		res.EndpointDied = d
		res.Warn(w)
		if ctx.Err() == nil {
			runErr = nil // the result says it; the CLI fails the run on it
		}
		return true, path, runErr
	}
	return false, path, runErr
}

// deathWatch notices an endpoint that dies during the run and stops the
// run at once, with the reason, instead of the router sending it requests
// that wait out watchdogs (push) or fail a wave at a time (SGLang). With
// --on-endpoint-death drain it takes the engine out of the router while
// pairs of live engines are left.
type deathWatch struct {
	died    atomic.Pointer[string] // the first death, as the result says it
	drained atomic.Int32           // deaths drained
	// stop ends the watchers: endpoints closed afterwards (for
	// --xfer-reference, and at the end) did not die.
	stop context.CancelFunc
}

func (h *handoff) watchDeaths(runCtx context.Context, stopRun context.CancelCauseFunc, f *handoffFleet) *deathWatch {
	type watched struct {
		name, role string
		idx        int
		c          *ctl.Client
	}
	var watch []watched
	for i, ep := range f.pes {
		watch = append(watch, watched{f.prefillName(i), "prefill", i, ep.rpc})
	}
	for i, ep := range f.des {
		watch = append(watch, watched{f.decodeName(i), "decode", i, ep.rpc})
	}
	dw := &deathWatch{}
	watchCtx, stop := context.WithCancel(runCtx)
	dw.stop = stop
	onces := make([]sync.Once, len(watch))
	death := func(k int) {
		onces[k].Do(func() {
			ep := watch[k]
			d := &endpointDeath{role: ep.name, why: ep.c.Why()}
			what := d.String()
			dw.died.CompareAndSwap(nil, &what)
			if h.o.OnEndpointDeath == DeathDrain {
				dw.drained.Add(1)
				if h.router.remove(ep.role, ep.idx) {
					h.o.Log.Error("an endpoint died: draining it, the run goes on with the engines left", "endpoint", what)
					return
				}
			}
			stopRun(d)
			h.o.Log.Error("an endpoint died: stopping the run", "endpoint", what)
		})
	}
	h.lost = func(role string, idx int) {
		for k, ep := range watch {
			if ep.role == role && ep.idx == idx {
				death(k)
			}
		}
	}
	for k, ep := range watch {
		go func() {
			select {
			case <-ep.c.Done():
				death(k)
			case <-watchCtx.Done():
			}
		}()
	}
	return dw
}

// outcome is the warning for a run in which an endpoint died, and which
// one died ("" for both when none did).
func (dw *deathWatch) outcome(runCtx context.Context) (warning, died string) {
	d := dw.died.Load()
	if d == nil {
		return "", ""
	}
	switch k := dw.drained.Load(); {
	case k > 0 && runCtx.Err() == nil:
		return fmt.Sprintf("the %s endpoint died during the run; drained (--on-endpoint-death drain): its requests in flight ended by themselves and the run went on with the engines left (%d died)", *d, k), *d
	case k > 0:
		return fmt.Sprintf("the %s endpoint died during the run; drained until no pair of live engines was left, which stopped the run (%d died)", *d, k), *d
	}
	return fmt.Sprintf("the %s endpoint died during the run, which stopped there", *d), *d
}

// settle collects what the endpoints report after the run: the last frees,
// the records, every engine's stats (what it still holds) and the
// initiator's transports.
func (h *handoff) settle(ctx context.Context, f *handoffFleet, res *HandoffResult, died bool) {
	o := h.o
	// Give prefill a moment to report its last frees, and, for blocks of
	// failed requests, the time their leases take (up to 5 s): what is held
	// after that is reported. Not when an endpoint died: what prefill
	// holds for a dead decode stays held for the whole lease (vLLM's
	// abort timeout), so the waits only delayed the exit (push took 10 s
	// to exit after its decode was killed) and reported the same blocks.
	freedWait, blocksBack := 2*time.Second, min(time.Duration(o.Lease), 5*time.Second)+time.Second
	if died {
		freedWait, blocksBack = 500*time.Millisecond, 250*time.Millisecond
		// A lease short enough to lapse within a second and a half
		// still gives its blocks back before they are counted: reading
		// prefill between the reaper's expiry and its free reported a
		// lapsed lease's blocks as leaked.
		if back := time.Duration(o.Lease) + time.Second/2; back <= 3*time.Second/2 {
			blocksBack = back
		}
	}
	h.drainFreed(freedWait)
	o.Log.Debug("phase: frees drained")
	h.streamRest()
	res.Records = h.records
	// Calls the run gave up on may still be finishing at prefill (a slow
	// fill, cancelled only between steps): wait for them, then for the
	// leases they left, before counting what is still held.
	nctx := context.WithoutCancel(ctx)
	n, m := len(f.pes), len(f.des)
	pstats, dstats := make([]engine.Stats, n), make([]engine.Stats, m)
	for i, pe := range f.pes {
		st, err := settlePrefill(nctx, pe, blocksBack, 10*time.Second)
		o.Log.Debug("phase: prefill settled", "engine", i, "in_flight", st.InFlight, "blocks_in_use", st.BlocksInUse)
		pstats[i] = st
		if err != nil {
			res.Warn(f.prefillName(i) + " stats: " + err.Error())
		}
	}
	for i, de := range f.des {
		if err := de.rpc.Call(nctx, "stats", nil, &dstats[i]); err != nil {
			res.Warn(f.decodeName(i) + " stats: " + err.Error())
		}
	}
	if w := tagWorkWarning(slices.Concat(pstats, dstats)); w != "" {
		res.Warn(w)
	}
	if n*m == 1 {
		res.Prefill, res.Decode = pstats[0], dstats[0]
	} else {
		for _, st := range pstats {
			sumStats(&res.Prefill, st)
		}
		for _, st := range dstats {
			sumStats(&res.Decode, st)
		}
		res.PrefillEngines, res.DecodeEngines = pstats, dstats
	}
	// The initiator's view of the path: decode READs in pull, prefill
	// WRITEs in push and SGLang.
	initiator := f.des[0]
	if o.Protocol != engine.ProtoPull {
		initiator = f.pes[0]
	}
	var info map[string]string
	if err := initiator.rpc.Call(nctx, "info", nil, &info); err != nil {
		return
	}
	res.Transports = info
	keys := make([]string, 0, len(info))
	for k := range info {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		v := info[k]
		if !strings.Contains(k, "transport:") {
			continue
		}
		res.Env.Transport = v
		if strings.Contains(v, "emulated over active messages on tcp") {
			res.Warn("TCP fallback: RMA is emulated over TCP active messages")
		}
	}
}

// judge says what the summarised run shows that its numbers alone do not:
// held, corrupt or unreachable blocks, arrivals that waited, stalls,
// clocks, malformed peers, software RMA, the interleaved reference and the
// host's CPU speed.
func (h *handoff) judge(res *HandoffResult, f *handoffFleet) {
	o := h.o
	n, m := len(f.pes), len(f.des)
	if res.Summary.LeakedBlocks > 0 {
		if n*m == 1 {
			res.Warn(fmt.Sprintf("%d KV blocks still held after the run (prefill %d, decode %d)", res.Summary.LeakedBlocks, res.Prefill.BlocksInUse, res.Decode.BlocksInUse))
		} else {
			res.Warn(fmt.Sprintf("%d KV blocks still held after the run (%s)", res.Summary.LeakedBlocks, heldByEngine(res.PrefillEngines, res.DecodeEngines)))
		}
	}
	if n*m > 1 {
		res.Summary.Pairs = SummarizePairs(h.records, n, m)
	}
	if res.Summary.CorruptBlocks > 0 {
		res.Warn(fmt.Sprintf("%d corrupt blocks: data arrived wrong or late", res.Summary.CorruptBlocks))
	}
	if k := h.arrivalsDelayed; k > 0 {
		res.Summary.ArrivalsDelayed = k
		res.Warn(fmt.Sprintf("%d of %d arrivals found --max-inflight %d requests in flight and waited for one to finish: the endpoints did not keep up with --rate %g (the waits are not in the latencies; the offered load was not the measured one)",
			k, len(h.records), o.openLoopCap(), o.Rate))
	}
	if w, _ := stallWarning(h.records); w != "" {
		res.Warn(w)
	}
	if w := unreachableWarning(res.Summary, o.NetDevices, res.Endpoints, netpath.RouteDevice); w != "" {
		res.Warn(w)
	}
	if ns := res.Summary.NegativeStages; len(ns) > 0 {
		res.Warn(fmt.Sprintf("negative stage times, left out of their histograms: %s (clocks that disagree, or a stamp on the wrong side)",
			strings.TrimSuffix(strings.TrimPrefix(runcore.ByReason(ns), " ("), ")")))
	}
	if bad := res.Prefill.MalformedNotifs + res.Decode.MalformedNotifs + res.Prefill.MalformedControl + res.Decode.MalformedControl; bad > 0 {
		res.Warn(fmt.Sprintf("%d malformed messages from peers (see the endpoints' logs)", bad))
	}
	if w := runcore.SoftwareRMAWarning(res.Env.Transport, "--xfer-reference measures what UCX-allocated (mapped) memory reaches on this host beside the run (efficiency_vs_limit)"); w != "" {
		res.Warn(w)
	}
	if o.Protocol == engine.ProtoSGLang && res.Backend == "cuda-ipc" {
		res.Warn("SGLang's aux rows are in GPU memory here: cuda-ipc moves GPU memory only (SGLang keeps them in host memory, which NIXL moves); each request's aux WRITE (three 64-byte pieces) is a GPU copy")
	}
	if il := h.rounds; il != nil {
		summarizeRounds(&res.Summary, h.records, il.roundRefsCopy())
		if len(res.Summary.Rounds) > 0 {
			res.Config.XferReference = il.config(len(res.Summary.Rounds))
		}
		if il.off != "" {
			res.Warn("the bench xfer reference stopped interleaving with the handoff: " + il.off)
		}
		il.close() // its memory back before any reference after the run
	}
	cpu := cpuspeed.Summarize(h.cpuReadings())
	if cpu.Readings > 0 {
		res.HostCPU = &cpu
		if w := cpu.Warning(); w != "" {
			res.Warn(w)
		}
	}
	if w, err := res.Field.Record(h.load); err != nil {
		o.Log.Debug("host load", "err", err)
	} else if w != "" {
		res.Warn(w)
	}
}

// measureReference runs the bench xfer reference after the run where it
// was not interleaved with it (open loops and traces), and warns when the
// handoff beat its reference.
func (h *handoff) measureReference(ctx context.Context, f *handoffFleet, res *HandoffResult, backend string, runErr error) {
	o := h.o
	remote := o.remote()
	if o.XferRef && remote && o.XferTarget == "" && runErr == nil {
		res.Warn("no bench xfer reference: with an endpoint on another host it must cross the same link (start serve target --listen there and give --xfer-target)")
	}
	if o.XferRef && (!remote || o.XferTarget != "") && runErr == nil && res.Summary.Requests > 0 && res.Summary.XferGBps == 0 {
		// The reference allocates the run's working set again: give the
		// endpoints' pools back first (both at once can exhaust memory).
		f.close()
		live.Emit(o.Live, live.Phase{Text: "bench xfer reference"})
		if gbps, err := h.xferReference(ctx, backend, res); err != nil {
			res.Warn("bench xfer reference: " + err.Error())
		} else if gbps > 0 {
			res.Summary.XferGBps = gbps
			res.Summary.EfficiencyXfer = res.Summary.BandwidthGBps / gbps
		}
	}
	// The reference is the limit for these transfers: a handoff clearly
	// faster than it says the reference did not measure the limit (a busy
	// machine, too short a run), not that the protocol beat the transport.
	if e := res.Summary.EfficiencyXfer; e > 1.05 {
		res.Warn(fmt.Sprintf("the handoff ran %.2fx the bench xfer reference on the same bytes: the reference did not measure the limit (a busy machine? a longer run?), so the ratio is not an efficiency", e))
	}
}
