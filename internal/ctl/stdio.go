package ctl

import (
	"context"
	"fmt"
	"os"

	"golang.org/x/sys/unix"
)

// SeparateStdout keeps the process's standard output for a control
// channel and points file descriptor 1 at standard error. UCX prints to
// fd 1 (UCX_PROTO_INFO tables, some warnings), which would corrupt the
// channel. Call it before anything loads UCX; use the returned file for
// replies.
func SeparateStdout() (*os.File, error) {
	fd, err := unix.FcntlInt(1, unix.F_DUPFD_CLOEXEC, 3)
	if err != nil {
		return nil, fmt.Errorf("keep stdout: %w", err)
	}
	if err := unix.Dup3(2, 1, 0); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("stdout to stderr: %w", err)
	}
	return os.NewFile(uintptr(fd), "control"), nil
}

// ServeStdio serves role on standard input and output, the channel a
// parent's Start gives its child, with fd 1 moved out of UCX's way first.
func ServeStdio(ctx context.Context, role Role) error {
	out, err := SeparateStdout()
	if err != nil {
		return err
	}
	defer out.Close()
	return Serve(ctx, os.Stdin, out, role)
}
