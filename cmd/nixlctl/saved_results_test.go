package main

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/nixlctl/nixlctl/internal/golden"
	"github.com/nixlctl/nixlctl/internal/report"
)

// Saved results of every run kind (bench xfer, pull, push, sglang, ec
// and lease-chaos, written by nixlctl before its run kinds moved into
// packages of their own) still decode into their kind, keep every field
// when written again, and render as they did: the schema and the
// renderers are what scripts and gates read, whatever package holds them.
func TestSavedResultsOfEveryKind(t *testing.T) {
	files, err := filepath.Glob("testdata/results/*.json")
	if err != nil || len(files) < 6 {
		t.Fatalf("saved results: %v %v", files, err)
	}
	for _, f := range files {
		name := strings.TrimSuffix(filepath.Base(f), ".json")
		t.Run(name, func(t *testing.T) {
			saved, err := os.ReadFile(f)
			if err != nil {
				t.Fatal(err)
			}
			res, err := report.DecodeResult(saved)
			if err != nil {
				t.Fatal(err)
			}
			var again bytes.Buffer
			if err := report.WriteJSON(&again, res); err != nil {
				t.Fatal(err)
			}
			if d := cmp.Diff(jsonPaths(t, saved), jsonPaths(t, again.Bytes())); d != "" {
				t.Errorf("fields written again differ from the saved ones (-saved +again):\n%s", d)
			}
			for format, ext := range map[report.Format]string{report.FormatTable: "txt", report.FormatMarkdown: "md"} {
				var b bytes.Buffer
				if err := res.Render(&b, format); err != nil {
					t.Fatalf("%s: %v", format, err)
				}
				golden.Check(t, "results/"+name+"."+ext, b.Bytes())
			}
		})
	}
}

// jsonPaths lists every key path in a JSON document, array indices
// folded to [].
func jsonPaths(t *testing.T, doc []byte) []string {
	t.Helper()
	var v any
	if err := json.Unmarshal(doc, &v); err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	var walk func(prefix string, v any)
	walk = func(prefix string, v any) {
		seen[prefix] = true
		switch x := v.(type) {
		case map[string]any:
			for k, e := range x {
				walk(prefix+"."+k, e)
			}
		case []any:
			for _, e := range x {
				walk(prefix+"[]", e)
			}
		}
	}
	walk("", v)
	out := make([]string, 0, len(seen))
	for p := range seen {
		out = append(out, p)
	}
	slices.Sort(out)
	return out
}
