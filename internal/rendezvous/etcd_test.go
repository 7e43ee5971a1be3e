package rendezvous

import (
	"context"
	"errors"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nixlctl/nixlctl/internal/rendezvous/etcdtest"
	"github.com/nixlctl/nixlctl/internal/testkit"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/goleak"
)

// startEtcd runs a real etcd for the test (etcdtest.Start).
func startEtcd(t *testing.T) string { return etcdtest.Start(t) }

// etcdLeaks ignores the goroutines there were before (the etcd process's
// waiters).
func etcdLeaks(before goleak.Option) []goleak.Option { return []goleak.Option{before} }

// joinEtcd registers h under the etcd at addr and watchEtcd watches it
// for expect, failing the test at once if they cannot.
func joinEtcd(t *testing.T, addr string, h Hello, opt Options) *Registration {
	t.Helper()
	r, err := JoinEtcd(context.Background(), addr, h, opt)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func watchEtcd(t *testing.T, addr string, expect Roster, opt Options) *Driver {
	t.Helper()
	d, err := WatchEtcd(context.Background(), addr, expect, opt)
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// serveEtcd is watchEtcd for a test that owns the driver (see owned);
// the goroutines there were before it (etcdLeaks) may stay.
func serveEtcd(t *testing.T, addr string, expect Roster, opt Options) *Driver {
	t.Helper()
	return owned(t, func() *Driver { return watchEtcd(t, addr, expect, opt) }, etcdLeaks(goleak.IgnoreCurrent())...)
}

func TestEtcd(t *testing.T) {
	addr := startEtcd(t)
	ctx := context.Background()

	t.Run("complete", func(t *testing.T) {
		defer goleak.VerifyNone(t, etcdLeaks(goleak.IgnoreCurrent())...)
		opt, _ := testOptions()
		d, err := Open(ctx, addr, PrefillDecode("run-a", 1, 1), opt)
		if err != nil {
			t.Fatal(err)
		}
		defer d.Close()
		if d.Addr() != addr {
			t.Errorf("Addr %q, want %q", d.Addr(), addr)
		}
		p, err := Register(ctx, addr, hello("run-a", "prefill", 0, 2, "0.0.0.0:7400"), opt)
		if err != nil {
			t.Fatal(err)
		}
		defer p.Close()
		if p.Addr() != "127.0.0.1:7400" {
			t.Errorf("advertised %q: the unspecified host should be the one etcd is reached from", p.Addr())
		}
		// Another run's member under the same store is invisible here.
		other := joinEtcd(t, addr, hello("run-b", "decode", 1, 2, "127.0.0.1:7401"), opt)
		defer other.Close()
		done := make(chan struct{})
		var members []Member
		var werr error
		go func() {
			members, werr = d.Wait(ctx, 10*time.Second)
			close(done)
		}()
		time.Sleep(50 * time.Millisecond)
		start := time.Now()
		dec := joinEtcd(t, addr, hello("run-a", "decode", 1, 2, "10.1.2.3:7401"), opt)
		defer dec.Close()
		<-done
		t.Logf("Wait returned %v after the last join", time.Since(start))
		if werr != nil {
			t.Fatal(werr)
		}
		if len(members) != 2 || members[0].Addr != "10.1.2.3:7401" || members[1].Addr != "127.0.0.1:7400" ||
			members[0].From != MemberKey("run-a", "decode", 1) {
			t.Fatalf("members %+v", members)
		}
	})

	t.Run("duplicate", func(t *testing.T) {
		opt, logs := testOptions()
		d := serveEtcd(t, addr, PrefillDecode("run-dup", 1, 1), opt)
		p := joinEtcd(t, addr, hello("run-dup", "prefill", 0, 2, "127.0.0.1:7400"), opt)
		defer p.Close()
		h := hello("run-dup", "prefill", 0, 2, "127.0.0.1:7401")
		h.Host = "imposter"
		_, err := JoinEtcd(ctx, addr, h, opt)
		var rej *RejectedError
		if !errors.As(err, &rej) || rej.Reason != RejectDuplicate || !strings.Contains(rej.Detail, "host host-prefill") {
			t.Fatalf("second prefill rank 0: %v", err)
		}
		waitFor(t, func() bool { return d.Rejected()[RejectDuplicate] == 1 }, func() string { return fmtCounts(d.Rejected()) })
		if !strings.Contains(logs.String(), "reason=duplicate") {
			t.Errorf("log:\n%s", logs)
		}
	})

	t.Run("missing, gone and garbage", func(t *testing.T) {
		opt, logs := testOptions()
		d := serveEtcd(t, addr, PrefillDecode("run-c", 1, 3), opt)
		p := joinEtcd(t, addr, hello("run-c", "prefill", 0, 4, "127.0.0.1:7400"), opt)
		defer p.Close()
		// Close revokes the lease: the key goes at once.
		left := joinEtcd(t, addr, hello("run-c", "decode", 1, 4, "127.0.0.1:7401"), opt)
		// A crash: the lease is no longer kept alive nor revoked, and the
		// key goes when it expires.
		crashOpt := opt
		crashOpt.LeaseTTL = time.Second
		crashed := joinEtcd(t, addr, hello("run-c", "decode", 2, 4, "127.0.0.1:7402"), crashOpt)
		waitFor(t, func() bool { return strings.Count(logs.String(), "rendezvous: joined") == 3 }, logs.String)
		if err := left.Close(); err != nil {
			t.Fatal(err)
		}
		crashed.etcd.cancel()
		<-crashed.etcd.kaDone
		crashed.etcd.cli.Close()
		// Garbage in a member's key.
		cli, err := newEtcdClient(addr)
		if err != nil {
			t.Fatal(err)
		}
		defer cli.Close()
		if _, err := cli.Put(ctx, MemberKey("run-c", "decode", 3), "not a hello"); err != nil {
			t.Fatal(err)
		}
		// The crashed member's key expires while Wait waits; once both
		// departures are seen, end Wait early rather than at the window.
		wctx, cancel := context.WithCancel(ctx)
		defer cancel()
		crashedAt := time.Now()
		go func() {
			defer cancel()
			for strings.Count(logs.String(), "member gone") < 2 && time.Since(crashedAt) < 20*time.Second {
				time.Sleep(10 * time.Millisecond)
			}
			t.Logf("the crashed member's key went %v after its keepalive stopped", time.Since(crashedAt))
		}()
		members, err := d.Wait(wctx, time.Minute)
		var inc *IncompleteError
		if !errors.As(err, &inc) || !errors.Is(err, context.Canceled) {
			t.Fatalf("Wait: %v", err)
		}
		t.Log(err)
		if len(members) != 1 || members[0].Role != "prefill" {
			t.Errorf("members %+v", members)
		}
		if len(inc.Missing) != 1 || inc.Missing[0] != (Slot{"decode", 3}) {
			t.Errorf("missing %v", inc.Missing)
		}
		if len(inc.Gone) != 2 || inc.Gone[0].Rank != 1 || inc.Gone[1].Rank != 2 ||
			!strings.Contains(inc.Gone[1].Why, "key deleted") {
			t.Errorf("gone %+v", inc.Gone)
		}
		if inc.Rejected[RejectGarbage] != 1 {
			t.Errorf("rejected %v", inc.Rejected)
		}
	})

	t.Run("refused", func(t *testing.T) {
		opt, _ := testOptions()
		if _, err := JoinEtcd(ctx, addr, hello("run-d", "decode", 1, 2, Reverse), opt); err == nil {
			t.Error("a reverse member joined etcd")
		}
		if _, err := JoinEtcd(ctx, addr, hello("", "decode", 1, 2, "127.0.0.1:1"), opt); err == nil {
			t.Error("a member without a run id joined etcd")
		}
		if _, err := WatchEtcd(ctx, addr, PrefillDecode("", 1, 1), opt); err == nil {
			t.Error("a driver without a run id watched etcd")
		}
	})

	t.Run("lease revoked on close", func(t *testing.T) {
		defer goleak.VerifyNone(t, etcdLeaks(goleak.IgnoreCurrent())...)
		opt, _ := testOptions()
		r := joinEtcd(t, addr, hello("run-e", "prefill", 0, 1, "127.0.0.1:7400"), opt)
		cli, err := newEtcdClient(addr)
		if err != nil {
			t.Fatal(err)
		}
		defer cli.Close()
		key := MemberKey("run-e", "prefill", 0)
		if resp, err := cli.Get(ctx, key); err != nil || len(resp.Kvs) != 1 || resp.Kvs[0].Lease == 0 {
			t.Fatalf("key before Close: %+v %v", resp, err)
		}
		if err := r.Close(); err != nil {
			t.Fatal(err)
		}
		select {
		case <-r.Done():
		default:
			t.Error("Done is open after Close")
		}
		if resp, err := cli.Get(ctx, key, clientv3.WithCountOnly()); err != nil || resp.Count != 0 {
			t.Fatalf("key after Close: %+v %v", resp, err)
		}
	})
}

// An etcd that refuses fails at once, and one that accepts but never
// answers fails within RetryFor (the driver's join window, a member's
// --register-timeout): both took the 10 s hello timeout before, whatever
// the window.
func TestEtcdUnreachableIsBounded(t *testing.T) {
	refused := "etcd://" + testkit.FreeAddr(t)
	silent, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer silent.Close()
	var held []net.Conn
	var mu sync.Mutex
	go func() {
		for {
			c, err := silent.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			held = append(held, c) // accepted, never answered
			mu.Unlock()
		}
	}()
	defer func() {
		mu.Lock()
		defer mu.Unlock()
		for _, c := range held {
			c.Close()
		}
	}()
	opt := Options{RetryFor: 500 * time.Millisecond}
	roster := PrefillDecode("r", 1, 1)
	for _, tc := range []struct {
		name, addr string
		limit      time.Duration
		want       string
	}{
		{"refused, driver", refused, 2 * time.Second, "cannot be reached"},
		{"silent, driver", "etcd://" + silent.Addr().String(), 5 * time.Second, "etcd"},
		{"refused, member", refused, 2 * time.Second, "cannot be reached"},
		{"silent, member", "etcd://" + silent.Addr().String(), 5 * time.Second, "etcd"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			start := time.Now()
			if strings.HasSuffix(tc.name, "driver") {
				d, err := WatchEtcd(context.Background(), tc.addr, roster, opt)
				if err == nil {
					d.Close()
					t.Fatal("no error")
				}
				if !strings.Contains(err.Error(), tc.want) {
					t.Errorf("error %v lacks %q", err, tc.want)
				}
			} else {
				r, err := JoinEtcd(context.Background(), tc.addr, hello("r", "decode", 1, 2, "127.0.0.1:7400"), opt)
				if err == nil {
					r.Close()
					t.Fatal("no error")
				}
				if !strings.Contains(err.Error(), tc.want) {
					t.Errorf("error %v lacks %q", err, tc.want)
				}
			}
			if d := time.Since(start); d > tc.limit {
				t.Errorf("took %v with RetryFor %v", d, opt.RetryFor)
			}
		})
	}
}
