// Package sidechannel holds the control planes engines use beside the data
// plane: ZeroMQ sockets (through libzmq, as the Python engines use), the
// vLLM NIXL handshake (a ROUTER answering msgpack get_meta_msg requests),
// and helpers shared by the SGLang and encoder-cache protocols.
//
// libzmq sockets are not safe for concurrent use: every socket here is
// owned by one goroutine, or guarded by a mutex so that calls never
// overlap (a mutex gives the full memory barrier ZeroMQ asks for when a
// socket moves between threads).
package sidechannel

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	zmq "github.com/pebbe/zmq4"
)

// pollEvery bounds how long a serving loop waits before it looks at its
// context again.
const pollEvery = 100 * time.Millisecond

// Handler answers one request received on a ROUTER: frames are the
// message without the routing identity and empty delimiter. A nil reply
// sends nothing (the peer times out); an error is logged and counted.
type Handler func(frames [][]byte) (reply [][]byte, err error)

// Router is a ZMQ ROUTER socket served by one goroutine, answering REQ and
// DEALER peers alike ([identity, "", frames...]).
type Router struct {
	endpoint string
	done     chan struct{}
	mu       sync.Mutex
	errs     int
	lastErr  error
}

// ListenRouter binds a ROUTER to endpoint ("tcp://127.0.0.1:0" picks a
// free port) and serves it until ctx ends.
func ListenRouter(ctx context.Context, endpoint string, h Handler, log *slog.Logger) (*Router, error) {
	sock, bound, err := bind(zmq.ROUTER, endpoint)
	if err != nil {
		return nil, err
	}
	r := &Router{endpoint: bound, done: make(chan struct{})}
	go r.serve(ctx, sock, h, log)
	return r, nil
}

// Endpoint is where the router listens (with the real port).
func (r *Router) Endpoint() string { return r.endpoint }

// Errors counts requests the handler rejected, with the last error.
func (r *Router) Errors() (int, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.errs, r.lastErr
}

// Wait blocks until the serving goroutine has closed the socket.
func (r *Router) Wait() { <-r.done }

func (r *Router) serve(ctx context.Context, sock *zmq.Socket, h Handler, log *slog.Logger) {
	defer close(r.done)
	defer sock.Close()
	pollLoop(ctx, func(_ *zmq.Socket, msg [][]byte) bool {
		id, body, delim, ok := splitEnvelope(msg)
		if !ok {
			r.fail(log, fmt.Errorf("message of %d frames without routing envelope", len(msg)))
			return true
		}
		reply, err := h(body)
		if err != nil {
			r.fail(log, err)
		}
		if reply == nil {
			return true
		}
		if _, err := sock.SendMessageDontwait(toAny(envelope(id, delim, reply))...); err != nil {
			r.fail(log, fmt.Errorf("reply: %w", err))
		}
		return true
	}, sock)
}

// pollLoop waits for messages on socks (pollEvery at a time, so that the
// end of ctx is seen) and hands each message of a socket that has some to
// each, until ctx ends, libzmq's context terminates, or each returns
// false. The side channel's serving goroutines all run on it.
func pollLoop(ctx context.Context, each func(from *zmq.Socket, msg [][]byte) bool, socks ...*zmq.Socket) {
	poller := zmq.NewPoller()
	for _, s := range socks {
		poller.Add(s, zmq.POLLIN)
	}
	for ctx.Err() == nil {
		polled, err := poller.Poll(pollEvery)
		if err != nil {
			if errors.Is(err, zmq.ETERM) {
				return
			}
			continue
		}
		for _, p := range polled {
			for {
				msg, err := p.Socket.RecvMessageBytes(zmq.DONTWAIT)
				if err != nil {
					break // drained
				}
				if !each(p.Socket, msg) {
					return
				}
			}
		}
	}
}

// splitEnvelope takes a ROUTER's message apart: [identity, "", frames...],
// or without the empty delimiter, which a DEALER may skip (delim says
// which); ok is false for a message with no frames after the identity.
func splitEnvelope(msg [][]byte) (id []byte, body [][]byte, delim, ok bool) {
	if len(msg) < 2 {
		return nil, nil, false, false
	}
	id, body = msg[0], msg[1:]
	if len(body[0]) == 0 {
		return id, body[1:], true, true
	}
	return id, body, false, true
}

// envelope is the message a ROUTER sends back to identity id: with the
// empty delimiter when the request had one.
func envelope(id []byte, delim bool, frames [][]byte) [][]byte {
	out := [][]byte{id}
	if delim {
		out = append(out, []byte{})
	}
	return append(out, frames...)
}

func (r *Router) fail(log *slog.Logger, err error) {
	r.mu.Lock()
	r.errs++
	r.lastErr = err
	r.mu.Unlock()
	if log != nil {
		log.Warn("side channel: bad request", "err", err)
	}
}

// Request sends frames on a fresh REQ socket and waits for the reply (the
// way vLLM's handshake client does), failing after timeout.
func Request(ctx context.Context, endpoint string, frames [][]byte, timeout time.Duration) ([][]byte, error) {
	sock, err := dialReq(endpoint)
	if err != nil {
		return nil, err
	}
	defer sock.Close()
	if _, err := sock.SendMessage(toAny(frames)...); err != nil {
		return nil, fmt.Errorf("send to %s: %w", endpoint, err)
	}
	return recvWithin(ctx, sock, endpoint, timeout)
}

// dialReq connects a REQ socket the way vLLM's make_zmq_socket does.
func dialReq(endpoint string) (*zmq.Socket, error) {
	sock, err := zmq.NewSocket(zmq.REQ)
	if err != nil {
		return nil, err
	}
	_ = sock.SetLinger(0)
	if isIPv6(endpoint) {
		_ = sock.SetIpv6(true) // as vLLM's make_zmq_socket does for such hosts
	}
	if err := sock.Connect(endpoint); err != nil {
		sock.Close()
		return nil, fmt.Errorf("connect %s: %w", endpoint, err)
	}
	return sock, nil
}

// ReqConn is one REQ socket kept for several requests, as vLLM's
// handshake client keeps one per remote engine and asks every (pp, tp)
// rank on it in turn. REQ alternates strictly: after a request that got no
// reply the socket cannot send again, so Request refuses once that happens.
type ReqConn struct {
	mu       sync.Mutex
	sock     *zmq.Socket
	endpoint string
	stuck    bool
}

// DialReq connects a REQ socket to endpoint.
func DialReq(endpoint string) (*ReqConn, error) {
	sock, err := zmq.NewSocket(zmq.REQ)
	if err != nil {
		return nil, err
	}
	_ = sock.SetLinger(0)
	if isIPv6(endpoint) {
		_ = sock.SetIpv6(true)
	}
	if err := sock.Connect(endpoint); err != nil {
		sock.Close()
		return nil, fmt.Errorf("connect %s: %w", endpoint, err)
	}
	return &ReqConn{sock: sock, endpoint: endpoint}, nil
}

// Request sends frames and waits up to timeout for the reply.
func (c *ReqConn) Request(ctx context.Context, frames [][]byte, timeout time.Duration) ([][]byte, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.stuck {
		return nil, fmt.Errorf("%s: an earlier request got no reply, so this REQ socket cannot send", c.endpoint)
	}
	if _, err := c.sock.SendMessage(toAny(frames)...); err != nil {
		return nil, fmt.Errorf("send to %s: %w", c.endpoint, err)
	}
	reply, err := recvWithin(ctx, c.sock, c.endpoint, timeout)
	if err != nil {
		c.stuck = true
	}
	return reply, err
}

// Close closes the socket.
func (c *ReqConn) Close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.sock.Close()
}

func recvWithin(ctx context.Context, sock *zmq.Socket, endpoint string, timeout time.Duration) ([][]byte, error) {
	poller := zmq.NewPoller()
	poller.Add(sock, zmq.POLLIN)
	deadline := time.Now().Add(timeout)
	for {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		left := time.Until(deadline)
		if left <= 0 {
			return nil, fmt.Errorf("%s: no reply within %v", endpoint, timeout)
		}
		polled, err := poller.Poll(min(left, pollEvery))
		if err != nil && !errors.Is(err, zmq.Errno(4)) { // EINTR
			return nil, err
		}
		if len(polled) > 0 {
			return sock.RecvMessageBytes(0)
		}
	}
}

// Dealer is a DEALER socket to one peer; Send and Recv never overlap.
type Dealer struct {
	mu       sync.Mutex
	sock     *zmq.Socket
	endpoint string
}

// Send sends [“”, frames...] (the empty delimiter a ROUTER expects from
// REQ-style peers).
func (d *Dealer) Send(frames [][]byte) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	_, err := d.sock.SendMessage(toAny(append([][]byte{{}}, frames...))...)
	return err
}

// Recv waits up to timeout for one reply and strips the delimiter.
func (d *Dealer) Recv(ctx context.Context, timeout time.Duration) ([][]byte, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	msg, err := recvWithin(ctx, d.sock, d.endpoint, timeout)
	if err != nil {
		return nil, err
	}
	if len(msg) == 0 || len(msg[0]) != 0 {
		return nil, fmt.Errorf("%s: malformed reply (no empty delimiter)", d.endpoint)
	}
	return msg[1:], nil
}

// Close closes the socket.
func (d *Dealer) Close() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.sock.Close()
}

// Pull is a bound PULL socket served by one goroutine (SGLang's per-rank
// inbox); every message goes to h.
type Pull struct {
	endpoint string
	done     chan struct{}
}

// ListenPull binds a PULL socket and hands every message to h until ctx ends.
func ListenPull(ctx context.Context, endpoint string, h func(frames [][]byte)) (*Pull, error) {
	sock, bound, err := bind(zmq.PULL, endpoint)
	if err != nil {
		return nil, err
	}
	p := &Pull{endpoint: bound, done: make(chan struct{})}
	go func() {
		defer close(p.done)
		defer sock.Close()
		pollLoop(ctx, func(_ *zmq.Socket, msg [][]byte) bool {
			h(msg)
			return true
		}, sock)
	}()
	return p, nil
}

// Endpoint is where the socket listens.
func (p *Pull) Endpoint() string { return p.endpoint }

// Wait blocks until the socket is closed.
func (p *Pull) Wait() { <-p.done }

// Push is a PUSH socket to one peer, as SGLang's senders use.
type Push struct {
	mu   sync.Mutex
	sock *zmq.Socket
}

// DialPush connects a PUSH socket; sends fail after sendTimeout instead of
// blocking forever on a dead peer.
func DialPush(endpoint string, sendTimeout time.Duration) (*Push, error) {
	sock, err := zmq.NewSocket(zmq.PUSH)
	if err != nil {
		return nil, err
	}
	_ = sock.SetLinger(0)
	_ = sock.SetSndtimeo(sendTimeout)
	if isIPv6(endpoint) {
		_ = sock.SetIpv6(true) // SGLang's _connect does the same
	}
	if err := sock.Connect(endpoint); err != nil {
		sock.Close()
		return nil, fmt.Errorf("connect %s: %w", endpoint, err)
	}
	return &Push{sock: sock}, nil
}

// Send sends one multipart message.
func (p *Push) Send(frames [][]byte) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	_, err := p.sock.SendMessage(toAny(frames)...)
	return err
}

// Close closes the socket.
func (p *Push) Close() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.sock.Close()
}

// isIPv6 reports whether a tcp:// endpoint names an IPv6 address
// ("tcp://[::1]:5600"): libzmq refuses those unless the socket has
// ZMQ_IPV6 set.
func isIPv6(endpoint string) bool {
	return strings.HasPrefix(strings.TrimPrefix(endpoint, "tcp://"), "[")
}

func bind(kind zmq.Type, endpoint string) (*zmq.Socket, string, error) {
	sock, err := zmq.NewSocket(kind)
	if err != nil {
		return nil, "", err
	}
	_ = sock.SetLinger(0)
	if isIPv6(endpoint) {
		_ = sock.SetIpv6(true)
	}
	ep := endpoint
	if strings.HasPrefix(ep, "tcp://") && strings.HasSuffix(ep, ":0") {
		ep = strings.TrimSuffix(ep, ":0") + ":*"
	}
	if err := sock.Bind(ep); err != nil {
		sock.Close()
		return nil, "", fmt.Errorf("bind %s: %w", endpoint, err)
	}
	bound, err := sock.GetLastEndpoint()
	if err != nil {
		bound = endpoint
	}
	return sock, bound, nil
}

func toAny(frames [][]byte) []any {
	out := make([]any, len(frames))
	for i, f := range frames {
		out[i] = f
	}
	return out
}
