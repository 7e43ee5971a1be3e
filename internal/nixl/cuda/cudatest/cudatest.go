// Package cudatest chooses the CUDA driver that nixlctl's tests use and,
// on machines without a GPU, builds the FAKE driver (testdata/fakecuda.c:
// host memory posing as device memory, copies on threads, IPC over memfds)
// so that the cuda package, the cuda-ipc backend and `bench xfer` on VRAM
// run for real in CI. Only tests import this package; nixlctl refuses the
// fake outside test binaries.
//
// A test package calls Setup from TestMain, or initialises a variable with
// MustSetup, so the choice is made before anything loads CUDA.
//
// NIXLCTL_TEST_CUDA picks the driver:
//
//	(unset)  the real driver where libcuda.so.1 is installed, else the fake
//	fake     the fake, even on a GPU machine
//	real     the real driver only: GPU tests skip without one
//	off      no driver: every GPU test skips with the reason
package cudatest

import (
	"crypto/sha256"
	_ "embed"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/nixlctl/nixlctl/internal/nixl/cuda"
)

//go:embed testdata/fakecuda.c
var fakeSource []byte

// EnvMode selects the driver for tests (see the package comment).
const EnvMode = "NIXLCTL_TEST_CUDA"

// Setup prepares the driver for this test process and the child processes
// it starts: it sets NIXLCTL_CUDA_LIB in the environment (children inherit
// it, and NIXLCTL_TEST_CUDA, so they choose alike) before anything loads
// CUDA, and returns the chosen mode ("fake", "real" or "off"). The fake is
// built once per version of its source into the user's cache directory.
func Setup() (mode string, err error) {
	mode = os.Getenv(EnvMode)
	switch mode {
	case "":
		mode = "fake"
		if realDriver() {
			mode = "real"
		}
	case "fake", "real", "off":
	default:
		return "", fmt.Errorf("%s=%q: want fake, real or off", EnvMode, mode)
	}
	switch mode {
	case "real":
		return mode, nil
	case "off":
		// Without a driver the loader gives its own reason; with one, this
		// turns it off.
		if realDriver() {
			os.Setenv(cuda.EnvLib, "none")
		}
		return mode, nil
	}
	lib, err := cachedFake()
	if err != nil {
		return "", err
	}
	os.Setenv(cuda.EnvLib, lib)
	return mode, nil
}

// MustSetup is Setup for a package-level variable of a test file, which is
// initialised before TestMain and every test: on failure it says why and
// exits the test binary.
func MustSetup() string {
	mode, err := Setup()
	if err != nil {
		fmt.Fprintln(os.Stderr, "cudatest:", err)
		os.Exit(1)
	}
	return mode
}

// cachedFake returns the fake driver built from this source with this
// compiler, building it first if needed. Concurrent test binaries may race
// to build it: each builds into its own file and renames it into place.
func cachedFake() (string, error) {
	base, err := os.UserCacheDir()
	if err != nil {
		base = os.TempDir()
	}
	h := sha256.New()
	h.Write(fakeSource)
	h.Write([]byte(cuda.Header))
	h.Write([]byte(compiler()))
	dir := filepath.Join(base, "nixlctl", "fake-cuda", hex.EncodeToString(h.Sum(nil))[:16])
	lib := filepath.Join(dir, "libcuda-nixlctl-fake.so")
	if _, err := os.Stat(lib); err == nil {
		return lib, nil
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	tmp, err := os.MkdirTemp(dir, "build-")
	if err != nil {
		return "", err
	}
	defer os.RemoveAll(tmp)
	built, err := BuildFake(tmp)
	if err != nil {
		return "", err
	}
	return lib, os.Rename(built, lib)
}

func compiler() string {
	if cc := os.Getenv("CC"); cc != "" {
		return cc
	}
	return "gcc"
}

// BuildFake compiles the fake driver into dir, beside the cuda package's
// shim.h (cuda.Header), which it includes, and returns the library's path.
// $CC is used when set.
func BuildFake(dir string) (string, error) {
	src := filepath.Join(dir, "fakecuda.c")
	if err := os.WriteFile(src, fakeSource, 0o644); err != nil {
		return "", err
	}
	if err := os.WriteFile(filepath.Join(dir, "shim.h"), []byte(cuda.Header), 0o644); err != nil {
		return "", err
	}
	lib := filepath.Join(dir, "libcuda-nixlctl-fake.so")
	out, err := exec.Command(compiler(), "-shared", "-fPIC", "-O1", "-Wall", "-o", lib, src, "-lpthread").CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("building the fake CUDA driver: %v\n%s", err, out)
	}
	return lib, nil
}

// realDriver reports whether libcuda.so.1 is installed where the dynamic
// loader looks, without loading it (loading is once per process, and the
// process may still choose the fake).
func realDriver() bool {
	dirs := filepath.SplitList(os.Getenv("LD_LIBRARY_PATH"))
	dirs = append(dirs, "/usr/lib/x86_64-linux-gnu", "/usr/lib64", "/usr/lib", "/usr/local/nvidia/lib64", "/usr/lib/wsl/lib")
	for _, d := range dirs {
		if _, err := os.Stat(filepath.Join(d, "libcuda.so.1")); err == nil {
			return true
		}
	}
	if out, err := exec.Command("ldconfig", "-p").Output(); err == nil {
		return strings.Contains(string(out), "libcuda.so.1 ")
	}
	return false
}

// Require skips the test, with the reason, when no CUDA driver is usable.
func Require(t testing.TB) {
	t.Helper()
	if ok, why := cuda.Available(); !ok {
		t.Skipf("no CUDA driver: %s", why)
	}
}

// RequireDevices skips the test unless n GPUs are visible.
func RequireDevices(t testing.TB, n int) {
	t.Helper()
	Require(t)
	if got := cuda.DeviceCount(); got < n {
		t.Skipf("needs %d GPUs, %d visible", n, got)
	}
}
