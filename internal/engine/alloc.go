package engine

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"time"
)

// BlockAllocator hands out block ids of a pool, shared by all TP ranks of
// an engine (one block table per request, as the engines' schedulers keep
// it).
type BlockAllocator struct {
	mu        sync.Mutex
	used      []bool
	nfree     int
	scattered bool
	rng       *rand.Rand
	hint      int // where the next first-fit search starts
	// freed is closed (and replaced) by every Free, waking AllocWait.
	freed chan struct{}
}

// NewBlockAllocator manages blocks 0..n-1. Contiguous allocation gives a
// request one run of consecutive blocks when there is one (first fit),
// so descriptors can merge; scattered allocation picks random free blocks,
// a fragmented block table whose descriptors cannot merge.
func NewBlockAllocator(n int, scattered bool, seed uint64) *BlockAllocator {
	return &BlockAllocator{used: make([]bool, n), nfree: n, scattered: scattered, rng: rand.New(rand.NewPCG(seed, 0xb10c)), freed: make(chan struct{})}
}

// AllocWait is Alloc for a request that may wait for blocks, as an
// engine's scheduler keeps a request queued until blocks are free rather
// than failing it: up to wait for frees (releases the peer already
// earned: a decode's READ done, a lease that runs out), then an error.
// waited says whether it had to. A request larger than the pool fails at
// once.
func (a *BlockAllocator) AllocWait(ctx context.Context, n int, wait time.Duration) (blocks []int, waited bool, err error) {
	if n > len(a.used) {
		blocks, err = a.Alloc(n)
		return blocks, false, err
	}
	deadline := time.NewTimer(wait)
	defer deadline.Stop()
	for {
		a.mu.Lock()
		ok, ch := n <= a.nfree, a.freed
		a.mu.Unlock()
		if ok {
			if blocks, err = a.Alloc(n); err == nil {
				return blocks, waited, nil
			}
			continue // taken meanwhile
		}
		waited = true
		select {
		case <-ch:
		case <-ctx.Done():
			return nil, waited, ctx.Err()
		case <-deadline.C:
			blocks, err = a.Alloc(n)
			if err != nil {
				err = fmt.Errorf("%w (after waiting %v for frees)", err, wait)
			}
			return blocks, waited, err
		}
	}
}

// Alloc returns n free blocks or an error when too few are free.
func (a *BlockAllocator) Alloc(n int) ([]int, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if n > a.nfree {
		return nil, fmt.Errorf("out of KV blocks: need %d, %d of %d free", n, a.nfree, len(a.used))
	}
	out := make([]int, 0, n)
	take := func(b int) { a.used[b] = true; out = append(out, b) }
	switch {
	case n == 0:
	case a.scattered:
		for len(out) < n {
			b := a.rng.IntN(len(a.used))
			for a.used[b] {
				b = (b + 1) % len(a.used)
			}
			take(b)
		}
	default:
		start := a.findRun(n)
		if start >= 0 {
			for b := start; b < start+n; b++ {
				take(b)
			}
			a.hint = (start + n) % len(a.used)
			break
		}
		for b := 0; len(out) < n; b++ { // no run long enough: lowest free ids
			if !a.used[b] {
				take(b)
			}
		}
	}
	a.nfree -= n
	return out, nil
}

// findRun finds n consecutive free blocks, searching from the hint.
func (a *BlockAllocator) findRun(n int) int {
	total := len(a.used)
	for pass := 0; pass < 2; pass++ {
		from, to := a.hint, total
		if pass == 1 {
			from, to = 0, min(a.hint+n, total)
		}
		run := 0
		for b := from; b < to; b++ {
			if a.used[b] {
				run = 0
				continue
			}
			run++
			if run == n {
				return b - n + 1
			}
		}
	}
	return -1
}

// Free returns blocks to the pool; freeing a free block is an error (a
// double free means the caller's bookkeeping is wrong).
func (a *BlockAllocator) Free(blocks []int) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, b := range blocks {
		if b < 0 || b >= len(a.used) || !a.used[b] {
			return fmt.Errorf("free of block %d that is not allocated", b)
		}
	}
	for _, b := range blocks {
		a.used[b] = false
	}
	a.nfree += len(blocks)
	close(a.freed)
	a.freed = make(chan struct{})
	return nil
}

// InUse is the number of allocated blocks.
func (a *BlockAllocator) InUse() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return len(a.used) - a.nfree
}

// Total is the pool size in blocks.
func (a *BlockAllocator) Total() int { return len(a.used) }
