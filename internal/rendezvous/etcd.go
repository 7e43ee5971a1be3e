package rendezvous

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
)

// EtcdScheme prefixes an etcd address for Open and Register.
const EtcdScheme = "etcd://"

// keyPrefix namespaces a run's keys: members/<role>/<rank> holds a
// joined member's hello, rejected/<role>/<rank>/<lease> one that found
// its slot taken (so that the driver counts it).
func keyPrefix(run string) string { return "nixlctl/" + run + "/" }

// MemberKey is where a member's hello lives.
func MemberKey(run, role string, rank int) string {
	return keyPrefix(run) + "members/" + role + "/" + strconv.Itoa(rank)
}

func newEtcdClient(endpoint string) (*clientv3.Client, error) {
	hostport := strings.TrimPrefix(endpoint, EtcdScheme)
	if _, _, err := net.SplitHostPort(hostport); err != nil {
		return nil, fmt.Errorf("rendezvous: etcd address %q is not etcd://HOST:PORT", endpoint)
	}
	return clientv3.New(clientv3.Config{
		Endpoints:   []string{hostport},
		DialTimeout: 5 * time.Second,
		Logger:      zap.NewNop(), // its retries are not ours to print
	})
}

// dialEtcd checks an etcd://HOST:PORT address, that something answers
// there within the etcd timeout, and makes the client.
func dialEtcd(ctx context.Context, endpoint string, opt Options) (*clientv3.Client, error) {
	if _, _, err := net.SplitHostPort(strings.TrimPrefix(endpoint, EtcdScheme)); err != nil {
		return nil, fmt.Errorf("rendezvous: etcd address %q is not etcd://HOST:PORT", endpoint)
	}
	if err := etcdReachable(ctx, endpoint, opt.etcdTimeout()); err != nil {
		return nil, err
	}
	return newEtcdClient(endpoint)
}

// etcdReachable dials etcd's client port once before a client is made:
// the client retries a refused connection until its context ends, so a
// wrong port or a stopped etcd cost the whole timeout with nothing but
// "context deadline exceeded" to show for it.
func etcdReachable(ctx context.Context, endpoint string, timeout time.Duration) error {
	hostport := strings.TrimPrefix(endpoint, EtcdScheme)
	var d net.Dialer
	dctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	conn, err := d.DialContext(dctx, "tcp", hostport)
	if err != nil {
		return fmt.Errorf("rendezvous: etcd at %s cannot be reached (waited at most %v): %w", hostport, timeout, err)
	}
	conn.Close()
	return nil
}

type etcdMember struct {
	cli     *clientv3.Client
	lease   clientv3.LeaseID
	cancel  context.CancelFunc
	kaDone  chan struct{}
	timeout time.Duration
}

// JoinEtcd puts h under MemberKey on a lease it keeps alive until Close
// (or this process dies, and the key goes a lease TTL later). A slot that
// is already taken is a *RejectedError naming its holder. A control
// address with an unspecified host is advertised with the address this
// host reaches etcd from. Reverse is refused: there is no connection.
func JoinEtcd(ctx context.Context, endpoint string, h Hello, opt Options) (*Registration, error) {
	if h.Ctl == Reverse {
		return nil, errors.New("rendezvous: a reverse control channel needs the TCP rendezvous, not etcd")
	}
	if h.Run == "" {
		return nil, errors.New("rendezvous: etcd needs a run id to namespace its keys")
	}
	if ctl, err := advertiseFrom(h.Ctl, strings.TrimPrefix(endpoint, EtcdScheme)); err == nil {
		h.Ctl = ctl
	}
	line, err := h.Encode()
	if err != nil {
		return nil, err
	}
	cli, err := dialEtcd(ctx, endpoint, opt)
	if err != nil {
		return nil, err
	}
	m := &etcdMember{cli: cli, timeout: opt.etcdTimeout()}
	if err := m.join(ctx, h, string(line), opt.leaseTTL()); err != nil {
		cli.Close()
		return nil, err
	}
	done := make(chan struct{})
	go func() {
		<-m.kaDone
		close(done)
	}()
	return &Registration{etcd: m, done: done, addr: h.Ctl}, nil
}

func (m *etcdMember) join(ctx context.Context, h Hello, value string, ttl time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, m.timeout)
	defer cancel()
	secs := int64((ttl + time.Second - 1) / time.Second)
	lease, err := m.cli.Grant(ctx, secs)
	if err != nil {
		return fmt.Errorf("rendezvous: etcd lease: %w", err)
	}
	m.lease = lease.ID
	key := MemberKey(h.Run, h.Role, h.Rank)
	resp, err := m.cli.Txn(ctx).
		If(clientv3.Compare(clientv3.CreateRevision(key), "=", 0)).
		Then(clientv3.OpPut(key, value, clientv3.WithLease(lease.ID))).
		Else(clientv3.OpGet(key)).Commit()
	if err != nil {
		m.revoke()
		return fmt.Errorf("rendezvous: etcd put %s: %w", key, err)
	}
	if !resp.Succeeded {
		holder := "another member"
		if kvs := resp.Responses[0].GetResponseRange().GetKvs(); len(kvs) > 0 {
			if old, err := DecodeHello(kvs[0].Value); err == nil {
				holder = "host " + old.Host
			}
		}
		detail := fmt.Sprintf("%s is already held by %s (%s)", Slot{h.Role, h.Rank}, holder, key)
		// Tell the driver, which cannot see a put that never happened.
		rkey := fmt.Sprintf("%srejected/%s/%d/%x", keyPrefix(h.Run), h.Role, h.Rank, int64(lease.ID))
		_, _ = m.cli.Put(ctx, rkey, detail, clientv3.WithLease(lease.ID))
		m.revoke()
		return &RejectedError{Reason: RejectDuplicate, Detail: detail}
	}
	kctx, kcancel := context.WithCancel(context.Background())
	ka, err := m.cli.KeepAlive(kctx, lease.ID)
	if err != nil {
		kcancel()
		m.revoke()
		return fmt.Errorf("rendezvous: etcd keepalive: %w", err)
	}
	m.cancel, m.kaDone = kcancel, make(chan struct{})
	go func() {
		for range ka { // the client renews; draining keeps it from warning
		}
		close(m.kaDone)
	}()
	return nil
}

func (m *etcdMember) revoke() error {
	ctx, cancel := context.WithTimeout(context.Background(), m.timeout)
	defer cancel()
	_, err := m.cli.Revoke(ctx, m.lease)
	return err
}

func (m *etcdMember) close() error {
	m.cancel()
	<-m.kaDone
	err := m.revoke()
	if cerr := m.cli.Close(); err == nil && cerr != nil && !errors.Is(cerr, context.Canceled) {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("rendezvous: leaving etcd: %w", err)
	}
	return nil
}

// advertiseFrom replaces an unspecified host in ctl with this host's
// address on the route to target (a UDP "connection" sends nothing).
func advertiseFrom(ctl, target string) (string, error) {
	host, port, err := net.SplitHostPort(ctl)
	if err != nil {
		return "", err
	}
	if ip := net.ParseIP(host); host != "" && (ip == nil || !ip.IsUnspecified()) {
		return ctl, nil
	}
	c, err := net.Dial("udp", target)
	if err != nil {
		return "", err
	}
	defer c.Close()
	return net.JoinHostPort(c.LocalAddr().(*net.UDPAddr).IP.String(), port), nil
}

type etcdDriver struct {
	cli    *clientv3.Client
	b      *board
	cancel context.CancelFunc
	wg     sync.WaitGroup
	byKey  map[string]*entry // the watcher's own, no lock
}

// WatchEtcd makes a driver that waits for members' keys under the
// roster's run (which must not be empty) at etcd://HOST:PORT, watching
// from the moment it is made, so that a member gone before Wait counts.
func WatchEtcd(ctx context.Context, endpoint string, expect Roster, opt Options) (*Driver, error) {
	if err := expect.Validate(); err != nil {
		return nil, err
	}
	if expect.Run == "" {
		return nil, errors.New("rendezvous: etcd needs a run id to namespace its keys")
	}
	cli, err := dialEtcd(ctx, endpoint, opt)
	if err != nil {
		return nil, err
	}
	wctx, cancel := context.WithCancel(ctx)
	d := &etcdDriver{cli: cli, b: newBoard(expect, opt.log()), cancel: cancel, byKey: map[string]*entry{}}
	gctx, gcancel := context.WithTimeout(ctx, opt.etcdTimeout())
	defer gcancel()
	rev, err := d.sync(gctx)
	if err != nil {
		cancel()
		cli.Close()
		return nil, fmt.Errorf("rendezvous: etcd %s: %w", endpoint, err)
	}
	d.wg.Add(1)
	go d.watch(wctx, rev)
	d.b.log.Info("rendezvous: watching etcd", "addr", endpoint, "prefix", keyPrefix(expect.Run), "roster", slotList(expect.Slots()))
	return &Driver{b: d.b, addr: EtcdScheme + strings.TrimPrefix(endpoint, EtcdScheme), stop: func() error {
		cancel()
		d.wg.Wait()
		return cli.Close()
	}}, nil
}

// sync reads every key of the run, as after a lost watch, and returns the
// revision to watch from.
func (d *etcdDriver) sync(ctx context.Context) (int64, error) {
	resp, err := d.cli.Get(ctx, keyPrefix(d.b.expect.Run)+"members/", clientv3.WithPrefix())
	if err != nil {
		return 0, err
	}
	seen := map[string]bool{}
	for _, kv := range resp.Kvs {
		seen[string(kv.Key)] = true
		d.put(string(kv.Key), kv.Value, kv.ModRevision)
	}
	for key, e := range d.byKey {
		if !seen[key] {
			delete(d.byKey, key)
			d.b.leave(e, "key deleted (lease expired or revoked)")
		}
	}
	return resp.Header.Revision, nil
}

func (d *etcdDriver) watch(ctx context.Context, rev int64) {
	defer d.wg.Done()
	for ctx.Err() == nil {
		wch := d.cli.Watch(clientv3.WithRequireLeader(ctx), keyPrefix(d.b.expect.Run),
			clientv3.WithPrefix(), clientv3.WithRev(rev+1))
		for resp := range wch {
			if err := resp.Err(); err != nil {
				d.b.log.Warn("rendezvous: etcd watch", "err", err)
				break
			}
			for _, ev := range resp.Events {
				key := string(ev.Kv.Key)
				switch {
				case ev.Type == clientv3.EventTypeDelete:
					if e := d.byKey[key]; e != nil {
						delete(d.byKey, key)
						d.b.leave(e, "key deleted (lease expired or revoked)")
					}
				case strings.HasPrefix(key, keyPrefix(d.b.expect.Run)+"rejected/"):
					d.b.reject(RejectDuplicate, string(ev.Kv.Value), key)
				default:
					d.put(key, ev.Kv.Value, ev.Kv.ModRevision)
				}
			}
			rev = resp.Header.Revision
		}
		if ctx.Err() != nil {
			return
		}
		// The watch broke (compaction, lost leader): read everything again
		// and go on from there.
		select {
		case <-ctx.Done():
			return
		case <-time.After(100 * time.Millisecond):
		}
		sctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		if r, err := d.sync(sctx); err == nil {
			rev = r
		}
		cancel()
	}
}

// put takes a member key's value as a hello.
func (d *etcdDriver) put(key string, value []byte, _ int64) {
	if !strings.HasPrefix(key, keyPrefix(d.b.expect.Run)+"members/") {
		return
	}
	if old := d.byKey[key]; old != nil {
		if string(value) == old.m.Hello.mustEncode() {
			return // the same member, seen again by a resync
		}
		delete(d.byKey, key)
		d.b.leave(old, "key overwritten")
	}
	h, err := DecodeHello(value)
	if err != nil {
		d.b.reject(RejectGarbage, err.Error(), key)
		return
	}
	if want := MemberKey(h.Run, h.Role, h.Rank); want != key {
		d.b.reject(RejectGarbage, fmt.Sprintf("a hello for %s under %s", want, key), key)
		return
	}
	e := &entry{m: Member{Hello: h, Addr: h.Ctl, From: key, Joined: time.Now()}}
	if h.Ctl == Reverse {
		d.b.reject(RejectGarbage, "a reverse control channel needs the TCP rendezvous", key)
		return
	}
	if rej := d.b.reserve(e); rej != nil {
		return
	}
	d.byKey[key] = e
	d.b.commit(e)
}

func (h Hello) mustEncode() string {
	b, _ := h.Encode()
	return string(b)
}
