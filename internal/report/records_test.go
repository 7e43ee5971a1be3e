package report

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/nixlctl/nixlctl/internal/testkit"
)

const recordsHead = `{"schema":"nixlctl.records/v1","command":"fake records"}` + "\n"

// What a kill leaves behind reads back: no trailer is expected, a last
// line cut mid-way is skipped and measured, and anything else wrong is an
// error.
func TestReadRecordLines(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, in string
		recs     []string
		torn     int
		err      string
	}{
		{name: "complete", in: recordsHead + "{\"v\":1}\n{\"v\":2}\n", recs: []string{`{"v":1}`, `{"v":2}`}},
		{name: "header only", in: recordsHead},
		{name: "no newline at the end, whole", in: recordsHead + "{\"v\":1}\n{\"v\":2}", recs: []string{`{"v":1}`, `{"v":2}`}},
		{name: "torn last line", in: recordsHead + "{\"v\":1}\n{\"v\":2}\n{\"v\":", recs: []string{`{"v":1}`, `{"v":2}`}, torn: 5},
		{name: "blank lines", in: recordsHead + "\n{\"v\":1}\n\n", recs: []string{`{"v":1}`}},
		{name: "bad line inside", in: recordsHead + "{\"v\":\n{\"v\":2}\n", err: "records line 2: not valid JSON"},
		{name: "bad last line with its newline", in: recordsHead + "{\"v\":1}\nnope\n", err: "records line 3: not valid JSON"},
		{name: "empty", in: "", err: "records: empty file"},
		{name: "torn header", in: `{"schema":"nixl`, err: "header line is cut short"},
		{name: "not a header", in: "{\"v\":1}\n", err: "first line is not a nixlctl.records/v1 header"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			l, err := ReadRecordLines(strings.NewReader(tc.in))
			if tc.err != "" {
				testkit.WantErr(t, err, tc.err)
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, r := range l.Records {
				got = append(got, string(r))
			}
			if diff := cmp.Diff(tc.recs, got); diff != "" || l.Torn != tc.torn {
				t.Errorf("records (-want +got):\n%s torn %d, want %d", diff, l.Torn, tc.torn)
			}
		})
	}
}

// saveProvisional writes a provisional result, as a run does at its
// start, into a directory of its own.
func saveProvisional(t *testing.T) (string, *recordsFake) {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "run")
	r := &recordsFake{fakeResult: *fake(0.9, nil)}
	r.Command = recordsCommand
	if err := SaveProvisional(dir, r); err != nil {
		t.Fatal(err)
	}
	return dir, r
}

// A run killed mid-way: the provisional result written at its start and
// the records it streamed, the last one torn. Load recomputes from the
// whole records, skips the torn one, and says the run was partial.
func TestLoadPartialRun(t *testing.T) {
	t.Parallel()
	dir, r := saveProvisional(t)
	if r.Partial || r.RecordsFile != nil {
		t.Fatalf("SaveProvisional changed the result: %+v", r.Meta)
	}
	w, err := CreateRecords(filepath.Join(dir, RecordsName))
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Header(map[string]string{"schema": RecordsSchema, "command": recordsCommand}); err != nil {
		t.Fatal(err)
	}
	for _, v := range []float64{0.2, 0.4} {
		if err := w.Append(map[string]float64{"v": v}); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	f, err := os.OpenFile(filepath.Join(dir, RecordsName), os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	f.WriteString(`{"v":0.`) // the kill came mid-write
	f.Close()

	l, err := Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	got := l.Result.(*recordsFake)
	if !l.Partial || !got.Partial || !l.FromRecords || len(got.recs) != 2 || got.Efficiency < 0.299 || got.Efficiency > 0.301 {
		t.Fatalf("load: partial %v/%v, from records %v, recs %v, efficiency %v", l.Partial, got.Partial, l.FromRecords, got.recs, got.Efficiency)
	}
	notes := strings.Join(l.Notes, "\n")
	for _, want := range []string{"the run did not finish", "from the 2 records", "cut mid-way (7 bytes"} {
		if !strings.Contains(notes, want) {
			t.Errorf("notes %q lack %q", notes, want)
		}
	}
	if !strings.Contains(strings.Join(got.Warnings, "\n"), "partial: the run did not finish") {
		t.Errorf("warnings %q", got.Warnings)
	}
	if p := Problems(got); len(p) != 1 || !strings.Contains(p[0], "did not finish") {
		t.Errorf("problems %q: the gate must refuse a partial run", p)
	}

	// The final save replaces the provisional result, linking the
	// streamed records as they are.
	count, n, sum := w.Written()
	r.recs = []float64{0.2, 0.4}
	m, err := SaveStreamed(dir, r, Streamed{Count: count, Bytes: n, SHA256: sum})
	if err != nil {
		t.Fatal(err)
	}
	if len(m.Files) != 2 || m.Files[1].Bytes != n || r.RecordsFile.Count != 2 || r.Partial {
		t.Fatalf("manifest %+v, result %+v", m, r.Meta)
	}
	// Records cut short under a final result are partial too.
	l, err = Load(dir)
	if err != nil || !l.Partial || !strings.Contains(strings.Join(l.Notes, "\n"), "cut mid-way") {
		t.Fatalf("final result, torn records: %+v %v", l, err)
	}
}

// A provisional result whose records never got their header (killed at
// once) shows as it is, with a note.
func TestLoadPartialRunWithoutRecords(t *testing.T) {
	t.Parallel()
	dir, _ := saveProvisional(t)
	if err := os.WriteFile(filepath.Join(dir, RecordsName), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	l, err := Load(dir)
	if err != nil || !l.Partial || l.FromRecords || len(l.Notes) != 1 || !strings.Contains(l.Notes[0], "hold nothing") {
		t.Fatalf("%+v %v", l, err)
	}
}
