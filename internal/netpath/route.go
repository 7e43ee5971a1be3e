package netpath

import (
	"fmt"
	"net"
)

// RouteDevice names the interface this host's routing table sends traffic
// to ip through (what `ip route get` answers), by connecting a UDP socket,
// which sends nothing, and finding the interface that holds its local
// address. It is the device to pin (UCX_NET_DEVICES) when UCX picked
// another one that does not reach the peer.
func RouteDevice(ip string) (string, error) {
	addr := net.ParseIP(ip)
	if addr == nil {
		return "", fmt.Errorf("%q is not an IP address", ip)
	}
	c, err := net.DialUDP("udp", nil, &net.UDPAddr{IP: addr, Port: 9})
	if err != nil {
		return "", fmt.Errorf("no route to %s: %w", ip, err)
	}
	local := c.LocalAddr().(*net.UDPAddr).IP
	c.Close()
	ifs, err := net.Interfaces()
	if err != nil {
		return "", err
	}
	for _, ifc := range ifs {
		addrs, err := ifc.Addrs()
		if err != nil {
			continue
		}
		for _, a := range addrs {
			if n, ok := a.(*net.IPNet); ok && n.IP.Equal(local) {
				return ifc.Name, nil
			}
		}
	}
	return "", fmt.Errorf("no interface holds %s, the address this host reaches %s from", local, ip)
}
