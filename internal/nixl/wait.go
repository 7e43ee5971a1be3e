package nixl

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// ErrStillRunning: a transfer outlived its timeout (DMA cannot be
// aborted: the caller must keep its buffers until it ends).
var ErrStillRunning = errors.New("transfer still running")

// WaitXfer polls a posted request until it leaves InProgress, ctx ends, or
// timeout (0: none) passes, paced as PollPacer paces (yield for the first
// 200 µs, when most transfers have ended, then sleep 20 µs between
// polls), so many requests in flight share the CPU. Many waits on one
// agent belong on a Poller.
func WaitXfer(ctx context.Context, a Agent, x XferReq, timeout time.Duration) error {
	start := time.Now()
	var pace PollPacer
	for {
		if end, err := waitEnded(a.XferStatus(x)); end {
			return err
		}
		if timeout > 0 && time.Since(start) > timeout {
			return fmt.Errorf("%w after %v", ErrStillRunning, timeout)
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		pace.After(false)
	}
}

// waitEnded says whether a status ends a wait, and with what: nil when
// Done, the status's error (or a generic one) when Failed.
func waitEnded(st Status, err error) (bool, error) {
	switch st {
	case InProgress:
		return false, nil
	case Done:
		return true, nil
	}
	if err == nil {
		err = errors.New("transfer failed")
	}
	return true, err
}

// AllocBuffer allocates a DRAM buffer the way --dram-alloc asks: plain
// mmap (like an engine's own pool) or by the backend itself.
func AllocBuffer(a Agent, size int, alloc string, huge bool) (*Buffer, error) {
	switch alloc {
	case "", "mmap":
		return AllocDRAM(size, huge)
	case "thp":
		if huge {
			return AllocDRAM(size, true) // hugetlb pages asked for: they are huge already
		}
		return AllocDRAMTHP(size)
	case "ucx":
		al, ok := a.(Allocator)
		if !ok {
			return nil, fmt.Errorf("--dram-alloc ucx needs the ucx backend (agent %s cannot allocate)", a.Info().Backend)
		}
		return al.AllocMem(size, DRAM)
	}
	return nil, fmt.Errorf("unknown --dram-alloc %q (want mmap, thp or ucx)", alloc)
}
