// Package fleet starts and reaches the processes a run drives: a
// handoff's prefill and decode endpoints, bench xfer's target, bench ec's
// encoder. Each runs in one of three places: as a goroutine of this
// process, at an address where it was started with --listen, or as a
// child process whose stderr is passed through with UCX's repeated
// warnings counted. What a run does with them (their clocks, setup,
// deaths) stays with the run kind; how one is started is decided here,
// once, from a small Proc instead of a run kind's options.
package fleet

import (
	"context"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/nixlctl/nixlctl/internal/ctl"
)

// Proc says where one process of a run runs and how to start it.
type Proc struct {
	// Name is how errors and the child's summary lines call it
	// ("prefill-1", "target").
	Name string
	// InProcess, when set, serves the role in this process.
	InProcess ctl.Role
	// Addr is a process started elsewhere (serve ... --listen).
	Addr string
	// Exe and Args start a child: Args default to DefaultArgs; Exe to
	// this program.
	Exe         string
	Args        []string
	DefaultArgs []string
	// Env is added to this process's environment for the child.
	Env []string
	// Stderr receives the child's stderr; nil: this process's stderr.
	Stderr io.Writer
	// Outlive keeps an in-process or child process running after ctx ends,
	// until its Conn is closed: an interrupted run still asks it for its
	// stats, or lets its consumers finish first.
	Outlive bool
}

// Where a Proc runs.
const (
	InProcess = "inproc"
	Child     = "process"
)

// Conn is a started or reached process: its control channel and, for a
// child, its stderr as passed through.
type Conn struct {
	*ctl.Client
	// Where is InProcess, Child or the address dialled.
	Where  string
	stderr *warnFolder
}

// DialError is a process at an address that could not be reached: the
// caller says what it was (a stale registration, a wrong --target). Its
// text is the dial's.
type DialError struct {
	Name, Addr string
	Err        error
}

func (e *DialError) Error() string {
	return "connect to " + e.Name + " " + e.Addr + ": " + e.Err.Error()
}
func (e *DialError) Unwrap() error { return e.Err }

// Start starts or reaches p. Its errors name p: a DialError ("connect to
// NAME ADDR: ...") for an address that could not be reached, "start
// NAME: ..." for a child that could not be started.
func Start(ctx context.Context, p Proc) (*Conn, error) {
	keep := ctx
	if p.Outlive {
		keep = context.WithoutCancel(ctx)
	}
	switch {
	case p.InProcess != nil:
		return &Conn{Client: ctl.StartInProcess(keep, p.InProcess), Where: InProcess}, nil
	case p.Addr != "":
		c, err := ctl.Dial(ctx, p.Addr)
		if err != nil {
			return nil, &DialError{Name: p.Name, Addr: p.Addr, Err: err}
		}
		return &Conn{Client: c, Where: p.Addr}, nil
	}
	args := p.Args
	if args == nil {
		args = p.DefaultArgs
	}
	stderr := newWarnFolder(childStderr(p.Stderr), p.Name)
	c, err := ctl.Start(keep, ctl.Cmd{Exe: p.Exe, Args: args, Env: append(os.Environ(), p.Env...), Stderr: stderr})
	if err != nil {
		return nil, fmt.Errorf("start %s: %w", p.Name, err)
	}
	return &Conn{Client: c, Where: Child, stderr: stderr}, nil
}

// Close closes the control channel (a child has grace to exit before it
// is killed; result receives its closing answer when not nil), then,
// once the child exited and all it wrote was copied, says how many of its
// UCX warnings were counted and not shown. Closing twice is harmless.
func (c *Conn) Close(grace time.Duration, result any) error {
	if c == nil {
		return nil
	}
	err := c.Client.Close(grace, result)
	if c.stderr != nil {
		_ = c.stderr.Close()
	}
	return err
}

// childStderr is where a child process's stderr goes: w when the caller
// gave one (the CLI's live view sends it to a log file, also for children
// started before the view came up), else this process's stderr.
func childStderr(w io.Writer) io.Writer {
	if w == nil {
		return os.Stderr
	}
	return w
}
