package engine

import (
	"fmt"
	"log/slog"
	"runtime"
	"sync"
	"sync/atomic"

	"github.com/nixlctl/nixlctl/internal/nixl"
	"golang.org/x/sys/unix"
)

// harnessCPU runs the work nixlctl adds to every request and no serving
// engine does, the tag fill that stands in for prefill's compute and
// decode's tag check, on threads at the kernel's idle priority
// (SCHED_IDLE): that work gets the CPU the transfer leaves over instead
// of CPU the transfer needs. On two cores UCX's emulated READ keeps both
// busy (prefill's progress thread copies into the FIFO, decode's copies
// out), and the fill and check at normal priority took 1.6 ms of CPU a
// 256 MiB request from them: bench pull moved 6.25 GB/s with them and
// 6.60 without (a measurement only; llama-3.1-8b, 2048 tokens,
// concurrency 4, four runs each, alternated). At idle priority it moves
// 6.35-6.46 against 6.15-6.18 (three runs and two, alternated), push 5.68-5.90
// against 5.58-5.82. A real prefill computes on its GPU; a check that
// waits for idle CPU delays only decode's reply, not the transfer it
// checks (TReady is stamped before it). nice 10 changed nothing: a
// niced thread still takes its share of a busy core, an idle one only
// what nobody else wants.
type harnessCPU struct {
	jobs    chan func()
	closed  chan struct{}
	once    sync.Once
	wg      sync.WaitGroup
	refused atomic.Pointer[string] // why a worker runs at normal priority
}

// newHarnessCPU starts n workers, each on an OS thread of its own at
// idle priority. A kernel that refuses SCHED_IDLE leaves a worker at
// normal priority, logged once per worker: the work still runs.
func newHarnessCPU(n int, log *slog.Logger) *harnessCPU {
	h := &harnessCPU{jobs: make(chan func()), closed: make(chan struct{})}
	var started sync.WaitGroup // so priority() knows from the start
	h.wg.Add(n)
	started.Add(n)
	for range n {
		go h.work(log, &started)
	}
	started.Wait()
	return h
}

func (h *harnessCPU) work(log *slog.Logger, started *sync.WaitGroup) {
	defer h.wg.Done()
	// Never unlocked: when this goroutine ends its thread ends with it,
	// so no other goroutine ever runs at this priority.
	runtime.LockOSThread()
	if err := setIdlePriority(); err != nil {
		why := err.Error()
		h.refused.Store(&why)
		log.Warn("tag fill and check run at normal priority and take CPU from the transfers", "err", err)
	}
	started.Done()
	for {
		select {
		case job := <-h.jobs:
			job()
		case <-h.closed:
			return
		}
	}
}

// setIdlePriority puts the calling thread in SCHED_IDLE.
func setIdlePriority() error {
	attr := unix.SchedAttr{Size: unix.SizeofSchedAttr, Policy: unix.SCHED_IDLE}
	if err := unix.SchedSetAttr(0, &attr, 0); err != nil {
		return fmt.Errorf("sched_setattr SCHED_IDLE: %w", err)
	}
	return nil
}

// onHarness runs rk's tag work f on a harness worker; with a pool in
// device memory f stays on the caller's thread, which holds the CUDA
// context its staged copies need.
func (e *Engine) onHarness(rk *rank, f func()) {
	if rk.buf != nil && rk.buf.Mem == nixl.VRAM {
		f()
		return
	}
	e.harness.Do(f)
}

// Do runs f on a worker and returns when it has; after close it runs f
// on the caller's thread.
func (h *harnessCPU) Do(f func()) {
	done := make(chan struct{})
	select {
	case h.jobs <- func() { defer close(done); f() }:
		// A worker took it (jobs is unbuffered) and runs it even if
		// close comes meanwhile.
		<-done
	case <-h.closed:
		f()
	}
}

// priority says where the tag work runs, for Stats.TagWork: "idle
// priority", or "normal priority (why)".
func (h *harnessCPU) priority() string {
	if why := h.refused.Load(); why != nil {
		return "normal priority (" + *why + ")"
	}
	return "idle priority"
}

// close stops the workers once their jobs are done.
func (h *harnessCPU) close() {
	h.once.Do(func() { close(h.closed) })
	h.wg.Wait()
}
