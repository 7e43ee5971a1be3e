package runcore

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/nixlctl/nixlctl/internal/ctl"
	"github.com/nixlctl/nixlctl/internal/netpath"
	"github.com/nixlctl/nixlctl/internal/report"
)

// NetPath says which network devices carried a run's payload, by endpoint
// role ("prefill", "decode"; "initiator", "target"; "producer",
// "consumer"), from each endpoint's byte counters read before and after
// the timed phase.
type NetPath map[string]PathVerdict

// PathVerdict is one endpoint's part of NetPath.
type PathVerdict struct {
	Host string `json:"host,omitempty"`
	// NetDevices is UCX_NET_DEVICES at the endpoint ("" when unset).
	NetDevices string `json:"net_devices,omitempty"`
	netpath.Verdict
	// Error says why the counters could not be read: no verdict then.
	Error string `json:"error,omitempty"`
	// SharedWith names the endpoints that share this one's host-wide
	// counters and moved payload the same way: the verdict is theirs
	// together, judged against their bytes summed.
	SharedWith []string `json:"shared_with,omitempty"`
}

// PathEnd is an endpoint whose counters a run reads: dir is which way
// the payload crossed it (prefill and producers send, decode and
// consumers receive; the xfer initiator sends what it WRITEs).
type PathEnd struct {
	Role string
	RPC  *ctl.Client // nil: this process
	Dir  netpath.Direction
}

// PathWatch reads every endpoint's counters around a timed phase.
type PathWatch struct {
	ends []PathEnd
	// remote: an endpoint was asked for on another host, so a payload
	// over loopback or an unintended device is a surprise worth a warning.
	remote        bool
	before, after []netReading
}

type netReading struct {
	ns  ctl.NetStat
	err error
}

// NetstatTimeout bounds one endpoint's reading: a run whose endpoint
// hangs must not hang on its counters too.
const NetstatTimeout = 5 * time.Second

// WatchPath reads the counters before the timed phase.
func WatchPath(ctx context.Context, remote bool, ends ...PathEnd) *PathWatch {
	w := &PathWatch{ends: ends, remote: remote}
	w.before = w.read(ctx)
	return w
}

// Stop reads the counters after the timed phase.
func (w *PathWatch) Stop(ctx context.Context) { w.after = w.read(ctx) }

// read reads every endpoint at once, so that the readings are close in
// time. It outlives ctx: an interrupted run still says where its bytes
// went.
func (w *PathWatch) read(ctx context.Context) []netReading {
	out := make([]netReading, len(w.ends))
	done := make(chan struct{})
	for i, e := range w.ends {
		go func() {
			defer func() { done <- struct{}{} }()
			if e.RPC == nil {
				out[i].ns, out[i].err = ctl.LocalNetStat("/sys")
				return
			}
			c, cancel := context.WithTimeout(context.WithoutCancel(ctx), NetstatTimeout)
			defer cancel()
			out[i].ns, out[i].err = e.RPC.NetStat(c)
		}()
	}
	for range w.ends {
		<-done
	}
	return out
}

// PairBytes is how many payload bytes moved between ends i and j (by
// their index in pathWatch.ends) during the timed phase.
type PairBytes func(i, j int) int64

// TwoEnds is pairBytes of a run with two ends that moved payload between
// them (bench xfer, bench ec).
func TwoEnds(payload int64) PairBytes {
	return func(i, j int) int64 {
		if i != j {
			return payload
		}
		return 0
	}
}

// Verdicts attributes payload bytes (what moved during the timed phase)
// at every endpoint and warns, through warn, about what looks
// unintended.
func (w *PathWatch) Verdicts(pb PairBytes, warn func(string)) NetPath {
	if w == nil || w.after == nil {
		return nil
	}
	np, warnings := judgePath(w.ends, w.before, w.after, pb, w.remote)
	for _, s := range warnings {
		warn(s)
	}
	return np
}

// judgePath is verdicts' decision. Each endpoint is judged against its own
// bytes, not the run's: in 2P x 2D each engine moves about half. Endpoints
// of one host read one host-wide counter, so those that moved payload the
// same way are judged together, against their bytes summed, and say so
// (SharedWith) instead of each claiming the whole counter. Of those bytes
// only what crossed to another host is expected on a device: a group whose
// peers all share its host is judged as a one-host run (shared memory,
// loopback: notes), even when another of the run's endpoints is remote.
//
// Where every endpoint shares this host and none is pinned
// (UCX_NET_DEVICES), loopback and shared memory are what is expected, and
// are noted, not warned about. With a remote endpoint or a pin, loopback, a
// device the pin does not allow, and TCP beside RDMA ports warn; so does no
// device at all for bytes that crossed hosts, which means the counters do
// not see the path. Counters that cannot be read leave that endpoint's
// verdict empty, with the error, and warn nothing: the path is unknown,
// not wrong.
func judgePath(ends []PathEnd, before, after []netReading, pb PairBytes, remote bool) (NetPath, []string) {
	np := NetPath{}
	pinned := false
	// Hosts are machines here, told apart by their kernel's boot id
	// (which the containers of one machine share); counters are per
	// host as nixlctl stages hosts (a PID namespace with its network one).
	boots, hosts := map[string]bool{}, map[string]bool{}
	hostOf := make([]string, len(ends))
	for i := range ends {
		hostOf[i] = fmt.Sprintf("unknown-%d", i)
		if after[i].err == nil && before[i].err == nil {
			id := after[i].ns.Host.Identity
			pinned = pinned || netpath.ParsePin(after[i].ns.NetDevices).Pinned()
			boots[id.BootID] = true
			hostOf[i] = id.BootID + "/" + id.PIDNamespace + "/" + after[i].ns.Host.Hostname
			hosts[hostOf[i]] = true
		}
	}
	crossHost := len(boots) > 1
	type group struct {
		members       []int
		remote, local int64
	}
	var groups []*group
	byKey := map[string]*group{}
	for i, e := range ends {
		pv := PathVerdict{Host: after[i].ns.Host.Hostname, NetDevices: after[i].ns.NetDevices}
		switch {
		case before[i].err != nil:
			pv.Error = "before the run: " + before[i].err.Error()
		case after[i].err != nil:
			pv.Error = "after the run: " + after[i].err.Error()
		}
		var remoteB, localB int64
		for j := range ends {
			if j == i {
				continue
			}
			if hostOf[j] == hostOf[i] {
				localB += pb(i, j)
			} else {
				remoteB += pb(i, j)
			}
		}
		if pv.Error != "" {
			pv.Verdict = netpath.Verdict{Payload: remoteB + localB, Direction: e.Dir}
			np[e.Role] = pv
			continue
		}
		key := hostOf[i] + "/" + e.Dir.String()
		g := byKey[key]
		if g == nil {
			g = &group{}
			byKey[key] = g
			groups = append(groups, g)
		}
		g.members = append(g.members, i)
		g.remote += remoteB
		g.local += localB
	}
	var warnings []string
	for _, g := range groups {
		first := g.members[0]
		a, b, dir := after[first], before[first], ends[first].Dir
		payload := g.remote
		if payload == 0 {
			payload = g.local
		}
		strict := pinned || remote && (g.remote > 0 || len(hosts) == 1)
		deltas := netpath.Delta(b.ns.Snapshot, a.ns.Snapshot)
		pv := PathVerdict{Host: a.ns.Host.Hostname, NetDevices: a.ns.NetDevices}
		if strict {
			pv.Verdict = netpath.Attribute(deltas, payload, dir, netpath.ParsePin(a.ns.NetDevices))
			if pv.NoDevice && crossHost && g.remote > 0 && len(pv.Warnings) == 0 {
				pv.Warnings = append(pv.Warnings, fmt.Sprintf(
					"no network device of %s carried a significant share of the payload although the endpoints are on different hosts: its counters do not see the path (another network namespace?)",
					cmp.Or(pv.Host, "its host")))
			}
		} else {
			pv.Verdict = netpath.AttributeSameHost(deltas, payload, dir)
		}
		var names []string
		for _, i := range g.members {
			names = append(names, ends[i].Role)
		}
		slices.SortFunc(names, naturalCompare)
		for _, i := range g.members {
			v := pv
			if len(names) > 1 {
				for _, n := range names {
					if n != ends[i].Role {
						v.SharedWith = append(v.SharedWith, n)
					}
				}
			}
			np[ends[i].Role] = v
		}
		for _, s := range pv.Warnings {
			warnings = append(warnings, fmt.Sprintf("net path, %s: %s", strings.Join(names, "+"), s))
		}
	}
	return np, warnings
}

// shmPath is what a verdict with no carrying device means on one host.
const shmPath = "no device carried the payload: shared memory or cma"

// roleOrder is the order endpoints are rendered in: where the payload
// comes from first.
var roleOrder = []string{"prefill", "decode", "initiator", "target", "producer", "consumer"}

// PathLine renders NetPath in one line: each endpoint's devices with a
// significant share of the payload, "veth0 98% (1.02 GiB tx)". Empty
// when nothing was read.
func PathLine(np NetPath) string {
	if len(np) == 0 {
		return ""
	}
	roles := make([]string, 0, len(np))
	for r := range np {
		roles = append(roles, r)
	}
	slices.SortFunc(roles, func(a, b string) int {
		ia, ib := slices.Index(roleOrder, roleBase(a)), slices.Index(roleOrder, roleBase(b))
		if ia != ib {
			if ia < 0 {
				return 1
			}
			if ib < 0 {
				return -1
			}
			return ia - ib
		}
		return naturalCompare(a, b)
	})
	allShm := true
	for _, r := range roles {
		v := np[r]
		allShm = allShm && v.Error == "" && v.NoDevice && len(v.Warnings) == 0
	}
	if allShm {
		return shmPath
	}
	parts := make([]string, 0, len(roles))
	done := map[string]bool{}
	for _, r := range roles {
		if done[r] {
			continue
		}
		v := np[r]
		name := r
		if len(v.SharedWith) > 0 {
			group := append([]string{r}, v.SharedWith...)
			slices.SortFunc(group, naturalCompare)
			for _, g := range group {
				done[g] = true
			}
			name = strings.Join(group, "+") + " (one host's counters)"
		}
		parts = append(parts, name+" "+v.line())
	}
	return strings.Join(parts, ", ")
}

// roleBase is a role without its engine index: "prefill" of "prefill-3".
func roleBase(r string) string {
	if i := strings.LastIndexByte(r, '-'); i > 0 {
		if _, err := strconv.Atoi(r[i+1:]); err == nil {
			return r[:i]
		}
	}
	return r
}

// naturalCompare orders strings with their digit runs compared as numbers:
// decode-2 before decode-10.
func naturalCompare(a, b string) int {
	for a != "" && b != "" {
		da, db := digitRun(a), digitRun(b)
		if da > 0 && db > 0 {
			na, nb := strings.TrimLeft(a[:da], "0"), strings.TrimLeft(b[:db], "0")
			if c := cmp.Compare(len(na), len(nb)); c != 0 {
				return c
			}
			if c := strings.Compare(na, nb); c != 0 {
				return c
			}
			a, b = a[da:], b[db:]
			continue
		}
		if a[0] != b[0] {
			return cmp.Compare(a[0], b[0])
		}
		a, b = a[1:], b[1:]
	}
	return cmp.Compare(len(a), len(b))
}

func digitRun(s string) int {
	n := 0
	for n < len(s) && s[n] >= '0' && s[n] <= '9' {
		n++
	}
	return n
}

// line is one endpoint's part of pathLine.
func (v PathVerdict) line() string {
	switch {
	case v.Error != "":
		return "unknown (" + v.Error + ")"
	case v.Payload <= 0:
		return "no payload to attribute"
	case v.NoDevice && len(v.Warnings) == 0:
		return "no device (shared memory or cma)"
	case v.NoDevice:
		return "no device (see warnings)"
	}
	var cs []string
	for _, c := range v.Carriers {
		if c.Share >= netpath.SignificantShare {
			cs = append(cs, fmt.Sprintf("%s %.0f%% (%s %s)", c.Name, 100*c.Share, report.Bytes(c.Bytes), v.Direction))
		}
	}
	return strings.Join(cs, " + ")
}

// TCPChoiceWarnings warns, for a run whose data went over TCP with no
// UCX_NET_DEVICES pin, about each endpoint whose host had several network
// interfaces up that TCP could have used: UCX then picks by its own order,
// which may be the slow or the wrong one (docker0, a management NIC).
func (w *PathWatch) TCPChoiceWarnings(transport string) []string {
	if w == nil || w.after == nil || !strings.Contains(transport, "tcp/") {
		return nil
	}
	var out []string
	for i, e := range w.ends {
		a := w.after[i]
		if a.err != nil || netpath.ParsePin(a.ns.NetDevices).Pinned() {
			continue
		}
		var up []string
		for _, d := range a.ns.Snapshot.Devices {
			if d.Kind == netpath.Net && !d.Loopback && d.Up() {
				up = append(up, d.Name)
			}
		}
		if len(up) > 1 {
			out = append(out, fmt.Sprintf("%s: TCP carried the data and %d interfaces could have (%s): --net-devices pins the one you mean",
				e.Role, len(up), strings.Join(up, ", ")))
		}
	}
	return out
}
