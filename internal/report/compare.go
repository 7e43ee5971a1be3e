package report

import (
	"fmt"
	"io"
	"math"
)

// Comparison lays several results side by side, the first as reference.
type Comparison struct {
	Labels []string        `json:"runs"` // one per result: where it came from
	Rows   []ComparisonRow `json:"metrics"`
	Notes  []string        `json:"notes,omitempty"`
	cmd    string
}

// ComparisonRow is one metric across the results. Values, Changes and
// Tests have one entry per result (the first result's change is 0 and its
// test "-"); a result without the metric has NaN.
type ComparisonRow struct {
	Name    string    `json:"metric"`
	Unit    string    `json:"unit,omitempty"`
	Better  string    `json:"better"`
	Values  []float64 `json:"values"`
	Changes []float64 `json:"changes"`
	Tests   []string  `json:"noise_tests"`
}

// Compare builds the comparison of results[1:] against results[0] for the
// metrics selected by key or name (all of the first result's when none).
// Every metric with latency distributions on both sides gets a noise
// test (see Shift).
func Compare(labels []string, results []Result, selectors []string) (*Comparison, error) {
	if len(results) < 2 {
		return nil, fmt.Errorf("compare needs at least two results")
	}
	first := results[0].Header().Command
	c := &Comparison{Labels: labels, cmd: first}
	for i, r := range results[1:] {
		if h := r.Header(); h.Command != first {
			c.Notes = append(c.Notes, fmt.Sprintf("%s is %q, %s is %q: only metrics with the same names are compared", labels[0], first, labels[i+1], h.Command))
		}
	}
	base := results[0].Metrics()
	if len(selectors) > 0 {
		var err error
		if base, err = selectMetrics(base, selectors); err != nil {
			return nil, err
		}
	}
	others := make([]map[string]Metric, len(results))
	for i, r := range results {
		others[i] = map[string]Metric{}
		for _, m := range r.Metrics() {
			others[i][m.Name()] = m
		}
	}
	for _, bm := range base {
		row := ComparisonRow{Name: bm.Name(), Unit: bm.Unit, Better: bm.Better.String()}
		for i := range results {
			m, ok := others[i][bm.Name()]
			if !ok {
				row.Values, row.Changes, row.Tests = append(row.Values, math.NaN()), append(row.Changes, math.NaN()), append(row.Tests, "-")
				continue
			}
			row.Values = append(row.Values, m.Value)
			ch := 0.0
			if i > 0 && m.Value != bm.Value {
				if bm.Value == 0 {
					ch = math.Copysign(math.Inf(1), m.Value)
				} else {
					ch = (m.Value - bm.Value) / math.Abs(bm.Value)
				}
			}
			row.Changes = append(row.Changes, ch)
			test := "-"
			if i > 0 && bm.Dist != nil && m.Dist != nil {
				test = CompareDists(bm.Dist, m.Dist).String()
			}
			row.Tests = append(row.Tests, test)
		}
		c.Rows = append(c.Rows, row)
	}
	c.Notes = append(c.Notes, fmt.Sprintf("Change is against %s. Noise test: Mann-Whitney U on the latency histograms behind the metric (\"same\" unless p < %g and Cliff's |δ| ≥ %g).", labels[0], ShiftAlpha, ShiftMinDelta))
	return c, nil
}

// Table renders the comparison: metric, then per result its value and,
// after the first, the change and the noise test.
func (c *Comparison) Table() *Table {
	t := &Table{Title: "compare: " + c.cmd, Columns: []Column{{"Metric", Left}, {"Better", Left}}, Notes: c.Notes}
	for i, l := range c.Labels {
		t.Columns = append(t.Columns, Column{l, Right})
		if i > 0 {
			t.Columns = append(t.Columns, Column{"Δ", Right}, Column{"Noise test", Left})
		}
	}
	for _, r := range c.Rows {
		row := []string{r.Name, r.Better}
		for i, v := range r.Values {
			if math.IsNaN(v) {
				row = append(row, "-")
			} else {
				row = append(row, Float(v))
			}
			if i > 0 {
				ch := "-"
				if !math.IsNaN(r.Changes[i]) {
					ch = signedPct(r.Changes[i])
				}
				row = append(row, ch, r.Tests[i])
			}
		}
		t.AddRow(row...)
	}
	return t
}

// Render writes the comparison in a format.
func (c *Comparison) Render(w io.Writer, f Format) error {
	if f == FormatProm {
		return FormatError("report compare", f) // a comparison is no set of samples
	}
	if f == FormatJSON {
		return WriteJSON(w, c.jsonSafe())
	}
	return Write(w, f, c.Table()) // every other format is the table
}

// jsonSafe replaces NaN and infinities, which JSON cannot carry, by null.
func (c *Comparison) jsonSafe() any {
	type row struct {
		ComparisonRow
		Values  []*float64 `json:"values"`
		Changes []*float64 `json:"changes"`
	}
	conv := func(xs []float64) []*float64 {
		out := make([]*float64, len(xs))
		for i, x := range xs {
			if !math.IsNaN(x) && !math.IsInf(x, 0) {
				out[i] = &xs[i]
			}
		}
		return out
	}
	rows := make([]row, len(c.Rows))
	for i, r := range c.Rows {
		rows[i] = row{ComparisonRow: r, Values: conv(r.Values), Changes: conv(r.Changes)}
	}
	return struct {
		Command string   `json:"command"`
		Runs    []string `json:"runs"`
		Rows    []row    `json:"metrics"`
		Notes   []string `json:"notes,omitempty"`
	}{c.cmd, c.Labels, rows, c.Notes}
}
