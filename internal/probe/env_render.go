package probe

import (
	"fmt"
	"io"
	"strings"

	"github.com/nixlctl/nixlctl/internal/report"
)

// WriteCSV writes the facts as section,key,value rows. The screen is
// WriteText, for every other format but JSON, which is the result itself.
func (res *EnvResult) WriteCSV(w io.Writer) error {
	t := &report.Table{Columns: []report.Column{{Name: "section"}, {Name: "key"}, {Name: "value"}}}
	for _, r := range envRows(res) {
		t.AddRow(r[0], r[1], r[2])
	}
	return t.WriteCSV(w)
}

// WriteText is one screen for people.
func (res *EnvResult) WriteText(w io.Writer) error {
	var b strings.Builder
	b.WriteString("nixlctl probe env: what transfers on this host will really use\n")
	rows := envRows(res)
	width := 0
	for _, r := range rows {
		width = max(width, len(r[1]))
	}
	section := ""
	for _, r := range rows {
		if r[0] != section {
			section = r[0]
			fmt.Fprintf(&b, "\n%s\n", sectionTitle(section))
		}
		fmt.Fprintf(&b, "  %-*s  %s\n", width, r[1], r[2])
	}
	if len(res.Notes) > 0 {
		b.WriteString("\n")
		for _, n := range res.Notes {
			fmt.Fprintf(&b, "note: %s\n", n)
		}
	}
	if len(res.Warnings) > 0 {
		b.WriteString("\n")
		report.WriteWarnings(&b, res.Warnings)
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// envRows is the screen as (section, key, value) rows.
func envRows(res *EnvResult) [][3]string {
	var rows [][3]string
	add := func(sec, k, v string) { rows = append(rows, [3]string{sec, k, v}) }
	u := res.UCX
	add("ucx", "library", "libucp "+u.Library+" (loaded by nixlctl)")
	if u.InfoPath != "" {
		info := fmt.Sprintf("%s: UCX %s", u.InfoPath, u.Info.Version)
		if !u.InfoMatches {
			info += " (NOT the library above)"
		}
		add("ucx", "ucx_info", info)
		if u.Info.Transports != "" {
			add("ucx", "built with", u.Info.Transports)
		}
	}
	for _, kind := range []string{"network", "intra-node", "loopback", "accelerator"} {
		var ds []string
		for _, d := range u.Devices {
			if d.Type == kind {
				ds = append(ds, d.Transport+"/"+d.Device)
			}
		}
		if len(ds) > 0 {
			add("ucx", kind, strings.Join(ds, " "))
		}
	}
	add("ucx", "RDMA", listOr(u.RDMA, "none (no rc/ud/dc/verbs/efa transport)"))
	add("ucx", "GPU transports", listOr(u.GPU, "none (no cuda_copy/cuda_ipc/gdr_copy)"))
	for _, k := range pathVars {
		v, ok := u.Settings[k]
		switch {
		case !ok && k == RcacheUnreleasedVar && !u.RcacheLimit:
			v = "unknown to this UCX"
		case !ok:
			continue
		case u.Set[k]:
			v += " (set)"
		default:
			v += " (default)"
		}
		add("ucx", k, v)
	}

	n := res.NIXL
	switch {
	case n.Available:
		add("nixl", "backend", "available: "+n.Version)
	case n.BuiltIn:
		add("nixl", "backend", "unavailable: "+n.Reason)
	default:
		add("nixl", "backend", n.Reason)
	}
	if n.PluginDir != "" {
		add("nixl", "plugins", fmt.Sprintf("%s: %s", n.PluginDir, listOr(n.Plugins, "none")))
	}

	c := res.CUDA
	if !c.Driver {
		add("cuda", "driver", c.Reason)
	} else {
		add("cuda", "driver", fmt.Sprintf("%s (via %s)", c.DriverVersion, c.Source))
		for _, g := range c.GPUs {
			add("cuda", fmt.Sprintf("GPU %d", g.Index), fmt.Sprintf("%s, %s", g.Name, report.Bytes(g.MemBytes)))
		}
	}

	s := res.System
	add("system", "memlock", fmt.Sprintf("%s soft, %s hard (RLIMIT_MEMLOCK)", limit(s.MemlockSoft), limit(s.MemlockHard)))
	add("system", "huge pages", fmt.Sprintf("%d reserved, %d free, %d reserved for mappings, of %s",
		s.MemInfo.HugePagesTotal, s.MemInfo.HugePagesFree, s.MemInfo.HugePagesRsvd, report.Bytes(s.MemInfo.HugePageBytes)))
	if s.THP != "" {
		add("system", "transparent huge pages", thpLine(s.THP))
	}
	add("system", "memory", fmt.Sprintf("%s, %d CPUs, kernel %s", report.Bytes(s.MemInfo.TotalBytes), res.Host.CPUs, res.Host.Kernel))

	for _, pp := range []struct {
		name string
		p    *PathReport
	}{{"path", res.Path}, {"path with peer error handling", res.PeerMode}} {
		p := pp.p
		if p == nil {
			continue
		}
		sec := pp.name
		add(sec, "loopback", fmt.Sprintf("%s backend, a receiver and a sender process, %s KV-shaped WRITEs with a notification each%s",
			p.Backend, report.Int(int64(p.Asked)), envLabel(p.Env)))
		if p.Used != "" {
			add(sec, "used", "this transfer used "+p.Used)
		}
		if p.Transport != "" {
			key := "lanes"
			if p.Backend != "ucx" {
				key = "agent"
			}
			add(sec, key, p.Transport)
		}
		if p.Requests > 0 {
			add(sec, "verified", fmt.Sprintf("%s moved, %d written blocks checked at the receiver, %d wrong; %d notifications", report.Bytes(p.Bytes), p.BlocksChecked, p.BlocksCorrupt, p.Notifs))
		}
		for _, t := range p.Protocols {
			var rs []string
			for _, r := range t.Ranges {
				rs = append(rs, fmt.Sprintf("%s %s on %s", r.Range, r.Description, r.Config))
			}
			add(sec, "protocol", fmt.Sprintf("%s: %s", t.Operation, strings.Join(rs, "; ")))
		}
		if p.ProtocolNote != "" {
			add(sec, "protocols", p.ProtocolNote)
		}
		if p.Error != "" {
			add(sec, "error", p.Error)
		}
	}
	return rows
}

func sectionTitle(s string) string {
	switch s {
	case "ucx", "nixl", "cuda":
		return strings.ToUpper(s)
	}
	return strings.ToUpper(s[:1]) + s[1:]
}

func envLabel(env []string) string {
	if len(env) == 0 {
		return ""
	}
	return " (" + strings.Join(env, " ") + ")"
}

func listOr(xs []string, none string) string {
	if len(xs) == 0 {
		return none
	}
	return strings.Join(xs, ", ")
}

func limit(n int64) string {
	if n < 0 {
		return "unlimited"
	}
	return report.Bytes(n)
}

// thpLine says what the kernel's THP mode means for a KV pool.
func thpLine(mode string) string {
	switch mode {
	case "always":
		return "always: every large anonymous mapping gets them, a pool of --dram-alloc mmap included"
	case "madvise":
		return "madvise: only memory advised for them (--dram-alloc thp; PyTorch with C10_THP_MEM_ALLOC_ENABLE=1)"
	case "never":
		return "never: --dram-alloc thp is refused"
	}
	return mode
}
