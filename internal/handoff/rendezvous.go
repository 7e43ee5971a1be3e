package handoff

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"time"

	"github.com/nixlctl/nixlctl/internal/live"
	"github.com/nixlctl/nixlctl/internal/rendezvous"
)

// resolveRendezvous settles the roster and placeholder engine slots of a
// rendezvous run (Validate); RunHandoff fills the slots in once the
// endpoints came.
func (o *HandoffOptions) resolveRendezvous(bad func(field, format string, a ...any)) {
	if o.Prefill != "" || o.Decode != "" || o.Topology != "" {
		bad("Rendezvous", "excludes --prefill, --decode and --topology: the endpoints register instead of being named")
		return
	}
	if o.JoinWindow <= 0 {
		bad("JoinWindow", "must be positive")
	}
	etcd := strings.HasPrefix(o.Rendezvous, rendezvous.EtcdScheme)
	addr := strings.TrimPrefix(strings.TrimPrefix(o.Rendezvous, rendezvous.EtcdScheme), "tcp://")
	if _, port, err := net.SplitHostPort(addr); err != nil {
		bad("Rendezvous", "%q: want [tcp://]HOST:PORT to listen on, or etcd://HOST:PORT", o.Rendezvous)
	} else if n, err := strconv.Atoi(port); err != nil || n < 0 || n > 65535 || etcd && n == 0 {
		bad("Rendezvous", "%q: bad port", o.Rendezvous)
	}
	if etcd && o.RunID == "" {
		bad("RunID", "etcd needs a run id to keep runs apart: give --run-id (or run under a launcher with a job id, or set NIXLCTL_JOB_ID)")
	}
	var r rendezvous.Roster
	if o.Roster != "" {
		var err error
		if r, err = rendezvous.ParseRoster(o.RunID, o.Roster); err != nil {
			bad("Roster", "%v", err)
			return
		}
		np, nd := len(r.Ranks["prefill"]), len(r.Ranks["decode"])
		for role := range r.Ranks {
			if role != "prefill" && role != "decode" {
				bad("Roster", "role %q: a handoff roster lists prefill and decode ranks", role)
				return
			}
		}
		if np == 0 || nd == 0 {
			bad("Roster", "%q: needs at least one prefill and one decode rank", o.Roster)
			return
		}
		if (o.Prefills > 1 || o.Decodes > 1) && (o.Prefills != np || o.Decodes != nd) {
			bad("Roster", "lists %d prefill and %d decode ranks, but --prefills %d --decodes %d", np, nd, o.Prefills, o.Decodes)
			return
		}
	} else {
		if o.Prefills < 0 || o.Decodes < 0 {
			bad("Prefills", "must not be negative")
			return
		}
		r = rendezvous.PrefillDecode(o.RunID, max(o.Prefills, 1), max(o.Decodes, 1))
		if err := r.Validate(); err != nil {
			bad("RunID", "%v", err)
			return
		}
	}
	o.roster = r
	o.prefills, o.decodes = nil, nil
	for range r.Ranks["prefill"] {
		o.prefills = append(o.prefills, EngineSlot{Addr: "rendezvous", TP: o.Spec.TP})
	}
	for range r.Ranks["decode"] {
		o.decodes = append(o.decodes, EngineSlot{Addr: "rendezvous", TP: o.DecodeTP})
	}
}

// meetRendezvous opens the rendezvous, waits for the roster and puts the
// members in the engine slots: prefill engine i is the i-th prefill rank.
// The driver it returns (also on error, when it opened) must be closed
// after the endpoints: closing it ends the members' registrations.
func (o *HandoffOptions) meetRendezvous(ctx context.Context) (*rendezvous.Driver, *RendezvousInfo, error) {
	live.Emit(o.Live, live.Phase{Text: "waiting for endpoints to register"})
	// RetryFor: etcd must answer within the join window too.
	drv, err := rendezvous.Open(ctx, o.Rendezvous, o.roster, rendezvous.Options{Log: o.Log, RetryFor: time.Duration(o.JoinWindow)})
	if err != nil {
		return nil, nil, fmt.Errorf("rendezvous %s: %w", o.Rendezvous, err)
	}
	if o.OnRendezvous != nil {
		o.OnRendezvous(drv.Addr(), o.roster)
	}
	start := time.Now()
	members, err := drv.Wait(ctx, o.JoinWindow)
	if err != nil {
		var inc *rendezvous.IncompleteError
		if errors.As(err, &inc) && ctx.Err() == nil {
			return drv, nil, fmt.Errorf("%w (run %q at %s, --join-window %v)", err, o.roster.Run, drv.Addr(), o.JoinWindow)
		}
		return drv, nil, err
	}
	info := &RendezvousInfo{Addr: drv.Addr(), RunID: o.roster.Run, Roster: o.roster.String(),
		WaitedMS: float64(time.Since(start).Microseconds()) / 1e3}
	o.prefills, o.decodes = nil, nil
	for _, m := range members {
		slot := EngineSlot{Addr: m.Addr, TP: o.Spec.TP}
		if m.Addr != "" {
			if o.registered == nil {
				o.registered = map[string]registration{}
			}
			o.registered[m.Addr] = registration{etcd: strings.HasPrefix(o.Rendezvous, "etcd://"),
				who: fmt.Sprintf("%s rank %d, registered from host %s (%s)", m.Role, m.Rank, m.Host, m.From)}
		}
		rec := RendezvousMember{Role: m.Role, Rank: m.Rank, Host: m.Host, Addr: m.Addr, From: m.From}
		if m.Conn != nil {
			slot.Addr, rec.Addr = "reverse@"+m.From, rendezvous.Reverse
			if o.reverse == nil {
				o.reverse = map[string]net.Conn{}
			}
			o.reverse[slot.Addr] = m.Conn
		}
		info.Members = append(info.Members, rec)
		if m.Role == "decode" {
			slot.TP = o.DecodeTP
			o.decodes = append(o.decodes, slot)
		} else {
			o.prefills = append(o.prefills, slot)
		}
	}
	return drv, info, nil
}
