package rendezvous

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"time"
)

// Open makes the driver addr names: etcd://HOST:PORT watches etcd (see
// WatchEtcd), anything else is a TCP address to listen on (see Listen).
func Open(ctx context.Context, addr string, expect Roster, opt Options) (*Driver, error) {
	if strings.HasPrefix(addr, EtcdScheme) {
		return WatchEtcd(ctx, addr, expect, opt)
	}
	return Listen(ctx, addr, expect, opt)
}

// Register announces h to the driver addr names: etcd://HOST:PORT (see
// JoinEtcd), anything else the TCP driver's HOST:PORT (see Join). A TCP
// driver that is not there yet (connection refused, a name that does not
// resolve yet: pods and tasks start in any order) is tried again, every
// 0.2 s growing to 2 s, until ctx ends; a rejection or a bad hello is
// final.
func Register(ctx context.Context, addr string, h Hello, opt Options) (*Registration, error) {
	if strings.HasPrefix(addr, EtcdScheme) {
		return JoinEtcd(ctx, addr, h, opt)
	}
	backoff := 200 * time.Millisecond
	for {
		r, err := Join(ctx, addr, h, opt)
		var ne *net.OpError
		var dns *net.DNSError
		if err == nil || ctx.Err() != nil || !errors.As(err, &ne) && !errors.As(err, &dns) {
			return r, err
		}
		opt.log().Info("rendezvous: driver not reachable yet", "addr", addr, "err", err, "retry_in", backoff)
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("rendezvous: %w; last try: %w", ctx.Err(), err)
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, 2*time.Second)
	}
}
