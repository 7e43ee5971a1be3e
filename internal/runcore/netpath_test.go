package runcore

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/nixlctl/nixlctl/internal/clocksync"
	"github.com/nixlctl/nixlctl/internal/ctl"
	"github.com/nixlctl/nixlctl/internal/netpath"
)

const fakeGB = 1_000_000_000

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

func fakeMoved(d fakeDev, tx, rx uint64) fakeDev { d.tx += tx; d.rx += rx; return d }

var prefillDecode = []PathEnd{{"prefill", nil, netpath.Send}, {"decode", nil, netpath.Receive}}

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
			np, warns := judgePath(prefillDecode, tc.before, tc.after, TwoEnds(fakeGB), tc.remote)
			if d := cmp.Diff(tc.wantWarn, warns); d != "" {
				t.Errorf("warnings (-want +got):\n%s", d)
			}
			if got := PathLine(np); got != tc.wantLine {
				t.Errorf("line %q\nwant %q", got, tc.wantLine)
			}
			if np["prefill"].Direction != netpath.Send || np["decode"].Direction != netpath.Receive {
				t.Errorf("directions: %+v", np)
			}
		})
	}
}

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
		w := &PathWatch{ends: []PathEnd{{Role: "decode"}}, after: []netReading{tt.after}}
		got := w.TCPChoiceWarnings(tt.transport)
		if len(got) != tt.want {
			t.Errorf("%s: %q", tt.name, got)
		}
		if tt.want == 1 && !strings.Contains(got[0], "eth0, docker0") {
			t.Errorf("%s: %q does not name the interfaces", tt.name, got[0])
		}
	}
}

func TestJudgePathPerEndpoint(t *testing.T) {
	const perPair = fakeGB / 4
	t.Run("2P x 2D across two hosts", func(t *testing.T) {
		ends := []PathEnd{{"prefill-0", nil, netpath.Send}, {"prefill-1", nil, netpath.Send}, {"decode-0", nil, netpath.Receive}, {"decode-1", nil, netpath.Receive}}
		a0, b0 := fakeStat("a", "", fakeEth0), fakeStat("b", "", fakeEth0)
		a1, b1 := fakeStat("a", "", fakeMoved(fakeEth0, fakeGB, 0)), fakeStat("b", "", fakeMoved(fakeEth0, 0, fakeGB))
		recs := []fakeRec{{Prefill: 0, Decode: 0, Bytes: perPair}, {Prefill: 0, Decode: 1, Bytes: perPair}, {Prefill: 1, Decode: 0, Bytes: perPair}, {Prefill: 1, Decode: 1, Bytes: perPair}}
		np, warns := judgePath(ends, []netReading{a0, a0, b0, b0}, []netReading{a1, a1, b1, b1}, fakePairBytes(recs, 2), true)
		if len(warns) != 0 {
			t.Errorf("warnings: %q", warns)
		}
		want := "prefill-0+prefill-1 (one host's counters) eth0 100% (953.67 MiB tx), decode-0+decode-1 (one host's counters) eth0 100% (953.67 MiB rx)"
		if got := PathLine(np); got != want {
			t.Errorf("line %q\nwant %q", got, want)
		}
		if d := cmp.Diff([]string{"prefill-1"}, np["prefill-0"].SharedWith); d != "" {
			t.Errorf("prefill-0 shared with (-want +got):\n%s", d)
		}
		if p := np["decode-1"].Payload; p != fakeGB {
			t.Errorf("decode-1 judged against %d bytes, want the host's %d", p, int64(fakeGB))
		}
	})
	t.Run("2P x 2D, every engine on its own host", func(t *testing.T) {
		ends := []PathEnd{{"prefill-0", nil, netpath.Send}, {"prefill-1", nil, netpath.Send}, {"decode-0", nil, netpath.Receive}, {"decode-1", nil, netpath.Receive}}
		var before, after []netReading
		for i, host := range []string{"p0", "p1", "d0", "d1"} {
			tx, rx := uint64(2*perPair), uint64(0)
			if i >= 2 {
				tx, rx = 0, 2*perPair
			}
			before, after = append(before, fakeStat(host, "", fakeEth0)), append(after, fakeStat(host, "", fakeMoved(fakeEth0, tx, rx)))
		}
		recs := []fakeRec{{Prefill: 0, Decode: 0, Bytes: perPair}, {Prefill: 0, Decode: 1, Bytes: perPair}, {Prefill: 1, Decode: 0, Bytes: perPair}, {Prefill: 1, Decode: 1, Bytes: perPair}}
		np, warns := judgePath(ends, before, after, fakePairBytes(recs, 2), true)
		if len(warns) != 0 {
			t.Errorf("warnings: %q", warns)
		}
		want := "prefill-0 eth0 100% (476.84 MiB tx), prefill-1 eth0 100% (476.84 MiB tx), decode-0 eth0 100% (476.84 MiB rx), decode-1 eth0 100% (476.84 MiB rx)"
		if got := PathLine(np); got != want {
			t.Errorf("line %q\nwant %q", got, want)
		}
	})
	t.Run("11 local decodes and one remote", func(t *testing.T) {
		ends := []PathEnd{{"prefill", nil, netpath.Send}}
		for i := range 12 {
			ends = append(ends, PathEnd{fmt.Sprintf("decode-%d", i), nil, netpath.Receive})
		}
		var recs []fakeRec
		for d := range 12 {
			recs = append(recs, fakeRec{Prefill: 0, Decode: d, Bytes: perPair})
		}
		before, after := []netReading{}, []netReading{}
		for range 12 { // prefill and decodes 0-10 on a, decode-11 on b
			before, after = append(before, fakeStat("a", "", fakeLo, fakeEth0)), append(after, fakeStat("a", "", fakeLo, fakeMoved(fakeEth0, perPair, 0)))
		}
		before, after = append(before, fakeStat("b", "", fakeEth0)), append(after, fakeStat("b", "", fakeMoved(fakeEth0, 0, perPair)))
		np, warns := judgePath(ends, before, after, fakePairBytes(recs, 1), true)
		if len(warns) != 0 {
			t.Errorf("warnings: %q", warns)
		}
		if v := np["decode-11"]; v.NoDevice || len(v.Carriers) == 0 || v.Carriers[0].Name != "eth0" || v.Carriers[0].Share != 1 {
			t.Errorf("the remote decode: %+v", v)
		}
		if v := np["prefill"]; v.NoDevice || v.Carriers[0].Share != 1 || v.Payload != perPair {
			t.Errorf("prefill, judged against what it sent off its host: %+v", v)
		}
		if v := np["decode-3"]; !v.NoDevice || len(v.SharedWith) != 10 {
			t.Errorf("a local decode: %+v", v)
		}
		line := PathLine(np)
		if !strings.Contains(line, "decode-0+decode-1+decode-2+decode-3+decode-4+decode-5+decode-6+decode-7+decode-8+decode-9+decode-10 (one host's counters) no device") ||
			!strings.HasSuffix(line, "decode-11 eth0 100% (238.42 MiB rx)") || !strings.HasPrefix(line, "prefill eth0 100%") {
			t.Errorf("line %q", line)
		}
	})
}

func TestNaturalCompare(t *testing.T) {
	got := []string{"decode-10", "decode-2", "decode-1", "decode", "decode-02x", "a9", "a10"}
	slices.SortFunc(got, naturalCompare)
	want := []string{"a9", "a10", "decode", "decode-1", "decode-2", "decode-02x", "decode-10"}
	if d := cmp.Diff(want, got); d != "" {
		t.Errorf("(-want +got):\n%s", d)
	}
}

var (
	fakeLo   = fakeDev{name: "lo", loopback: true}
	fakeEth0 = fakeDev{name: "eth0"}
	fakeIB   = fakeDev{name: "mlx5_0:1", kind: netpath.InfiniBand}
)

// fakeRec is a handoff record as far as path judging reads one: which
// prefill (0..n-1) sent how many bytes to which decode.
type fakeRec struct {
	Prefill, Decode int
	Bytes           int64
}

// fakePairBytes is the payload per pair of ends (n prefills, then the
// decodes), as a handoff run totals its records.
func fakePairBytes(recs []fakeRec, n int) PairBytes {
	by := map[[2]int]int64{}
	for _, r := range recs {
		by[[2]int{r.Prefill, n + r.Decode}] += r.Bytes
	}
	return func(i, j int) int64 {
		return by[[2]int{min(i, j), max(i, j)}]
	}
}
