package ctl

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// Client calls a Server: a child process, a goroutine of this process or
// a remote process over TCP. Calls may run concurrently from any
// goroutine; each waits for its own reply.
type Client struct {
	wmu sync.Mutex // one request line at a time; never held while reading
	w   io.WriteCloser

	mu      sync.Mutex
	next    uint64
	pending map[uint64]chan Message
	err     error // why no more replies will come
	events  chan Event
	done    chan struct{} // the reader has stopped

	// What is at the other end: proc and exited for a child, served for a
	// goroutine; hangup closes the read side so that the reader stops.
	proc     *os.Process
	exited   chan struct{}
	exitErr  error
	served   chan struct{}
	serveErr error
	hangup   func()
	unwatch  func() bool
	local    net.Addr // this end of a TCP connection (Dial)

	closeOnce sync.Once
	closeRes  json.RawMessage
	closeErr  error
}

// eventBuffer is how many events wait for a reader before the oldest are
// dropped: replies must never queue behind events nobody reads.
const eventBuffer = 4096

func newClient(r io.Reader, w io.WriteCloser, hangup func()) *Client {
	c := &Client{w: w, pending: map[uint64]chan Message{}, events: make(chan Event, eventBuffer),
		done: make(chan struct{}), hangup: hangup}
	go c.read(r)
	return c
}

// Cmd says which child to start.
type Cmd struct {
	Exe    string    // default: this program (SelfExe)
	Args   []string  // nixlctl: serve ROLE --stdio
	Env    []string  // the child's whole environment; nil inherits this process's
	Stderr io.Writer // the child's stderr; nil discards it
	// Grace is how long a child may take to close when ctx ends before it
	// is killed (default DefaultGrace): time to unlink its shared-memory
	// files and release its blocks, which a SIGKILL would leave behind.
	Grace time.Duration
}

// DefaultGrace is Cmd.Grace's default.
const DefaultGrace = 5 * time.Second

// Start runs a child whose stdin and stdout are the channel. The child
// dies with this process (Pdeathsig); when ctx ends it is asked to close
// and killed only if it has not within Cmd.Grace. Pass a context without
// cancellation to keep it for collecting results after an interrupt.
func Start(ctx context.Context, cmd Cmd) (*Client, error) {
	exe := cmd.Exe
	if exe == "" {
		var err error
		if exe, err = SelfExe(); err != nil {
			return nil, err
		}
	}
	// Our own pipes rather than exec's: Wait closes exec's pipes as soon as
	// the child exits, which would lose the replies and events still
	// buffered in them.
	inR, inW, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	outR, outW, err := os.Pipe()
	if err != nil {
		inR.Close()
		inW.Close()
		return nil, err
	}
	x := exec.Command(exe, cmd.Args...)
	x.Env, x.Stdin, x.Stdout, x.Stderr = cmd.Env, inR, outW, cmd.Stderr
	x.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	err = x.Start()
	inR.Close()
	outW.Close()
	if err != nil {
		inW.Close()
		outR.Close()
		return nil, fmt.Errorf("start %s: %w", filepath.Base(exe), err)
	}
	c := newClient(outR, inW, func() { outR.Close() })
	c.proc, c.exited = x.Process, make(chan struct{})
	go func() {
		c.exitErr = x.Wait()
		close(c.exited)
	}()
	grace := cmd.Grace
	if grace <= 0 {
		grace = DefaultGrace
	}
	c.unwatch = context.AfterFunc(ctx, func() { go func() { _ = c.Close(grace, nil) }() })
	return c, nil
}

// StartInProcess serves role on a goroutine of this process over pipes,
// until the client closes it or ctx ends.
func StartInProcess(ctx context.Context, role Role) *Client {
	reqR, reqW := io.Pipe()
	repR, repW := io.Pipe()
	c := newClient(repR, reqW, func() { repR.Close() })
	c.served = make(chan struct{})
	go func() {
		c.serveErr = Serve(ctx, reqR, repW, role)
		repW.Close()
		reqR.Close()
		close(c.served)
	}()
	return c
}

// Dial connects to a server listening on addr (host:port, optionally
// prefixed with tcp://), as `nixlctl serve ROLE --listen` does.
func Dial(ctx context.Context, addr string) (*Client, error) {
	var d net.Dialer
	conn, err := d.DialContext(ctx, "tcp", strings.TrimPrefix(addr, "tcp://"))
	if err != nil {
		return nil, err
	}
	TuneConn(conn)
	return NewConnClient(conn), nil
}

// KeepAlive is the TCP keep-alive of control connections: an endpoint
// whose host crashed or dropped off the network sends no FIN, and with
// Go's defaults (15 s idle, then 9 probes 15 s apart) the driver would
// learn of it after two and a half minutes; with these, within about 8 s.
var KeepAlive = net.KeepAliveConfig{Enable: true, Idle: 3 * time.Second, Interval: time.Second, Count: 5}

// UserTimeout bounds how long sent data may go unacknowledged before the
// kernel drops the connection (TCP_USER_TIMEOUT). Keep-alive probes only
// run on an idle connection; one with a request in flight to a vanished
// host would otherwise retransmit for about 15 minutes.
const UserTimeout = 10 * time.Second

// TuneConn gives a control connection KeepAlive and UserTimeout, so that
// either end learns within seconds that the other's host is gone. Other
// kinds of connection are left as they are.
func TuneConn(c net.Conn) {
	tc, ok := c.(*net.TCPConn)
	if !ok {
		return
	}
	_ = tc.SetKeepAliveConfig(KeepAlive)
	if raw, err := tc.SyscallConn(); err == nil {
		_ = raw.Control(func(fd uintptr) {
			_ = unix.SetsockoptInt(int(fd), unix.IPPROTO_TCP, unix.TCP_USER_TIMEOUT, int(UserTimeout/time.Millisecond))
		})
	}
}

// NewConnClient calls a server at the other end of conn, a connection
// made some other way than Dial: one an endpoint dialled to the driver
// and serves on (a reverse rendezvous member). Close half-closes conn for
// the reply to "close", then closes it.
func NewConnClient(conn net.Conn) *Client {
	c := newClient(conn, halfCloser{conn}, func() { conn.Close() })
	c.local = conn.LocalAddr()
	return c
}

// LocalAddr is this end of a dialled connection (nil for children and
// in-process servers): the address by which this host reaches the
// server's, so what a local endpoint should advertise to it.
func (c *Client) LocalAddr() net.Addr { return c.local }

// halfCloser ends the requests but keeps the connection open for the
// reply to "close".
type halfCloser struct{ net.Conn }

func (h halfCloser) Close() error {
	if t, ok := h.Conn.(interface{ CloseWrite() error }); ok {
		return t.CloseWrite()
	}
	return nil
}

// SelfExe is the path to run this program again as a child: the name it
// was started as when that resolves (a test harness may run it under
// another name, as testscript does), else the running executable.
func SelfExe() (string, error) {
	if p, err := exec.LookPath(os.Args[0]); err == nil {
		if abs, err := filepath.Abs(p); err == nil {
			return abs, nil
		}
	}
	return os.Executable()
}

func (c *Client) read(r io.Reader) {
	br := bufio.NewReaderSize(r, 64<<10)
	var err error
	for {
		line, rerr := br.ReadBytes('\n')
		if len(bytes.TrimSpace(line)) > 0 {
			var m Message
			if jerr := json.Unmarshal(line, &m); jerr != nil {
				err = fmt.Errorf("bad message %.80q: %w", line, jerr)
				break
			}
			c.deliver(m)
		}
		if rerr != nil {
			err = rerr
			break
		}
	}
	c.mu.Lock()
	c.err = fmt.Errorf("%w: %w", ErrLost, err)
	for id, ch := range c.pending {
		close(ch)
		delete(c.pending, id)
	}
	c.mu.Unlock()
	// After garbage the stream cannot be trusted, but the server must
	// never block writing to a pipe nobody reads.
	_, _ = io.Copy(io.Discard, br)
	close(c.done)
}

func (c *Client) deliver(m Message) {
	if m.Event != "" {
		ev := Event{m.Event, m.Data}
		select {
		case c.events <- ev:
		default:
			select {
			case <-c.events: // drop the oldest rather than block replies
			default:
			}
			select {
			case c.events <- ev:
			default:
			}
		}
		return
	}
	c.mu.Lock()
	ch := c.pending[m.ID]
	delete(c.pending, m.ID)
	c.mu.Unlock()
	if ch != nil {
		ch <- m
	}
}

// Events delivers what the server reported on its own. Events are
// buffered; a consumer that falls behind loses the oldest.
func (c *Client) Events() <-chan Event { return c.events }

// Done is closed when nothing more will come from the server.
func (c *Client) Done() <-chan struct{} { return c.done }

// Lost says the channel is gone (calls fail with ErrLost), which can be
// a moment before Done is closed: a caller whose call just failed asks
// this rather than wait for Done.
func (c *Client) Lost() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.err != nil
}

// Why says why nothing more will come from the server, once Done is
// closed: how a child exited (waiting up to a second for its exit
// status), or what ended the connection.
func (c *Client) Why() string {
	if c.exited != nil {
		select {
		case <-c.exited:
			if c.exitErr != nil {
				return c.exitErr.Error()
			}
			return "exited"
		case <-time.After(time.Second):
		}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.err != nil {
		return c.err.Error()
	}
	return "connection closed"
}

func (c *Client) register() (uint64, chan Message, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.err != nil {
		return 0, nil, c.err
	}
	c.next++
	ch := make(chan Message, 1)
	c.pending[c.next] = ch
	return c.next, ch, nil
}

func (c *Client) forget(id uint64) {
	c.mu.Lock()
	delete(c.pending, id)
	c.mu.Unlock()
}

var (
	// ErrLost is why calls fail once the server went away (a child that
	// died, a dropped connection) or sent what cannot be parsed.
	ErrLost   = errors.New("control channel lost")
	errClosed = errors.New("control channel closed")
)

func (c *Client) write(m Message) error {
	b, err := json.Marshal(m)
	if err != nil {
		return err
	}
	c.wmu.Lock()
	defer c.wmu.Unlock()
	if c.w == nil {
		return errClosed
	}
	_, err = c.w.Write(append(b, '\n'))
	return err
}

// CallRole is Call for a typed client of a child role (an encoder, an
// xfer target): the reply decoded as R, an error prefixed with the role
// and method, since the caller's caller did not ask the child itself. It
// takes no context: a run still collects a child's counters, tags or
// notifications after an interrupt, and a child that died fails the call
// at once.
func CallRole[R any](c *Client, role, method string, params any) (R, error) {
	var rep R
	if err := c.Call(context.Background(), method, params, &rep); err != nil {
		var none R
		return none, fmt.Errorf("%s %s: %w", role, method, err)
	}
	return rep, nil
}

// Call sends a request and decodes its result into result (nil: ignore
// it). An error the server answered comes back as is; a server that went
// away fails every call at once. Errors do not name the method: the
// caller knows what it asked.
func (c *Client) Call(ctx context.Context, method string, params, result any) error {
	p, err := json.Marshal(params)
	if err != nil {
		return err
	}
	id, ch, err := c.register()
	if err != nil {
		return err
	}
	if err := c.write(Message{ID: id, Method: method, Params: p}); err != nil {
		c.forget(id)
		return err
	}
	select {
	case <-ctx.Done():
		c.forget(id)
		// Stop the work at the other end too (best effort: a server that
		// is gone needs no telling).
		if b, err := json.Marshal(cancelParams{ID: id}); err == nil {
			_ = c.write(Message{Method: cancelMethod, Params: b})
		}
		return ctx.Err()
	case m, ok := <-ch:
		if !ok {
			c.mu.Lock()
			defer c.mu.Unlock()
			return c.err
		}
		if m.Error != "" {
			return errors.New(m.Error)
		}
		if result != nil {
			if err := json.Unmarshal(m.Result, result); err != nil {
				return fmt.Errorf("result: %w", err)
			}
		}
		return nil
	}
}

// PID is the child's process id (0 for a server not started by Start).
func (c *Client) PID() int {
	if c.proc == nil {
		return 0
	}
	return c.proc.Pid
}

// Signal sends the child a signal (fault tests and chaos).
func (c *Client) Signal(sig syscall.Signal) error {
	if c.proc == nil {
		return errors.New("the server is not a child process")
	}
	return c.proc.Signal(sig)
}

// Close asks the server to close and waits up to grace for its answer
// and, for a child, its exit; a child still running then is killed. The
// answer to "close" is decoded into result (when not nil and answered).
// It returns how the child exited (nil: cleanly) or why the server did
// not stop; calling it again returns the same.
func (c *Client) Close(grace time.Duration, result any) error {
	c.closeOnce.Do(func() { c.closeRes, c.closeErr = c.shutdown(grace) })
	if result != nil && c.closeRes != nil {
		if err := json.Unmarshal(c.closeRes, result); err != nil && c.closeErr == nil {
			return fmt.Errorf("close: result: %w", err)
		}
	}
	return c.closeErr
}

func (c *Client) shutdown(grace time.Duration) (json.RawMessage, error) {
	if c.unwatch != nil {
		defer c.unwatch()
	}
	ctx, cancel := context.WithTimeout(context.Background(), grace)
	defer cancel()
	var res json.RawMessage
	var err error
	id, ch, rerr := c.register()
	if rerr == nil {
		if rerr = c.write(Message{ID: id, Method: closeMethod}); rerr != nil {
			c.forget(id)
		}
	}
	c.wmu.Lock()
	if c.w != nil {
		_ = c.w.Close() // EOF ends a server that missed the request
		c.w = nil
	}
	c.wmu.Unlock()
	if rerr == nil {
		select {
		case m, ok := <-ch:
			if ok && m.Error != "" {
				err = fmt.Errorf("close: %s", m.Error)
			} else if ok {
				res = m.Result
			}
		case <-ctx.Done():
		}
	}
	switch {
	case c.exited != nil:
		select {
		case <-c.exited:
			if c.exitErr != nil {
				err = c.exitErr
			}
		case <-ctx.Done():
			_ = c.proc.Kill()
			<-c.exited
			err = fmt.Errorf("still running %v after close, killed: %w", grace, c.exitErr)
		}
	case c.served != nil:
		select {
		case <-c.served:
			if c.serveErr != nil {
				err = c.serveErr
			}
		case <-ctx.Done():
			err = fmt.Errorf("in-process server still running %v after close", grace)
		}
	}
	// Let the reader take what the server sent before it went (events a
	// caller drains after Done), then stop it for good.
	select {
	case <-c.done:
	case <-time.After(time.Second):
	}
	c.hangup()
	<-c.done
	return res, err
}

// EachEvent hands f the peer's events until the connection is gone and
// what the peer sent before that is drained.
func (c *Client) EachEvent(f func(Event)) {
	for {
		select {
		case ev := <-c.Events():
			f(ev)
		case <-c.Done():
			for {
				select {
				case ev := <-c.Events():
					f(ev)
				default:
					return
				}
			}
		}
	}
}
