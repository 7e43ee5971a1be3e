package handoff

import (
	"errors"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/nixlctl/nixlctl/internal/engine"
	"github.com/nixlctl/nixlctl/internal/errkind"
	"github.com/nixlctl/nixlctl/internal/kv"
	"github.com/nixlctl/nixlctl/internal/report"
	"github.com/nixlctl/nixlctl/internal/runcore/runcoretest"
	"github.com/nixlctl/nixlctl/internal/testkit"
)

func TestRouterRoundRobin(t *testing.T) {
	for _, tc := range []struct {
		n, m int
		want [][2]int
	}{
		{1, 1, [][2]int{{0, 0}, {0, 0}, {0, 0}}},
		{1, 3, [][2]int{{0, 0}, {0, 1}, {0, 2}, {0, 0}}},
		{3, 1, [][2]int{{0, 0}, {1, 0}, {2, 0}, {0, 0}}},
		// every pair once per cycle, the prefill turning fastest
		{2, 2, [][2]int{{0, 0}, {1, 0}, {0, 1}, {1, 1}, {0, 0}}},
		{2, 3, [][2]int{{0, 0}, {1, 0}, {0, 1}, {1, 1}, {0, 2}, {1, 2}, {0, 0}}},
	} {
		r := newRouter(RouterRoundRobin, tc.n, tc.m)
		var got [][2]int
		for range tc.want {
			p, d, _ := r.pick()
			got = append(got, [2]int{p, d})
		}
		if diff := cmp.Diff(tc.want, got); diff != "" {
			t.Errorf("%dx%d (-want +got):\n%s", tc.n, tc.m, diff)
		}
	}
}

// Least-loaded: the decode with the fewest requests in flight, then the
// prefill with the fewest; ties go round robin; done frees the slot.
func TestRouterLeastLoaded(t *testing.T) {
	type step struct {
		done *[2]int // finish this pair first
		want [2]int
	}
	pair := func(p, d int) *[2]int { return &[2]int{p, d} }
	for _, tc := range []struct {
		name  string
		n, m  int
		steps []step
	}{
		{"spreads over idle decodes then prefills", 2, 2, []step{
			{want: [2]int{0, 0}}, {want: [2]int{1, 1}}, {want: [2]int{0, 1}}, {want: [2]int{1, 0}}}},
		{"a freed decode is picked at once", 2, 2, []step{
			{want: [2]int{0, 0}}, {want: [2]int{1, 1}}, {done: pair(1, 1), want: [2]int{1, 1}},
			{done: pair(1, 1), want: [2]int{1, 1}}}},
		{"ties by prefill in flight", 3, 1, []step{
			{want: [2]int{0, 0}}, {want: [2]int{1, 0}}, {want: [2]int{2, 0}}, {done: pair(1, 0), want: [2]int{1, 0}}}},
		{"one pair", 1, 1, []step{{want: [2]int{0, 0}}, {want: [2]int{0, 0}}}},
		{"idle: round robin", 2, 2, []step{
			{want: [2]int{0, 0}}, {done: pair(0, 0), want: [2]int{1, 0}}, {done: pair(1, 0), want: [2]int{0, 1}},
			{done: pair(0, 1), want: [2]int{1, 1}}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := newRouter(RouterLeastLoaded, tc.n, tc.m)
			for i, s := range tc.steps {
				if s.done != nil {
					r.done(s.done[0], s.done[1])
				}
				if p, d, _ := r.pick(); [2]int{p, d} != s.want {
					t.Fatalf("step %d: picked (%d, %d), want %v", i, p, d, s.want)
				}
			}
		})
	}
}

func TestParseTopology(t *testing.T) {
	for _, tc := range []struct {
		name, file, text string
		want             Topology
		err              string
	}{
		{name: "json", file: "t.json", text: `{"prefill": [{"addr": "local", "tp": 2}, {"addr": "10.0.0.1:7400"}], "decode": [{"addr": "tcp://h:1", "tp": 1}]}`,
			want: Topology{Prefill: []EngineSlot{{"local", 2}, {"10.0.0.1:7400", 0}}, Decode: []EngineSlot{{"tcp://h:1", 1}}}},
		{name: "yaml", file: "t.yaml", text: "prefill:\n  - addr: local\n    tp: 2\ndecode:\n  - addr: local\n  - addr: 10.0.0.2:7401\n",
			want: Topology{Prefill: []EngineSlot{{"local", 2}}, Decode: []EngineSlot{{"local", 0}, {"10.0.0.2:7401", 0}}}},
		{name: "empty addr is local", file: "t.json", text: `{"prefill": [{}], "decode": [{}]}`,
			want: Topology{Prefill: []EngineSlot{{}}, Decode: []EngineSlot{{}}}},
		{name: "no decode", file: "t.json", text: `{"prefill": [{"addr": "local"}]}`, err: "no decode engines"},
		{name: "unknown field", file: "t.json", text: `{"prefill": [{"address": "local"}], "decode": [{}]}`, err: `unknown field "address"`},
		{name: "unknown yaml field", file: "t.yml", text: "prefill:\n  - host: x\ndecode:\n  - addr: local\n", err: "field host not found"},
		{name: "bad address", file: "t.json", text: `{"prefill": [{"addr": "nohost"}], "decode": [{}]}`, err: `prefill 0: "nohost": want host:port (or "local")`},
		{name: "bad port", file: "t.json", text: `{"prefill": [{}], "decode": [{}, {"addr": "h:0"}]}`, err: `decode 1: "h:0": port must be 1..65535`},
		{name: "negative tp", file: "t.json", text: `{"prefill": [{"tp": -1}], "decode": [{}]}`, err: "prefill 0: tp must not be negative"},
		{name: "not json", file: "t.json", text: `prefill: []`, err: "not a topology"},
		{name: "two values", file: "t.json", text: `{"prefill": [{}], "decode": [{}]} {}`, err: "more than one JSON value"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ParseTopology(tc.file, []byte(tc.text))
			testkit.WantResult(t, got, err, tc.want, tc.err)
		})
	}
}

// The engines Validate settles on, and the flags it blames.
func TestHandoffEngines(t *testing.T) {
	dir := t.TempDir()
	write := func(name, text string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	topo := write("ok.json", `{"prefill": [{"tp": 2}, {"addr": "10.0.0.1:7400"}], "decode": [{}]}`)
	badTP := write("badtp.json", `{"prefill": [{"tp": 3}], "decode": [{}]}`)
	for _, tc := range []struct {
		name     string
		set      func(o *HandoffOptions)
		pre, dec []EngineSlot
		field    string // the field an error names
	}{
		{name: "default: one local of each", set: func(o *HandoffOptions) {},
			pre: []EngineSlot{{"local", 1}}, dec: []EngineSlot{{"local", 1}}},
		{name: "counts", set: func(o *HandoffOptions) { o.Prefills, o.Decodes = 2, 3 },
			pre: []EngineSlot{{"local", 1}, {"local", 1}}, dec: []EngineSlot{{"local", 1}, {"local", 1}, {"local", 1}}},
		{name: "lists", set: func(o *HandoffOptions) { o.Prefill, o.Decodes = "h:1, local", 2 },
			pre: []EngineSlot{{"h:1", 1}, {"local", 1}}, dec: []EngineSlot{{"local", 1}, {"local", 1}}},
		{name: "topology", set: func(o *HandoffOptions) { o.Topology = topo },
			pre: []EngineSlot{{"local", 2}, {"10.0.0.1:7400", 1}}, dec: []EngineSlot{{"local", 1}}},
		{name: "bad address in a list", set: func(o *HandoffOptions) { o.Decode = "h:1,h:x" }, field: "Decode"},
		{name: "count and list disagree", set: func(o *HandoffOptions) { o.Prefill, o.Prefills = "h:1,h:2", 3 }, field: "Prefills"},
		{name: "negative count", set: func(o *HandoffOptions) { o.Decodes = -1 }, field: "Decodes"},
		{name: "topology and a list", set: func(o *HandoffOptions) { o.Topology, o.Prefill = topo, "h:1" }, field: "Topology"},
		{name: "topology and a count", set: func(o *HandoffOptions) { o.Topology, o.Decodes = topo, 2 }, field: "Topology"},
		{name: "missing topology", set: func(o *HandoffOptions) { o.Topology = filepath.Join(dir, "none.json") }, field: "Topology"},
		{name: "topology tp the model cannot split", set: func(o *HandoffOptions) { o.Topology = badTP }, field: "Topology"},
		{name: "unknown router", set: func(o *HandoffOptions) { o.Router = "random" }, field: "Router"},
		{name: "inproc and a remote engine", set: func(o *HandoffOptions) { o.Inproc, o.Decode = true, "local,h:1" }, field: "Inproc"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := DefaultHandoffOptions()
			o.Protocol, o.Spec = engine.ProtoPull, kv.Spec{Model: runcoretest.SmallModel(t), BlockSize: 16, TP: 1}
			tc.set(&o)
			err := o.Validate()
			if tc.field != "" {
				var fe errkind.FieldError
				if !errors.As(err, &fe) || fe.Field != tc.field {
					t.Fatalf("error %v, want one naming %s", err, tc.field)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			p, d := o.engines()
			if diff := cmp.Diff(tc.pre, p); diff != "" {
				t.Errorf("prefills (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(tc.dec, d); diff != "" {
				t.Errorf("decodes (-want +got):\n%s", diff)
			}
		})
	}
}

func TestSummarizePairs(t *testing.T) {
	recs := []HandoffRecord{
		{Prefill: 0, Decode: 0, Bytes: 1e9, HandoffMS: 2, TStart: 1e9, TReady: 2e9},
		{Prefill: 0, Decode: 0, Bytes: 1e9, HandoffMS: 4, TStart: 1.5e9, TReady: 3e9},
		{Prefill: 1, Decode: 0, Error: "decode: boom", TStart: 1e9},
		{Prefill: 1, Decode: 0, Bytes: 5e8, CorruptBlocks: 2, HandoffMS: 1, TStart: 1e9, TReady: 1.5e9},
		{Prefill: 0, Decode: 1, Bytes: 1e9, Warmup: true, HandoffMS: 9, TStart: 1, TReady: 2},
	}
	got := SummarizePairs(recs, 2, 2)
	if len(got) != 4 {
		t.Fatalf("%d pairs", len(got))
	}
	p00, p01, p10 := got[0], got[1], got[2]
	if p00.Requests != 2 || p00.Bytes != 2e9 || p00.ActiveSeconds != 2 || p00.ActiveGBps != 1 || p00.HandoffLatencyMS.Count != 2 {
		t.Errorf("(0, 0): %+v", p00)
	}
	if p01.Prefill != 0 || p01.Decode != 1 || p01.Requests != 0 || p01.ActiveGBps != 0 {
		t.Errorf("(0, 1) only had a warm-up: %+v", p01)
	}
	if p10.Requests != 2 || p10.Failed != 2 || p10.CorruptBlocks != 2 || p10.Bytes != 5e8 {
		t.Errorf("(1, 0): %+v", p10)
	}
}

// An xPyD result renders its pairs as matrices (rows prefill, columns
// decode) and plots them as heatmaps; a 1x1 one renders neither.
func TestHandoffPairRender(t *testing.T) {
	recs := []HandoffRecord{
		{Index: 0, Prefill: 0, Decode: 0, Bytes: 1e9, HandoffMS: 2, TStart: 1e9, TReady: 2e9},
		{Index: 1, Prefill: 1, Decode: 0, Bytes: 1e9, HandoffMS: 3, TStart: 1e9, TReady: 3e9},
		{Index: 2, Prefill: 0, Decode: 1, Error: "decode: boom", TStart: 1e9},
	}
	res := &HandoffResult{Protocol: "pull", Records: recs, Summary: SummarizeHandoff(recs, 0)}
	res.Config.PrefillEngines = []EngineSlot{{"local", 1}, {"local", 1}}
	res.Config.DecodeEngines = res.Config.PrefillEngines
	res.Summary.Pairs = SummarizePairs(recs, 2, 2)
	var b strings.Builder
	if err := res.Render(&b, report.FormatTable); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"requests (failed)", "GB/s (pair active)", "handoff p99 (ms)", "prefill-1", "decode-1", "1 (1)"} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("no %q in:\n%s", want, b.String())
		}
	}
	fig, err := res.Figure()
	if err != nil {
		t.Fatal(err)
	}
	if len(fig.Panels) != 4 || fig.Panels[2].Heatmap == nil || math.Abs(fig.Panels[3].Heatmap.Values[0][0]-2) > 0.01 {
		t.Errorf("figure %+v", fig)
	}
	if !math.IsNaN(fig.Panels[2].Heatmap.Values[0][1]) || !math.IsNaN(fig.Panels[2].Heatmap.Values[1][1]) {
		t.Errorf("pairs that moved nothing should be blank: %v", fig.Panels[2].Heatmap.Values)
	}
	one := &HandoffResult{Protocol: "pull", Records: recs[:1], Summary: SummarizeHandoff(recs[:1], 0)}
	b.Reset()
	if err := one.Render(&b, report.FormatTable); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(b.String(), "pair active") {
		t.Errorf("1x1 renders pairs:\n%s", b.String())
	}
}

// A removed engine gets no more requests; pick says so when no live pair
// is left.
func TestRouterRemove(t *testing.T) {
	for _, kind := range Routers {
		t.Run(string(kind), func(t *testing.T) {
			r := newRouter(kind, 2, 2)
			if !r.remove("decode", 0) {
				t.Fatal("decode-1 and both prefills are left: pairs remain")
			}
			for range 8 {
				p, d, ok := r.pick()
				if !ok || d != 1 {
					t.Fatalf("pick = (%d, %d, %v) after decode-0 died", p, d, ok)
				}
				r.done(p, d)
			}
			if r.remove("decode", 1) {
				t.Fatal("no decode is left, yet remove says pairs remain")
			}
			if _, _, ok := r.pick(); ok {
				t.Fatal("pick found a pair with every decode dead")
			}
		})
	}
}
