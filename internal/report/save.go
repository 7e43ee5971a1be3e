package report

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"time"

	"github.com/nixlctl/nixlctl/internal/userfile"
)

// Names of the files `--save DIR` writes.
const (
	ResultName   = "result.json"
	RecordsName  = "records.jsonl"
	ManifestName = "manifest.json"
	// ManifestSchema versions the manifest's format.
	ManifestSchema = "nixlctl.manifest/v1"
)

// Manifest lists what a saved run directory holds, with checksums, so a
// result and its records travel and are checked together.
type Manifest struct {
	Schema    string         `json:"schema"`
	Command   string         `json:"command"`
	Version   string         `json:"nixlctl_version"`
	CreatedAt time.Time      `json:"created_at"`
	Files     []ManifestFile `json:"files"`
}

// ManifestFile is one file of a saved run.
type ManifestFile struct {
	Name   string `json:"name"`
	Role   string `json:"role"` // result, records, plot
	Bytes  int    `json:"bytes"`
	SHA256 string `json:"sha256"`
}

// Save writes r into dir (created if needed): its records (when it keeps
// any) as records.jsonl, the result as result.json linking to them, and
// manifest.json. Extra files already written into dir (a plot) are listed
// in the manifest when named in extra.
func Save(dir string, r Result, extra ...string) (*Manifest, error) {
	return save(dir, r, nil, extra)
}

// Streamed describes a records file that a run streamed into a saved
// directory as records.jsonl while it went (see RecordsWriter.Written).
type Streamed struct {
	Count, Bytes int
	SHA256       string
}

// SaveStreamed is Save for a run whose records were streamed into
// dir/records.jsonl: the result links that file as it is and the manifest
// lists it, rather than writing the records again.
func SaveStreamed(dir string, r Result, recs Streamed, extra ...string) (*Manifest, error) {
	return save(dir, r, &recs, extra)
}

// SaveProvisional writes, when a streaming run's timed phase starts, a
// result.json marked Partial that links the records.jsonl being streamed,
// and a manifest listing both: if the run is killed, `report show DIR`
// still finds a result to recompute from the records. The final Save
// replaces both.
func SaveProvisional(dir string, r Result) error {
	return savePartial(dir, r, &RecordsRef{Path: RecordsName, Schema: RecordsSchema})
}

// SaveSnapshot writes a result as it stands in the middle of a run that
// streams no records (bench xfer after each point, bench ec before its
// timed phase), marked Partial, with a manifest: a run killed then still
// leaves what it had measured for `report show DIR`, and the gate refuses
// it as partial. The final Save replaces both.
func SaveSnapshot(dir string, r Result) error { return savePartial(dir, r, nil) }

// savePartial writes r marked Partial, linking records (nil: none), and
// a manifest listing the result and the records file. The records are
// still growing: the manifest gives them no size or checksum.
func savePartial(dir string, r Result, records *RecordsRef) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	h := r.Header()
	keep := *h
	defer func() { *h = keep }()
	h.Partial, h.RecordsFile = true, records
	var b bytes.Buffer
	if err := WriteJSON(&b, r); err != nil {
		return err
	}
	sum, err := writeFile(filepath.Join(dir, ResultName), b.Bytes())
	if err != nil {
		return err
	}
	files := []ManifestFile{{Name: ResultName, Role: "result", Bytes: b.Len(), SHA256: sum}}
	if records != nil {
		files = append(files, ManifestFile{Name: records.Path, Role: "records"})
	}
	m := &Manifest{Schema: ManifestSchema, Command: h.Command, Version: h.Version, CreatedAt: time.Now().UTC(), Files: files}
	var mb bytes.Buffer
	if err := WriteJSON(&mb, m); err != nil {
		return err
	}
	_, err = writeFile(filepath.Join(dir, ManifestName), mb.Bytes())
	return err
}

func save(dir string, r Result, streamed *Streamed, extra []string) (*Manifest, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	h := r.Header()
	h.Partial = false
	m := &Manifest{Schema: ManifestSchema, Command: h.Command, Version: h.Version, CreatedAt: time.Now().UTC()}
	if streamed != nil {
		h.RecordsFile = &RecordsRef{Path: RecordsName, Schema: RecordsSchema, Count: streamed.Count, SHA256: streamed.SHA256}
		m.Files = append(m.Files, ManifestFile{Name: RecordsName, Role: "records", Bytes: streamed.Bytes, SHA256: streamed.SHA256})
	} else if rk, ok := r.(RecordsKeeper); ok {
		var b bytes.Buffer
		n, err := rk.WriteRecords(&b)
		if err != nil {
			return nil, fmt.Errorf("records: %w", err)
		}
		sum, err := writeFile(filepath.Join(dir, RecordsName), b.Bytes())
		if err != nil {
			return nil, err
		}
		h.RecordsFile = &RecordsRef{Path: RecordsName, Schema: RecordsSchema, Count: n, SHA256: sum}
		m.Files = append(m.Files, ManifestFile{Name: RecordsName, Role: "records", Bytes: b.Len(), SHA256: sum})
	}
	var b bytes.Buffer
	if err := WriteJSON(&b, r); err != nil {
		return nil, err
	}
	sum, err := writeFile(filepath.Join(dir, ResultName), b.Bytes())
	if err != nil {
		return nil, err
	}
	m.Files = append([]ManifestFile{{Name: ResultName, Role: "result", Bytes: b.Len(), SHA256: sum}}, m.Files...)
	for _, name := range extra {
		data, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil {
			return nil, err
		}
		m.Files = append(m.Files, ManifestFile{Name: name, Role: "plot", Bytes: len(data), SHA256: sha(data)})
	}
	var mb bytes.Buffer
	if err := WriteJSON(&mb, m); err != nil {
		return nil, err
	}
	if _, err := writeFile(filepath.Join(dir, ManifestName), mb.Bytes()); err != nil {
		return nil, err
	}
	return m, nil
}

func sha(b []byte) string {
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}

// writeFile writes through a temporary file and a rename, so an
// interrupted save leaves no half-written file under the final name.
func writeFile(path string, data []byte) (string, error) {
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, data, 0o644); err != nil {
		return "", err
	}
	if err := os.Rename(tmp, path); err != nil {
		return "", err
	}
	return sha(data), nil
}

// Loaded is a result read back from disk.
type Loaded struct {
	Result Result
	Path   string // the result file
	// FromRecords says the summary was recomputed from the records file.
	FromRecords bool
	Notes       []string // what could not be checked or read, one line each
	// Partial says the run did not finish: a provisional result, or
	// records cut short by a kill.
	Partial bool
	// Altered lists, one line each, what differs from the checksums the
	// run wrote (manifest.json's, the result's own for its records): a
	// file edited or deleted since. The summary shown may still be
	// right, but the gate will not judge a result it cannot vouch for.
	Altered []string
}

// MaxLoadBytes bounds each file Load reads (result, manifest, records):
// a saved result comes from elsewhere, and one naming /dev/zero or a huge
// file must fail with a message, not exhaust memory. A variable so that
// tests can lower it.
var MaxLoadBytes = userfile.MaxLarge

// Load reads a result from a result file or a --save directory. When the
// result links a records file that is present and the kind keeps records,
// the records are read and the summary recomputed from them; a missing or
// changed records file is noted, not an error, since the stored summary
// still stands. Records are only read from a regular file inside the
// result's directory (symlinks resolved): the path comes from the result
// file, which may have been crafted to point anywhere.
func Load(path string) (*Loaded, error) {
	st, err := os.Stat(path)
	if err != nil {
		return nil, err
	}
	file := path
	var manifest *Manifest
	if st.IsDir() {
		file = filepath.Join(path, ResultName)
		if mb, err := readRegular(filepath.Join(path, ManifestName)); err == nil {
			var m Manifest
			if err := json.Unmarshal(mb, &m); err != nil || m.Schema != ManifestSchema {
				return nil, fmt.Errorf("%s: not a nixlctl manifest", filepath.Join(path, ManifestName))
			}
			for _, f := range m.Files {
				if !filepath.IsLocal(f.Name) {
					return nil, fmt.Errorf("%s: %s %q is not a file inside %s", filepath.Join(path, ManifestName), f.Role, f.Name, path)
				}
				if f.Role == "result" {
					file = filepath.Join(path, f.Name)
				}
			}
			manifest = &m
		} else if errors.Is(err, errTooLarge) {
			return nil, err
		}
	}
	data, err := readRegular(file)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) && st.IsDir() {
			return nil, fmt.Errorf("%s holds no %s (save one with --save DIR)", path, ResultName)
		}
		return nil, err
	}
	r, err := DecodeResult(data)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", file, err)
	}
	l := &Loaded{Result: r, Path: file, Partial: r.Header().Partial}
	if manifest != nil {
		l.Altered = manifest.check(path, filepath.Base(file), data)
		l.Notes = append(l.Notes, l.Altered...)
	}
	h := r.Header()
	ref := h.RecordsFile
	rk, keeps := r.(RecordsKeeper)
	if ref == nil && h.Partial {
		l.Notes = append(l.Notes, "the run did not finish: this is the result as it stood when it was last saved (SaveSnapshot), before it was stopped")
	}
	if ref == nil || !keeps {
		return l, nil
	}
	rp, err := recordsPath(filepath.Dir(file), ref.Path)
	if err != nil {
		l.Notes = append(l.Notes, fmt.Sprintf("records %s not read (%v): showing the stored summary", ref.Path, err))
		return l, nil
	}
	rb, err := readRegular(rp)
	if errors.Is(err, errTooLarge) {
		return nil, err
	}
	if err != nil {
		l.Notes = append(l.Notes, fmt.Sprintf("records %s not readable (%v): showing the stored summary", ref.Path, err))
		return l, nil
	}
	lines, err := ReadRecordLines(bytes.NewReader(rb))
	if err != nil && h.Partial {
		// Killed before its header line was written: nothing to recompute.
		l.Notes = append(l.Notes, fmt.Sprintf("the run did not finish and its records %s hold nothing (%v): showing the provisional result", ref.Path, err))
		return l, nil
	}
	if err != nil {
		return nil, fmt.Errorf("%s: %w", rp, err)
	}
	// A killed run leaves a provisional result and perhaps a last line cut
	// short: each is said, and the summary is what the records that are
	// there give. Fewer records than the final result counts is not taken
	// for partial: a filtered file is a use, and its checksum is noted.
	partial := h.Partial
	switch {
	case h.Partial:
		l.Notes = append(l.Notes, fmt.Sprintf("the run did not finish (the result is the provisional one written at its start): summary recomputed from the %d records it wrote", len(lines.Records)))
	case ref.SHA256 != "" && sha(rb) != ref.SHA256:
		l.Notes = append(l.Notes, fmt.Sprintf("records %s changed since the run (checksum differs): summary recomputed from the file as it is", ref.Path))
		if manifest == nil { // else the manifest's check said it
			l.Altered = append(l.Altered, fmt.Sprintf("records %s changed since the run (its checksum differs from the result's)", ref.Path))
		}
	}
	if lines.Torn > 0 {
		partial = true
		l.Notes = append(l.Notes, fmt.Sprintf("records %s: the last line was cut mid-way (%d bytes, the run was killed while writing it): skipped", ref.Path, lines.Torn))
	}
	if err := rk.ReadRecords(bytes.NewReader(rb)); err != nil {
		return nil, fmt.Errorf("%s: %w", rp, err)
	}
	l.FromRecords = true
	if partial {
		l.Partial = true
		h.Partial = true
		h.Warn(fmt.Sprintf("partial: the run did not finish; the summary covers the %d records written before it stopped", len(lines.Records)))
	}
	return l, nil
}

// check compares the files a manifest lists with their checksums: the
// result (already read, as data) and the others in dir. A file with no
// checksum (a provisional manifest's growing records) is not checked; a
// listed file that is gone is.
func (m *Manifest) check(dir, resultName string, data []byte) []string {
	var altered []string
	for _, f := range m.Files {
		if f.SHA256 == "" {
			continue
		}
		var got string
		if f.Name == resultName {
			got = sha(data)
		} else {
			b, err := readRegular(filepath.Join(dir, f.Name))
			if err != nil {
				if errors.Is(err, fs.ErrNotExist) {
					altered = append(altered, fmt.Sprintf("%s %s listed in %s is gone", f.Role, f.Name, ManifestName))
				} else {
					altered = append(altered, fmt.Sprintf("%s %s listed in %s not readable: %v", f.Role, f.Name, ManifestName, err))
				}
				continue
			}
			got = sha(b)
		}
		if got != f.SHA256 {
			altered = append(altered, fmt.Sprintf("%s %s changed since the run (its checksum differs from %s's)", f.Role, f.Name, ManifestName))
		}
	}
	return altered
}

// recordsPath resolves a result's records path: relative to the result's
// directory (or, as --records FILE recorded it, to the working directory),
// then through symlinks, and refuses it unless it lands inside the
// result's directory.
func recordsPath(dir, ref string) (string, error) {
	rp := ref
	if !filepath.IsAbs(rp) {
		if _, err := os.Lstat(filepath.Join(dir, rp)); err == nil {
			rp = filepath.Join(dir, rp)
		}
	}
	realDir, err := filepath.EvalSymlinks(dir)
	if err != nil {
		return "", err
	}
	real, err := filepath.EvalSymlinks(rp)
	if err != nil {
		return "", err
	}
	if rel, err := filepath.Rel(realDir, real); err != nil || !filepath.IsLocal(rel) {
		return "", fmt.Errorf("outside the result's directory %s", dir)
	}
	return real, nil
}

// errTooLarge is userfile's, so Load can tell a file over the limit.
var errTooLarge = userfile.ErrTooLarge

// readRegular reads a regular file of at most MaxLoadBytes (the one
// reader every user-named input goes through).
func readRegular(path string) ([]byte, error) {
	return userfile.ReadFile(path, MaxLoadBytes)
}
