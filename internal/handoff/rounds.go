package handoff

import (
	"context"
	"fmt"
	"math"
	"slices"
	"sync"

	"github.com/nixlctl/nixlctl/internal/engine"
	"github.com/nixlctl/nixlctl/internal/live"
	"github.com/nixlctl/nixlctl/internal/nixl"
	"github.com/nixlctl/nixlctl/internal/report"
	"github.com/nixlctl/nixlctl/internal/runcore"
	"github.com/nixlctl/nixlctl/internal/xferbench"
)

// roundsFor returns how many requests a round holds: rounds of at least
// four times the concurrency (shorter ones are mostly a pipeline's ramp),
// at most want of them.
func roundsFor(requests, concurrency, want int) int {
	n := max(1, min(want, requests/max(1, 4*concurrency)))
	return (requests + n - 1) / n
}

// between measures round k's references; the handoff's requests of round
// k have all finished and none of round k+1 has started (last: there is
// none, so the pools are not touched for it).
func (il *interleave) between(ctx context.Context, k int, last bool) {
	if il.off != "" || ctx.Err() != nil {
		return
	}
	il.h.readCPU()
	cpu := il.h.cpuReadings()
	if il.xfer == nil {
		if err := il.setup(ctx); err != nil {
			il.off = err.Error()
			return
		}
	}
	roundBytes := int64(0)
	il.h.mu.Lock()
	for _, r := range il.h.records {
		if r.Round == k && !r.Warmup && r.Error == "" {
			roundBytes += r.Bytes
		}
	}
	il.h.mu.Unlock()
	if roundBytes == 0 {
		return // nothing moved: nothing to compare
	}
	iters := max(1, int(math.Round(float64(roundBytes)/float64(il.block*il.batch))))
	ref := roundRefs{}
	if len(cpu) > 0 {
		ref.cpuNS = cpu[len(cpu)-1].Slowest()
	}
	live.Emit(il.h.o.Live, live.Phase{Text: fmt.Sprintf("bench xfer reference, round %d", k+1)})
	for _, m := range []struct {
		run *xferbench.Session
		to  *float64
	}{{il.xfer, &ref.xfer}, {il.limit, &ref.limit}} {
		if m.run == nil {
			continue
		}
		// Every round warms its buffers first, untimed: they sat out the
		// handoff's round, and on a host that reclaims idle memory
		// (TouchPools) the first pass over them was the reference's alone.
		warmup := m.run.Options().PipelineDepth
		p, err := m.run.Point(ctx, k, il.block, il.batch, iters, warmup)
		if err != nil {
			if ctx.Err() == nil {
				il.off = fmt.Sprintf("round %d: %v", k+1, err)
			}
			return
		}
		*m.to = p.BandwidthGBps
	}
	if !last {
		ref.touchMS = il.touchPools(ctx)
	}
	live.Emit(il.h.o.Live, live.Phase{Text: "measuring"})
	il.mu.Lock()
	for len(il.refs) <= k {
		il.refs = append(il.refs, roundRefs{})
	}
	il.refs[k] = ref
	il.mu.Unlock()
}

// touchPools has every endpoint read a byte of each page of its pools
// (engine.TouchPools) before the next handoff round, so that the round
// does not start on memory the host reclaimed while the references ran;
// it returns the slowest endpoint's time in ms. An endpoint that cannot
// (a build from before "touch") is left as it is, once said.
func (il *interleave) touchPools(ctx context.Context) float64 {
	h := il.h
	eps := slices.Concat(h.pes, h.des)
	took := make([]int64, len(eps))
	var wg sync.WaitGroup
	for i, ep := range eps {
		wg.Go(func() {
			var r engine.TouchReply
			if err := ep.rpc.Call(ctx, "touch", nil, &r); err != nil {
				il.touchOnce.Do(func() { h.o.Log.Warn("pools not touched before the handoff rounds", "err", err) })
				return
			}
			took[i] = r.NS
		})
	}
	wg.Wait()
	return float64(slices.Max(took)) / 1e6
}

// setup starts the reference's initiator and target (and the limit's)
// with the first round's mean descriptor, as xferReference does after a
// whole run, while the engines keep their pools: it refuses when the
// host's available memory cannot hold both.
func (il *interleave) setup(ctx context.Context) error {
	h := il.h
	var bytes int64
	descs, n := 0, 0
	h.mu.Lock()
	for _, r := range h.records {
		if r.Round == 0 && !r.Warmup && r.Error == "" && r.Bytes > 0 {
			bytes += r.Bytes
			descs += r.Descriptors
			n++
		}
	}
	h.mu.Unlock()
	if n == 0 || descs == 0 {
		return fmt.Errorf("the first round moved no bytes")
	}
	il.batch = max(1, int(math.Round(float64(descs)/float64(n))))
	il.block = max(8, int(bytes/int64(descs))/8*8)
	depth := max(1, h.o.Concurrency)
	set := int64(il.block) * int64(il.batch) * int64(depth)
	// Initiator and target each hold the working set; the limit's pair
	// too. Half of what is available, as the pools are sized.
	avail := runcore.MemAvailable()
	if avail > 0 && 2*set > avail/2 {
		return fmt.Errorf("its working set (2 x %s) does not fit beside the engines' pools in half of the %s available", report.Bytes(set), report.Bytes(avail))
	}
	// The handoff moves its blocks over a whole pool on each side, and a
	// copy runs slower the more memory it walks: the reference walks a
	// rank's pool's worth too, where that fits (both references' pairs).
	sides := int64(2)
	if il.wantLimit(set, avail) {
		sides = 4
	}
	il.span = h.referenceSpan(set, sides, avail)
	xo := h.referenceOptions(il.backend, il.block, il.batch, h.o.DRAMAlloc)
	if il.span > 0 {
		xo.TotalBufferSize, xo.Spread = runcore.ByteSize(il.span), true
	}
	var err error
	if il.xfer, err = xferbench.StartSession(ctx, xo); err != nil {
		return err
	}
	if il.wantLimit(set, avail) {
		lo := h.referenceOptions(il.backend, il.block, il.batch, engine.AllocUCX)
		lo.TotalBufferSize, lo.Spread = xo.TotalBufferSize, xo.Spread
		if il.limit, err = xferbench.StartSession(ctx, lo); err != nil {
			h.o.Log.Warn("the host-limit reference (UCX-allocated memory) did not start", "err", err)
			il.limit = nil
		}
	}
	return nil
}

// wantLimit says whether the rounds also measure the host's limit (the
// same transfers between UCX-allocated memory): on one host, over ucx,
// from DRAM not already UCX's, with room for a second pair of working
// sets of set bytes.
func (il *interleave) wantLimit(set, avail int64) bool {
	o := il.h.o
	return il.backend == "ucx" && o.Mem == nixl.DRAM && !o.remote() && o.DRAMAlloc != engine.AllocUCX && 4*set <= avail/2
}

// referenceSpan is the memory each side of a reference walks: one rank's
// KV pool on the first prefill, what a request's blocks are taken from,
// or as much of it as sides of it fit in half of avail (0 or less:
// unknown, taken as room); 0, the pipeline's slots only, when that is no
// more than the pipeline's set. A pool too large to walk whole once fell
// back to the slots: with --isl-dist uniform 1024-3072 (larger pools)
// that reference ran 4.7-4.9 GB/s against 4.1-4.4 over a pool, and the
// handoff read 0.83-0.88 of it against 0.91-0.96 with fixed prompts.
func (h *handoff) referenceSpan(set, sides, avail int64) int64 {
	if len(h.psetups) == 0 {
		return 0
	}
	s := h.psetups[0]
	span := s.PoolBytes / int64(max(1, s.TP)*max(1, s.PP))
	if avail > 0 {
		span = min(span, avail/2/max(1, sides))
	}
	if span <= set {
		return 0
	}
	return span
}

// close stops the references' processes and frees their buffers; a
// second call does nothing.
func (il *interleave) close() {
	for _, r := range []**xferbench.Session{&il.xfer, &il.limit} {
		if *r != nil {
			(*r).Close()
			*r = nil
		}
	}
}

// config says what the rounds compared the handoff with.
func (il *interleave) config(rounds int) *XferReference {
	if il.xfer == nil {
		return nil
	}
	o := il.xfer.Options()
	ref := &XferReference{Op: o.Op.String(), BlockSize: il.block, BatchSize: il.batch, PipelineDepth: o.PipelineDepth,
		Polling: "paced", Rounds: rounds, RoundRequests: il.size, Target: il.h.o.XferTarget, SpanBytes: il.span}
	if il.limit != nil {
		ref.Limit = "the same transfers between UCX-allocated memory (--dram-alloc ucx: UCX's shared-memory path)"
	}
	return ref
}

// roundRefsCopy returns the rounds' references measured so far.
func (il *interleave) roundRefsCopy() []roundRefs {
	il.mu.Lock()
	defer il.mu.Unlock()
	return append([]roundRefs(nil), il.refs...)
}

// referenceOptions are bench xfer's options for the same transfers as
// the handoff's: its mean descriptor, as many in flight as the run had,
// the same direction, each request carrying a notification, progressed
// as the engines are.
func (h *handoff) referenceOptions(backend string, block, batch int, alloc engine.DRAMAlloc) xferbench.XferOptions {
	depth := max(1, h.o.Concurrency)
	// Paced: the endpoints wait for their transfers with sleeps between
	// polls (a nixl.Poller per rank; push's owner polls every millisecond), which
	// leaves the CPU to the copy; a reference spinning on its requests
	// took a core from a copy that needs both on small hosts (UCX's
	// emulated RMA copies on both sides), and push ran 1.12-1.16x it.
	// Notif: every handoff transfer carries its completion notification
	// (pull's READ, push's and SGLang's WRITEs), so every reference
	// request does too.
	xo := xferbench.XferOptions{Backend: backend, Op: nixl.Write, StartBlock: runcore.ByteSize(block), MaxBlock: runcore.ByteSize(block), StartBatch: batch, MaxBatch: batch,
		NumIter: 10 * depth, WarmupIter: depth, LargeBlkIterFtr: 1, PipelineDepth: depth, DRAMAlloc: alloc, DescOrder: xferbench.DescSequential, Paced: true, Notif: true, NoCopyReference: true,
		// Progressed as the engines are, so the reference is the same path.
		Progress:        xferbench.XferThread,
		TotalBufferSize: runcore.ByteSize(block * batch * depth), Target: xferbench.TargetSpec{Inproc: h.o.Inproc, Addr: h.o.XferTarget, Exe: h.o.Exe, Env: h.o.ChildEnv}, ChildStderr: h.o.ChildStderr, Log: h.o.Log}
	// The same memory as the pools: GPU memory on the engines' GPUs, the
	// initiator being the side that posts (prefill for WRITEs, decode for
	// pull's READs).
	xo.InitiatorSeg, xo.TargetSeg = h.o.Mem, h.o.Mem
	xo.Device, xo.TargetDevice = h.o.Device, h.o.DecodeDevice
	if h.o.Protocol == engine.ProtoPull {
		xo.Op = nixl.Read
		xo.Device, xo.TargetDevice = h.o.DecodeDevice, h.o.Device
	}
	if !h.o.Inproc && h.o.XferTarget == "" && h.o.Exe != "" {
		xo.Target.Args = append(append([]string(nil), h.o.ExeArgs...), "target", "--stdio")
	}
	return xo
}
