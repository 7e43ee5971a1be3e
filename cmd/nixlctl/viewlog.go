package main

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"

	"github.com/nixlctl/nixlctl/internal/ctl"
)

// switchWriter is stderr as the CLI's logger and the children see it:
// while the live view is up it points at the view's log file instead.
// The children write through it (a pipe exec copies from, not the
// terminal itself), so that those started before the view came up are
// moved too.
type switchWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (s *switchWriter) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.w.Write(p)
}

// swap points s at w and returns where it pointed.
func (s *switchWriter) swap(w io.Writer) io.Writer {
	s.mu.Lock()
	defer s.mu.Unlock()
	old := s.w
	s.w = w
	return old
}

// canRedirect says whether the live view may come up for mo with a
// terminal on stderr, whose lines would be drawn over the view.
func (a *app) canRedirect(mo measureOptions) bool {
	return a.wantsTUI(mo) && a.io.StderrTTY
}

// childStderr is what a measuring command gives its children as stderr:
// the switchable writer when the view may come up, else stderr itself,
// which the children then inherit as before.
func (a *app) childStderr(mo measureOptions) io.Writer {
	if a.canRedirect(mo) {
		return a.stderr
	}
	return a.io.ErrOut
}

// viewLog is the file that takes everything bound for the terminal's
// stderr while the live view is up: this process's log lines, the
// children's stderr and whatever C libraries write to fds 1 and 2.
type viewLog struct {
	path       string
	f          *os.File
	prev       io.Writer
	restoreFDs func() error
	sw         *switchWriter
}

// viewLogPath is nixlctl-<command>-<pid>.log in the temporary directory.
func (a *app) viewLogPath() string {
	name := strings.Join(strings.Fields(strings.TrimPrefix(a.command, "nixlctl")), "-")
	if name == "" {
		name = "run"
	}
	return filepath.Join(os.TempDir(), fmt.Sprintf("nixlctl-%s-%d.log", name, os.Getpid()))
}

// startViewLog moves stderr to a fresh log file; nil (nothing moved) when
// the file cannot be made, in which case the lines reach the terminal as
// before and the view may be drawn over.
func (a *app) startViewLog() *viewLog {
	path := a.viewLogPath()
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_TRUNC|os.O_APPEND, 0o644)
	if err != nil {
		a.log.Warn("terminal view: cannot keep the log lines out of the view", "err", err)
		return nil
	}
	restore, err := ctl.RedirectOutput(f)
	if err != nil {
		f.Close()
		os.Remove(path)
		a.log.Warn("terminal view: cannot keep the log lines out of the view", "err", err)
		return nil
	}
	return &viewLog{path: path, f: f, prev: a.stderr.swap(f), restoreFDs: restore, sw: a.stderr}
}

// stop puts stderr back and returns the log's path, or "" when nothing
// was written to it (the file is removed then). Safe on nil.
func (v *viewLog) stop() string {
	if v == nil || v.f == nil {
		return ""
	}
	v.sw.swap(v.prev)
	rerr := v.restoreFDs()
	st, err := v.f.Stat()
	v.f.Close()
	v.f = nil
	if rerr != nil {
		fmt.Fprintf(v.prev, "nixlctl: %v\n", rerr)
	}
	if err == nil && st.Size() == 0 {
		os.Remove(v.path)
		return ""
	}
	return v.path
}
