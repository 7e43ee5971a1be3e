package engine

import (
	"io"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"
	"golang.org/x/sys/unix"
)

func schedPolicy(t *testing.T) uint32 {
	t.Helper()
	attr, err := unix.SchedGetAttr(0, 0)
	if err != nil {
		t.Fatalf("sched_getattr: %v", err)
	}
	return attr.Policy
}

// TestHarnessRunsAtIdlePriority: the tag work runs on a SCHED_IDLE
// thread, and the caller's thread keeps its priority.
func TestHarnessRunsAtIdlePriority(t *testing.T) {
	defer goleak.VerifyNone(t)
	h := newHarnessCPU(2, slog.New(slog.NewTextHandler(io.Discard, nil)))
	defer h.close()
	var inside uint32
	var insideErr error
	h.Do(func() {
		attr, err := unix.SchedGetAttr(0, 0)
		if err != nil {
			insideErr = err
			return
		}
		inside = attr.Policy
	})
	if insideErr != nil {
		t.Fatalf("sched_getattr on the worker: %v", insideErr)
	}
	if inside != unix.SCHED_IDLE {
		t.Errorf("the work ran under policy %d, want SCHED_IDLE (%d)", inside, unix.SCHED_IDLE)
	}
	if p := schedPolicy(t); p == unix.SCHED_IDLE {
		t.Errorf("the caller's thread is in SCHED_IDLE after Do")
	}
	if got := h.priority(); got != "idle priority" {
		t.Errorf("priority() = %q, want %q", got, "idle priority")
	}
}

// TestHarnessStaysNormalWhereIdleIsOneWay: where a thread could enter
// SCHED_IDLE but not leave it (an unprivileged process without
// RLIMIT_NICE), a starved job could never be raised, so the workers run
// at normal priority and say why. fakeNoReturnFromIdle stands in for
// such a kernel.
func TestHarnessStaysNormalWhereIdleIsOneWay(t *testing.T) {
	defer goleak.VerifyNone(t)
	fakeNoReturnFromIdle := func(tid int, policy uint32) error {
		if policy == unix.SCHED_NORMAL {
			return unix.EPERM
		}
		return setSchedPolicy(tid, policy)
	}
	h := newHarnessCPUWith(1, slog.New(slog.NewTextHandler(io.Discard, nil)), fakeNoReturnFromIdle)
	defer h.close()
	var policy uint32 = 99
	h.Do(func() {
		if attr, err := unix.SchedGetAttr(0, 0); err == nil {
			policy = attr.Policy
		}
	})
	if policy != unix.SCHED_NORMAL {
		t.Errorf("the job ran under policy %d, want SCHED_NORMAL", policy)
	}
	if got := h.priority(); !strings.HasPrefix(got, "normal priority (") || !strings.Contains(got, "could not leave SCHED_IDLE") {
		t.Errorf("priority() = %q, want normal priority and why", got)
	}
}

// TestHarnessDoesEveryJob: concurrent callers each get their own job
// done before Do returns, and a Do after close still runs its job.
func TestHarnessDoesEveryJob(t *testing.T) {
	defer goleak.VerifyNone(t)
	h := newHarnessCPU(2, slog.New(slog.NewTextHandler(io.Discard, nil)))
	const callers = 16
	done := make([]bool, callers)
	var wg sync.WaitGroup
	for i := range callers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			h.Do(func() { done[i] = true })
			if !done[i] {
				t.Errorf("Do %d returned before its job ran", i)
			}
		}()
	}
	wg.Wait()
	h.close()
	ran := false
	h.Do(func() { ran = true })
	if !ran {
		t.Error("a Do after close did not run its job")
	}
	h.close() // a second close does nothing
}

// TestHarnessRaisesAStarvedJob: a job that gets no CPU for a window
// (here it sleeps, which a starved thread cannot tell apart from
// waiting for a core) runs the rest at normal priority, the next job
// is back at idle priority, and priority() counts the raise.
func TestHarnessRaisesAStarvedJob(t *testing.T) {
	defer goleak.VerifyNone(t)
	h := newHarnessCPU(1, slog.New(slog.NewTextHandler(io.Discard, nil)))
	defer h.close()
	h.window = 10 * time.Millisecond
	policy := func() uint32 {
		attr, err := unix.SchedGetAttr(0, 0)
		if err != nil {
			t.Errorf("sched_getattr: %v", err)
			return 0
		}
		return attr.Policy
	}
	var during, next uint32
	h.Do(func() {
		time.Sleep(5 * h.window)
		during = policy()
	})
	h.Do(func() { next = policy() })
	if during != unix.SCHED_NORMAL {
		t.Errorf("a job that got no CPU for a window still runs under policy %d, want SCHED_NORMAL", during)
	}
	if next != unix.SCHED_IDLE {
		t.Errorf("the job after a raised one runs under policy %d, want SCHED_IDLE", next)
	}
	if got := h.priority(); !strings.Contains(got, "1 of 2 jobs raised") {
		t.Errorf("priority() = %q, want it to count 1 of 2 jobs raised", got)
	}
}

// threadPolicy is thread tid's scheduling policy.
func threadPolicy(t *testing.T, tid int) uint32 {
	t.Helper()
	attr, err := unix.SchedGetAttr(tid, 0)
	if err != nil {
		t.Fatalf("sched_getattr %d: %v", tid, err)
	}
	return attr.Policy
}

// TestHarnessWaitsAtNormalPriority: a worker is at idle priority only
// while it runs a job. Between jobs it waits at normal priority, so a
// process killed on busy cores is not kept alive (its sockets open)
// while its idle workers wait their turn to exit; and close raises a
// job still running, so the engine's close does not wait for it either.
func TestHarnessWaitsAtNormalPriority(t *testing.T) {
	defer goleak.VerifyNone(t)
	h := newHarnessCPU(1, slog.New(slog.NewTextHandler(io.Discard, nil)))
	var tid int
	h.Do(func() { tid = unix.Gettid() })
	if p := threadPolicy(t, tid); p != unix.SCHED_NORMAL {
		t.Errorf("a worker waiting for work is under policy %d, want SCHED_NORMAL", p)
	}
	started, release := make(chan struct{}), make(chan struct{})
	var during uint32
	go h.Do(func() {
		during = threadPolicy(t, unix.Gettid())
		close(started)
		<-release
	})
	<-started
	if during != unix.SCHED_IDLE {
		t.Errorf("the job ran under policy %d, want SCHED_IDLE", during)
	}
	closed := make(chan struct{})
	go func() { h.close(); close(closed) }()
	deadline := time.Now().Add(10 * time.Second)
	for threadPolicy(t, tid) != unix.SCHED_NORMAL {
		if time.Now().After(deadline) {
			t.Fatal("close did not raise the job running at idle priority")
		}
		time.Sleep(time.Millisecond)
	}
	close(release)
	<-closed
}
