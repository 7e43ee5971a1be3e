package probe

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"
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

// ProcStatus is what we read from /proc/PID/status.
type ProcStatus struct {
	RSS    int64
	VmData int64
}

// ParseProcStatus reads VmRSS and VmData ("VmRSS:	  12345 kB") from the
// contents of /proc/PID/status. Both must be present: a kernel thread or
// a zombie has neither, and sampling one is an error, not a zero.
func ParseProcStatus(b []byte) (ProcStatus, error) {
	var st ProcStatus
	var haveRSS, haveData bool
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		key, val, ok := strings.Cut(sc.Text(), ":")
		if !ok {
			continue
		}
		var dst *int64
		switch key {
		case "VmRSS":
			dst, haveRSS = &st.RSS, true
		case "VmData":
			dst, haveData = &st.VmData, true
		default:
			continue
		}
		n, err := parseKB(val)
		if err != nil {
			return ProcStatus{}, fmt.Errorf("%s: %w", key, err)
		}
		*dst = n
	}
	if err := sc.Err(); err != nil {
		return ProcStatus{}, err
	}
	if !haveRSS || !haveData {
		return ProcStatus{}, errors.New("no VmRSS/VmData (a zombie or kernel thread?)")
	}
	return st, nil
}

// parseKB parses "  12345 kB" into bytes.
func parseKB(s string) (int64, error) {
	f := strings.Fields(s)
	if len(f) != 2 || f[1] != "kB" {
		return 0, fmt.Errorf("malformed value %q (want \"N kB\")", strings.TrimSpace(s))
	}
	n, err := strconv.ParseInt(f[0], 10, 64)
	if err != nil || n < 0 || n > 1<<50 {
		return 0, fmt.Errorf("malformed value %q", f[0])
	}
	return n * 1024, nil
}

// MemInfo is the part of /proc/meminfo that `probe env` reports.
type MemInfo struct {
	TotalBytes     int64 `json:"total_bytes"`
	AvailableBytes int64 `json:"available_bytes"`
	HugePagesTotal int64 `json:"hugepages_total"`
	HugePagesFree  int64 `json:"hugepages_free"`
	HugePagesRsvd  int64 `json:"hugepages_rsvd"`
	HugePageBytes  int64 `json:"hugepage_bytes"`
}

// ParseMemInfo reads /proc/meminfo contents. HugePages_* are counts, the
// others kB. Unknown lines are ignored; malformed known ones are errors.
func ParseMemInfo(b []byte) (MemInfo, error) {
	var m MemInfo
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		key, val, ok := strings.Cut(sc.Text(), ":")
		if !ok {
			continue
		}
		var err error
		switch key {
		case "MemTotal":
			m.TotalBytes, err = parseKB(val)
		case "MemAvailable":
			m.AvailableBytes, err = parseKB(val)
		case "Hugepagesize":
			m.HugePageBytes, err = parseKB(val)
		case "HugePages_Total":
			m.HugePagesTotal, err = parseCount(val)
		case "HugePages_Free":
			m.HugePagesFree, err = parseCount(val)
		case "HugePages_Rsvd":
			m.HugePagesRsvd, err = parseCount(val)
		}
		if err != nil {
			return MemInfo{}, fmt.Errorf("%s: %w", key, err)
		}
	}
	return m, sc.Err()
}

func parseCount(s string) (int64, error) {
	n, err := strconv.ParseInt(strings.TrimSpace(s), 10, 64)
	if err != nil || n < 0 {
		return 0, fmt.Errorf("malformed count %q", strings.TrimSpace(s))
	}
	return n, nil
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
	st, err := ParseProcStatus(b)
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
