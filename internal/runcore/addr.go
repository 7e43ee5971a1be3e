package runcore

import (
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/nixlctl/nixlctl/internal/errkind"
	"github.com/nixlctl/nixlctl/internal/netpath"
)

// CheckAddr checks a host:port before anything dials it: a typo such as a
// missing port or port 99999 is the user's to fix (bad input), where a
// well-formed address nobody listens on is a failed run.
func CheckAddr(s string) error {
	host, port, err := net.SplitHostPort(strings.TrimPrefix(s, "tcp://"))
	if err != nil {
		return fmt.Errorf("%q: want host:port", s)
	}
	if host == "" {
		return fmt.Errorf("%q: no host", s)
	}
	if !ValidHost(host) {
		return fmt.Errorf("%q: %q is not a host name or an IP address", s, host)
	}
	if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 {
		return fmt.Errorf("%q: port must be 1..65535", s)
	}
	return nil
}

// ValidHost says whether host is an IP address or a host name of RFC
// 1123 letters, digits, hyphens and dots (an underscore allowed, as
// resolvers accept it). Anything else ("!!") cannot resolve; refusing it
// up front spares a run that would only fail to connect.
func ValidHost(host string) bool {
	if net.ParseIP(strings.TrimSuffix(strings.TrimPrefix(host, "["), "]")) != nil {
		return true
	}
	if host == "" || len(host) > 253 {
		return false
	}
	for _, label := range strings.Split(strings.TrimSuffix(host, "."), ".") {
		if label == "" || len(label) > 63 || label[0] == '-' || label[len(label)-1] == '-' {
			return false
		}
		for _, c := range label {
			if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_') {
				return false
			}
		}
	}
	return true
}

// SysClassRoot is where this host's network devices are listed.
const SysClassRoot = "/sys/class"

// CheckNetDevices checks a UCX_NET_DEVICES list for local endpoints:
// "all", or devices that exist here, a kernel interface (eth1) or an
// RDMA device's port (mlx5_0:1). UCX given only unknown devices finds
// no transport, and the run failed later with an error that did not
// name the flag.
func CheckNetDevices(root, list string) error {
	for _, item := range strings.Split(list, ",") {
		item = strings.TrimSpace(item)
		if item == "" {
			return fmt.Errorf("%q: an empty item in the list (a stray comma?)", list)
		}
		if item == "all" {
			continue
		}
		name, port, isPort := strings.Cut(item, ":")
		var paths []string
		if isPort {
			paths = []string{filepath.Join(root, "infiniband", name, "ports", port)}
		} else {
			paths = []string{filepath.Join(root, "net", name), filepath.Join(root, "infiniband", name)}
		}
		if !slices.ContainsFunc(paths, func(p string) bool { _, err := os.Stat(p); return err == nil }) {
			return fmt.Errorf("%q: no such network device on this host (see %s/net and %s/infiniband)", item, root, root)
		}
	}
	return nil
}

// CheckNetDevicesAt checks --net-devices against the devices an endpoint
// on another host reported (ctl.netstat): the local check reads this
// host's /sys, which says nothing of theirs, and a name that host lacks
// made UCX fail every request there.
func CheckNetDevicesAt(role, host string, devs []netpath.Device, list string) error {
	have := map[string]bool{}
	var names []string
	for _, d := range devs {
		have[d.Name] = true
		names = append(names, d.Name)
		if name, _, ok := strings.Cut(d.Name, ":"); ok {
			have[name] = true // an RDMA device, any port
		}
	}
	for _, item := range strings.Split(list, ",") {
		item = strings.TrimSpace(item)
		if item == "" || item == "all" || have[item] {
			continue
		}
		return errkind.BadInput(errkind.Field("NetDevices", "%q: %s (on host %s) has no such network device (it has: %s)", item, role, host, strings.Join(names, ", ")))
	}
	return nil
}

func SplitHostPort(ep string) (string, int, error) {
	host, port, err := net.SplitHostPort(strings.TrimPrefix(ep, "tcp://"))
	if err != nil {
		return "", 0, err
	}
	var p int
	_, err = fmt.Sscanf(port, "%d", &p)
	return host, p, err
}
