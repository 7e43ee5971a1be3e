package plots

import (
	"bytes"
	"encoding/xml"
	"image"
	_ "image/png"
	"io"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/nixlctl/nixlctl/internal/report"
)

// synthetic figures: shapes like real runs, from a seeded generator.
func figures(t *testing.T) map[string]report.Figure {
	t.Helper()
	rng := rand.New(rand.NewPCG(1, 2))
	var sweep []report.SweepPoint
	for _, batch := range []int{1, 4, 16} {
		for b := 4 << 10; b <= 64<<20; b *= 2 {
			bytes := float64(b * batch)
			gbps := 12 * bytes / (bytes + 40e3)
			sweep = append(sweep, report.SweepPoint{Block: b, Batch: batch, GBps: gbps, P99US: 3 + bytes/gbps/1e3*1.2})
		}
	}
	sf, err := report.SweepFigure("bench xfer WRITE DRAM->DRAM over ucx", sweep)
	if err != nil {
		t.Fatal(err)
	}
	h := report.NewHistogram()
	var raw []float64
	for range 2000 {
		v := 2 + rng.ExpFloat64()*0.8
		raw = append(raw, v)
		h.Record(time.Duration(v * 1e6))
	}
	lf, err := report.LatencyFigure("bench push latency", time.Millisecond,
		report.LatencySeries{Label: "handoff (records)", Values: raw}, report.LatencySeries{Label: "handoff (histogram)", Hist: h})
	if err != nil {
		t.Fatal(err)
	}
	var rss []report.RSSSeries
	for i, slope := range []float64{0, 0.05, 0.4} {
		s := report.RSSSeries{Label: []string{"default", "RCACHE=1024", "MMAP_HOOK=none"}[i], Intercept: 300, SlopeMBs: slope, Fitted: true}
		for ts := 0.0; ts <= 120; ts += 2 {
			s.Seconds = append(s.Seconds, ts)
			s.RSSMB = append(s.RSSMB, 300+slope*ts+rng.NormFloat64()*1.5)
		}
		rss = append(rss, s)
	}
	rf, err := report.RSSFigure("probe ucx-leak (synthetic example data)", rss)
	if err != nil {
		t.Fatal(err)
	}
	var leases []report.LeaseSpan
	for i := range 12 {
		start := float64(i) * 0.8
		out := "released"
		if i%5 == 3 {
			out = "expired"
		}
		if i == 7 {
			out = "failed"
		}
		leases = append(leases, report.LeaseSpan{ID: "req-" + string(rune('a'+i)), Start: start, End: start + 1 + rng.Float64()*3, Outcome: out})
	}
	tf, err := report.LeaseTimelineFigure("lease-chaos (synthetic example data)", leases)
	if err != nil {
		t.Fatal(err)
	}
	// an xPyD run's pair matrices: incast on decode-0, a slow pair, a pair
	// that moved nothing
	hf := report.Figure{Title: "bench pull, 2 prefill x 3 decode (synthetic example data)", Columns: 2, Panels: []report.Panel{
		{Title: "GB/s per pair", XLabel: "decode", YLabel: "prefill", Heatmap: &report.Heatmap{
			Rows: []string{"prefill-0", "prefill-1"}, Cols: []string{"decode-0", "decode-1", "decode-2"},
			Values: [][]float64{{3.1, 6.2, 6.0}, {2.9, 0.8, math.NaN()}}, HighIsGood: true}},
		{Title: "handoff p99 per pair (ms)", XLabel: "decode", YLabel: "prefill", Heatmap: &report.Heatmap{
			Rows: []string{"prefill-0", "prefill-1"}, Cols: []string{"decode-0", "decode-1", "decode-2"},
			Values: [][]float64{{1200, 5.5, 58}, {1300, 41, math.NaN()}}}},
	}}
	return map[string]report.Figure{"sweep": sf, "latency": lf, "rss": rf, "leases": tf, "heatmap": hf}
}

// TestFiguresDecode draws every kind of figure as PNG and SVG and checks
// the files are real images. NIXLCTL_PLOT_DIR keeps them for a look.
func TestFiguresDecode(t *testing.T) {
	t.Parallel()
	dir := os.Getenv("NIXLCTL_PLOT_DIR")
	if dir == "" {
		dir = t.TempDir()
	}
	for name, f := range figures(t) {
		for _, ext := range []string{"png", "svg"} {
			path := filepath.Join(dir, name+"."+ext)
			if err := Save(path, f); err != nil {
				t.Fatalf("%s: %v", path, err)
			}
			b, err := os.ReadFile(path)
			if err != nil || len(b) == 0 {
				t.Fatalf("%s: %d bytes, %v", path, len(b), err)
			}
			if ext == "png" {
				img, format, err := image.Decode(bytes.NewReader(b))
				if err != nil || format != "png" || img.Bounds().Dx() < 400 {
					t.Errorf("%s: %v %s %v", path, err, format, img)
				}
				continue
			}
			if err := wellFormedXML(b); err != nil {
				t.Errorf("%s: %v", path, err)
			}
		}
	}
}

func wellFormedXML(b []byte) error {
	d := xml.NewDecoder(bytes.NewReader(b))
	root := ""
	for {
		tok, err := d.Token()
		if err == io.EOF {
			if root != "svg" {
				return io.ErrUnexpectedEOF
			}
			return nil
		}
		if err != nil {
			return err
		}
		if se, ok := tok.(xml.StartElement); ok && root == "" {
			root = se.Name.Local
		}
	}
}

// A log axis over values <= 0 panics inside gonum and leaves an empty file
// with plot.Save; Save must neither panic nor leave a file.
func TestSaveNoEmptyFileOnBadData(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "bad.png")
	f := report.Figure{Panels: []report.Panel{{XScale: report.Log10, Lines: []report.Line{{X: []float64{0, -1}, Y: []float64{1, 2}}}}}}
	if err := Save(path, f); err == nil {
		t.Error("a panel with nothing drawable should be an error")
	}
	if _, err := os.Stat(path); err == nil {
		t.Error("a failed plot left a file")
	}
	if err := Save(filepath.Join(t.TempDir(), "x.pdf"), f); err == nil {
		t.Error(".pdf accepted")
	}
	ok := report.Figure{Panels: []report.Panel{{XScale: report.Log10, Lines: []report.Line{{X: []float64{0, 1, 10}, Y: []float64{1, 2, math.NaN()}}, {X: []float64{1, 100}, Y: []float64{3, 4}}}}}}
	if err := Save(path, ok); err != nil {
		t.Errorf("points a log axis cannot show should be dropped: %v", err)
	}
}

func TestLogTicks(t *testing.T) {
	t.Parallel()
	labels := func(ts logTicks, lo, hi float64) (n int, out []string) {
		for _, tk := range ts.Ticks(lo, hi) {
			if tk.Label != "" {
				out = append(out, tk.Label)
			}
		}
		return len(out), out
	}
	if n, l := labels(logTicks{base2: true, bytes: true}, 4096, 64<<20); n > 9 || l[0] != "4K" {
		t.Errorf("bytes axis: %v", l)
	}
	if n, l := labels(logTicks{}, 20, 90); n < 2 {
		t.Errorf("within one decade: %v", l)
	}
	if _, l := labels(logTicks{}, 1, 1e6); len(l) != 7 {
		t.Errorf("six decades: %v", l)
	}
}

// A heatmap whose values do not match its labels is an error, not a
// panic or a half-drawn picture.
func TestHeatmapShape(t *testing.T) {
	for _, hm := range []*report.Heatmap{
		{Rows: []string{"a"}, Cols: []string{"x", "y"}, Values: [][]float64{{1}}},
		{Rows: []string{"a", "b"}, Cols: []string{"x"}, Values: [][]float64{{1}}},
		{},
	} {
		f := report.Figure{Panels: []report.Panel{{Title: "bad", Heatmap: hm}}}
		if err := Write(io.Discard, "png", f); err == nil {
			t.Errorf("%+v: no error", hm)
		}
	}
	one := report.Figure{Panels: []report.Panel{{Title: "one value", Heatmap: &report.Heatmap{Rows: []string{"a"}, Cols: []string{"x"}, Values: [][]float64{{2}}}}}}
	if err := Write(io.Discard, "svg", one); err != nil {
		t.Error(err)
	}
}
