package ctl

import (
	"context"
	"fmt"
	"os"
	"sync"

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
	})
	return separated.f, separated.err
}

var separated struct {
	once sync.Once
	f    *os.File
	err  error
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
