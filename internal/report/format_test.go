package report

import (
	"bytes"
	"errors"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/nixlctl/nixlctl/internal/golden"
)

func TestFormatting(t *testing.T) {
	t.Parallel()
	tests := []struct{ got, want string }{
		{Int(0), "0"}, {Int(999), "999"}, {Int(1000), "1,000"}, {Int(327680), "327,680"}, {Int(-1234567), "-1,234,567"},
		{Bytes(999), "999 B"}, {Bytes(1024), "1 KiB"}, {Bytes(327680), "320 KiB"}, {Bytes(1342177280), "1.25 GiB"},
		{GBps(18.04e9), "18.0 GB/s"}, {GBps(512e6), "0.512 GB/s"}, {GBps(123.4e9), "123 GB/s"},
		{Duration(13416 * time.Microsecond), "13.4 ms"}, {Duration(850 * time.Microsecond), "850 µs"},
		{Duration(1640 * time.Millisecond), "1.64 s"}, {Duration(0), "0"}, {Duration(12), "12.0 ns"},
		{Seconds(0.0537), "53.7 ms"},
	}
	for _, tc := range tests {
		if tc.got != tc.want {
			t.Errorf("got %q, want %q", tc.got, tc.want)
		}
	}
	if _, err := ParseFormat("yaml"); err == nil {
		t.Error("yaml is not a format")
	}
}

func TestTableRenderings(t *testing.T) {
	t.Parallel()
	tb := &Table{Title: "T", Columns: []Column{{"name", Left}, {"value", Right}}, Notes: []string{"note"}}
	tb.AddRow("a|b", "1")
	tb.AddRow("long name", "12,345")
	tb.AddRow("short")
	var txt, csv, md bytes.Buffer
	if err := tb.WriteText(&txt); err != nil {
		t.Fatal(err)
	}
	if err := tb.WriteCSV(&csv); err != nil {
		t.Fatal(err)
	}
	if err := tb.WriteMarkdown(&md); err != nil {
		t.Fatal(err)
	}
	golden.Check(t, "table.txt", txt.Bytes())
	golden.Check(t, "table.csv", csv.Bytes())
	golden.Check(t, "table.md", md.Bytes())
}

func TestParseSize(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]int64{"4096": 4096, "64K": 65536, "64KiB": 65536, "1m": 1 << 20, "1.5G": 3 << 29, "2TB": 2 << 40, "0": 0} {
		if got, err := ParseSize(in); err != nil || got != want {
			t.Errorf("ParseSize(%q) = %d, %v", in, got, err)
		}
	}
	for _, bad := range []string{"", "x", "-1K", "1.3", "9999999T", "NaN", "nanK", "Inf", "-0.5", "1e300", "18014398509481985K"} {
		if _, err := ParseSize(bad); err == nil {
			t.Errorf("ParseSize(%q) accepted", bad)
		}
	}
}

// says is a writer of a fixed text, so the test can tell which one ran.
type says string

func (s says) write(w io.Writer) error { _, err := io.WriteString(w, string(s)); return err }

// everyFormat has a writer of its own for every format.
type everyFormat struct {
	A int `json:"a"`
}

func (everyFormat) WriteText(w io.Writer) error     { return says("text").write(w) }
func (everyFormat) WriteCSV(w io.Writer) error      { return says("csv").write(w) }
func (everyFormat) WriteMarkdown(w io.Writer) error { return says("md").write(w) }
func (everyFormat) WriteProm(w io.Writer) error     { return says("prom").write(w) }

// textOnly has only its text.
type textOnly []int

func (textOnly) WriteText(w io.Writer) error { return says("text").write(w) }

// metricsOnly is a Result with text and no Prometheus writer of its own.
type metricsOnly struct{ *fakeResult }

func (metricsOnly) WriteText(w io.Writer) error { return says("text").write(w) }

// noProm refuses Prometheus text, as a comparison does.
type noProm struct{ textOnly }

func (noProm) WriteProm(io.Writer) error { return FormatError("no prom", FormatProm) }

func TestWrite(t *testing.T) {
	t.Parallel()
	gauges := "# HELP nixlctl_fake_measure_bandwidth_gbps bandwidth_gbps (GB/s), higher is better\n"
	for _, tc := range []struct {
		name    string
		f       Format
		res     TextWriter
		want    string
		prefix  bool // want is how the output starts
		wantErr error
	}{
		{"json is the value", FormatJSON, everyFormat{1}, "{\n  \"a\": 1\n}\n", false, nil},
		{"table", FormatTable, everyFormat{}, "text", false, nil},
		{"csv", FormatCSV, everyFormat{}, "csv", false, nil},
		{"markdown", FormatMarkdown, everyFormat{}, "md", false, nil},
		{"prom", FormatProm, everyFormat{}, "prom", false, nil},
		{"an unknown format: text", Format("yaml"), everyFormat{}, "text", false, nil},
		{"json without writers", FormatJSON, textOnly{1}, "[\n  1\n]\n", false, nil},
		{"no csv of its own: text", FormatCSV, textOnly{}, "text", false, nil},
		{"no markdown of its own: text", FormatMarkdown, textOnly{}, "text", false, nil},
		{"no prom and no metrics: text", FormatProm, textOnly{}, "text", false, nil},
		{"no prom of its own: the metrics as gauges", FormatProm, metricsOnly{fake(0.8, nil)}, gauges, true, nil},
		{"a result's json is the result", FormatJSON, metricsOnly{fake(0.8, nil)}, "{\n  \"schema\": \"" + Schema + "\"", true, nil},
		{"a format refused: the error", FormatProm, noProm{}, "", false, ErrFormat},
		{"a format refused, the others written", FormatCSV, noProm{}, "text", false, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			var b strings.Builder
			err := Write(&b, tc.f, tc.res)
			if (err != nil) != (tc.wantErr != nil) || !errors.Is(err, tc.wantErr) {
				t.Fatalf("Write(%s) error %v, want %v", tc.f, err, tc.wantErr)
			}
			if got := b.String(); got != tc.want && !(tc.prefix && strings.HasPrefix(got, tc.want)) {
				t.Errorf("Write(%s) = %q, want %q", tc.f, got, tc.want)
			}
		})
	}
}
