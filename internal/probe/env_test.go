package probe

import (
	"bytes"
	"context"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/nixlctl/nixlctl/internal/golden"
	"github.com/nixlctl/nixlctl/internal/procfs"
	"github.com/nixlctl/nixlctl/internal/report"
)

func findWarning(res *EnvResult, substr string) string {
	for _, w := range res.Warnings {
		if strings.Contains(w, substr) {
			return w
		}
	}
	return ""
}

// The real thing: a loopback between two processes over the ucx backend,
// every block checked, and no TCP on one host by default.
func TestEnvProvesThePath(t *testing.T) {
	res, err := RunEnv(context.Background(), EnvOptions{Backend: "ucx", Requests: 5, PeerModeCheck: true, Peer: testPeer(t)})
	if err != nil {
		t.Fatal(err)
	}
	p := res.Path
	if p == nil || p.Error != "" {
		t.Fatalf("path: %+v", p)
	}
	if p.Requests != 5 || p.Notifs != 5 || p.BlocksChecked == 0 || p.BlocksCorrupt != 0 {
		t.Errorf("the loopback did not move and verify what it says: %+v", p)
	}
	if p.TCP || p.Used == "" || !strings.HasPrefix(p.Transport, "rma: ") {
		t.Errorf("on one host the ucx backend should not use TCP: used %q, lanes %q", p.Used, p.Transport)
	}
	if w := findWarning(res, "TCP FALLBACK"); w != "" {
		t.Errorf("TCP fallback warning without a fallback: %s", w)
	}
	if res.PeerMode == nil || res.PeerMode.Requests != 5 {
		t.Errorf("peer-mode loopback: %+v", res.PeerMode)
	}
	if res.UCX.Library == "" || len(res.UCX.Devices) == 0 || res.Env.Backend != "ucx" {
		t.Errorf("UCX report: %+v, env %+v", res.UCX, res.Env)
	}
}

// UCX_TLS=tcp,self forces TCP: our backend still picks error mode "none"
// on one host, and its lanes put RMA on tcp; the warning must come from
// that lane report.
func TestEnvTCPFallbackWarning(t *testing.T) {
	t.Setenv("UCX_TLS", "tcp,self")
	res, err := RunEnv(context.Background(), EnvOptions{Backend: "ucx", Requests: 3, Peer: testPeer(t)})
	if err != nil {
		t.Fatal(err)
	}
	p := res.Path
	if p == nil || p.Error != "" || p.Requests != 3 {
		t.Fatalf("path: %+v", p)
	}
	// UCX 1.13 (protocols v1) has no one-sided lane over TCP: software
	// RMA over TCP active messages; newer UCX puts zero-copy over TCP.
	if !strings.Contains(p.Transport, "rma: tcp/") && !strings.Contains(p.Transport, "rma: emulated over active messages on tcp/") ||
		!strings.Contains(p.Transport, "error handling: none") {
		t.Errorf("lanes with UCX_TLS=tcp,self: %q", p.Transport)
	}
	if !p.TCP || !strings.HasPrefix(p.Used, "tcp on ") {
		t.Errorf("used %q, tcp %v", p.Used, p.TCP)
	}
	if w := findWarning(res, "TCP FALLBACK: this transfer used tcp on"); w == "" {
		t.Errorf("no TCP fallback warning: %q", res.Warnings)
	}
	if w := findWarning(res, "UCX_TLS=tcp,self: TCP only"); w == "" {
		t.Errorf("no UCX_TLS warning: %q", res.Warnings)
	}
}

// fakeUCX is a made-up UCX (an RDMA node) for the settings checks.
func fakeUCX() UCXReport {
	return UCXReport{Library: "1.18.0", InfoPath: "/usr/bin/ucx_info", Info: UCXBuild{Version: "1.18.0"}, InfoMatches: true,
		Devices: []UCXDevice{
			{MD: "tcp", Transport: "tcp", Device: "eth0", Type: "network", ErrorHandling: "peer failure, ep_check, keepalive"},
			{MD: "mlx5_0", Transport: "rc_mlx5", Device: "mlx5_0:1", Type: "network", ErrorHandling: "peer failure, ep_check"},
			{MD: "sysv", Transport: "sysv", Device: "memory", Type: "intra-node", ErrorHandling: "ep_check"},
			{MD: "cma", Transport: "cma", Device: "memory", Type: "intra-node", ErrorHandling: "peer failure, ep_check"},
		},
		RDMA: []string{"rc_mlx5"}, Settings: map[string]string{HookModeVar: "bistro"}, Set: map[string]bool{}, RcacheLimit: true}
}

func TestCheckSettings(t *testing.T) {
	tests := []struct {
		name string
		mut  func(*EnvResult)
		want []string // substrings of warnings
		not  []string
	}{
		{"RDMA with the leak defaults and low memlock", func(r *EnvResult) { r.System.MemlockSoft = 64 << 10 },
			[]string{"behind the known decode-side RSS leak", "RLIMIT_MEMLOCK is 64 KiB"}, []string{"TCP only"}},
		{"hooks off", func(r *EnvResult) {
			r.UCX.Settings[HookModeVar], r.UCX.Set[HookModeVar] = "none", true
			r.System.MemlockSoft = -1
		}, nil, []string{"RSS leak", "RLIMIT_MEMLOCK"}},
		{"TCP only", func(r *EnvResult) { r.UCX.Settings["UCX_TLS"], r.UCX.Set["UCX_TLS"] = "tcp", true },
			[]string{"UCX_TLS=tcp: TCP only"}, []string{"which this UCX does not have"}},
		{"no shared memory, and a transport UCX lacks", func(r *EnvResult) { r.UCX.Settings["UCX_TLS"], r.UCX.Set["UCX_TLS"] = "rc,ud,self", true },
			[]string{"has no shared-memory transport", "UCX_TLS names ud, which this UCX does not have"}, []string{"names rc,"}},
		{"an alias UCX has", func(r *EnvResult) { r.UCX.Settings["UCX_TLS"], r.UCX.Set["UCX_TLS"] = "sm,rc_x", true },
			nil, []string{"does not have", "no shared-memory"}},
		{"excluded transports are not checked", func(r *EnvResult) { r.UCX.Settings["UCX_TLS"], r.UCX.Set["UCX_TLS"] = "^tcp,cuda", true },
			nil, []string{"does not have", "TCP only"}},
		{"a device that is not there", func(r *EnvResult) {
			r.UCX.Settings["UCX_NET_DEVICES"], r.UCX.Set["UCX_NET_DEVICES"] = "mlx5_0:1,mlx5_3:1", true
		}, []string{"UCX_NET_DEVICES names mlx5_3:1"}, []string{"names mlx5_0:1"}},
		{"UCX 1.13 and peer mode", func(r *EnvResult) { r.UCX.Library = "1.13.1"; r.UCX.Info.Version = "1.13.1" },
			[]string{"UCX 1.13.1: sysv cannot serve endpoints with peer error handling"}, nil},
		{"GPUs without UCX CUDA transports", func(r *EnvResult) {
			r.CUDA = CUDAReport{Driver: true, DriverVersion: "12.4", GPUs: []GPUInfo{{Name: "H100"}}}
		}, []string{"1 GPU(s) with CUDA driver 12.4, but this UCX has no CUDA transports"}, nil},
		{"ucx_info of another UCX", func(r *EnvResult) { r.UCX.InfoMatches = false; r.UCX.Info.Version = "1.13.1" },
			[]string{"is UCX 1.13.1 but this process loaded libucp 1.18.0"}, nil},
	}
	for _, tc := range tests {
		res := &EnvResult{Meta: report.Meta{Warnings: []string{}}, UCX: fakeUCX(), System: SystemReport{MemlockSoft: -1},
			CUDA: CUDAReport{Reason: "no CUDA driver"}, NIXL: NIXLReport{Reason: "fake"}}
		tc.mut(res)
		checkSettings(res)
		for _, w := range tc.want {
			if findWarning(res, w) == "" {
				t.Errorf("%s: no warning with %q in %q", tc.name, w, res.Warnings)
			}
		}
		for _, w := range tc.not {
			if got := findWarning(res, w); got != "" {
				t.Errorf("%s: unexpected warning %q", tc.name, got)
			}
		}
	}
}

func TestPathUsed(t *testing.T) {
	for _, tc := range []struct {
		p    PathReport
		used string
		tcp  bool
	}{
		{PathReport{Transport: "rma: cma/memory (zero-copy); lanes: am=sysv/memory rma_bw=cma/memory; error handling: none"}, "cma on memory (zero-copy RMA)", false},
		{PathReport{Transport: "rma: tcp/lo,tcp/eth0 (zero-copy); lanes: rma_bw=tcp/lo,tcp/eth0"}, "tcp on lo, tcp on eth0 (zero-copy RMA)", true},
		{PathReport{Transport: "rma: emulated over active messages on tcp/lo (software RMA: each side copies every byte); lanes: am=tcp/lo"}, "tcp on lo, RMA emulated over active messages (each side copies every byte)", true},
		{PathReport{Transport: "rma: emulated over active messages on sysv/memory (software RMA: each side copies every byte); lanes: am=sysv/memory rma_bw=cma/memory"}, "sysv on memory, RMA emulated over active messages (each side copies every byte)", false},
		{PathReport{Transport: "rma: rc_mlx5/mlx5_0:1 (one-sided); lanes: rma=rc_mlx5/mlx5_0:1"}, "rc_mlx5 on mlx5_0:1 (one-sided RMA)", false},
		{PathReport{Transport: "rma: shared-memory mapping (sysv/posix: a memcpy into the peer's segment); lanes: am=posix/memory"}, "a shared-memory mapping (sysv/posix): a memcpy into the peer's segment", false},
		{PathReport{Transport: "rma: tcp/lo (zero-copy)", Protocols: ParseProtoInfo(readTestdata(t, "proto_info_1.22.txt"))},
			"cma on memory (UCX's protocol table for ucp_put*)", false}, // UCX's own table wins over the lanes
		{PathReport{}, "", false},
	} {
		used, tcp := pathUsed(&tc.p)
		if used != tc.used || tcp != tc.tcp {
			t.Errorf("%q: got %q %v, want %q %v", tc.p.Transport, used, tcp, tc.used, tc.tcp)
		}
	}
}

func TestParseNvidiaSMI(t *testing.T) {
	got := ParseNvidiaSMI("0, NVIDIA H100 80GB HBM3, 81559, 550.54.15\n1, NVIDIA H100 80GB HBM3, 81559, 550.54.15\ngarbage\n")
	want := CUDAReport{Driver: true, Source: "nvidia-smi", DriverVersion: "550.54.15", GPUs: []GPUInfo{
		{Index: 0, Name: "NVIDIA H100 80GB HBM3", MemBytes: 81559 << 20}, {Index: 1, Name: "NVIDIA H100 80GB HBM3", MemBytes: 81559 << 20}}}
	if d := cmp.Diff(want, got); d != "" {
		t.Error(d)
	}
	if r := ParseNvidiaSMI("No devices were found"); r.Driver {
		t.Errorf("no devices: %+v", r)
	}
}

func FuzzParseNvidiaSMI(f *testing.F) {
	f.Add("0, NVIDIA H100, 81559, 550.54.15\n")
	f.Fuzz(func(t *testing.T, s string) {
		r := ParseNvidiaSMI(s)
		for _, g := range r.GPUs {
			if g.MemBytes < 0 {
				t.Errorf("negative memory: %+v", g)
			}
		}
	})
}

// This machine's CUDA answer is whatever it is, but it is an answer.
func TestProbeCUDA(t *testing.T) {
	r := ProbeCUDA()
	if !r.Driver && !strings.HasPrefix(r.Reason, "no CUDA driver") && !strings.Contains(r.Reason, "nvidia-smi") {
		t.Errorf("no driver and no clear reason: %+v", r)
	}
	t.Logf("%+v", r)
}

func TestWriteEnv(t *testing.T) {
	res := &EnvResult{Meta: report.Meta{Schema: report.Schema, Command: "probe env", Warnings: []string{"TCP FALLBACK: a warning"},
		Host: report.Host{CPUs: 2, Kernel: "6.1"}}, UCX: fakeUCX(), Notes: []string{"a note"},
		NIXL:   NIXLReport{BuiltIn: true, Available: true, Version: "/opt/nixl/lib/libnixl_capi.so", PluginDir: "/opt/nixl/lib/plugins", Plugins: []string{"UCX"}},
		CUDA:   CUDAReport{Driver: true, DriverVersion: "12.4", Source: "libcuda.so.1", GPUs: []GPUInfo{{Index: 0, Name: "NVIDIA H100 80GB HBM3", MemBytes: 80 << 30}}},
		System: SystemReport{MemlockSoft: -1, MemlockHard: -1, MemInfo: procfs.MemInfo{TotalBytes: 1 << 40, HugePagesTotal: 16, HugePagesFree: 16, HugePageBytes: 2 << 20}, THP: "madvise"},
		Path: &PathReport{Backend: "nixl", Asked: 20, Requests: 20, Bytes: 40 << 20, Notifs: 20, BlocksChecked: 256, Used: "rc_mlx5 on mlx5_0:1 (UCX's protocol table for ucp_put*)",
			Protocols: []ProtoTable{{Operation: "remote memory write by ucp_put* from host memory to host", Ranges: []ProtoRange{{"0..inf", "zero-copy", "rc_mlx5/mlx5_0:1"}}}}},
	}
	var b bytes.Buffer
	if err := report.Write(&b, report.FormatTable, res); err != nil {
		t.Fatal(err)
	}
	golden.Check(t, "env_screen.txt", b.Bytes())
	b.Reset()
	if err := report.Write(&b, report.FormatCSV, res); err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(b.String(), "section,key,value\nucx,library,libucp 1.18.0") || !strings.Contains(b.String(), "path,used,this transfer used rc_mlx5") {
		t.Errorf("CSV:\n%s", b.String())
	}
}

func TestUniqueTables(t *testing.T) {
	put := ProtoTable{Operation: "remote memory write by ucp_put* from host memory to host", Ranges: []ProtoRange{{"0..inf", "zero-copy", "cma/memory"}}}
	am := ProtoTable{Operation: "active message by ucp_am_send* from host memory", Ranges: []ProtoRange{{"0..92", "short", "tcp/lo"}, {"93..inf", "copy-in", "tcp/lo"}}}
	cut := ProtoTable{Operation: am.Operation, Ranges: am.Ranges[:1]}
	got := uniqueTables([]ProtoTable{put, am, put, cut, am})
	if d := cmp.Diff([]ProtoTable{put, am}, got); d != "" {
		t.Error(d)
	}
	if got := amTransports(got); len(got) != 1 || got[0] != "tcp/lo" {
		t.Errorf("am transports: %q", got)
	}
}
