package report

import (
	"encoding/csv"
	"fmt"
	"io"
	"strings"
	"unicode/utf8"
)

// Align is a column's alignment in text and Markdown tables.
type Align int

// Alignments.
const (
	Left Align = iota
	Right
)

// Column is a table column.
type Column struct {
	Name  string
	Align Align
}

// Table is a titled grid of already-formatted cells.
type Table struct {
	Title   string
	Columns []Column
	Rows    [][]string
	Notes   []string // printed under the table in text form
}

// AddRow appends a row; missing cells render empty.
func (t *Table) AddRow(cells ...string) { t.Rows = append(t.Rows, cells) }

func (t *Table) cell(r []string, i int) string {
	if i < len(r) {
		return r[i]
	}
	return ""
}

func (t *Table) widths() []int {
	w := make([]int, len(t.Columns))
	for i, c := range t.Columns {
		w[i] = utf8.RuneCountInString(c.Name)
	}
	for _, r := range t.Rows {
		for i := range t.Columns {
			if n := utf8.RuneCountInString(t.cell(r, i)); n > w[i] {
				w[i] = n
			}
		}
	}
	return w
}

func pad(s string, width int, a Align) string {
	n := width - utf8.RuneCountInString(s)
	if n <= 0 {
		return s
	}
	if a == Right {
		return strings.Repeat(" ", n) + s
	}
	return s + strings.Repeat(" ", n)
}

// WriteText renders an aligned plain-text table, two spaces between
// columns, headers underlined with dashes.
func (t *Table) WriteText(w io.Writer) error {
	var b strings.Builder
	if t.Title != "" {
		b.WriteString(t.Title + "\n")
	}
	widths := t.widths()
	line := func(cells func(i int) string, align func(i int) Align) {
		var parts []string
		for i := range t.Columns {
			parts = append(parts, pad(cells(i), widths[i], align(i)))
		}
		b.WriteString(strings.TrimRight(strings.Join(parts, "  "), " ") + "\n")
	}
	line(func(i int) string { return t.Columns[i].Name }, func(i int) Align { return t.Columns[i].Align })
	line(func(i int) string { return strings.Repeat("-", widths[i]) }, func(int) Align { return Left })
	for _, r := range t.Rows {
		line(func(i int) string { return t.cell(r, i) }, func(i int) Align { return t.Columns[i].Align })
	}
	for _, n := range t.Notes {
		b.WriteString(n + "\n")
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// WriteCSV renders the header and rows as CSV (no title, no notes).
func (t *Table) WriteCSV(w io.Writer) error {
	cw := csv.NewWriter(w)
	head := make([]string, len(t.Columns))
	for i, c := range t.Columns {
		head[i] = c.Name
	}
	if err := cw.Write(head); err != nil {
		return err
	}
	for _, r := range t.Rows {
		row := make([]string, len(t.Columns))
		for i := range t.Columns {
			row[i] = t.cell(r, i)
		}
		if err := cw.Write(row); err != nil {
			return err
		}
	}
	cw.Flush()
	return cw.Error()
}

// WriteMarkdown renders a GitHub-flavoured Markdown table.
func (t *Table) WriteMarkdown(w io.Writer) error {
	var b strings.Builder
	if t.Title != "" {
		fmt.Fprintf(&b, "**%s**\n\n", t.Title)
	}
	esc := func(s string) string { return strings.ReplaceAll(s, "|", `\|`) }
	b.WriteString("|")
	for _, c := range t.Columns {
		b.WriteString(" " + esc(c.Name) + " |")
	}
	b.WriteString("\n|")
	for _, c := range t.Columns {
		if c.Align == Right {
			b.WriteString("---:|")
		} else {
			b.WriteString("---|")
		}
	}
	b.WriteString("\n")
	for _, r := range t.Rows {
		b.WriteString("|")
		for i := range t.Columns {
			b.WriteString(" " + esc(t.cell(r, i)) + " |")
		}
		b.WriteString("\n")
	}
	for _, n := range t.Notes {
		b.WriteString("\n" + n + "\n")
	}
	_, err := io.WriteString(w, b.String())
	return err
}
