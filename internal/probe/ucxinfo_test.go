package probe

import (
	"os"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func readTestdata(t testing.TB, name string) string {
	t.Helper()
	b, err := os.ReadFile("testdata/" + name)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func TestParseUCXVersion(t *testing.T) {
	old := ParseUCXVersion(readTestdata(t, "ucx_info_v_1.13.txt"))
	if old.Version != "1.13.1" || old.Library != "" || old.Transports != "with-verbs enable-cma" {
		t.Errorf("1.13: %+v", old)
	}
	cur := ParseUCXVersion(readTestdata(t, "ucx_info_v_1.22.txt"))
	if cur.Version != "1.22.0" || cur.Library != "/work/nixl-prefix/ucx/lib/libucs.so.0" {
		t.Errorf("1.22: %+v", cur)
	}
	if want := "without-cuda without-rocm enable-cma without-verbs without-rdmacm without-knem without-xpmem without-ugni without-gdrcopy without-ze without-fuse3 without-mad"; cur.Transports != want {
		t.Errorf("1.22 build flags:\n got %s\nwant %s", cur.Transports, want)
	}
}

func TestParseUCXDevices(t *testing.T) {
	got := ParseUCXDevices(readTestdata(t, "ucx_info_d_1.13.txt"))
	want := []UCXDevice{
		{MD: "self", Component: "self", Transport: "self", Device: "memory0", Type: "loopback", SystemDevice: "<unknown>", ErrorHandling: "ep_check"},
		{MD: "tcp", Component: "tcp", Transport: "tcp", Device: "lo", Type: "network", SystemDevice: "<unknown>", ErrorHandling: "peer failure, ep_check, keepalive"},
		{MD: "tcp", Component: "tcp", Transport: "tcp", Device: "eth0", Type: "network", SystemDevice: "<unknown>", ErrorHandling: "peer failure, ep_check, keepalive"},
		{MD: "sysv", Component: "sysv", Transport: "sysv", Device: "memory", Type: "intra-node", SystemDevice: "<unknown>", ErrorHandling: "ep_check"},
		{MD: "posix", Component: "posix", Transport: "posix", Device: "memory", Type: "intra-node", SystemDevice: "<unknown>", ErrorHandling: "ep_check"},
		{MD: "cma", Component: "cma", Transport: "cma", Device: "memory", Type: "intra-node", SystemDevice: "<unknown>", ErrorHandling: "peer failure, ep_check"},
	}
	if d := cmp.Diff(want, got); d != "" {
		t.Errorf("1.13 (-want +got):\n%s", d)
	}
	if n := len(ParseUCXDevices(readTestdata(t, "ucx_info_d_1.22.txt"))); n != 6 {
		t.Errorf("1.22: %d devices, want 6", n)
	}
}

func TestParseProtoInfo(t *testing.T) {
	got := ParseProtoInfo(readTestdata(t, "proto_info_1.22.txt"))
	if len(got) != 4 {
		t.Fatalf("%d tables, want 4 (the last one cut short): %+v", len(got), got)
	}
	put := ProtoTable{Context: "ucp_context_0 intra-node cfg#0", Operation: "remote memory write by ucp_put* from host memory to host",
		Ranges: []ProtoRange{{Range: "0..inf", Description: "zero-copy", Config: "cma/memory"}}}
	if d := cmp.Diff(put, got[0]); d != "" {
		t.Errorf("put table (-want +got):\n%s", d)
	}
	if r := got[1].Ranges; len(r) != 3 || r[2] != (ProtoRange{"5029..inf", "(?) rendezvous zero-copy read from remote", "cma/memory"}) {
		t.Errorf("am table: %+v", got[1])
	}
	if len(ParseProtoInfo("no tables here\n| x |\n+--+\n")) != 0 {
		t.Error("tables out of nothing")
	}
}

func TestParseUCXConfig(t *testing.T) {
	got := ParseUCXConfig("# comment\nUCX_TLS=tcp,self\nUCX_NET_DEVICES=all\nnot=this\nUCX_ BAD=x\n")
	if d := cmp.Diff(map[string]string{"UCX_TLS": "tcp,self", "UCX_NET_DEVICES": "all"}, got); d != "" {
		t.Error(d)
	}
}

func FuzzParseUCXDevices(f *testing.F) {
	f.Add(readTestdata(f, "ucx_info_d_1.13.txt"))
	f.Add("# Transport: tcp\n# Device: lo\n# Memory domain: x\n# Device: y")
	f.Fuzz(func(t *testing.T, s string) {
		for _, d := range ParseUCXDevices(s) {
			_ = d.Transport + d.Device
		}
		_ = ParseUCXVersion(s)
		_ = ParseUCXConfig(s)
	})
}

func FuzzParseProtoInfo(f *testing.F) {
	f.Add(readTestdata(f, "proto_info_1.22.txt"))
	f.Add("+--+\n| a |\n| b |\n+--+\n| Range | Description | Config |\n+--+\n| 0..inf | x | tcp/lo |\n")
	f.Fuzz(func(t *testing.T, s string) {
		for _, tb := range ParseProtoInfo(s) {
			if len(tb.Ranges) == 0 {
				t.Errorf("empty table returned: %+v", tb)
			}
		}
	})
}
