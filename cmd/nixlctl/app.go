package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"runtime/pprof"
	"slices"
	"strings"
	"syscall"

	"golang.org/x/term"

	"github.com/nixlctl/nixlctl/internal/ctl"
	"github.com/nixlctl/nixlctl/internal/errkind"
	"github.com/nixlctl/nixlctl/internal/nixl/ucx"
	"github.com/nixlctl/nixlctl/internal/report"
)

// Exit codes. Scripts and CI gates rely on them.
const (
	exitOK          = 0   // success
	exitFailure     = 1   // the run failed, or its results failed a check
	exitUsage       = 2   // bad flags, config file or input
	exitInterrupted = 130 // stopped by Ctrl-C (results so far were printed)
	exitTerminated  = 143 // stopped by SIGTERM (128 + 15, as a shell reports it)
)

// version is set at build time with -ldflags "-X main.version=...".
var version = "dev"

// ioStreams is where a command reads and writes; tests swap in buffers.
type ioStreams struct {
	In        io.Reader
	Out       io.Writer
	ErrOut    io.Writer
	StdinTTY  bool
	StdoutTTY bool
	StderrTTY bool
}

// systemStreams moves fd 1 out of the way first (ctl.SeparateStdout):
// nothing but the result may reach stdout, and UCX prints its warnings
// there.
func systemStreams() *ioStreams {
	out, err := ctl.SeparateStdout()
	if err != nil {
		out = os.Stdout
	}
	return &ioStreams{In: os.Stdin, Out: out, ErrOut: os.Stderr, StdinTTY: term.IsTerminal(int(os.Stdin.Fd())),
		StdoutTTY: term.IsTerminal(int(out.Fd())), StderrTTY: term.IsTerminal(int(os.Stderr.Fd()))}
}

// app carries what every command needs once the global flags are resolved.
type app struct {
	io     *ioStreams
	format report.Format
	log    *slog.Logger
	// stderr is io.ErrOut as the logger and the children write to it, so
	// the live view can move their lines to a file (viewLog).
	stderr  *switchWriter
	args    []string // the command line after "nixlctl", recorded in results
	command string   // the running command's path ("nixlctl lease-chaos"), names the view's log
	// interrupt stops the running command as the first Ctrl-C does (the
	// TUI calls it: in raw mode Ctrl-C is a key press, not a signal).
	interrupt func()
}

// Main runs nixlctl with os.Args and returns the exit code.
func Main() int {
	defer startCPUProfile()()
	ctx, stop := interruptContext()
	defer stop()
	code := run(ctx, systemStreams(), os.Args[1:])
	reportFoldedUCX(os.Stderr)
	return code
}

// reportFoldedUCX says, once the command's agents are closed, how many
// lines of each repeated UCX warning or error were not printed (UCX itself
// prints the first ucx.LogRepeats): a serve whose peer died mid-transfer
// logged one "not returned to mpool" line per request its worker held.
func reportFoldedUCX(w io.Writer) {
	for _, f := range ucx.FoldedLogs() {
		fmt.Fprintf(w, "nixlctl: UCX logged %d more %s lines like %q (%s; %d in all, not shown)\n", f.Hidden(), f.Level, f.Example, f.Where, f.Count)
	}
}

// startCPUProfile writes a CPU profile of this process to
// $NIXLCTL_CPUPROFILE.<pid> when that variable is set. Endpoint children
// inherit it, so one run profiles the driver and every endpoint (each
// its own file) — where a handoff's time goes is split across them.
func startCPUProfile() (stop func()) {
	base := os.Getenv("NIXLCTL_CPUPROFILE")
	if base == "" {
		return func() {}
	}
	f, err := os.Create(fmt.Sprintf("%s.%d", base, os.Getpid()))
	if err != nil {
		fmt.Fprintf(os.Stderr, "NIXLCTL_CPUPROFILE: %v\n", err)
		return func() {}
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		fmt.Fprintf(os.Stderr, "NIXLCTL_CPUPROFILE: %v\n", err)
		f.Close()
		return func() {}
	}
	return func() {
		pprof.StopCPUProfile()
		f.Close()
	}
}

// interruptContext cancels on the first SIGINT/SIGTERM so that commands can
// stop and still print what they measured; a second signal exits at once.
func interruptContext() (context.Context, func()) {
	ctx, cancel := context.WithCancelCause(context.Background())
	sigs := make(chan os.Signal, 2)
	signal.Notify(sigs, os.Interrupt, syscall.SIGTERM)
	done := make(chan struct{})
	go func() {
		select {
		case s := <-sigs:
			cancel(errInterrupted{s})
		case <-done:
			return
		}
		select {
		case <-sigs:
			fmt.Fprintln(os.Stderr, "nixlctl: interrupted twice, exiting")
			os.Exit(exitInterrupted)
		case <-done:
		}
	}()
	return ctx, func() { signal.Stop(sigs); close(done); cancel(nil) }
}

type errInterrupted struct{ sig os.Signal }

func (e errInterrupted) Error() string { return "interrupted by " + e.sig.String() }

func run(ctx context.Context, ios *ioStreams, args []string) int {
	stderr := &switchWriter{w: ios.ErrOut}
	a := &app{io: ios, format: report.FormatJSON, log: slog.New(slog.NewTextHandler(stderr, nil)), stderr: stderr, args: args,
		interrupt: func() { _ = syscall.Kill(os.Getpid(), syscall.SIGINT) }}
	root := newRootCmd(a)
	root.SetArgs(joinOptionalValues(args))
	root.SetIn(ios.In)
	root.SetOut(ios.Out)
	root.SetErr(ios.ErrOut)
	cmd, err := root.ExecuteContextC(ctx)
	return exitCode(ctx, ios.ErrOut, cmd, err)
}

// exitCode is the one place errors become exit codes and messages.
func exitCode(ctx context.Context, errOut io.Writer, cmd interface{ CommandPath() string }, err error) int {
	if err == nil {
		return exitOK
	}
	var intr errInterrupted
	if errors.As(context.Cause(ctx), &intr) && (errors.Is(err, context.Canceled) || errors.As(err, &intr)) {
		fmt.Fprintf(errOut, "nixlctl: %v\n", context.Cause(ctx))
		if intr.sig == syscall.SIGTERM {
			return exitTerminated
		}
		return exitInterrupted
	}
	switch {
	case errkind.IsBadInput(err) || isCobraUsageError(err):
		fmt.Fprintf(errOut, "error: %v\n", oneLine(err))
		if cmd != nil {
			fmt.Fprintf(errOut, "Run '%s --help' for usage.\n", cmd.CommandPath())
		}
		return exitUsage
	case errkind.IsCheckFailed(err):
		fmt.Fprintf(errOut, "FAIL: %v\n", err)
		return exitFailure
	}
	fmt.Fprintf(errOut, "error: %v\n", err)
	return exitFailure
}

// oneLine joins a multi-error (errors.Join) onto one line.
func oneLine(err error) string {
	return strings.ReplaceAll(err.Error(), "\n", "; ")
}

func isCobraUsageError(err error) bool {
	msg := err.Error()
	for _, p := range []string{"unknown command", "unknown flag", "unknown shorthand flag", "required flag", "accepts ", "requires at least", "invalid argument"} {
		if strings.HasPrefix(msg, p) {
			return true
		}
	}
	return false
}

// optionalValues are the values of flags that may also stand alone
// (pflag's NoOptDefVal: --tui alone means on). pflag takes such a flag's
// value only as --tui=off, so `--tui off` left "off" as an argument and
// was refused; joinOptionalValues makes it --tui=off when the next
// argument is one of the flag's values.
var optionalValues = map[string][]string{"--tui": {"auto", "on", "off"}}

func joinOptionalValues(args []string) []string {
	out := make([]string, 0, len(args))
	for i := 0; i < len(args); i++ {
		if args[i] == "--" {
			return append(out, args[i:]...)
		}
		if vals, ok := optionalValues[args[i]]; ok && i+1 < len(args) && slices.Contains(vals, args[i+1]) {
			out = append(out, args[i]+"="+args[i+1])
			i++
			continue
		}
		out = append(out, args[i])
	}
	return out
}
