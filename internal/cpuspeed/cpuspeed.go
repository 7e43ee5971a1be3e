// Package cpuspeed measures how fast this host's CPUs run right now, by
// timing a fixed chain of dependent integer operations pinned to each CPU.
//
// Why: on a virtual machine the hypervisor can run the guest's CPUs at a
// fraction of their speed for seconds at a time without the guest seeing
// any steal time (/proc/stat's steal stays 0 on Firecracker). On the
// project's 2-core hosts a single-threaded loop of fixed work swung 2.7x
// (61-180 ms) in streaks on an idle guest, and every CPU-bound number a
// benchmark reports swings with it. A reading before, between and after
// the phases of a run says whether the host held still while it measured.
package cpuspeed

import (
	"fmt"
	"runtime"
	"slices"
	"time"

	"github.com/nixlctl/nixlctl/internal/stats"
	"golang.org/x/sys/unix"
)

// chainLen is the loop's length: about 1-2 ms at full speed (a multiply
// and an add each step, 4 cycles of latency), short enough to take
// between a run's phases, long enough that the timer's resolution does
// not matter.
const chainLen = 500_000

// tries per CPU; the reading is their median, so one interrupt does not
// make a CPU look slow and one lucky try does not make it look fast.
const tries = 5

//go:noinline
func chain(n int, x uint64) uint64 {
	for i := 0; i < n; i++ {
		x = x*6364136223846793005 + 1442695040888963407
	}
	return x
}

// sink keeps the compiler from dropping the chain.
var sink uint64

// Reading is one measurement: nanoseconds per step of the chain on each
// CPU, the CPUs in the order measured.
type Reading struct {
	At   time.Time `json:"at"`
	CPUs []int     `json:"cpus"`
	NS   []float64 `json:"ns_per_step"`
}

// Slowest is the reading's largest ns per step (its slowest CPU).
func (r Reading) Slowest() float64 {
	if len(r.NS) == 0 {
		return 0
	}
	return slices.Max(r.NS)
}

// Measure takes a reading on every CPU this process may run on.
func Measure() (Reading, error) {
	var set unix.CPUSet
	if err := unix.SchedGetaffinity(0, &set); err != nil {
		return Reading{}, fmt.Errorf("cpuspeed: %w", err)
	}
	var cpus []int
	for c := 0; c < len(set)*64 && len(cpus) < set.Count(); c++ {
		if set.IsSet(c) {
			cpus = append(cpus, c)
		}
	}
	return MeasureCPUs(cpus)
}

// MeasureCPUs takes a reading on the given CPUs, one after another (each
// alone, so that the reading is the CPU's and not a contest between two
// loops of ours).
func MeasureCPUs(cpus []int) (Reading, error) {
	r := Reading{At: time.Now(), CPUs: cpus, NS: make([]float64, len(cpus))}
	for i, c := range cpus {
		ns, err := onCPU(c)
		if err != nil {
			return Reading{}, err
		}
		r.NS[i] = ns
	}
	return r, nil
}

// onCPU times the chain pinned to cpu, on a locked thread that gets its
// affinity back before it is unlocked. The thread must not end with the
// goroutine (what a goroutine that exits locked does): the children this
// process started carry a parent-death signal (Pdeathsig), which the
// kernel ties to the thread that forked them, and any pooled thread may
// have forked an endpoint, which the thread's exit would then kill.
func onCPU(cpu int) (float64, error) {
	type out struct {
		ns  float64
		err error
	}
	ch := make(chan out, 1)
	go func() {
		runtime.LockOSThread()
		var was unix.CPUSet
		if err := unix.SchedGetaffinity(0, &was); err != nil {
			runtime.UnlockOSThread()
			ch <- out{err: fmt.Errorf("cpuspeed: %w", err)}
			return
		}
		var set unix.CPUSet
		set.Set(cpu)
		if err := unix.SchedSetaffinity(0, &set); err != nil {
			runtime.UnlockOSThread()
			ch <- out{err: fmt.Errorf("cpuspeed: pin to CPU %d: %w", cpu, err)}
			return
		}
		sink = chain(chainLen/10, sink) // settle on the CPU first
		ts := make([]float64, tries)
		for k := range ts {
			t0 := time.Now()
			sink = chain(chainLen, sink)
			ts[k] = float64(time.Since(t0).Nanoseconds()) / chainLen
		}
		o := out{ns: stats.Median(ts)}
		if err := unix.SchedSetaffinity(0, &was); err != nil {
			// Never seen: the thread stays locked and ends with this
			// goroutine rather than go back to the pool pinned.
			ch <- o
			return
		}
		runtime.UnlockOSThread()
		ch <- o
	}()
	o := <-ch
	return o.ns, o.err
}

// Summary sums up the readings of one run.
type Summary struct {
	Readings int `json:"readings"`
	// FastestNS and SlowestNS are the extremes of the readings' slowest
	// CPUs (ns per step); Swing is their ratio, 1 when the host held
	// still.
	FastestNS float64 `json:"fastest_ns_per_step"`
	SlowestNS float64 `json:"slowest_ns_per_step"`
	Swing     float64 `json:"swing"`
}

// Summarize sums up readings; the zero Summary for none.
func Summarize(rs []Reading) Summary {
	var s Summary
	for _, r := range rs {
		v := r.Slowest()
		if v <= 0 {
			continue
		}
		if s.Readings == 0 || v < s.FastestNS {
			s.FastestNS = v
		}
		s.SlowestNS = max(s.SlowestNS, v)
		s.Readings++
	}
	if s.FastestNS > 0 {
		s.Swing = s.SlowestNS / s.FastestNS
	}
	return s
}

// SwingWarnAt is the swing above which a run says its host's CPU speed
// moved under it: two readings of an idle host agree within a few
// percent, and a 25% slower CPU moves CPU-bound transfer rates by more
// than a gate allows.
const SwingWarnAt = 1.25

// Warning is the run's warning when the host's speed moved by more than
// SwingWarnAt between readings; "" otherwise.
func (s Summary) Warning() string {
	if s.Readings < 2 || s.Swing <= SwingWarnAt {
		return ""
	}
	return fmt.Sprintf("the host's CPUs ran at different speeds during this run: a fixed loop took %.2f-%.2f ns a step (%.2fx) in %d readings "+
		"(a hypervisor that runs this VM's CPUs slower at times, shown as no steal time; or frequency scaling): absolute rates are not comparable "+
		"between runs, ratios against a reference measured beside them are", s.FastestNS, s.SlowestNS, s.Swing, s.Readings)
}
