package netpath

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
)

// netDev and ibPort describe a fake sysfs entry; writeSysfs lays them out
// the way the kernel does (counters in bytes for net, in 4-byte words for
// RDMA).
type netDev struct {
	name   string
	typ    int
	state  string
	tx, rx uint64
}

type ibPort struct {
	dev              string
	port             int
	linkLayer, state string
	txWords, rxWords uint64
}

func write(t *testing.T, path, content string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

func writeSysfs(t *testing.T, root string, nets []netDev, ibs []ibPort) {
	t.Helper()
	for _, n := range nets {
		dir := filepath.Join(root, "class/net", n.name)
		write(t, filepath.Join(dir, "statistics/tx_bytes"), strconv.FormatUint(n.tx, 10)+"\n")
		write(t, filepath.Join(dir, "statistics/rx_bytes"), strconv.FormatUint(n.rx, 10)+"\n")
		write(t, filepath.Join(dir, "operstate"), n.state+"\n")
		write(t, filepath.Join(dir, "type"), strconv.Itoa(n.typ)+"\n")
	}
	for _, p := range ibs {
		dir := filepath.Join(root, "class/infiniband", p.dev, "ports", strconv.Itoa(p.port))
		write(t, filepath.Join(dir, "counters/port_xmit_data"), strconv.FormatUint(p.txWords, 10)+"\n")
		write(t, filepath.Join(dir, "counters/port_rcv_data"), strconv.FormatUint(p.rxWords, 10)+"\n")
		write(t, filepath.Join(dir, "link_layer"), p.linkLayer+"\n")
		write(t, filepath.Join(dir, "state"), p.state+"\n")
	}
}

// take builds a fake tree, snapshots it, and returns the snapshot.
func take(t *testing.T, nets []netDev, ibs []ibPort) Snapshot {
	t.Helper()
	root := t.TempDir()
	writeSysfs(t, root, nets, ibs)
	s, err := Take(root)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

const gb = 1_000_000_000

var (
	lo   = netDev{name: "lo", typ: 772, state: "unknown"}
	eth0 = netDev{name: "eth0", typ: 1, state: "up"}
	eth1 = netDev{name: "eth1", typ: 1, state: "up"}
	veth = netDev{name: "veth0", typ: 1, state: "up"}
	mlx  = ibPort{dev: "mlx5_0", port: 1, linkLayer: "InfiniBand", state: "4: ACTIVE"}
)

// moved returns d with its counters advanced.
func moved(d netDev, tx, rx uint64) netDev { d.tx += tx; d.rx += rx; return d }

func movedWords(p ibPort, tx, rx uint64) ibPort { p.txWords += tx; p.rxWords += rx; return p }

func TestTake(t *testing.T) {
	got := take(t,
		[]netDev{moved(eth0, 10, 20), moved(lo, 5, 5), {name: "loop7", typ: 772, state: "unknown"}},
		[]ibPort{movedWords(mlx, 100, 200), {dev: "mlx5_1", port: 1, linkLayer: "Ethernet", state: "1: DOWN"}})
	want := Snapshot{Devices: []Device{
		{Name: "mlx5_0:1", Kind: InfiniBand, State: "ACTIVE", LinkLayer: "InfiniBand", TxBytes: 400, RxBytes: 800},
		{Name: "mlx5_1:1", Kind: InfiniBand, State: "DOWN", LinkLayer: "Ethernet"},
		{Name: "eth0", Kind: Net, State: "up", TxBytes: 10, RxBytes: 20},
		{Name: "lo", Kind: Net, Loopback: true, State: "unknown", TxBytes: 5, RxBytes: 5},
		{Name: "loop7", Kind: Net, Loopback: true, State: "unknown"},
	}}
	if d := cmp.Diff(want, got); d != "" {
		t.Error(d)
	}
	if !got.Devices[0].Up() || got.Devices[1].Up() || !got.Devices[3].Up() {
		t.Error("Up is wrong")
	}
}

func TestTakeErrors(t *testing.T) {
	if _, err := Take(t.TempDir()); err == nil || !strings.Contains(err.Error(), "class/net") {
		t.Errorf("no /sys/class/net: err %v", err)
	}
	for _, tc := range []struct {
		name, file, content string
	}{
		{"garbage counter", "class/net/eth0/statistics/tx_bytes", "lots\n"},
		{"negative counter", "class/net/eth0/statistics/rx_bytes", "-1\n"},
		{"garbage type", "class/net/eth0/type", "ether\n"},
		{"empty operstate", "class/net/eth0/operstate", "\n"},
		{"garbage RDMA counter", "class/infiniband/mlx5_0/ports/1/counters/port_rcv_data", "0x10\n"},
		{"garbage port state", "class/infiniband/mlx5_0/ports/1/state", "ACTIVE\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			root := t.TempDir()
			writeSysfs(t, root, []netDev{eth0}, []ibPort{mlx})
			write(t, filepath.Join(root, tc.file), tc.content)
			_, err := Take(root)
			if err == nil || !strings.Contains(err.Error(), filepath.Join(root, tc.file)) {
				t.Errorf("err %v, want it to name %s", err, tc.file)
			}
		})
	}
	// A device that lacks a file (rather than vanishing) is an error too.
	root := t.TempDir()
	writeSysfs(t, root, []netDev{eth0}, nil)
	if err := os.Remove(filepath.Join(root, "class/net/eth0/statistics/rx_bytes")); err != nil {
		t.Fatal(err)
	}
	if _, err := Take(root); err == nil || !strings.Contains(err.Error(), "rx_bytes") {
		t.Errorf("missing rx_bytes: err %v", err)
	}
}

// The real /sys, where there is one: it must parse.
func TestTakeLive(t *testing.T) {
	if _, err := os.Stat("/sys/class/net"); err != nil {
		t.Skip("no /sys/class/net")
	}
	s, err := Take("/sys")
	if err != nil {
		t.Fatal(err)
	}
	if len(s.Devices) == 0 {
		t.Error("no devices")
	}
}

var approx = cmpopts.EquateApprox(0, 1e-9)

func TestAttribute(t *testing.T) {
	for _, tc := range []struct {
		name          string
		before, after []netDev
		ibBefore      []ibPort
		ibAfter       []ibPort
		payload       int64
		dir           Direction
		pin           string
		want          Verdict
	}{
		{
			name:    "veth carries 95%",
			before:  []netDev{lo, eth0, veth},
			after:   []netDev{lo, moved(eth0, 40_000, 0), moved(veth, 950_000_000, 3_000_000)},
			payload: gb, dir: Send,
			want: Verdict{Payload: gb, Direction: Send, Carriers: []Carrier{
				{Name: "veth0", Kind: Net, Bytes: 950_000_000, Share: 0.95},
				{Name: "eth0", Kind: Net, Bytes: 40_000, Share: 0.00004},
			}},
		},
		{
			name:    "received side counts rx",
			before:  []netDev{veth},
			after:   []netDev{moved(veth, 3_000_000, 960_000_000)},
			payload: gb, dir: Receive,
			want: Verdict{Payload: gb, Direction: Receive, Carriers: []Carrier{
				{Name: "veth0", Kind: Net, Bytes: 960_000_000, Share: 0.96},
			}},
		},
		{
			name:    "loopback, share capped",
			before:  []netDev{lo, eth0},
			after:   []netDev{moved(lo, 1_030_000_000, 1_030_000_000), eth0},
			payload: gb, dir: Send,
			want: Verdict{Payload: gb, Direction: Send,
				Carriers: []Carrier{{Name: "lo", Kind: Net, Loopback: true, Bytes: 1_030_000_000, Share: 1}},
				Warnings: []string{"the payload went over loopback (lo, 100%): both ends are on this host"},
			},
		},
		{
			name:    "pinned mismatch",
			before:  []netDev{eth0, eth1},
			after:   []netDev{moved(eth0, 1000, 0), moved(eth1, 990_000_000, 0)},
			payload: gb, dir: Send, pin: "eth0",
			want: Verdict{Payload: gb, Direction: Send,
				Carriers: []Carrier{
					{Name: "eth1", Kind: Net, Bytes: 990_000_000, Share: 0.99},
					{Name: "eth0", Kind: Net, Bytes: 1000, Share: 0.000001},
				},
				Warnings: []string{"the payload went over eth1 (99%), which UCX_NET_DEVICES=eth0 does not allow"},
			},
		},
		{
			name:     "pin names an RDMA port, TCP carried it",
			before:   []netDev{eth0},
			after:    []netDev{moved(eth0, gb, 0)},
			ibBefore: []ibPort{mlx}, ibAfter: []ibPort{mlx},
			payload: gb, dir: Send, pin: "mlx5_0:1",
			want: Verdict{Payload: gb, Direction: Send,
				Carriers: []Carrier{{Name: "eth0", Kind: Net, Bytes: gb, Share: 1}},
				Warnings: []string{
					"the payload went over eth0 (100%), which UCX_NET_DEVICES=mlx5_0:1 does not allow",
					"the payload went over TCP (eth0, 100%) although RDMA ports are up (mlx5_0:1)",
				},
			},
		},
		{
			name:     "RDMA up but TCP used; RDMA counts words",
			before:   []netDev{eth0},
			after:    []netDev{moved(eth0, 1_010_000_000, 0)},
			ibBefore: []ibPort{mlx}, ibAfter: []ibPort{movedWords(mlx, 250, 250)},
			payload: gb, dir: Send,
			want: Verdict{Payload: gb, Direction: Send,
				Carriers: []Carrier{
					{Name: "eth0", Kind: Net, Bytes: 1_010_000_000, Share: 1},
					{Name: "mlx5_0:1", Kind: InfiniBand, Bytes: 1000, Share: 0.000001},
				},
				Warnings: []string{"the payload went over TCP (eth0, 100%) although RDMA ports are up (mlx5_0:1)"},
			},
		},
		{
			name:     "RDMA carried it: 250M words are 1 GB",
			before:   []netDev{eth0},
			after:    []netDev{moved(eth0, 20_000, 0)},
			ibBefore: []ibPort{mlx}, ibAfter: []ibPort{movedWords(mlx, 250_000_000, 1000)},
			payload: gb, dir: Send, pin: "mlx5_0:1",
			want: Verdict{Payload: gb, Direction: Send, Carriers: []Carrier{
				{Name: "mlx5_0:1", Kind: InfiniBand, Bytes: gb, Share: 1},
				{Name: "eth0", Kind: Net, Bytes: 20_000, Share: 0.00002},
			}},
		},
		{
			name:    "nothing carried it: shared memory",
			before:  []netDev{lo, eth0},
			after:   []netDev{lo, moved(eth0, 5000, 5000)},
			payload: gb, dir: Send,
			want: Verdict{Payload: gb, Direction: Send, NoDevice: true,
				Carriers: []Carrier{{Name: "eth0", Kind: Net, Bytes: 5000, Share: 0.000005}},
				Notes: []string{"no network device sent a significant share of the 1000000000-byte payload: " +
					"it moved through shared memory or another path inside this host"},
			},
		},
		{
			name:    "a counter went backwards",
			before:  []netDev{moved(eth0, 5_000_000_000, 7)},
			after:   []netDev{moved(eth0, 1000, 7)},
			payload: gb, dir: Send,
			want: Verdict{Payload: gb, Direction: Send, NoDevice: true,
				Warnings: []string{"eth0: counters went backwards (tx 5000000000 -> 1000, rx 7 -> 7): reset or wrapped; its bytes are unknown"},
				Notes:    []string{"no device with readable counters sent a significant share of the 1000000000-byte payload"},
			},
		},
		{
			name:     "a saturated RDMA counter",
			ibBefore: []ibPort{movedWords(mlx, 1<<32-10, 0)}, ibAfter: []ibPort{movedWords(mlx, 1<<32-1, 0)},
			before: []netDev{veth}, after: []netDev{moved(veth, gb, 0)},
			payload: gb, dir: Send,
			want: Verdict{Payload: gb, Direction: Send,
				Carriers: []Carrier{{Name: "veth0", Kind: Net, Bytes: gb, Share: 1}},
				Warnings: []string{"mlx5_0:1: counters saturated at their 32-bit limit; its bytes are unknown"},
			},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			deltas := Delta(take(t, tc.before, tc.ibBefore), take(t, tc.after, tc.ibAfter))
			for _, d := range deltas {
				if d.Tx < 0 || d.Rx < 0 {
					t.Errorf("negative bytes: %+v", d)
				}
			}
			got := Attribute(deltas, tc.payload, tc.dir, ParsePin(tc.pin))
			if d := cmp.Diff(tc.want, got, approx); d != "" {
				t.Error(d)
			}
		})
	}
}

func TestDeltaDevicesComeAndGo(t *testing.T) {
	before := Snapshot{Devices: []Device{{Name: "veth0", Kind: Net, TxBytes: 10}, {Name: "veth1", Kind: Net}}}
	after := Snapshot{Devices: []Device{{Name: "veth0", Kind: Net, TxBytes: 30, State: "up"}, {Name: "veth2", Kind: Net, TxBytes: 99}}}
	want := []DeviceBytes{
		{Name: "veth0", Kind: Net, Up: true, Tx: 20},
		{Name: "veth2", Kind: Net, Note: "appeared during the run; its bytes are unknown"},
		{Name: "veth1", Kind: Net, Note: "disappeared during the run; its bytes are unknown"},
	}
	if d := cmp.Diff(want, Delta(before, after)); d != "" {
		t.Error(d)
	}
}

func TestParsePin(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want Pin
	}{
		{"", Pin{}},
		{"all", Pin{}},
		{"eth0", Pin{Devices: []string{"eth0"}}},
		{" mlx5_0:1, eth0 ,", Pin{Devices: []string{"mlx5_0:1", "eth0"}}},
		{"^lo", Pin{Devices: []string{"lo"}, Exclude: true}},
		{"eth0,all", Pin{}},
		{"^", Pin{}},
	} {
		if d := cmp.Diff(tc.want, ParsePin(tc.in)); d != "" {
			t.Errorf("%q: %s", tc.in, d)
		}
	}
	for _, tc := range []struct {
		pin, dev string
		want     bool
	}{
		{"", "eth0", true},
		{"eth0", "eth0", true},
		{"eth0", "eth1", false},
		{"^lo", "lo", false},
		{"^lo", "eth0", true},
	} {
		if got := ParsePin(tc.pin).Allows(tc.dev); got != tc.want {
			t.Errorf("%q allows %s = %v", tc.pin, tc.dev, got)
		}
	}
}

// Counter files are outside input: garbage is an error naming the file,
// never a panic or a silent zero.
func FuzzParsers(f *testing.F) {
	for _, s := range []string{"123\n", "0", "18446744073709551615\n", "18446744073709551616", "-1", "up\n", "4: ACTIVE\n", "772", "", " \n", "x:y", "\xff"} {
		f.Add([]byte(s))
	}
	const path = "/sys/class/net/eth0/statistics/tx_bytes"
	f.Fuzz(func(t *testing.T, b []byte) {
		check := func(what string, err error) {
			if err != nil && !strings.Contains(err.Error(), path) {
				t.Fatalf("%s: error %q does not name the file", what, err)
			}
		}
		v, err := parseCounter(path, b)
		check("counter", err)
		if err == nil && strconv.FormatUint(v, 10) != strings.TrimLeft(strings.TrimSpace(string(b)), "+0") && v != 0 {
			t.Fatalf("counter %q read as %d", b, v)
		}
		_, err = parseType(path, b)
		check("type", err)
		w, err := parseWord(path, b)
		check("word", err)
		if err == nil && (w == "" || strings.ContainsAny(w, " \t\n")) {
			t.Fatalf("word %q from %q", w, b)
		}
		_, err = parseIBState(path, b)
		check("state", err)
	})
}

func FuzzParsePin(f *testing.F) {
	for _, s := range []string{"", "all", "eth0", "^lo,eth0", "mlx5_0:1,,", "^all"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		p := ParsePin(s)
		for _, d := range p.Devices {
			if strings.HasPrefix(d, "^") {
				t.Skip() // "^" only means "exclude" at the start of the value
			}
		}
		if q := ParsePin(p.String()); p.Pinned() && !cmp.Equal(p, q) {
			t.Fatalf("%q -> %+v -> %q -> %+v", s, p, p.String(), q)
		}
	})
}

func TestAttributeNoPayload(t *testing.T) {
	v := Attribute([]DeviceBytes{{Name: "eth0", Kind: Net, Tx: 500}}, 0, Send, Pin{})
	want := Verdict{Carriers: []Carrier{{Name: "eth0", Kind: Net, Bytes: 500}}}
	if d := cmp.Diff(want, v); d != "" {
		t.Error(d)
	}
}

// On one host with nothing pinned, loopback and TCP beside RDMA are the
// expected paths, and unreadable counters hide nothing asked for: notes,
// never warnings. A pin still warns.
func TestAttributeSameHost(t *testing.T) {
	for _, tc := range []struct {
		name          string
		before, after []netDev
		ibBefore      []ibPort
		ibAfter       []ibPort
		want          Verdict
	}{
		{
			name:   "loopback",
			before: []netDev{lo, eth0}, after: []netDev{moved(lo, gb, gb), eth0},
			want: Verdict{Payload: gb, Direction: Receive,
				Carriers: []Carrier{{Name: "lo", Kind: Net, Loopback: true, Bytes: gb, Share: 1}},
				Notes:    []string{"the payload went over loopback (lo, 100%): both ends are on this host"}},
		},
		{
			name:   "TCP beside RDMA",
			before: []netDev{veth}, after: []netDev{moved(veth, gb, gb)},
			ibBefore: []ibPort{mlx}, ibAfter: []ibPort{mlx},
			want: Verdict{Payload: gb, Direction: Receive,
				Carriers: []Carrier{{Name: "veth0", Kind: Net, Bytes: gb, Share: 1}},
				Notes:    []string{"the payload went over TCP (veth0, 100%) although RDMA ports are up (mlx5_0:1)"}},
		},
		{
			name:   "shared memory, a counter reset",
			before: []netDev{lo, moved(eth0, 500, 500)}, after: []netDev{lo, eth0},
			want: Verdict{Payload: gb, Direction: Receive, NoDevice: true,
				Notes: []string{"eth0: counters went backwards (tx 500 -> 0, rx 500 -> 0): reset or wrapped; its bytes are unknown",
					"no device with readable counters received a significant share of the 1000000000-byte payload"}},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := AttributeSameHost(Delta(take(t, tc.before, tc.ibBefore), take(t, tc.after, tc.ibAfter)), gb, Receive)
			if d := cmp.Diff(tc.want, got, approx); d != "" {
				t.Error(d)
			}
		})
	}
}

// A verdict travels as JSON (results, the control channel) and comes back
// the same; the direction is its counter's name.
func TestVerdictJSON(t *testing.T) {
	v := Verdict{Payload: gb, Direction: Receive, Carriers: []Carrier{{Name: "mlx5_0:1", Kind: InfiniBand, Bytes: gb, Share: 1}},
		Warnings: []string{"w"}, Notes: []string{"n"}}
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(b), `"direction":"rx"`) || !strings.Contains(string(b), `"kind":"infiniband"`) {
		t.Errorf("JSON %s", b)
	}
	var back Verdict
	if err := json.Unmarshal(b, &back); err != nil {
		t.Fatal(err)
	}
	if d := cmp.Diff(v, back); d != "" {
		t.Error(d)
	}
	if err := json.Unmarshal([]byte(`{"direction":"up"}`), &back); err == nil {
		t.Error("direction up: no error")
	}
}
