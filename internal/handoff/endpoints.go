package handoff

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"slices"
	"strings"
	"time"

	"github.com/nixlctl/nixlctl/internal/clocksync"
	"github.com/nixlctl/nixlctl/internal/ctl"
	"github.com/nixlctl/nixlctl/internal/engine"
	"github.com/nixlctl/nixlctl/internal/fleet"
	"github.com/nixlctl/nixlctl/internal/netpath"
	"github.com/nixlctl/nixlctl/internal/runcore"
)

// localHostFor is the address by which this host reaches a remote
// endpoint: where a local child must bind and what it must advertise so
// that the remote one can reach it back. "" when ep is local.
func localHostFor(eps ...*Endpoint) string {
	for _, ep := range eps {
		if ep == nil {
			continue
		}
		if a, ok := ep.rpc.LocalAddr().(*net.TCPAddr); ok {
			return a.IP.String()
		}
	}
	return ""
}

// sideChannelDial is how long the driver waits to reach an advertised
// side channel before it calls the address unreachable.
const sideChannelDial = 3 * time.Second

// checkReachable dials each address an endpoint advertised. A wrong
// --advertise otherwise shows up as every request timing out in a
// handshake; here it fails before the run, naming the address.
func checkReachable(ctx context.Context, role string, addrs ...string) error {
	for _, a := range addrs {
		if a == "" {
			continue
		}
		hp := strings.TrimPrefix(strings.TrimPrefix(a, "tcp://"), "http://")
		dctx, cancel := context.WithTimeout(ctx, sideChannelDial)
		var d net.Dialer
		conn, err := d.DialContext(dctx, "tcp", hp)
		cancel()
		if err != nil {
			return fmt.Errorf("%s advertises %s, which this driver cannot reach (%v): run its serve with --advertise set to an address of its host that the peers can reach", role, a, err)
		}
		conn.Close()
	}
	return nil
}

// checkLoopbackAdvert refuses an advertised address that is loopback when
// an endpoint that must dial it runs on another host. The driver's own
// reachability check cannot see this: the driver may share the advertiser's
// host, dial 127.0.0.1 happily, and pass a run in which every request then
// fails in its handshake ("no reply within 5s").
func checkLoopbackAdvert(role string, adv *Endpoint, addr string, dialers []*Endpoint) error {
	host := advertHost(addr)
	if host == "" || !isLoopbackHost(host) {
		return nil
	}
	for _, d := range dialers {
		if d == nil || clocksync.SameHost(adv.host.Identity, d.host.Identity) {
			continue
		}
		where := d.info.Role
		if d.info.Hostname != "" {
			where += " on " + d.info.Hostname
		}
		return fmt.Errorf("%s advertises %s, a loopback address, but %s runs on another host and would dial its own loopback: give %s an address its peers can reach (serve --listen/--advertise with the host's IP, not 127.0.0.1 or localhost)",
			role, addr, where, role)
	}
	return nil
}

// isLoopbackHost: 127.0.0.0/8, ::1 or the name localhost.
func isLoopbackHost(h string) bool {
	if strings.EqualFold(h, "localhost") || strings.HasSuffix(strings.ToLower(h), ".localhost") {
		return true
	}
	ip := net.ParseIP(h)
	return ip != nil && ip.IsLoopback()
}

// checkRemoteNetDevices checks --net-devices at every endpoint the driver
// did not start, against the devices it reports, before any engine is set
// up.
func checkRemoteNetDevices(ctx context.Context, list string, pes, des []*Endpoint, pslots, dslots []EngineSlot) error {
	check := func(eps []*Endpoint, slots []EngineSlot) error {
		for i, ep := range eps {
			if slots[i].Local() {
				continue // this host: checked against /sys in Validate
			}
			nctx, cancel := context.WithTimeout(ctx, runcore.NetstatTimeout)
			ns, err := ep.rpc.NetStat(nctx)
			cancel()
			if err != nil {
				continue // an older serve: its engine set-up says
			}
			if err := runcore.CheckNetDevicesAt(ep.info.Role, cmp.Or(ns.Host.Hostname, ep.info.Hostname), ns.Snapshot.Devices, list); err != nil {
				return err
			}
		}
		return nil
	}
	if err := check(pes, pslots); err != nil {
		return err
	}
	return check(des, dslots)
}

// dialError says why an endpoint could not be reached and, for one that
// registered in a rendezvous, which rank registered the address and that
// it may be stale: an endpoint killed within its etcd lease leaves its key
// behind, and the next run dials the dead address.
func dialError(name, addr string, reg registration, err error) error {
	switch {
	case reg.who == "":
		return fmt.Errorf("%s endpoint %s: %w", name, addr, err)
	case reg.etcd:
		return fmt.Errorf("%s endpoint %s (%s) cannot be reached: %w; a stale registration? An endpoint killed within its etcd lease leaves its key until the lease runs out (about 10 s): start that rank again, or wait and rerun", name, addr, reg.who, err)
	}
	return fmt.Errorf("%s endpoint %s (%s) cannot be reached: %w", name, addr, reg.who, err)
}

// launch is what starting a run's endpoints takes from its options: a
// handoff's and lease-chaos's alike, so neither builds the other's.
type launch struct {
	exe     string   // default this program
	exeArgs []string // before the role; default serve
	env     []string
	stderr  io.Writer
	log     *slog.Logger
	inproc  bool
	// bootstrap is an external SGLang bootstrap server: the prefill is
	// then a stand-in in this process that answers through it.
	bootstrap        string
	bootstrapTimeout time.Duration
	// reverse maps a reverse rendezvous member's slot address to the
	// connection it registered on; registered names who registered each
	// member's address.
	reverse    map[string]net.Conn
	registered map[string]registration
}

// launch is how this handoff starts its endpoints.
func (o *HandoffOptions) launch() launch {
	return launch{exe: o.Exe, exeArgs: o.ExeArgs, env: o.ChildEnv, stderr: o.ChildStderr, log: o.Log, inproc: o.Inproc,
		bootstrap: o.Bootstrap, bootstrapTimeout: time.Duration(o.SGLBootstrapTimeout), reverse: o.reverse, registered: o.registered}
}

// startEndpoint starts (or dials, for an address) an endpoint of role
// (prefill or decode); name is how errors call it ("prefill-1").
func startEndpoint(ctx context.Context, l launch, role, name string, slot EngineSlot) (*Endpoint, error) {
	addr := slot.remoteAddr()
	if c := l.reverse[addr]; c != nil {
		// A reverse rendezvous member: its control channel is the
		// connection it registered on.
		return &Endpoint{rpc: ctl.NewConnClient(c)}, nil
	}
	// Endpoints outlive the run's context: an interrupted run still asks
	// them for their stats.
	p := fleet.Proc{Name: name, Addr: addr, Exe: l.exe, DefaultArgs: []string{"serve", role, "--stdio"}, Env: l.env, Stderr: l.stderr, Outlive: true}
	if l.exeArgs != nil {
		p.Args = append(slices.Clone(l.exeArgs), role, "--stdio")
	}
	switch {
	case role == "prefill" && l.bootstrap != "":
		hostPort, err := ParseBootstrapURL(l.bootstrap)
		if err != nil {
			return nil, err
		}
		p.InProcess, p.Addr = sglExternalPrefillRole(hostPort, l.bootstrapTimeout+time.Minute, l.log.With("role", name)), ""
	case l.inproc:
		p.InProcess, p.Addr = engine.EndpointRole(l.log.With("role", name), engine.SideChannelHost{}), ""
	}
	c, err := fleet.Start(ctx, p)
	var dial *fleet.DialError
	switch {
	case errors.As(err, &dial):
		return nil, dialError(name, addr, l.registered[addr], dial.Err)
	case err != nil:
		return nil, err
	}
	return &Endpoint{rpc: c.Client, conn: c}, nil
}

// handoffFleet is one handoff run's endpoints: the engine slots asked for,
// the endpoints started or dialled for them (nil where none was yet), and
// what their engines' setup answered.
type handoffFleet struct {
	pslots, dslots   []EngineSlot
	pes, des         []*Endpoint
	psetups, dsetups []engine.SetupReply
}

func (f *handoffFleet) prefillName(i int) string { return engineName("prefill", i, len(f.pslots)) }
func (f *handoffFleet) decodeName(i int) string  { return engineName("decode", i, len(f.dslots)) }

// all is every endpoint, prefills first.
func (f *handoffFleet) all() []*Endpoint { return slices.Concat(f.pes, f.des) }

// sameHostPIDs are the process ids of the engines on this host, in this
// PID namespace, as their setup gave them: the run's own, even where it
// did not start them (serve started by hand, or by a launcher).
func (f *handoffFleet) sameHostPIDs() []int {
	me, err := clocksync.ReadHostIdentity()
	if err != nil {
		return nil
	}
	var pids []int
	add := func(eps []*Endpoint, setups []engine.SetupReply) {
		for j, s := range setups {
			if j < len(eps) && eps[j] != nil && s.PID > 0 && clocksync.SameHost(me, eps[j].host.Identity) {
				pids = append(pids, s.PID)
			}
		}
	}
	add(f.pes, f.psetups)
	add(f.des, f.dsetups)
	return pids
}

// close closes every endpoint started so far; closing one twice is
// harmless.
func (f *handoffFleet) close() {
	for _, ep := range f.all() {
		ep.close()
	}
}

// pathEnds are the endpoints as the network path watcher reads them: each
// engine's counters against its own bytes (engines of one host read the
// same host-wide counters and are judged together, judgePath).
func (f *handoffFleet) pathEnds() []runcore.PathEnd {
	var ends []runcore.PathEnd
	for i, ep := range f.pes {
		ends = append(ends, runcore.PathEnd{Role: f.prefillName(i), RPC: ep.rpc, Dir: netpath.Send})
	}
	for i, ep := range f.des {
		ends = append(ends, runcore.PathEnd{Role: f.decodeName(i), RPC: ep.rpc, Dir: netpath.Receive})
	}
	return ends
}

// start starts or dials every endpoint, relates each one's clock and host
// to the driver's, and sets up its engine.
func (f *handoffFleet) start(ctx context.Context, o *HandoffOptions, backend string, blocks int) error {
	n, m := len(f.pslots), len(f.dslots)
	f.pes, f.des = make([]*Endpoint, n), make([]*Endpoint, m)
	// Remote endpoints are dialled first: one that cannot be reached
	// fails the run before any local engine is started (--decode
	// 127.0.0.1:1 failed after the local prefill was up).
	for _, remote := range []bool{true, false} {
		for i, s := range f.pslots {
			if !s.Local() == remote {
				ep, err := startEndpoint(ctx, o.launch(), "prefill", f.prefillName(i), s)
				if err != nil {
					return err
				}
				f.pes[i] = ep
			}
		}
		for i, s := range f.dslots {
			if !s.Local() == remote {
				ep, err := startEndpoint(ctx, o.launch(), "decode", f.decodeName(i), s)
				if err != nil {
					return err
				}
				f.des[i] = ep
			}
		}
	}
	pcs, dcs := make([]engine.Config, n), make([]engine.Config, m)
	for i, s := range f.pslots {
		pcs[i] = o.engineConfig(engine.RolePrefill, backend, blocks, i, s.TP)
	}
	for i, s := range f.dslots {
		dcs[i] = o.engineConfig(engine.RoleDecode, backend, blocks, i, s.TP)
	}
	// A local child whose peers are on another host binds and advertises
	// the address this host reaches them by, not loopback.
	bindFor(f.pslots, pcs, remoteOf(f.dslots, f.des))
	bindFor(f.dslots, dcs, remoteOf(f.pslots, f.pes))
	for i, ep := range f.pes {
		if err := ep.meet(ctx, f.prefillName(i), f.pslots[i].remoteAddr()); err != nil {
			return err
		}
	}
	for i, ep := range f.des {
		if err := ep.meet(ctx, f.decodeName(i), f.dslots[i].remoteAddr()); err != nil {
			return err
		}
	}
	if o.NetDevices != "" && (o.remote() || o.Rendezvous != "") {
		if err := checkRemoteNetDevices(ctx, o.NetDevices, f.pes, f.des, f.pslots, f.dslots); err != nil {
			return err
		}
	}
	f.psetups, f.dsetups = make([]engine.SetupReply, n), make([]engine.SetupReply, m)
	for i, ep := range f.pes {
		if err := ep.rpc.Call(ctx, "setup", pcs[i], &f.psetups[i]); err != nil {
			return fmt.Errorf("%s setup: %w", f.prefillName(i), err)
		}
		ep.info.SideChannel = f.psetups[i].SideChannel
	}
	for i, ep := range f.des {
		if err := ep.rpc.Call(ctx, "setup", dcs[i], &f.dsetups[i]); err != nil {
			return fmt.Errorf("%s setup: %w", f.decodeName(i), err)
		}
		ep.info.SideChannel = f.dsetups[i].SideChannel
	}
	return nil
}

// remoteOf is the endpoints of slots on other hosts.
func remoteOf(slots []EngineSlot, eps []*Endpoint) []*Endpoint {
	var out []*Endpoint
	for i, s := range slots {
		if !s.Local() {
			out = append(out, eps[i])
		}
	}
	return out
}

// bindFor makes the local engines of slots bind and advertise the address
// by which this host reaches peers, when they have peers on another host.
func bindFor(slots []EngineSlot, cfgs []engine.Config, peers []*Endpoint) {
	if len(peers) == 0 {
		return
	}
	host := localHostFor(peers...)
	if host == "" {
		return
	}
	for i, s := range slots {
		if s.Local() {
			cfgs[i].SideChannel, cfgs[i].Advertise = "tcp://"+net.JoinHostPort(host, "0"), host
		}
	}
}

// checkAdverts checks, for a run across hosts, that every address an
// engine advertised is one its peers can dial: not loopback when a peer is
// on another host, and reachable from the driver.
func (f *handoffFleet) checkAdverts(ctx context.Context) error {
	for i := range f.pes {
		for _, a := range []string{f.psetups[i].SideChannel, f.psetups[i].Bootstrap} {
			if err := checkLoopbackAdvert(f.prefillName(i), f.pes[i], a, f.des); err != nil {
				return err
			}
		}
	}
	for i := range f.des {
		if err := checkLoopbackAdvert(f.decodeName(i), f.des[i], f.dsetups[i].SideChannel, f.pes); err != nil {
			return err
		}
	}
	for i := range f.pes {
		if err := checkReachable(ctx, f.prefillName(i), f.psetups[i].SideChannel, f.psetups[i].Bootstrap); err != nil {
			return err
		}
	}
	for i := range f.des {
		if err := checkReachable(ctx, f.decodeName(i), f.dsetups[i].SideChannel); err != nil {
			return err
		}
	}
	return nil
}
