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
		var cfg Config
		if err := json.Unmarshal(params, &cfg); err != nil {
			return nil, fmt.Errorf("setup: %w", err)
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
	srv.Handle("prefill", func(ctx context.Context, params json.RawMessage) (any, error) {
		e, err := get()
		if err != nil {
			return nil, err
		}
		var r PrefillRequest
		if err := json.Unmarshal(params, &r); err != nil {
			return nil, fmt.Errorf("prefill: %w", err)
		}
		e.c.inFlight.Add(1)
		defer e.c.inFlight.Add(-1)
		return e.role.Prefill(ctx, r)
	})
	srv.Handle("load", func(ctx context.Context, params json.RawMessage) (any, error) {
		e, err := get()
		if err != nil {
			return nil, err
		}
		var r LoadRequest
		if err := json.Unmarshal(params, &r); err != nil {
			return nil, fmt.Errorf("load: %w", err)
		}
		e.c.inFlight.Add(1)
		defer e.c.inFlight.Add(-1)
		return e.role.Load(ctx, r)
	})
	srv.Handle("abort", func(ctx context.Context, params json.RawMessage) (any, error) {
		e, err := get()
		if err != nil {
			return nil, err
		}
		var r AbortRequest
		if err := json.Unmarshal(params, &r); err != nil {
			return nil, fmt.Errorf("abort: %w", err)
		}
		aborted, err := e.role.Abort(r.ID)
		if err != nil {
			return nil, err
		}
		return AbortReply{Aborted: aborted}, nil
	})
	srv.Handle("stats", func(context.Context, json.RawMessage) (any, error) {
		e, err := get()
		if err != nil {
			return nil, err
		}
		return e.Stats(), nil
	})
	srv.Handle("touch", func(context.Context, json.RawMessage) (any, error) {
		e, err := get()
		if err != nil {
			return nil, err
		}
		return e.TouchPools(), nil
	})
	srv.Handle("info", func(context.Context, json.RawMessage) (any, error) {
		e, err := get()
		if err != nil {
			return nil, err
		}
		return e.Info(), nil
	})
	return func() {
		mu.Lock()
		if eng != nil {
			eng.Close()
		}
		mu.Unlock()
	}
}
