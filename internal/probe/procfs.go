package probe

import (
	"bytes"
	"fmt"
	"os"
	"time"

	"github.com/nixlctl/nixlctl/internal/procfs"
)

// Sample is one look at a process's memory and handles, in the units the
// kernel reports them in /proc/PID/status (converted to bytes).
type Sample struct {
	T      float64 `json:"t"`      // seconds since sampling started
	RSS    int64   `json:"rss"`    // VmRSS, bytes
	VmData int64   `json:"vmdata"` // VmData (private data + anonymous mappings), bytes
	Maps   int     `json:"maps"`   // lines of /proc/PID/maps
	FDs    int     `json:"fds"`    // entries of /proc/PID/fd
}

// procRoot is where /proc is (tests point it at a fake tree).
type procFS struct{ root string }

var realProc = procFS{root: "/proc"}

// sample reads one Sample of pid; t is filled in by the caller.
func (p procFS) sample(pid int) (Sample, error) {
	dir := fmt.Sprintf("%s/%d", p.root, pid)
	b, err := os.ReadFile(dir + "/status")
	if err != nil {
		return Sample{}, err
	}
	st, err := procfs.ParseProcStatus(b)
	if err != nil {
		return Sample{}, fmt.Errorf("%s/status: %w", dir, err)
	}
	maps, err := os.ReadFile(dir + "/maps")
	if err != nil {
		return Sample{}, err
	}
	fds, err := os.ReadDir(dir + "/fd")
	if err != nil {
		return Sample{}, err
	}
	return Sample{RSS: st.RSS, VmData: st.VmData, Maps: bytes.Count(maps, []byte{'\n'}), FDs: len(fds)}, nil
}

// Sampler samples one process at a fixed interval.
type Sampler struct {
	PID      int
	Interval time.Duration
	proc     procFS
}

// NewSampler samples pid's /proc entries.
func NewSampler(pid int, interval time.Duration) *Sampler {
	return &Sampler{PID: pid, Interval: interval, proc: realProc}
}

// Run samples until duration has passed (measured from the first
// sample), stop is closed or the process cannot be read any more; each
// sample is passed to each (which may be nil) as it is taken. It returns
// the samples taken and, when it stopped because sampling failed, why.
// Samples are taken on a ticker, so a slow sample delays the next one but
// never shifts the schedule; T is the real time of each sample.
func (s *Sampler) Run(duration time.Duration, stop <-chan struct{}, each func(Sample)) ([]Sample, error) {
	var out []Sample
	start := time.Now()
	tick := time.NewTicker(s.Interval)
	defer tick.Stop()
	for {
		smp, err := s.proc.sample(s.PID)
		if err != nil {
			return out, fmt.Errorf("sample pid %d: %w", s.PID, err)
		}
		smp.T = time.Since(start).Seconds()
		out = append(out, smp)
		if each != nil {
			each(smp)
		}
		if time.Since(start)+s.Interval/2 > duration {
			return out, nil
		}
		select {
		case <-stop:
			return out, nil
		case <-tick.C:
		}
	}
}
