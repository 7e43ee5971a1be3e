// Package cuda is nixlctl's way to GPU memory: the CUDA driver API, loaded
// at run time with dlopen("libcuda.so.1") and never linked, so one nixlctl
// binary runs on hosts with and without NVIDIA's driver and says why GPU
// memory is unavailable where it is.
//
// It allocates device memory as nixl.Buffers (Mem VRAM, Alloc "cuda", no
// host view), copies spans of it to and from the host (how tags are filled
// and verified), exports and opens CUDA IPC handles, and wraps the streams
// and events that the cuda-ipc backend and the device-to-device reference
// measurement use. The C shim (shim.h) holds nixlctl's own declarations of
// the driver functions it calls; all of them are resolved when the driver
// is loaded, so an unresolved symbol is never called.
//
// NIXLCTL_CUDA_LIB names a driver library to load instead of the default
// soname ("none" turns GPU memory off). A library that identifies itself as nixlctl's fake driver (built
// by the tests from cudatest/testdata) is refused outside test binaries.
package cuda

/*
#cgo CFLAGS: -O2 -Wall
#cgo LDFLAGS: -ldl
#include <stdlib.h>
#include "shim.h"
*/
import "C"

import (
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"testing"
	"unsafe"

	"github.com/nixlctl/nixlctl/internal/nixl"
)

const (
	// EnvLib names a driver library to load instead of libcuda.so.1.
	EnvLib = "NIXLCTL_CUDA_LIB"
	soname = "libcuda.so.1"
)

// Driver result codes nixlctl acts on.
const (
	codeNotReady = C.NXCU_ERROR_NOT_READY
	codeNoDevice = C.NXCU_ERROR_NO_DEVICE
)

// Error is a failed driver call.
type Error struct {
	Call string // the driver function, e.g. "cuMemAlloc_v2"
	Code int
	Name string // e.g. "CUDA_ERROR_OUT_OF_MEMORY"
	Text string // the driver's description
}

func (e *Error) Error() string { return fmt.Sprintf("%s: %s (%s)", e.Call, e.Text, e.Name) }

// check turns a driver result into an error (nil for success).
func check(callName string, r C.int) error {
	if r == 0 {
		return nil
	}
	return &Error{Call: callName, Code: int(r), Name: C.GoString(C.nxcu_error_name(r)), Text: C.GoString(C.nxcu_error_string(r))}
}

// driver is the process's one loaded CUDA driver, or why there is none.
type driver struct {
	err     error // wraps nixl.ErrUnavailable
	path    string
	fake    bool
	version int // e.g. 12040 for 12.4
	devices int

	mu   sync.Mutex
	ctxs map[int]C.CUcontext
}

var load = sync.OnceValue(func() *driver { return open(os.Getenv, testing.Testing()) })

// open loads and initialises the driver. inTest says whether this is a
// test binary, the only place the fake driver may be used.
func open(getenv func(string) string, inTest bool) *driver {
	d := &driver{ctxs: map[int]C.CUcontext{}}
	fail := func(format string, a ...any) *driver {
		d.err = fmt.Errorf("%w: cuda: %s", nixl.ErrUnavailable, fmt.Sprintf(format, a...))
		return d
	}
	path, from := soname, ""
	if p := getenv(EnvLib); p == "none" {
		return fail("disabled by %s=none", EnvLib)
	} else if p != "" {
		path, from = p, EnvLib+"="
		if _, err := os.Stat(p); err != nil {
			return fail("%s%s: %v", from, p, err)
		}
	}
	cpath := C.CString(path)
	defer C.free(unsafe.Pointer(cpath))
	var notFound C.int
	var ebuf [1024]C.char
	if C.nxcu_load(cpath, &notFound, &ebuf[0], C.size_t(len(ebuf))) != 0 {
		if notFound != 0 && from == "" {
			return fail("%s not found (no NVIDIA driver on this host)", soname)
		}
		return fail("%s%s", from, C.GoString(&ebuf[0]))
	}
	d.path = path
	var pbuf [4096]C.char
	if C.nxcu_lib_path(&pbuf[0], C.size_t(len(pbuf))) == 0 {
		d.path = C.GoString(&pbuf[0])
	}
	d.fake = C.nxcu_is_fake() != 0
	if d.fake && !inTest {
		// The library stays loaded but unused: nothing below calls it.
		return fail("%s is nixlctl's fake CUDA driver for tests; it is refused outside test binaries (unset %s)", d.path, EnvLib)
	}
	var v C.int
	if err := check("cuDriverGetVersion", C.nxcu_driver_version(&v)); err != nil {
		return fail("%v", err)
	}
	d.version = int(v)
	if r := C.nxcu_init(); r != 0 {
		if r == codeNoDevice {
			return fail("no CUDA devices%s (driver %s)", visible(), d.versionString())
		}
		return fail("driver %s: %v", d.versionString(), check("cuInit", r))
	}
	var n C.int
	if err := check("cuDeviceGetCount", C.nxcu_device_count(&n)); err != nil {
		return fail("%v", err)
	}
	if n <= 0 {
		return fail("no CUDA devices%s (driver %s)", visible(), d.versionString())
	}
	d.devices = int(n)
	return d
}

// visible notes CUDA_VISIBLE_DEVICES when it is set: the usual reason a
// GPU host shows no devices.
func visible() string {
	if v, ok := os.LookupEnv("CUDA_VISIBLE_DEVICES"); ok {
		return fmt.Sprintf(" (CUDA_VISIBLE_DEVICES=%q)", v)
	}
	return ""
}

func (d *driver) versionString() string {
	return fmt.Sprintf("%d.%d", d.version/1000, d.version%1000/10)
}

// Available reports whether GPU memory can be used here, and why not.
func Available() (bool, string) {
	if err := load().err; err != nil {
		return false, strings.TrimPrefix(err.Error(), nixl.ErrUnavailable.Error()+": cuda: ")
	}
	return true, ""
}

// Unavailable is the human reason GPU memory cannot be used here ("" when
// it can), e.g. "libcuda.so.1 not found (no NVIDIA driver on this host)".
func Unavailable() string {
	_, why := Available()
	return why
}

// Err is nil when the driver is usable, else an error wrapping
// nixl.ErrUnavailable that says why.
func Err() error { return load().err }

// Version describes the driver in use for results, e.g. "CUDA driver 12.4
// (/usr/lib/x86_64-linux-gnu/libcuda.so.1)"; "" when unavailable. The
// fake driver of the tests says so.
func Version() string {
	d := load()
	if d.err != nil {
		return ""
	}
	if d.fake {
		return fmt.Sprintf("CUDA driver %s (FAKE driver for tests, host memory: %s)", d.versionString(), d.path)
	}
	return fmt.Sprintf("CUDA driver %s (%s)", d.versionString(), d.path)
}

// Fake reports whether the loaded driver is nixlctl's fake for tests.
func Fake() bool { d := load(); return d.err == nil && d.fake }

// DeviceCount is the number of GPUs visible to this process (0 when
// unavailable).
func DeviceCount() int {
	d := load()
	if d.err != nil {
		return 0
	}
	return d.devices
}

// devCtx returns the primary context of GPU dev, retained once for the
// life of the process: it is the context every CUDA library in the process
// shares, and releasing it would tear down memory others still use.
func devCtx(dev int) (C.CUcontext, error) {
	d := load()
	if d.err != nil {
		return nil, d.err
	}
	if dev < 0 || dev >= d.devices {
		return nil, fmt.Errorf("GPU %d does not exist: %d visible (0..%d)", dev, d.devices, d.devices-1)
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if c, ok := d.ctxs[dev]; ok {
		return c, nil
	}
	var c C.CUcontext
	if err := check("cuDevicePrimaryCtxRetain", C.nxcu_primary_ctx(C.int(dev), &c)); err != nil {
		return nil, fmt.Errorf("GPU %d: %w", dev, err)
	}
	d.ctxs[dev] = c
	return c, nil
}

// DeviceName is the product name of GPU dev.
func DeviceName(dev int) (string, error) {
	if _, err := devCtx(dev); err != nil {
		return "", err
	}
	var buf [256]C.char
	if err := check("cuDeviceGetName", C.nxcu_device_name(C.int(dev), &buf[0], C.int(len(buf)))); err != nil {
		return "", err
	}
	return C.GoString(&buf[0]), nil
}

// DeviceUUID is GPU dev's UUID in nvidia-smi's form ("GPU-8f3e…"): device
// indices differ between processes with different CUDA_VISIBLE_DEVICES,
// the UUID does not.
func DeviceUUID(dev int) (string, error) {
	if _, err := devCtx(dev); err != nil {
		return "", err
	}
	var u [16]C.uchar
	if err := check("cuDeviceGetUuid", C.nxcu_device_uuid(C.int(dev), &u[0])); err != nil {
		return "", err
	}
	b := C.GoBytes(unsafe.Pointer(&u[0]), 16)
	return fmt.Sprintf("GPU-%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:16]), nil
}

// MemInfo reports free and total memory of GPU dev.
func MemInfo(dev int) (free, total uint64, err error) {
	ctx, err := devCtx(dev)
	if err != nil {
		return 0, 0, err
	}
	var f, t C.uint64_t
	if err := check("cuMemGetInfo_v2", C.nxcu_mem_info(ctx, &f, &t)); err != nil {
		return 0, 0, err
	}
	return uint64(f), uint64(t), nil
}

// CanAccessPeer reports whether GPU dev can map GPU peer's memory.
func CanAccessPeer(dev, peer int) (bool, error) {
	if _, err := devCtx(dev); err != nil {
		return false, err
	}
	if _, err := devCtx(peer); err != nil {
		return false, err
	}
	var can C.int
	if err := check("cuDeviceCanAccessPeer", C.nxcu_can_access_peer(C.int(dev), C.int(peer), &can)); err != nil {
		return false, err
	}
	return can != 0, nil
}

// EnablePeerAccess lets GPU dev's context reach GPU peer's memory directly
// (NVLink or PCIe peer-to-peer); enabling it twice is not an error.
func EnablePeerAccess(dev, peer int) error {
	if dev == peer {
		return nil
	}
	ctx, err := devCtx(dev)
	if err != nil {
		return err
	}
	pctx, err := devCtx(peer)
	if err != nil {
		return err
	}
	if ok, err := CanAccessPeer(dev, peer); err != nil || !ok {
		if err == nil {
			err = errors.New("the devices cannot access each other's memory")
		}
		return fmt.Errorf("peer access GPU %d -> GPU %d: %w", dev, peer, err)
	}
	return check("cuCtxEnablePeerAccess", C.nxcu_enable_peer(ctx, pctx))
}
