// Package userfile opens the files a user names (a config file, a model's
// config.json, a topology, a trace, a saved result, an output target) in
// one way for every command: regular files only, and never more than a
// limit read into memory. A plain open of a FIFO blocks until a writer
// appears (Ctrl-C does not reach a goroutine stuck in open), and
// /dev/zero or a huge file named by mistake is read until memory runs
// out; both must be a clear error instead.
package userfile

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"syscall"
)

// Limits for the kinds of input. Options and descriptions are small
// (a config file, a model's config.json, compatibility factors, a
// topology); traces and saved results hold a line per request.
const (
	MaxSmall int64 = 16 << 20
	MaxLarge int64 = 1 << 30
)

// ErrTooLarge is the error for a file over its limit.
var ErrTooLarge = errors.New("larger than the limit")

// ErrNotRegular is the error for a FIFO, a device, a socket or a
// directory where a file's contents were wanted.
var ErrNotRegular = errors.New("not a regular file")

// Open opens path for reading, refusing anything but a regular file of
// at most limit bytes; the reader fails with ErrTooLarge past limit
// should the file grow while it is read. It opens without blocking, so a
// FIFO is refused rather than waited on, and checks the opened file, not
// the name, so the answer cannot change in between.
func Open(path string, limit int64) (io.ReadCloser, error) {
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NONBLOCK, 0)
	if err != nil {
		return nil, err
	}
	st, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, err
	}
	if !st.Mode().IsRegular() {
		f.Close()
		return nil, fmt.Errorf("%s is %w", path, ErrNotRegular)
	}
	if st.Size() > limit {
		f.Close()
		return nil, tooLarge(path, limit)
	}
	return &limited{f: f, r: io.LimitReader(f, limit+1), left: limit + 1, path: path, limit: limit}, nil
}

// ReadFile reads a regular file of at most limit bytes (see Open).
func ReadFile(path string, limit int64) ([]byte, error) {
	r, err := Open(path, limit)
	if err != nil {
		return nil, err
	}
	defer r.Close()
	return io.ReadAll(r)
}

type limited struct {
	f     *os.File
	r     io.Reader
	left  int64
	path  string
	limit int64
}

func (l *limited) Read(p []byte) (int, error) {
	n, err := l.r.Read(p)
	l.left -= int64(n)
	if l.left <= 0 {
		return n, tooLarge(l.path, l.limit)
	}
	return n, err
}

func (l *limited) Close() error { return l.f.Close() }

func tooLarge(path string, limit int64) error {
	return fmt.Errorf("%s: %w of %d bytes", path, ErrTooLarge, limit)
}

// CheckOutput accepts an output path that does not exist yet or is a
// regular file (which writing replaces): writing to a FIFO blocks until
// a reader appears, and writing to a device or a socket is never what a
// --plot or --records path meant.
func CheckOutput(path string) error {
	st, err := os.Stat(path)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return nil
	case err != nil:
		return err
	case !st.Mode().IsRegular():
		return fmt.Errorf("%s exists and is %w", path, ErrNotRegular)
	}
	return nil
}

// Create creates or truncates a regular file for writing, refusing
// anything else that exists under the name (see CheckOutput), again by
// the opened file so the check cannot race the open.
func Create(path string) (*os.File, error) {
	if err := CheckOutput(path); err != nil {
		return nil, err
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|syscall.O_NONBLOCK, 0o644)
	if err != nil {
		return nil, err
	}
	st, err := f.Stat()
	if err == nil && !st.Mode().IsRegular() {
		err = fmt.Errorf("%s exists and is %w", path, ErrNotRegular)
	}
	if err == nil {
		err = f.Truncate(0)
	}
	if err != nil {
		f.Close()
		return nil, err
	}
	return f, nil
}

// WriteFile writes data to path through Create.
func WriteFile(path string, data []byte) error {
	f, err := Create(path)
	if err != nil {
		return err
	}
	_, err = f.Write(data)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}
