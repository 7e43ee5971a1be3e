package userfile

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// Each case must come back at once: a FIFO without a writer, /dev/zero
// and a file over the limit are refused, not waited on or read whole.
func TestReadFile(t *testing.T) {
	dir := t.TempDir()
	small := filepath.Join(dir, "small.yaml")
	if err := os.WriteFile(small, []byte("a: 1\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	fifo := filepath.Join(dir, "fifo")
	if err := syscall.Mkfifo(fifo, 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name, path string
		limit      int64
		want       error // nil: reads "a: 1\n"
		msg        string
	}{
		{"regular", small, 100, nil, ""},
		{"exactly the limit", small, 5, nil, ""},
		{"over the limit", small, 4, ErrTooLarge, "larger than the limit of 4 bytes"},
		{"fifo", fifo, 100, ErrNotRegular, fifo + " is not a regular file"},
		{"dev zero", "/dev/zero", 100, ErrNotRegular, "/dev/zero is not a regular file"},
		{"directory", dir, 100, ErrNotRegular, "is not a regular file"},
		{"missing", filepath.Join(dir, "none"), 100, os.ErrNotExist, "no such file"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			done := make(chan struct{})
			var data []byte
			var err error
			go func() { data, err = ReadFile(tc.path, tc.limit); close(done) }()
			select {
			case <-done:
			case <-time.After(5 * time.Second):
				t.Fatalf("ReadFile(%s) still running after 5s", tc.path)
			}
			if tc.want == nil {
				if err != nil || string(data) != "a: 1\n" {
					t.Fatalf("ReadFile = %q, %v", data, err)
				}
				return
			}
			if !errors.Is(err, tc.want) || !strings.Contains(err.Error(), tc.msg) {
				t.Fatalf("ReadFile error = %v, want %v containing %q", err, tc.want, tc.msg)
			}
		})
	}
}

// A file that grows past the limit after the open is cut off by the
// reader, not read whole.
func TestOpenGrows(t *testing.T) {
	path := filepath.Join(t.TempDir(), "grows")
	if err := os.WriteFile(path, []byte("abc"), 0o644); err != nil {
		t.Fatal(err)
	}
	r, err := Open(path, 4)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	if err := os.WriteFile(path, []byte("abcdefgh"), 0o644); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 100)
	var n int
	for err == nil {
		var k int
		k, err = r.Read(buf[n:])
		n += k
	}
	if !errors.Is(err, ErrTooLarge) || n > 5 {
		t.Fatalf("read %d bytes, err %v; want at most 5 and ErrTooLarge", n, err)
	}
}

func TestCreate(t *testing.T) {
	dir := t.TempDir()
	fifo := filepath.Join(dir, "fifo")
	if err := syscall.Mkfifo(fifo, 0o644); err != nil {
		t.Fatal(err)
	}
	old := filepath.Join(dir, "old.png")
	if err := os.WriteFile(old, []byte("previous, longer contents"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name, path string
		want       error
	}{
		{"new", filepath.Join(dir, "new.png"), nil},
		{"replaces a regular file", old, nil},
		{"fifo", fifo, ErrNotRegular},
		{"dev null", "/dev/null", ErrNotRegular},
		{"directory", dir, ErrNotRegular},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if err := CheckOutput(tc.path); !errors.Is(err, tc.want) {
				t.Fatalf("CheckOutput = %v, want %v", err, tc.want)
			}
			done := make(chan error, 1)
			go func() { done <- WriteFile(tc.path, []byte("x")) }()
			var err error
			select {
			case err = <-done:
			case <-time.After(5 * time.Second):
				t.Fatalf("WriteFile(%s) still running after 5s", tc.path)
			}
			if !errors.Is(err, tc.want) {
				t.Fatalf("WriteFile = %v, want %v", err, tc.want)
			}
			if tc.want == nil {
				if b, err := os.ReadFile(tc.path); err != nil || string(b) != "x" {
					t.Fatalf("file holds %q, %v; want x", b, err)
				}
			}
		})
	}
}
