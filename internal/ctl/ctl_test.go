package ctl

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/nixlctl/nixlctl/internal/mono"
	"go.uber.org/goleak"
	"golang.org/x/sys/unix"
)

// The test binary doubles as the child processes, one behaviour per
// CTL_TEST_CHILD.
func TestMain(m *testing.M) {
	switch os.Getenv("CTL_TEST_CHILD") {
	case "":
		os.Exit(m.Run())
	case "serve":
		if err := ServeStdio(context.Background(), testRole(nil)); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		os.Exit(0)
	case "deaf": // reads requests, answers none, ignores EOF
		_, _ = io.Copy(io.Discard, os.Stdin)
		time.Sleep(time.Hour)
	case "garbage":
		fmt.Println("{not json")
		_, _ = io.Copy(io.Discard, os.Stdin)
		os.Exit(0)
	}
	os.Exit(2)
}

// testRole: echo (upper-cases, emits "saw"), wait (blocks until release
// is closed), die (exits 3), and a close answer of {"bye":true}.
func testRole(release <-chan struct{}) Role { return testRoleStarted(release, nil) }

// testRoleStarted is testRole whose "wait" says on started (when not
// nil) that it is running.
func testRoleStarted(release <-chan struct{}, started chan<- struct{}) Role {
	return func(s *Server) func() {
		s.Handle("echo", Typed(func(_ context.Context, in string) (any, error) {
			s.Emit("saw", in)
			if in == "fail" {
				return nil, errors.New("asked to fail")
			}
			return strings.ToUpper(in), nil
		}))
		s.Handle("wait", func(ctx context.Context, _ json.RawMessage) (any, error) {
			if started != nil {
				started <- struct{}{}
			}
			select {
			case <-release:
				return "released", nil
			case <-ctx.Done():
				return nil, ctx.Err()
			}
		})
		s.Handle("die", func(context.Context, json.RawMessage) (any, error) {
			os.Exit(3)
			return nil, nil
		})
		s.OnClose(func(context.Context, json.RawMessage) (any, error) { return map[string]bool{"bye": true}, nil })
		return nil
	}
}

func child(t *testing.T, mode string) *Client {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	c, err := Start(context.Background(), Cmd{Exe: exe, Args: []string{"-test.run=^$"},
		Env: append(os.Environ(), "CTL_TEST_CHILD="+mode), Stderr: os.Stderr})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func TestOutOfOrder(t *testing.T) {
	defer goleak.VerifyNone(t)
	release, started := make(chan struct{}), make(chan struct{}, 1)
	c := StartInProcess(context.Background(), testRoleStarted(release, started))
	var order []string
	var mu sync.Mutex
	note := func(s string) {
		mu.Lock()
		order = append(order, s)
		mu.Unlock()
	}
	waited := make(chan error, 1)
	go func() {
		var out string
		err := c.Call(context.Background(), "wait", nil, &out)
		note(out)
		waited <- err
	}()
	// The first request is still running: later ones are answered first.
	<-started
	for _, s := range []string{"a", "b"} {
		var out string
		if err := c.Call(context.Background(), "echo", s, &out); err != nil {
			t.Fatal(err)
		}
		note(out)
	}
	close(release)
	if err := <-waited; err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]string{"A", "B", "released"}, order); diff != "" {
		t.Errorf("answer order (-want +got):\n%s", diff)
	}
	var bye map[string]bool
	if err := c.Close(time.Second, &bye); err != nil {
		t.Fatal(err)
	}
	if !bye["bye"] {
		t.Errorf("close answered %v", bye)
	}
}

func TestErrorsAndEvents(t *testing.T) {
	defer goleak.VerifyNone(t)
	c := StartInProcess(context.Background(), testRole(nil))
	for _, tc := range []struct {
		method, param, want string
	}{
		{"echo", "fail", "asked to fail"},
		{"nope", "", `unknown method "nope"`},
	} {
		if err := c.Call(context.Background(), tc.method, tc.param, nil); err == nil || err.Error() != tc.want {
			t.Errorf("%s(%q): %v, want %q", tc.method, tc.param, err, tc.want)
		}
	}
	if err := c.Call(context.Background(), "echo", 42, nil); err == nil || !strings.Contains(err.Error(), "params") {
		t.Errorf("wrong params type: %v", err)
	}
	if err := c.Close(time.Second, nil); err != nil {
		t.Fatal(err)
	}
	<-c.Done()
	var got []string
	for len(c.Events()) > 0 {
		ev := <-c.Events()
		var s string
		_ = json.Unmarshal(ev.Data, &s)
		got = append(got, ev.Name+":"+s)
	}
	if diff := cmp.Diff([]string{"saw:fail"}, got); diff != "" {
		t.Errorf("events (-want +got):\n%s", diff)
	}
	if err := c.Call(context.Background(), "echo", "x", nil); err == nil {
		t.Error("a call after close succeeded")
	}
}

func TestCloseWaitsForRunning(t *testing.T) {
	defer goleak.VerifyNone(t)
	release, started := make(chan struct{}), make(chan struct{}, 1)
	c := StartInProcess(context.Background(), testRoleStarted(release, started))
	waited := make(chan error, 1)
	go func() { waited <- c.Call(context.Background(), "wait", nil, nil) }()
	// "wait" is running before "close" goes out. (An "echo" answered
	// first did not say so: the goroutine sending "wait" may not have
	// run yet, and CI once saw close return at once.)
	<-started
	closed := make(chan error, 1)
	go func() { closed <- c.Close(5*time.Second, nil) }()
	select {
	case err := <-closed:
		t.Fatalf("close returned while a request ran: %v", err)
	case <-time.After(50 * time.Millisecond):
	}
	close(release)
	if err := <-waited; err != nil {
		t.Errorf("running request: %v", err)
	}
	if err := <-closed; err != nil {
		t.Errorf("close: %v", err)
	}
}

// echoAndClose makes one call of testRole's echo, which answers in
// upper case, then closes the client, whose goodbye must come back.
func echoAndClose(t *testing.T, c *Client, in string) {
	t.Helper()
	var out string
	if err := c.Call(context.Background(), "echo", in, &out); err != nil || out != strings.ToUpper(in) {
		t.Fatalf("echo: %q %v", out, err)
	}
	var bye map[string]bool
	if err := c.Close(5*time.Second, &bye); err != nil || !bye["bye"] {
		t.Fatalf("close: %v %v", bye, err)
	}
}

func TestChild(t *testing.T) {
	defer goleak.VerifyNone(t)
	c := child(t, "serve")
	if c.PID() <= 0 {
		t.Errorf("pid %d", c.PID())
	}
	echoAndClose(t, c, "hi")
	ev := <-c.Events()
	if ev.Name != "saw" {
		t.Errorf("event %+v", ev)
	}
}

func TestChildDies(t *testing.T) {
	defer goleak.VerifyNone(t)
	c := child(t, "serve")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	err := c.Call(ctx, "die", nil, nil)
	if err == nil || ctx.Err() != nil || !strings.Contains(err.Error(), "control channel lost") {
		t.Fatalf("call to a dying child: %v (ctx %v)", err, ctx.Err())
	}
	if err := c.Call(ctx, "echo", "x", nil); err == nil {
		t.Error("a call after the child died succeeded")
	}
	if err := c.Close(5*time.Second, nil); err == nil || !strings.Contains(err.Error(), "exit status 3") {
		t.Errorf("close: %v, want exit status 3", err)
	}
}

func TestChildIgnoresClose(t *testing.T) {
	defer goleak.VerifyNone(t)
	c := child(t, "deaf")
	t0 := time.Now()
	err := c.Close(200*time.Millisecond, nil)
	if err == nil || !strings.Contains(err.Error(), "killed") {
		t.Errorf("close: %v, want killed", err)
	}
	if d := time.Since(t0); d < 200*time.Millisecond || d > 5*time.Second {
		t.Errorf("close took %v with a grace of 200ms", d)
	}
	if err2 := c.Close(time.Hour, nil); err2 != err {
		t.Errorf("second close: %v, want %v", err2, err)
	}
}

func TestBadJSONFromServer(t *testing.T) {
	defer goleak.VerifyNone(t)
	c := child(t, "garbage")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	err := c.Call(ctx, "echo", "x", nil)
	if err == nil || ctx.Err() != nil || !strings.Contains(err.Error(), "bad message") {
		t.Errorf("call: %v", err)
	}
	// The channel is lost as the call fails, while Done waits for the
	// server to stop writing (it is still running): a caller that must
	// act before its next call asks Lost.
	if !c.Lost() {
		t.Error("Lost() = false after a call failed on a lost channel")
	}
	if err := c.Close(5*time.Second, nil); err != nil {
		t.Errorf("close: %v", err)
	}
}

func TestBadJSONFromClient(t *testing.T) {
	defer goleak.VerifyNone(t)
	reqR, reqW := io.Pipe()
	repR, repW := io.Pipe()
	served := make(chan error, 1)
	go func() {
		served <- Serve(context.Background(), reqR, repW, testRole(nil))
		repW.Close()
	}()
	dec := json.NewDecoder(repR)
	for _, tc := range []struct{ in, want string }{
		{"{not json\n", "malformed request"},
		{`{"id":7}` + "\n", "malformed request: no method"},
		{`{"id":8,"method":"echo","params":"ok"}` + "\n", ""},
	} {
		if _, err := io.WriteString(reqW, tc.in); err != nil {
			t.Fatal(err)
		}
		var m Message
		if err := dec.Decode(&m); err != nil {
			t.Fatal(err)
		}
		if m.Event != "" { // echo's event comes before its reply
			if err := dec.Decode(&m); err != nil {
				t.Fatal(err)
			}
		}
		if !strings.HasPrefix(m.Error, tc.want) || (tc.want == "") != (m.Error == "") {
			t.Errorf("%q: answered %+v, want error %q", tc.in, m, tc.want)
		}
	}
	reqW.Close()
	if err := <-served; err != nil {
		t.Errorf("serve after EOF: %v", err)
	}
}

func TestDial(t *testing.T) {
	defer goleak.VerifyNone(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- ServeListener(ctx, ln, testRole(nil), slog.New(slog.DiscardHandler)) }()
	for range 2 { // one driver after another
		c, err := Dial(context.Background(), "tcp://"+ln.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		echoAndClose(t, c, "net")
	}
	cancel()
	if err := <-served; !errors.Is(err, context.Canceled) {
		t.Errorf("listener: %v", err)
	}
}

func TestHandleSerial(t *testing.T) {
	defer goleak.VerifyNone(t)
	var running, most int
	var mu sync.Mutex
	role := func(s *Server) func() {
		HandleSerial(s, []string{"a", "b"}, func(_ context.Context, method string, n int) (any, error) {
			mu.Lock()
			running++
			most = max(most, running)
			mu.Unlock()
			time.Sleep(5 * time.Millisecond) // long enough for the others to pile up
			mu.Lock()
			running--
			mu.Unlock()
			return fmt.Sprintf("%s%d", method, n), nil
		})
		return nil
	}
	c := StartInProcess(context.Background(), role)
	var wg sync.WaitGroup
	for i := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			method := []string{"a", "b"}[i%2]
			var out string
			if err := c.Call(context.Background(), method, i, &out); err != nil || out != fmt.Sprintf("%s%d", method, i) {
				t.Errorf("%s(%d): %q %v", method, i, out, err)
			}
		}()
	}
	wg.Wait()
	if most != 1 {
		t.Errorf("%d requests ran at once, want 1", most)
	}
	if err := c.Close(time.Second, nil); err != nil {
		t.Fatal(err)
	}
}

func TestClockOffsetSameHost(t *testing.T) {
	t.Parallel()
	c := StartInProcess(context.Background(), func(*Server) func() { return nil })
	defer c.Close(time.Second, nil)
	off, h, err := c.ClockOffset(context.Background(), 4)
	if err != nil {
		t.Fatal(err)
	}
	if !off.SameClock || off.Nanos != 0 {
		t.Errorf("in-process server: offset %v, want same host", off)
	}
	if h.Identity.BootID == "" || h.Hostname == "" {
		t.Errorf("host info %+v lacks the boot id or host name", h)
	}
}

// The clock built-in answers readings between the client's send and
// receive: on one clock, t0 <= t1 <= t2 <= t3.
func TestClockReadingsOrdered(t *testing.T) {
	t.Parallel()
	c := StartInProcess(context.Background(), func(*Server) func() { return nil })
	defer c.Close(time.Second, nil)
	for range 8 {
		var r clockReading
		t0 := mono.Now()
		if err := c.Call(context.Background(), clockMethod, nil, &r); err != nil {
			t.Fatal(err)
		}
		t3 := mono.Now()
		if !(t0 <= r.T1 && r.T1 <= r.T2 && r.T2 <= t3) {
			t.Fatalf("readings out of order: t0=%d t1=%d t2=%d t3=%d", t0, r.T1, r.T2, t3)
		}
	}
}

// A TCP session tells the role which local address the driver reached,
// and the dialling client knows its own end.
func TestServeConnLocalAddr(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	got := make(chan net.Addr, 1)
	go func() {
		_ = ServeListener(ctx, ln, func(s *Server) func() { got <- s.LocalAddr(); return nil }, slog.New(slog.DiscardHandler))
	}()
	c, err := Dial(ctx, "tcp://"+ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close(time.Second, nil)
	h, err := c.Host(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if a := <-got; a == nil || a.String() != ln.Addr().String() || h.Addr != ln.Addr().String() {
		t.Errorf("server's local address %v, host addr %q; want %v", a, h.Addr, ln.Addr())
	}
	if c.LocalAddr() == nil {
		t.Error("a dialled client has no local address")
	}
}

// TestNewConnClient reverses the roles of TestDial: the side that dialled
// serves, the side that accepted calls (a reverse rendezvous member).
func TestNewConnClient(t *testing.T) {
	defer goleak.VerifyNone(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	served := make(chan error, 1)
	go func() {
		conn, err := net.Dial("tcp", ln.Addr().String())
		if err != nil {
			served <- err
			return
		}
		defer conn.Close()
		served <- Serve(context.Background(), conn, conn, testRole(nil))
	}()
	conn, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	c := NewConnClient(conn)
	echoAndClose(t, c, "rev")
	if err := <-served; err != nil {
		t.Errorf("serve: %v", err)
	}
}

// Dialled control connections carry the keep-alive and user timeout that
// let a driver notice a vanished host within seconds.
func TestDialTunesConnection(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		if c, err := ln.Accept(); err == nil {
			defer c.Close()
			_, _ = io.Copy(io.Discard, c)
		}
	}()
	c, err := Dial(context.Background(), ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close(time.Second, nil)
	tc, ok := c.w.(halfCloser).Conn.(*net.TCPConn)
	if !ok {
		t.Fatalf("connection is %T", c.w)
	}
	raw, err := tc.SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	var timeout, keepalive, idle int
	_ = raw.Control(func(fd uintptr) {
		timeout, _ = unix.GetsockoptInt(int(fd), unix.IPPROTO_TCP, unix.TCP_USER_TIMEOUT)
		keepalive, _ = unix.GetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_KEEPALIVE)
		idle, _ = unix.GetsockoptInt(int(fd), unix.IPPROTO_TCP, unix.TCP_KEEPIDLE)
	})
	if timeout != int(UserTimeout/time.Millisecond) || keepalive != 1 || idle != int(KeepAlive.Idle/time.Second) {
		t.Errorf("TCP_USER_TIMEOUT %d ms, SO_KEEPALIVE %d, TCP_KEEPIDLE %d s", timeout, keepalive, idle)
	}
}

func TestCallRole(t *testing.T) {
	defer goleak.VerifyNone(t)
	c := StartInProcess(context.Background(), testRole(nil))
	if got, err := CallRole[string](c, "tester", "echo", "hi"); err != nil || got != "HI" {
		t.Errorf("echo: %q, %v; want HI", got, err)
	}
	if got, err := CallRole[string](c, "tester", "echo", "fail"); err == nil || err.Error() != "tester echo: asked to fail" || got != "" {
		t.Errorf("failed echo: %q, %v; want the error named by role and method", got, err)
	}
	if err := c.Close(time.Second, nil); err != nil {
		t.Fatal(err)
	}
	<-c.Done()
}
