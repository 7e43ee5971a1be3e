package htmlreport

import (
	"bytes"
	_ "embed" // the page's stylesheet, script and template
	"fmt"
	"html/template"
	"io"
	"strconv"
)

var (
	//go:embed assets/page.css
	pageCSS string
	//go:embed assets/page.js
	pageJS string
	//go:embed assets/page.html.tmpl
	pageTmpl string

	tmpl = template.Must(template.New("page").Parse(pageTmpl))
)

// Page is one report page, built from results and ready to write.
type Page struct {
	Title, Subtitle string
	// Kind says which builder made it ("bench push", "compare", "gate"):
	// the body's data-kind, for tests and for readers of the markup.
	Kind     string
	Warnings []Warning
	Runs     []RunHeader
	Sections []Section
	// FromRecords says the page drew on per-request records.
	FromRecords bool
	// Generator is the nixlctl version that wrote the page.
	Generator string
}

// Warning is one of a run's warnings; Run names the run on pages of
// several.
type Warning struct{ Run, Text string }

// RunHeader describes one run: what ran, where, with what.
type RunHeader struct {
	Label string
	Rows  []KV
}

// KV is one line of a run header. Field, when set, names the result's
// JSON field it shows (data-field), for tests that read the page back.
type KV struct {
	Key, Value, Field string
	Mono              bool
}

// Section is a titled part of the page: paragraphs, charts and tables in
// order.
type Section struct {
	ID, Title string
	Blocks    []Block
}

// Block is one paragraph, row of charts or table.
type Block struct {
	Para   string
	Class  string
	Charts []chart
	Table  *Table
}

// Table is an HTML table whose number cells carry the exact value.
type Table struct {
	ID, Caption string
	Head        []Cell
	Rows        [][]Cell
	// Collapsed folds the table (per-request lists) behind a summary line.
	Collapsed bool
}

// Cell is one table cell. A cell with Metric set is a number the result
// holds: it gets data-metric (the metric's name), data-value (the value
// at full precision) and data-run (the run's label, on pages of several),
// so a test or a script can read the page's numbers back.
type Cell struct {
	Text   string
	Num    bool
	Class  string
	Metric string
	Value  string
	Run    string
}

// text is a plain cell; numCell a right-aligned one; metricCell a number
// of the result, named.
func text(s string) Cell { return Cell{Text: s} }

func numCell(s string) Cell { return Cell{Text: s, Num: true} }

func metricCell(run, name string, v float64, shown string) Cell {
	return Cell{Text: shown, Num: true, Metric: name, Value: strconv.FormatFloat(v, 'g', -1, 64), Run: run}
}

func head(names ...string) []Cell {
	out := make([]Cell, len(names))
	for i, n := range names {
		out[i] = Cell{Text: n}
	}
	return out
}

// numHead marks the columns from i on as numbers (right-aligned).
func numHead(names []string, from int) []Cell {
	out := head(names...)
	for i := from; i < len(out); i++ {
		out[i].Num = true
	}
	return out
}

func para(s string) Block { return Block{Para: s} }

func charts(cs ...chart) Block { return Block{Charts: cs} }

func tableBlock(t *Table) Block { return Block{Table: t} }

// Write renders the page as one self-contained HTML document: the
// stylesheet and script are inside it, charts are inline SVG, and it
// loads nothing, so it opens offline and from a CI artifact.
func (p *Page) Write(w io.Writer) error {
	var b bytes.Buffer
	data := struct {
		*Page
		CSS template.CSS
		JS  template.JS
	}{p, template.CSS(pageCSS), template.JS(pageJS)} //nolint:gosec // our own embedded files
	if err := tmpl.Execute(&b, data); err != nil {
		return fmt.Errorf("html page: %w", err)
	}
	_, err := w.Write(b.Bytes())
	return err
}
