package sidechannel

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	zmq "github.com/pebbe/zmq4"
)

// Msg is one message received on an AsyncRouter: the sender's routing
// identity, whether it framed the message with the empty delimiter (REQ
// and vLLM's DEALERs do), and the frames after it.
type Msg struct {
	ID     []byte
	Delim  bool
	Frames [][]byte
}

// AsyncRouter is a ROUTER whose replies are decoupled from its requests:
// messages come out of In, and Reply may answer any of them later, from
// any goroutine. The encoder-cache producer needs this: a WRITE grant is
// acknowledged only when its transfer finished, while other requests keep
// arriving.
//
// One goroutine owns the ROUTER. Replies reach it through an inproc PUSH
// → PULL pair that it polls beside the ROUTER, so a reply is sent at once
// rather than at the next poll timeout, and the ROUTER is never touched
// by two threads.
type AsyncRouter struct {
	endpoint string
	in       chan Msg
	done     chan struct{}

	mu   sync.Mutex  // guards push
	push *zmq.Socket // nil once the router stopped
}

var inprocSeq atomic.Uint64

// ListenAsyncRouter binds a ROUTER to endpoint ("tcp://127.0.0.1:0" picks
// a free port) and serves it until ctx ends.
func ListenAsyncRouter(ctx context.Context, endpoint string, log *slog.Logger) (*AsyncRouter, error) {
	sock, bound, err := bind(zmq.ROUTER, endpoint)
	if err != nil {
		return nil, err
	}
	inproc := fmt.Sprintf("inproc://nixlctl-async-router-%d", inprocSeq.Add(1))
	pull, _, err := bind(zmq.PULL, inproc)
	if err != nil {
		sock.Close()
		return nil, err
	}
	push, err := zmq.NewSocket(zmq.PUSH)
	if err == nil {
		_ = push.SetLinger(0)
		if err = push.Connect(inproc); err != nil {
			push.Close()
		}
	}
	if err != nil {
		sock.Close()
		pull.Close()
		return nil, fmt.Errorf("reply channel: %w", err)
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	r := &AsyncRouter{endpoint: bound, in: make(chan Msg, 64), done: make(chan struct{}), push: push}
	go r.serve(ctx, sock, pull, log)
	return r, nil
}

// Endpoint is where the router listens (with the real port).
func (r *AsyncRouter) Endpoint() string { return r.endpoint }

// In delivers received messages; it is closed when the router stops.
func (r *AsyncRouter) In() <-chan Msg { return r.in }

// Wait blocks until the router has closed its sockets.
func (r *AsyncRouter) Wait() { <-r.done }

// ErrRouterClosed is returned by Reply after the router stopped.
var ErrRouterClosed = errors.New("router closed")

// Reply sends frames back to the sender of m, keeping its framing.
func (r *AsyncRouter) Reply(m Msg, frames [][]byte) error {
	out := make([][]byte, 0, 2+len(frames))
	delim := []byte{0}
	if m.Delim {
		delim[0] = 1
	}
	out = append(out, m.ID, delim)
	out = append(out, frames...)
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.push == nil {
		return ErrRouterClosed
	}
	_, err := r.push.SendMessage(toAny(out)...)
	return err
}

func (r *AsyncRouter) serve(ctx context.Context, sock, pull *zmq.Socket, log *slog.Logger) {
	defer close(r.done)
	defer close(r.in)
	defer func() {
		r.mu.Lock()
		r.push.Close()
		r.push = nil
		r.mu.Unlock()
		pull.Close()
		sock.Close()
	}()
	pollLoop(ctx, func(from *zmq.Socket, msg [][]byte) bool {
		if from == pull {
			// [identity, delimiter flag, frames...] from Reply. A peer
			// that went away makes ROUTER drop the reply silently (no
			// ROUTER_MANDATORY), as vLLM's does.
			if len(msg) < 2 || len(msg[1]) != 1 {
				return true
			}
			if _, err := sock.SendMessageDontwait(toAny(envelope(msg[0], msg[1][0] == 1, msg[2:]))...); err != nil {
				log.Warn("side channel: reply not sent", "err", err)
			}
			return true
		}
		id, body, delim, ok := splitEnvelope(msg)
		if !ok {
			log.Warn("side channel: message without routing envelope", "frames", len(msg))
			return true
		}
		select {
		case r.in <- Msg{ID: id, Frames: body, Delim: delim}:
			return true
		case <-ctx.Done():
			return false
		}
	}, sock, pull)
}

// DealerOptions tune a DEALER. Zero values leave libzmq's defaults.
type DealerOptions struct {
	// ZMTP heartbeats: a PING every HeartbeatIvl, the connection is
	// dropped when no traffic arrives within HeartbeatTimeout, and the
	// peer is asked to drop it after HeartbeatTTL without a PING.
	HeartbeatIvl     time.Duration
	HeartbeatTimeout time.Duration
	HeartbeatTTL     time.Duration
	// SendTimeout bounds a send that cannot be queued (the high-water
	// mark towards a dead peer is full) instead of blocking forever.
	SendTimeout time.Duration
}

// ECDealerOptions are the heartbeats vLLM's encoder-cache consumer sets
// on its per-producer DEALERs (2 s / 4 s / 8 s).
var ECDealerOptions = DealerOptions{HeartbeatIvl: 2 * time.Second, HeartbeatTimeout: 4 * time.Second, HeartbeatTTL: 8 * time.Second,
	SendTimeout: time.Second}

// DialDealerWith connects a DEALER to endpoint with options.
func DialDealerWith(endpoint string, o DealerOptions) (*Dealer, error) {
	sock, err := zmq.NewSocket(zmq.DEALER)
	if err != nil {
		return nil, err
	}
	_ = sock.SetLinger(0)
	if isIPv6(endpoint) {
		_ = sock.SetIpv6(true)
	}
	var errs []error
	if o.HeartbeatIvl > 0 {
		errs = append(errs, sock.SetHeartbeatIvl(o.HeartbeatIvl))
	}
	if o.HeartbeatTimeout > 0 {
		errs = append(errs, sock.SetHeartbeatTimeout(o.HeartbeatTimeout))
	}
	if o.HeartbeatTTL > 0 {
		errs = append(errs, sock.SetHeartbeatTtl(o.HeartbeatTTL))
	}
	if o.SendTimeout > 0 {
		errs = append(errs, sock.SetSndtimeo(o.SendTimeout))
	}
	if err := errors.Join(errs...); err != nil {
		sock.Close()
		return nil, fmt.Errorf("dealer options: %w", err)
	}
	if err := sock.Connect(endpoint); err != nil {
		sock.Close()
		return nil, fmt.Errorf("connect %s: %w", endpoint, err)
	}
	return &Dealer{sock: sock, endpoint: endpoint}, nil
}
