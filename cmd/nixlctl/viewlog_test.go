package main

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/nixlctl/nixlctl/internal/live"
	"github.com/nixlctl/nixlctl/internal/report"
)

// With the live view up, a child's stderr, the CLI's own log lines and
// what a C library writes to fd 2 go to the view's log file, not to the
// terminal's stderr, which gets one line naming the file afterwards.
// Not parallel: it points this test process's fd 2 at the file for a
// moment.
func TestLiveViewLog(t *testing.T) {
	tmp := t.TempDir()
	t.Setenv("TMPDIR", tmp)
	// Terminals faked: the view draws into a buffer and waits for keys
	// on a pipe nobody writes.
	keys, keysW := io.Pipe()
	defer keysW.Close()
	var out, errOut bytes.Buffer
	ios := &ioStreams{In: keys, Out: &out, ErrOut: &errOut, StdinTTY: true, StdoutTTY: true, StderrTTY: true}
	a := &app{io: ios, stderr: &switchWriter{w: &errOut}, command: "nixlctl test view", interrupt: func() {}}
	a.log = slog.New(slog.NewTextHandler(a.stderr, nil))
	mo := measureOptions{TUI: "on"}

	_, err := a.measure(context.Background(), mo, func(ctx context.Context, _ live.Sink) (report.Result, error) {
		// The view starts at once (--tui on); wait until its log is in place.
		deadline := time.Now().Add(10 * time.Second)
		for {
			if m, _ := filepath.Glob(filepath.Join(tmp, "nixlctl-test-view-*.log")); len(m) > 0 {
				break
			}
			if time.Now().After(deadline) {
				t.Error("the view's log file never appeared")
				return nil, nil
			}
			time.Sleep(10 * time.Millisecond)
		}
		child := exec.CommandContext(ctx, "sh", "-c", "echo child-line >&2")
		child.Stderr = a.childStderr(mo)
		if err := child.Run(); err != nil {
			t.Errorf("child: %v", err)
		}
		a.log.Warn("driver-line")
		if _, err := unix.Write(2, []byte("fd2-line\n")); err != nil {
			t.Errorf("write fd 2: %v", err)
		}
		return nil, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`are in (\S+)\n`).FindStringSubmatch(errOut.String())
	if m == nil {
		t.Fatalf("stderr names no log file: %q", errOut.String())
	}
	logged, err := os.ReadFile(m[1])
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range []string{"child-line", "driver-line", "fd2-line"} {
		if !strings.Contains(string(logged), line) {
			t.Errorf("log file lacks %q: %q", line, logged)
		}
		if strings.Contains(errOut.String(), line) {
			t.Errorf("stderr got %q, which belongs in the log: %q", line, errOut.String())
		}
	}
	// Stderr is back: the logger writes to it again.
	a.log.Warn("after-line")
	if !strings.Contains(errOut.String(), "after-line") {
		t.Errorf("the logger did not come back to stderr: %q", errOut.String())
	}
}

// Without the view nothing moves: the children inherit stderr as before.
func TestNoViewNoLog(t *testing.T) {
	var errOut bytes.Buffer
	a := &app{io: &ioStreams{ErrOut: &errOut, StderrTTY: true}, stderr: &switchWriter{w: &errOut}}
	for _, mo := range []measureOptions{{TUI: "off"}, {TUI: "on"}} {
		if w := a.childStderr(mo); w != io.Writer(&errOut) {
			t.Errorf("--tui %s without terminals: children get %T, want stderr itself", mo.TUI, w)
		}
	}
}
