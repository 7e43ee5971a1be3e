package report

import (
	"bytes"
	"encoding/json"
	"io"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"testing/fstest"
	"time"

	"github.com/google/go-cmp/cmp"
)

// fakeResult is a made-up result kind for the generic tools' tests: a
// Meta, a few numbers and the latency histogram behind them.
type fakeResult struct {
	Meta
	Efficiency float64 `json:"efficiency"`
	GBps       float64 `json:"bandwidth_gbps"`
	P99MS      float64 `json:"p99_ms"`
	Failed     float64 `json:"failed"`
	Hist       string  `json:"latency_histogram"`
}

const (
	fakeCommand    = "fake measure"
	recordsCommand = "fake records"
)

// The fake kinds are registered once, before any test runs, so that tests
// never write the registry and can run in parallel.
func init() {
	RegisterKind(func() Result { return new(fakeResult) }, fakeCommand)
	RegisterKind(func() Result { return new(recordsFake) }, recordsCommand)
}

func (r *fakeResult) Metrics() []Metric {
	h, _ := DecodeHistogram(r.Hist)
	if r.Hist == "" {
		h = nil
	}
	var out []Metric
	if r.Efficiency > 0 { // like a run without its reference: no ratio
		out = append(out, Metric{Key: "efficiency", Value: r.Efficiency, Unit: "ratio", Better: HigherIsBetter, Stable: true, Dist: h})
	}
	return append(out, []Metric{
		{Key: "bandwidth_gbps", Value: r.GBps, Unit: "GB/s", Better: HigherIsBetter, Dist: h},
		{Key: "p99_ms", Value: r.P99MS, Unit: "ms", Better: LowerIsBetter, Dist: h},
		{Key: "failed", Value: r.Failed, Better: LowerIsBetter},
	}...)
}

func (r *fakeResult) Render(w io.Writer, f Format) error {
	if f == FormatJSON {
		return WriteJSON(w, r)
	}
	return FormatError(fakeCommand, f)
}

// latencies records n values spread evenly around center (ms), width
// wide: a deterministic stand-in for a run's latency histogram.
func latencies(n int, center, width float64) *Histogram {
	h := NewHistogram()
	for i := range n {
		f := (float64(i)+0.5)/float64(n) - 0.5
		h.Record(time.Duration((center + f*width) * 1e6))
	}
	return h
}

func fake(eff float64, h *Histogram) *fakeResult {
	r := &fakeResult{Meta: Meta{Schema: Schema, Command: fakeCommand, Version: "test", StartedAt: time.Unix(1e9, 0).UTC()},
		Efficiency: eff, GBps: eff * 20, P99MS: 1 / eff}
	if h != nil {
		r.Hist, _ = h.Encode()
	}
	return r
}

func TestDecodeResultSchemaChecks(t *testing.T) {
	t.Parallel()
	r := fake(0.8, latencies(100, 2, 1))
	r.Args = []string{"fake", "--x", "1"}
	r.RecordsFile = &RecordsRef{Path: "records.jsonl", Schema: RecordsSchema, Count: 3, SHA256: "ab"}
	r.Env.GPUs = []GPU{{Index: 0, Name: "NVIDIA H100 80GB HBM3", UUID: "GPU-1", Bus: "0000:19:00.0"}}
	var b bytes.Buffer
	if err := WriteJSON(&b, r); err != nil {
		t.Fatal(err)
	}
	back, err := DecodeResult(b.Bytes())
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(r, back, cmp.AllowUnexported(Histogram{})); diff != "" {
		t.Errorf("round trip (-want +got):\n%s", diff)
	}
	for in, want := range map[string]string{
		`{"schema":"nixlctl.result/v2","command":"fake measure"}`:   "this nixlctl reads nixlctl.result/v1",
		`{"schema":"other","command":"x"}`:                          "not a nixlctl result",
		`{"schema":"nixlctl.result/v1","command":"bench teleport"}`: `results of "bench teleport" are not known`,
		`[1,2]`: "not a nixlctl result",
	} {
		if _, err := DecodeResult([]byte(in)); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: got %v, want %q", in, err, want)
		}
	}
}

func TestNvidiaGPUs(t *testing.T) {
	t.Parallel()
	fsys := fstest.MapFS{
		"version":                       {Data: []byte("NVRM version: NVIDIA UNIX x86_64 Kernel Module  550.54.15  Tue Mar  5 22:23:56 UTC 2024\nGCC version: gcc 12\n")},
		"gpus/0000:3b:00.0/information": {Data: []byte("Model: \t\t NVIDIA H100 80GB HBM3\nIRQ: \t\t 42\nGPU UUID: \t GPU-bbbb\nBus Location: \t 0000:3b:00.0\nDevice Minor: \t 1\n")},
		"gpus/0000:19:00.0/information": {Data: []byte("Model: \t\t NVIDIA H100 80GB HBM3\nGPU UUID: \t GPU-aaaa\nBus Location: \t 0000:19:00.0\nDevice Minor: \t 0\n")},
	}
	driver, gpus := NvidiaGPUs(fsys)
	want := []GPU{{0, "NVIDIA H100 80GB HBM3", "GPU-aaaa", "0000:19:00.0"}, {1, "NVIDIA H100 80GB HBM3", "GPU-bbbb", "0000:3b:00.0"}}
	if driver != "550.54.15" || !cmp.Equal(gpus, want) {
		t.Errorf("driver %q gpus %+v", driver, gpus)
	}
	if d, g := NvidiaGPUs(fstest.MapFS{}); d != "" || g != nil {
		t.Errorf("no driver: %q %v", d, g)
	}
}

// recordsFake is fakeResult with records: the summary is the mean of the
// records, recomputed on load.
type recordsFake struct {
	fakeResult
	recs []float64
}

func (r *recordsFake) WriteRecords(w io.Writer) (int, error) {
	enc := json.NewEncoder(w)
	_ = enc.Encode(map[string]string{"schema": RecordsSchema, "command": r.Command})
	for _, x := range r.recs {
		_ = enc.Encode(map[string]float64{"v": x})
	}
	return len(r.recs), nil
}

func (r *recordsFake) ReadRecords(rd io.Reader) error {
	lines, err := ReadRecordLines(rd)
	if err != nil {
		return err
	}
	r.recs, r.Efficiency = nil, 0
	for _, b := range lines.Records {
		var rec map[string]float64
		if err := json.Unmarshal(b, &rec); err != nil {
			return err
		}
		r.recs = append(r.recs, rec["v"])
		r.Efficiency += rec["v"]
	}
	if len(r.recs) > 0 {
		r.Efficiency /= float64(len(r.recs))
	}
	return nil
}

func TestSaveAndLoad(t *testing.T) {
	t.Parallel()
	dir := filepath.Join(t.TempDir(), "run")
	r := &recordsFake{fakeResult: *fake(0.5, nil), recs: []float64{0.5, 0.5}}
	r.Command = recordsCommand
	m, err := Save(dir, r)
	if err != nil {
		t.Fatal(err)
	}
	if len(m.Files) != 2 || m.Files[0].Name != ResultName || m.Files[1].Role != "records" || r.RecordsFile.Count != 2 {
		t.Fatalf("manifest %+v, ref %+v", m, r.RecordsFile)
	}
	l, err := Load(dir)
	if err != nil || !l.FromRecords || len(l.Notes) != 0 || l.Result.(*recordsFake).Efficiency != 0.5 {
		t.Fatalf("load: %+v %v", l, err)
	}
	// Edit the records: the summary follows them, and the changed checksum
	// is noted.
	if err := os.WriteFile(filepath.Join(dir, RecordsName), []byte("{\"schema\":\"nixlctl.records/v1\"}\n{\"v\":0.25}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	l, err = Load(filepath.Join(dir, ResultName))
	if err != nil || l.Result.(*recordsFake).Efficiency != 0.25 || len(l.Notes) != 1 || !strings.Contains(l.Notes[0], "checksum") {
		t.Fatalf("edited records: %+v %v", l, err)
	}
	// Without the records the stored summary stands.
	os.Remove(filepath.Join(dir, RecordsName))
	// Loaded as a saved directory, its manifest says the records are gone.
	l, err = Load(dir)
	if err != nil || l.FromRecords || l.Result.(*recordsFake).Efficiency != 0.5 || len(l.Notes) != 2 ||
		len(l.Altered) != 1 || !strings.Contains(l.Altered[0], "records records.jsonl listed in manifest.json is gone") {
		t.Fatalf("missing records: %+v %v", l, err)
	}
	// The result file alone has no manifest: only the note.
	l, err = Load(filepath.Join(dir, ResultName))
	if err != nil || l.FromRecords || len(l.Notes) != 1 || len(l.Altered) != 0 {
		t.Fatalf("missing records, the result file alone: %+v %v", l, err)
	}
	// The result edited: the manifest's checksum says so.
	data, err := os.ReadFile(filepath.Join(dir, ResultName))
	must(t, err)
	must(t, os.WriteFile(filepath.Join(dir, ResultName), append(data, ' '), 0o644))
	l, err = Load(dir)
	if err != nil || len(l.Altered) != 2 || !strings.Contains(l.Altered[0], "result result.json changed since the run") {
		t.Fatalf("edited result: %+v %v", l, err)
	}
	if _, err := Load(t.TempDir()); err == nil || !strings.Contains(err.Error(), "holds no result.json") {
		t.Errorf("empty dir: %v", err)
	}
}

// The U statistic on histograms matches a brute-force count over all
// pairs of the same values.
func TestCompareDistsMatchesBruteForce(t *testing.T) {
	t.Parallel()
	av := []float64{1, 2, 2, 3, 5, 8}
	bv := []float64{2, 3, 3, 4, 9, 9, 10}
	a, b := NewHistogram(), NewHistogram()
	for _, x := range av {
		a.Record(time.Duration(x * 1e6))
	}
	for _, x := range bv {
		b.Record(time.Duration(x * 1e6))
	}
	var gt, lt float64
	for _, x := range av {
		for _, y := range bv {
			switch {
			case y > x:
				gt++
			case y < x:
				lt++
			}
		}
	}
	want := (gt - lt) / float64(len(av)*len(bv))
	s := CompareDists(a, b)
	if math.Abs(s.Delta-want) > 1e-12 || s.NA != 6 || s.NB != 7 {
		t.Errorf("delta %v, want %v (%+v)", s.Delta, want, s)
	}
	same := CompareDists(latencies(500, 2, 1), latencies(500, 2, 1))
	if same.Delta != 0 || same.P < 0.99 || same.Real() || !same.Overlap || !strings.HasPrefix(same.String(), "same") {
		t.Errorf("identical: %+v %s", same, same)
	}
	slower := CompareDists(latencies(500, 2, 1), latencies(500, 4, 1))
	if slower.Delta != 1 || !slower.Slower() || slower.Overlap || !strings.HasPrefix(slower.String(), "slower (p<0.001") {
		t.Errorf("shifted: %+v %s", slower, slower)
	}
	if CompareDists(nil, NewHistogram()).String() != "-" {
		t.Error("a missing side has no test")
	}
}
