package ctl

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"sync"

	"github.com/nixlctl/nixlctl/internal/mono"
)

// Handler answers one request. Its result is sent as JSON; an error is
// sent as the reply's error string.
type Handler func(ctx context.Context, params json.RawMessage) (any, error)

// Role registers a role's handlers on a fresh server, one per session,
// and returns what releases the role's resources once the session ended
// (nil if nothing).
type Role func(s *Server) (release func())

// maxLine bounds one request: agent metadata and descriptor lists are the
// largest things sent, far below it.
const maxLine = 256 << 20

// Server dispatches requests to handlers, each on its own goroutine, so a
// slow request never holds up the others; replies carry the request's id.
type Server struct {
	mu       sync.Mutex // one line at a time on w
	enc      *json.Encoder
	handlers map[string]Handler
	onClose  Handler
	wg       sync.WaitGroup
	runMu    sync.Mutex
	running  map[uint64]context.CancelFunc // requests running, by id (cancelMethod)
	local    net.Addr                      // the server's end of a TCP session
	sysRoot  string                        // ctl.netstat reads counters here; "" is /sys (tests set a fake tree)
}

// NewServer writes replies and events to w.
func NewServer(w io.Writer) *Server {
	return &Server{enc: json.NewEncoder(w), handlers: map[string]Handler{}}
}

// Handle registers a method. Register everything before Serve.
func (s *Server) Handle(method string, h Handler) { s.handlers[method] = h }

// OnClose sets what answers a "close" request, after every running request
// was answered (the leak peer's final counters); without it the answer is
// an empty object.
func (s *Server) OnClose(h Handler) { s.onClose = h }

// Emit sends an event. It is safe from any goroutine; an event that
// cannot be encoded or sent is dropped, since nobody waits for it.
func (s *Server) Emit(event string, data any) {
	b, err := json.Marshal(data)
	if err != nil {
		return
	}
	s.send(Message{Event: event, Data: b})
}

func (s *Server) send(m Message) {
	s.mu.Lock()
	defer s.mu.Unlock()
	// A write error means the client is gone; reading ends the session.
	_ = s.enc.Encode(m)
}

func (s *Server) reply(id uint64, res any, err error) {
	m := Message{ID: id}
	if err == nil {
		if res == nil {
			res = struct{}{}
		}
		m.Result, err = json.Marshal(res)
	}
	if err != nil {
		m.Result, m.Error = nil, err.Error()
	}
	s.send(m)
}

// Serve reads requests from r until a "close" request, EOF or the end of
// ctx, and returns once every running request has been answered.
func (s *Server) Serve(ctx context.Context, r io.Reader) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	defer s.wg.Wait()
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<20), maxLine)
	lines := make(chan []byte)
	go func() {
		defer close(lines)
		for sc.Scan() {
			select {
			case lines <- append([]byte(nil), sc.Bytes()...):
			case <-ctx.Done():
				return
			}
		}
	}()
	for {
		var line []byte
		select {
		case <-ctx.Done():
			return ctx.Err()
		case l, ok := <-lines:
			if !ok {
				return sc.Err()
			}
			line = l
		}
		received := mono.Now()
		var m Message
		if err := json.Unmarshal(line, &m); err != nil || m.Method == "" {
			if err == nil {
				err = errors.New("no method")
			}
			s.reply(m.ID, nil, fmt.Errorf("malformed request: %w", err))
			continue
		}
		if s.answerBuiltin(m, received) {
			continue
		}
		if m.Method == cancelMethod {
			var p cancelParams
			if json.Unmarshal(m.Params, &p) == nil {
				s.cancelRunning(p.ID)
			}
			continue
		}
		if m.Method == closeMethod {
			s.wg.Wait()
			var res any
			var err error
			if s.onClose != nil {
				res, err = s.onClose(ctx, m.Params)
			}
			s.reply(m.ID, res, err)
			return nil
		}
		h, ok := s.handlers[m.Method]
		if !ok {
			s.reply(m.ID, nil, fmt.Errorf("unknown method %q", m.Method))
			continue
		}
		s.wg.Add(1)
		// While the request runs, its context ends with the session or a
		// cancel from the caller. Once answered it is left alone: a role
		// may keep what it started with it (an engine made by "setup");
		// the role's release function stops that.
		hctx, hcancel := context.WithCancel(context.WithoutCancel(ctx))
		stop := context.AfterFunc(ctx, hcancel)
		s.track(m.ID, hcancel)
		go func() {
			defer s.wg.Done()
			res, err := h(hctx, m.Params)
			stop()
			s.untrack(m.ID)
			s.reply(m.ID, res, err)
		}()
	}
}

// Serve runs one session of role on r and w, then releases the role.
func Serve(ctx context.Context, r io.Reader, w io.Writer, role Role) error {
	s := NewServer(w)
	release := role(s)
	err := s.Serve(ctx, r)
	if release != nil {
		release()
	}
	return err
}

// ServeConn runs one session of role on a connection; the role sees the
// connection's local address (Server.LocalAddr).
func ServeConn(ctx context.Context, conn net.Conn, role Role) error {
	s := NewServer(conn)
	s.local = conn.LocalAddr()
	release := role(s)
	err := s.Serve(ctx, conn)
	if release != nil {
		release()
	}
	return err
}

// ServeListener accepts one driver at a time on ln, each a fresh session
// of role, until ctx ends (which closes ln).
func ServeListener(ctx context.Context, ln net.Listener, role Role, log *slog.Logger) error {
	stop := context.AfterFunc(ctx, func() { ln.Close() })
	defer stop()
	for {
		conn, err := ln.Accept()
		if err != nil {
			if ctx.Err() != nil || errors.Is(err, net.ErrClosed) {
				return ctx.Err()
			}
			return err
		}
		// A driver whose host vanished ends the session within seconds.
		TuneConn(conn)
		log.Info("driver connected", "from", conn.RemoteAddr())
		err = ServeConn(ctx, conn, role)
		conn.Close()
		if err != nil {
			log.Warn("session ended", "err", err)
		}
	}
}

// HandleSerial registers f for every method in methods, answering one
// request at a time: for roles whose state is a plain struct that one
// driver steps through (the xfer target, the encoder, the leak peer).
func HandleSerial[P any](s *Server, methods []string, f func(ctx context.Context, method string, p P) (any, error)) {
	var mu sync.Mutex
	for _, m := range methods {
		s.Handle(m, Typed(func(ctx context.Context, p P) (any, error) {
			mu.Lock()
			defer mu.Unlock()
			return f(ctx, m, p)
		}))
	}
}

// Typed adapts a handler of decoded params; absent params decode as P's
// zero value.
func Typed[P any](f func(context.Context, P) (any, error)) Handler {
	return func(ctx context.Context, raw json.RawMessage) (any, error) {
		var p P
		if len(raw) > 0 {
			if err := json.Unmarshal(raw, &p); err != nil {
				return nil, fmt.Errorf("params: %w", err)
			}
		}
		return f(ctx, p)
	}
}

// track keeps a running request's cancel function under its id (ids are
// the client's; 0, a request that wants no answer, is not tracked).
func (s *Server) track(id uint64, cancel context.CancelFunc) {
	if id == 0 {
		return
	}
	s.runMu.Lock()
	if s.running == nil {
		s.running = map[uint64]context.CancelFunc{}
	}
	s.running[id] = cancel
	s.runMu.Unlock()
}

func (s *Server) untrack(id uint64) {
	if id == 0 {
		return
	}
	s.runMu.Lock()
	delete(s.running, id)
	s.runMu.Unlock()
}

func (s *Server) cancelRunning(id uint64) {
	s.runMu.Lock()
	cancel := s.running[id]
	s.runMu.Unlock()
	if cancel != nil {
		cancel()
	}
}
