package nixl

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"time"
)

// ErrStillRunning: a transfer outlived its timeout (DMA cannot be
// aborted: the caller must keep its buffers until it ends).
var ErrStillRunning = errors.New("transfer still running")

// WaitXfer polls a posted request until it leaves InProgress, ctx ends, or
// timeout (0: none) passes. It yields for the first 200 µs (most transfers
// end by then) and then sleeps 20 µs between polls, so many requests in
// flight share the CPU.
func WaitXfer(ctx context.Context, a Agent, x XferReq, timeout time.Duration) error {
	start := time.Now()
	for {
		st, err := a.XferStatus(x)
		switch st {
		case Done:
			return nil
		case Failed:
			if err == nil {
				err = errors.New("transfer failed")
			}
			return err
		}
		el := time.Since(start)
		if timeout > 0 && el > timeout {
			return fmt.Errorf("%w after %v", ErrStillRunning, timeout)
		}
		if el < 200*time.Microsecond {
			runtime.Gosched()
			continue
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		time.Sleep(20 * time.Microsecond)
	}
}

// AllocBuffer allocates a DRAM buffer the way --dram-alloc asks: plain
// mmap (like an engine's own pool) or by the backend itself.
func AllocBuffer(a Agent, size int, alloc string, huge bool) (*Buffer, error) {
	switch alloc {
	case "", "mmap":
		return AllocDRAM(size, huge)
	case "ucx":
		al, ok := a.(Allocator)
		if !ok {
			return nil, fmt.Errorf("--dram-alloc ucx needs the ucx backend (agent %s cannot allocate)", a.Info().Backend)
		}
		return al.AllocMem(size, DRAM)
	}
	return nil, fmt.Errorf("unknown --dram-alloc %q (want mmap or ucx)", alloc)
}
