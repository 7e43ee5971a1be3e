// Package clocksync relates timestamps taken on different clocks so that a
// stage that starts in one process and ends in another can be timed
// honestly. On one host every process reads the same CLOCK_MONOTONIC and
// readings subtract directly; across hosts (or time namespaces) each clock
// has its own origin, so the driver estimates each endpoint's offset from
// a few pings, NTP-style, and says how far the estimate can be off.
//
// The package does no I/O except ReadHostIdentity, and the estimate takes
// the endpoint's readings as untrusted input: malformed samples are errors,
// never panics or silent nonsense.
package clocksync

import (
	"errors"
	"fmt"
	"time"
)

// Sample is one ping. T0 and T3 are on the driver's clock (send, receive);
// T1 and T2 are on the endpoint's clock (receive, reply). An endpoint that
// takes a single reading leaves T2 zero: CLOCK_MONOTONIC is never zero in
// a running system, so zero cannot be mistaken for a real reading.
type Sample struct {
	T0, T1, T2, T3 int64
}

// Offset is how the endpoint's clock relates to the driver's.
type Offset struct {
	// Nanos is the endpoint's clock minus the driver's clock.
	Nanos int64
	// Uncertainty bounds the error of Nanos: the truth lies within
	// Nanos ± Uncertainty as long as neither clock drifted during the ping.
	Uncertainty time.Duration
	// RTT is the winning sample's network round trip, without the
	// endpoint's processing time between T1 and T2.
	RTT time.Duration
	// Samples is how many pings the estimate considered.
	Samples int
	// SameClock means both processes read one clock: Nanos is exactly 0 and
	// nothing was estimated.
	SameClock bool
}

// SameClockOffset is the offset between two processes that share a clock.
func SameClockOffset() Offset { return Offset{SameClock: true} }

// ToDriver maps a reading of the endpoint's clock onto the driver's clock.
func (o Offset) ToDriver(endpointNanos int64) int64 { return endpointNanos - o.Nanos }

// String reads like "+3600.000012s ±45µs (rtt 90µs, 16 samples)", or
// "same clock" when no estimate was needed.
func (o Offset) String() string {
	if o.SameClock {
		return "same clock"
	}
	sign := "+"
	if o.Nanos < 0 {
		sign = ""
	}
	return fmt.Sprintf("%s%v ±%v (rtt %v, %d samples)", sign, time.Duration(o.Nanos), o.Uncertainty, o.RTT, o.Samples)
}

// Estimate returns the offset from a set of pings. The sample with the
// lowest round trip wins rather than an average: queueing delay only ever
// adds to a round trip and is rarely symmetric, so the fastest ping is the
// one whose midpoint assumption is least wrong, and its bound is tightest.
//
// A sample whose readings are negative or out of order (T3 before T0, T2
// before T1, or an endpoint that spent longer than the whole round trip)
// rejects the whole set: it means clocks were mixed up or the data was
// corrupted, and any estimate from that set would be a guess.
func Estimate(samples []Sample) (Offset, error) {
	if len(samples) == 0 {
		return Offset{}, errors.New("clocksync: no samples to estimate an offset from")
	}
	best := Offset{RTT: -1}
	for i, s := range samples {
		o, err := estimateOne(s)
		if err != nil {
			return Offset{}, fmt.Errorf("clocksync: sample %d: %w", i, err)
		}
		if best.RTT < 0 || o.RTT < best.RTT {
			best = o
		}
	}
	best.Samples = len(samples)
	return best, nil
}

// estimateOne bounds the offset θ by causality alone: the endpoint
// received after the driver sent (T1-θ ≥ T0) and replied before the driver
// received (T2-θ ≤ T3), so θ ∈ [T2-T3, T1-T0]. The interval's width is the
// network round trip; its midpoint is NTP's estimate.
func estimateOne(s Sample) (Offset, error) {
	t2 := s.T2
	if t2 == 0 {
		t2 = s.T1
	}
	// Non-negative readings keep every difference below from overflowing,
	// whatever an endpoint sends.
	for _, r := range []struct {
		name string
		v    int64
	}{{"t0", s.T0}, {"t1", s.T1}, {"t2", t2}, {"t3", s.T3}} {
		if r.v < 0 {
			return Offset{}, fmt.Errorf("%s=%d is negative; clock readings never are", r.name, r.v)
		}
	}
	if s.T3 < s.T0 {
		return Offset{}, fmt.Errorf("negative round trip: driver received at %d before it sent at %d", s.T3, s.T0)
	}
	if t2 < s.T1 {
		return Offset{}, fmt.Errorf("negative processing time: endpoint replied at %d before it received at %d", t2, s.T1)
	}
	rtt := (s.T3 - s.T0) - (t2 - s.T1)
	if rtt < 0 {
		return Offset{}, fmt.Errorf("negative round trip: endpoint took %d ns of a %d ns round trip", t2-s.T1, s.T3-s.T0)
	}
	lo, hi := t2-s.T3, s.T1-s.T0
	// mid rounds down, so hi-mid rounds the bound up: an odd round trip's
	// lost half nanosecond never leaves the truth outside it.
	mid := lo + rtt/2
	return Offset{Nanos: mid, Uncertainty: time.Duration(hi - mid), RTT: time.Duration(rtt)}, nil
}
