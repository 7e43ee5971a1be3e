package bench

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/nixlctl/nixlctl/internal/clocksync"
	"github.com/nixlctl/nixlctl/internal/ctl"
	"github.com/nixlctl/nixlctl/internal/engine"
	"github.com/nixlctl/nixlctl/internal/netpath"
	"github.com/nixlctl/nixlctl/internal/nixl"
)

const fakeGB = 1_000_000_000

// fakeDev is a fake device's counters; fakeStat a fake endpoint's reading
// on the host booted as boot.
type fakeDev struct {
	name     string
	kind     netpath.Kind
	loopback bool
	tx, rx   uint64
}

func fakeStat(boot, netDevices string, devs ...fakeDev) netReading {
	ns := ctl.NetStat{Host: ctl.HostInfo{Hostname: "host-" + boot, Identity: clocksync.HostIdentity{BootID: boot, PIDNamespace: "pid:[1]"}},
		NetDevices: netDevices}
	for _, d := range devs {
		kind, state := netpath.Net, "up"
		if d.kind == netpath.InfiniBand {
			kind, state = d.kind, "ACTIVE"
		}
		ns.Snapshot.Devices = append(ns.Snapshot.Devices, netpath.Device{Name: d.name, Kind: kind, Loopback: d.loopback,
			State: state, TxBytes: d.tx, RxBytes: d.rx})
	}
	return netReading{ns: ns}
}

var (
	fakeLo   = fakeDev{name: "lo", loopback: true}
	fakeEth0 = fakeDev{name: "eth0"}
	fakeIB   = fakeDev{name: "mlx5_0:1", kind: netpath.InfiniBand}
)

func fakeMoved(d fakeDev, tx, rx uint64) fakeDev { d.tx += tx; d.rx += rx; return d }

var prefillDecode = []pathEnd{{"prefill", nil, netpath.Send}, {"decode", nil, netpath.Receive}}

func TestJudgePath(t *testing.T) {
	for _, tc := range []struct {
		name          string
		before, after []netReading
		remote        bool
		wantWarn      []string
		wantLine      string
	}{
		{
			name:     "one host, shared memory",
			before:   []netReading{fakeStat("a", "", fakeLo, fakeEth0), fakeStat("a", "", fakeLo, fakeEth0)},
			after:    []netReading{fakeStat("a", "", fakeLo, fakeMoved(fakeEth0, 900, 900)), fakeStat("a", "", fakeLo, fakeMoved(fakeEth0, 900, 900))},
			wantLine: "no device carried the payload: shared memory or cma",
		},
		{
			name:     "one host, loopback is no surprise",
			before:   []netReading{fakeStat("a", "", fakeLo), fakeStat("a", "", fakeLo)},
			after:    []netReading{fakeStat("a", "", fakeMoved(fakeLo, fakeGB, fakeGB)), fakeStat("a", "", fakeMoved(fakeLo, fakeGB, fakeGB))},
			wantLine: "prefill lo 100% (953.67 MiB tx), decode lo 100% (953.67 MiB rx)",
		},
		{
			name:   "remote, loopback warns",
			remote: true,
			before: []netReading{fakeStat("a", "", fakeLo), fakeStat("a", "", fakeLo)},
			after:  []netReading{fakeStat("a", "", fakeMoved(fakeLo, fakeGB, fakeGB)), fakeStat("a", "", fakeMoved(fakeLo, fakeGB, fakeGB))},
			wantWarn: []string{"net path, prefill: the payload went over loopback (lo, 100%): both ends are on this host",
				"net path, decode: the payload went over loopback (lo, 100%): both ends are on this host"},
			wantLine: "prefill lo 100% (953.67 MiB tx), decode lo 100% (953.67 MiB rx)",
		},
		{
			name:     "remote over RDMA, two hosts",
			remote:   true,
			before:   []netReading{fakeStat("a", "", fakeEth0, fakeIB), fakeStat("b", "", fakeEth0, fakeIB)},
			after:    []netReading{fakeStat("a", "", fakeMoved(fakeEth0, 5000, 0), fakeMoved(fakeIB, 980_000_000, 0)), fakeStat("b", "", fakeEth0, fakeMoved(fakeIB, 0, 990_000_000))},
			wantLine: "prefill mlx5_0:1 98% (934.6 MiB tx), decode mlx5_0:1 99% (944.14 MiB rx)",
		},
		{
			name:     "remote over TCP beside RDMA",
			remote:   true,
			before:   []netReading{fakeStat("a", "", fakeEth0, fakeIB), fakeStat("b", "", fakeEth0)},
			after:    []netReading{fakeStat("a", "", fakeMoved(fakeEth0, fakeGB, 0), fakeIB), fakeStat("b", "", fakeMoved(fakeEth0, 0, fakeGB))},
			wantWarn: []string{"net path, prefill: the payload went over TCP (eth0, 100%) although RDMA ports are up (mlx5_0:1)"},
			wantLine: "prefill eth0 100% (953.67 MiB tx), decode eth0 100% (953.67 MiB rx)",
		},
		{
			name:     "one host but pinned: the pin is checked",
			before:   []netReading{fakeStat("a", "mlx5_0:1", fakeLo, fakeIB), fakeStat("a", "mlx5_0:1", fakeLo, fakeIB)},
			after:    []netReading{fakeStat("a", "mlx5_0:1", fakeMoved(fakeLo, fakeGB, fakeGB), fakeIB), fakeStat("a", "mlx5_0:1", fakeMoved(fakeLo, fakeGB, fakeGB), fakeIB)},
			wantWarn: []string{"net path, prefill: the payload went over loopback (lo, 100%): both ends are on this host", "net path, prefill: the payload went over lo (100%), which UCX_NET_DEVICES=mlx5_0:1 does not allow", "net path, decode: the payload went over loopback (lo, 100%): both ends are on this host", "net path, decode: the payload went over lo (100%), which UCX_NET_DEVICES=mlx5_0:1 does not allow"},
			wantLine: "prefill lo 100% (953.67 MiB tx), decode lo 100% (953.67 MiB rx)",
		},
		{
			name:     "two hosts, no device: the counters miss the path",
			remote:   true,
			before:   []netReading{fakeStat("a", "", fakeEth0), fakeStat("b", "", fakeEth0)},
			after:    []netReading{fakeStat("a", "", fakeEth0), fakeStat("b", "", fakeMoved(fakeEth0, 0, fakeGB))},
			wantWarn: []string{"net path, prefill: no network device of host-a carried a significant share of the payload although the endpoints are on different hosts: its counters do not see the path (another network namespace?)"},
			wantLine: "prefill no device (see warnings), decode eth0 100% (953.67 MiB rx)",
		},
		{
			name:     "an endpoint that cannot say",
			remote:   true,
			before:   []netReading{{err: errors.New(`unknown method "ctl.netstat"`)}, fakeStat("b", "", fakeEth0)},
			after:    []netReading{{err: errors.New(`unknown method "ctl.netstat"`)}, fakeStat("b", "", fakeMoved(fakeEth0, 0, fakeGB))},
			wantLine: `prefill unknown (before the run: unknown method "ctl.netstat"), decode eth0 100% (953.67 MiB rx)`,
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			np, warns := judgePath(prefillDecode, tc.before, tc.after, fakeGB, tc.remote)
			if d := cmp.Diff(tc.wantWarn, warns); d != "" {
				t.Errorf("warnings (-want +got):\n%s", d)
			}
			if got := pathLine(np); got != tc.wantLine {
				t.Errorf("line %q\nwant %q", got, tc.wantLine)
			}
			if np["prefill"].Direction != netpath.Send || np["decode"].Direction != netpath.Receive {
				t.Errorf("directions: %+v", np)
			}
		})
	}
}

func TestXferPathEnds(t *testing.T) {
	for _, tc := range []struct {
		op       nixl.Op
		ini, tgt netpath.Direction
	}{{nixl.Write, netpath.Send, netpath.Receive}, {nixl.Read, netpath.Receive, netpath.Send}} {
		e := xferPathEnds(tc.op, nil)
		if e[0].role != "initiator" || e[0].dir != tc.ini || e[1].role != "target" || e[1].dir != tc.tgt {
			t.Errorf("%v: %+v", tc.op, e)
		}
	}
	o := smallXfer(nixl.Write)
	o.LargeBlkIterFtr = 10
	got := xferPayload(&o, []XferPoint{{BlockSize: 4096, BatchSize: 2}, {BlockSize: 2 << 20, BatchSize: 1}})
	if want := int64(4096*2*(50+5) + 2<<20*(5+0)); got != want {
		t.Errorf("xfer payload %d, want %d", got, want)
	}
}

// A local run, both endpoints child processes of this host: every
// endpoint has a verdict on the whole payload and nothing warns, whether
// UCX took shared memory or loopback.
func TestNetPathLocalRun(t *testing.T) {
	t.Setenv("UCX_NET_DEVICES", "")
	t.Run("handoff", func(t *testing.T) {
		o := handoffOpts(t, engine.ProtoPull, 1, 1)
		o.Requests = 3
		res, err := RunHandoff(context.Background(), o)
		if err != nil {
			t.Fatal(err)
		}
		checkLocalPath(t, res.NetPath, res.Warnings, handoffPayload(res.Records), "prefill", "decode")
		if handoffPayload(res.Records) < res.Summary.Bytes {
			t.Errorf("payload %d is less than the summary's %d bytes", handoffPayload(res.Records), res.Summary.Bytes)
		}
	})
	t.Run("xfer", func(t *testing.T) {
		o := smallXfer(nixl.Read)
		o.MaxBlock, o.MaxBatch = 8<<10, 2
		res, err := RunXfer(context.Background(), o)
		if err != nil {
			t.Fatal(err)
		}
		checkLocalPath(t, res.NetPath, res.Warnings, xferPayload(&o, res.Points), "initiator", "target")
		if res.NetPath["initiator"].Direction != netpath.Receive {
			t.Error("a READ's initiator receives")
		}
	})
	t.Run("ec", func(t *testing.T) {
		o := smallEC(nixl.Read)
		o.Requests = 10
		res, err := RunEC(context.Background(), o)
		if err != nil {
			t.Fatal(err)
		}
		checkLocalPath(t, res.NetPath, res.Warnings, res.Summary.Bytes, "producer", "consumer")
	})
}

func checkLocalPath(t *testing.T, np NetPath, warnings []string, payload int64, roles ...string) {
	t.Helper()
	for _, w := range warnings {
		if strings.HasPrefix(w, "net path") {
			t.Errorf("a local run warns: %s", w)
		}
	}
	for _, r := range roles {
		v, ok := np[r]
		if !ok || v.Error != "" || v.Payload != payload || payload <= 0 || v.Host == "" {
			t.Errorf("%s: verdict %+v (payload %d)", r, v, payload)
		}
	}
	if pathLine(np) == "" {
		t.Error("no path line")
	}
	t.Logf("path: %s", pathLine(np))
}

// TCP with several interfaces up and no pin warns, naming them; a pin, one
// interface, or a transport other than TCP does not.
func TestTCPChoiceWarnings(t *testing.T) {
	t.Parallel()
	dev := func(name string, lo bool) netpath.Device {
		return netpath.Device{Name: name, Kind: netpath.Net, Loopback: lo, State: "up"}
	}
	reading := func(pin string, devs ...netpath.Device) netReading {
		return netReading{ns: ctl.NetStat{NetDevices: pin, Snapshot: netpath.Snapshot{Devices: devs}}}
	}
	tcp := "rma: emulated over active messages on tcp/eth0; error handling: peer"
	tests := []struct {
		name      string
		transport string
		after     netReading
		want      int
	}{
		{"two up, unpinned", tcp, reading("", dev("lo", true), dev("eth0", false), dev("docker0", false)), 1},
		{"pinned", tcp, reading("eth0", dev("eth0", false), dev("docker0", false)), 0},
		{"one up", tcp, reading("", dev("lo", true), dev("eth0", false)), 0},
		{"shared memory", "rma: sysv/memory", reading("", dev("eth0", false), dev("docker0", false)), 0},
	}
	for _, tt := range tests {
		w := &pathWatch{ends: []pathEnd{{role: "decode"}}, after: []netReading{tt.after}}
		got := w.tcpChoiceWarnings(tt.transport)
		if len(got) != tt.want {
			t.Errorf("%s: %q", tt.name, got)
		}
		if tt.want == 1 && !strings.Contains(got[0], "eth0, docker0") {
			t.Errorf("%s: %q does not name the interfaces", tt.name, got[0])
		}
	}
}
