package ctl

import (
	"context"
	"os"

	"github.com/nixlctl/nixlctl/internal/netpath"
)

// netstatMethod answers NetStat: the server's host's network byte
// counters, so that a driver can tell which device carried a run's bytes
// at every endpoint, wherever it runs.
const netstatMethod = "ctl.netstat"

// NetStat is one endpoint's network counters at one moment, and what it
// lets UCX use.
type NetStat struct {
	Host     HostInfo         `json:"host"`
	Snapshot netpath.Snapshot `json:"snapshot"`
	// NetDevices is UCX_NET_DEVICES in the endpoint's environment as it
	// is now ("" when unset): an engine sets it from its configuration.
	NetDevices string `json:"net_devices"`
}

// LocalNetStat reads this process's NetStat from the sysfs tree at root
// ("/sys"; tests pass a fake one).
func LocalNetStat(root string) (NetStat, error) {
	h, err := LocalHostInfo()
	if err != nil {
		return NetStat{}, err
	}
	snap, err := netpath.Take(root)
	if err != nil {
		return NetStat{}, err
	}
	return NetStat{Host: h, Snapshot: snap, NetDevices: os.Getenv("UCX_NET_DEVICES")}, nil
}

// answerNetStat reads the counters off the reading goroutine: a host
// with hundreds of interfaces takes a while, and clock pings must not
// wait behind it. Close waits for it like for any request.
func (s *Server) answerNetStat(id uint64) {
	root := s.sysRoot
	if root == "" {
		root = "/sys"
	}
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		ns, err := LocalNetStat(root)
		if s.local != nil {
			ns.Host.Addr = s.local.String()
		}
		s.reply(id, ns, err)
	}()
}

// NetStat asks the server for its host's network counters.
func (c *Client) NetStat(ctx context.Context) (NetStat, error) {
	var ns NetStat
	err := c.Call(ctx, netstatMethod, nil, &ns)
	return ns, err
}
