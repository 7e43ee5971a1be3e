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
// 0.2 s growing to 2 s, until ctx ends or opt.RetryFor has passed, each
// try logged at WARN with its count and reason; a rejection or a bad
// hello is final.
func Register(ctx context.Context, addr string, h Hello, opt Options) (*Registration, error) {
	if strings.HasPrefix(addr, EtcdScheme) {
		return JoinEtcd(ctx, addr, h, opt)
	}
	backoff := 200 * time.Millisecond
	start := time.Now()
	for try := 1; ; try++ {
		r, err := Join(ctx, addr, h, opt)
		var ne *net.OpError
		var dns *net.DNSError
		if err == nil || ctx.Err() != nil || !errors.As(err, &ne) && !errors.As(err, &dns) {
			return r, err
		}
		wait := backoff
		if opt.RetryFor > 0 {
			left := opt.RetryFor - time.Since(start)
			if left <= 0 {
				return nil, fmt.Errorf("rendezvous: driver at %s not reachable in %v (%d tries; last: %w)", addr, opt.RetryFor, try, err)
			}
			wait = min(wait, left)
		}
		// WARN: an endpoint waiting on a driver that never comes is the
		// thing its operator needs to see, with why and how often.
		opt.log().Warn("rendezvous: driver not reachable yet", "addr", addr, "try", try, "err", err, "retry_in", wait)
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("rendezvous: %w; last try: %w", ctx.Err(), err)
		case <-time.After(wait):
		}
		backoff = min(2*backoff, 2*time.Second)
	}
}
