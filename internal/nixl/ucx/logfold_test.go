package ucx

import (
	"bytes"
	"io"
	"os"
	"strings"
	"syscall"
	"testing"
)

// captureOutput runs f with file descriptors 1 and 2 sent to a pipe (UCX's
// own handler writes to fd 1 unless UCX_LOG_FILE says otherwise; the CLI
// points fd 1 at stderr), and returns what was written.
func captureOutput(t *testing.T, f func()) string {
	t.Helper()
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	var saved [2]int
	for i, fd := range []int{1, 2} {
		if saved[i], err = syscall.Dup(fd); err != nil {
			t.Fatal(err)
		}
		if err := syscall.Dup3(int(w.Fd()), fd, 0); err != nil {
			t.Fatal(err)
		}
	}
	f()
	for i, fd := range []int{1, 2} {
		if err := syscall.Dup3(saved[i], fd, 0); err != nil {
			t.Fatal(err)
		}
		syscall.Close(saved[i])
	}
	w.Close()
	var buf bytes.Buffer
	_, _ = io.Copy(&buf, r)
	r.Close()
	return buf.String()
}

func foldedTestEntry() (FoldedLog, bool) {
	for _, f := range FoldedLogs() {
		if strings.Contains(f.Example, "nixlctl logfold test object") {
			return f, true
		}
	}
	return FoldedLog{}, false
}

// A warning UCX logs from one call site again and again prints LogRepeats
// times and is counted after that; another call site's warning prints.
func TestLogFoldCountsRepeats(t *testing.T) {
	if ok, why := Available(); !ok {
		t.Skip(why)
	}
	before, _ := foldedTestEntry()
	const n = 10
	out := captureOutput(t, func() { logFoldProbe(n) })
	printed := strings.Count(out, "nixlctl logfold test object")
	if want := max(0, LogRepeats-before.Count); printed != want {
		t.Errorf("the repeated warning printed %d times, want %d (LogRepeats %d, %d logged before):\n%s", printed, want, LogRepeats, before.Count, out)
	}
	if !strings.Contains(out, "a different warning") && before.Count == 0 {
		t.Errorf("another call site's warning was folded with the first:\n%s", out)
	}
	after, ok := foldedTestEntry()
	if !ok {
		t.Fatalf("FoldedLogs has no entry for the repeated warning: %+v", FoldedLogs())
	}
	if got := after.Count - before.Count; got != n {
		t.Errorf("counted %d more, want %d", got, n)
	}
	if after.Level != "WARN" || !strings.HasPrefix(after.Where, "logfold.c:") || !strings.Contains(after.Example, "0x1000") {
		t.Errorf("entry = %+v: want level WARN, where logfold.c:N and the first message (0x1000)", after)
	}
	if after.Hidden() != after.Count-LogRepeats {
		t.Errorf("Hidden() = %d for count %d", after.Hidden(), after.Count)
	}
}
