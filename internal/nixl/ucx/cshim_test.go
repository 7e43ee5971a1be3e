package ucx

import (
	"context"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestCShim builds testdata/shim_test.c with the package's C files and runs
// its cases, each in a process of its own: the notification queue, and the
// transfer state machine over a loopback between two agents. The C side
// asserts; a failed check is a non-zero exit.
func TestCShim(t *testing.T) {
	gcc, err := exec.LookPath("gcc")
	if err != nil {
		t.Skipf("no C compiler to build the C test: %v", err)
	}
	if _, err := exec.LookPath("pkg-config"); err != nil {
		t.Skipf("no pkg-config to find UCX for the C test: %v", err)
	}
	ucxFlags, err := exec.Command("pkg-config", "--cflags", "--libs", "ucx").Output()
	if err != nil {
		t.Skipf("pkg-config knows no ucx (libucx-dev missing?): %v", err)
	}
	srcs, err := filepath.Glob("*.c")
	if err != nil || len(srcs) == 0 {
		t.Fatalf("the shim's C files: %v %v", srcs, err)
	}
	bin := filepath.Join(t.TempDir(), "shim_test")
	args := append([]string{"-O2", "-Wall", "-pthread", "-I.", "-o", bin, filepath.Join("testdata", "shim_test.c")}, srcs...)
	args = append(args, strings.Fields(string(ucxFlags))...)
	args = append(args, "-ldl")
	if out, err := exec.Command(gcc, args...).CombinedOutput(); err != nil {
		t.Fatalf("gcc %s: %v\n%s", strings.Join(args, " "), err, out)
	} else if len(out) > 0 {
		t.Logf("gcc: %s", out)
	}
	for _, c := range []string{"notif", "xfer"} {
		t.Run(c, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			out, err := exec.CommandContext(ctx, bin, c).CombinedOutput()
			t.Logf("%s", out)
			if err != nil {
				t.Fatalf("shim_test %s: %v", c, err)
			}
		})
	}
}
