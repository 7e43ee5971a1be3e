package engine

import (
	"fmt"
	"log/slog"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"
)

// harnessCPU runs the work nixlctl adds to every request and no serving
// engine does, the tag fill that stands in for prefill's compute and
// decode's tag check, on threads at the kernel's idle priority
// (SCHED_IDLE): that work gets the CPU the transfer leaves over instead
// of CPU the transfer needs. On two cores UCX's emulated READ keeps both
// busy (prefill's progress thread copies into the FIFO, decode's copies
// out), and the fill and check at normal priority took 1.6 ms of CPU a
// 256 MiB request from them (BenchmarkPoolTagsCold, HND: fill 0.82 ms,
// check 0.78): bench pull moved 6.25 GB/s with them and
// 6.60 without (a measurement only; llama-3.1-8b, 2048 tokens,
// concurrency 4, four runs each, alternated). At idle priority it moves
// 6.35-6.46 against 6.15-6.18 (three runs and two, alternated), push 5.68-5.90
// against 5.58-5.82. A real prefill computes on its GPU; a check that
// waits for idle CPU delays only decode's reply, not the transfer it
// checks (TReady is stamped before it). nice 10 changed nothing: a
// niced thread still takes its share of a busy core, an idle one only
// what nobody else wants.
//
// Idle priority must not mean never: on a host whose cores something
// else keeps busy (two `yes > /dev/null` here), an idle thread gets a
// few thousandths of a core, and starved fills took bench pull to 0.61
// GB/s against 1.24 with the tag work at normal priority. So a job that
// gets less than starvedShare of a core over a starveWindow is raised
// to normal priority until it ends: 1.40 GB/s there, and on the quiet
// host 6.45-6.49 GB/s as without the guard (6.44-6.50; 17 of 130 jobs
// raised).
type harnessCPU struct {
	jobs    chan *harnessJob
	closed  chan struct{}
	mu      sync.Mutex
	workers []*harnessWorker
	once    sync.Once
	wg      sync.WaitGroup
	refused atomic.Pointer[string] // why a worker runs at normal priority
	jobsRun atomic.Int64
	raised  atomic.Int64 // jobs raised to normal priority

	window    time.Duration // starveWindow; tests shorten it
	share     float64       // starvedShare
	setPolicy func(tid int, policy uint32) error
}

// The starvation guard: a window long enough that the idle moments
// between two copies add up (at concurrency 4 a fill's 1 ms of CPU
// took 37 ms p50 on two busy cores, 125 ms at most), a share well above
// what SCHED_IDLE gets from a busy core.
const (
	starveWindow = 50 * time.Millisecond
	starvedShare = 0.01
)

type harnessJob struct {
	f      func()
	worker chan *harnessWorker // sent when the worker starts f
	done   chan struct{}
	raised bool // the guard raised the worker for this job; under the worker's mu
}

// harnessWorker is one worker's thread. mu orders the guard's raise
// against the job's end, so a raise never outlives its job.
//
// A worker is at idle priority only while it runs a job: one waiting
// for work waits at normal priority. A thread must be scheduled to die,
// and on cores that something else keeps busy a SCHED_IDLE thread waits
// about a second for its turn: a decode SIGKILLed under load took 2.5 to
// 3.7 s to close its sockets (its idle workers exiting one by one), the
// driver saw the death that late, and closing a prefill waited as long
// for its workers to see the end.
type harnessWorker struct {
	tid     int
	mu      sync.Mutex
	closing bool // close raised it: it stays at normal priority
}

// newHarnessCPU starts n workers, each on an OS thread of its own at
// idle priority. Where the kernel refuses SCHED_IDLE, or would not let
// a starved job back out of it (an unprivileged process with
// RLIMIT_NICE below 20, without CAP_SYS_NICE), the workers run at
// normal priority, with a warning: the work still runs, and never
// starves.
func newHarnessCPU(n int, log *slog.Logger) *harnessCPU {
	return newHarnessCPUWith(n, log, setSchedPolicy)
}

func newHarnessCPUWith(n int, log *slog.Logger, setPolicy func(tid int, policy uint32) error) *harnessCPU {
	h := &harnessCPU{jobs: make(chan *harnessJob), closed: make(chan struct{}), window: starveWindow, share: starvedShare, setPolicy: setPolicy}
	if err := h.probe(); err != nil {
		why := err.Error()
		h.refused.Store(&why)
		log.Warn("tag fill and check run at normal priority and take CPU from the transfers", "err", err)
	}
	idle := h.refused.Load() == nil
	h.wg.Add(n)
	for range n {
		go h.work(idle)
	}
	return h
}

// probe tries the round trip a starved job needs, into SCHED_IDLE and
// back, on a thread of its own that ends with it (it may be left idle).
func (h *harnessCPU) probe() error {
	res := make(chan error, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread ends here
		tid := unix.Gettid()
		if err := h.setPolicy(tid, unix.SCHED_IDLE); err != nil {
			res <- err
			return
		}
		if err := h.setPolicy(tid, unix.SCHED_NORMAL); err != nil {
			res <- fmt.Errorf("a starved job could not leave SCHED_IDLE again (that needs CAP_SYS_NICE or RLIMIT_NICE 20: ulimit -e 20, or nice 0 in limits.conf): %w", err)
			return
		}
		res <- nil
	}()
	return <-res
}

func (h *harnessCPU) work(idle bool) {
	defer h.wg.Done()
	// Never unlocked: when this goroutine ends its thread ends with it,
	// so no other goroutine ever runs at this priority.
	runtime.LockOSThread()
	w := &harnessWorker{tid: unix.Gettid()}
	h.mu.Lock()
	h.workers = append(h.workers, w)
	h.mu.Unlock()
	for {
		select {
		case job := <-h.jobs:
			if idle {
				w.mu.Lock()
				if !w.closing {
					_ = h.setPolicy(w.tid, unix.SCHED_IDLE)
				}
				w.mu.Unlock()
			}
			job.worker <- w
			job.f()
			w.mu.Lock()
			if idle && !job.raised && !w.closing {
				_ = h.setPolicy(w.tid, unix.SCHED_NORMAL)
			}
			close(job.done)
			w.mu.Unlock()
		case <-h.closed:
			return
		}
	}
}

// setSchedPolicy puts thread tid in policy (SCHED_IDLE or SCHED_NORMAL).
func setSchedPolicy(tid int, policy uint32) error {
	attr := unix.SchedAttr{Size: unix.SizeofSchedAttr, Policy: policy}
	if err := unix.SchedSetAttr(tid, &attr, 0); err != nil {
		name := "SCHED_IDLE"
		if policy == unix.SCHED_NORMAL {
			name = "SCHED_NORMAL"
		}
		return fmt.Errorf("sched_setattr %s: %w", name, err)
	}
	return nil
}

// threadCPU is how much CPU thread tid of this process has used.
func threadCPU(tid int) (time.Duration, error) {
	// MAKE_THREAD_CPUCLOCK(tid, CPUCLOCK_SCHED) from linux/posix-timers.h.
	clock := int32(^uint32(tid)<<3 | 6)
	var ts unix.Timespec
	if err := unix.ClockGettime(clock, &ts); err != nil {
		return 0, err
	}
	return time.Duration(ts.Nano()), nil
}

// onHarness runs tag work f on a harness worker, or on the caller's
// thread in an engine without one (VRAM pools: the staged copies need
// the caller's CUDA context).
func (e *Engine) onHarness(f func()) {
	if e.harness == nil {
		f()
		return
	}
	e.harness.Do(f)
}

// Do runs f on a worker and returns when it has; after close it runs f
// on the caller's thread. While it waits it raises a starved worker.
func (h *harnessCPU) Do(f func()) {
	h.jobsRun.Add(1)
	job := &harnessJob{f: f, worker: make(chan *harnessWorker, 1), done: make(chan struct{})}
	select {
	case h.jobs <- job:
		// A worker took it (jobs is unbuffered) and runs it even if
		// close comes meanwhile.
	case <-h.closed:
		f()
		return
	}
	h.guard(job, <-job.worker)
}

// guard waits for job and raises its worker to normal priority once it
// got less than h.share of a core over h.window.
func (h *harnessCPU) guard(job *harnessJob, w *harnessWorker) {
	if h.refused.Load() != nil {
		<-job.done // at normal priority already
		return
	}
	tick := time.NewTicker(h.window)
	defer tick.Stop()
	last, err := threadCPU(w.tid)
	for {
		select {
		case <-job.done:
			return
		case <-tick.C:
		}
		if err != nil {
			continue // no clock to judge by: leave it idle
		}
		var now time.Duration
		if now, err = threadCPU(w.tid); err != nil {
			continue
		}
		if float64(now-last) < h.share*float64(h.window) {
			w.mu.Lock()
			select {
			case <-job.done: // ended meanwhile: nothing to raise
			default:
				if h.setPolicy(w.tid, unix.SCHED_NORMAL) == nil {
					job.raised = true
					h.raised.Add(1)
				}
			}
			w.mu.Unlock()
			<-job.done
			return
		}
		last = now
	}
}

// tagWork is Stats.TagWork: where this engine's tag work runs.
func (e *Engine) tagWork() string {
	if e.harness == nil {
		return "the caller's thread (VRAM pools: staged copies)"
	}
	return e.harness.priority()
}

// priority says where the tag work runs: "idle priority", or "normal
// priority (why)".
func (h *harnessCPU) priority() string {
	if why := h.refused.Load(); why != nil {
		return "normal priority (" + *why + ")"
	}
	if n := h.raised.Load(); n > 0 {
		return fmt.Sprintf("idle priority (%d of %d jobs raised to normal after starving)", n, h.jobsRun.Load())
	}
	return "idle priority"
}

// close stops the workers once their jobs are done; nil (no harness)
// does nothing.
func (h *harnessCPU) close() {
	if h == nil {
		return
	}
	h.once.Do(func() {
		// A job running at idle priority would hold the close (and the
		// engine's) for as long as the busy cores leave it waiting.
		h.mu.Lock()
		for _, w := range h.workers {
			w.mu.Lock()
			if h.refused.Load() == nil {
				_ = h.setPolicy(w.tid, unix.SCHED_NORMAL) // a waiting one is there already
			}
			w.closing = true
			w.mu.Unlock()
		}
		h.mu.Unlock()
		close(h.closed)
	})
	h.wg.Wait()
}
