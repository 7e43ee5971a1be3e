package rendezvous

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nixlctl/nixlctl/internal/ctl"
)

// answer is the driver's one line back to a hello.
type answer struct {
	OK     bool   `json:"ok,omitempty"`
	Addr   string `json:"addr,omitempty"` // where the driver will dial the member
	Reason string `json:"reason,omitempty"`
	Error  string `json:"error,omitempty"`
}

// bufConn reads through the reader that took the hello (or its answer),
// so nothing it buffered past that line is lost to the control channel.
type bufConn struct {
	net.Conn
	r        *bufio.Reader
	stopping atomic.Bool   // the watcher is being stopped, not the peer gone
	watched  chan struct{} // closed when the watcher returned
}

func (c *bufConn) Read(p []byte) (int, error) { return c.r.Read(p) }

// CloseWrite lets ctl's client half-close for the reply to "close".
func (c *bufConn) CloseWrite() error {
	if t, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return t.CloseWrite()
	}
	return nil
}

type tcpDriver struct {
	ln      net.Listener
	b       *board
	timeout time.Duration
	wg      sync.WaitGroup
	mu      sync.Mutex
	conns   map[net.Conn]struct{}
	closing bool
}

// Listen makes a TCP driver listening on addr (HOST:PORT, optionally
// tcp://): members Join it. The roster must be valid. When ctx ends the
// listener closes; Close releases everything.
func Listen(ctx context.Context, addr string, expect Roster, opt Options) (*Driver, error) {
	if err := expect.Validate(); err != nil {
		return nil, err
	}
	var lc net.ListenConfig
	ln, err := lc.Listen(ctx, "tcp", strings.TrimPrefix(addr, "tcp://"))
	if err != nil {
		return nil, err
	}
	t := &tcpDriver{ln: ln, b: newBoard(expect, opt.log()), timeout: opt.helloTimeout(), conns: map[net.Conn]struct{}{}}
	t.b.finish = t.handOver
	unwatch := context.AfterFunc(ctx, func() { ln.Close() })
	t.wg.Add(1)
	go t.accept()
	t.b.log.Info("rendezvous: listening", "addr", ln.Addr().String(), "run", expect.Run, "roster", slotList(expect.Slots()))
	return &Driver{b: t.b, addr: ln.Addr().String(), stop: func() error {
		unwatch()
		return t.close()
	}}, nil
}

func (t *tcpDriver) accept() {
	defer t.wg.Done()
	for {
		conn, err := t.ln.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) || t.isClosing() {
				return
			}
			// Out of descriptors and the like: the members already in
			// must not lose their driver over it.
			t.b.log.Warn("rendezvous: accept", "err", err)
			time.Sleep(50 * time.Millisecond)
			continue
		}
		if !t.track(conn) {
			conn.Close()
			return
		}
		// A reverse member's control channel: its host vanishing must
		// end the run within seconds, as a dialled endpoint's does.
		ctl.TuneConn(conn)
		t.wg.Add(1)
		go t.handle(conn)
	}
}

func (t *tcpDriver) track(c net.Conn) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closing {
		return false
	}
	t.conns[c] = struct{}{}
	return true
}

func (t *tcpDriver) isClosing() bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.closing
}

func (t *tcpDriver) close() error {
	t.mu.Lock()
	t.closing = true
	err := t.ln.Close()
	for c := range t.conns {
		c.Close()
	}
	t.mu.Unlock()
	t.wg.Wait()
	if errors.Is(err, net.ErrClosed) {
		err = nil // ctx ended first
	}
	return err
}

func writeAnswer(c net.Conn, a answer) error {
	b, err := json.Marshal(a)
	if err != nil {
		return err
	}
	_, err = c.Write(append(b, '\n'))
	return err
}

// handle takes one connection's hello, answers it and, if it joined,
// watches the connection until the member leaves (or, for a reverse
// member, until Wait hands the connection over).
func (t *tcpDriver) handle(conn net.Conn) {
	defer t.wg.Done()
	from := conn.RemoteAddr().String()
	bc := &bufConn{Conn: conn, r: bufio.NewReaderSize(conn, MaxHello), watched: make(chan struct{})}
	refuse := func(rej *RejectedError) {
		// Best effort, and never long: the hello's deadline may be spent.
		_ = conn.SetWriteDeadline(time.Now().Add(time.Second))
		_ = writeAnswer(conn, answer{Reason: rej.Reason, Error: rej.Detail})
		conn.Close()
	}
	_ = conn.SetDeadline(time.Now().Add(t.timeout))
	line, err := bc.r.ReadSlice('\n')
	if err != nil {
		if t.isClosing() {
			conn.Close()
			return
		}
		var detail string
		switch {
		case errors.Is(err, bufio.ErrBufferFull):
			detail = fmt.Sprintf("no newline in the first %d bytes", MaxHello)
		case errors.Is(err, os.ErrDeadlineExceeded):
			detail = fmt.Sprintf("no hello line within %v", t.timeout)
		case errors.Is(err, io.EOF):
			detail = fmt.Sprintf("closed after %d bytes without a hello line", len(line))
		default:
			detail = "reading the hello: " + err.Error()
		}
		refuse(t.b.reject(RejectGarbage, detail, from))
		return
	}
	h, err := DecodeHello(line)
	if err != nil {
		refuse(t.b.reject(RejectGarbage, err.Error(), from))
		return
	}
	e := &entry{m: Member{Hello: h, From: from, Joined: time.Now()}, conn: bc}
	if h.Ctl != Reverse {
		e.m.Addr = advertise(h.Ctl, conn.RemoteAddr())
	}
	if rej := t.b.reserve(e); rej != nil {
		refuse(rej)
		return
	}
	if err := writeAnswer(conn, answer{OK: true, Addr: e.m.Addr}); err != nil {
		t.b.leave(e, "answering the hello: "+err.Error())
		conn.Close()
		return
	}
	_ = conn.SetDeadline(time.Time{})
	t.b.commit(e)
	why := t.watch(bc, h.Ctl == Reverse)
	close(bc.watched)
	if why != "" && !t.isClosing() {
		t.b.leave(e, why)
	}
}

// watch returns why the member is gone, or "" when watching stopped
// without it going: a reverse member handed over or that sent data (its
// control channel is then the caller's to watch).
func (t *tcpDriver) watch(bc *bufConn, reverse bool) string {
	if !reverse {
		// A member sends nothing after its hello; anything it does send
		// is dropped, and the end of the connection is the member's.
		_, err := io.Copy(io.Discard, bc.r)
		return goneWhy(err)
	}
	_, err := bc.r.Peek(1)
	switch {
	case err == nil:
		return ""
	case bc.stopping.Load() && errors.Is(err, os.ErrDeadlineExceeded):
		return ""
	}
	return goneWhy(err)
}

func goneWhy(err error) string {
	if err == nil || errors.Is(err, io.EOF) {
		return "connection closed"
	}
	return err.Error()
}

// handOver stops watching reverse members' connections so that the
// caller can run ctl clients on them.
func (t *tcpDriver) handOver(ready []*entry) {
	for _, e := range ready {
		if e.m.Hello.Ctl != Reverse {
			continue
		}
		bc := e.conn
		bc.stopping.Store(true)
		_ = bc.SetReadDeadline(time.Now())
		<-bc.watched
		_ = bc.SetReadDeadline(time.Time{})
		e.m.Conn = bc
	}
}

// advertise replaces an unspecified host in a member's control address
// with the address its hello came from.
func advertise(ctl string, remote net.Addr) string {
	host, port, err := net.SplitHostPort(ctl)
	if err != nil {
		return ctl
	}
	if ip := net.ParseIP(host); host != "" && (ip == nil || !ip.IsUnspecified()) {
		return ctl
	}
	if ta, ok := remote.(*net.TCPAddr); ok {
		return net.JoinHostPort(ta.IP.String(), port)
	}
	return ctl
}

// Registration is a member's side of the rendezvous; Close leaves it.
type Registration struct {
	conn    *bufConn // TCP
	done    chan struct{}
	watcher sync.WaitGroup
	addr    string
	etcd    *etcdMember
	once    sync.Once
	err     error
}

// Conn, for a reverse TCP member, is the connection to serve the control
// channel on (ctl.Serve(ctx, conn, conn, role)); nil otherwise.
func (r *Registration) Conn() net.Conn {
	if r.conn == nil || r.done != nil {
		return nil
	}
	return r.conn
}

// Addr is where the driver will reach this member's control channel (as
// the driver resolved it, TCP; as advertised, etcd); empty for reverse.
func (r *Registration) Addr() string { return r.addr }

// Done is closed when the member is no longer registered: the driver
// closed the connection (TCP), or the lease was lost (etcd). Nil for a
// reverse member, whose control channel ends instead.
func (r *Registration) Done() <-chan struct{} { return r.done }

// Close leaves the rendezvous: closes the connection (TCP), or revokes
// the lease so that the key goes at once (etcd).
func (r *Registration) Close() error {
	r.once.Do(func() {
		if r.etcd != nil {
			r.err = r.etcd.close()
			return
		}
		r.err = r.conn.Close()
		r.watcher.Wait()
	})
	return r.err
}

// Join announces h to the TCP driver at driver (HOST:PORT, optionally
// tcp://) and waits for its answer: a *RejectedError when turned away.
// The connection stays open as this member's liveness (or, reverse, as its
// control channel) until Close.
func Join(ctx context.Context, driver string, h Hello, opt Options) (*Registration, error) {
	line, err := h.Encode()
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, opt.helloTimeout())
	defer cancel()
	// A reverse member serves the driver on this connection: it must
	// notice a vanished driver as a dialled endpoint does.
	var d net.Dialer
	conn, err := d.DialContext(ctx, "tcp", strings.TrimPrefix(driver, "tcp://"))
	if err != nil {
		return nil, fmt.Errorf("rendezvous: %w", err)
	}
	ctl.TuneConn(conn)
	stop := context.AfterFunc(ctx, func() { _ = conn.SetDeadline(time.Now()) })
	bc := &bufConn{Conn: conn, r: bufio.NewReaderSize(conn, MaxHello)}
	a, err := handshake(bc, line)
	if !stop() || err != nil {
		conn.Close()
		if ctx.Err() != nil {
			return nil, fmt.Errorf("rendezvous: no answer from %s: %w", driver, ctx.Err())
		}
		return nil, fmt.Errorf("rendezvous: %s: %w", driver, err)
	}
	if !a.OK {
		conn.Close()
		return nil, &RejectedError{Reason: a.Reason, Detail: a.Error}
	}
	r := &Registration{conn: bc, addr: a.Addr}
	if h.Ctl != Reverse {
		r.done = make(chan struct{})
		r.watcher.Add(1)
		go func() {
			defer r.watcher.Done()
			_, _ = io.Copy(io.Discard, bc.r)
			close(r.done)
		}()
	}
	return r, nil
}

func handshake(bc *bufConn, line []byte) (answer, error) {
	var a answer
	if _, err := bc.Write(line); err != nil {
		return a, err
	}
	reply, err := bc.r.ReadSlice('\n')
	if err != nil {
		return a, fmt.Errorf("reading the answer: %w", err)
	}
	if err := json.Unmarshal(reply, &a); err != nil {
		return a, fmt.Errorf("bad answer %.80q: %w", reply, err)
	}
	return a, nil
}
