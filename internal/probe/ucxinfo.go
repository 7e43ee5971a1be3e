package probe

import (
	"strings"
)

// This file parses what UCX prints about itself: ucx_info -v (version and
// build), ucx_info -d (memory domains, transports, devices), ucx_info -c
// and ucp_config_print (UCX_* variables), and the protocol tables that
// UCX_PROTO_INFO=y makes a process print. All of it is outside input:
// parsers skip what they do not recognise and never fail.

// ParseUCXConfig reads "UCX_NAME=value" lines (ucx_info -c, or the
// library's own ucp_config_print) into a map; comments and anything else
// are skipped.
func ParseUCXConfig(s string) map[string]string {
	out := map[string]string{}
	for _, line := range strings.Split(s, "\n") {
		line = strings.TrimSpace(line)
		k, v, ok := strings.Cut(line, "=")
		if !ok || !strings.HasPrefix(k, "UCX_") || strings.ContainsAny(k, " \t#") {
			continue
		}
		out[k] = v
	}
	return out
}

// UCXBuild is what ucx_info -v says.
type UCXBuild struct {
	Version    string `json:"version"`
	Library    string `json:"library,omitempty"` // path, UCX >= 1.14
	Configure  string `json:"configure,omitempty"`
	Transports string `json:"built_with,omitempty"` // --with-* / --enable-* flags that decide transports
}

// ParseUCXVersion reads ucx_info -v output: "# Version 1.13.1" (old) or
// "# Library version: 1.22.0" (new), "# Library path: ...", "# Configured
// with: ...".
func ParseUCXVersion(s string) UCXBuild {
	var b UCXBuild
	for _, line := range strings.Split(s, "\n") {
		line = strings.TrimSpace(strings.TrimPrefix(strings.TrimSpace(line), "#"))
		switch {
		case strings.HasPrefix(line, "Library version:"):
			b.Version = strings.TrimSpace(strings.TrimPrefix(line, "Library version:"))
		case strings.HasPrefix(line, "Version ") && b.Version == "":
			b.Version = strings.TrimSpace(strings.TrimPrefix(line, "Version "))
		case strings.HasPrefix(line, "Library path:"):
			b.Library = strings.TrimSpace(strings.TrimPrefix(line, "Library path:"))
		case strings.HasPrefix(line, "Configured with:"):
			b.Configure = strings.TrimSpace(strings.TrimPrefix(line, "Configured with:"))
		}
	}
	var flags []string
	for _, f := range strings.Fields(b.Configure) {
		for _, p := range []string{"--with-", "--without-", "--enable-cma", "--disable-cma"} {
			if strings.HasPrefix(f, p) && !strings.HasPrefix(f, "--with-go") && !strings.HasPrefix(f, "--without-go") &&
				!strings.HasPrefix(f, "--without-java") {
				flags = append(flags, strings.TrimPrefix(f, "--"))
				break
			}
		}
	}
	b.Transports = strings.Join(flags, " ")
	return b
}

// UCXDevice is one transport on one device, as ucx_info -d lists them.
type UCXDevice struct {
	MD            string `json:"memory_domain"`
	Component     string `json:"component,omitempty"`
	Transport     string `json:"transport"`
	Device        string `json:"device"`
	Type          string `json:"type,omitempty"` // network, intra-node, loopback, accelerator
	SystemDevice  string `json:"system_device,omitempty"`
	ErrorHandling string `json:"error_handling,omitempty"`
}

// ParseUCXDevices reads ucx_info -d output. A "Transport:" line starts a
// device under the current memory domain; the lines after it fill it in.
func ParseUCXDevices(s string) []UCXDevice {
	var out []UCXDevice
	var md, comp string
	cur := -1
	for _, line := range strings.Split(s, "\n") {
		line = strings.TrimSpace(strings.TrimPrefix(strings.TrimSpace(line), "#"))
		key, val, ok := strings.Cut(line, ":")
		if !ok {
			continue
		}
		key, val = strings.TrimSpace(key), strings.TrimSpace(val)
		switch key {
		case "Memory domain":
			md, comp, cur = val, "", -1
		case "Component":
			comp = val
		case "Connection manager":
			cur = -1
		case "Transport":
			out = append(out, UCXDevice{MD: md, Component: comp, Transport: val})
			cur = len(out) - 1
		case "Device":
			if cur >= 0 {
				out[cur].Device = val
			}
		case "Type":
			if cur >= 0 {
				out[cur].Type = val
			}
		case "System device":
			if cur >= 0 {
				out[cur].SystemDevice = val
			}
		case "error handling":
			if cur >= 0 {
				out[cur].ErrorHandling = val
			}
		}
	}
	return out
}

// ProtoTable is one protocol-selection table that UCX_PROTO_INFO=y prints
// when an endpoint first does an operation: the context line ("ucp_context_0
// intra-node cfg#0"), the operation ("remote memory write by ucp_put* from
// host memory to host") and, per message-size range, the protocol and the
// transport/device it runs on.
type ProtoTable struct {
	Context   string       `json:"context"`
	Operation string       `json:"operation"`
	Ranges    []ProtoRange `json:"ranges"`
}

// ProtoRange is one row of a ProtoTable.
type ProtoRange struct {
	Range       string `json:"range"`       // "0..inf", "93..5028", "256K..inf"
	Description string `json:"description"` // "zero-copy", "(?) rendezvous zero-copy read from remote"
	Config      string `json:"config"`      // "cma/memory", "rc_mlx5/mlx5_0:1 50% + ..."
}

// ParseProtoInfo reads the tables out of a process's output, whatever
// surrounds them (UCX prefixes each line with a timestamp and
// host:pid). A table is: a border, one or two title rows, a border, a
// header row (Range | Description | Config), a border, rows, a border.
func ParseProtoInfo(s string) []ProtoTable {
	var out []ProtoTable
	var cur *ProtoTable
	var titles []string
	inRows := false
	flush := func() {
		if cur != nil && len(cur.Ranges) > 0 {
			out = append(out, *cur)
		}
		cur, titles, inRows = nil, nil, false
	}
	for _, raw := range strings.Split(s, "\n") {
		i := strings.IndexAny(raw, "|+")
		if i < 0 {
			flush()
			continue
		}
		line := strings.TrimSpace(raw[i:])
		if strings.HasPrefix(line, "+") && strings.Trim(line, "+-") == "" {
			if inRows && cur != nil && len(cur.Ranges) > 0 {
				flush()
			}
			continue
		}
		if !strings.HasPrefix(line, "|") || !strings.HasSuffix(line, "|") || len(line) < 2 {
			flush()
			continue
		}
		cells := strings.Split(line[1:len(line)-1], "|")
		for k := range cells {
			cells[k] = strings.TrimSpace(cells[k])
		}
		switch {
		case len(cells) == 1:
			if inRows {
				flush()
			}
			titles = append(titles, cells[0])
		case len(cells) == 3 && cells[0] == "Range":
			cur = &ProtoTable{}
			if len(titles) > 0 {
				cur.Context = titles[0]
			}
			if len(titles) > 1 {
				cur.Operation = strings.Join(titles[1:], " ")
			}
			inRows = true
		case len(cells) == 3 && inRows && cur != nil:
			cur.Ranges = append(cur.Ranges, ProtoRange{Range: cells[0], Description: cells[1], Config: cells[2]})
		default:
			flush()
		}
	}
	flush()
	return out
}
