package runcore

import (
	"strings"
	"testing"

	"github.com/nixlctl/nixlctl/internal/netpath"
)

func TestCheckAddr(t *testing.T) {
	for _, tc := range []struct {
		addr string
		ok   bool
	}{
		{"127.0.0.1:7400", true},
		{"host:1", true},
		{"[::1]:65535", true},
		{"nonsense", false},
		{"host:99999", false},
		{"host:0", false},
		{"host:http", false},
		{":7400", false},
		{"host:", false},
	} {
		if err := CheckAddr(tc.addr); (err == nil) != tc.ok {
			t.Errorf("%q: %v", tc.addr, err)
		}
	}
}

func TestCheckNetDevicesAt(t *testing.T) {
	devs := []netpath.Device{{Name: "lo"}, {Name: "eth0"}, {Name: "mlx5_0:1", Kind: netpath.InfiniBand}}
	for _, tc := range []struct {
		list string
		ok   bool
	}{{"eth0", true}, {"mlx5_0:1", true}, {"mlx5_0", true}, {"eth0,all", true}, {"bogus0", false}, {"eth0,eth1", false}} {
		err := CheckNetDevicesAt("decode", "node2", devs, tc.list)
		if (err == nil) != tc.ok {
			t.Errorf("%q: %v", tc.list, err)
		}
		if err != nil && (!strings.Contains(err.Error(), "node2") || !strings.Contains(err.Error(), "lo, eth0, mlx5_0:1")) {
			t.Errorf("%q: %v names neither the host nor its devices", tc.list, err)
		}
	}
}
