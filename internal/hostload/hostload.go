// Package hostload measures how much of the host's CPU time went to
// processes that are not the run's own while it measured: a neighbour
// that takes a core of a 2-core host makes UCX's spinning progress
// threads wait for it, and every rate of the run (handoff and reference
// alike) collapses by up to 10x for as long as it runs. A run cannot see
// that in its own numbers; it can see it here, and say so.
//
// It reads the kernel's busy time from /proc/stat and the run's own
// processes' time from /proc/PID/stat: the difference is everyone
// else's (other processes, and kernel threads working for no one of
// ours, such as memory reclaim). The parsers do no I/O and are fuzzed.
package hostload

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"
)

// userHZ is the unit of /proc's CPU times: USER_HZ, 100 on every Linux
// architecture Go builds for (the kernel converts to it for /proc).
const userHZ = 100

// ParseStatBusy returns the host's busy CPU time and its CPU count from
// the contents of /proc/stat: the aggregate "cpu" line's user, nice,
// system, irq, softirq and steal ticks (idle and iowait are not busy;
// guest time is already inside user), and how many "cpuN" lines follow.
func ParseStatBusy(b []byte) (busyTicks uint64, cpus int, err error) {
	found := false
	for _, line := range bytes.Split(b, []byte("\n")) {
		f := strings.Fields(string(line))
		if len(f) == 0 {
			continue
		}
		switch {
		case f[0] == "cpu":
			if len(f) < 8 {
				return 0, 0, fmt.Errorf("/proc/stat: cpu line has %d fields, want at least 8", len(f))
			}
			var v [8]uint64
			for i := 1; i < 8; i++ {
				if v[i], err = strconv.ParseUint(f[i], 10, 64); err != nil {
					return 0, 0, fmt.Errorf("/proc/stat: cpu field %d: %w", i, err)
				}
			}
			if len(f) > 8 {
				steal, err := strconv.ParseUint(f[8], 10, 64)
				if err != nil {
					return 0, 0, fmt.Errorf("/proc/stat: cpu steal: %w", err)
				}
				busyTicks += steal
			}
			// user nice system idle iowait irq softirq [steal ...]
			busyTicks += v[1] + v[2] + v[3] + v[6] + v[7]
			found = true
		case strings.HasPrefix(f[0], "cpu"):
			cpus++
		}
	}
	if !found {
		return 0, 0, errors.New("/proc/stat: no aggregate cpu line")
	}
	return busyTicks, max(cpus, 1), nil
}

// ProcTimes is what /proc/PID/stat says about one process's CPU time.
type ProcTimes struct {
	PPID int
	// Ticks is the process's own user and system time, all its threads.
	Ticks uint64
	// ChildTicks is the time of its children that exited and were waited
	// for.
	ChildTicks uint64
}

// ParseProcStat reads a process's parent and CPU times from the contents
// of /proc/PID/stat. The command name (field 2) is in parentheses and may
// hold spaces and parentheses itself: the fields are counted from the
// last ')'.
func ParseProcStat(b []byte) (ProcTimes, error) {
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return ProcTimes{}, errors.New("no ')' after the command name")
	}
	// After ")": state(3) ppid(4) pgrp session tty_nr tpgid flags minflt
	// cminflt majflt cmajflt utime(14) stime(15) cutime(16) cstime(17).
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 15 {
		return ProcTimes{}, fmt.Errorf("%d fields after the command name, want at least 15", len(f))
	}
	ppid, err := strconv.Atoi(f[1])
	if err != nil {
		return ProcTimes{}, fmt.Errorf("ppid: %w", err)
	}
	var t [4]uint64
	for k := range t {
		// cutime and cstime are signed in the kernel's format; a negative
		// one is nonsense, refused rather than wrapped.
		if t[k], err = strconv.ParseUint(f[11+k], 10, 64); err != nil {
			return ProcTimes{}, fmt.Errorf("time field %d: %w", 14+k, err)
		}
	}
	return ProcTimes{PPID: ppid, Ticks: t[0] + t[1], ChildTicks: t[2] + t[3]}, nil
}

// Sample is one reading: the host's busy time and the run's own, at a
// time.
type Sample struct {
	At        time.Time
	BusyTicks uint64
	OwnTicks  uint64
	CPUs      int
}

// Others is the CPU time that went to processes other than the run's
// own between two samples, in CPUs (1.0: one CPU busy all along). The
// two readings are not atomic, and tick accounting is sampled: a small
// negative difference is that, and reads 0.
func Others(a, b Sample) (cores float64, err error) {
	wall := b.At.Sub(a.At).Seconds()
	if wall <= 0 {
		return 0, fmt.Errorf("samples %v apart: the second is not after the first", b.At.Sub(a.At))
	}
	if b.BusyTicks < a.BusyTicks {
		return 0, errors.New("the host's busy time went backwards")
	}
	busy := float64(b.BusyTicks - a.BusyTicks)
	own := float64(b.OwnTicks) - float64(a.OwnTicks)
	return max(0, busy-own) / userHZ / wall, nil
}

// Sampler reads samples for a run: this process, every process below it,
// and the extra PIDs it is given (endpoints the run did not start but
// reached on this host).
type Sampler struct {
	root  string // "/proc"
	self  int
	extra []int
}

// NewSampler samples under /proc for this process and extra.
func NewSampler(extra ...int) *Sampler {
	return &Sampler{root: "/proc", self: os.Getpid(), extra: extra}
}

// Read takes a sample. A process that ends between the listing and its
// read is skipped; its time moves to its parent's children's time when
// waited for, and the next sample has it there.
func (s *Sampler) Read() (Sample, error) {
	at := time.Now()
	st, err := os.ReadFile(filepath.Join(s.root, "stat"))
	if err != nil {
		return Sample{}, err
	}
	busy, cpus, err := ParseStatBusy(st)
	if err != nil {
		return Sample{}, err
	}
	procs, err := s.procs()
	if err != nil {
		return Sample{}, err
	}
	return Sample{At: at, BusyTicks: busy, OwnTicks: OwnTicks(procs, s.self, s.extra), CPUs: cpus}, nil
}

// procs reads every process's times.
func (s *Sampler) procs() (map[int]ProcTimes, error) {
	ents, err := os.ReadDir(s.root)
	if err != nil {
		return nil, err
	}
	out := make(map[int]ProcTimes, len(ents))
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid <= 0 {
			continue
		}
		b, err := os.ReadFile(filepath.Join(s.root, e.Name(), "stat"))
		if err != nil {
			continue // ended since the listing
		}
		if t, err := ParseProcStat(b); err == nil {
			out[pid] = t
		}
	}
	return out, nil
}

// OwnTicks is the CPU time of self, every process below it and the extra
// PIDs and every process below them, each counted once. A process's time
// includes its waited-for children's (which have left the tree): when a
// process ends and is waited for, its time moves into its parent's, and
// the sum stays.
func OwnTicks(procs map[int]ProcTimes, self int, extra []int) uint64 {
	children := map[int][]int{}
	for pid, t := range procs {
		children[t.PPID] = append(children[t.PPID], pid)
	}
	seen := map[int]bool{}
	var total uint64
	stack := append([]int{self}, extra...)
	for len(stack) > 0 {
		pid := stack[len(stack)-1]
		stack = stack[:len(stack)-1]
		t, ok := procs[pid]
		if !ok || seen[pid] {
			continue
		}
		seen[pid] = true
		total += t.Ticks + t.ChildTicks
		stack = append(stack, children[pid]...)
	}
	return total
}

// Summary sums up a run's samples.
type Summary struct {
	// CPUs is the host's CPU count.
	CPUs int `json:"cpus"`
	// Samples is how many readings were taken (at the start, between the
	// rounds of an interleaved reference, at the end).
	Samples int `json:"samples"`
	// MeanCPUs is the CPU time other processes used over the whole run,
	// in CPUs; MaxCPUs the most they used between two samples.
	MeanCPUs float64 `json:"mean_cpus"`
	MaxCPUs  float64 `json:"max_cpus"`
}

// Summarize sums up samples taken in order; an error when there are
// fewer than two, or two that disagree with time (a later one earlier).
func Summarize(ss []Sample) (Summary, error) {
	if len(ss) < 2 {
		return Summary{}, fmt.Errorf("%d samples: two are needed", len(ss))
	}
	s := Summary{CPUs: ss[0].CPUs, Samples: len(ss)}
	for i := 1; i < len(ss); i++ {
		c, err := Others(ss[i-1], ss[i])
		if err != nil {
			return Summary{}, err
		}
		s.MaxCPUs = max(s.MaxCPUs, c)
	}
	var err error
	s.MeanCPUs, err = Others(ss[0], ss[len(ss)-1])
	return s, err
}

// WarnAtCPUs is the share of a CPU others may use, on average or between
// two samples, before a run says it shared the host: an idle host's
// daemons and kernel threads use a few hundredths.
const WarnAtCPUs = 0.25

// Shared reports whether others used WarnAtCPUs or more, over the run or
// between two samples.
func (s Summary) Shared() bool { return s.MeanCPUs >= WarnAtCPUs || s.MaxCPUs >= WarnAtCPUs }

// Short is the gate's line for a shared run; "" for one that was not.
func (s Summary) Short() string {
	if !s.Shared() {
		return ""
	}
	return fmt.Sprintf("other processes used %.2f of the host's %d CPUs (%.2f at the most)", s.MeanCPUs, s.CPUs, s.MaxCPUs)
}

// Warning is the run's warning when others used WarnAtCPUs or more; ""
// otherwise.
func (s Summary) Warning() string {
	if !s.Shared() {
		return ""
	}
	return fmt.Sprintf("other processes used %.2f of this host's %d CPUs during the run (%.2f at the most between two of %d readings): "+
		"the run's processes waited for CPUs they did not have, and its rates, the reference's too, fell with it (by up to 10x on a 2-core host); "+
		"compare runs made on a quiet host, or gate this build against the old one run in turns beside it (gate --baseline-binary)",
		s.MeanCPUs, s.CPUs, s.MaxCPUs, s.Samples)
}

// Field is a result's record of it, embedded in the results that measure
// it (its JSON key is host_others_cpu), with the gate's line
// (report.HostSharer).
type Field struct {
	// HostOthers is the CPU time processes other than the run's own took
	// of the host while it measured; nil where it was not read.
	HostOthers *Summary `json:"host_others_cpu,omitempty"`
}

// SharedHost is the gate's line when others took a share of the host's
// CPUs during the run; "" otherwise.
func (f Field) SharedHost() string {
	if f.HostOthers == nil {
		return ""
	}
	return f.HostOthers.Short()
}

// HostMoved reports whether others took WarnAtCPUs or more on average
// over the run (a burst between two readings alone does not count): the
// gate judges without such a run where enough others remain.
func (f Field) HostMoved() bool { return f.HostOthers != nil && f.HostOthers.MeanCPUs >= WarnAtCPUs }

// Recorder keeps a run's samples, taken in order; safe for concurrent
// use.
type Recorder struct {
	s       *Sampler
	mu      sync.Mutex
	samples []Sample
}

// NewRecorder samples for this process, everything below it and extra.
func NewRecorder(extra ...int) *Recorder { return &Recorder{s: NewSampler(extra...)} }

// Take takes a sample and keeps it; an error (nothing kept) when /proc
// cannot be read.
func (r *Recorder) Take() error {
	s, err := r.s.Read()
	if err != nil {
		return err
	}
	r.mu.Lock()
	r.samples = append(r.samples, s)
	r.mu.Unlock()
	return nil
}

// Record sums up rec's samples into f and returns the run's warning (""
// when others took little); an error, f untouched, when they cannot be
// summed (a nil rec, fewer than two samples).
func (f *Field) Record(rec *Recorder) (string, error) {
	if rec == nil {
		return "", errors.New("no samples")
	}
	rec.mu.Lock()
	sum, err := Summarize(rec.samples)
	rec.mu.Unlock()
	if err != nil {
		return "", err
	}
	f.HostOthers = &sum
	return sum.Warning(), nil
}
