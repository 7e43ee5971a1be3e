package rendezvous

import (
	"context"
	"strings"
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
// JoinEtcd), anything else the TCP driver's HOST:PORT (see Join).
func Register(ctx context.Context, addr string, h Hello, opt Options) (*Registration, error) {
	if strings.HasPrefix(addr, EtcdScheme) {
		return JoinEtcd(ctx, addr, h, opt)
	}
	return Join(ctx, addr, h, opt)
}
