package main

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/nixlctl/nixlctl/internal/ctl"
	"github.com/nixlctl/nixlctl/internal/engine"
	"github.com/nixlctl/nixlctl/internal/errkind"
	"github.com/nixlctl/nixlctl/internal/launcher"
	"github.com/nixlctl/nixlctl/internal/rendezvous"
	"github.com/nixlctl/nixlctl/internal/runcore"
)

// launcherJobID is the run id a rendezvous defaults to: $NIXLCTL_JOB_ID
// when set (it beats the launcher's id), else the launcher's job id.
func launcherJobID() string {
	if info, err := launcher.FromEnviron(launcher.Options{}); err == nil && info.JobID != "" {
		return info.JobID
	}
	return os.Getenv("NIXLCTL_JOB_ID")
}

// runRegisteredEngine is serve prefill|decode --register: announce the
// endpoint to a rendezvous driver, serve its one session (on --listen, or
// reverse on the registration's connection), and exit 0 when that session
// ends or the registration ends. Interrupted before its session, it exits
// 130 (SIGINT) or 143 (SIGTERM); a driver unreachable for
// --register-timeout is exit 1. Everything the flags and the environment
// can get wrong (address, port, rank and world size) is refused before
// any network I/O.
func runRegisteredEngine(ctx context.Context, a *app, role string, o serveEngineOptions, set explicitOptions) error {
	etcd := strings.HasPrefix(o.Register, rendezvous.EtcdScheme)
	switch {
	case o.Stdio:
		return errkind.BadInputf("--register goes with --listen (or neither, to serve over the registration), not --stdio")
	case etcd && o.Listen == "":
		return errkind.BadInputf("--register %s needs --listen: an etcd member must accept the driver's connection (serving over the registration is TCP only)", o.Register)
	}
	host, port, err := net.SplitHostPort(strings.TrimPrefix(strings.TrimPrefix(o.Register, rendezvous.EtcdScheme), "tcp://"))
	if err != nil {
		return errkind.BadInputf("--register %q: want the driver's [tcp://]HOST:PORT or etcd://HOST:PORT", o.Register)
	}
	// A port or host that can never be dialled was retried forever.
	if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 {
		return errkind.BadInputf("--register %q: port must be 1..65535", o.Register)
	}
	if !runcore.ValidHost(host) {
		return errkind.BadInputf("--register %q: %q is not a host name or an IP address", o.Register, host)
	}
	if err := checkAdvertise(o.Advertise); err != nil {
		return err
	}
	var listenHost string
	if o.Listen != "" {
		host, _, err := net.SplitHostPort(strings.TrimPrefix(o.Listen, "tcp://"))
		if err != nil {
			return errkind.BadInputf("--listen %q: want [tcp://]host:port", o.Listen)
		}
		listenHost = cmp.Or(host, "0.0.0.0") // ":7400" listens everywhere
	}
	info, err := launcher.FromEnviron(launcher.Options{})
	if err != nil {
		return errkind.BadInputf("%v (--rank and --world-size do not replace a malformed launcher variable: fix or unset it)", err)
	}
	if set("rank") {
		info.Rank = o.Rank
	}
	if set("world-size") {
		info.WorldSize = o.WorldSize
	}
	run := o.RunID
	if run == "" {
		run = launcherJobID()
	}
	if etcd && run == "" {
		return errkind.BadInputf("--run-id: etcd needs a run id to keep runs apart (none given, no launcher job id, no $NIXLCTL_JOB_ID)")
	}
	if info.Source == launcher.None && (!set("rank") || !set("world-size")) {
		// Without them every endpoint said rank 0 of 1 and waited on a
		// driver that could only refuse all but one.
		return errkind.BadInputf("--rank and --world-size: no launcher environment (Slurm, torchrun, MPI, an Indexed Job) gives them; give both")
	}
	// Checked with a stand-in control address: the real one needs the
	// listener.
	h, err := rendezvous.FromLauncher(info, run, role, rendezvous.Reverse)
	if err != nil {
		return errkind.BadInputf("rendezvous hello: %v", err)
	}
	ropt := rendezvous.Options{Log: a.log, RetryFor: o.RegisterTimeout}
	if o.Listen == "" {
		return serveReverse(ctx, a, o, h, ropt)
	}
	ln, err := net.Listen("tcp", strings.TrimPrefix(o.Listen, "tcp://"))
	if err != nil {
		return errkind.BadInputf("--listen: %v", err)
	}
	defer ln.Close()
	_, lnPort, _ := net.SplitHostPort(ln.Addr().String())
	h.Ctl = net.JoinHostPort(listenHost, lnPort)
	fmt.Fprintf(a.io.ErrOut, "listening on %s\n", ln.Addr())
	reg, err := rendezvous.Register(ctx, o.Register, h, ropt)
	if err != nil {
		if ctx.Err() != nil {
			return context.Cause(ctx) // interrupted before the driver was there: 130 or 143
		}
		return err
	}
	defer reg.Close()
	fmt.Fprintf(a.io.ErrOut, "registered %s rank %d of %d (run %q, host %s) with %s: the driver dials %s\n",
		h.Role, h.Rank, h.World, h.Run, h.Host, o.Register, reg.Addr())
	// One session: the run this registration is for. The registration
	// ending (the driver closed it, or the etcd lease was lost) stops the
	// waiting but lets a session in progress finish.
	stop := context.AfterFunc(ctx, func() { ln.Close() })
	defer stop()
	go func() {
		select {
		case <-reg.Done():
			ln.Close()
		case <-ctx.Done():
		}
	}()
	conn, err := ln.Accept()
	if err != nil {
		if ctx.Err() == nil && errors.Is(err, net.ErrClosed) {
			fmt.Fprintf(a.io.ErrOut, "registration ended before the driver connected\n")
			return nil
		}
		if ctx.Err() != nil {
			return context.Cause(ctx) // interrupted while waiting for the driver
		}
		return err
	}
	a.log.Info("driver connected", "from", conn.RemoteAddr())
	side := engine.SideChannelHost{Bind: listenHost, Advertise: o.Advertise}
	if side.Identity, err = o.identity(); err != nil {
		return err
	}
	err = ctl.ServeConn(ctx, conn, engine.EndpointRole(a.log, side))
	conn.Close()
	if ctx.Err() != nil {
		return nil
	}
	if err != nil {
		return fmt.Errorf("session with the driver: %w", err)
	}
	// A TCP driver ends the registrations right after the run: leaving
	// first would only make it log a departure. An etcd registration has
	// nobody to end it.
	if !etcd {
		select {
		case <-reg.Done():
		case <-ctx.Done():
		case <-time.After(leaveGrace):
		}
	}
	fmt.Fprintf(a.io.ErrOut, "session ended; leaving the rendezvous\n")
	return nil
}

// leaveGrace is how long an endpoint whose session ended waits for the
// driver to end its registration before it leaves by itself.
const leaveGrace = 5 * time.Second

// serveReverse registers with Ctl "reverse" and serves the control channel
// on the registration's connection.
func serveReverse(ctx context.Context, a *app, o serveEngineOptions, h rendezvous.Hello, ropt rendezvous.Options) error {
	reg, err := rendezvous.Register(ctx, o.Register, h, ropt)
	if err != nil {
		if ctx.Err() != nil {
			return context.Cause(ctx) // interrupted before the driver was there
		}
		return err
	}
	defer reg.Close()
	fmt.Fprintf(a.io.ErrOut, "registered %s rank %d of %d (run %q, host %s) with %s: control channel on the registration's connection (reverse)\n",
		h.Role, h.Rank, h.World, h.Run, h.Host, o.Register)
	conn := reg.Conn()
	// Side channels bind everywhere and advertise the address this host
	// reaches the driver from (the connection's local address).
	side := engine.SideChannelHost{Bind: "0.0.0.0", Advertise: o.Advertise}
	if side.Identity, err = o.identity(); err != nil {
		return err
	}
	stop := context.AfterFunc(ctx, func() { conn.Close() })
	defer stop()
	err = ctl.ServeConn(ctx, conn, engine.EndpointRole(a.log, side))
	if ctx.Err() != nil {
		return nil
	}
	if err != nil {
		return fmt.Errorf("session with the driver: %w", err)
	}
	fmt.Fprintf(a.io.ErrOut, "session ended; leaving the rendezvous\n")
	return nil
}
