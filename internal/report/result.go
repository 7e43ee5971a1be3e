package report

import (
	"encoding/json"
	"fmt"
	"io"
	"sort"
	"strings"
	"sync"
)

// Result is what every measuring command produces. A command gets the
// generic tools for free by implementing it on its result type and
// registering the type with RegisterKind:
//
//   - `--save DIR`, `nixlctl report show` and `report compare` (Render, Metrics)
//   - `nixlctl gate` (Metrics: Stable ones are gated by default)
//   - `--plot` (the optional Plottable)
//   - `-o prom` through Render(w, FormatProm): the kind's WriteProm (see
//     PromExporter) or WriteMetricsProm
//   - records kept beside the result and re-read (the optional RecordsKeeper)
//
// Header comes from the embedded Meta; results stay plain structs whose
// JSON encoding is the schema (docs/result-schema.md).
type Result interface {
	Header() *Meta
	// Metrics lists the numbers worth comparing between runs.
	Metrics() []Metric
	// Render writes the result in one output format. Formats a kind cannot
	// write return an error wrapping ErrFormat.
	Render(w io.Writer, f Format) error
}

// Plottable results can draw themselves (--plot, report show --plot).
type Plottable interface {
	Figure() (Figure, error)
}

// PromExporter is the method of the kinds whose runs are KV transfers and
// so can speak vLLM's own metrics (bench xfer, the handoff benchmarks).
// Write asserts it for FormatProm; other kinds answer with
// WriteMetricsProm.
type PromExporter interface {
	// WriteProm writes the result as Prometheus text exposition under
	// vLLM NixlConnector's metric names and buckets (fill a
	// NewVLLMTransfers and call its Write).
	WriteProm(w io.Writer) error
}

// RecordsKeeper results keep raw per-request records next to their
// summary: WriteRecords writes them as JSON lines (a header line first,
// {"schema": RecordsSchema, ...}); ReadRecords loads such a file and
// recomputes the summary from it.
type RecordsKeeper interface {
	WriteRecords(w io.Writer) (int, error)
	ReadRecords(r io.Reader) error
}

// ErrFormat is wrapped by Render for formats a kind cannot write.
var ErrFormat = fmt.Errorf("output format not supported")

// FormatError says a command cannot write format f.
func FormatError(command string, f Format) error {
	return fmt.Errorf("%w: %s cannot write %s", ErrFormat, command, f)
}

// Better says which way a metric improves.
type Better int8

// Directions.
const (
	HigherIsBetter Better = iota
	LowerIsBetter
)

func (b Better) String() string {
	if b == LowerIsBetter {
		return "lower"
	}
	return "higher"
}

// Metric is one comparable number of a result.
type Metric struct {
	// Key names the number as its field in the result's summary (or sweep
	// point) is named, dots between levels: "efficiency",
	// "handoff_latency_ms.p99". `gate --metric` selects by it.
	Key string
	// Series names the point of a sweep the value belongs to ("WRITE 4 KiB
	// x 1"); empty for whole-run metrics.
	Series string
	Value  float64
	Unit   string
	Better Better
	// Stable marks ratios against a reference measured in the same run
	// (efficiency vs memcpy or vs bench xfer): they carry across machines
	// and are what gate compares unless told otherwise.
	Stable bool
	// Dist is the latency distribution the value comes from (nil if
	// none); compare and gate use it to tell a change from noise. Its
	// "worse" direction is always "slower".
	Dist *Histogram
}

// Name is Key, with the series in brackets when there is one.
func (m Metric) Name() string {
	if m.Series == "" {
		return m.Key
	}
	return m.Key + "[" + m.Series + "]"
}

// MatchKey reports whether the metric is selected by sel: its key
// ("bandwidth_gbps"), or its full name ("bandwidth_gbps[WRITE 4 KiB x 1]").
func (m Metric) MatchKey(sel string) bool { return sel == m.Key || sel == m.Name() }

var (
	kindsMu sync.RWMutex
	kinds   = map[string]func() Result{}
)

// RegisterKind makes results of the given commands ("bench xfer") readable
// by DecodeResult: newResult returns an empty value to decode into. Call
// it from an init function of the package that defines the result.
func RegisterKind(newResult func() Result, commands ...string) {
	kindsMu.Lock()
	defer kindsMu.Unlock()
	for _, c := range commands {
		kinds[c] = newResult
	}
}

// Kinds lists the registered commands, sorted.
func Kinds() []string {
	kindsMu.RLock()
	defer kindsMu.RUnlock()
	var out []string
	for k := range kinds {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// DecodeResult parses a result written by any registered command. It
// checks the schema first, so a newer or foreign file fails with a clear
// message rather than decoding to zeros.
func DecodeResult(data []byte) (Result, error) {
	var head struct {
		Schema  string `json:"schema"`
		Command string `json:"command"`
	}
	if err := json.Unmarshal(data, &head); err != nil {
		return nil, fmt.Errorf("not a nixlctl result: %v", err)
	}
	if head.Schema != Schema {
		if strings.HasPrefix(head.Schema, "nixlctl.result/") {
			return nil, fmt.Errorf("result schema %q: this nixlctl reads %s", head.Schema, Schema)
		}
		return nil, fmt.Errorf("not a nixlctl result (schema %q, want %s)", head.Schema, Schema)
	}
	kindsMu.RLock()
	newResult := kinds[head.Command]
	kindsMu.RUnlock()
	if newResult == nil {
		return nil, fmt.Errorf("results of %q are not known to this nixlctl (known: %s)", head.Command, strings.Join(Kinds(), ", "))
	}
	r := newResult()
	if err := json.Unmarshal(data, r); err != nil {
		return nil, fmt.Errorf("%s result: %v", head.Command, err)
	}
	return r, nil
}
