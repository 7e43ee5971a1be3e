// Package netpath tells which network path carried a transfer's bytes, from
// the kernel's per-device byte counters read before and after the timed
// phase. A benchmark that claims RDMA numbers while UCX quietly fell back to
// TCP, or that measured loopback when the user meant two hosts, is wrong in
// a way no timing reveals; the counters do.
//
// Take reads a sysfs tree whose root is a parameter, so tests build fake
// trees; the file parsers take outside bytes and are fuzzed.
package netpath

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
)

// Kind is the counter family a device belongs to.
type Kind string

const (
	// Net is a kernel network interface (/sys/class/net): TCP and
	// everything else the kernel's stack carries.
	Net Kind = "net"
	// InfiniBand is an RDMA port (/sys/class/infiniband), InfiniBand or
	// RoCE: traffic that bypasses the kernel's stack.
	InfiniBand Kind = "infiniband"
)

// arphrdLoopback is ARPHRD_LOOPBACK, the /sys/class/net/<if>/type of a
// loopback device whatever its name.
const arphrdLoopback = 772

// ibWordBytes: InfiniBand's port_xmit_data and port_rcv_data count 32-bit
// words, not bytes (IBA spec, PortCounters).
const ibWordBytes = 4

// ibSaturated is where a 32-bit InfiniBand data counter stops: unlike the
// net counters it saturates instead of wrapping, so a counter sitting there
// has stopped counting.
const ibSaturated = 1<<32 - 1

// Device is one interface or RDMA port and its counters at one moment.
type Device struct {
	// Name is the interface name ("eth0") or, for RDMA, "<dev>:<port>"
	// ("mlx5_0:1"), the form UCX_NET_DEVICES uses.
	Name string `json:"name"`
	Kind Kind   `json:"kind"`
	// Loopback is set for net devices of type ARPHRD_LOOPBACK or named lo.
	Loopback bool `json:"loopback,omitempty"`
	// State is the net device's operstate ("up", "down", "unknown") or the
	// RDMA port's state ("ACTIVE", "DOWN").
	State string `json:"state"`
	// LinkLayer is an RDMA port's link layer ("InfiniBand", "Ethernet" for
	// RoCE); empty for net devices.
	LinkLayer string `json:"link_layer,omitempty"`
	// TxBytes and RxBytes are the counters in bytes (RDMA words already
	// multiplied by 4).
	TxBytes uint64 `json:"tx_bytes"`
	RxBytes uint64 `json:"rx_bytes"`
	// Saturated is set when an RDMA data counter sits at its 32-bit limit.
	Saturated bool `json:"saturated,omitempty"`
}

// Up reports whether the device can carry traffic. Loopback and many
// virtual interfaces report "unknown", which the kernel uses for drivers
// that do not track carrier, so it counts as up.
func (d Device) Up() bool {
	switch d.Kind {
	case InfiniBand:
		return d.State == "ACTIVE"
	default:
		return d.State == "up" || d.State == "unknown"
	}
}

// Snapshot is every device's counters at one moment, sorted by kind then
// name.
type Snapshot struct {
	Devices []Device `json:"devices"`
}

// Take reads every net device and RDMA port under root ("/sys" on a real
// system). A device that vanishes while it is read (a veth torn down) is
// left out; a file that exists but does not parse is an error naming it.
// No /sys/class/infiniband just means no RDMA.
func Take(root string) (Snapshot, error) {
	var s Snapshot
	netDir := filepath.Join(root, "class/net")
	names, err := listDir(netDir)
	if err != nil {
		return Snapshot{}, fmt.Errorf("netpath: listing net devices: %w", err)
	}
	for _, name := range names {
		d, err := readNetDevice(filepath.Join(netDir, name), name)
		if gone(err, filepath.Join(netDir, name)) {
			continue
		}
		if err != nil {
			return Snapshot{}, fmt.Errorf("netpath: %w", err)
		}
		s.Devices = append(s.Devices, d)
	}
	ibDir := filepath.Join(root, "class/infiniband")
	devs, err := listDir(ibDir)
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return Snapshot{}, fmt.Errorf("netpath: listing RDMA devices: %w", err)
	}
	for _, dev := range devs {
		portsDir := filepath.Join(ibDir, dev, "ports")
		ports, err := listDir(portsDir)
		if gone(err, filepath.Join(ibDir, dev)) {
			continue
		}
		if err != nil {
			return Snapshot{}, fmt.Errorf("netpath: listing ports of %s: %w", dev, err)
		}
		for _, port := range ports {
			d, err := readIBPort(filepath.Join(portsDir, port), dev+":"+port)
			if gone(err, filepath.Join(portsDir, port)) {
				continue
			}
			if err != nil {
				return Snapshot{}, fmt.Errorf("netpath: %w", err)
			}
			s.Devices = append(s.Devices, d)
		}
	}
	slices.SortFunc(s.Devices, func(a, b Device) int {
		if c := strings.Compare(string(a.Kind), string(b.Kind)); c != 0 {
			return c
		}
		return strings.Compare(a.Name, b.Name)
	})
	return s, nil
}

// listDir names a directory's entries. In sysfs they are symlinks into
// /sys/devices, so entries are not filtered by type.
func listDir(dir string) ([]string, error) {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	names := make([]string, 0, len(ents))
	for _, e := range ents {
		names = append(names, e.Name())
	}
	return names, nil
}

// gone reports whether err is a missing file because the device directory
// itself disappeared, as opposed to a device that lacks a file it should
// have.
func gone(err error, devDir string) bool {
	if !errors.Is(err, fs.ErrNotExist) {
		return false
	}
	_, statErr := os.Stat(devDir)
	return errors.Is(statErr, fs.ErrNotExist)
}

func readNetDevice(dir, name string) (Device, error) {
	d := Device{Name: name, Kind: Net}
	var err error
	if d.TxBytes, err = readCounter(filepath.Join(dir, "statistics/tx_bytes")); err != nil {
		return Device{}, err
	}
	if d.RxBytes, err = readCounter(filepath.Join(dir, "statistics/rx_bytes")); err != nil {
		return Device{}, err
	}
	if d.State, err = readWord(filepath.Join(dir, "operstate")); err != nil {
		return Device{}, err
	}
	typ, err := readType(filepath.Join(dir, "type"))
	if err != nil {
		return Device{}, err
	}
	d.Loopback = typ == arphrdLoopback || name == "lo"
	return d, nil
}

func readIBPort(dir, name string) (Device, error) {
	d := Device{Name: name, Kind: InfiniBand}
	var tx, rx uint64
	var err error
	if tx, err = readCounter(filepath.Join(dir, "counters/port_xmit_data")); err != nil {
		return Device{}, err
	}
	if rx, err = readCounter(filepath.Join(dir, "counters/port_rcv_data")); err != nil {
		return Device{}, err
	}
	d.Saturated = tx == ibSaturated || rx == ibSaturated
	if tx > (1<<64-1)/ibWordBytes || rx > (1<<64-1)/ibWordBytes {
		return Device{}, fmt.Errorf("%s: counter too large to be in words", filepath.Join(dir, "counters"))
	}
	d.TxBytes, d.RxBytes = tx*ibWordBytes, rx*ibWordBytes
	if d.LinkLayer, err = readWord(filepath.Join(dir, "link_layer")); err != nil {
		return Device{}, err
	}
	b, err := os.ReadFile(filepath.Join(dir, "state"))
	if err != nil {
		return Device{}, err
	}
	if d.State, err = parseIBState(filepath.Join(dir, "state"), b); err != nil {
		return Device{}, err
	}
	return d, nil
}

func readCounter(path string) (uint64, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, err
	}
	return parseCounter(path, b)
}

func readWord(path string) (string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return "", err
	}
	return parseWord(path, b)
}

func readType(path string) (int, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, err
	}
	return parseType(path, b)
}

// parseCounter reads a sysfs counter: a decimal unsigned integer and a
// newline.
func parseCounter(path string, b []byte) (uint64, error) {
	s := strings.TrimSpace(string(b))
	v, err := strconv.ParseUint(s, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("%s: %q is not a counter", path, truncate(s))
	}
	return v, nil
}

// parseType reads /sys/class/net/<if>/type, an ARPHRD_* number.
func parseType(path string, b []byte) (int, error) {
	s := strings.TrimSpace(string(b))
	v, err := strconv.ParseUint(s, 10, 16)
	if err != nil {
		return 0, fmt.Errorf("%s: %q is not a device type", path, truncate(s))
	}
	return int(v), nil
}

// parseWord reads a one-word attribute (operstate, link_layer).
func parseWord(path string, b []byte) (string, error) {
	s := strings.TrimSpace(string(b))
	if s == "" || strings.ContainsFunc(s, func(r rune) bool { return r <= ' ' || r > '~' }) {
		return "", fmt.Errorf("%s: %q is not one word", path, truncate(s))
	}
	return s, nil
}

// parseIBState reads an RDMA port's state, "4: ACTIVE", keeping the name.
func parseIBState(path string, b []byte) (string, error) {
	s := strings.TrimSpace(string(b))
	num, name, ok := strings.Cut(s, ":")
	if _, err := strconv.ParseUint(strings.TrimSpace(num), 10, 8); !ok || err != nil {
		return "", fmt.Errorf("%s: %q is not a port state", path, truncate(s))
	}
	return parseWord(path, []byte(name))
}

// truncate keeps an error about a garbage file readable.
func truncate(s string) string {
	if len(s) > 40 {
		return s[:40] + "..."
	}
	return s
}
