package hostload

import (
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"github.com/nixlctl/nixlctl/internal/testkit"
)

func TestParseStatBusy(t *testing.T) {
	type parsed struct {
		Busy uint64
		CPUs int
	}
	for name, tc := range map[string]struct {
		in   string
		want parsed
		err  string
	}{
		"two cpus with steal":         {"cpu  100 5 20 900 7 3 2 4 0 0\ncpu0 50 2 10 450 3 1 1 2 0 0\ncpu1 50 3 10 450 4 2 1 2 0 0\nintr 1\n", parsed{134, 2}, ""},
		"an old kernel without steal": {"cpu 10 0 5 100 1 1 1\ncpu0 10 0 5 100 1 1 1\n", parsed{17, 1}, ""},
		"no aggregate line":           {"cpu0 1 2 3 4 5 6 7 8\n", parsed{}, "no aggregate cpu line"},
		"too few fields":              {"cpu 1 2 3\n", parsed{}, "at least 8"},
		"a field that is no number":   {"cpu 1 2 x 4 5 6 7 8\n", parsed{}, "cpu field 3"},
	} {
		t.Run(name, func(t *testing.T) {
			busy, cpus, err := ParseStatBusy([]byte(tc.in))
			testkit.WantResult(t, parsed{busy, cpus}, err, tc.want, tc.err)
		})
	}
}

func TestParseProcStat(t *testing.T) {
	// A command name with spaces and a ')' of its own.
	in := "4242 (my (odd) name) S 17 4242 4242 0 -1 4194560 100 0 0 0 250 40 7 3 20 0 4 0 1000 0 0"
	got, err := ParseProcStat([]byte(in))
	if err != nil {
		t.Fatal(err)
	}
	if want := (ProcTimes{PPID: 17, Ticks: 290, ChildTicks: 10}); got != want {
		t.Fatalf("got %+v, want %+v", got, want)
	}
	for _, bad := range []string{"", "1 (x S 1", "1 (x) S 1 2 3", "1 (x) S 1 1 1 0 -1 0 0 0 0 0 5 5 -1 0 20"} {
		if _, err := ParseProcStat([]byte(bad)); err == nil {
			t.Errorf("%q: no error", bad)
		}
	}
}

func TestOwnTicksCountsTheTreeOnce(t *testing.T) {
	procs := map[int]ProcTimes{
		1:  {PPID: 0, Ticks: 1000},              // init: not ours
		10: {PPID: 1, Ticks: 5, ChildTicks: 7},  // self, with a waited-for child
		11: {PPID: 10, Ticks: 20},               // an endpoint it started
		12: {PPID: 11, Ticks: 3, ChildTicks: 1}, // its helper
		20: {PPID: 1, Ticks: 40},                // an endpoint started by hand
		21: {PPID: 20, Ticks: 2},
		30: {PPID: 1, Ticks: 500}, // a neighbour
	}
	// 11 given as an extra too: counted once.
	if got, want := OwnTicks(procs, 10, []int{20, 11, 99}), uint64(5+7+20+3+1+40+2); got != want {
		t.Fatalf("own ticks %d, want %d", got, want)
	}
}

func TestOthersAndSummary(t *testing.T) {
	t0 := time.Unix(1000, 0)
	at := func(s float64) time.Time { return t0.Add(time.Duration(s * float64(time.Second))) }
	// Two seconds of a quiet host, then two in which a neighbour took a
	// whole CPU (200 ticks not ours), then a sample where our own time
	// grew more than the host's (sampling skew): 0, not negative.
	ss := []Sample{
		{At: at(0), BusyTicks: 1000, OwnTicks: 400, CPUs: 2},
		{At: at(2), BusyTicks: 1300, OwnTicks: 695, CPUs: 2},
		{At: at(4), BusyTicks: 1800, OwnTicks: 995, CPUs: 2},
		{At: at(5), BusyTicks: 1900, OwnTicks: 1100, CPUs: 2},
	}
	got, err := Summarize(ss)
	if err != nil {
		t.Fatal(err)
	}
	want := Summary{CPUs: 2, Samples: 4, MeanCPUs: (900 - 700) / 100.0 / 5, MaxCPUs: 1.0}
	if diff := cmp.Diff(want, got, cmpopts.EquateApprox(0, 1e-9)); diff != "" {
		t.Fatalf("summary (-want +got):\n%s", diff)
	}
	if w := got.Warning(); !strings.Contains(w, "other processes used 0.40 of this host's 2 CPUs") || !strings.Contains(w, "1.00 at the most") {
		t.Errorf("warning %q", w)
	}
	quiet := Summary{CPUs: 2, Samples: 3, MeanCPUs: 0.03, MaxCPUs: 0.1}
	if w := quiet.Warning(); w != "" {
		t.Errorf("a quiet host warned: %q", w)
	}
	for _, bad := range [][]Sample{ss[:1], {ss[1], ss[0]}, {ss[0], {At: at(1), BusyTicks: 10}}} {
		if _, err := Summarize(bad); err == nil {
			t.Errorf("%+v: no error", bad)
		}
	}
}

// On real processes: a child's work, once waited for, is the run's own;
// the same work in a process that is not below this one (its parent
// exited at once) is not, and shows in the host's busy time instead.
func TestSamplerOnRealProcesses(t *testing.T) {
	if _, err := os.Stat("/proc/stat"); err != nil {
		t.Skip("no /proc/stat:", err)
	}
	const work = "i=0; while [ $i -lt 200000 ]; do i=$((i+1)); done"
	s := NewSampler()
	a, err := s.Read()
	if err != nil {
		t.Fatal(err)
	}
	child := exec.Command("sh", "-c", work)
	if err := child.Run(); err != nil {
		t.Fatal(err)
	}
	childTicks := (child.ProcessState.UserTime() + child.ProcessState.SystemTime()).Seconds() * userHZ
	// The neighbour stops itself when its work is done, so that its time
	// can still be read; its stdout is not ours to wait for.
	out, err := exec.Command("sh", "-c", "sh -c '"+work+"; kill -STOP $$' >/dev/null 2>&1 & echo $!").Output()
	if err != nil {
		t.Fatal(err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(out)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = syscall.Kill(pid, syscall.SIGKILL) })
	statFile := filepath.Join("/proc", strconv.Itoa(pid), "stat")
	var nb ProcTimes
	for { // until it has stopped itself: its work is done
		b, err := os.ReadFile(statFile)
		if err != nil {
			t.Fatal(err)
		}
		if i := strings.LastIndexByte(string(b), ')'); i > 0 && strings.HasPrefix(string(b[i+1:]), " T") {
			if nb, err = ParseProcStat(b); err != nil {
				t.Fatal(err)
			}
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	b, err := s.Read()
	if err != nil {
		t.Fatal(err)
	}
	own, busy := float64(b.OwnTicks-a.OwnTicks), float64(b.BusyTicks-a.BusyTicks)
	if childTicks < 5 || nb.Ticks < 5 {
		t.Skipf("the work took %.0f and %d ticks: too little to tell apart", childTicks, nb.Ticks)
	}
	if own < childTicks-2 {
		t.Errorf("own ticks grew by %.0f, less than the waited-for child's %.0f", own, childTicks)
	}
	// Tick accounting of the host and of a process are sampled apart:
	// allow a tenth.
	if others := busy - own; others < 0.9*float64(nb.Ticks)-2 {
		t.Errorf("others' ticks %.0f (busy %.0f, own %.0f), less than the neighbour's %d", others, busy, own, nb.Ticks)
	}
	procs, err := s.procs()
	if err != nil {
		t.Fatal(err)
	}
	if with, without := OwnTicks(procs, s.self, []int{pid}), OwnTicks(procs, s.self, nil); with-without != nb.Ticks+nb.ChildTicks {
		t.Errorf("the neighbour given as an extra added %d ticks, want its %d", with-without, nb.Ticks+nb.ChildTicks)
	}
}

func FuzzParseProcStat(f *testing.F) {
	f.Add([]byte("4242 (my (odd) name) S 17 4242 4242 0 -1 4194560 100 0 0 0 250 40 7 3 20 0 4 0 1000 0 0"))
	f.Add([]byte("1 (x) S"))
	f.Fuzz(func(t *testing.T, b []byte) {
		// No panic on any bytes; what parses has a parent.
		if p, err := ParseProcStat(b); err == nil && p.PPID < 0 && !strings.Contains(string(b), "-") {
			t.Fatalf("negative parent %d from no minus sign", p.PPID)
		}
	})
}

func FuzzParseStatBusy(f *testing.F) {
	f.Add([]byte("cpu  100 5 20 900 7 3 2 4 0 0\ncpu0 50 2 10 450 3 1 1 2 0 0\n"))
	f.Add([]byte("cpu 1 2 3\n"))
	f.Fuzz(func(t *testing.T, b []byte) {
		if _, cpus, err := ParseStatBusy(b); err == nil && cpus < 1 {
			t.Fatalf("%d CPUs without an error", cpus)
		}
	})
}

func TestRecorderIntoField(t *testing.T) {
	var f Field
	if _, err := f.Record(nil); err == nil || f.HostOthers != nil {
		t.Fatalf("no recorder: err %v, field %+v", err, f.HostOthers)
	}
	rec := NewRecorder()
	if err := rec.Take(); err != nil {
		t.Skip("no /proc here:", err)
	}
	if _, err := f.Record(rec); err == nil || f.HostOthers != nil {
		t.Fatalf("one sample: err %v, field %+v", err, f.HostOthers)
	}
	if err := rec.Take(); err != nil {
		t.Fatal(err)
	}
	if _, err := f.Record(rec); err != nil || f.HostOthers == nil || f.HostOthers.Samples != 2 || f.HostOthers.CPUs < 1 {
		t.Fatalf("two samples: err %v, field %+v", err, f.HostOthers)
	}
}

// BenchmarkSamplerRead is what one sample costs: /proc/stat and every
// process's stat, taken between a handoff's rounds and after each bench
// xfer point, outside the timed work.
func BenchmarkSamplerRead(b *testing.B) {
	s := NewSampler()
	for b.Loop() {
		if _, err := s.Read(); err != nil {
			b.Fatal(err)
		}
	}
}
