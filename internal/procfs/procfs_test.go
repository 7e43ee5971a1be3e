package procfs

import (
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/nixlctl/nixlctl/internal/testkit"
)

func TestParseProcStatus(t *testing.T) {
	t.Parallel()
	got, err := ParseProcStatus([]byte(testkit.ProcStatus))
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
	t.Parallel()
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

func FuzzParseProcStatus(f *testing.F) {
	f.Add([]byte(testkit.ProcStatus))
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
