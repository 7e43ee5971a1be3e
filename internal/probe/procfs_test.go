package probe

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/nixlctl/nixlctl/internal/testkit"
)

// A fake /proc tree: the sampler reads status, maps and fd/ of a pid.
func TestSamplerOnFakeProc(t *testing.T) {
	root := t.TempDir()
	dir := filepath.Join(root, "42")
	if err := os.MkdirAll(filepath.Join(dir, "fd"), 0o755); err != nil {
		t.Fatal(err)
	}
	write := func(name, s string) {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("status", testkit.ProcStatus)
	write("maps", strings.Repeat("00400000-00452000 r-xp 00000000 08:02 173521 /usr/bin/x\n", 7))
	for _, fd := range []string{"0", "1", "2"} {
		write("fd/"+fd, "")
	}
	s := &Sampler{PID: 42, Interval: 10 * time.Millisecond, proc: procFS{root: root}}
	var seen int
	got, err := s.Run(45*time.Millisecond, nil, func(Sample) { seen++ })
	if err != nil {
		t.Fatal(err)
	}
	if len(got) < 3 || seen != len(got) {
		t.Fatalf("%d samples (%d reported) in 45ms at 10ms", len(got), seen)
	}
	if d := cmp.Diff(Sample{T: got[0].T, RSS: 85232 << 10, VmData: 180312 << 10, Maps: 7, FDs: 3}, got[0]); d != "" {
		t.Error(d)
	}
	for i := 1; i < len(got); i++ {
		if got[i].T <= got[i-1].T {
			t.Errorf("times not increasing: %v", got)
		}
	}
	// The process went away: sampling stops with the samples so far.
	if err := os.RemoveAll(dir); err != nil {
		t.Fatal(err)
	}
	got, err = s.Run(time.Second, nil, nil)
	if err == nil || len(got) != 0 {
		t.Errorf("vanished process: %d samples, err %v", len(got), err)
	}
}

// The real thing: this process.
func TestSampleSelf(t *testing.T) {
	s, err := realProc.sample(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	if s.RSS <= 0 || s.VmData <= 0 || s.Maps < 5 || s.FDs < 3 {
		t.Errorf("implausible sample of this process: %+v", s)
	}
}
