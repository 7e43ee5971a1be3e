package engine

import (
	"context"
	"errors"
	"strings"

	"github.com/nixlctl/nixlctl/internal/lease"
	"github.com/nixlctl/nixlctl/internal/sidechannel"
)

// role is what an engine is: prefill or decode, with vLLM's protocols or
// SGLang's. The RPC, the per-rank notification owners and Stats/Setup/
// Close go through it instead of checking which states are set.
type role interface {
	Prefill(ctx context.Context, r PrefillRequest) (PrefillReply, error)
	Load(ctx context.Context, r LoadRequest) (LoadReply, error)
	Abort(routerID string) (bool, error)
	// onNotif takes one notification a rank received; afterNotifs runs
	// on the rank's owner goroutine after each batch, pending says
	// whether the owner must poll even if nothing wakes it, and wake is
	// what wakes it besides notifications (nil: nothing).
	onNotif(rk *rank, from string, m []byte)
	afterNotifs(rk *rank)
	pending(r int) bool
	wake(r int) <-chan struct{}
	// start launches the role's engine steps (counted in Engine.wg).
	start()
	stats(st *Stats)
	setup(rep *SetupReply)
	// close runs once the engine's goroutines stopped, before the
	// agents close; closeAfterAgents frees what they had registered.
	close()
	closeAfterAgents()
}

var (
	errPrefillEngine = errors.New("this endpoint is a prefill engine")
	errDecodeEngine  = errors.New("this endpoint is a decode engine")
)

func newRole(e *Engine) role {
	switch {
	case e.cfg.Role == RolePrefill && e.sgl != nil:
		return sglPrefillRole{prefillRole{e.pre}, e.sgl}
	case e.cfg.Role == RolePrefill:
		return prefillRole{e.pre}
	case e.sgl != nil:
		return sglDecodeRole{decodeRole{e.dec}, e.sgl}
	default:
		return decodeRole{e.dec}
	}
}

// prefillRole is vLLM's prefill: pull's completions, push's writer, leases.
type prefillRole struct{ s *prefillState }

func (p prefillRole) Prefill(ctx context.Context, r PrefillRequest) (PrefillReply, error) {
	return p.s.Prefill(ctx, r)
}

func (prefillRole) Load(context.Context, LoadRequest) (LoadReply, error) {
	return LoadReply{}, errPrefillEngine
}

// Abort frees a request's blocks that no decode read: the router's answer
// to a decode that could not even handshake with this prefill, which
// otherwise holds them for a whole lease while later requests run out of
// blocks. A request some decode already read is left to its lease.
func (p prefillRole) Abort(id string) (bool, error) { return p.s.abortUnread(id), nil }

func (p prefillRole) onNotif(rk *rank, from string, m []byte) {
	s := string(m)
	switch {
	case strings.HasPrefix(s, "PUSH_REG:"):
		p.s.onPushReg(rk, from, m[len("PUSH_REG:"):])
	case strings.HasPrefix(s, "HB:"):
		ids, _ := lease.ParseHeartbeat(s)
		p.s.onHeartbeat(ids)
	default:
		if id, n, ok := p.s.e.completion(from, s); ok {
			p.s.onConsumed(rk, from, id, n)
		}
	}
}

func (p prefillRole) afterNotifs(rk *rank)       { p.s.pushStep(rk) }
func (p prefillRole) pending(r int) bool         { return p.s.pushPending(r) }
func (p prefillRole) wake(r int) <-chan struct{} { return p.s.wake[r] }
func (p prefillRole) stats(st *Stats)            { p.s.stats(st) }
func (prefillRole) setup(*SetupReply)            {}
func (prefillRole) close()                       {}
func (prefillRole) closeAfterAgents()            {}

func (p prefillRole) start() {
	p.s.e.wg.Add(1)
	go p.s.reaper()
}

// decodeRole is vLLM's decode: pull's READs, push's registrations and
// watchdog, heartbeats, the queue.
type decodeRole struct{ s *decodeState }

func (decodeRole) Prefill(context.Context, PrefillRequest) (PrefillReply, error) {
	return PrefillReply{}, errDecodeEngine
}

func (d decodeRole) Load(ctx context.Context, r LoadRequest) (LoadReply, error) {
	return d.s.Load(ctx, r)
}

func (d decodeRole) Abort(id string) (bool, error) { return d.s.Abort(id), nil }

func (d decodeRole) onNotif(rk *rank, from string, m []byte) {
	e, s := d.s.e, string(m)
	switch {
	case strings.HasPrefix(s, "PUSH_REG:"):
		e.badNotif("PUSH_REG received by a decode engine", from, s)
	case strings.HasPrefix(s, "HB:"):
		e.badNotif("heartbeat received by a decode engine", from, s)
	default:
		if id, n, ok := e.completion(from, s); ok {
			d.s.onPushDone(rk, from, id, n)
		}
	}
}

func (decodeRole) afterNotifs(*rank)        {}
func (decodeRole) pending(int) bool         { return false }
func (decodeRole) wake(int) <-chan struct{} { return nil }
func (d decodeRole) stats(st *Stats)        { d.s.stats(st) }
func (decodeRole) setup(*SetupReply)        {}
func (decodeRole) close()                   {}
func (decodeRole) closeAfterAgents()        {}

func (d decodeRole) start() {
	e := d.s.e
	hb := d.s.tracker != nil && e.cfg.LeaseConfig().HeartbeatInterval() > 0
	if hb || e.cfg.Protocol == ProtoPush {
		e.wg.Add(1)
		go d.s.stepLoop(hb)
	}
}

// sglPrefillRole is SGLang's prefill: the bootstrap server and the rooms
// (the lease machinery of prefillRole idles).
type sglPrefillRole struct {
	prefillRole
	sgl *sglState
}

func (p sglPrefillRole) Prefill(ctx context.Context, r PrefillRequest) (PrefillReply, error) {
	return p.sgl.prefill(ctx, r)
}

func (p sglPrefillRole) setup(rep *SetupReply) { rep.Bootstrap = p.sgl.bootstrapAddr }
func (p sglPrefillRole) close()                { p.sgl.close() }
func (p sglPrefillRole) closeAfterAgents()     { p.sgl.freeAux() }

// sglDecodeRole is SGLang's decode: room notifications feed is_done.
type sglDecodeRole struct {
	decodeRole
	sgl *sglState
}

func (d sglDecodeRole) onNotif(rk *rank, from string, m []byte) {
	if s := string(m); sidechannel.IsSGLangNotif(s) {
		d.sgl.onNotif(rk, from, s)
		return
	}
	d.decodeRole.onNotif(rk, from, m)
}

func (d sglDecodeRole) setup(rep *SetupReply) { rep.Bootstrap = d.sgl.bootstrapAddr }
func (d sglDecodeRole) close()                { d.sgl.close() }
func (d sglDecodeRole) closeAfterAgents()     { d.sgl.freeAux() }
