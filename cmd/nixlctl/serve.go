package main

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"strings"

	"github.com/spf13/cobra"

	"github.com/nixlctl/nixlctl/internal/ctl"
	"github.com/nixlctl/nixlctl/internal/ec"
	"github.com/nixlctl/nixlctl/internal/errkind"
	"github.com/nixlctl/nixlctl/internal/probe"
	"github.com/nixlctl/nixlctl/internal/xfertarget"
)

func newServeCmd(a *app) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "serve",
		Short: "Run one transfer endpoint by hand",
		Long: `Run a transfer endpoint as its own process. nixlctl's benchmarks start these
themselves as child processes on loopback; run them by hand to put the two sides
on different hosts or under a debugger.`,
	}
	cmd.AddCommand(newServeTargetCmd(a), newServeEngineCmd(a, "prefill"), newServeEngineCmd(a, "decode"), newServeEncoderCmd(a), newServeLeakPeerCmd(a))
	return cmd
}

func newServeTargetCmd(a *app) *cobra.Command {
	return withServeRole(a, xfertarget.Role, &cobra.Command{
		Use:   "target",
		Short: "Serve the passive side of `bench xfer`",
		Long: `Serve the target of "nixlctl bench xfer": an agent with a registered buffer that the
initiator READs from and WRITEs into, driven over a small control channel (JSON
lines: set-up, metadata exchange, tag fill and verify, notifications). The data
itself moves over the transfer backend, never over the control channel.

--stdio uses standard input and output as the control channel (how bench xfer
runs its child). --listen HOST:PORT accepts one initiator at a time over TCP;
point "bench xfer --target HOST:PORT" at it.`,
		Example: `  nixlctl serve target --listen 0.0.0.0:7300
  nixlctl bench xfer --target tcp://10.0.0.2:7300`,
	})
}

// serveRoleOptions are the flags of a command that serves a role
// (withServeRole).
type serveRoleOptions struct {
	Stdio  bool   `mapstructure:"stdio"`
	Listen string `mapstructure:"listen"`
}

// withServeRole makes cmd serve the role that newRole makes (with the
// logger the command runs with) on --stdio or --listen (serveRole).
func withServeRole(a *app, newRole func(*slog.Logger) ctl.Role, cmd *cobra.Command) *cobra.Command {
	cmd.Args = cobra.NoArgs
	cmd.RunE = bound(func(ctx context.Context, o serveRoleOptions) error {
		return serveRole(ctx, a, o.Stdio, o.Listen, newRole(a.log))
	})
	cmd.Flags().Bool("stdio", false, "control channel on stdin/stdout")
	cmd.Flags().String("listen", "", "control channel on this TCP address (host:port)")
	return cmd
}

// serveRole serves role on standard input and output (--stdio, how the
// benchmarks run their children) or on a TCP address, one driver at a
// time (--listen).
func serveRole(ctx context.Context, a *app, stdio bool, listen string, role ctl.Role) error {
	switch {
	case stdio == (listen != ""):
		return errkind.BadInputf("use exactly one of --stdio and --listen")
	case stdio:
		return ctl.ServeStdio(ctx, role)
	}
	ln, err := net.Listen("tcp", strings.TrimPrefix(listen, "tcp://"))
	if err != nil {
		return errkind.BadInputf("--listen: %v", err)
	}
	fmt.Fprintf(a.io.ErrOut, "listening on %s\n", ln.Addr())
	return ctl.ServeListener(ctx, ln, role, a.log)
}

func newServeEncoderCmd(a *app) *cobra.Command {
	return withServeRole(a, ec.EncoderRole, &cobra.Command{
		Use:   "encoder",
		Short: "Serve an encoder-cache producer (the E of EPD) for `bench ec`",
		Long: `Serve the producer of "nixlctl bench ec": an agent with a /dev/shm region of
embedding blocks, a ZMQ ROUTER answering vLLM's XferReq/XferAck encoder-cache
protocol, and a control channel (JSON lines: set-up, encode an image, counters)
through which the benchmark plays the orchestrator that sends images to the
encode node. Consumers fetch over the side channel and the transfer backend,
never over the control channel.

--stdio uses standard input and output as the control channel (how bench ec
runs its child). --listen HOST:PORT accepts one benchmark at a time over TCP;
point "bench ec --producer HOST:PORT" at it. The region file is unlinked on
exit; one left by a killed encoder is removed by the next nixlctl that
creates a region.`,
		Example: `  nixlctl serve encoder --listen 0.0.0.0:7301
  nixlctl bench ec --producer tcp://10.0.0.2:7301`,
	})
}

type serveLeakPeerOptions struct {
	Stdio bool `mapstructure:"stdio"`
}

// newServeLeakPeerCmd is the child that probe ucx-leak and probe env start
// for each side of their transfers; users have no reason to run it.
func newServeLeakPeerCmd(a *app) *cobra.Command {
	cmd := &cobra.Command{
		Use:    "leak-peer",
		Short:  "Serve one side of probe ucx-leak / probe env transfers (started by nixlctl itself)",
		Hidden: true,
		Args:   cobra.NoArgs,
		RunE: bound(func(ctx context.Context, o serveLeakPeerOptions) error {
			if !o.Stdio {
				return errkind.BadInputf("leak-peer needs --stdio")
			}
			return ctl.ServeStdio(ctx, probe.LeakPeerRole(a.log))
		}),
	}
	cmd.Flags().Bool("stdio", false, "control channel on stdin/stdout")
	return cmd
}
