package ctl

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sync"
	"sync/atomic"

	"golang.org/x/sys/unix"
)

// SeparateStdout keeps the process's standard output for the result (or
// a control channel) and points file descriptor 1 at standard error. UCX
// and other C libraries print to fd 1 (UCX_PROTO_INFO tables, WARN lines
// when a worker is destroyed with operations pending), which would corrupt
// a JSON result or the channel. Every call returns the same file, so the
// CLI can separate at start-up and a serve command still gets the real
// stdout.
func SeparateStdout() (*os.File, error) {
	separated.once.Do(func() {
		fd, err := unix.FcntlInt(1, unix.F_DUPFD_CLOEXEC, 3)
		if err != nil {
			separated.err = fmt.Errorf("keep stdout: %w", err)
			return
		}
		if err := unix.Dup3(2, 1, 0); err != nil {
			unix.Close(fd)
			separated.err = fmt.Errorf("stdout to stderr: %w", err)
			return
		}
		separated.f = os.NewFile(uintptr(fd), "stdout")
		separated.done.Store(true)
	})
	return separated.f, separated.err
}

var separated struct {
	once sync.Once
	f    *os.File
	err  error
	done atomic.Bool // fd 1 points at stderr (RedirectOutput asks without separating)
}

// ServeStdio serves role on standard input and output, the channel a
// parent's Start gives its child, with fd 1 moved out of UCX's way first.
func ServeStdio(ctx context.Context, role Role) error {
	out, err := SeparateStdout()
	if err != nil {
		return err
	}
	return Serve(ctx, os.Stdin, out, role)
}

// RedirectOutput points file descriptor 2, and fd 1 once SeparateStdout
// has pointed it at stderr, at f until restore is called, which points
// them back where they were. It is for what writes to those descriptors
// directly, not through os.Stderr: C libraries (UCX's WARN lines) and the
// Go runtime; a view drawn on the terminal stays readable while their
// lines go to f. f must stay open until restore; restore may be called
// more than once.
func RedirectOutput(f *os.File) (restore func() error, err error) {
	fds := []int{2}
	if separated.done.Load() {
		fds = append(fds, 1)
	}
	return redirectFDs(int(f.Fd()), fds)
}

// redirectFDs dup2s to onto each of fds, keeping a close-on-exec copy of
// each to put back.
func redirectFDs(to int, fds []int) (func() error, error) {
	var saved []int
	undo := func() error {
		var errs []error
		for i, s := range saved {
			if err := unix.Dup3(s, fds[i], 0); err != nil {
				errs = append(errs, fmt.Errorf("restore fd %d: %w", fds[i], err))
			}
			unix.Close(s)
		}
		return errors.Join(errs...)
	}
	for _, fd := range fds {
		s, err := unix.FcntlInt(uintptr(fd), unix.F_DUPFD_CLOEXEC, 3)
		if err != nil {
			undo()
			return nil, fmt.Errorf("keep fd %d: %w", fd, err)
		}
		saved = append(saved, s)
		if err := unix.Dup3(to, fd, 0); err != nil {
			undo()
			return nil, fmt.Errorf("fd %d to the log: %w", fd, err)
		}
	}
	return sync.OnceValue(undo), nil
}
