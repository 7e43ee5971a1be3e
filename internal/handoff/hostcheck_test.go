package handoff

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/nixlctl/nixlctl/internal/runcore"
)

func TestValidHost(t *testing.T) {
	for _, tc := range []struct {
		host string
		ok   bool
	}{
		{"localhost", true}, {"node-1.cluster.local", true}, {"10.0.0.1", true}, {"::1", true}, {"[::1]", true},
		{"my_host", true}, {"a.b.", true},
		{"!!", false}, {"", false}, {"-a", false}, {"a-", false}, {"a..b", false}, {"b@d", false}, {"a b", false},
		{"x:1", false}, {string(make([]byte, 64)), false},
	} {
		if got := runcore.ValidHost(tc.host); got != tc.ok {
			t.Errorf("ValidHost(%q) = %v, want %v", tc.host, got, tc.ok)
		}
	}
}

func TestCheckNetDevices(t *testing.T) {
	root := t.TempDir()
	for _, d := range []string{"net/eth1", "infiniband/mlx5_0/ports/1"} {
		if err := os.MkdirAll(filepath.Join(root, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for _, tc := range []struct {
		list string
		ok   bool
	}{
		{"all", true}, {"eth1", true}, {"mlx5_0:1", true}, {"mlx5_0", true}, {"eth1,mlx5_0:1", true},
		{"bogus0", false}, {"mlx5_0:2", false}, {"eth1,", false}, {"eth1,bogus0", false}, {"eth1:1", false},
	} {
		if err := runcore.CheckNetDevices(root, tc.list); (err == nil) != tc.ok {
			t.Errorf("checkNetDevices(%q) = %v, want ok %v", tc.list, err, tc.ok)
		}
	}
}
