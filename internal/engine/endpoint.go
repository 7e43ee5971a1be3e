package engine

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"sync"

	"github.com/nixlctl/nixlctl/internal/ctl"
)

// EndpointRole is one engine endpoint on a control channel: "setup"
// creates the engine (once), then "prefill" or "load", "abort", "stats", "touch",
// "info". Events ("freed"; with lease events "heartbeat", "leases",
// "queued", "crashing") flow back unasked. The engine closes with the
// session.
func EndpointRole(log *slog.Logger, side SideChannelHost) ctl.Role {
	return func(srv *ctl.Server) func() {
		return serveEndpoint(srv, log, side)
	}
}

// SideChannelHost is where an endpoint started by hand (serve --listen)
// binds its side channels and what it advertises, whatever the driver's
// setup says: the driver does not know the endpoint's addresses. The zero
// value leaves the driver's choice.
type SideChannelHost struct {
	// Bind is the host the side channels bind (the --listen host).
	Bind string
	// Advertise is the host messages name; empty: Bind, or for 0.0.0.0
	// and :: the address the driver's connection came in on.
	Advertise string
	// Identity is the endpoint's own vLLM compatibility identity, which
	// a driver's setup must agree with (the zero value: the driver's).
	Identity Identity
}

// apply sets cfg's side channel from h, for a session whose control
// connection arrived at local (nil on stdio).
func (h SideChannelHost) apply(cfg *Config, local net.Addr) error {
	if h.Bind == "" {
		return nil
	}
	cfg.SideChannel = "tcp://" + net.JoinHostPort(h.Bind, "0")
	cfg.Advertise = h.Advertise
	if cfg.Advertise == "" && Unroutable(h.Bind) {
		ta, ok := local.(*net.TCPAddr)
		if !ok {
			return NoAdvertise("--listen host " + h.Bind)
		}
		cfg.Advertise = ta.IP.String()
	}
	return nil
}

// decodeParams decodes a control call's params, an error naming the
// method.
func decodeParams[T any](method string, params json.RawMessage) (T, error) {
	var v T
	if err := json.Unmarshal(params, &v); err != nil {
		return v, fmt.Errorf("%s: %w", method, err)
	}
	return v, nil
}

func serveEndpoint(srv *ctl.Server, log *slog.Logger, side SideChannelHost) (release func()) {
	var mu sync.Mutex
	var eng *Engine
	get := func() (*Engine, error) {
		mu.Lock()
		defer mu.Unlock()
		if eng == nil {
			return nil, errors.New("setup first")
		}
		return eng, nil
	}
	srv.Handle("setup", func(ctx context.Context, params json.RawMessage) (any, error) {
		cfg, err := decodeParams[Config]("setup", params)
		if err != nil {
			return nil, err
		}
		if err := side.apply(&cfg, srv.LocalAddr()); err != nil {
			return nil, err
		}
		if err := side.Identity.apply(&cfg); err != nil {
			return nil, err
		}
		mu.Lock()
		defer mu.Unlock()
		if eng != nil {
			return nil, errors.New("already set up")
		}
		e, err := NewEngine(ctx, cfg, log, srv.Emit)
		if err != nil {
			return nil, err
		}
		eng = e
		rep := e.Setup()
		// Where its side channels are, for "probe sidechannel" (--log-level info).
		e.log.Info("engine set up", "role", cfg.Role, "protocol", cfg.Protocol, "engine_id", rep.EngineID,
			"side_channel", rep.SideChannel, "bootstrap", rep.Bootstrap)
		return rep, nil
	})
	// The methods after setup act on its engine.
	handle := func(method string, do func(context.Context, *Engine, json.RawMessage) (any, error)) {
		srv.Handle(method, func(ctx context.Context, params json.RawMessage) (any, error) {
			e, err := get()
			if err != nil {
				return nil, err
			}
			return do(ctx, e, params)
		})
	}
	handle("prefill", func(ctx context.Context, e *Engine, params json.RawMessage) (any, error) {
		r, err := decodeParams[PrefillRequest]("prefill", params)
		if err != nil {
			return nil, err
		}
		e.c.inFlight.Add(1)
		defer e.c.inFlight.Add(-1)
		return e.role.Prefill(ctx, r)
	})
	handle("load", func(ctx context.Context, e *Engine, params json.RawMessage) (any, error) {
		r, err := decodeParams[LoadRequest]("load", params)
		if err != nil {
			return nil, err
		}
		e.c.inFlight.Add(1)
		defer e.c.inFlight.Add(-1)
		return e.role.Load(ctx, r)
	})
	handle("abort", func(_ context.Context, e *Engine, params json.RawMessage) (any, error) {
		r, err := decodeParams[AbortRequest]("abort", params)
		if err != nil {
			return nil, err
		}
		aborted, err := e.role.Abort(r.ID)
		if err != nil {
			return nil, err
		}
		return AbortReply{Aborted: aborted}, nil
	})
	handle("stats", func(_ context.Context, e *Engine, _ json.RawMessage) (any, error) { return e.Stats(), nil })
	handle("touch", func(_ context.Context, e *Engine, _ json.RawMessage) (any, error) { return e.TouchPools(), nil })
	handle("info", func(_ context.Context, e *Engine, _ json.RawMessage) (any, error) { return e.Info(), nil })
	return func() {
		mu.Lock()
		if eng != nil {
			eng.Close()
		}
		mu.Unlock()
	}
}
