// Package report turns measurements into what people read and what
// machines parse, and judges them against each other: the Result interface
// and the registry of result kinds; aligned tables, CSV, Markdown, JSON and
// Prometheus text (vLLM's metric names, or any result's metrics as
// gauges); latency histograms; saving and loading a run's files; compare,
// gate (which refuses runs that report problems) and the noise test behind
// both; figures as data for internal/plots; and the formatting helpers
// (sizes, rates, durations) they share. Runners produce the data; this
// package never measures.
package report
