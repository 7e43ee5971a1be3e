package report

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"hash"
	"io"
	"os"
	"path/filepath"
	"sync"

	"github.com/nixlctl/nixlctl/internal/userfile"
)

// RecordsSink takes a run's records as the run produces them, so that a
// driver killed half-way leaves on disk what it had measured. A runner
// that streams calls Begin once, before its timed phase, then Record once
// per request whose record is final.
//
// The stream has no trailer: a file written before streaming, or by a
// nixlctl that predates it, reads the same, and an older reader counts no
// extra record. Whether a run ended normally is said by its result (the
// final result.json links the records with their count and checksum; the
// provisional one written at the start is marked Partial).
type RecordsSink interface {
	// Begin is given the result as far as it is known before the timed
	// phase (command, start, configuration) and the records' header line.
	Begin(r Result, header any) error
	// Record appends one final record.
	Record(rec any) error
}

// RecordsWriter writes a records file (or the same lines to several)
// line by line: each line is one write of its own, with no buffer in
// between, so a kill loses at most the line being written. It is safe for
// concurrent use.
type RecordsWriter struct {
	mu    sync.Mutex
	files []*os.File
	sum   hash.Hash
	count int // records, header not counted
	bytes int
	err   error
}

// CreateRecords creates (truncating) the files at paths; the same file
// named twice is written once.
func CreateRecords(paths ...string) (*RecordsWriter, error) {
	w := &RecordsWriter{sum: sha256.New()}
	seen := map[string]bool{}
	for _, p := range paths {
		abs, err := filepath.Abs(p)
		if err != nil {
			abs = filepath.Clean(p)
		}
		if seen[abs] {
			continue
		}
		seen[abs] = true
		f, err := userfile.Create(p)
		if err != nil {
			_ = w.Close()
			return nil, err
		}
		w.files = append(w.files, f)
	}
	return w, nil
}

// Header writes the header line; call it first.
func (w *RecordsWriter) Header(h any) error { return w.line(h, false) }

// Append writes one record line.
func (w *RecordsWriter) Append(rec any) error { return w.line(rec, true) }

func (w *RecordsWriter) line(v any, record bool) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	b = append(b, '\n')
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.err != nil {
		return w.err
	}
	for _, f := range w.files {
		if _, err := f.Write(b); err != nil {
			w.err = fmt.Errorf("%s: %w", f.Name(), err)
			return w.err
		}
	}
	w.sum.Write(b)
	w.bytes += len(b)
	if record {
		w.count++
	}
	return nil
}

// Written is what has been written so far: records, bytes, and the
// SHA-256 of those bytes (what a RecordsRef and a manifest hold).
func (w *RecordsWriter) Written() (count, bytes int, sha string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.count, w.bytes, hex.EncodeToString(w.sum.Sum(nil))
}

// Close closes the files and returns the first error of writing or
// closing. Further writes fail.
func (w *RecordsWriter) Close() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	err := w.err
	for _, f := range w.files {
		if cerr := f.Close(); err == nil && cerr != nil {
			err = cerr
		}
	}
	w.files = nil
	if w.err == nil {
		w.err = errors.New("records file closed")
	}
	return err
}

// RecordLines is a records file split into its lines.
type RecordLines struct {
	Header  []byte
	Records [][]byte // one JSON value each; blank lines dropped
	// Torn is the length of a last line cut mid-way (a kill during its
	// write): no newline and not valid JSON. It is left out of Records.
	Torn int
}

// maxRecordLine bounds one line of a records file.
const maxRecordLine = 16 << 20

// ReadRecordLines splits a records file: the header line (which must be a
// RecordsSchema header), then one record per line. Only the last line may
// be torn; a bad line anywhere else is an error, since that is not what a
// kill leaves behind.
func ReadRecordLines(r io.Reader) (*RecordLines, error) {
	br := bufio.NewReaderSize(r, 64<<10)
	var out RecordLines
	for n := 1; ; n++ {
		line, err := readLine(br)
		if err != nil && !errors.Is(err, io.EOF) {
			return nil, err
		}
		if len(line) == 0 && errors.Is(err, io.EOF) {
			break
		}
		complete := bytes.HasSuffix(line, []byte("\n"))
		body := bytes.TrimSpace(line)
		switch {
		case n == 1:
			var h struct {
				Schema string `json:"schema"`
			}
			if !complete && !json.Valid(body) {
				return nil, fmt.Errorf("records: the header line is cut short (the run was killed before it was written)")
			}
			if json.Unmarshal(body, &h) != nil || h.Schema != RecordsSchema {
				return nil, fmt.Errorf("records: the first line is not a %s header", RecordsSchema)
			}
			out.Header = body
		case len(body) == 0:
		case !json.Valid(body):
			if !complete {
				out.Torn = len(line)
				return &out, nil
			}
			return nil, fmt.Errorf("records line %d: not valid JSON", n)
		default:
			out.Records = append(out.Records, body)
		}
		if errors.Is(err, io.EOF) {
			break
		}
	}
	if out.Header == nil {
		return nil, fmt.Errorf("records: empty file")
	}
	return &out, nil
}

// readLine reads one line with its newline (none at the end of the file),
// at most maxRecordLine bytes.
func readLine(br *bufio.Reader) ([]byte, error) {
	var line []byte
	for {
		frag, err := br.ReadSlice('\n')
		line = append(line, frag...)
		if len(line) > maxRecordLine {
			return nil, fmt.Errorf("records: a line longer than %d bytes", maxRecordLine)
		}
		if !errors.Is(err, bufio.ErrBufferFull) {
			return line, err
		}
	}
}
