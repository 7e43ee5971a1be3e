package cpuspeed

import (
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"testing"

	"go.uber.org/goleak"
)

func TestMeasureReadsEveryCPU(t *testing.T) {
	defer goleak.VerifyNone(t)
	r, err := Measure()
	if err != nil {
		t.Fatal(err)
	}
	if len(r.CPUs) == 0 || len(r.NS) != len(r.CPUs) {
		t.Fatalf("reading %+v: want one value per CPU", r)
	}
	for i, ns := range r.NS {
		// A multiply-add step is a few cycles: between 0.05 ns (a 20 GHz
		// CPU) and 1 us (a host stopped for the whole loop) is a reading.
		if ns < 0.05 || ns > 1000 {
			t.Errorf("CPU %d: %.3f ns a step is not a plausible reading", r.CPUs[i], ns)
		}
	}
}

func TestMeasureCPUsRefusesACPUItMayNotUse(t *testing.T) {
	if _, err := MeasureCPUs([]int{1 << 20}); err == nil {
		t.Fatal("pinning to CPU 1048576 succeeded")
	}
}

func TestSummarize(t *testing.T) {
	for _, tc := range []struct {
		name      string
		readings  [][]float64
		wantSwing float64
		warn      bool
	}{
		{"none", nil, 0, false},
		{"one reading cannot swing", [][]float64{{1, 3}}, 1, false},
		{"steady", [][]float64{{1.0, 1.1}, {1.05, 1.1}, {1.0, 1.12}}, 1.12 / 1.1, false},
		{"slowed", [][]float64{{1.0, 1.0}, {2.0, 1.0}, {1.0, 1.1}}, 2, true},
		{"zero readings are skipped", [][]float64{{0}, {1}, {1.2}}, 1.2, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var rs []Reading
			for _, ns := range tc.readings {
				rs = append(rs, Reading{NS: ns, CPUs: make([]int, len(ns))})
			}
			s := Summarize(rs)
			if d := s.Swing - tc.wantSwing; d > 1e-9 || d < -1e-9 {
				t.Errorf("swing %.4f, want %.4f", s.Swing, tc.wantSwing)
			}
			if got := s.Warning() != ""; got != tc.warn {
				t.Errorf("warning %q, want one: %v", s.Warning(), tc.warn)
			}
		})
	}
}

func BenchmarkMeasure(b *testing.B) {
	for b.Loop() {
		if _, err := Measure(); err != nil {
			b.Fatal(err)
		}
	}
}

// Children started with a parent-death signal are killed when the thread
// that forked them ends: a reading must leave every thread it used alive
// (it once ended them, which killed the endpoints of a run mid-way).
func TestMeasureKeepsItsThreads(t *testing.T) {
	var kids []*exec.Cmd
	var wg sync.WaitGroup
	var mu sync.Mutex
	for range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c := exec.Command("sleep", "60")
			c.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
			if err := c.Start(); err != nil {
				t.Error(err)
				return
			}
			mu.Lock()
			kids = append(kids, c)
			mu.Unlock()
		}()
	}
	wg.Wait()
	defer func() {
		for _, c := range kids {
			_ = c.Process.Kill()
			_ = c.Wait()
		}
	}()
	for range 20 {
		if _, err := Measure(); err != nil {
			t.Fatal(err)
		}
	}
	for _, c := range kids {
		// Signal 0: is it still there (a killed child is a zombie until
		// waited for, so ask /proc for its state instead).
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", c.Process.Pid))
		if err != nil || strings.Contains(string(b), ") Z ") {
			t.Fatalf("child %d was killed while readings were taken (its parent thread ended)", c.Process.Pid)
		}
	}
}
