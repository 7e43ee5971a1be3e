package report

import (
	"encoding/json"
	"fmt"
	"io"
	"strings"

	"github.com/nixlctl/nixlctl/internal/kv"
)

// WriteKVLayout renders `nixlctl kv layout` results: one analysis per token
// count of a sweep, all for the same model and deployment.
func WriteKVLayout(w io.Writer, f Format, as []kv.Analysis) error {
	if len(as) == 0 {
		return fmt.Errorf("no token counts to report")
	}
	return Write(w, f, kvLayout(as))
}

// kvLayout is a sweep's analyses, one per token count.
type kvLayout []kv.Analysis

// MarshalJSON writes one token count as its analysis alone, as before
// kv layout took sweeps, so scripts reading it keep working.
func (as kvLayout) MarshalJSON() ([]byte, error) {
	if len(as) == 1 {
		return json.Marshal(as[0])
	}
	return json.Marshal([]kv.Analysis(as))
}

func (as kvLayout) WriteMarkdown(w io.Writer) error {
	if _, err := fmt.Fprintf(w, "```\n%s\n```\n\n", kvHeader(as[0])); err != nil {
		return err
	}
	if err := kvSweepTable(as).WriteMarkdown(w); err != nil {
		return err
	}
	if last := as[len(as)-1]; last.Hetero != nil {
		if _, err := io.WriteString(w, "\n"); err != nil {
			return err
		}
		return kvHeteroTable(last).WriteMarkdown(w)
	}
	return nil
}

func (as kvLayout) WriteText(w io.Writer) error {
	a := as[0]
	if _, err := io.WriteString(w, kvHeader(a)+"\n"); err != nil {
		return err
	}
	t := kvSweepTable(as)
	if err := t.WriteText(w); err != nil {
		return err
	}
	last := as[len(as)-1]
	if last.Hetero != nil {
		if _, err := io.WriteString(w, "\n"); err != nil {
			return err
		}
		return kvHeteroTable(last).WriteText(w)
	}
	return nil
}

func kvHeader(a kv.Analysis) string {
	var b strings.Builder
	src := "preset"
	if a.ModelSource != "preset" {
		src = a.ModelSource
	}
	fmt.Fprintf(&b, "Model     %s (%s): %d layers", a.Model, src, sum(a.LayersPerStage))
	if a.MLA {
		fmt.Fprintf(&b, ", MLA latent (one region per layer, whole on every TP rank)")
	} else {
		fmt.Fprintf(&b, ", %d KV heads per rank", a.HeadsPerRank)
		if a.HeadReplicas > 1 {
			fmt.Fprintf(&b, " (each head on %d ranks)", a.HeadReplicas)
		}
	}
	if a.SlidingLayers > 0 {
		fmt.Fprintf(&b, ", %d sliding-window layers (window %d tokens)", a.SlidingLayers, a.SlidingWindow)
	}
	fmt.Fprintf(&b, ", KV cache %s\n", a.KVDType)
	layout := string(a.Layout) + " " + string(a.KVCacheLayout)
	if a.MLA {
		layout = "mla"
	}
	tp := fmt.Sprintf("TP %d", a.TP)
	if a.Hetero != nil {
		tp = fmt.Sprintf("prefill TP %d -> decode TP %d", a.Hetero.PrefillTP, a.Hetero.DecodeTP)
	}
	fmt.Fprintf(&b, "Layout    %s, %d-token blocks, %s x PP %d (layers per stage %s): %d regions per rank, %s per block per region\n",
		layout, a.BlockSize, tp, a.PP, joinInts(a.LayersPerStage), a.RegionsPerRank, Bytes(a.BytesPerBlockPerRank))
	fmt.Fprintf(&b, "Per token %s B whole model, %s B per rank, %s B on all ranks\n",
		Int(a.BytesPerToken), Int(a.BytesPerTokenPerRank), Int(a.BytesPerTokenAllRanks))
	return b.String()
}

func kvSweepTable(as []kv.Analysis) *Table {
	t := &Table{Columns: []Column{
		{"Tokens", Right}, {"KV/request", Right}, {"Per rank", Right}, {"Blocks", Right},
		{"Descs/rank", Right}, {"B/desc", Right},
	}}
	for _, e := range as[0].Estimates {
		t.Columns = append(t.Columns, Column{e.Link, Right})
	}
	for _, a := range as {
		row := []string{Int(int64(a.Tokens)), Bytes(a.BytesPerRequest), Bytes(a.BytesPerRequestPerRank),
			blocksCell(a), Int(int64(a.DescriptorsPerRequest)), Int(a.BytesPerDescriptor)}
		for _, e := range a.Estimates {
			row = append(row, Seconds(e.Seconds))
		}
		t.AddRow(row...)
	}
	t.Notes = append(t.Notes, "Times: one rank's bytes at the link's line rate (no protocol overhead); ranks transfer in parallel, one link each.")
	if as[0].SlidingLayers > 0 {
		t.Notes = append(t.Notes, "Blocks: full-attention layers / sliding-window layers (only blocks overlapping the window are kept and sent).")
	}
	return t
}

func blocksCell(a kv.Analysis) string {
	if a.SlidingLayers > 0 {
		return fmt.Sprintf("%s/%s", Int(int64(a.BlocksPerRequest)), Int(int64(a.SlidingBlocksPerRequest)))
	}
	return Int(int64(a.BlocksPerRequest))
}

func kvHeteroTable(a kv.Analysis) *Table {
	h := a.Hetero
	t := &Table{
		Title: fmt.Sprintf("Heterogeneous TP: what each decode rank reads for %s tokens", Int(int64(a.Tokens))),
		Columns: []Column{{"Decode rank", Right}, {"KV heads", Left}, {"Reads from prefill", Left},
			{"Notify only", Left}, {"Descs/request", Right}, {"B/desc", Right}, {"Bytes/request", Right}},
	}
	for _, r := range h.Ranks {
		notify := "-"
		if len(r.NotifyOnly) > 0 {
			notify = joinInts(r.NotifyOnly)
		}
		t.AddRow(fmt.Sprint(r.Rank), r.Heads, joinInts(r.Sources), notify,
			Int(int64(r.DescriptorsPerRequest)), Int(r.BytesPerDescriptor), Bytes(r.BytesPerRequest))
	}
	t.Notes = append(t.Notes, fmt.Sprintf("Completion notifications each prefill rank waits for: %s", joinInts(h.Consumers)))
	return t
}

func (as kvLayout) WriteCSV(w io.Writer) error { return kvCSVTable(as).WriteCSV(w) }

func kvCSVTable(as []kv.Analysis) *Table {
	t := &Table{Columns: []Column{{Name: "model"}, {Name: "tokens"}, {Name: "kv_dtype"}, {Name: "block_size"},
		{Name: "tp"}, {Name: "pp"}, {Name: "layout"}, {Name: "bytes_per_token"}, {Name: "bytes_per_token_per_rank"},
		{Name: "bytes_per_request"}, {Name: "bytes_per_request_per_rank"}, {Name: "blocks_per_request"},
		{Name: "regions_per_rank"}, {Name: "descriptors_per_request"}, {Name: "bytes_per_descriptor"}}}
	for _, e := range as[0].Estimates {
		t.Columns = append(t.Columns, Column{Name: "seconds_" + slug(e.Link)})
	}
	for _, a := range as {
		row := []string{a.Model, fmt.Sprint(a.Tokens), string(a.KVDType), fmt.Sprint(a.BlockSize), fmt.Sprint(a.TP),
			fmt.Sprint(a.PP), string(a.Layout), fmt.Sprint(a.BytesPerToken), fmt.Sprint(a.BytesPerTokenPerRank),
			fmt.Sprint(a.BytesPerRequest), fmt.Sprint(a.BytesPerRequestPerRank), fmt.Sprint(a.BlocksPerRequest),
			fmt.Sprint(a.RegionsPerRank), fmt.Sprint(a.DescriptorsPerRequest), fmt.Sprint(a.BytesPerDescriptor)}
		for _, e := range a.Estimates {
			row = append(row, fmt.Sprintf("%.6g", e.Seconds))
		}
		t.AddRow(row...)
	}
	return t
}

func slug(s string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(s) {
		switch {
		case r >= 'a' && r <= 'z', r >= '0' && r <= '9':
			b.WriteRune(r)
		default:
			if b.Len() > 0 && !strings.HasSuffix(b.String(), "_") {
				b.WriteByte('_')
			}
		}
	}
	return strings.TrimSuffix(b.String(), "_")
}

func joinInts(xs []int) string {
	parts := make([]string, len(xs))
	for i, x := range xs {
		parts[i] = fmt.Sprint(x)
	}
	return strings.Join(parts, ",")
}

func sum(xs []int) int {
	n := 0
	for _, x := range xs {
		n += x
	}
	return n
}

// WriteProm writes the sizes as gauges, one sample per token count,
// labelled with the deployment (so a dashboard can show what a model
// costs next to what moving it took):
// nixlctl_kv_layout_bytes_per_request{model=...}.
func (as kvLayout) WriteProm(w io.Writer) error {
	t := kvCSVTable(as)
	const labels = 7 // model, tokens, kv_dtype, block_size, tp, pp, layout
	for c := labels; c < len(t.Columns); c++ {
		name := "nixlctl_kv_layout_" + t.Columns[c].Name
		if _, err := fmt.Fprintf(w, "# TYPE %s gauge\n", name); err != nil {
			return err
		}
		for _, row := range t.Rows {
			var l []string
			for i := 0; i < labels; i++ {
				l = append(l, fmt.Sprintf(`%s="%s"`, t.Columns[i].Name, promEscape(row[i])))
			}
			if _, err := fmt.Fprintf(w, "%s{%s} %s\n", name, strings.Join(l, ","), row[c]); err != nil {
				return err
			}
		}
	}
	return nil
}
