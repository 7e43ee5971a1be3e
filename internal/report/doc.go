// Package report turns measurements into what people read and what
// machines parse: aligned tables, CSV, Markdown and JSON, plus the
// formatting helpers (sizes, rates, durations) they share. Runners produce
// data; this package only renders it.
package report
