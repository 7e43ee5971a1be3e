package clocksync

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestSameHost(t *testing.T) {
	h := HostIdentity{BootID: "b1", PIDNamespace: "pid:[1]", TimeNamespace: "time:[1]"}
	with := func(f func(*HostIdentity)) HostIdentity { c := h; f(&c); return c }
	for _, tc := range []struct {
		name string
		a, b HostIdentity
		want bool
	}{
		{"identical", h, h, true},
		{"other boot", h, with(func(c *HostIdentity) { c.BootID = "b2" }), false},
		{"other PID namespace", h, with(func(c *HostIdentity) { c.PIDNamespace = "pid:[2]" }), false},
		{"other time namespace", h, with(func(c *HostIdentity) { c.TimeNamespace = "time:[2]" }), false},
		{"no time namespaces on either", with(func(c *HostIdentity) { c.TimeNamespace = "" }), with(func(c *HostIdentity) { c.TimeNamespace = "" }), true},
		{"unknown is never the same", HostIdentity{}, HostIdentity{}, false},
	} {
		if got := SameHost(tc.a, tc.b); got != tc.want {
			t.Errorf("%s: SameHost = %v", tc.name, got)
		}
	}
}

// fakeProc builds a /proc with the files ReadHostIdentity reads; an empty
// value leaves that file out.
func fakeProc(t *testing.T, bootID, pidNS, timeNS string) string {
	t.Helper()
	root := t.TempDir()
	if err := os.MkdirAll(filepath.Join(root, "sys/kernel/random"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Join(root, "self/ns"), 0o755); err != nil {
		t.Fatal(err)
	}
	if bootID != "" {
		if err := os.WriteFile(filepath.Join(root, "sys/kernel/random/boot_id"), []byte(bootID), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	for name, target := range map[string]string{"pid": pidNS, "time": timeNS} {
		if target != "" {
			if err := os.Symlink(target, filepath.Join(root, "self/ns", name)); err != nil {
				t.Fatal(err)
			}
		}
	}
	return root
}

func TestReadHostIdentity(t *testing.T) {
	for _, tc := range []struct {
		name                  string
		bootID, pidNS, timeNS string
		want                  HostIdentity
		wantErr               string
	}{
		{"all", "abc\n", "pid:[4026531836]", "time:[4026531834]",
			HostIdentity{"abc", "pid:[4026531836]", "time:[4026531834]"}, ""},
		{"kernel without time namespaces", "abc\n", "pid:[1]", "", HostIdentity{"abc", "pid:[1]", ""}, ""},
		{"no boot id", "", "pid:[1]", "time:[1]", HostIdentity{}, "boot_id"},
		{"empty boot id", "\n", "pid:[1]", "time:[1]", HostIdentity{}, "boot_id is empty"},
		{"no PID namespace", "abc", "", "time:[1]", HostIdentity{}, "ns/pid"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := readHostIdentity(fakeProc(t, tc.bootID, tc.pidNS, tc.timeNS))
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err %v, want it to name %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if d := cmp.Diff(tc.want, got); d != "" {
				t.Error(d)
			}
		})
	}
}

// This process and itself read one clock.
func TestReadHostIdentityLive(t *testing.T) {
	a, err := ReadHostIdentity()
	if err != nil {
		t.Skipf("no /proc here: %v", err)
	}
	b, err := ReadHostIdentity()
	if err != nil {
		t.Fatal(err)
	}
	if !SameHost(a, b) {
		t.Errorf("%+v is not the same host as itself", a)
	}
}

// A time namespace shifts CLOCK_MONOTONIC while the boot id and PID
// namespace stay the same (`unshare --time --monotonic 3600`), which is how
// two hosts' clocks are reproduced on one machine; the identity must tell
// such a process apart or its offset would be taken as zero. The test runs
// itself under unshare, which needs root: elsewhere it skips.
func TestTimeNamespaceIsAnotherClock(t *testing.T) {
	if os.Getenv("CLOCKSYNC_PRINT_IDENTITY") == "1" {
		h, err := ReadHostIdentity()
		if err != nil {
			t.Fatal(err)
		}
		fmt.Printf("identity %s %s %s\n", h.BootID, h.PIDNamespace, h.TimeNamespace)
		return
	}
	self, err := ReadHostIdentity()
	if err != nil || self.TimeNamespace == "" {
		t.Skipf("no time namespaces here (%v)", err)
	}
	unshare, err := exec.LookPath("unshare")
	if err != nil {
		t.Skip("no unshare")
	}
	cmd := exec.Command(unshare, "--time", "--monotonic", "3600", os.Args[0], "-test.run=^TestTimeNamespaceIsAnotherClock$")
	cmd.Env = append(os.Environ(), "CLOCKSYNC_PRINT_IDENTITY=1")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Skipf("cannot make a time namespace here: %v: %s", err, out)
	}
	var other HostIdentity
	for line := range strings.Lines(string(out)) {
		if f := strings.Fields(line); len(f) == 4 && f[0] == "identity" {
			other = HostIdentity{f[1], f[2], f[3]}
		}
	}
	if other.BootID != self.BootID || other.PIDNamespace != self.PIDNamespace {
		t.Fatalf("child %+v, self %+v: expected the same boot and PID namespace (output %s)", other, self, out)
	}
	if SameHost(self, other) {
		t.Errorf("a process in another time namespace (%s) counts as the same clock as %s", other.TimeNamespace, self.TimeNamespace)
	}
}

// One kernel and one time namespace is one clock, whatever the PID
// namespaces; another time namespace or kernel is not.
func TestSameClock(t *testing.T) {
	t.Parallel()
	a := HostIdentity{BootID: "b1", PIDNamespace: "pid:[1]", TimeNamespace: "time:[7]"}
	tests := []struct {
		name string
		b    HostIdentity
		want bool
	}{
		{"same", a, true},
		{"other pid namespace", HostIdentity{BootID: "b1", PIDNamespace: "pid:[2]", TimeNamespace: "time:[7]"}, true},
		{"other time namespace", HostIdentity{BootID: "b1", PIDNamespace: "pid:[1]", TimeNamespace: "time:[8]"}, false},
		{"other kernel", HostIdentity{BootID: "b2", PIDNamespace: "pid:[1]", TimeNamespace: "time:[7]"}, false},
	}
	for _, tc := range tests {
		if got := SameClock(a, tc.b); got != tc.want {
			t.Errorf("%s: SameClock = %v", tc.name, got)
		}
	}
	if SameClock(HostIdentity{}, HostIdentity{}) {
		t.Error("two unread identities are one clock")
	}
}
