package cuda

/*
#include "shim.h"
*/
import "C"

import (
	"errors"
	"fmt"
	"time"
	"unsafe"

	"github.com/nixlctl/nixlctl/internal/nixl"
)

// Copy is one device-to-device copy of Len bytes. Addresses are device
// addresses valid in the stream's context (local allocations, or peers'
// allocations mapped with OpenIPC). Its layout matches the C side's.
type Copy struct{ Dst, Src, Len uint64 }

// Copy is passed to C as nxcu_copy_t: these fail to compile if the sizes differ.
var (
	_ [unsafe.Sizeof(Copy{}) - unsafe.Sizeof(C.nxcu_copy_t{})]struct{}
	_ [unsafe.Sizeof(C.nxcu_copy_t{}) - unsafe.Sizeof(Copy{})]struct{}
)

// Stream is a CUDA stream on one GPU that does not synchronise with the
// legacy default stream, so copies of different peers overlap.
type Stream struct {
	dev int
	ctx C.CUcontext
	s   C.CUstream
}

// NewStream creates a stream on GPU dev.
func NewStream(dev int) (*Stream, error) {
	ctx, err := devCtx(dev)
	if err != nil {
		return nil, err
	}
	st := &Stream{dev: dev, ctx: ctx}
	if err := check("cuStreamCreate", C.nxcu_stream_create(ctx, &st.s)); err != nil {
		return nil, err
	}
	return st, nil
}

// Device is the stream's GPU.
func (s *Stream) Device() int { return s.dev }

// Copy queues the copies on the stream and then records done (when not
// nil) after them, all in one call into C: a request of thousands of
// descriptors costs one cgo transition, not thousands. It returns how many
// copies the driver accepted; on an error the ones before it still run.
func (s *Stream) Copy(ops []Copy, done *Event) (int, error) {
	var ev C.CUevent
	if done != nil {
		if done.ctx != s.ctx {
			return 0, errors.New("event and stream belong to different GPUs")
		}
		ev = done.e
	}
	var p *C.nxcu_copy_t
	if len(ops) > 0 {
		p = (*C.nxcu_copy_t)(unsafe.Pointer(&ops[0]))
	}
	var issued C.size_t
	err := check("cuMemcpyDtoDAsync_v2", C.nxcu_copy_batch(s.ctx, s.s, p, C.size_t(len(ops)), ev, &issued))
	return int(issued), err
}

// Synchronize waits until everything queued on the stream has finished.
func (s *Stream) Synchronize() error {
	return check("cuStreamSynchronize", C.nxcu_stream_sync(s.ctx, s.s))
}

// Destroy releases the stream; work still queued completes first.
func (s *Stream) Destroy() error {
	return check("cuStreamDestroy_v2", C.nxcu_stream_destroy(s.ctx, s.s))
}

// Event marks a point in a stream. Events made by NewEvent are created
// with blocking sync, so a thread waiting in Wait sleeps in the kernel
// instead of spinning a core, and without timing, which makes recording
// them cheaper.
type Event struct {
	ctx C.CUcontext
	e   C.CUevent
}

// NewEvent creates an event on GPU dev.
func NewEvent(dev int) (*Event, error) {
	return newEvent(dev, C.NXCU_EVENT_BLOCKING_SYNC|C.NXCU_EVENT_DISABLE_TIMING)
}

func newEvent(dev int, flags C.unsigned) (*Event, error) {
	ctx, err := devCtx(dev)
	if err != nil {
		return nil, err
	}
	ev := &Event{ctx: ctx}
	if err := check("cuEventCreate", C.nxcu_event_create(ctx, flags, &ev.e)); err != nil {
		return nil, err
	}
	return ev, nil
}

// Query reports whether the work before the event's last record has
// finished (cuEventQuery: it never blocks).
func (e *Event) Query() (bool, error) {
	switch r := C.nxcu_event_query(e.ctx, e.e); r {
	case 0:
		return true, nil
	case codeNotReady:
		return false, nil
	default:
		return false, check("cuEventQuery", r)
	}
}

// Wait blocks until the work before the event's last record has finished.
func (e *Event) Wait() error { return check("cuEventSynchronize", C.nxcu_event_sync(e.ctx, e.e)) }

// Destroy releases the event (safe while recorded work is pending: the
// driver frees it once that work is done).
func (e *Event) Destroy() error { return check("cuEventDestroy_v2", C.nxcu_event_destroy(e.ctx, e.e)) }

// D2DBandwidth measures device-to-device copy bandwidth: each span of src
// copied to the same offset of dst with cuMemcpyDtoDAsync, repeated for
// about budget, timed on the GPU by events around the copies. It is the
// ceiling a same-GPU transfer of that descriptor pattern can reach, and
// the reference `bench xfer` reports VRAM efficiency against. Decimal
// GB/s.
func D2DBandwidth(src, dst *nixl.Buffer, spans []nixl.Span, budget time.Duration) (float64, error) {
	if src.Mem != nixl.VRAM || dst.Mem != nixl.VRAM {
		return 0, errors.New("device-to-device bandwidth needs two VRAM buffers")
	}
	if err := src.CheckSpans(spans); err != nil {
		return 0, err
	}
	if err := dst.CheckSpans(spans); err != nil {
		return 0, err
	}
	ops := make([]Copy, 0, len(spans))
	var bytes uint64
	for _, s := range spans {
		if s.Len > 0 {
			ops = append(ops, Copy{Dst: dst.Addr + uint64(s.Off), Src: src.Addr + uint64(s.Off), Len: uint64(s.Len)})
			bytes += uint64(s.Len)
		}
	}
	if len(ops) == 0 {
		return 0, errors.New("nothing to copy")
	}
	dev := int(src.Dev)
	st, err := NewStream(dev)
	if err != nil {
		return 0, err
	}
	defer st.Destroy()
	// Timing events, blocking sync: the host sleeps while the GPU copies.
	e0, err := newEvent(dev, C.NXCU_EVENT_BLOCKING_SYNC)
	if err != nil {
		return 0, err
	}
	defer e0.Destroy()
	e1, err := newEvent(dev, C.NXCU_EVENT_BLOCKING_SYNC)
	if err != nil {
		return 0, err
	}
	defer e1.Destroy()
	round := func(reps int) (time.Duration, error) {
		var ms C.float
		r := C.nxcu_time_copies(st.ctx, st.s, e0.e, e1.e, (*C.nxcu_copy_t)(unsafe.Pointer(&ops[0])), C.size_t(len(ops)), C.int(reps), &ms)
		if err := check("cuMemcpyDtoDAsync_v2", r); err != nil {
			return 0, err
		}
		return time.Duration(float64(ms) * float64(time.Millisecond)), nil
	}
	// One round warms up (first-touch costs, clocks) and sizes the
	// measured run to the budget.
	one, err := round(1)
	if err != nil {
		return 0, err
	}
	reps := 1
	if one > 0 {
		reps = int(min(max(budget/one, 1), 1<<20))
	}
	took, err := round(reps)
	if err != nil {
		return 0, err
	}
	if took <= 0 {
		return 0, fmt.Errorf("the GPU timed %d copies at zero time", reps*len(ops))
	}
	return float64(bytes) * float64(reps) / took.Seconds() / 1e9, nil
}

// HostCopyBandwidth measures copies of the spans between device buffer b
// and the host (toDevice: host to device), for about budget, by wall
// clock: the reference for transfers between DRAM and VRAM.
func HostCopyBandwidth(b *nixl.Buffer, spans []nixl.Span, toDevice bool, budget time.Duration) (float64, error) {
	n := 0
	for _, s := range spans {
		n += s.Len
	}
	if n == 0 {
		return 0, errors.New("nothing to copy")
	}
	host := make([]byte, n)
	step := CopyOut
	if toDevice {
		step = CopyIn
	}
	if err := step(b, spans, host); err != nil { // warm-up
		return 0, err
	}
	var copied int64
	start := time.Now()
	for time.Since(start) < budget {
		if err := step(b, spans, host); err != nil {
			return 0, err
		}
		copied += int64(n)
	}
	return float64(copied) / 1e9 / time.Since(start).Seconds(), nil
}
