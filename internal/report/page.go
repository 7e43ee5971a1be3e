package report

import (
	"fmt"
	"io"
)

// A result's text and Markdown pages (its WriteText and WriteMarkdown,
// which Write calls) lay out their tables and warnings the same way for
// every kind; these write those parts.

// WriteTables writes tables in order, a blank line between them, each by
// write: (*Table).WriteText or (*Table).WriteMarkdown.
func WriteTables(w io.Writer, write func(*Table, io.Writer) error, tables ...*Table) error {
	for i, t := range tables {
		if i > 0 {
			fmt.Fprintln(w)
		}
		if err := write(t, w); err != nil {
			return err
		}
	}
	return nil
}

// WriteWarnings ends a text page: a line a warning.
func WriteWarnings(w io.Writer, warnings []string) {
	for _, warn := range warnings {
		fmt.Fprintf(w, "WARNING: %s\n", warn)
	}
}

// WriteMarkdownWarnings ends a Markdown page: a quoted paragraph a
// warning.
func WriteMarkdownWarnings(w io.Writer, warnings []string) {
	for _, warn := range warnings {
		fmt.Fprintf(w, "\n> **Warning:** %s\n", warn)
	}
}
