package probe

import (
	"fmt"
	"io"
	"strconv"
	"strings"

	"github.com/nixlctl/nixlctl/internal/report"
)

// WriteSideChannel renders probe sidechannel: a screen for people, the
// result as JSON, or its rows as key,value CSV.
func WriteSideChannel(w io.Writer, f report.Format, res *SideChannelResult) error {
	switch f {
	case report.FormatJSON:
		return report.WriteJSON(w, res)
	case report.FormatCSV:
		t := &report.Table{Columns: []report.Column{{Name: "key"}, {Name: "value"}}}
		for _, r := range sideChannelRows(res) {
			t.AddRow(r[0], r[1])
		}
		return t.WriteCSV(w)
	}
	var b strings.Builder
	switch {
	case res.VLLM != nil:
		fmt.Fprintf(&b, "nixlctl probe sidechannel: vLLM NIXL handshake with %s (pp rank %d, tp rank %d)\n\n", res.Target, res.VLLM.PPRank, res.VLLM.TPRank)
	default:
		fmt.Fprintf(&b, "nixlctl probe sidechannel: SGLang bootstrap server %s\n\n", res.Target)
	}
	rows := sideChannelRows(res)
	width := 0
	for _, r := range rows {
		width = max(width, len(r[0]))
	}
	for _, r := range rows {
		fmt.Fprintf(&b, "  %-*s  %s\n", width, r[0], r[1])
	}
	if s := res.SGLang; s != nil && len(s.Ranks) > 0 {
		t := &report.Table{Columns: []report.Column{{Name: "dp"}, {Name: "cp"}, {Name: "tp"}, {Name: "pp"}, {Name: "rank_ip"}, {Name: "rank_port"}}}
		for _, r := range s.Ranks {
			t.AddRow(strconv.Itoa(r.DPRank), strconv.Itoa(r.CPRank), strconv.Itoa(r.TPRank), strconv.Itoa(r.PPRank), r.RankIP, strconv.Itoa(r.RankPort))
		}
		b.WriteString("\nranks (GET /route per rank)\n")
		var tb strings.Builder
		if err := t.WriteText(&tb); err != nil {
			return err
		}
		for _, l := range strings.Split(strings.TrimRight(tb.String(), "\n"), "\n") {
			b.WriteString("  " + l + "\n")
		}
		if s.RanksOmitted > 0 {
			fmt.Fprintf(&b, "  … %d more not listed\n", s.RanksOmitted)
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
		add("ssm sizes", fmt.Sprintf("%d, %d", h.SSMSizes[0], h.SSMSizes[1]))
		add("metadata size", fmt.Sprintf("payload %d B, NixlAgentMetadata %d B, agent blob %d B", h.PayloadBytes, h.MetadataBytes, h.AgentBlobBytes))
		add("listener clock", fmt.Sprintf("%.6f s, %+.3f ms from this host's monotonic clock", h.RemoteClockS, h.ClockOffsetMs))
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
