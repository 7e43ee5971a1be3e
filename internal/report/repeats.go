package report

import (
	"cmp"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"time"
)

// Repeats is what --repeat N adds to a result: the N runs' values of
// every metric they share, with their spread. The result that carries it
// is its representative run, the one whose main metric (the first stable
// one, else the first) lay at the median.
type Repeats struct {
	N int `json:"n"`
	// Representative is the run (1-based) whose summary the result shows.
	Representative int            `json:"representative"`
	Main           string         `json:"main_metric"`
	Runs           []RepeatRun    `json:"runs"`
	Metrics        []RepeatMetric `json:"metrics"`
}

// RepeatRun is when one of the runs started and how long it took, and
// whether other processes took a share of the host's CPUs while it
// measured (its HostSharer line): the result's own record of that is its
// representative run's alone.
type RepeatRun struct {
	StartedAt  time.Time `json:"started_at"`
	Seconds    float64   `json:"duration_s"`
	SharedHost string    `json:"shared_host,omitempty"`
	// HostMoved: others took enough of the host on average over the run
	// that the gate sets it aside where it can (HostSharer.HostMoved).
	HostMoved bool `json:"host_moved,omitempty"`
}

// RepeatMetric is one metric over the runs.
type RepeatMetric struct {
	Name   string    `json:"metric"`
	Unit   string    `json:"unit,omitempty"`
	Better string    `json:"better"`
	Stable bool      `json:"stable,omitempty"`
	Values []float64 `json:"values"`
	Spread Spread    `json:"spread"`
}

// values returns the repeats' values of the metric named name.
func (r *Repeats) values(name string) ([]float64, bool) {
	if r == nil {
		return nil, false
	}
	for _, m := range r.Metrics {
		if m.Name == name {
			return m.Values, true
		}
	}
	return nil, false
}

// RepeatSpreadWarnAt is the main metric's max/min over the runs above
// which the result warns that its runs disagree.
const RepeatSpreadWarnAt = 1.2

// WithRepeats returns the representative of runs (all of one command)
// with Repeats set, and the warnings of the other runs added to its own.
func WithRepeats(runs []Result) (Result, error) {
	if len(runs) == 0 {
		return nil, fmt.Errorf("no runs")
	}
	first := runs[0].Metrics()
	var names []string
	byName := map[string]Metric{}
	for _, m := range first {
		names = append(names, m.Name())
		byName[m.Name()] = m
	}
	values := map[string][]float64{}
	for _, r := range runs {
		got := map[string]float64{}
		for _, m := range r.Metrics() {
			got[m.Name()] = m.Value
		}
		for _, n := range names {
			if v, ok := got[n]; ok {
				values[n] = append(values[n], v)
			}
		}
	}
	main := ""
	for _, m := range first {
		if m.Stable {
			main = m.Name()
			break
		}
	}
	if main == "" && len(first) > 0 {
		main = first[0].Name()
	}
	rep := &Repeats{N: len(runs), Main: main, Representative: 1}
	if vs := values[main]; len(vs) == len(runs) {
		// The lower of the two middle runs for an even count: a run that
		// happened, not an average of two.
		idx := make([]int, len(runs))
		for i := range idx {
			idx[i] = i
		}
		slices.SortStableFunc(idx, func(a, b int) int { return cmp.Compare(vs[a], vs[b]) })
		rep.Representative = idx[(len(idx)-1)/2] + 1
	}
	for _, r := range runs {
		h := r.Header()
		rep.Runs = append(rep.Runs, RepeatRun{StartedAt: h.StartedAt, Seconds: h.Seconds, SharedHost: ownSharedHost(r), HostMoved: NeighbourMoved(r)})
	}
	for _, n := range names {
		vs := values[n]
		if len(vs) != len(runs) {
			continue // a metric not every run has (an interrupted sweep)
		}
		m := byName[n]
		rep.Metrics = append(rep.Metrics, RepeatMetric{Name: n, Unit: m.Unit, Better: m.Better.String(), Stable: m.Stable, Values: vs, Spread: SpreadOf(vs)})
	}
	out := runs[rep.Representative-1]
	h := out.Header()
	// Every run's warnings, once each, saying in how many runs they came.
	counts := map[string]int{}
	var order []string
	for _, r := range runs {
		for _, w := range r.Header().Warnings {
			if counts[w] == 0 {
				order = append(order, w)
			}
			counts[w]++
		}
	}
	h.Warnings = []string{}
	for _, w := range order {
		if c := counts[w]; c < len(runs) {
			w = fmt.Sprintf("(%d of %d runs) %s", c, len(runs), w)
		}
		h.Warn(w)
	}
	if vs, ok := rep.values(main); ok {
		if sp := SpreadOf(vs); sp.MaxOverMin > RepeatSpreadWarnAt {
			h.Warn(fmt.Sprintf("the %d runs disagree: %s ranged %.3g-%.3g (max/min %.2f); judge the median and its interval, not one run",
				len(runs), main, sp.Min, sp.Max, sp.MaxOverMin))
		}
	}
	h.Repeats = rep
	return out, nil
}

// RepeatsTable renders the runs' spread, one row per metric; nil without
// repeats.
func RepeatsTable(r Result) *Table {
	rep := r.Header().Repeats
	if rep == nil {
		return nil
	}
	t := &Table{Columns: []Column{{Name: fmt.Sprintf("Over %d runs", rep.N)}, {Name: "min", Align: Right}, {Name: "median", Align: Right},
		{Name: "max", Align: Right}, {Name: "95% CI of median", Align: Right}, {Name: "max/min", Align: Right}}}
	for _, m := range rep.Metrics {
		s := m.Spread
		name := m.Name
		if m.Unit != "" && m.Unit != "ratio" {
			name += " (" + m.Unit + ")"
		}
		t.AddRow(name, Float(s.Min), Float(s.Median), Float(s.Max), Float(s.CILow)+" - "+Float(s.CIHigh), fmt.Sprintf("%.2f", s.MaxOverMin))
	}
	return t
}

// WriteRepeats writes the repeats table after a rendered result (table
// and Markdown); nothing without repeats or for other formats.
func WriteRepeats(w io.Writer, r Result, f Format) error {
	t := RepeatsTable(r)
	if t == nil {
		return nil
	}
	rep := r.Header().Repeats
	switch f {
	case FormatTable:
		if _, err := fmt.Fprintf(w, "\nThe result above is run %d of %d (its %s at the median).\n", rep.Representative, rep.N, rep.Main); err != nil {
			return err
		}
		return t.WriteText(w)
	case FormatMarkdown:
		if _, err := fmt.Fprintf(w, "\nThe result above is run %d of %d (its %s at the median).\n\n", rep.Representative, rep.N, rep.Main); err != nil {
			return err
		}
		return t.WriteMarkdown(w)
	}
	return nil
}

// sharedHost is r's SharedHost line, "" when it has none or cannot say.
// A --repeat result speaks for all its runs, not for its representative
// alone: it names those of its runs that shared the host. (One saved
// before runs recorded it has only the representative's line.)
func sharedHost(r Result) string {
	rep := r.Header().Repeats
	if rep == nil {
		return ownSharedHost(r)
	}
	var which []string
	first := ""
	for i, run := range rep.Runs {
		if run.SharedHost == "" {
			continue
		}
		which = append(which, strconv.Itoa(i+1))
		if first == "" {
			first = run.SharedHost
		}
	}
	if len(which) == 0 {
		return ownSharedHost(r)
	}
	return fmt.Sprintf("%d of its %d runs (run %s); run %s: %s", len(which), len(rep.Runs), strings.Join(which, ", "), which[0], first)
}
