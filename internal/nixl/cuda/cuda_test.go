package cuda_test

import (
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nixlctl/nixlctl/internal/blocktag"
	"github.com/nixlctl/nixlctl/internal/nixl"
	"github.com/nixlctl/nixlctl/internal/nixl/cuda"
	"github.com/nixlctl/nixlctl/internal/nixl/cuda/cudatest"
)

var mode string

func TestMain(m *testing.M) {
	switch os.Getenv("CUDA_TEST_CHILD") {
	case "refusal":
		// Loading as a command would: the fake must be refused.
		fmt.Print(cuda.LoadAsCommand())
		os.Exit(0)
	case "ipc":
		os.Exit(ipcChild())
	case "reason":
		fmt.Print(cuda.Unavailable())
		os.Exit(0)
	}
	var err error
	if mode, err = cudatest.Setup(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	os.Exit(m.Run())
}

func TestAvailability(t *testing.T) {
	ok, why := cuda.Available()
	t.Logf("mode %s: available %v %q; %s", mode, ok, why, cuda.Version())
	if ok != (why == "") || ok != (cuda.Err() == nil) || ok != (cuda.Version() != "") {
		t.Fatalf("inconsistent: available %v, reason %q, err %v, version %q", ok, why, cuda.Err(), cuda.Version())
	}
	if !ok {
		if !errors.Is(cuda.Err(), nixl.ErrUnavailable) {
			t.Errorf("%v does not wrap ErrUnavailable", cuda.Err())
		}
		if mode == "off" && os.Getenv(cuda.EnvLib) == "" && !strings.Contains(why, "libcuda.so.1 not found") {
			t.Errorf("reason %q should say libcuda.so.1 is missing", why)
		}
		if _, err := cuda.Alloc(0, 4096); !errors.Is(err, nixl.ErrUnavailable) {
			t.Errorf("Alloc without a driver: %v", err)
		}
		return
	}
	if cuda.DeviceCount() < 1 {
		t.Fatal("available with no devices")
	}
	if mode == "fake" && (!cuda.Fake() || !strings.Contains(cuda.Version(), "FAKE")) {
		t.Errorf("the fake driver must say so: %q", cuda.Version())
	}
	name, err := cuda.DeviceName(0)
	if err != nil || name == "" {
		t.Errorf("device name %q: %v", name, err)
	}
	if _, err := cuda.DeviceName(cuda.DeviceCount()); err == nil {
		t.Error("a device past the last one has a name")
	}
	free, total, err := cuda.MemInfo(0)
	if err != nil || total == 0 || free > total {
		t.Errorf("mem info %d/%d: %v", free, total, err)
	}
}

// alloc allocates size bytes on GPU 0, freed when the test ends.
func alloc(t *testing.T, size int) *nixl.Buffer {
	t.Helper()
	b, err := cuda.Alloc(0, size)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Free() })
	return b
}

// child is this test binary run again as the child called kind (see
// TestMain), with env added to the environment.
func child(kind string, env ...string) *exec.Cmd {
	exe, _ := os.Executable()
	cmd := exec.Command(exe)
	cmd.Env = append(append(os.Environ(), "CUDA_TEST_CHILD="+kind), env...)
	return cmd
}

// Each way of having no usable driver gives its own reason (each case
// loads the driver in a fresh process: loading happens once per process).
func TestUnavailableReasons(t *testing.T) {
	dir := t.TempDir()
	stub := dir + "/libcuda-stub.so"
	src := dir + "/stub.c"
	if err := os.WriteFile(src, []byte("int cuInit(unsigned f) { return 0; }\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("gcc", "-shared", "-fPIC", "-o", stub, src).CombinedOutput(); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	cases := []struct {
		env  []string
		want string
	}{
		{[]string{cuda.EnvLib + "=none"}, "disabled by NIXLCTL_CUDA_LIB=none"},
		{[]string{cuda.EnvLib + "=" + dir + "/missing.so"}, "NIXLCTL_CUDA_LIB=" + dir + "/missing.so: stat"},
		{[]string{cuda.EnvLib + "=" + stub}, "has no cuDriverGetVersion (a CUDA driver older than 11.0, or not a CUDA driver)"},
	}
	if cuda.Fake() {
		cases = append(cases, struct {
			env  []string
			want string
		}{[]string{"NIXLCTL_FAKE_CUDA_DEVICES=0", "CUDA_VISIBLE_DEVICES="}, `no CUDA devices (CUDA_VISIBLE_DEVICES="") (driver 12.4)`})
	}
	for _, tc := range cases {
		out, err := child("reason", tc.env...).CombinedOutput()
		if err != nil || !strings.Contains(string(out), tc.want) {
			t.Errorf("%v: %q (%v), want %q", tc.env, out, err, tc.want)
		}
	}
}

// The fake driver is never used outside tests.
func TestFakeRefusedOutsideTests(t *testing.T) {
	if !cuda.Fake() {
		t.Skip("not running on the fake driver")
	}
	out, err := child("refusal").CombinedOutput()
	if err != nil {
		t.Fatal(err, string(out))
	}
	if !strings.Contains(string(out), "fake CUDA driver for tests; it is refused outside test binaries") {
		t.Fatalf("outside a test the fake gave: %s", out)
	}
}

// Spans go to the device and back unchanged; bad spans are refused.
func TestAllocAndHostCopies(t *testing.T) {
	cudatest.Require(t)
	const size = 1 << 20
	b := alloc(t, size)
	if b.Mem != nixl.VRAM || b.Alloc != "cuda" || b.Bytes() != nil || b.Len != size {
		t.Fatalf("buffer %+v", b)
	}
	spans := []nixl.Span{{Off: 0, Len: 4096}, {Off: size - 100, Len: 100}, {Off: 8192, Len: 12345}}
	host := make([]byte, 4096+100+12345)
	at := 0
	for i, s := range spans {
		blocktag.Fill(host[at:at+s.Len], blocktag.Key(1, uint64(i)))
		at += s.Len
	}
	if err := cuda.CopyIn(b, spans, host); err != nil {
		t.Fatal(err)
	}
	back := make([]byte, len(host))
	if err := cuda.CopyOut(b, spans, back); err != nil {
		t.Fatal(err)
	}
	if string(back) != string(host) {
		t.Fatal("device round trip changed the bytes")
	}
	if err := cuda.CopyOut(b, []nixl.Span{{Off: size - 10, Len: 20}}, make([]byte, 20)); err == nil {
		t.Error("a span past the end was copied")
	}
	if err := cuda.CopyOut(b, spans, back[:10]); err == nil {
		t.Error("a short host buffer was accepted")
	}
	dram, _ := nixl.AllocDRAM(4096, false)
	defer dram.Free()
	if err := cuda.CopyIn(dram, []nixl.Span{{Len: 8}}, make([]byte, 8)); err == nil {
		t.Error("CopyIn into DRAM")
	}
	if _, err := cuda.Alloc(cuda.DeviceCount(), 4096); err == nil {
		t.Error("allocated on a device that does not exist")
	}
}

func TestStreamCopiesAndEvents(t *testing.T) {
	cudatest.Require(t)
	const size = 4 << 20
	src := alloc(t, size)
	dst := alloc(t, size)
	all := []nixl.Span{{Len: size}}
	want := make([]byte, size)
	blocktag.Fill(want, blocktag.Key(7))
	if err := cuda.CopyIn(src, all, want); err != nil {
		t.Fatal(err)
	}
	s, err := cuda.NewStream(0)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Destroy()
	ev, err := cuda.NewEvent(0)
	if err != nil {
		t.Fatal(err)
	}
	defer ev.Destroy()
	// Reverse the 64 KiB blocks: a misplaced copy would show.
	const blk = 64 << 10
	var ops []cuda.Copy
	for i := 0; i < size/blk; i++ {
		ops = append(ops, cuda.Copy{Dst: dst.Addr + uint64(size-(i+1)*blk), Src: src.Addr + uint64(i*blk), Len: blk})
	}
	n, err := s.Copy(ops, ev)
	if err != nil || n != len(ops) {
		t.Fatalf("issued %d of %d: %v", n, len(ops), err)
	}
	if err := ev.Wait(); err != nil {
		t.Fatal(err)
	}
	if done, err := ev.Query(); !done || err != nil {
		t.Fatalf("query after wait: %v %v", done, err)
	}
	got := make([]byte, size)
	if err := cuda.CopyOut(dst, all, got); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < size/blk; i++ {
		if string(got[size-(i+1)*blk:size-i*blk]) != string(want[i*blk:(i+1)*blk]) {
			t.Fatalf("block %d landed in the wrong place", i)
		}
	}
	// Copies outside any allocation are refused, not done.
	if _, err := s.Copy([]cuda.Copy{{Dst: dst.Addr + size - 8, Src: src.Addr, Len: 16}}, nil); err == nil {
		t.Error("a copy past the end of an allocation was accepted")
	}
	if err := s.Synchronize(); err != nil {
		t.Fatal(err)
	}
}

func TestD2DBandwidth(t *testing.T) {
	cudatest.Require(t)
	const size = 8 << 20
	a := alloc(t, size)
	b := alloc(t, size)
	spans := []nixl.Span{{Off: 0, Len: 1 << 20}, {Off: 4 << 20, Len: 1 << 20}}
	gbps, err := cuda.D2DBandwidth(a, b, spans, 20*time.Millisecond)
	if err != nil || gbps <= 0 {
		t.Fatalf("%v GB/s: %v", gbps, err)
	}
	t.Logf("device-to-device: %.2f GB/s", gbps)
	h2d, err := cuda.HostCopyBandwidth(a, spans, true, 10*time.Millisecond)
	if err != nil || h2d <= 0 {
		t.Fatalf("host to device %v GB/s: %v", h2d, err)
	}
	if _, err := cuda.D2DBandwidth(a, b, []nixl.Span{{Off: size, Len: 1}}, time.Millisecond); err == nil {
		t.Error("a span outside the buffer was timed")
	}
}

// A second process maps an allocation through its IPC handle, writes
// tags into it (on every GPU), and this process reads them back.
func TestIPCAcrossProcesses(t *testing.T) {
	cudatest.Require(t)
	const size = 1 << 20
	b := alloc(t, size)
	exp, err := cuda.ExportIPC(0, b.Addr+4096)
	if err != nil {
		t.Fatal(err)
	}
	if exp.Base != b.Addr || exp.Size < size {
		t.Fatalf("allocation %#x+%d, buffer %#x+%d", exp.Base, exp.Size, b.Addr, size)
	}
	if _, err := cuda.OpenIPC(0, exp.Handle); err == nil {
		t.Error("opened an IPC handle in the process that exported it")
	}
	for dev := 0; dev < cuda.DeviceCount() && dev < 2; dev++ {
		cmd := child("ipc", "IPC_HANDLE="+hex.EncodeToString(exp.Handle[:]), "IPC_SIZE="+strconv.Itoa(size), "IPC_DEV="+strconv.Itoa(dev))
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("child on GPU %d: %v: %s", dev, err, out)
		}
		host := make([]byte, size)
		if err := cuda.CopyOut(b, []nixl.Span{{Len: size}}, host); err != nil {
			t.Fatal(err)
		}
		if m := blocktag.Check(host, blocktag.Key(99, uint64(dev))); m != nil {
			t.Fatalf("written through IPC from GPU %d: %v", dev, m)
		}
	}
}

func ipcChild() int {
	fail := func(err error) int { fmt.Fprintln(os.Stderr, err); return 1 }
	raw, err := hex.DecodeString(os.Getenv("IPC_HANDLE"))
	if err != nil || len(raw) != 64 {
		return fail(fmt.Errorf("bad handle: %v", err))
	}
	var h cuda.IPCHandle
	copy(h[:], raw)
	size, _ := strconv.Atoi(os.Getenv("IPC_SIZE"))
	dev, _ := strconv.Atoi(os.Getenv("IPC_DEV"))
	addr, err := cuda.OpenIPC(dev, h)
	if err != nil {
		return fail(err)
	}
	// A second open (another agent of this process) shares the mapping;
	// the mapping stays until the last close.
	again, err := cuda.OpenIPC(dev, h)
	if err != nil || again != addr {
		return fail(fmt.Errorf("second open: %#x vs %#x: %v", again, addr, err))
	}
	if err := cuda.CloseIPC(dev, again); err != nil {
		return fail(err)
	}
	mapped := nixl.NewBuffer(addr, size, nixl.VRAM, uint32(dev), "ipc", nil, nil)
	host := make([]byte, size)
	blocktag.Fill(host, blocktag.Key(99, uint64(dev)))
	if err := cuda.CopyIn(mapped, []nixl.Span{{Len: size}}, host); err != nil {
		return fail(err)
	}
	if err := cuda.CloseIPC(dev, addr); err != nil {
		return fail(err)
	}
	if err := cuda.CloseIPC(dev, addr); err == nil {
		return fail(fmt.Errorf("closed an IPC mapping twice"))
	}
	return 0
}
