package probe

import (
	"fmt"
	"io"
	"strconv"
	"strings"

	"github.com/nixlctl/nixlctl/internal/report"
)

// WriteText is the screen for people (JSON is the result itself).
func (res *SideChannelResult) WriteText(w io.Writer) error {
	return writeSideChannelText(w, res, false)
}

// WriteMarkdown is the screen for a report.
func (res *SideChannelResult) WriteMarkdown(w io.Writer) error {
	return writeSideChannelText(w, res, true)
}

// WriteCSV is the screen's rows as key,value, with every rank and check.
func (res *SideChannelResult) WriteCSV(w io.Writer) error {
	t := &report.Table{Columns: []report.Column{{Name: "key"}, {Name: "value"}}}
	for _, r := range sideChannelRows(res) {
		t.AddRow(r[0], r[1])
	}
	if len(res.Ranks) > 1 {
		for _, h := range res.Ranks {
			t.AddRow(fmt.Sprintf("rank pp %d tp %d", h.PPRank, h.TPRank), rankSummary(h))
		}
	}
	if a := res.Accept; a != nil {
		for _, c := range a.Checks {
			t.AddRow("check "+c.Check, fmt.Sprintf("%s (prefill %s, decode %s): %s", okWord(c.OK), c.Prefill, c.Decode, c.Why))
		}
		t.AddRow("verdict", a.Verdict)
	}
	return t.WriteCSV(w)
}

// writeSideChannelText is the screen, or with md the Markdown.
func writeSideChannelText(w io.Writer, res *SideChannelResult, md bool) error {
	var b strings.Builder
	var title string
	switch {
	case res.VLLM != nil:
		title = fmt.Sprintf("nixlctl probe sidechannel: vLLM NIXL handshake with %s (pp rank %d, tp rank %d", res.Target, res.VLLM.PPRank, res.VLLM.TPRank)
		if n := len(res.Ranks); n > 1 {
			title += fmt.Sprintf(", then %d more", n-1)
		}
		title += ")"
	default:
		title = fmt.Sprintf("nixlctl probe sidechannel: SGLang bootstrap server %s", res.Target)
	}
	rows := sideChannelRows(res)
	if md {
		fmt.Fprintf(&b, "### %s\n\n", title)
		t := &report.Table{Columns: []report.Column{{Name: "key"}, {Name: "value"}}}
		for _, r := range rows {
			t.AddRow(r[0], r[1])
		}
		if err := t.WriteMarkdown(&b); err != nil {
			return err
		}
	} else {
		b.WriteString(title + "\n\n")
		width := 0
		for _, r := range rows {
			width = max(width, len(r[0]))
		}
		for _, r := range rows {
			fmt.Fprintf(&b, "  %-*s  %s\n", width, r[0], r[1])
		}
	}
	section := func(name string, t *report.Table) error {
		if md {
			fmt.Fprintf(&b, "\n**%s**\n\n", name)
			return t.WriteMarkdown(&b)
		}
		b.WriteString("\n" + name + "\n")
		var tb strings.Builder
		if err := t.WriteText(&tb); err != nil {
			return err
		}
		for _, l := range strings.Split(strings.TrimRight(tb.String(), "\n"), "\n") {
			b.WriteString("  " + l + "\n")
		}
		return nil
	}
	if len(res.Ranks) > 1 {
		t := &report.Table{Columns: []report.Column{{Name: "pp", Align: report.Right}, {Name: "tp", Align: report.Right}, {Name: "engine id"},
			{Name: "agent"}, {Name: "regions", Align: report.Right}, {Name: "registered", Align: report.Right}, {Name: "block len"},
			{Name: "blocks", Align: report.Right}, {Name: "rtt ms", Align: report.Right}, {Name: "clock ms", Align: report.Right}}}
		for _, h := range res.Ranks {
			t.AddRow(strconv.Itoa(h.PPRank), strconv.Itoa(h.TPRank), h.EngineID, orDash(h.AgentName), strconv.Itoa(h.Regions),
				report.Bytes(h.RegisteredBytes), runs(h.BlockLens, " B"), strconv.Itoa(h.NumBlocks),
				fmt.Sprintf("%.3f", h.RTTMs), fmt.Sprintf("%+.3f", h.ClockOffsetMs))
		}
		if err := section("ranks (get_meta_msg per rank, in vLLM's order, one REQ socket)", t); err != nil {
			return err
		}
	}
	if s := res.SGLang; s != nil && len(s.Ranks) > 0 {
		t := &report.Table{Columns: []report.Column{{Name: "dp"}, {Name: "cp"}, {Name: "tp"}, {Name: "pp"}, {Name: "rank_ip"}, {Name: "rank_port"}}}
		for _, r := range s.Ranks {
			t.AddRow(strconv.Itoa(r.DPRank), strconv.Itoa(r.CPRank), strconv.Itoa(r.TPRank), strconv.Itoa(r.PPRank), r.RankIP, strconv.Itoa(r.RankPort))
		}
		if err := section("ranks (GET /route per rank)", t); err != nil {
			return err
		}
		if s.RanksOmitted > 0 {
			fmt.Fprintf(&b, "  … %d more not listed\n", s.RanksOmitted)
		}
	}
	if a := res.Accept; a != nil {
		t := &report.Table{Columns: []report.Column{{Name: "check"}, {Name: "prefill"}, {Name: "decode"}, {Name: "ok"}, {Name: "why"}}}
		for _, c := range a.Checks {
			t.AddRow(c.Check, c.Prefill, c.Decode, okWord(c.OK), c.Why)
		}
		if err := section("acceptance (the rules a vLLM decode applies at handshake)", t); err != nil {
			return err
		}
		if md {
			fmt.Fprintf(&b, "\n**verdict:** %s\n", a.Verdict)
		} else {
			fmt.Fprintf(&b, "\nverdict: %s\n", a.Verdict)
		}
	}
	if len(res.Notes) > 0 {
		b.WriteString("\n")
		for _, n := range res.Notes {
			fmt.Fprintf(&b, "note: %s\n", n)
		}
	}
	_, err := io.WriteString(w, b.String())
	return err
}

func okWord(ok *bool) string {
	switch {
	case ok == nil:
		return "?"
	case *ok:
		return "ok"
	}
	return "REFUSED"
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// rankSummary is one rank on one line, for CSV.
func rankSummary(h *VLLMHandshake) string {
	return fmt.Sprintf("engine %s, agent %s, %d regions, %s registered, block len %s, %d blocks, rtt %.3f ms, clock %+.3f ms",
		h.EngineID, orDash(h.AgentName), h.Regions, report.Bytes(h.RegisteredBytes), runs(h.BlockLens, " B"), h.NumBlocks, h.RTTMs, h.ClockOffsetMs)
}

// sideChannelRows is the screen as (key, value) rows.
func sideChannelRows(res *SideChannelResult) [][2]string {
	var rows [][2]string
	add := func(k, v string) { rows = append(rows, [2]string{k, v}) }
	if h := res.VLLM; h != nil {
		add("round trip", fmt.Sprintf("%.3f ms", h.RTTMs))
		add("engine id", h.EngineID)
		agent := h.AgentName
		if agent == "" {
			agent = "(not readable from the blob)"
		}
		add("agent", fmt.Sprintf("%s (%s blob, %d B)", agent, h.AgentBlobFormat, h.AgentBlobBytes))
		add("compat hash", h.CompatHash)
		switch {
		case h.CompatMatch == nil:
			add("compat check", "not checked (give --compat-factors or --compat-hash)")
		case *h.CompatMatch:
			add("compat check", "matches "+h.CompatFrom)
		default:
			add("compat check", fmt.Sprintf("MISMATCH: %s gives %s", h.CompatFrom, h.CompatExpected))
		}
		if h.TPSize > 0 {
			add("TP size", fmt.Sprintf("%d (pp size %d; nixlctl's metadata extension)", h.TPSize, h.PPSize))
		} else {
			add("TP size", "not in the handshake")
		}
		if res.Discovery != "" {
			add("ranks asked", res.Discovery)
		}
		add("KV layout", fmt.Sprintf("%s, %d-token blocks, %d blocks, device %d, %s", h.KVCacheLayout, h.BlockSize, h.NumBlocks, h.DeviceID, h.AttnBackend))
		add("regions", strconv.Itoa(h.Regions))
		add("block lengths", runs(h.BlockLens, " B"))
		if len(h.BlockStrides) > 0 {
			add("block strides", runs(h.BlockStrides, " B"))
		}
		if len(h.RegionMemTypes) > 0 {
			add("region memory", strRuns(h.RegionMemTypes))
		}
		add("parallel", fmt.Sprintf("dcp %d, pcp %d, %d physical blocks per logical", h.DCPSize, h.PCPSize, h.PhysicalBlocksPerLogical))
		// The decoder insists on two, but a saved result read back may
		// carry any number: print what is there rather than index it.
		ssm := make([]string, len(h.SSMSizes))
		for i, n := range h.SSMSizes {
			ssm[i] = strconv.FormatInt(n, 10)
		}
		add("ssm sizes", strings.Join(ssm, ", "))
		add("registered", fmt.Sprintf("%s (%d B)", report.Bytes(h.RegisteredBytes), h.RegisteredBytes))
		add("metadata size", fmt.Sprintf("payload %d B, NixlAgentMetadata %d B, agent blob %d B", h.PayloadBytes, h.MetadataBytes, h.AgentBlobBytes))
		add("listener clock", fmt.Sprintf("%.6f s, %+.3f ms from this host's monotonic clock", h.RemoteClockS, h.ClockOffsetMs))
		if res.ClockOffsetMs != nil && len(res.Ranks) > 1 {
			add("clock offset", fmt.Sprintf("%+.3f ms (fastest round trip: %s)", *res.ClockOffsetMs, res.ClockRank))
		}
		if h.Backend != "" {
			add("nixlctl backend", h.Backend)
		}
		if len(h.UnknownFields) > 0 {
			add("other fields", strings.Join(h.UnknownFields, ", ")+" (not vLLM's; a vLLM decode ignores them)")
		}
	}
	if s := res.SGLang; s != nil {
		add("health", fmt.Sprintf("%s (%.3f ms)", s.Health, s.HealthMs))
		if i := s.Info; i != nil {
			add("route", fmt.Sprintf("%.3f ms", s.RouteMs))
			add("parallel", fmt.Sprintf("attn tp %d, attn cp %d, dp %d, pp %d", i.AttnTPSize, i.AttnCPSize, i.DPSize, i.PPSize))
			add("page size", optInt(i.PageSize))
			kvd := "null"
			if i.KVCacheDType != nil {
				kvd = *i.KVCacheDType
			}
			add("kv cache dtype", kvd)
			add("follow bootstrap room", strconv.FormatBool(i.FollowBootstrapRoom))
			add("dsa layer split", strconv.FormatBool(i.EnableDSACacheLayerSplit))
			add("prefill http port", optInt(i.PrefillHTTPPort))
			add("query_dp_ranks", s.QueryDPRanks)
		}
	}
	return rows
}

func optInt(p *int) string {
	if p == nil {
		return "null"
	}
	return strconv.Itoa(*p)
}

// runs writes a list as runs of equal values: "8192 B ×32" or
// "8192 B ×2, 4096 B".
func runs(xs []int64, unit string) string {
	s := make([]string, len(xs))
	for i, x := range xs {
		s[i] = strconv.FormatInt(x, 10) + unit
	}
	return strRuns(s)
}

func strRuns(xs []string) string {
	var parts []string
	for i := 0; i < len(xs); {
		j := i
		for j < len(xs) && xs[j] == xs[i] {
			j++
		}
		if j-i > 1 {
			parts = append(parts, fmt.Sprintf("%s ×%d", xs[i], j-i))
		} else {
			parts = append(parts, xs[i])
		}
		i = j
	}
	if len(parts) > 8 {
		parts = append(parts[:8], fmt.Sprintf("… (%d entries)", len(xs)))
	}
	return strings.Join(parts, ", ")
}
