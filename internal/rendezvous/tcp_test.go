package rendezvous

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nixlctl/nixlctl/internal/testkit"

	"go.uber.org/goleak"

	"github.com/nixlctl/nixlctl/internal/ctl"
)

// syncBuffer collects a logger's output from several goroutines.
type syncBuffer = testkit.SyncBuffer

func testOptions() (Options, *syncBuffer) {
	var buf syncBuffer
	return Options{Log: slog.New(slog.NewTextHandler(&buf, nil)), HelloTimeout: 2 * time.Second}, &buf
}

func listen(t *testing.T, expect Roster, opt Options) *Driver {
	t.Helper()
	d, err := Listen(context.Background(), "tcp://127.0.0.1:0", expect, opt)
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// serve is listen for a test that owns the driver (see owned).
func serve(t *testing.T, expect Roster, opt Options) *Driver {
	t.Helper()
	return owned(t, func() *Driver { return listen(t, expect, opt) })
}

// owned starts a driver for a test that owns it: when the test ends
// (after its own defers, such as its members' Close) the driver is
// closed, and then any goroutine left behind, but those ignore lets
// pass, fails the test.
func owned(t *testing.T, start func() *Driver, ignore ...goleak.Option) *Driver {
	t.Helper()
	t.Cleanup(func() { goleak.VerifyNone(t, ignore...) })
	d := start()
	t.Cleanup(func() { d.Close() })
	return d
}

// join registers h with d, failing the test at once if it cannot.
func join(t *testing.T, d *Driver, h Hello, opt Options) *Registration {
	t.Helper()
	r, err := Join(context.Background(), d.Addr(), h, opt)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// joinAndLeave registers h with d and closes the registration at once,
// waiting until d's log (logs) says the member is gone.
func joinAndLeave(t *testing.T, d *Driver, h Hello, opt Options, logs *syncBuffer) {
	t.Helper()
	join(t, d, h, opt).Close()
	waitFor(t, func() bool { return strings.Contains(logs.String(), "member gone") }, logs.String)
}

func hello(run, role string, rank, world int, ctlAddr string) Hello {
	return Hello{Run: run, Role: role, Rank: rank, World: world, Host: "host-" + role, Ctl: ctlAddr}
}

func echoRole(s *ctl.Server) func() {
	s.Handle("echo", ctl.Typed(func(_ context.Context, in string) (any, error) { return strings.ToUpper(in), nil }))
	return nil
}

// TestTCPComplete: a prefill that serves on a port and a decode that asks
// for its hello connection to be the control channel; the driver gets
// both, resolves the unspecified host, and runs ctl over the reverse one.
func TestTCPComplete(t *testing.T) {
	opt, _ := testOptions()
	d := serve(t, PrefillDecode("run-1", 1, 1), opt)
	ctx := context.Background()

	p := join(t, d, hello("run-1", "prefill", 0, 2, "0.0.0.0:7400"), opt)
	defer p.Close()
	if p.Addr() != "127.0.0.1:7400" || p.Conn() != nil {
		t.Errorf("prefill: Addr %q Conn %v", p.Addr(), p.Conn())
	}
	dec, err := Register(ctx, "tcp://"+d.Addr(), hello("run-1", "decode", 1, 2, Reverse), opt)
	if err != nil {
		t.Fatal(err)
	}
	defer dec.Close()
	served := make(chan error, 1)
	go func() { served <- ctl.Serve(ctx, dec.Conn(), dec.Conn(), echoRole) }()

	members, err := d.Wait(ctx, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if len(members) != 2 || members[0].Role != "decode" || members[1].Role != "prefill" {
		t.Fatalf("members %+v", members)
	}
	if m := members[1]; m.Addr != "127.0.0.1:7400" || m.Conn != nil || m.Host != "host-prefill" {
		t.Errorf("prefill member %+v", m)
	}
	m := members[0]
	if m.Conn == nil || m.Addr != "" {
		t.Fatalf("decode member %+v", m)
	}
	c := ctl.NewConnClient(m.Conn)
	var out string
	if err := c.Call(ctx, "echo", "reverse", &out); err != nil || out != "REVERSE" {
		t.Fatalf("echo over the reverse connection: %q %v", out, err)
	}
	if err := c.Close(5*time.Second, nil); err != nil {
		t.Fatal(err)
	}
	if err := <-served; err != nil {
		t.Errorf("decode's ctl session: %v", err)
	}
	if n := d.Rejected(); len(n) != 0 {
		t.Errorf("rejected %v", n)
	}
	// The driver going away is the prefill's signal.
	if err := d.Close(); err != nil {
		t.Error(err)
	}
	select {
	case <-p.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("prefill did not see the driver go")
	}
}

// rawHello sends line as is and returns the driver's answer.
func rawHello(t *testing.T, addr, line string) string {
	t.Helper()
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := conn.Write([]byte(line)); err != nil {
		t.Fatal(err)
	}
	if tc, ok := conn.(*net.TCPConn); ok && !strings.HasSuffix(line, "\n") && len(line) < MaxHello {
		_ = tc.CloseWrite()
	}
	_ = conn.SetReadDeadline(time.Now().Add(5 * time.Second))
	ans, _ := bufio.NewReader(conn).ReadString('\n')
	return ans
}

func TestTCPRejections(t *testing.T) {
	opt, logs := testOptions()
	opt.HelloTimeout = 300 * time.Millisecond
	d := serve(t, PrefillDecode("run-1", 1, 1), opt)
	ctx := context.Background()
	p := join(t, d, hello("run-1", "prefill", 0, 2, "127.0.0.1:7400"), opt)
	defer p.Close()

	for _, tc := range []struct {
		name   string
		h      Hello
		reason string
	}{
		{"duplicate", hello("run-1", "prefill", 0, 2, "127.0.0.1:7401"), RejectDuplicate},
		{"wrong run", hello("run-0", "decode", 1, 2, "127.0.0.1:7401"), RejectRun},
		{"role not in roster", hello("run-1", "encoder", 1, 2, "127.0.0.1:7401"), RejectRoster},
		{"rank not in roster", hello("run-1", "decode", 0, 2, "127.0.0.1:7401"), RejectRoster},
		{"world size", hello("run-1", "decode", 1, 3, "127.0.0.1:7401"), RejectWorld},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Join(ctx, d.Addr(), tc.h, opt)
			var rej *RejectedError
			if !errors.As(err, &rej) || rej.Reason != tc.reason {
				t.Fatalf("got %v, want a %s rejection", err, tc.reason)
			}
		})
	}
	for _, tc := range []struct{ name, line, answer string }{
		{"not json", "GET / HTTP/1.0\r\n", "not a JSON object"},
		{"missing field", `{"v":1,"run":"run-1","role":"decode","rank":1,"world":2,"host":"h"}` + "\n", `no \"ctl\"`},
		{"no newline before EOF", `{"v":1`, "without a hello line"},
		{"too long", strings.Repeat("x", MaxHello+10), "no newline in the first"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if ans := rawHello(t, d.Addr(), tc.line); !strings.Contains(ans, `"reason":"garbage"`) || !strings.Contains(ans, tc.answer) {
				t.Fatalf("answer %q, want a garbage rejection saying %q", ans, tc.answer)
			}
		})
	}
	t.Run("silent", func(t *testing.T) {
		conn, err := net.Dial("tcp", d.Addr())
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		_ = conn.SetReadDeadline(time.Now().Add(5 * time.Second))
		if ans, _ := bufio.NewReader(conn).ReadString('\n'); !strings.Contains(ans, "no hello line within") {
			t.Fatalf("answer %q", ans)
		}
	})

	want := map[string]int{RejectDuplicate: 1, RejectRun: 1, RejectRoster: 2, RejectWorld: 1, RejectGarbage: 5}
	waitFor(t, func() bool { return equalCounts(d.Rejected(), want) }, func() string { return fmtCounts(d.Rejected()) })
	// The driver still works: the real decode joins.
	dec := join(t, d, hello("run-1", "decode", 1, 2, "127.0.0.1:7401"), opt)
	defer dec.Close()
	if _, err := d.Wait(ctx, 5*time.Second); err != nil {
		t.Fatal(err)
	}
	_, err := Join(ctx, d.Addr(), hello("run-1", "decode", 1, 2, "127.0.0.1:7402"), opt)
	var rej *RejectedError
	if !errors.As(err, &rej) || rej.Reason != RejectLate {
		t.Fatalf("after Wait: %v", err)
	}
	for _, s := range []string{"reason=duplicate", "reason=wrong-run", "reason=not-in-roster", "reason=world-size", "reason=garbage", "reason=late",
		`already held by host host-prefill`, `run id \"run-0\", this driver's is \"run-1\"`} {
		if !strings.Contains(logs.String(), s) {
			t.Errorf("the log does not say %s:\n%s", s, logs)
		}
	}
}

func equalCounts(a, b map[string]int) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range b {
		if a[k] != v {
			return false
		}
	}
	return true
}

func fmtCounts(m map[string]int) string { return rejectSummary(m) }

func waitFor(t *testing.T, cond func() bool, state func() string) {
	t.Helper()
	testkit.WaitFor(t, 0, "the condition", cond, state)
}

// TestTCPIncomplete: the window ends with one decode rank never there and
// one that joined and left; the error names both, and the members that
// are there come back.
func TestTCPIncomplete(t *testing.T) {
	opt, logs := testOptions()
	d := serve(t, PrefillDecode("r", 1, 2), opt)
	ctx := context.Background()
	p := join(t, d, hello("r", "prefill", 0, 3, "127.0.0.1:7400"), opt)
	defer p.Close()
	joinAndLeave(t, d, hello("r", "decode", 2, 3, "127.0.0.1:7402"), opt, logs)

	start := time.Now()
	members, err := d.Wait(ctx, 300*time.Millisecond)
	var inc *IncompleteError
	if !errors.As(err, &inc) {
		t.Fatalf("Wait: %v", err)
	}
	if el := time.Since(start); el < 300*time.Millisecond || el > 3*time.Second {
		t.Errorf("Wait took %v for a 300ms window", el)
	}
	if len(members) != 1 || members[0].Role != "prefill" {
		t.Errorf("members %+v", members)
	}
	if len(inc.Missing) != 1 || inc.Missing[0] != (Slot{"decode", 1}) {
		t.Errorf("missing %v", inc.Missing)
	}
	if len(inc.Gone) != 1 || inc.Gone[0].Slot != (Slot{"decode", 2}) || inc.Gone[0].Why != "connection closed" {
		t.Errorf("gone %+v", inc.Gone)
	}
	if !strings.Contains(err.Error(), "missing decode rank 1; gone: decode rank 2 (host host-decode: connection closed)") {
		t.Errorf("error %q", err)
	}
}

// TestTCPRejoin: a member that left and came back (a restarted pod)
// completes the roster, and is not reported gone.
func TestTCPRejoin(t *testing.T) {
	opt, logs := testOptions()
	d := serve(t, PrefillDecode("r", 1, 0), opt)
	ctx := context.Background()
	joinAndLeave(t, d, hello("r", "prefill", 0, 1, "127.0.0.1:7400"), opt, logs)
	again := join(t, d, hello("r", "prefill", 0, 1, "127.0.0.1:7400"), opt)
	defer again.Close()
	if m, err := d.Wait(ctx, 5*time.Second); err != nil || len(m) != 1 {
		t.Fatalf("Wait: %+v %v", m, err)
	}
}

// TestTCPCancel: Wait gives up with its context, and says what was
// missing then.
func TestTCPCancel(t *testing.T) {
	opt, _ := testOptions()
	d := serve(t, PrefillDecode("r", 1, 1), opt)
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	_, err := d.Wait(ctx, time.Hour)
	var inc *IncompleteError
	if !errors.Is(err, context.DeadlineExceeded) || !errors.As(err, &inc) || len(inc.Missing) != 2 {
		t.Fatalf("Wait: %v", err)
	}
}

// TestTCPReverseGone: a reverse member that drops before Wait returns is
// gone, although nothing reads its connection but the watcher.
func TestTCPReverseGone(t *testing.T) {
	opt, logs := testOptions()
	d := serve(t, PrefillDecode("r", 1, 1), opt)
	ctx := context.Background()
	joinAndLeave(t, d, hello("r", "decode", 1, 2, Reverse), opt, logs)
	_, err := d.Wait(ctx, 50*time.Millisecond)
	var inc *IncompleteError
	if !errors.As(err, &inc) || len(inc.Gone) != 1 || len(inc.Missing) != 1 {
		t.Fatalf("Wait: %v", err)
	}
}

// TestTCPManyJoiners: concurrent joins racing for the same slots; each
// slot goes to exactly one and the rest are duplicates.
func TestTCPManyJoiners(t *testing.T) {
	opt, _ := testOptions()
	opt.Log = slog.New(slog.DiscardHandler)
	d := serve(t, PrefillDecode("r", 2, 2), opt)
	ctx := context.Background()
	var wg sync.WaitGroup
	var mu sync.Mutex
	var regs []*Registration
	dups := 0
	for i := range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			role := "prefill"
			if i%4 >= 2 {
				role = "decode"
			}
			r, err := Join(ctx, d.Addr(), hello("r", role, i%4, 4, "127.0.0.1:7400"), opt)
			mu.Lock()
			defer mu.Unlock()
			var rej *RejectedError
			switch {
			case err == nil:
				regs = append(regs, r)
			case errors.As(err, &rej) && rej.Reason == RejectDuplicate:
				dups++
			default:
				t.Error(err)
			}
		}()
	}
	wg.Wait()
	defer func() {
		for _, r := range regs {
			r.Close()
		}
	}()
	if len(regs) != 4 || dups != 12 {
		t.Fatalf("%d joined, %d duplicates", len(regs), dups)
	}
	if m, err := d.Wait(ctx, 5*time.Second); err != nil || len(m) != 4 {
		t.Fatalf("Wait: %d %v", len(m), err)
	}
}

// TestTCPCloseEndsWait: Close during Wait ends it at once, and a second
// Wait is refused.
func TestTCPCloseEndsWait(t *testing.T) {
	opt, _ := testOptions()
	d := serve(t, PrefillDecode("r", 1, 1), opt)
	time.AfterFunc(50*time.Millisecond, func() { d.Close() })
	start := time.Now()
	_, err := d.Wait(context.Background(), time.Hour)
	var inc *IncompleteError
	if !errors.Is(err, ErrClosed) || !errors.As(err, &inc) || time.Since(start) > 5*time.Second {
		t.Fatalf("Wait: %v after %v", err, time.Since(start))
	}
	if _, err := d.Wait(context.Background(), time.Second); err == nil {
		t.Fatal("a second Wait")
	}
}

// A member that leaves after the rendezvous warns, unless the run said it
// is ending: then it is every successful run's teardown (the etcd runs
// warned "member left after the rendezvous" on each).
func TestLeaveAfterTheRendezvous(t *testing.T) {
	defer goleak.VerifyNone(t)
	for _, ending := range []bool{false, true} {
		t.Run(fmt.Sprintf("ending=%v", ending), func(t *testing.T) {
			var logs syncBuffer
			opt := Options{Log: slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug})), HelloTimeout: 2 * time.Second}
			d := listen(t, PrefillDecode("run-1", 1, 1), opt)
			defer d.Close()
			ctx := context.Background()
			var joined []*Registration
			for i, role := range []string{"prefill", "decode"} {
				m := join(t, d, hello("run-1", role, i, 2, "127.0.0.1:7400"), opt)
				defer m.Close()
				joined = append(joined, m)
			}
			if _, err := d.Wait(ctx, 5*time.Second); err != nil {
				t.Fatal(err)
			}
			if ending {
				d.Ending()
			}
			joined[1].Close()
			// Either way the departure is logged, at warn or debug level.
			deadline := time.Now().Add(10 * time.Second)
			for !strings.Contains(logs.String(), "rendezvous: member left") {
				if time.Now().After(deadline) {
					t.Fatalf("the departure was never logged: %s", logs.String())
				}
				time.Sleep(10 * time.Millisecond)
			}
			warned := strings.Contains(logs.String(), "level=WARN msg=\"rendezvous: member left after the rendezvous\"")
			if warned == ending {
				t.Errorf("warned %v, want %v: %s", warned, !ending, logs.String())
			}
		})
	}
}
