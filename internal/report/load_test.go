package report

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

// savedWithRecordsPath saves a result that keeps records, then points its
// records path at recPath, as a crafted or moved result file would.
func savedWithRecordsPath(t *testing.T, recPath string) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "run")
	r := &recordsFake{fakeResult: *fake(0.5, nil), recs: []float64{0.25, 0.25}}
	r.Command = recordsCommand
	if _, err := Save(dir, r); err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(dir, ResultName)
	data, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := json.Unmarshal(data, &m); err != nil {
		t.Fatal(err)
	}
	m["records_file"].(map[string]any)["path"] = recPath
	if data, err = json.Marshal(m); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(file, data, 0o644); err != nil {
		t.Fatal(err)
	}
	reseal(t, dir)
	return dir
}

// reseal puts result.json's new checksum in the manifest, as if the run
// had written the result as edited (else Load reports it altered).
func reseal(t *testing.T, dir string) {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(dir, ResultName))
	must(t, err)
	mb, err := os.ReadFile(filepath.Join(dir, ManifestName))
	must(t, err)
	var m Manifest
	must(t, json.Unmarshal(mb, &m))
	for i := range m.Files {
		if m.Files[i].Name == ResultName {
			m.Files[i].SHA256 = sha(data)
		}
	}
	mb, err = json.Marshal(m)
	must(t, err)
	must(t, os.WriteFile(filepath.Join(dir, ManifestName), mb, 0o644))
}

// A result's records path comes from the file: only a regular file inside
// the result's directory is read (a result naming /dev/zero exhausted
// memory), and never more than MaxLoadBytes.
func TestLoadReadsOnlyRecordsInsideTheResultDir(t *testing.T) {
	t.Parallel()
	outside := filepath.Join(t.TempDir(), "elsewhere.jsonl")
	if err := os.WriteFile(outside, []byte("{\"schema\":\"nixlctl.records/v1\"}\n{\"v\":0.125}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name    string
		records string
		setup   func(t *testing.T, dir string)
		note    string // the stored summary stands, with this note
		recomp  bool   // the summary comes from the records
	}{
		{name: "saved records", records: RecordsName, recomp: true},
		{name: "dot-slash inside", records: "./" + RecordsName, recomp: true},
		{name: "/dev/zero", records: "/dev/zero", note: "outside the result's directory"},
		{name: "absolute, outside", records: outside, note: "outside the result's directory"},
		{name: "relative, escaping", records: "../escape.jsonl", note: "outside the result's directory",
			setup: func(t *testing.T, dir string) {
				must(t, os.WriteFile(filepath.Join(dir, "..", "escape.jsonl"), []byte("{\"schema\":\"nixlctl.records/v1\"}\n"), 0o644))
			}},
		{name: "symlink out", records: "link.jsonl", note: "outside the result's directory",
			setup: func(t *testing.T, dir string) { must(t, os.Symlink("/dev/zero", filepath.Join(dir, "link.jsonl"))) }},
		{name: "symlink in", records: "link.jsonl", recomp: true,
			setup: func(t *testing.T, dir string) { must(t, os.Symlink(RecordsName, filepath.Join(dir, "link.jsonl"))) }},
		{name: "fifo", records: "fifo.jsonl", note: "not a regular file",
			setup: func(t *testing.T, dir string) { must(t, syscall.Mkfifo(filepath.Join(dir, "fifo.jsonl"), 0o644)) }},
		{name: "directory", records: ".", note: "not a regular file"},
		{name: "missing", records: "gone.jsonl", note: "not read"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			dir := savedWithRecordsPath(t, tc.records)
			if tc.setup != nil {
				tc.setup(t, dir)
			}
			l, err := Load(dir)
			if err != nil {
				t.Fatal(err)
			}
			if l.FromRecords != tc.recomp {
				t.Errorf("FromRecords = %v, want %v (notes %q)", l.FromRecords, tc.recomp, l.Notes)
			}
			if tc.note == "" && len(l.Notes) > 0 {
				t.Errorf("unexpected notes %q", l.Notes)
			}
			if tc.note != "" && (len(l.Notes) != 1 || !strings.Contains(l.Notes[0], tc.note)) {
				t.Errorf("notes %q, want one with %q", l.Notes, tc.note)
			}
			want := 0.5 // stored
			if tc.recomp {
				want = 0.25 // from the records
			}
			if got := l.Result.(*recordsFake).Efficiency; got != want {
				t.Errorf("efficiency %v, want %v", got, want)
			}
		})
	}
}

// Not parallel: it lowers the package's MaxLoadBytes.
func TestLoadSizeLimit(t *testing.T) {
	dir := savedWithRecordsPath(t, RecordsName)
	defer func(n int64) { MaxLoadBytes = n }(MaxLoadBytes)
	st, err := os.Stat(filepath.Join(dir, ResultName))
	if err != nil {
		t.Fatal(err)
	}
	// The result fits, the records do not.
	MaxLoadBytes = st.Size()
	must(t, os.WriteFile(filepath.Join(dir, RecordsName), []byte(strings.Repeat("{\"v\":0}\n", int(st.Size()))), 0o644))
	want := "larger than the limit of " + itoa(st.Size()) + " bytes"
	if _, err := Load(dir); err == nil || !strings.Contains(err.Error(), want) {
		t.Errorf("records over the limit: %v, want %q", err, want)
	}
	MaxLoadBytes = 10
	if _, err := Load(dir); err == nil || !strings.Contains(err.Error(), "larger than the limit of 10 bytes") {
		t.Errorf("result over the limit: %v", err)
	}
}

func TestLoadRefusesWhatIsNotAResultFile(t *testing.T) {
	t.Parallel()
	if _, err := Load("/dev/zero"); err == nil || !strings.Contains(err.Error(), "not a regular file") {
		t.Errorf("/dev/zero: %v", err)
	}
	dir := savedWithRecordsPath(t, RecordsName)
	man := `{"schema": "` + ManifestSchema + `", "files": [{"name": "../../etc/passwd", "role": "result"}]}`
	must(t, os.WriteFile(filepath.Join(dir, ManifestName), []byte(man), 0o644))
	if _, err := Load(dir); err == nil || !strings.Contains(err.Error(), "is not a file inside") {
		t.Errorf("manifest pointing outside: %v", err)
	}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func itoa(n int64) string { b, _ := json.Marshal(n); return string(b) }
