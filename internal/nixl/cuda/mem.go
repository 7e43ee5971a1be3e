package cuda

/*
#include "shim.h"
*/
import "C"

import (
	"fmt"
	"sync"
	"unsafe"

	"github.com/nixlctl/nixlctl/internal/nixl"
)

// Alloc allocates size bytes of device memory on GPU dev (cuMemAlloc): a
// VRAM buffer with no host view; Free releases it. This is the VRAM pool
// an endpoint registers, the counterpart of nixl.AllocDRAM.
func Alloc(dev, size int) (*nixl.Buffer, error) {
	if size <= 0 {
		return nil, fmt.Errorf("buffer size must be > 0 (got %d)", size)
	}
	ctx, err := devCtx(dev)
	if err != nil {
		return nil, err
	}
	var p C.uint64_t
	if err := check("cuMemAlloc_v2", C.nxcu_mem_alloc(ctx, C.uint64_t(size), &p)); err != nil {
		if free, total, ierr := MemInfo(dev); ierr == nil {
			return nil, fmt.Errorf("allocate %d bytes on GPU %d (%d of %d bytes free): %w", size, dev, free, total, err)
		}
		return nil, fmt.Errorf("allocate %d bytes on GPU %d: %w", size, dev, err)
	}
	free := func() error { return check("cuMemFree_v2", C.nxcu_mem_free(ctx, p)) }
	return nixl.NewBuffer(uint64(p), size, nixl.VRAM, uint32(dev), "cuda", nil, free), nil
}

// CopyIn copies host bytes into spans of device buffer b: src holds the
// spans' contents back to back.
func CopyIn(b *nixl.Buffer, spans []nixl.Span, src []byte) error {
	return copySpans(b, spans, src, true)
}

// CopyOut copies spans of device buffer b to the host, back to back in dst.
func CopyOut(b *nixl.Buffer, spans []nixl.Span, dst []byte) error {
	return copySpans(b, spans, dst, false)
}

// copySpans copies between spans of device buffer b and host, which holds
// their contents back to back: into the device (toDevice) or out of it.
func copySpans(b *nixl.Buffer, spans []nixl.Span, host []byte, toDevice bool) error {
	if b.Mem != nixl.VRAM {
		return fmt.Errorf("%s buffer at %#x is not device memory", b.Mem, b.Addr)
	}
	if err := b.CheckSpans(spans); err != nil {
		return err
	}
	ctx, err := devCtx(int(b.Dev))
	if err != nil {
		return err
	}
	offs := make([]C.uint64_t, len(spans))
	lens := make([]C.uint64_t, len(spans))
	total := 0
	for i, s := range spans {
		offs[i], lens[i] = C.uint64_t(s.Off), C.uint64_t(s.Len)
		total += s.Len
	}
	if total != len(host) {
		return fmt.Errorf("spans hold %d bytes, host buffer %d", total, len(host))
	}
	if total == 0 {
		return nil
	}
	what, dir := "cuMemcpyDtoH_v2", C.int(0)
	if toDevice {
		what, dir = "cuMemcpyHtoD_v2", 1
	}
	return check(what, C.nxcu_copy_spans(ctx, C.uint64_t(b.Addr), &offs[0], &lens[0], C.size_t(len(spans)), unsafe.Pointer(&host[0]), dir))
}

// IPCHandle is a CUDA IPC memory handle: what another process on this host
// needs to map an allocation (cuIpcGetMemHandle).
type IPCHandle [64]byte

// Allocation describes the cuMemAlloc allocation that holds an address:
// IPC handles name whole allocations, so a region inside one is exported
// as (handle, offset).
type Allocation struct {
	Handle IPCHandle
	Base   uint64
	Size   uint64
}

// ExportIPC returns the IPC handle of the allocation that holds addr on
// GPU dev. Memory that cuMemAlloc did not allocate (cuMemCreate, host
// memory) cannot be exported this way and gets the driver's error.
func ExportIPC(dev int, addr uint64) (Allocation, error) {
	ctx, err := devCtx(dev)
	if err != nil {
		return Allocation{}, err
	}
	var a Allocation
	var base, size C.uint64_t
	if err := check("cuMemGetAddressRange_v2", C.nxcu_mem_range(ctx, C.uint64_t(addr), &base, &size)); err != nil {
		return a, fmt.Errorf("%#x is not device memory of GPU %d: %w", addr, dev, err)
	}
	a.Base, a.Size = uint64(base), uint64(size)
	if err := check("cuIpcGetMemHandle", C.nxcu_ipc_get(ctx, base, (*C.uchar)(unsafe.Pointer(&a.Handle[0])))); err != nil {
		return a, err
	}
	return a, nil
}

// ipcMaps counts what OpenIPC mapped, per GPU and handle: two agents of
// one process (two TP ranks) may load the same peer, and the driver maps a
// handle once per context, so the second open shares the first mapping
// and the last close unmaps it.
var ipcMaps = struct {
	sync.Mutex
	byHandle map[ipcKey]*ipcMap
	byAddr   map[ipcAddr]*ipcMap
}{byHandle: map[ipcKey]*ipcMap{}, byAddr: map[ipcAddr]*ipcMap{}}

type ipcKey struct {
	dev int
	h   IPCHandle
}

type ipcAddr struct {
	dev  int
	addr uint64
}

type ipcMap struct {
	key  ipcKey
	addr uint64
	refs int
}

// OpenIPC maps another process's allocation into GPU dev's context and
// returns its address here. Peer access to another GPU is enabled as
// needed. A handle cannot be opened in the process that exported it.
// Opening a handle this process has open already returns the same
// address; each OpenIPC needs its CloseIPC.
func OpenIPC(dev int, h IPCHandle) (uint64, error) {
	ctx, err := devCtx(dev)
	if err != nil {
		return 0, err
	}
	ipcMaps.Lock()
	defer ipcMaps.Unlock()
	k := ipcKey{dev, h}
	if m, ok := ipcMaps.byHandle[k]; ok {
		m.refs++
		return m.addr, nil
	}
	var p C.uint64_t
	if err := check("cuIpcOpenMemHandle_v2", C.nxcu_ipc_open(ctx, (*C.uchar)(unsafe.Pointer(&h[0])), &p)); err != nil {
		return 0, err
	}
	m := &ipcMap{key: k, addr: uint64(p), refs: 1}
	ipcMaps.byHandle[k] = m
	ipcMaps.byAddr[ipcAddr{dev, m.addr}] = m
	return m.addr, nil
}

// CloseIPC undoes one OpenIPC; the last one unmaps.
func CloseIPC(dev int, addr uint64) error {
	ctx, err := devCtx(dev)
	if err != nil {
		return err
	}
	ipcMaps.Lock()
	defer ipcMaps.Unlock()
	m, ok := ipcMaps.byAddr[ipcAddr{dev, addr}]
	if !ok {
		return fmt.Errorf("%#x on GPU %d was not mapped by OpenIPC", addr, dev)
	}
	if m.refs--; m.refs > 0 {
		return nil
	}
	delete(ipcMaps.byHandle, m.key)
	delete(ipcMaps.byAddr, ipcAddr{dev, addr})
	return check("cuIpcCloseMemHandle", C.nxcu_ipc_close(ctx, C.uint64_t(addr)))
}

// AllocSeg allocates a transfer buffer of memory type mem: DRAM the way
// AllocBuffer does (alloc, huge), VRAM on GPU dev through the CUDA driver.
func AllocSeg(a nixl.Agent, mem nixl.MemType, dev, size int, alloc string, huge bool) (*nixl.Buffer, error) {
	if mem != nixl.VRAM {
		return nixl.AllocBuffer(a, size, alloc, huge)
	}
	b, err := Alloc(dev, size)
	if err != nil {
		return nil, fmt.Errorf("VRAM on GPU %d: %w", dev, err)
	}
	return b, nil
}
