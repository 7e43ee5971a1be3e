package clocksync

import (
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"
)

// NegativeStageError is a stage that ended before it started: the two
// readings came from clocks that were not related correctly (or the
// offset's uncertainty exceeds the stage). It is an error rather than a
// zero because a zero is indistinguishable from a real, fast stage and
// silently drags percentiles down.
type NegativeStageError struct {
	Name       string
	Start, End int64
}

func (e *NegativeStageError) Error() string {
	return fmt.Sprintf("stage %s is negative: ends at %d, %v before it starts at %d",
		e.Name, e.End, time.Duration(e.Start-e.End), e.Start)
}

// Stage is the duration from start to end, both on one clock (map endpoint
// readings with Offset.ToDriver first). A negative stage is a
// *NegativeStageError.
func Stage(name string, start, end int64) (time.Duration, error) {
	if end < start {
		return 0, &NegativeStageError{Name: name, Start: start, End: end}
	}
	return time.Duration(end - start), nil
}

// Stages counts negative stages by name over a run, so that a result can
// say "3 negative stages in handoff" instead of reporting impossible
// numbers or hiding them. The zero value is ready; it is safe for
// concurrent use because endpoints record stages from several goroutines.
type Stages struct {
	mu       sync.Mutex
	total    int
	negative map[string]int
}

// Measure is Stage, counting the stage if it is negative.
func (s *Stages) Measure(name string, start, end int64) (time.Duration, error) {
	d, err := Stage(name, start, end)
	s.mu.Lock()
	defer s.mu.Unlock()
	s.total++
	if err != nil {
		if s.negative == nil {
			s.negative = make(map[string]int)
		}
		s.negative[name]++
	}
	return d, err
}

// NegativeCount is how many stages of one name were negative.
type NegativeCount struct {
	Name  string
	Count int
}

// Total is how many stages were measured.
func (s *Stages) Total() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.total
}

// Negative lists the names with negative stages, sorted by name so that
// results are stable from run to run.
func (s *Stages) Negative() []NegativeCount {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]NegativeCount, 0, len(s.negative))
	for name, n := range s.negative {
		out = append(out, NegativeCount{name, n})
	}
	slices.SortFunc(out, func(a, b NegativeCount) int { return strings.Compare(a.Name, b.Name) })
	return out
}

// Warnings are Negative as sentences for a result's warnings, one a name.
func (s *Stages) Warnings() []string {
	var out []string
	for _, n := range s.Negative() {
		noun := "stages"
		if n.Count == 1 {
			noun = "stage"
		}
		out = append(out, fmt.Sprintf("%d negative %s in %s", n.Count, noun, n.Name))
	}
	return out
}
