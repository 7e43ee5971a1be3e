package ctl

import (
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"
)

// Not parallel: it points this test process's own fd 2 at a file for a
// moment.
func TestRedirectOutput(t *testing.T) {
	path := filepath.Join(t.TempDir(), "log")
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var before unix.Stat_t
	if err := unix.Fstat(2, &before); err != nil {
		t.Fatal(err)
	}
	restore, err := RedirectOutput(f)
	if err != nil {
		t.Fatal(err)
	}
	// As a C library writes: straight to the descriptor.
	_, werr := unix.Write(2, []byte("from fd 2\n"))
	rerr := restore()
	if werr != nil || rerr != nil {
		t.Fatalf("write %v, restore %v", werr, rerr)
	}
	if err := restore(); err != nil {
		t.Errorf("second restore: %v", err)
	}
	got, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if string(got) != "from fd 2\n" {
		t.Errorf("log file holds %q, want the line written to fd 2", got)
	}
	var after unix.Stat_t
	if err := unix.Fstat(2, &after); err != nil {
		t.Fatal(err)
	}
	if after.Dev != before.Dev || after.Ino != before.Ino {
		t.Errorf("fd 2 is not back where it was: dev/ino %d/%d, was %d/%d", after.Dev, after.Ino, before.Dev, before.Ino)
	}
}
