package netpath

import (
	"cmp"
	"fmt"
	"math"
	"slices"
	"strings"
)

// DeviceBytes is what one device moved between two snapshots.
type DeviceBytes struct {
	Name      string `json:"name"`
	Kind      Kind   `json:"kind"`
	Loopback  bool   `json:"loopback,omitempty"`
	Up        bool   `json:"up"` // as of the later snapshot
	LinkLayer string `json:"link_layer,omitempty"`
	Tx        int64  `json:"tx_bytes"`
	Rx        int64  `json:"rx_bytes"`
	// Note, when set, says why Tx and Rx are unknown (left at zero): a
	// counter went backwards, saturated, or the device came or went. A
	// reset counter must not read as a huge or negative transfer.
	Note string `json:"note,omitempty"`
}

// Delta is each device's bytes moved from before to after, in after's
// order, then devices that disappeared.
func Delta(before, after Snapshot) []DeviceBytes {
	type key struct {
		kind Kind
		name string
	}
	prev := make(map[key]Device, len(before.Devices))
	for _, d := range before.Devices {
		prev[key{d.Kind, d.Name}] = d
	}
	out := make([]DeviceBytes, 0, len(after.Devices))
	for _, a := range after.Devices {
		db := DeviceBytes{Name: a.Name, Kind: a.Kind, Loopback: a.Loopback, Up: a.Up(), LinkLayer: a.LinkLayer}
		b, ok := prev[key{a.Kind, a.Name}]
		delete(prev, key{a.Kind, a.Name})
		switch {
		case !ok:
			db.Note = "appeared during the run; its bytes are unknown"
		case a.TxBytes < b.TxBytes || a.RxBytes < b.RxBytes:
			db.Note = fmt.Sprintf("counters went backwards (tx %d -> %d, rx %d -> %d): reset or wrapped; its bytes are unknown",
				b.TxBytes, a.TxBytes, b.RxBytes, a.RxBytes)
		case a.Saturated:
			db.Note = "counters saturated at their 32-bit limit; its bytes are unknown"
		case a.TxBytes-b.TxBytes > math.MaxInt64 || a.RxBytes-b.RxBytes > math.MaxInt64:
			db.Note = "counters moved implausibly far; its bytes are unknown"
		default:
			db.Tx, db.Rx = int64(a.TxBytes-b.TxBytes), int64(a.RxBytes-b.RxBytes)
		}
		out = append(out, db)
	}
	for _, b := range before.Devices {
		if _, ok := prev[key{b.Kind, b.Name}]; ok {
			out = append(out, DeviceBytes{Name: b.Name, Kind: b.Kind, Loopback: b.Loopback, LinkLayer: b.LinkLayer,
				Note: "disappeared during the run; its bytes are unknown"})
		}
	}
	return out
}

// Direction is which counter of this endpoint's devices the payload moved
// through.
type Direction int

const (
	// Send: this endpoint sent the payload (tx counters).
	Send Direction = iota
	// Receive: this endpoint received the payload (rx counters).
	Receive
)

func (d Direction) String() string {
	if d == Receive {
		return "rx"
	}
	return "tx"
}

// MarshalText writes the direction as its counter's name, "tx" or "rx".
func (d Direction) MarshalText() ([]byte, error) { return []byte(d.String()), nil }

// UnmarshalText reads "tx" or "rx".
func (d *Direction) UnmarshalText(b []byte) error {
	switch string(b) {
	case "tx":
		*d = Send
	case "rx":
		*d = Receive
	default:
		return fmt.Errorf("direction %q: want tx or rx", b)
	}
	return nil
}

// SignificantShare is the share of the payload below which a device's
// traffic is background (ssh, the control channel, a metrics scraper)
// rather than a path the payload took. A payload split across rails still
// puts far more than this on each.
const SignificantShare = 0.10

// Carrier is one device's part in moving the payload.
type Carrier struct {
	Name     string `json:"name"`
	Kind     Kind   `json:"kind"`
	Loopback bool   `json:"loopback,omitempty"`
	Bytes    int64  `json:"bytes"`
	// Share is Bytes over the payload, capped at 1: protocol headers and
	// other traffic push a device above 100%, which says nothing more
	// about where the payload went. Zero when the payload is unknown.
	Share float64 `json:"share"`
}

// Verdict says which devices carried a payload and what looks wrong.
type Verdict struct {
	Payload   int64     `json:"payload_bytes"`
	Direction Direction `json:"direction"`
	// Carriers are the devices that moved bytes in Direction, most first.
	Carriers []Carrier `json:"carriers,omitempty"`
	// NoDevice is set when no device carried a significant share: the
	// payload moved through shared memory or another path inside one host
	// (or the counters are unknown; see Warnings).
	NoDevice bool `json:"no_device,omitempty"`
	// Warnings are paths the user probably did not intend, and counters
	// that could not be read.
	Warnings []string `json:"warnings,omitempty"`
	// Notes explain the path without implying a failure.
	Notes []string `json:"notes,omitempty"`
}

// Pin is UCX_NET_DEVICES parsed: the devices UCX may use.
type Pin struct {
	Devices []string
	// Exclude inverts the list ("^eth0": any device but these).
	Exclude bool
}

// ParsePin reads a UCX_NET_DEVICES value: a comma-separated list of net
// devices ("eth0") and RDMA ports ("mlx5_0:1"), "all" (or empty) for no
// pin, and a leading "^" to exclude the list instead.
func ParsePin(s string) Pin {
	var p Pin
	s = strings.TrimSpace(s)
	if rest, ok := strings.CutPrefix(s, "^"); ok {
		p.Exclude, s = true, rest
	}
	for f := range strings.SplitSeq(s, ",") {
		f = strings.TrimSpace(f)
		if f == "" {
			continue
		}
		if f == "all" && !p.Exclude {
			return Pin{}
		}
		p.Devices = append(p.Devices, f)
	}
	if len(p.Devices) == 0 {
		return Pin{}
	}
	return p
}

// Pinned reports whether the pin restricts anything.
func (p Pin) Pinned() bool { return len(p.Devices) > 0 }

// Allows reports whether the pin lets UCX use a device.
func (p Pin) Allows(name string) bool {
	if !p.Pinned() {
		return true
	}
	return slices.Contains(p.Devices, name) != p.Exclude
}

// Attribute says which devices carried a payload of payloadBytes that this
// endpoint moved in dir, and warns about loopback, a device the pin does
// not allow, and TCP used while RDMA ports are up. With no payload
// (payloadBytes <= 0) it only lists the carriers: there is nothing to
// attribute.
func Attribute(deltas []DeviceBytes, payloadBytes int64, dir Direction, pin Pin) Verdict {
	return attribute(deltas, payloadBytes, dir, pin, false)
}

// AttributeSameHost is Attribute for a run whose endpoints all share this
// host and pin no device. Loopback and shared memory are the paths
// expected there, so loopback, and TCP beside RDMA ports, are notes
// rather than warnings; so are counters that could not be read, which
// hide no path the user asked for.
func AttributeSameHost(deltas []DeviceBytes, payloadBytes int64, dir Direction) Verdict {
	return attribute(deltas, payloadBytes, dir, Pin{}, true)
}

func attribute(deltas []DeviceBytes, payloadBytes int64, dir Direction, pin Pin, sameHost bool) Verdict {
	v := Verdict{Payload: payloadBytes, Direction: dir}
	// expected is what a same-host run only notes.
	expected := func(msg string) {
		if sameHost {
			v.Notes = append(v.Notes, msg)
		} else {
			v.Warnings = append(v.Warnings, msg)
		}
	}
	var rdmaUp []string
	unknown := false
	for _, d := range deltas {
		if d.Note != "" {
			expected(fmt.Sprintf("%s: %s", d.Name, d.Note))
			unknown = true
			continue
		}
		if d.Kind == InfiniBand && d.Up {
			rdmaUp = append(rdmaUp, d.Name)
		}
		n := d.Tx
		if dir == Receive {
			n = d.Rx
		}
		if n <= 0 {
			continue
		}
		c := Carrier{Name: d.Name, Kind: d.Kind, Loopback: d.Loopback, Bytes: n}
		if payloadBytes > 0 {
			c.Share = min(1, float64(n)/float64(payloadBytes))
		}
		v.Carriers = append(v.Carriers, c)
	}
	slices.SortStableFunc(v.Carriers, func(a, b Carrier) int {
		if c := cmp.Compare(b.Bytes, a.Bytes); c != 0 {
			return c
		}
		return strings.Compare(a.Name, b.Name)
	})
	if payloadBytes <= 0 {
		return v
	}
	var significant []Carrier
	for _, c := range v.Carriers {
		if c.Share >= SignificantShare {
			significant = append(significant, c)
		}
	}
	if len(significant) == 0 {
		v.NoDevice = true
		if unknown {
			// Unreadable counters may hide the path.
			v.Notes = append(v.Notes, fmt.Sprintf(
				"no device with readable counters %s a significant share of the %d-byte payload", verb(dir), payloadBytes))
		} else {
			v.Notes = append(v.Notes, fmt.Sprintf(
				"no network device %s a significant share of the %d-byte payload: it moved through shared memory or another path inside this host",
				verb(dir), payloadBytes))
		}
		return v
	}
	rdmaCarried := false
	for _, c := range significant {
		if c.Kind == InfiniBand {
			rdmaCarried = true
		}
	}
	for _, c := range significant {
		if c.Loopback {
			expected(fmt.Sprintf("the payload went over loopback (%s, %s): both ends are on this host", c.Name, pct(c.Share)))
		}
		if !pin.Allows(c.Name) {
			v.Warnings = append(v.Warnings, fmt.Sprintf(
				"the payload went over %s (%s), which UCX_NET_DEVICES=%s does not allow", c.Name, pct(c.Share), pin))
		}
		if c.Kind == Net && !c.Loopback && !rdmaCarried && len(rdmaUp) > 0 {
			expected(fmt.Sprintf("the payload went over TCP (%s, %s) although RDMA ports are up (%s)",
				c.Name, pct(c.Share), strings.Join(rdmaUp, ", ")))
		}
	}
	return v
}

// String is the pin as UCX_NET_DEVICES would spell it.
func (p Pin) String() string {
	if !p.Pinned() {
		return "all"
	}
	s := strings.Join(p.Devices, ",")
	if p.Exclude {
		s = "^" + s
	}
	return s
}

func verb(d Direction) string {
	if d == Receive {
		return "received"
	}
	return "sent"
}

func pct(share float64) string { return fmt.Sprintf("%.0f%%", 100*share) }
