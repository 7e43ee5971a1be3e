package probe

/*
#cgo CFLAGS: -O2 -Wall
#include "churn.h"
*/
import "C"

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"
)

// ChurnConfig shapes the allocation churn a leak receiver makes: Slots
// live allocations, each replaced at random Rate times a second in all,
// with sizes between Min and Max bytes (log-uniform). The defaults are
// Python's and PyTorch's CPU allocations: 256 KiB arenas up to tensors of
// tens of MiB.
type ChurnConfig struct {
	Rate  float64 `json:"rate"`  // replacements per second (0: no churn)
	Slots int     `json:"slots"` // live allocations
	Min   int64   `json:"min"`   // bytes
	Max   int64   `json:"max"`   // bytes
}

// DefaultChurn is what `probe ucx-leak` uses unless told otherwise.
var DefaultChurn = ChurnConfig{Rate: 1000, Slots: 32, Min: 256 << 10, Max: 32 << 20}

// Validate checks the numbers.
func (c ChurnConfig) Validate() error {
	if c.Rate < 0 || c.Rate > 1e5 {
		return fmt.Errorf("churn rate %g: want 0..100000 allocations per second", c.Rate)
	}
	if c.Rate == 0 {
		return nil
	}
	if c.Slots <= 0 || c.Slots > 4096 {
		return fmt.Errorf("churn slots %d: want 1..4096", c.Slots)
	}
	if c.Min < 4096 || c.Max < c.Min || c.Max > 1<<30 {
		return fmt.Errorf("churn sizes %d..%d: want 4 KiB <= min <= max <= 1 GiB", c.Min, c.Max)
	}
	return nil
}

// churner runs the churn on a goroutine. mmap and munmap go through
// libc's wrappers (cgo), where UCX's hooks sit; Go's own syscall.Mmap
// makes raw system calls that no hook would see.
type churner struct {
	c      *C.nxp_churn_t
	mu     sync.Mutex // guards c against stats while stepping
	failed int64
	stop   context.CancelFunc
	done   chan struct{}
}

func startChurn(cfg ChurnConfig, seed uint64) (*churner, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.Rate == 0 {
		return nil, nil
	}
	c := C.nxp_churn_new(C.int(cfg.Slots), C.size_t(cfg.Min), C.size_t(cfg.Max), C.uint64_t(seed))
	if c == nil {
		return nil, errors.New("churn: out of memory")
	}
	ctx, cancel := context.WithCancel(context.Background())
	ch := &churner{c: c, stop: cancel, done: make(chan struct{})}
	go ch.run(ctx, cfg.Rate)
	return ch, nil
}

// run keeps the number of replacements at rate x elapsed time, catching
// up after a late tick (but by at most one second's worth).
func (ch *churner) run(ctx context.Context, rate float64) {
	defer close(ch.done)
	var done float64
	ticking(ctx, 10*time.Millisecond, func(elapsed time.Duration) {
		due := rate*elapsed.Seconds() - done
		if due > rate {
			done += due - rate
			due = rate
		}
		n := int(due)
		if n <= 0 {
			return
		}
		ch.mu.Lock()
		f := C.nxp_churn_step(ch.c, C.int(n))
		ch.failed += int64(f)
		ch.mu.Unlock()
		done += float64(n)
	})
}

// ticking calls fn every period with the time since it began, until ctx
// ends: the paced loops here follow wall time, not their ticks' count.
func ticking(ctx context.Context, period time.Duration, fn func(elapsed time.Duration)) {
	start := time.Now()
	tick := time.NewTicker(period)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		fn(time.Since(start))
	}
}

// stats reports replacements made, failed mmaps and the bytes mapped now.
func (ch *churner) stats() (ops, failed, live int64) {
	if ch == nil {
		return 0, 0, 0
	}
	ch.mu.Lock()
	defer ch.mu.Unlock()
	var o, l C.uint64_t
	C.nxp_churn_stats(ch.c, &o, &l)
	return int64(o), ch.failed, int64(l)
}

// close stops the churn and unmaps what it holds.
func (ch *churner) close() {
	if ch == nil {
		return
	}
	ch.stop()
	<-ch.done
	C.nxp_churn_free(ch.c)
	ch.c = nil
}

// leaker is the probe's self-test: it maps and touches MBPerS megabytes
// (10^6 bytes) a second and never frees them, so a run against it must
// say LEAK at about that rate.
type leaker struct {
	mu     sync.Mutex
	leaked int64
	failed error
	stop   context.CancelFunc
	done   chan struct{}
}

func startLeak(mbPerS float64) *leaker {
	if mbPerS <= 0 {
		return nil
	}
	ctx, cancel := context.WithCancel(context.Background())
	l := &leaker{stop: cancel, done: make(chan struct{})}
	go l.run(ctx, mbPerS*1e6)
	return l
}

// run maps whatever the rate says is due every 100 ms, so the growth
// follows wall time even when the machine is too busy to run it on time.
func (l *leaker) run(ctx context.Context, bytesPerS float64) {
	defer close(l.done)
	ticking(ctx, 100*time.Millisecond, func(elapsed time.Duration) {
		l.mu.Lock()
		due := int64(bytesPerS*elapsed.Seconds()) - l.leaked
		if due >= 4096 && l.failed == nil {
			if C.nxp_leak(C.size_t(due)) != 0 {
				l.failed = fmt.Errorf("self-test leak: mmap of %d bytes failed", due)
			} else {
				l.leaked += due
			}
		}
		l.mu.Unlock()
	})
}

func (l *leaker) bytes() int64 {
	if l == nil {
		return 0
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.leaked
}

func (l *leaker) close() {
	if l == nil {
		return
	}
	l.stop()
	<-l.done
}
