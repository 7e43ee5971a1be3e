package xferbench

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"runtime"
	"sort"
	"strings"
	"time"

	"github.com/nixlctl/nixlctl/internal/blocktag"
	"github.com/nixlctl/nixlctl/internal/ctl"
	"github.com/nixlctl/nixlctl/internal/errkind"
	"github.com/nixlctl/nixlctl/internal/fleet"
	"github.com/nixlctl/nixlctl/internal/hostload"
	"github.com/nixlctl/nixlctl/internal/live"
	"github.com/nixlctl/nixlctl/internal/netpath"
	"github.com/nixlctl/nixlctl/internal/nixl"
	"github.com/nixlctl/nixlctl/internal/nixl/cuda"
	"github.com/nixlctl/nixlctl/internal/nixl/ucx"
	"github.com/nixlctl/nixlctl/internal/report"
	"github.com/nixlctl/nixlctl/internal/runcore"
	"github.com/nixlctl/nixlctl/internal/xfertarget"
)

type xferRun struct {
	o      *XferOptions
	log    *slog.Logger
	agent  nixl.Agent
	target *xfertarget.Client
	// targetConn is how the target was started: closing it flushes a
	// child's stderr.
	targetConn *fleet.Conn
	local      *nixl.Buffer
	scratch    []byte       // memcpy reference destination (DRAM to DRAM)
	vscratch   *nixl.Buffer // device reference buffer (runs with VRAM)
	ref        string       // the reference: see XferConfig.Reference
	remote     string
	raddr      uint64
	rlen       int
	// ownPIDs are processes of the run's that are not below this one: a
	// target it dialed on this host (hostload).
	ownPIDs  []int
	backend  string
	transp   string
	notifSeq int
}

// RunXfer runs the sweep. It returns the points finished so far when ctx
// is cancelled (Interrupted set) along with ctx's error, and when a point
// fails (Failure set, a problem of the result's).
func RunXfer(ctx context.Context, o XferOptions) (*XferResult, error) {
	if o.Log == nil {
		o.Log = slog.New(slog.DiscardHandler)
	}
	if err := o.Validate(); err != nil {
		return nil, err
	}
	o.TargetDevice = o.targetDevice()
	if o.Progress == "" {
		o.Progress = XferPoll
	}
	res := &XferResult{Meta: report.NewMeta("bench xfer", o.Version)}
	size := o.bufferSize()
	res.Config = XferConfig{Op: o.Op.String(), InitiatorSeg: o.InitiatorSeg.String(), TargetSeg: o.TargetSeg.String(),
		StartBlock: int(o.StartBlock), MaxBlock: int(o.MaxBlock), StartBatch: o.StartBatch, MaxBatch: o.MaxBatch,
		NumIter: o.NumIter, WarmupIter: o.WarmupIter, PipelineDepth: o.PipelineDepth, TotalBufferSize: size,
		DRAMAlloc: string(o.DRAMAlloc), CheckConsistency: o.CheckConsistency, RecreateXfer: o.RecreateXfer,
		DescOrder: string(o.DescOrder), Notif: o.Notif, Shape: o.Shape, Progress: string(o.Progress)}
	live.Emit(o.Live, live.Phase{Text: "setting up the target"})
	r, err := setupXfer(ctx, &o, res, size)
	if err != nil {
		return nil, err
	}
	defer r.close()
	res.Env.Backend = r.backend
	res.Env.Transport = r.transp
	if w := runcore.SoftwareRMAWarning(r.transp, "--dram-alloc ucx measures UCX-allocated (mapped) memory, the fastest path on this host"); w != "" {
		res.Warn(w)
	}
	if strings.Contains(r.transp, "tcp") && strings.Contains(r.transp, "rma: emulated") {
		res.Warn("TCP fallback: RMA runs as software emulation over TCP active messages; expect a fraction of shared-memory or RDMA bandwidth")
		live.Emit(o.Live, live.Warning{Text: "TCP fallback: RMA emulated over TCP"})
	}
	var points [][2]int
	for b := int(o.StartBlock); b <= int(o.MaxBlock); b *= 2 {
		for n := o.StartBatch; n <= o.MaxBatch; n *= 2 {
			points = append(points, [2]int{b, n}) // descriptors wrap around a smaller buffer
		}
	}
	live.Emit(o.Live, live.Start{Title: "bench xfer " + res.Config.Op, Total: len(points), Unit: "points"})
	live.Emit(o.Live, live.Phase{Text: "sweeping"})
	path := runcore.WatchPath(ctx, o.Target.Addr != "", xferPathEnds(o.Op, r.target.Client)...)
	snap := runcore.Snapshotter(o.Snapshot, res, o.Live)
	snap()
	// What other processes take of the host, sampled between the points:
	// the target this run started is below it, one it dialed here is
	// named.
	load := hostload.NewRecorder(r.ownPIDs...)
	sampleLoad := func() {
		if err := load.Take(); err != nil {
			o.Log.Debug("host load sample", "err", err)
		}
	}
	sampleLoad()
	for i, pt := range points {
		if ctx.Err() != nil {
			break
		}
		p, err := r.point(ctx, i, pt[0], pt[1])
		if err != nil {
			if ctx.Err() != nil {
				break
			}
			res.Failure = fmt.Sprintf("block %d batch %d (point %d of %d): %v", pt[0], pt[1], i+1, len(points), err)
			w := "the sweep stopped at " + res.Failure
			res.Warn(w)
			live.Emit(o.Live, live.Warning{Text: w})
			// Not returned as an error: the result carries it, so the
			// caller fails the run on its problems (or allows them).
			break
		}
		res.Points = append(res.Points, p)
		sampleLoad()
		snap()
		failed := strings.HasPrefix(p.Consistency, "FAILED")
		live.Emit(o.Live, live.Point{Label: p.Series(), Bytes: p.Bytes, Elapsed: time.Duration(p.Seconds * 1e9),
			Requests: p.Iterations, P50: time.Duration(p.LatencyUS.P50 * 1e3), P99: time.Duration(p.LatencyUS.P99 * 1e3), OK: !failed})
		if failed {
			w := fmt.Sprintf("consistency check failed at block %d batch %d: %s", p.BlockSize, p.BatchSize, p.Consistency)
			res.Warn(w)
			live.Emit(o.Live, live.Warning{Text: w})
		}
	}
	path.Stop(ctx)
	res.NetPath = path.Verdicts(runcore.TwoEnds(xferPayload(&o, res.Points)), func(w string) { res.Warn(w); live.Emit(o.Live, live.Warning{Text: w}) })
	if w, err := res.Field.Record(load); err != nil {
		o.Log.Debug("host load", "err", err)
	} else if w != "" {
		res.Warn(w)
		live.Emit(o.Live, live.Warning{Text: w})
	}
	res.Finish()
	if err := ctx.Err(); err != nil {
		res.Interrupted = true
		res.Warn("interrupted: the sweep stopped early")
		return res, err
	}
	return res, nil
}

func setupXfer(ctx context.Context, o *XferOptions, res *XferResult, size int) (*xferRun, error) {
	backend, err := nixl.Resolve(o.Backend)
	if err != nil {
		return nil, err
	}
	r := &xferRun{o: o, log: o.Log, backend: backend.Name}
	runcore.RecordBackend(&res.Meta, backend.Name, backend.Version())
	vram := o.InitiatorSeg == nixl.VRAM || o.TargetSeg == nixl.VRAM
	if vram {
		if err := cuda.Err(); err != nil {
			// This host's limit, not a typo (exit 1), but name the flag
			// that asked for VRAM.
			flag := map[bool]string{true: "--mem", false: "--target-mem"}[o.InitiatorSeg == nixl.VRAM]
			return nil, fmt.Errorf("%s VRAM: VRAM segments need the CUDA driver: %s", flag, cuda.Unavailable())
		}
		res.Env.CUDA = cuda.Version()
		if cuda.Fake() {
			res.Warn("the CUDA driver is nixlctl's FAKE test driver: device memory is host memory, these are not GPU numbers")
		}
		if o.InitiatorSeg == nixl.VRAM {
			res.Config.InitiatorDevice = &o.Device
		}
		if o.TargetSeg == nixl.VRAM {
			res.Config.TargetDevice = &o.TargetDevice
		}
	}
	ok := false
	defer func() {
		if !ok {
			r.close()
		}
	}()
	// The initiator first: a backend that cannot move the chosen memory
	// says so before a target process is started.
	iprog, tprog := o.Progress.agents()
	if backend.Name != "nixl" {
		res.Config.Progress = "" // the others progress their own way
	}
	if r.agent, err = nixl.Open(backend.Name, nixl.Config{Name: "xfer-initiator", Progress: iprog}); err != nil {
		return nil, err
	}
	if r.local, err = cuda.AllocSeg(r.agent, o.InitiatorSeg, o.Device, size, string(o.DRAMAlloc), o.HugePages); err != nil {
		return nil, err
	}
	res.Config.InitiatorAlloc = r.local.Alloc
	if err := r.agent.RegisterMem(r.local); err != nil {
		return nil, segError("initiator", o.InitiatorSeg, err)
	}
	if o.TargetSeg != o.InitiatorSeg {
		if err := probeSeg(r.agent, o.TargetSeg, o.TargetDevice, string(o.DRAMAlloc)); err != nil {
			return nil, segError("target", o.TargetSeg, err)
		}
	}
	if err := r.setupReference(size); err != nil {
		return nil, err
	}

	p := fleet.Proc{Name: "target", Addr: o.Target.Addr, Exe: o.Target.Exe, Args: o.Target.Args, DefaultArgs: []string{"serve", "target", "--stdio"},
		Env: o.Target.Env, Stderr: o.ChildStderr}
	if o.Target.Inproc {
		p.InProcess = xfertarget.Role(o.Log)
	}
	tc, err := fleet.Start(ctx, p)
	if err != nil {
		return nil, err
	}
	r.targetConn, r.target = tc, &xfertarget.Client{Client: tc.Client}
	res.Config.Target = tc.Where
	if p.InProcess == nil && o.Target.Addr != "" {
		res.Endpoints, res.Placement = runcore.DescribePeer(ctx, "target", o.Target.Addr, tc.Client)
	}
	rep, err := r.target.Call(xfertarget.Request{Op: "setup", Backend: backend.Name, Name: "xfer-target", Size: size, Progress: tprog.String(),
		Alloc: string(o.DRAMAlloc), HugePages: o.HugePages, Seg: o.TargetSeg.String(), Device: o.TargetDevice})
	if err != nil {
		return nil, err
	}
	r.raddr, r.rlen = rep.Addr, rep.Len
	if len(res.Endpoints) == 2 && rep.PID > 0 {
		res.Endpoints[1].PID = rep.PID
		if res.Placement == runcore.PlacementOneHost {
			r.ownPIDs = append(r.ownPIDs, rep.PID)
		}
	}
	res.Config.TargetAlloc = rep.Alloc
	res.Config.Reference = r.ref
	if r.remote, err = r.agent.LoadRemoteMD(rep.MD); err != nil {
		return nil, err
	}
	md, err := r.agent.LocalMD()
	if err != nil {
		return nil, err
	}
	if _, err := r.target.Call(xfertarget.Request{Op: "load_md", MD: md}); err != nil {
		return nil, err
	}
	info := r.agent.Info()
	res.Transports = info.Details
	r.transp = agentTransport(info, r.remote)
	if backend.Name == "nixl" {
		// NIXL's UCX plugin runs on the libucp this process loaded first,
		// which is the one nixlctl links: one soname per process.
		res.Env.UCX = ucx.Version()
		res.Env.NIXL = backend.Version()
	}
	ok = true
	return r, nil
}

// agentTransport is what carries the transfers to remote: the backend's
// own per-peer description where it has one (nixlctl's UCX layer), else
// all it says about itself (NIXL does not tell which UCX transports a
// peer's endpoint uses: its plugin, parameters and libucp file instead).
func agentTransport(info nixl.Info, remote string) string {
	if t := info.Details["transport:"+remote]; t != "" {
		return t
	}
	parts := make([]string, 0, len(info.Details))
	for k, v := range info.Details {
		parts = append(parts, k+"="+v)
	}
	sort.Strings(parts)
	return strings.Join(parts, "; ")
}

// segError says which side's memory the backend refused; a backend that
// cannot move that memory type at all is the user's choice to change.
func segError(side string, mem nixl.MemType, err error) error {
	flag := map[string]string{"initiator": "--mem", "target": "--target-mem"}[side]
	err = fmt.Errorf("%s %s: %w", flag, mem, err)
	if errors.Is(err, nixl.ErrMemType) {
		return errkind.BadInput(err)
	}
	return err
}

// probeSeg registers a small buffer of the target's memory type with the
// initiator's agent, so a backend that cannot move it says so up front.
func probeSeg(a nixl.Agent, mem nixl.MemType, dev int, alloc string) error {
	b, err := cuda.AllocSeg(a, mem, dev, 64<<10, alloc, false)
	if err != nil {
		return err
	}
	defer b.Free()
	if err := a.RegisterMem(b); err != nil {
		return err
	}
	return a.DeregisterMem(b)
}

// setupReference allocates what the same-run reference copies into.
func (r *xferRun) setupReference(size int) error {
	o := r.o
	var err error
	switch {
	case o.InitiatorSeg == nixl.DRAM && o.TargetSeg == nixl.DRAM:
		r.ref = "memcpy"
		r.scratch = make([]byte, size)
		for i := 0; i < len(r.scratch); i += 4096 {
			r.scratch[i] = 1 // fault the pages in before timing copies into them
		}
		return nil
	case o.InitiatorSeg == nixl.VRAM && o.TargetSeg == nixl.VRAM:
		r.ref = "cuda-d2d"
		r.vscratch, err = cuda.Alloc(o.Device, size)
	case o.InitiatorSeg == nixl.DRAM:
		// Host memory here, device memory there: time host<->device copies
		// with a device buffer on the target's GPU.
		r.ref = map[nixl.Op]string{nixl.Write: "cuda-h2d", nixl.Read: "cuda-d2h"}[o.Op]
		r.vscratch, err = cuda.Alloc(o.TargetDevice, size)
	default:
		r.ref = map[nixl.Op]string{nixl.Write: "cuda-d2h", nixl.Read: "cuda-h2d"}[o.Op]
	}
	if err != nil {
		return fmt.Errorf("reference buffer: %w", err)
	}
	return nil
}

func (r *xferRun) close() {
	if r.agent != nil {
		r.agent.Close()
	}
	if r.local != nil {
		r.local.Free()
	}
	if r.vscratch != nil {
		r.vscratch.Free()
	}
	if r.targetConn != nil {
		_ = r.targetConn.Close(10*time.Second, nil)
	}
}

// offsets places the batch's descriptors: nixlbench's j*block (mod the
// buffer), shifted per pipeline slot, or a random permutation of block
// slots when descriptors should be scattered.
func (r *xferRun) offsets(block, batch, slot int, rng *rand.Rand) []int {
	slots := r.rlen / block
	if slots < 1 {
		slots = 1
	}
	offs := make([]int, batch)
	var perm []int
	if r.o.DescOrder == DescRandom {
		perm = rng.Perm(slots)
	}
	for j := range offs {
		k := (slot*batch + j) % slots
		if perm != nil {
			k = perm[k]
		}
		offs[j] = k * block
	}
	return offs
}

// slotWalk gives a remade request its descriptors' offsets: its
// pipeline slot's fixed ones, or with spread the next batch of block
// slots through the whole buffer, wrapping at its end.
type slotWalk struct {
	r            *xferRun
	block, batch int
	rng          *rand.Rand
	fixed        [][]int // by pipeline slot
	spread       bool
	next         int // spread: the slot the next request takes
}

func (w *slotWalk) offsets(k int) []int {
	if !w.spread {
		return w.fixed[k]
	}
	w.next++
	return w.r.offsets(w.block, w.batch, w.next-1, w.rng)
}

func (r *xferRun) makeReq(block int, offs []int, notif bool) (nixl.XferReq, error) {
	ld := make([]nixl.Desc, len(offs))
	rd := make([]nixl.Desc, len(offs))
	for i, off := range offs {
		ld[i] = r.local.Desc(off, block)
		rd[i] = nixl.Desc{Addr: r.raddr + uint64(off), Len: uint64(block)}
	}
	var msg []byte
	if notif {
		r.notifSeq++
		msg = []byte(fmt.Sprintf("xfer-%d", r.notifSeq))
	}
	return r.agent.CreateXferReq(r.o.Op, r.o.InitiatorSeg, ld, r.o.TargetSeg, rd, r.remote, msg)
}

// wait polls a posted request until it leaves InProgress.
func (r *xferRun) wait(ctx context.Context, req nixl.XferReq) error {
	for i := 0; ; i++ {
		st, err := r.agent.XferStatus(req)
		switch st {
		case nixl.Done:
			return nil
		case nixl.Failed:
			return err
		}
		if i&1023 == 1023 && ctx.Err() != nil {
			return ctx.Err()
		}
	}
}

func (r *xferRun) point(ctx context.Context, idx, block, batch int) (XferPoint, error) {
	o := r.o
	iters, warm := o.iterations(block)
	rng := rand.New(rand.NewPCG(uint64(block), uint64(batch)))
	depth := o.PipelineDepth
	slotOffs := make([][]int, depth)
	reqs := make([]nixl.XferReq, depth)
	prep := report.NewHistogram()
	defer func() {
		for _, q := range reqs {
			if q != nil {
				_ = r.agent.ReleaseXferReq(q)
			}
		}
	}()
	for k := range reqs {
		slotOffs[k] = r.offsets(block, batch, k, rng)
		t0 := time.Now()
		q, err := r.makeReq(block, slotOffs[k], o.Notif)
		if err != nil {
			return XferPoint{}, err
		}
		prep.Record(time.Since(t0))
		reqs[k] = q
	}

	var samples [][2]time.Duration // post and transfer time per timed request
	walk := slotWalk{r: r, block: block, batch: batch, rng: rng, fixed: slotOffs, spread: o.Spread, next: depth}
	// run posts n requests keeping `depth` in flight; record says whether
	// to measure them.
	run := func(n int, record bool) error {
		posted, done := 0, 0
		active := make([]bool, depth)
		repost := func(k int) error {
			if (o.RecreateXfer || o.Spread) && posted >= depth {
				if err := r.agent.ReleaseXferReq(reqs[k]); err != nil {
					return err
				}
				reqs[k] = nil
				t0 := time.Now()
				q, err := r.makeReq(block, walk.offsets(k), o.Notif)
				if err != nil {
					return err
				}
				if record {
					prep.Record(time.Since(t0))
				}
				reqs[k] = q
			}
			st, err := r.agent.PostXferReq(reqs[k])
			if st == nixl.Failed {
				return fmt.Errorf("post: %w", err)
			}
			posted++
			active[k] = true
			return nil
		}
		for k := 0; k < depth && posted < n; k++ {
			if err := repost(k); err != nil {
				return err
			}
		}
		var pace nixl.PollPacer // Paced
		lastYield := time.Now()
		for spins := 0; done < n; spins++ {
			before := done
			for k := 0; k < depth; k++ {
				if !active[k] {
					continue
				}
				st, err := r.agent.XferStatus(reqs[k])
				if st == nixl.InProgress {
					continue
				}
				if st == nixl.Failed {
					return fmt.Errorf("transfer: %w", err)
				}
				active[k] = false
				done++
				if record {
					// Kept raw and binned after the timed loop, so the
					// histograms cost the measurement nothing.
					t := r.agent.Telemetry(reqs[k])
					samples = append(samples, [2]time.Duration{t.PostDuration, t.XferDuration})
				}
				if posted < n {
					if err := repost(k); err != nil {
						return err
					}
				}
			}
			if spins&4095 == 4095 && ctx.Err() != nil {
				return ctx.Err()
			}
			if spins&15 == 15 {
				// Yield about every millisecond: a goroutine that never
				// reschedules looks stuck to Go's sysmon, which then
				// preempts it and hands its P around every 10 ms and wakes
				// 400-1,900 times a second (sched_switch stacks of both
				// processes), each wake-up taking a core from this loop or
				// from the target (4 KiB requests: 0.77x
				// nixlbench without, 0.91x with, alternated six times).
				// By time, not by count: a 1 MiB pass takes 80 us, a
				// 4 KiB one under 1 us. The loop is not locked to a
				// thread: there a yield costs two thread switches (1 MiB
				// requests ran 0.87x locked, 0.91x not).
				if now := time.Now(); now.Sub(lastYield) > time.Millisecond {
					runtime.Gosched()
					lastYield = now
				}
			}
			if o.Paced && done < n {
				pace.After(done > before)
			}
		}
		return nil
	}
	if warm > 0 {
		if err := run(warm, false); err != nil {
			return XferPoint{}, err
		}
	}
	samples = make([][2]time.Duration, 0, iters)
	start := time.Now()
	if err := run(iters, true); err != nil {
		return XferPoint{}, err
	}
	elapsed := time.Since(start)
	return r.measured(ctx, idx, block, batch, iters, elapsed, samples, slotOffs[0], prep)
}

// measured is a point's result from its timed requests: bandwidth and
// latency histograms, the same-run copy reference, and the consistency
// check of what was moved.
func (r *xferRun) measured(ctx context.Context, idx, block, batch, iters int, elapsed time.Duration, samples [][2]time.Duration, offs []int, prep *report.Histogram) (XferPoint, error) {
	o := r.o
	post, tx, lat := report.NewHistogram(), report.NewHistogram(), report.NewHistogram()
	for _, sm := range samples {
		post.Record(sm[0])
		tx.Record(sm[1])
		lat.Record(sm[0] + sm[1])
	}
	if o.Notif {
		// Drain what the target received so its queue does not grow.
		if _, err := r.target.Call(xfertarget.Request{Op: "notifs"}); err != nil {
			return XferPoint{}, err
		}
	}

	bytes := int64(block) * int64(batch) * int64(iters)
	p := XferPoint{Backend: r.backend, Op: o.Op.String(), BlockSize: block, BatchSize: batch, Iterations: iters,
		Bytes: bytes, Seconds: elapsed.Seconds(), Transport: r.transp,
		BandwidthGBps: float64(bytes) / 1e9 / elapsed.Seconds(),
		AvgLatUS:      float64(elapsed.Microseconds()) / float64(iters*batch),
		LatencyUS:     lat.In(time.Microsecond), PrepUS: prep.In(time.Microsecond),
		PostUS: post.In(time.Microsecond), TxUS: tx.In(time.Microsecond),
		DescriptorsPerS: float64(iters*batch) / elapsed.Seconds()}
	p.PostNSPerDesc = p.PostUS.Mean * 1e3 / float64(batch)
	p.Histogram, _ = lat.Encode()
	p.TxHistogram, _ = tx.Encode()
	p.PostHistogram, _ = post.Encode()
	if !o.NoCopyReference {
		ref, err := r.reference(block, offs, elapsed)
		if err != nil {
			return XferPoint{}, fmt.Errorf("reference copy (%s): %w", r.ref, err)
		}
		p.MemcpyGBps = ref
		if p.MemcpyGBps > 0 {
			p.Efficiency = p.BandwidthGBps / p.MemcpyGBps
		}
	}
	if o.CheckConsistency {
		c, err := r.check(ctx, idx, block, batch)
		if err != nil {
			// The check could not run (the target gone, a post that
			// failed): the point failed, and that is no verdict on the
			// bytes. A lost target read "consistency FAILED" before.
			return XferPoint{}, fmt.Errorf("consistency check: %w", err)
		}
		p.Consistency = c
	}
	return p, nil
}

// reference measures, in this run, the copy that bounds a same-host
// transfer of this descriptor pattern: memcpy between two local buffers
// for DRAM, cuMemcpyDtoDAsync on the initiator's GPU for VRAM, host<->device
// copies for mixed runs. It copies for about as long as the transfer ran
// (20 ms to 1 s).
func (r *xferRun) reference(block int, offs []int, budget time.Duration) (float64, error) {
	budget = min(max(budget, 20*time.Millisecond), time.Second)
	spans := make([]nixl.Span, len(offs))
	for i, off := range offs {
		spans[i] = nixl.Span{Off: off, Len: block}
	}
	switch r.ref {
	case "memcpy":
		return r.memcpy(block, offs, budget), nil
	case "cuda-d2d":
		return cuda.D2DBandwidth(r.local, r.vscratch, spans, budget)
	}
	vbuf := r.local
	if r.o.InitiatorSeg == nixl.DRAM {
		vbuf = r.vscratch
	}
	return cuda.HostCopyBandwidth(vbuf, spans, r.ref == "cuda-h2d", budget)
}

// memcpy measures the copy bandwidth of the descriptor pattern between two
// local host buffers: the ceiling a same-host DRAM transfer can reach.
func (r *xferRun) memcpy(block int, offs []int, budget time.Duration) float64 {
	src := r.local.Bytes()
	if src == nil {
		return 0
	}
	var copied int64
	// Read the clock once per ~1 MiB of copies, not after every pass: for
	// one tiny block a pass is a few nanoseconds and the clock would
	// dominate what is measured.
	passes := max(1, (1<<20)/max(1, block*len(offs)))
	start := time.Now()
	for time.Since(start) < budget {
		for range passes {
			for _, off := range offs {
				copied += int64(copy(r.scratch[off:off+block], src[off:off+block]))
			}
		}
	}
	return float64(copied) / 1e9 / time.Since(start).Seconds()
}

// check moves one batch of tagged, distinct descriptors and verifies every
// byte at the receiver, so a misaddressed or partial block is caught. Its
// verdict is "ok (...)" or "FAILED: ..." (bytes that arrived wrong); an
// error says the check could not run.
func (r *xferRun) check(ctx context.Context, idx, block, batch int) (string, error) {
	slots := r.rlen / block
	n := min(batch, slots)
	if n == 0 {
		return "skipped: buffer smaller than a block", nil
	}
	rng := rand.New(rand.NewPCG(uint64(idx), 7))
	perm := rng.Perm(slots)[:n] // distinct destinations, scattered
	offs := make([]int, n)
	offs64 := make([]int64, n)
	for i, k := range perm {
		offs[i], offs64[i] = k*block, int64(k*block)
	}
	seed := uint64(idx + 1)
	spans := make([]nixl.Span, n)
	for i, off := range offs {
		spans[i] = nixl.Span{Off: off, Len: block}
	}
	key := func(i int) uint64 { return blocktag.Key(seed, uint64(i)) }
	if r.o.Op == nixl.Write {
		if err := blocktag.FillSpans(r.local, spans, key); err != nil {
			return "", err
		}
	} else if _, err := r.target.Call(xfertarget.Request{Op: "fill", Seed: seed, DescLen: block, Offsets: offs64}); err != nil {
		return "", err
	}
	q, err := r.makeReq(block, offs, false)
	if err != nil {
		return "", err
	}
	defer r.agent.ReleaseXferReq(q)
	if st, err := r.agent.PostXferReq(q); st == nixl.Failed {
		return "", fmt.Errorf("post: %w", err)
	}
	if err := r.wait(ctx, q); err != nil {
		return "", err
	}
	if r.o.Op == nixl.Write {
		rep, err := r.target.Call(xfertarget.Request{Op: "verify", Seed: seed, DescLen: block, Offsets: offs64})
		if err != nil {
			return "", err
		}
		if rep.Corrupt > 0 {
			return fmt.Sprintf("FAILED: %d of %d descriptors wrong; first: %s", rep.Corrupt, n, rep.First), nil
		}
		return fmt.Sprintf("ok (%d descriptors)", n), nil
	}
	c, err := blocktag.CheckSpans(r.local, spans, key)
	if err != nil {
		return "", err
	}
	if c.Bad > 0 {
		return fmt.Sprintf("FAILED: %d of %d descriptors wrong; first: %s", c.Bad, n, c.First), nil
	}
	return fmt.Sprintf("ok (%d descriptors)", n), nil
}

// xferPathEnds are bench xfer's endpoints: the initiator (this process)
// sends what it WRITEs and receives what it READs.
func xferPathEnds(op nixl.Op, target *ctl.Client) []runcore.PathEnd {
	ini, tgt := netpath.Send, netpath.Receive
	if op == nixl.Read {
		ini, tgt = tgt, ini
	}
	return []runcore.PathEnd{{Role: "initiator", Dir: ini}, {Role: "target", RPC: target, Dir: tgt}}
}

// xferPayload is what the sweep moved between the readings: every
// point's timed and warm-up requests (consistency checks, one batch a
// point, are left out).
func xferPayload(o *XferOptions, points []XferPoint) int64 {
	var n int64
	for _, p := range points {
		iters, warm := o.iterations(p.BlockSize)
		n += int64(p.BlockSize) * int64(p.BatchSize) * int64(iters+warm)
	}
	return n
}
