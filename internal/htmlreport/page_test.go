package htmlreport

import (
	"bytes"
	"encoding/json"
	"fmt"
	"html"
	"math"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/nixlctl/nixlctl/internal/golden"
	"github.com/nixlctl/nixlctl/internal/report"
)

// The fixtures in testdata are real runs of nixlctl on the development
// machine (docs/reports.md says how they were made): a bench push whose
// registration watchdog failed 14 of 24 requests, a clean one, one with
// --repeat 3, a 2x2 xPyD run, a bench xfer sweep, a lease-chaos --sim run,
// a probe ucx-leak run with its self-test leak and a bench ec run.

func load(t testing.TB, name string) report.Result {
	t.Helper()
	l, err := report.Load(filepath.Join("testdata", name))
	if err != nil {
		t.Fatal(err)
	}
	return l.Result
}

func render(t testing.TB, p *Page) []byte {
	t.Helper()
	var b bytes.Buffer
	if err := p.Write(&b); err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}

// pageCase is one kind of page: how to build it, the sections it must
// have, and the values its numbers must equal.
type pageCase struct {
	name     string
	build    func(t testing.TB) (*Page, valuesFunc)
	sections []string
}

// valuesFunc returns the value a page's number (data-run, data-metric)
// must equal, and whether it knows that number.
type valuesFunc func(run, metric string) (float64, bool)

func single(name string) func(t testing.TB) (*Page, valuesFunc) {
	return func(t testing.TB) (*Page, valuesFunc) {
		res := load(t, name)
		p, err := Build(res, "test")
		if err != nil {
			t.Fatal(err)
		}
		v := resultValues(t, res)
		return p, func(_, m string) (float64, bool) { return v(m) }
	}
}

var pageCases = []pageCase{
	{"handoff-failures", single("push-fail"), []string{"warnings", "run", "summary", "latency", "bandwidth", "failures", "all-metrics"}},
	{"handoff-repeat", single("push-rep"), []string{"summary", "latency", "bandwidth", "repeats", "all-metrics"}},
	{"xpyd", single("xpyd"), []string{"summary", "latency", "bandwidth", "pairs", "failures"}},
	{"xfer", single("xfer"), []string{"sweep", "all-metrics"}},
	{"ucx-leak", single("ucx-leak.json"), []string{"rss", "all-metrics"}},
	{"lease-chaos", single("lease-chaos.json"), []string{"scenarios", "sweep", "timelines"}},
	// A kind without a page of its own: its --plot figure and its metrics.
	{"bench-ec", single("ec"), []string{"charts", "all-metrics"}},
	{"compare", func(t testing.TB) (*Page, valuesFunc) {
		a, b := load(t, "push-small"), load(t, "push-rep")
		p, err := BuildCompare([]string{"push-small", "push-rep"}, []report.Result{a, b}, nil, "test")
		if err != nil {
			t.Fatal(err)
		}
		va, vb := resultValues(t, a), resultValues(t, b)
		return p, func(run, m string) (float64, bool) {
			if run == "push-small" {
				return va(m)
			}
			return vb(m)
		}
	}, []string{"comparison", "runs-as-points"}},
	{"gate", func(t testing.TB) (*Page, valuesFunc) {
		base, run := load(t, "push-small"), load(t, "push-rep")
		rep, err := report.Gate(base, []report.Result{run}, report.GateOptions{MaxRegression: 0.05,
			Metrics: []string{"efficiency_vs_memcpy", "handoff_latency_ms.p99", "bandwidth_gbps"}})
		if err != nil {
			t.Fatal(err)
		}
		p := BuildGate(rep, "baseline push-small", base, []string{"push-rep"}, []report.Result{run}, "test")
		return p, func(run, m string) (float64, bool) {
			for _, r := range rep.Rows {
				if r.Name == m {
					if run == "baseline" {
						return r.Baseline, true
					}
					return r.Result, true
				}
			}
			return 0, false
		}
	}, []string{"verdict", "runs-as-points"}},
}

// resultValues looks a page's metric names up in the result: a metric's
// name (Metrics), or a path into the result's JSON ($.summary.pairs[0].
// requests, $.summary.failures_by_reason[reason]).
func resultValues(t testing.TB, res report.Result) func(string) (float64, bool) {
	t.Helper()
	byName := map[string]float64{}
	for _, m := range res.Metrics() {
		byName[m.Name()] = m.Value
	}
	raw, err := json.Marshal(res)
	if err != nil {
		t.Fatal(err)
	}
	var doc any
	if err := json.Unmarshal(raw, &doc); err != nil {
		t.Fatal(err)
	}
	return func(name string) (float64, bool) {
		if !strings.HasPrefix(name, "$.") {
			v, ok := byName[name]
			return v, ok
		}
		return jsonPath(doc, name[2:])
	}
}

// jsonPath follows a.b[2].c (a bracket holds an index or a map key that
// may contain dots and spaces).
func jsonPath(doc any, path string) (float64, bool) {
	cur := doc
	for path != "" {
		var key string
		switch {
		case path[0] == '.':
			path = path[1:]
			continue
		case path[0] == '[':
			// The first "]" that ends the path or is followed by "." or
			// "[": a key may hold brackets of its own.
			end := -1
			for i := 1; i < len(path); i++ {
				if path[i] == ']' && (i+1 == len(path) || path[i+1] == '.' || path[i+1] == '[') {
					end = i
					break
				}
			}
			if end < 0 {
				return 0, false
			}
			key, path = path[1:end], path[end+1:]
		default:
			end := strings.IndexAny(path, ".[")
			if end < 0 {
				end = len(path)
			}
			key, path = path[:end], path[end:]
		}
		switch c := cur.(type) {
		case map[string]any:
			cur = c[key]
		case []any:
			i, err := strconv.Atoi(key)
			if err != nil || i < 0 || i >= len(c) {
				return 0, false
			}
			cur = c[i]
		default:
			return 0, false
		}
	}
	f, ok := cur.(float64)
	return f, ok
}

// pageNumber is one number read back from a page.
type pageNumber struct {
	run, metric, text string
	value             float64
}

var numberRE = regexp.MustCompile(`<td[^>]*?(?: data-run="([^"]*)")? data-metric="([^"]*)" data-value="([^"]*)"[^>]*>([^<]*)</td>`)

// readNumbers finds every named number of a page (as written, or as a
// browser's DOM dump has it).
func readNumbers(t testing.TB, page []byte) []pageNumber {
	t.Helper()
	var out []pageNumber
	for _, m := range numberRE.FindAllSubmatch(page, -1) {
		v, err := strconv.ParseFloat(html.UnescapeString(string(m[3])), 64)
		if err != nil {
			t.Fatalf("data-value %q: %v", m[3], err)
		}
		out = append(out, pageNumber{run: html.UnescapeString(string(m[1])), metric: html.UnescapeString(string(m[2])),
			text: html.UnescapeString(string(m[4])), value: v})
	}
	return out
}

// numberProblems compares every named number on the page with the
// result: data-value exactly, and the text shown to the figures shown.
func numberProblems(t testing.TB, page []byte, want valuesFunc) (problems []string, n int) {
	t.Helper()
	nums := readNumbers(t, page)
	if len(nums) == 0 {
		return []string{"the page has no named numbers"}, 0
	}
	for _, n := range nums {
		w, ok := want(n.run, n.metric)
		if !ok {
			problems = append(problems, fmt.Sprintf("%s %s: not in the result", n.run, n.metric))
			continue
		}
		if n.value != w && !(math.IsNaN(n.value) && math.IsNaN(w)) {
			problems = append(problems, fmt.Sprintf("%s %s: page has %v, result %v", n.run, n.metric, n.value, w))
		}
		shown, err := strconv.ParseFloat(strings.ReplaceAll(n.text, ",", ""), 64)
		if err != nil {
			problems = append(problems, fmt.Sprintf("%s %s: shown as %q, not a number", n.run, n.metric, n.text))
			continue
		}
		if !close3(shown, w) {
			problems = append(problems, fmt.Sprintf("%s %s: shown as %q, result %v", n.run, n.metric, n.text, w))
		}
	}
	return problems, len(nums)
}

func checkNumbers(t *testing.T, page []byte, want valuesFunc) int {
	t.Helper()
	problems, n := numberProblems(t, page, want)
	for _, p := range problems {
		t.Error(p)
	}
	return n
}

// close3 says a and b agree to the three significant figures (or one
// decimal, for the sweep table's %.1f) a page shows.
func close3(shown, v float64) bool {
	d := math.Abs(shown - v)
	return d <= 0.005*math.Abs(v)+1e-12 || d <= 0.05
}

func TestPages(t *testing.T) {
	for _, tc := range pageCases {
		t.Run(tc.name, func(t *testing.T) {
			p, want := tc.build(t)
			page := render(t, p)
			n := checkNumbers(t, page, want)
			t.Logf("%d bytes, %d numbers checked", len(page), n)
			s := string(page)
			for _, id := range tc.sections {
				if !strings.Contains(s, `id="`+id+`"`) {
					t.Errorf("no section %q", id)
				}
			}
			// Self-contained: nothing to fetch, so it opens offline.
			for _, bad := range []string{"<link", " src=", " href=", "@import", "url(", "http://", "https://"} {
				if strings.Contains(s, bad) {
					t.Errorf("the page refers to something outside it (%q)", bad)
				}
			}
			// Warnings come before everything the run measured.
			if w, r := strings.Index(s, `id="warnings"`), strings.Index(s, `id="run"`); w < 0 || w > r {
				t.Errorf("warnings at %d, the run's header at %d: want warnings first", w, r)
			}
		})
	}
}

// TestWarningsShown: every warning of the result is on the page, in the
// warnings box.
func TestWarningsShown(t *testing.T) {
	for _, name := range []string{"push-fail", "xfer", "lease-chaos.json"} {
		t.Run(name, func(t *testing.T) {
			res := load(t, name)
			p, err := Build(res, "test")
			if err != nil {
				t.Fatal(err)
			}
			page := string(render(t, p))
			box := page
			if end := strings.Index(page, `id="run"`); end >= 0 {
				box = page[:end]
			}
			for _, w := range res.Header().Warnings {
				if !strings.Contains(box, html.EscapeString(w)) {
					t.Errorf("warning not in the box: %s", w)
				}
			}
			if len(res.Header().Warnings) == 0 && !strings.Contains(box, "No warnings") {
				t.Error("a run without warnings does not say so")
			}
		})
	}
}

// TestFailureExamples: each failure reason comes with a record that
// failed for it.
func TestFailureExamples(t *testing.T) {
	p, err := Build(load(t, "push-fail"), "test")
	if err != nil {
		t.Fatal(err)
	}
	page := string(render(t, p))
	for _, want := range []string{"decode: registration watchdog: no push completion within N", "request ", "14 of 24 requests failed"} {
		if !strings.Contains(page, html.EscapeString(want)) {
			t.Errorf("failures section lacks %q", want)
		}
	}
	if strings.Contains(page, "(no record has this reason)") {
		t.Error("a reason without its example")
	}
}

func TestJSONPath(t *testing.T) {
	doc := map[string]any{"a": []any{map[string]any{"b.c": 2.5, "d": map[string]any{"p50": 1.0}}}}
	for _, tc := range []struct {
		path string
		want float64
		ok   bool
	}{
		{"a[0][b.c]", 2.5, true},
		{"a[0].d.p50", 1, true},
		{"a[1].d", 0, false},
		{"x", 0, false},
	} {
		got, ok := jsonPath(doc, tc.path)
		if ok != tc.ok || got != tc.want {
			t.Errorf("%s: got %v %v, want %v %v", tc.path, got, ok, tc.want, tc.ok)
		}
	}
}

// TestCheckNumbersCatches: the number check fails on a page whose number
// differs from the result, so its passes mean something.
func TestCheckNumbersCatches(t *testing.T) {
	res := load(t, "push-small")
	p, err := Build(res, "test")
	if err != nil {
		t.Fatal(err)
	}
	page := render(t, p)
	v := resultValues(t, res)
	nums := readNumbers(t, page)
	if len(nums) < 20 {
		t.Fatalf("only %d numbers read", len(nums))
	}
	wrong := func(_, m string) (float64, bool) {
		x, ok := v(m)
		return x*1.5 + 1, ok
	}
	problems, n := numberProblems(t, page, wrong)
	if len(problems) < n {
		t.Errorf("numbers 1.5x off: %d problems found among %d numbers, want all", len(problems), n)
	}
}

// TestGolden pins the rendered markup of two small pages.
func TestGolden(t *testing.T) {
	for _, tc := range []struct{ name, golden string }{{"gate", "gate.html.golden"}, {"ucx-leak", "ucx-leak.html.golden"}} {
		t.Run(tc.name, func(t *testing.T) {
			for _, pc := range pageCases {
				if pc.name == tc.name {
					p, _ := pc.build(t)
					golden.Check(t, tc.golden, render(t, p))
					return
				}
			}
			t.Fatalf("no page case %s", tc.name)
		})
	}
}

func TestQuantilePoints(t *testing.T) {
	many := make([]float64, 10000)
	for i := range many {
		many[i] = float64(i + 1)
	}
	for _, tc := range []struct {
		name      string
		in        []float64
		maxPoints int
	}{
		{"few values keep every step", []float64{1, 2, 2, 3}, 3},
		{"10,000 values", many, 400},
	} {
		t.Run(tc.name, func(t *testing.T) {
			xs, ps := quantilePoints(tc.in, 200)
			if len(xs) > tc.maxPoints || len(xs) != len(ps) {
				t.Fatalf("%d points (%d fractions), want at most %d", len(xs), len(ps), tc.maxPoints)
			}
			if xs[len(xs)-1] != tc.in[len(tc.in)-1] || ps[len(ps)-1] != 1 {
				t.Errorf("last point %v at %v: want the max at 1", xs[len(xs)-1], ps[len(ps)-1])
			}
			for i := 1; i < len(xs); i++ {
				if xs[i] <= xs[i-1] || ps[i] <= ps[i-1] {
					t.Fatalf("not increasing at %d: %v %v", i, xs[i-1:i+1], ps[i-1:i+1])
				}
			}
			if len(tc.in) == 10000 {
				// p99 to max is drawn value by value.
				n := 0
				for _, x := range xs {
					if x > 9900 {
						n++
					}
				}
				if n < 99 {
					t.Errorf("%d points above p99, want every value", n)
				}
			}
		})
	}
}

func TestEscaping(t *testing.T) {
	p := &Page{Title: `<script>alert(1)</script>`, Warnings: []Warning{{Text: `a "quoted" <b>warning</b>`}},
		Sections: []Section{{ID: "s", Title: "t", Blocks: []Block{charts(renderPanel("x", report.Panel{Title: "<i>", XLabel: "<x>", Lines: []report.Line{{Label: "<l>", X: []float64{1, 2}, Y: []float64{1, 2}}}}))}}}}
	page := string(render(t, p))
	for _, bad := range []string{"<script>alert", "<b>warning", "<i>", "<x>", "<l>"} {
		if strings.Contains(page, bad) {
			t.Errorf("unescaped %q in the page", bad)
		}
	}
}
