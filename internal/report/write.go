package report

import "io"

// Write lives in a file of its own, above format.go and result.go: it
// dispatches to a Result's writers, and result.go is built on format.go's
// Format, so in format.go the two files would use each other.

// The writers a value can have, one a format, for Write. Table has all
// three, so a value whose every format is one table can hand them on.
type (
	TextWriter     interface{ WriteText(w io.Writer) error }
	CSVWriter      interface{ WriteCSV(w io.Writer) error }
	MarkdownWriter interface{ WriteMarkdown(w io.Writer) error }
)

// Write writes res in format f, the one dispatch on the format that every
// result goes through: JSON encodes res itself; CSV, Markdown and Prom use
// res's writer for the format (PromExporter's WriteProm for Prom, else a
// Result's Metrics as gauges, WriteMetricsProm); any other format, or one
// res has no writer for, gets its text. A value that cannot write a
// format says so from its writer (FormatError) or before calling Write.
func Write(w io.Writer, f Format, res TextWriter) error {
	switch f {
	case FormatJSON:
		return WriteJSON(w, res)
	case FormatCSV:
		if c, ok := res.(CSVWriter); ok {
			return c.WriteCSV(w)
		}
	case FormatMarkdown:
		if m, ok := res.(MarkdownWriter); ok {
			return m.WriteMarkdown(w)
		}
	case FormatProm:
		if p, ok := res.(PromExporter); ok {
			return p.WriteProm(w)
		}
		if r, ok := res.(Result); ok {
			return WriteMetricsProm(w, r)
		}
	}
	return res.WriteText(w)
}
