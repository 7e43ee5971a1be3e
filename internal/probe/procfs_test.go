package probe

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

const statusSample = `Name:	nixlctl
Umask:	0022
State:	S (sleeping)
VmPeak:	 1298520 kB
VmSize:	 1233048 kB
VmRSS:	   85232 kB
RssAnon:	   40000 kB
VmData:	  180312 kB
VmStk:	     132 kB
Threads:	9
`

func TestParseProcStatus(t *testing.T) {
	got, err := ParseProcStatus([]byte(statusSample))
	if err != nil {
		t.Fatal(err)
	}
	if d := cmp.Diff(ProcStatus{RSS: 85232 << 10, VmData: 180312 << 10}, got); d != "" {
		t.Error(d)
	}
	for _, bad := range []string{
		"Name:	x\nState:	Z (zombie)\n",                   // a zombie has no Vm lines
		"VmRSS:	12 MB\nVmData:	1 kB\n",                   // wrong unit
		"VmRSS:	-1 kB\nVmData:	1 kB\n",                   // negative
		"VmRSS:	1 kB\n",                                  // VmData missing
		"VmRSS:	99999999999999999999 kB\nVmData:	1 kB\n", // overflow
	} {
		if _, err := ParseProcStatus([]byte(bad)); err == nil {
			t.Errorf("%q: no error", bad)
		}
	}
}

func TestParseMemInfo(t *testing.T) {
	in := "MemTotal:       24684092 kB\nMemFree:        24000000 kB\nMemAvailable:   23100000 kB\nHugePages_Total:      16\nHugePages_Free:       10\nHugePages_Rsvd:        2\nHugePages_Surp:        0\nHugepagesize:       2048 kB\n"
	got, err := ParseMemInfo([]byte(in))
	if err != nil {
		t.Fatal(err)
	}
	want := MemInfo{TotalBytes: 24684092 << 10, AvailableBytes: 23100000 << 10, HugePagesTotal: 16, HugePagesFree: 10, HugePagesRsvd: 2, HugePageBytes: 2 << 20}
	if d := cmp.Diff(want, got); d != "" {
		t.Error(d)
	}
	if _, err := ParseMemInfo([]byte("HugePages_Total: lots\n")); err == nil {
		t.Error("malformed count accepted")
	}
}

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
	write("status", statusSample)
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

func FuzzParseProcStatus(f *testing.F) {
	f.Add([]byte(statusSample))
	f.Add([]byte("VmRSS:\t1 kB\nVmData:\t2 kB"))
	f.Add([]byte("VmRSS:"))
	f.Fuzz(func(t *testing.T, b []byte) {
		st, err := ParseProcStatus(b)
		if err == nil && (st.RSS < 0 || st.VmData < 0) {
			t.Errorf("negative sizes accepted: %+v", st)
		}
	})
}

func FuzzParseMemInfo(f *testing.F) {
	f.Add([]byte("MemTotal: 1 kB\nHugePages_Total: 4\nHugepagesize: 2048 kB\n"))
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := ParseMemInfo(b)
		if err == nil && (m.TotalBytes < 0 || m.HugePagesTotal < 0 || m.HugePageBytes < 0) {
			t.Errorf("negative values accepted: %+v", m)
		}
	})
}
