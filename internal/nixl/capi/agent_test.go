package capi

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/nixlctl/nixlctl/internal/nixl"
)

// These tests need the real NIXL (see docs/backends.md for the
// environment); without it they skip, saying why.
func needNIXL(t *testing.T) {
	t.Helper()
	if ok, why := Available(); !ok {
		t.Skipf("NIXL unavailable: %s", why)
	}
}

func open(t *testing.T, name string) nixl.Agent {
	t.Helper()
	a, err := New(nixl.Config{Name: name})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Close() })
	return a
}

func buffer(t *testing.T, a nixl.Agent, size int) *nixl.Buffer {
	t.Helper()
	b, err := nixl.AllocDRAM(size, false)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Free() })
	if err := a.RegisterMem(b); err != nil {
		t.Fatal(err)
	}
	return b
}

// connect loads to's metadata into from.
func connect(t *testing.T, from, to nixl.Agent) string {
	t.Helper()
	md, err := to.LocalMD()
	if err != nil {
		t.Fatal(err)
	}
	name, err := from.LoadRemoteMD(md)
	if err != nil {
		t.Fatal(err)
	}
	return name
}

func waitDone(t *testing.T, a nixl.Agent, r nixl.XferReq) {
	t.Helper()
	st, err := a.PostXferReq(r)
	for deadline := time.Now().Add(20 * time.Second); st == nixl.InProgress && err == nil; {
		if time.Now().After(deadline) {
			t.Fatal("transfer still in progress after 20 s")
		}
		st, err = a.XferStatus(r)
	}
	if st != nixl.Done {
		t.Fatalf("transfer ended %v: %v", st, err)
	}
}

// Opening and closing agents, with transfers and notifications in
// between, leaves no goroutine behind (NIXL's own threads are C threads,
// which destroy_agent joins).
func TestNoGoroutineLeak(t *testing.T) {
	needNIXL(t)
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	for i := 0; i < 3; i++ {
		a, err := New(nixl.Config{Name: "a"})
		if err != nil {
			t.Fatal(err)
		}
		b, err := New(nixl.Config{Name: "b"})
		if err != nil {
			t.Fatal(err)
		}
		ab, _ := nixl.AllocDRAM(1<<20, false)
		bb, _ := nixl.AllocDRAM(1<<20, false)
		if err := a.RegisterMem(ab); err != nil {
			t.Fatal(err)
		}
		if err := b.RegisterMem(bb); err != nil {
			t.Fatal(err)
		}
		md, _ := b.LocalMD()
		remote, err := a.LoadRemoteMD(md)
		if err != nil {
			t.Fatal(err)
		}
		r, err := a.CreateXferReq(nixl.Write, nixl.DRAM, []nixl.Desc{ab.Desc(0, 4096)}, nixl.DRAM, []nixl.Desc{bb.Desc(0, 4096)}, remote, []byte("x"))
		if err != nil {
			t.Fatal(err)
		}
		waitDone(t, a, r)
		// Left unreleased, and with the notification unread: Close copes.
		if err := a.Close(); err != nil {
			t.Fatal(err)
		}
		if err := b.Close(); err != nil {
			t.Fatal(err)
		}
		ab.Free()
		bb.Free()
	}
}

// Corrupted metadata is refused before NIXL sees it: NIXL and UCX take
// whatever they are given, and UCX aborts the process on some single-byte
// corruptions of a worker address or rkey.
func TestCorruptMetadata(t *testing.T) {
	needNIXL(t)
	init, target := open(t, "initiator"), open(t, "target")
	buffer(t, target, 1<<20)
	md, err := target.LocalMD()
	if err != nil {
		t.Fatal(err)
	}
	blob, err := unseal(md)
	if err != nil || len(blob) == len(md) {
		t.Fatalf("LocalMD is not sealed: %v", err)
	}
	if _, err := parseNIXLMD(blob); err != nil {
		t.Fatalf("NIXL's own metadata fails the check: %v", err)
	}
	for n := 0; n < len(md); n++ {
		if n == len(blob) {
			continue // the plain NIXL blob, without the seal: valid
		}
		if _, err := init.LoadRemoteMD(md[:n]); !errors.Is(err, nixl.ErrBadMetadata) {
			t.Fatalf("truncated to %d of %d bytes: %v", n, len(md), err)
		}
	}
	for i := range md {
		for _, x := range []byte{0xff, 0x01} {
			f := append([]byte(nil), md...)
			f[i] ^= x
			if name, err := init.LoadRemoteMD(f); !errors.Is(err, nixl.ErrBadMetadata) {
				t.Fatalf("byte %d ^%#x: loaded as %q, %v", i, x, name, err)
			}
		}
	}
	// The intact blob still loads, sealed or not (as another NIXL program
	// would send it).
	if name, err := init.LoadRemoteMD(md); err != nil || name != "target" {
		t.Fatalf("intact metadata: %q, %v", name, err)
	}
	other := open(t, "other")
	if name, err := other.LoadRemoteMD(blob); err != nil || name != "target" {
		t.Fatalf("unsealed metadata: %q, %v", name, err)
	}
	if _, err := target.LoadRemoteMD(md); err == nil {
		t.Error("an agent loaded its own metadata")
	}
}

// The seal does not stop NIXL itself from reading the metadata: a NIXL
// agent that knows nothing of nixlctl loads the sealed blob as it is.
func TestSealedMetadataLoadsInPlainNIXL(t *testing.T) {
	needNIXL(t)
	plain, target := open(t, "plain").(*agent), open(t, "target")
	tb := buffer(t, target, 1<<20)
	md, _ := target.LocalMD()
	plain.mu.Lock()
	name, err := plain.nixlLoadLocked(md)
	plain.mu.Unlock()
	if err != nil || name != "target" {
		t.Fatalf("NIXL loading the sealed blob directly: %q, %v", name, err)
	}
	// And transfers work on what it loaded.
	plain.mu.Lock()
	plain.remotes[name] = &remote{name: name}
	plain.mu.Unlock()
	pb := buffer(t, plain, 1<<20)
	copy(pb.Bytes(), "through plain NIXL")
	r, err := plain.CreateXferReq(nixl.Write, nixl.DRAM, []nixl.Desc{pb.Desc(0, 64)}, nixl.DRAM, []nixl.Desc{tb.Desc(0, 64)}, name, nil)
	if err != nil {
		t.Fatal(err)
	}
	waitDone(t, plain, r)
	if got := string(tb.Bytes()[:18]); got != "through plain NIXL" {
		t.Errorf("target holds %q", got)
	}
}

// A consumer that only waits on NotifReady sees standalone notifications
// and those attached to transfers, without polling GetNotifs itself.
func TestNotifReady(t *testing.T) {
	needNIXL(t)
	init, target := open(t, "initiator"), open(t, "target")
	ib, tb := buffer(t, init, 1<<20), buffer(t, target, 1<<20)
	remote := connect(t, init, target)
	await := func(want string) {
		t.Helper()
		start := time.Now()
		select {
		case <-target.NotifReady():
		case <-time.After(10 * time.Second):
			t.Fatalf("NotifReady not signalled for %q", want)
		}
		n, err := target.GetNotifs()
		if err != nil {
			t.Fatal(err)
		}
		if got := n["initiator"]; len(got) != 1 || string(got[0]) != want {
			t.Fatalf("notifications %q, want one %q", n, want)
		}
		t.Logf("%q signalled after %v", want, time.Since(start))
	}
	if err := init.SendNotif(remote, []byte("hello")); err != nil {
		t.Fatal(err)
	}
	await("hello")
	r, err := init.CreateXferReq(nixl.Write, nixl.DRAM, []nixl.Desc{ib.Desc(0, 4096)}, nixl.DRAM, []nixl.Desc{tb.Desc(0, 4096)}, remote, []byte("written"))
	if err != nil {
		t.Fatal(err)
	}
	waitDone(t, init, r)
	await("written")
	// Binary messages, including an empty one, arrive as sent.
	for _, msg := range [][]byte{{0, '|', 0xff, 0}, {}} {
		if err := init.SendNotif(remote, msg); err != nil {
			t.Fatal(err)
		}
	}
	var got [][]byte
	for deadline := time.Now().Add(10 * time.Second); len(got) < 2 && time.Now().Before(deadline); {
		n, _ := target.GetNotifs()
		got = append(got, n["initiator"]...)
	}
	if len(got) != 2 || string(got[0]) != "\x00|\xff\x00" || len(got[1]) != 0 {
		t.Errorf("binary notifications: %q", got)
	}
}

func TestInvalidateAndReload(t *testing.T) {
	needNIXL(t)
	init, target := open(t, "initiator"), open(t, "target")
	ib, tb := buffer(t, init, 1<<20), buffer(t, target, 1<<20)
	remote := connect(t, init, target)
	ld, err := init.PrepXferDlist("", nixl.DRAM, []nixl.Desc{ib.Desc(0, 4096)})
	if err != nil {
		t.Fatal(err)
	}
	rd, err := init.PrepXferDlist(remote, nixl.DRAM, []nixl.Desc{tb.Desc(0, 4096)})
	if err != nil {
		t.Fatal(err)
	}
	r, err := init.MakeXferReq(nixl.Write, ld, []int{0}, rd, []int{0}, nil)
	if err != nil {
		t.Fatal(err)
	}
	waitDone(t, init, r)
	if err := init.InvalidateRemoteMD(remote); err != nil {
		t.Fatal(err)
	}
	if _, err := init.PostXferReq(r); !errors.Is(err, nixl.ErrUnknownAgent) {
		t.Errorf("post after invalidate: %v", err)
	}
	if _, err := init.MakeXferReq(nixl.Write, ld, []int{0}, rd, []int{0}, nil); !errors.Is(err, nixl.ErrUnknownAgent) {
		t.Errorf("make from a stale list: %v", err)
	}
	if err := init.ReleaseXferReq(r); err != nil {
		t.Errorf("release after invalidate: %v", err)
	}
	if err := init.InvalidateRemoteMD(remote); !errors.Is(err, nixl.ErrUnknownAgent) {
		t.Errorf("second invalidate: %v", err)
	}

	// The target registers more memory: its new metadata replaces the old.
	connect(t, init, target)
	more := buffer(t, target, 1<<20)
	if _, err := init.PrepXferDlist(remote, nixl.DRAM, []nixl.Desc{more.Desc(0, 64)}); !errors.Is(err, nixl.ErrNotRegistered) {
		t.Errorf("memory registered after the metadata was sent: %v", err)
	}
	connect(t, init, target)
	r, err = init.CreateXferReq(nixl.Write, nixl.DRAM, []nixl.Desc{ib.Desc(0, 64)}, nixl.DRAM, []nixl.Desc{more.Desc(0, 64)}, remote, nil)
	if err != nil {
		t.Fatalf("after reloading: %v", err)
	}
	waitDone(t, init, r)
	if err := init.ReleaseXferReq(r); err != nil {
		t.Fatal(err)
	}
	if err := init.ReleaseDlist(ld); err != nil {
		t.Fatal(err)
	}
}

func TestRequestChecks(t *testing.T) {
	needNIXL(t)
	init, target := open(t, "initiator"), open(t, "target")
	ib, tb := buffer(t, init, 1<<20), buffer(t, target, 1<<20)
	remote := connect(t, init, target)
	ld, _ := init.PrepXferDlist("", nixl.DRAM, []nixl.Desc{ib.Desc(0, 64), ib.Desc(64, 128)})
	rd, _ := init.PrepXferDlist(remote, nixl.DRAM, []nixl.Desc{tb.Desc(0, 64), tb.Desc(4096, 64)})
	if _, err := init.MakeXferReq(nixl.Read, ld, []int{1}, rd, []int{0}, nil); !errors.Is(err, nixl.ErrLengthMismatch) {
		t.Errorf("length mismatch: %v", err)
	}
	if _, err := init.MakeXferReq(nixl.Read, ld, []int{2}, rd, []int{0}, nil); err == nil {
		t.Error("index out of range accepted")
	}
	if _, err := init.MakeXferReq(nixl.Read, ld, []int{0, 0}, rd, []int{0}, nil); err == nil {
		t.Error("index counts differ, accepted")
	}
	if _, err := init.MakeXferReq(nixl.Read, rd, []int{0}, ld, []int{0}, nil); err == nil {
		t.Error("lists swapped, accepted")
	}
	other := open(t, "other")
	od, _ := other.PrepXferDlist("", nixl.DRAM, nil)
	if _, err := init.MakeXferReq(nixl.Read, od, nil, rd, nil, nil); err == nil {
		t.Error("another agent's list accepted")
	}
	if _, err := init.PrepXferDlist(remote, nixl.DRAM, []nixl.Desc{{Addr: tb.Addr + 1<<20 - 8, Len: 16}}); !errors.Is(err, nixl.ErrNotRegistered) {
		t.Errorf("remote descriptor past the end: %v", err)
	}
	if _, err := init.PrepXferDlist(remote, nixl.VRAM, []nixl.Desc{tb.Desc(0, 64)}); !errors.Is(err, nixl.ErrNotRegistered) {
		t.Errorf("remote DRAM prepared as VRAM: %v", err)
	}
	// Empty lists and requests are NIXL's to refuse or accept; neither
	// may crash (NIXL divides by a list's length when it makes requests).
	el, err := init.PrepXferDlist("", nixl.DRAM, nil)
	if err == nil {
		if _, err := init.MakeXferReq(nixl.Read, el, nil, rd, nil, nil); err == nil {
			t.Error("a request of no descriptors was made")
		}
	}
	if er, err := init.PrepXferDlist(remote, nixl.DRAM, nil); err == nil {
		if _, err := init.MakeXferReq(nixl.Read, ld, nil, er, nil, nil); err == nil {
			t.Error("a request of no descriptors was made")
		}
	}
	if r, err := init.CreateXferReq(nixl.Write, nixl.DRAM, nil, nixl.DRAM, nil, remote, nil); err == nil {
		init.ReleaseXferReq(r)
	}
	r, err := init.MakeXferReq(nixl.Read, ld, []int{0}, rd, []int{1}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if st, err := init.XferStatus(r); st != nixl.Failed || err == nil {
		t.Errorf("status of a request never posted: %v, %v", st, err)
	}
	waitDone(t, init, r)
	if err := init.ReleaseXferReq(r); err != nil {
		t.Fatal(err)
	}
	if err := init.ReleaseXferReq(r); err == nil {
		t.Error("double release accepted")
	}
	if _, err := init.PostXferReq(r); err == nil {
		t.Error("post after release accepted")
	}
}

// NIXL's per-request telemetry: durations in microseconds, bytes and the
// descriptor count NIXL moved.
func TestTelemetry(t *testing.T) {
	needNIXL(t)
	init, target := open(t, "initiator"), open(t, "target")
	const size = 16 << 20
	ib, tb := buffer(t, init, size), buffer(t, target, size)
	remote := connect(t, init, target)
	var ld, rd []nixl.Desc
	for off := 0; off < size; off += 1 << 20 {
		ld = append(ld, ib.Desc(off, 1<<19))
		rd = append(rd, tb.Desc(size-off-(1<<20), 1<<19))
	}
	r, err := init.CreateXferReq(nixl.Write, nixl.DRAM, ld, nixl.DRAM, rd, remote, nil)
	if err != nil {
		t.Fatal(err)
	}
	if tel := init.Telemetry(r); tel.Bytes != size/2 || tel.Descs != 16 || tel.Total() != 0 {
		t.Errorf("before posting: %+v", tel)
	}
	waitDone(t, init, r)
	tel := init.Telemetry(r)
	if tel.Bytes != size/2 || tel.Descs != 16 || tel.Total() <= 0 || tel.PostDuration <= 0 || tel.XferDuration < 0 {
		t.Errorf("after the transfer: %+v", tel)
	}
	t.Logf("telemetry %+v", tel)
}

// VRAM goes to NIXL as it is; this NIXL has no CUDA and must refuse it
// with an error, not a crash.
func TestVRAMPassesThrough(t *testing.T) {
	needNIXL(t)
	a := open(t, "gpu")
	host, err := nixl.AllocDRAM(1<<20, false)
	if err != nil {
		t.Fatal(err)
	}
	defer host.Free()
	v := nixl.NewBuffer(host.Addr, host.Len, nixl.VRAM, 0, "fake", nil, nil)
	if err := a.RegisterMem(v); err != nil {
		t.Logf("NIXL refused VRAM: %v", err)
		return
	}
	t.Log("NIXL registered VRAM (a CUDA-enabled build)")
	if err := a.DeregisterMem(v); err != nil {
		t.Fatal(err)
	}
}

func TestClosed(t *testing.T) {
	needNIXL(t)
	init, target := open(t, "initiator"), open(t, "target")
	ib, tb := buffer(t, init, 1<<20), buffer(t, target, 1<<20)
	remote := connect(t, init, target)
	ld, _ := init.PrepXferDlist("", nixl.DRAM, []nixl.Desc{ib.Desc(0, 64)})
	rd, _ := init.PrepXferDlist(remote, nixl.DRAM, []nixl.Desc{tb.Desc(0, 64)})
	r, err := init.MakeXferReq(nixl.Write, ld, []int{0}, rd, []int{0}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := init.Close(); err != nil {
		t.Fatal(err)
	}
	if err := init.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
	md, _ := target.LocalMD()
	calls := map[string]error{
		"RegisterMem":   init.RegisterMem(ib),
		"DeregisterMem": init.DeregisterMem(ib),
		"SendNotif":     init.SendNotif(remote, nil),
		"Invalidate":    init.InvalidateRemoteMD(remote),
	}
	_, calls["LocalMD"] = init.LocalMD()
	_, calls["LoadRemoteMD"] = init.LoadRemoteMD(md)
	_, calls["PrepXferDlist"] = init.PrepXferDlist("", nixl.DRAM, nil)
	_, calls["MakeXferReq"] = init.MakeXferReq(nixl.Write, ld, []int{0}, rd, []int{0}, nil)
	_, calls["CreateXferReq"] = init.CreateXferReq(nixl.Write, nixl.DRAM, nil, nixl.DRAM, nil, remote, nil)
	_, calls["PostXferReq"] = init.PostXferReq(r)
	_, calls["XferStatus"] = init.XferStatus(r)
	_, calls["GetNotifs"] = init.GetNotifs()
	for name, err := range calls {
		if !errors.Is(err, nixl.ErrClosed) {
			t.Errorf("%s after Close: %v", name, err)
		}
	}
	// Releasing after Close is harmless: Close freed everything.
	if err := init.ReleaseXferReq(r); err != nil {
		t.Errorf("ReleaseXferReq after Close: %v", err)
	}
	if err := init.ReleaseDlist(ld); err != nil {
		t.Errorf("ReleaseDlist after Close: %v", err)
	}
	if tel := init.Telemetry(r); tel.Bytes != 64 {
		t.Errorf("Telemetry after Close: %+v", tel)
	}
}

// Why the backend is unavailable, in environments set up in child
// processes (the library is loaded once per process).
func TestUnavailableReasons(t *testing.T) {
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	reason := func(env ...string) string {
		t.Helper()
		cmd := exec.Command(exe, "-test.run=^$")
		cmd.Env = append(cleanEnv(), append(env, "NIXLCTL_CAPI_TEST_REASON=1")...)
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("child: %v", err)
		}
		return string(out)
	}
	missing := filepath.Join(t.TempDir(), "libnixl_capi.so")
	if got := reason("NIXLCTL_NIXL_LIB=" + missing); !strings.Contains(got, "NIXLCTL_NIXL_LIB="+missing) {
		t.Errorf("NIXLCTL_NIXL_LIB pointing nowhere: %q", got)
	}
	if _, err := os.Stat("/opt/nvidia/nvda_nixl"); err != nil {
		// LD_LIBRARY_PATH may lead the loader to this machine's NIXL.
		got := reason("NIXL_PREFIX="+t.TempDir(), "LD_LIBRARY_PATH=")
		for _, want := range []string{"libnixl_capi.so not found (searched:", "/opt/nvidia/nvda_nixl/lib/libnixl_capi.so", "set NIXLCTL_NIXL_LIB or NIXL_PREFIX"} {
			if !strings.Contains(got, want) {
				t.Errorf("no library: %q does not contain %q", got, want)
			}
		}
	}
	if ok, _ := Available(); !ok {
		return
	}
	lib := load().lib.path
	empty := t.TempDir()
	if got := reason("NIXLCTL_NIXL_LIB="+lib, "NIXL_PLUGIN_DIR="+empty); !strings.Contains(got, "UCX plugin not found in NIXL_PLUGIN_DIR="+empty) {
		t.Errorf("no UCX plugin: %q", got)
	}
	if got := reason("NIXLCTL_NIXL_LIB=" + lib); got != "" {
		t.Errorf("the library this process uses is unavailable in a child: %q", got)
	}
}

// cleanEnv is this process's environment without the settings the
// children are given.
func cleanEnv() []string {
	var out []string
	for _, kv := range os.Environ() {
		k, _, _ := strings.Cut(kv, "=")
		switch k {
		case "NIXLCTL_NIXL_LIB", "NIXL_PREFIX", "NIXL_PLUGIN_DIR":
			continue
		}
		out = append(out, kv)
	}
	return out
}

func TestNewWhenUnavailable(t *testing.T) {
	if ok, _ := Available(); ok {
		t.Skip("NIXL is available here")
	}
	if _, err := New(nixl.Config{Name: "a"}); !errors.Is(err, nixl.ErrUnavailable) {
		t.Errorf("New without NIXL: %v", err)
	}
	if v := Version(); v != "" {
		t.Errorf("Version without NIXL: %q", v)
	}
}

// An initiator that polls and a target that spins, neither with NIXL's
// progress thread (bench xfer's --progress poll): WRITEs with
// notifications complete and arrive, and Info says how each progresses.
func TestPolledAndSpinningAgents(t *testing.T) {
	needNIXL(t)
	if _, err := New(nixl.Config{Name: "x", Progress: nixl.Progress(7)}); err == nil {
		t.Error("an unknown progress was accepted")
	}
	init, err := New(nixl.Config{Name: "initiator", Progress: nixl.ProgressCaller})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { init.Close() })
	target, err := New(nixl.Config{Name: "target", Progress: nixl.ProgressSpin})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { target.Close() })
	if p := init.Info().Details["progress"]; !strings.Contains(p, "polled by the caller") {
		t.Errorf("initiator's progress %q", p)
	}
	if p := target.Info().Details["progress"]; !strings.Contains(p, "spinning") {
		t.Errorf("target's progress %q", p)
	}
	ib, tb := buffer(t, init, 1<<20), buffer(t, target, 1<<20)
	remote := connect(t, init, target)
	connect(t, target, init)
	copy(ib.Bytes(), bytes.Repeat([]byte{0xab}, 1<<20))
	const n = 200
	for i := range n {
		off := i % 256 * 4096
		r, err := init.CreateXferReq(nixl.Write, nixl.DRAM, []nixl.Desc{ib.Desc(off, 4096)}, nixl.DRAM, []nixl.Desc{tb.Desc(off, 4096)}, remote, []byte(fmt.Sprint(i)))
		if err != nil {
			t.Fatal(err)
		}
		waitDone(t, init, r)
		if err := init.ReleaseXferReq(r); err != nil {
			t.Fatal(err)
		}
	}
	var got int
	for deadline := time.Now().Add(10 * time.Second); got < n && time.Now().Before(deadline); {
		m, _ := target.GetNotifs()
		got += len(m["initiator"])
	}
	if got != n {
		t.Errorf("%d notifications, want %d", got, n)
	}
	if !bytes.Equal(tb.Bytes()[:200*4096], bytes.Repeat([]byte{0xab}, 200*4096)) {
		t.Error("the target's buffer does not hold what was written")
	}
}

// A spinning target polls for notifications hundreds of thousands of
// times a second: a poll that allocates runs Go's GC every few tens of
// milliseconds, and its mark worker takes a core from the transfer (1 MiB
// x 1 WRITEs read 0.89 of nixlbench with the allocation, 0.93-0.97
// without). nixltest's TestStatusPollsDoNotAllocate covers status polls.
func TestNotifPollDoesNotAllocate(t *testing.T) {
	needNIXL(t)
	ta, ok := open(t, "target").(*agent)
	if !ok {
		t.Fatal("open returned another agent type")
	}
	fetch := func() {
		ta.mu.Lock()
		defer ta.mu.Unlock()
		if _, err := ta.fetchLocked(); err != nil {
			t.Fatal(err)
		}
	}
	if n := testing.AllocsPerRun(1000, fetch); n != 0 {
		t.Errorf("a notification poll that finds none allocates %.1f times", n)
	}
}
