package engine

import (
	"context"
	"errors"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nixlctl/nixlctl/internal/runcore"
	"github.com/nixlctl/nixlctl/internal/sglrooms"
	"github.com/nixlctl/nixlctl/internal/testkit"
)

func TestSGLLiveness(t *testing.T) {
	t.Parallel()
	fail := errors.New("refused")
	for _, tc := range []struct {
		name   string
		max    int
		checks string // per check: o = 200, x = failed
		lostAt []int  // checks after which the prefill is given up on
	}{
		{"healthy", 2, "oooo", nil},
		{"two in a row", 2, "oxx", []int{2}},
		{"a success resets", 2, "xoxoxo", nil},
		{"one is enough at max 1", 1, "oxo", []int{1}},
		// Not reset when given up on (upstream's heartbeat_failures): a
		// prefill checked again after a new lookup goes at its next failure.
		{"count kept after the loss", 2, "xxx", []int{1, 2}},
		{"three", 3, "xxoxxx", []int{5}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l := newSGLLiveness(tc.max)
			var lost []int
			for i, c := range tc.checks {
				var err error
				if c == 'x' {
					err = fail
				}
				if _, gone := l.observe("p:1", err); gone {
					lost = append(lost, i)
				}
				// Another prefill's checks do not count for this one.
				l.observe("q:1", fail)
			}
			if len(lost) != len(tc.lostAt) || (len(lost) > 0 && lost[0] != tc.lostAt[0]) || (len(lost) > 1 && lost[1] != tc.lostAt[1]) {
				t.Errorf("%s with max %d: lost after checks %v, want %v", tc.checks, tc.max, lost, tc.lostAt)
			}
		})
	}
}

func TestSGLConfigDefaults(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name    string
		in      Config
		want    [4]any // bootstrap, waiting, interval, max failures
		wantErr string
	}{
		{"upstream defaults", Config{}, [4]any{300 * time.Second, 300 * time.Second, 5 * time.Second, 2}, ""},
		{"given", Config{Knobs: Knobs{SGLBootstrapTimeout: runcore.Duration(time.Second), SGLWaitingTimeout: runcore.Duration(2 * time.Second), SGLHeartbeatInterval: runcore.Duration(3 * time.Second), SGLHeartbeatMaxFailures: 4}}, [4]any{time.Second, 2 * time.Second, 3 * time.Second, 4}, ""},
		{"floored as upstream", Config{Knobs: Knobs{SGLHeartbeatInterval: runcore.Duration(100 * time.Millisecond)}}, [4]any{300 * time.Second, 300 * time.Second, 2 * time.Second, 2}, ""},
		{"negative timeout", Config{Knobs: Knobs{SGLWaitingTimeout: runcore.Duration(-time.Second)}}, [4]any{}, "sglang_waiting_timeout"},
		{"negative failures", Config{Knobs: Knobs{SGLHeartbeatMaxFailures: -1}}, [4]any{}, "sglang_heartbeat_max_failures"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := tc.in
			err := c.sglDefaults()
			if tc.wantErr != "" {
				testkit.WantErr(t, err, tc.wantErr)
				return
			}
			got := [4]any{time.Duration(c.SGLBootstrapTimeout), time.Duration(c.SGLWaitingTimeout), time.Duration(c.SGLHeartbeatInterval), c.SGLHeartbeatMaxFailures}
			if err != nil || got != tc.want {
				t.Errorf("got %v, %v; want %v", got, err, tc.want)
			}
		})
	}
}

// A prefill whose bootstrap server stops answering /health: decode fails
// the room it waits on after SGLHeartbeatMaxFailures failed checks, seconds
// after, not at the 300 s waiting timeout; one that keeps answering does
// not. Each case replaces the bootstrap server on its own port with one
// that refuses, answers 503, or accepts and never answers.
func TestSGLangPrefillHealthLost(t *testing.T) {
	for _, tc := range []struct {
		name     string
		max      int
		replace  func(t *testing.T, addr string) // nil: the server stays up
		lastWord string                          // in the failure's reason
	}{
		{"answering", 2, nil, ""},
		{"refused", 2, func(*testing.T, string) {}, "refused"},
		{"503", 2, func(t *testing.T, addr string) {
			serveOn(t, addr, http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
				http.Error(w, "draining", http.StatusServiceUnavailable)
			}))
		}, "503"},
		{"silent", 1, func(t *testing.T, addr string) { silentOn(t, addr) }, "timeout"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			p, d, _ := engines(t, ProtoSGLang, 1, 1, func(c *Config) {
				c.SGLHeartbeatInterval, c.SGLHeartbeatMaxFailures = runcore.Duration(SGLMinHeartbeatInterval), tc.max
			})
			if time.Duration(d.cfg.SGLWaitingTimeout) != SGLDefaultWaitingTimeout {
				t.Fatalf("waiting timeout %v, want upstream's %v", d.cfg.SGLWaitingTimeout, SGLDefaultWaitingTimeout)
			}
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			const room = uint64(77)
			addr := p.sgl.bootstrapAddr
			type result struct {
				lr   LoadReply
				took time.Duration
			}
			loaded := make(chan result, 1)
			var t0 time.Time
			var mu sync.Mutex
			go func() {
				lr, _ := d.dec.Load(ctx, LoadRequest{ID: "r", Tokens: 100, Key: room, Room: room, Bootstrap: addr})
				mu.Lock()
				defer mu.Unlock()
				loaded <- result{lr, time.Since(t0)}
			}()
			// Decode's TransferInfo is in: the room waits on a prefill that
			// will never write it.
			waitFor(t, "the room to be bootstrapped", func() bool {
				p.sgl.mu.Lock()
				defer p.sgl.mu.Unlock()
				st, ok := p.sgl.rooms[0].State(room)
				return ok && st == sglrooms.Ready
			})
			mu.Lock()
			t0 = time.Now()
			if tc.replace != nil {
				_ = p.sgl.http.Close()
				tc.replace(t, addr)
			}
			mu.Unlock()
			if tc.replace == nil {
				waitStat(t, "heartbeats", func() int64 { return d.Stats().SGLHeartbeats }, 2)
				select {
				case r := <-loaded:
					t.Fatalf("a prefill that answers /health was given up on: %s", r.lr.Error)
				default:
				}
				if st := d.Stats(); st.SGLHeartbeatFailures != 0 || st.SGLPrefillsLost != 0 {
					t.Errorf("decode with a live prefill: %+v", st)
				}
				cancel()
				if r := <-loaded; !strings.Contains(r.lr.Error, "context canceled") {
					t.Errorf("cancelled load: %q", r.lr.Error)
				}
				return
			}
			var r result
			select {
			case r = <-loaded:
			case <-time.After(60 * time.Second):
				t.Fatal("decode still waits a minute after its prefill stopped answering /health")
			}
			t.Logf("failed after %v: %s", r.took, r.lr.Error)
			if r.lr.CorruptBlocks != 0 {
				t.Errorf("a room that failed counts %d corrupt blocks (%s): its aux row was never written", r.lr.CorruptBlocks, r.lr.Corrupt)
			}
			for _, want := range []string{"prefill " + addr + " lost", "consecutive /health checks failed", tc.lastWord} {
				if !strings.Contains(r.lr.Error, want) {
					t.Errorf("reason %q does not say %q", r.lr.Error, want)
				}
			}
			// max rounds of 2 s plus at most 5 s per check; far from 300 s.
			if limit := time.Duration(tc.max) * (SGLMinHeartbeatInterval + 6*time.Second); r.took > limit {
				t.Errorf("failed after %v, want within %v", r.took, limit)
			}
			st := d.Stats()
			if st.SGLPrefillsLost != 1 || st.SGLRoomsFailed != 1 || st.SGLHeartbeatFailures < int64(tc.max) || st.RegTimeouts != 0 ||
				st.BlocksInUse != 0 {
				t.Errorf("decode stats: %+v", st)
			}
			d.sgl.mu.Lock()
			_, known := d.sgl.info[addr]
			pushes := len(d.sgl.ranks[0].push)
			d.sgl.mu.Unlock()
			if known || pushes != 0 {
				t.Errorf("decode kept the lost prefill's info (%v) or sockets (%d)", known, pushes)
			}
		})
	}
}

// serveOn serves h on addr (the port the engine's bootstrap server had).
func serveOn(t *testing.T, addr string, h http.Handler) {
	t.Helper()
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: h, ReadHeaderTimeout: time.Second}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })
}

// silentOn accepts connections on addr and never answers.
func silentOn(t *testing.T, addr string) {
	t.Helper()
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var conns []net.Conn
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		_ = ln.Close()
		mu.Lock()
		defer mu.Unlock()
		for _, c := range conns {
			_ = c.Close()
		}
	})
}

// A room decode gives up at its waiting timeout is aborted at prefill, as
// upstream's decode does: prefill's room is aborted, not left to be
// written into pages decode has freed.
func TestSGLangWaitingTimeoutAborts(t *testing.T) {
	p, d, _ := engines(t, ProtoSGLang, 1, 1, func(c *Config) { c.SGLWaitingTimeout = runcore.Duration(300 * time.Millisecond) })
	const room = uint64(91)
	lr, _ := d.dec.Load(context.Background(), LoadRequest{ID: "r", Tokens: 100, Key: room, Room: room, Bootstrap: p.sgl.bootstrapAddr})
	if !strings.Contains(lr.Error, "waiting timeout after 300ms") || lr.CorruptBlocks != 0 {
		t.Fatalf("load: %q (corrupt %d)", lr.Error, lr.CorruptBlocks)
	}
	waitFor(t, "prefill to see the ABORT", func() bool {
		p.sgl.mu.Lock()
		defer p.sgl.mu.Unlock()
		st, ok := p.sgl.rooms[0].State(room)
		return ok && st == sglrooms.Aborted
	})
	if st := d.Stats(); st.RegTimeouts != 1 || st.BlocksInUse != 0 {
		t.Errorf("decode: %+v", st)
	}
	// The prefill call that comes after finds the room aborted.
	if _, err := p.sgl.prefill(context.Background(), PrefillRequest{ID: "r", Tokens: 100, Key: room, Room: room}); err == nil ||
		!strings.Contains(err.Error(), "aborted by decode") {
		t.Errorf("prefill of an aborted room: %v", err)
	}
}
