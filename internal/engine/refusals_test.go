package engine

import (
	"net"
	"testing"
)

// The refusals that the CLI, the bench and the engine share are one
// function each, with one message.
func TestCheckPP(t *testing.T) {
	for _, tc := range []struct {
		p    Protocol
		pp   int
		fail bool
	}{
		{ProtoSGLang, 1, false},
		{ProtoSGLang, 2, true},
		{ProtoPull, 2, false},
		{ProtoPush, 4, false},
	} {
		err := CheckPP(tc.p, tc.pp)
		if (err != nil) != tc.fail {
			t.Errorf("CheckPP(%s, %d) = %v, want failure %v", tc.p, tc.pp, err, tc.fail)
		}
	}
}

func TestNoAdvertise(t *testing.T) {
	for host, want := range map[string]bool{"": true, "0.0.0.0": true, "::": true, "127.0.0.1": false, "10.0.0.2": false, "node-a": false} {
		if Unroutable(host) != want {
			t.Errorf("Unroutable(%q) = %v, want %v", host, !want, want)
		}
	}
	const want = `side channel tcp://0.0.0.0:5600 binds every address: give --advertise HOST, the address the peers reach this host by`
	if _, err := advertisedHost("tcp://0.0.0.0:5600", ""); err == nil || err.Error() != want {
		t.Errorf("advertisedHost: %v, want %s", err, want)
	}
	if h, err := advertisedHost("tcp://0.0.0.0:5600", "10.0.0.2"); err != nil || h != "10.0.0.2" {
		t.Errorf("advertisedHost with --advertise: %q, %v", h, err)
	}
	var cfg Config
	err := SideChannelHost{Bind: "0.0.0.0"}.apply(&cfg, &net.UnixAddr{Name: "ctl", Net: "unix"})
	if want := "--listen host 0.0.0.0 binds every address: give --advertise HOST, the address the peers reach this host by"; err == nil || err.Error() != want {
		t.Errorf("apply on a connection with no address: %v, want %s", err, want)
	}
	if err := (SideChannelHost{Bind: "0.0.0.0"}).apply(&cfg, &net.TCPAddr{IP: net.IPv4(10, 0, 0, 3)}); err != nil || cfg.Advertise != "10.0.0.3" {
		t.Errorf("apply on a TCP connection: advertise %q, %v", cfg.Advertise, err)
	}
}
