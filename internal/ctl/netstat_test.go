package ctl

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/nixlctl/nixlctl/internal/netpath"
)

// writeFakeSysfs lays out a fake sysfs tree: one net device and one RDMA
// port (whose counters are in 4-byte words).
func writeFakeSysfs(t *testing.T, root string, ethTx, ibTxWords int) {
	t.Helper()
	for path, content := range map[string]string{
		"class/net/eth0/statistics/tx_bytes":                      itoa(ethTx),
		"class/net/eth0/statistics/rx_bytes":                      "7",
		"class/net/eth0/operstate":                                "up",
		"class/net/eth0/type":                                     "1",
		"class/infiniband/mlx5_0/ports/1/counters/port_xmit_data": itoa(ibTxWords),
		"class/infiniband/mlx5_0/ports/1/counters/port_rcv_data":  "0",
		"class/infiniband/mlx5_0/ports/1/link_layer":              "InfiniBand",
		"class/infiniband/mlx5_0/ports/1/state":                   "4: ACTIVE",
	} {
		p := filepath.Join(root, path)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(content+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

func itoa(n int) string { return fmt.Sprint(n) }

// Every role answers ctl.netstat itself: its host, the counters under its
// sysfs root, and its UCX_NET_DEVICES. Two readings attribute a payload.
func TestNetStatBuiltin(t *testing.T) {
	t.Setenv("UCX_NET_DEVICES", "mlx5_0:1")
	root := t.TempDir()
	writeFakeSysfs(t, root, 1000, 0)
	c := StartInProcess(context.Background(), func(s *Server) func() { s.sysRoot = root; return nil })
	defer c.Close(time.Second, nil)
	ctx := context.Background()
	before, err := c.NetStat(ctx)
	if err != nil {
		t.Fatal(err)
	}
	want := netpath.Snapshot{Devices: []netpath.Device{
		{Name: "mlx5_0:1", Kind: netpath.InfiniBand, State: "ACTIVE", LinkLayer: "InfiniBand"},
		{Name: "eth0", Kind: netpath.Net, State: "up", TxBytes: 1000, RxBytes: 7},
	}}
	if d := cmp.Diff(want, before.Snapshot); d != "" {
		t.Error(d)
	}
	if before.NetDevices != "mlx5_0:1" || before.Host.Hostname == "" || before.Host.Identity.BootID == "" {
		t.Errorf("net devices %q, host %+v", before.NetDevices, before.Host)
	}
	writeFakeSysfs(t, root, 2000, 250_000_000)
	after, err := c.NetStat(ctx)
	if err != nil {
		t.Fatal(err)
	}
	v := netpath.Attribute(netpath.Delta(before.Snapshot, after.Snapshot), 1_000_000_000, netpath.Send, netpath.ParsePin(after.NetDevices))
	if len(v.Carriers) != 2 || v.Carriers[0].Name != "mlx5_0:1" || v.Carriers[0].Share != 1 || len(v.Warnings) != 0 {
		t.Errorf("verdict %+v", v)
	}
}

// A tree that does not parse is the call's error, not a dead session.
func TestNetStatError(t *testing.T) {
	t.Parallel()
	root := t.TempDir()
	writeFakeSysfs(t, root, 1, 1)
	if err := os.WriteFile(filepath.Join(root, "class/net/eth0/type"), []byte("ether\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	c := StartInProcess(context.Background(), func(s *Server) func() { s.sysRoot = root; return nil })
	defer c.Close(time.Second, nil)
	if _, err := c.NetStat(context.Background()); err == nil {
		t.Fatal("no error from a garbage tree")
	}
	if _, err := c.Host(context.Background()); err != nil {
		t.Errorf("the session died with the error: %v", err)
	}
}

// On this machine's real /sys, where there is one, it parses.
func TestNetStatLive(t *testing.T) {
	t.Parallel()
	if _, err := os.Stat("/sys/class/net"); err != nil {
		t.Skip("no /sys/class/net")
	}
	c := StartInProcess(context.Background(), func(*Server) func() { return nil })
	defer c.Close(time.Second, nil)
	ns, err := c.NetStat(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if len(ns.Snapshot.Devices) == 0 {
		t.Error("no devices")
	}
}
