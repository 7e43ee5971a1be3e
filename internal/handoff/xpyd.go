package handoff

import (
	"cmp"
	"fmt"
	"math"
	"reflect"
	"strings"
	"time"

	"github.com/nixlctl/nixlctl/internal/engine"
	"github.com/nixlctl/nixlctl/internal/errkind"
	"github.com/nixlctl/nixlctl/internal/kv"
	"github.com/nixlctl/nixlctl/internal/report"
	"github.com/nixlctl/nixlctl/internal/runcore"
)

// resolveEngines settles the prefill and decode engines from --topology
// or from --prefill/--decode and --prefills/--decodes (Validate).
func (o *HandoffOptions) resolveEngines(add func(error), bad func(field, format string, a ...any)) {
	o.prefills, o.decodes = nil, nil
	if o.Rendezvous != "" {
		o.resolveRendezvous(bad)
		return
	}
	if o.Topology != "" {
		if o.Prefill != "" || o.Decode != "" || o.Prefills > 1 || o.Decodes > 1 {
			bad("Topology", "the file lists the engines: give it or --prefill/--decode/--prefills/--decodes, not both")
			return
		}
		t, err := ReadTopology(o.Topology)
		if err != nil {
			bad("Topology", "%v", err)
			return
		}
		for _, s := range t.Prefill {
			o.prefills = append(o.prefills, EngineSlot{Addr: cmp.Or(s.Addr, "local"), TP: cmp.Or(s.TP, o.Spec.TP)})
		}
		for _, s := range t.Decode {
			o.decodes = append(o.decodes, EngineSlot{Addr: cmp.Or(s.Addr, "local"), TP: cmp.Or(s.TP, o.DecodeTP)})
		}
		return
	}
	var err error
	if o.prefills, err = parseEngineList("Prefill", "Prefills", o.Prefill, o.Prefills, o.Spec.TP); err != nil {
		add(err)
	}
	if o.decodes, err = parseEngineList("Decode", "Decodes", o.Decode, o.Decodes, o.DecodeTP); err != nil {
		add(err)
	}
}

// engines are the prefill and decode engines (one local child of each
// when Validate has not run).
func (o *HandoffOptions) engines() (p, d []EngineSlot) {
	p, d = o.prefills, o.decodes
	if len(p) == 0 {
		p = []EngineSlot{{Addr: cmp.Or(o.Prefill, "local"), TP: o.Spec.TP}}
	}
	if len(d) == 0 {
		d = []EngineSlot{{Addr: cmp.Or(o.Decode, "local"), TP: o.DecodeTP}}
	}
	return p, d
}

// remote says whether any engine runs elsewhere.
func (o *HandoffOptions) remote() bool {
	p, d := o.engines()
	for _, s := range append(append([]EngineSlot(nil), p...), d...) {
		if !s.Local() {
			return true
		}
	}
	return false
}

// checkTopologyTPs checks every TP pair a topology gives that the
// --prefill-tp/--decode-tp checks did not: each layout valid, and every
// prefill able to hand off to every decode.
func (o *HandoffOptions) checkTopologyTPs() []error {
	if o.Topology == "" || o.Spec.Validate() != nil {
		return nil
	}
	var errs []error
	seen := map[[2]int]bool{{o.Spec.TP, o.DecodeTP}: true}
	for _, p := range o.prefills {
		for _, d := range o.decodes {
			if seen[[2]int{p.TP, d.TP}] {
				continue
			}
			seen[[2]int{p.TP, d.TP}] = true
			ps, ds := o.Spec, o.Spec
			ps.TP, ds.TP = p.TP, d.TP
			if err := ps.Validate(); err != nil {
				errs = append(errs, errkind.Field("Topology", "prefill tp %d: %v", p.TP, err))
			} else if err := ds.Validate(); err != nil {
				errs = append(errs, errkind.Field("Topology", "decode tp %d: %v", d.TP, err))
			} else if _, err := kv.Plan(ps, ds); err != nil {
				errs = append(errs, errkind.Field("Topology", "prefill tp %d -> decode tp %d: %v", p.TP, d.TP, err))
			} else if kv.VLLMRefusesTP(ps, ds) && !o.AllowUnsupportedTP && o.Protocol != engine.ProtoSGLang {
				errs = append(errs, errkind.Field("Topology", "%s (--allow-unsupported-tp runs it anyway)", tpRefusal(ps, ds)))
			}
		}
	}
	return errs
}

// engineConfig is engine i of a role's configuration: EngineConfig with
// its own TP, engine id ("prefill-1": every engine's agents are named by
// it, so peers tell them apart) and seed.
func (o *HandoffOptions) engineConfig(role engine.Role, backend string, numBlocks, i, tp int) engine.Config {
	c := o.EngineConfig(role, backend, numBlocks)
	c.TP = tp
	c.EngineID = fmt.Sprintf("%s-%d", role, i)
	c.Seed += uint64(2 * i)
	return c
}

// PairSummary is one (prefill, decode) pair of an xPyD run, from its
// measured requests.
type PairSummary struct {
	Prefill       int   `json:"prefill"`
	Decode        int   `json:"decode"`
	Requests      int   `json:"requests"`
	Failed        int   `json:"failed"`
	CorruptBlocks int   `json:"corrupt_blocks"`
	Bytes         int64 `json:"bytes"`
	// ActiveSeconds is the pair's active time: its first measured
	// request's start to its last one's decode ready.
	ActiveSeconds float64 `json:"active_seconds"`
	// ActiveGBps is Bytes / ActiveSeconds: what the pair moved while it
	// had work (not over the whole run's time).
	ActiveGBps       float64            `json:"active_bandwidth_gbps"`
	HandoffLatencyMS report.Percentiles `json:"handoff_latency_ms"`
}

// SummarizePairs summarizes every pair of an n x m run from its records
// (warm-up ones left out), prefill-major: pair (p, d) is at p*m + d.
func SummarizePairs(records []HandoffRecord, n, m int) []PairSummary {
	out := make([]PairSummary, n*m)
	hists := make([]*report.Histogram, n*m)
	first, last := make([]int64, n*m), make([]int64, n*m)
	for i := range out {
		out[i].Prefill, out[i].Decode = i/m, i%m
		hists[i] = report.NewHistogram()
	}
	for _, r := range records {
		if r.Warmup || r.Prefill >= n || r.Decode >= m {
			continue
		}
		k := r.Prefill*m + r.Decode
		ps := &out[k]
		ps.Requests++
		ps.CorruptBlocks += r.CorruptBlocks
		if r.Error != "" || r.CorruptBlocks > 0 {
			ps.Failed++
		}
		if r.Error != "" {
			continue
		}
		ps.Bytes += r.Bytes
		if r.HandoffMS >= 0 {
			hists[k].Record(time.Duration(r.HandoffMS * 1e6))
		}
		if first[k] == 0 || r.TStart < first[k] {
			first[k] = r.TStart
		}
		last[k] = max(last[k], r.TReady)
	}
	for k := range out {
		if last[k] > first[k] {
			out[k].ActiveSeconds = float64(last[k]-first[k]) / 1e9
			out[k].ActiveGBps = float64(out[k].Bytes) / 1e9 / out[k].ActiveSeconds
		}
		out[k].HandoffLatencyMS = hists[k].In(time.Millisecond)
	}
	return out
}

// sumStats adds b's counters into a: integer fields add up, those named
// ...Max take the larger, nested structs (the lease table's) recurse.
func sumStats(a *engine.Stats, b engine.Stats) {
	sumInts(reflect.ValueOf(a).Elem(), reflect.ValueOf(b))
}

func sumInts(a, b reflect.Value) {
	for i := 0; i < a.NumField(); i++ {
		fa, fb := a.Field(i), b.Field(i)
		switch fa.Kind() {
		case reflect.Int, reflect.Int64:
			if strings.HasSuffix(a.Type().Field(i).Name, "Max") {
				fa.SetInt(max(fa.Int(), fb.Int()))
			} else {
				fa.SetInt(fa.Int() + fb.Int())
			}
		case reflect.Pointer:
			if fb.IsNil() || fb.Elem().Kind() != reflect.Struct {
				continue
			}
			if fa.IsNil() {
				fa.Set(reflect.New(fb.Elem().Type()))
			}
			sumInts(fa.Elem(), fb.Elem())
		}
	}
}

// heldByEngine says which engines still hold blocks ("prefill-0 3,
// decode-1 2").
func heldByEngine(prefills, decodes []engine.Stats) string {
	var parts []string
	for _, r := range []struct {
		role  string
		stats []engine.Stats
	}{{"prefill", prefills}, {"decode", decodes}} {
		for i, s := range r.stats {
			if s.BlocksInUse > 0 {
				parts = append(parts, fmt.Sprintf("%s %d", engineName(r.role, i, len(r.stats)), s.BlocksInUse))
			}
		}
	}
	return strings.Join(parts, ", ")
}

// slotsLabel names engines for the result's endpoints line.
func slotsLabel(slots []EngineSlot) string {
	names := make([]string, len(slots))
	for i, s := range slots {
		names[i] = cmp.Or(s.remoteAddr(), "local child")
	}
	return strings.Join(names, ", ")
}

// placementAll is the widest placement of any (prefill, decode) pair:
// cross-host if one pair crosses hosts.
func placementAll(pes, des []*Endpoint) string {
	rank := map[string]int{runcore.PlacementOneHost: 0, runcore.PlacementNamespaces: 1, runcore.PlacementCrossHost: 2}
	out := runcore.PlacementOneHost
	for _, pe := range pes {
		for _, de := range des {
			if p := runcore.Placement(pe.host, de.host); rank[p] > rank[out] {
				out = p
			}
		}
	}
	return out
}

// pairDims is an xPyD result's prefill and decode counts (0, 0 with one
// of each).
func pairDims(res *HandoffResult) (n, m int) {
	n, m = len(res.Config.PrefillEngines), len(res.Config.DecodeEngines)
	if len(res.Summary.Pairs) != n*m {
		return 0, 0
	}
	return n, m
}

// pairMatrix is one number per pair, [prefill][decode]; NaN where the
// pair moved nothing.
func pairMatrix(res *HandoffResult, v func(PairSummary) (float64, bool)) [][]float64 {
	n, m := pairDims(res)
	out := make([][]float64, n)
	for p := range out {
		out[p] = make([]float64, m)
		for d := range out[p] {
			x, ok := v(res.Summary.Pairs[p*m+d])
			if !ok {
				x = math.NaN()
			}
			out[p][d] = x
		}
	}
	return out
}

// The per-pair matrices: bandwidth over the pair's active time, and
// handoff latency p99.
func pairGBps(p PairSummary) (float64, bool) { return p.ActiveGBps, p.ActiveSeconds > 0 }
func pairP99(p PairSummary) (float64, bool) {
	return p.HandoffLatencyMS.P99, p.HandoffLatencyMS.Count > 0
}

// pairTables renders an xPyD run's pairs as matrices, prefill rows by
// decode columns: requests (failed), GB/s over each pair's active time,
// and handoff p99. None with one pair.
func pairTables(res *HandoffResult) []*report.Table {
	n, m := pairDims(res)
	if n*m <= 1 {
		return nil
	}
	matrix := func(corner string, cell func(PairSummary) string) *report.Table {
		t := &report.Table{Columns: []report.Column{{Name: corner}}}
		for d := 0; d < m; d++ {
			t.Columns = append(t.Columns, report.Column{Name: engineName("decode", d, m), Align: report.Right})
		}
		for p := 0; p < n; p++ {
			row := []string{engineName("prefill", p, n)}
			for d := 0; d < m; d++ {
				row = append(row, cell(res.Summary.Pairs[p*m+d]))
			}
			t.AddRow(row...)
		}
		return t
	}
	num := func(v func(PairSummary) (float64, bool)) func(PairSummary) string {
		return func(p PairSummary) string {
			if x, ok := v(p); ok {
				return report.Float(x)
			}
			return "-"
		}
	}
	return []*report.Table{
		matrix("requests (failed)", func(p PairSummary) string { return fmt.Sprintf("%d (%d)", p.Requests, p.Failed) }),
		matrix("GB/s (pair active)", num(pairGBps)),
		matrix("handoff p99 (ms)", num(pairP99)),
	}
}
