package htmlreport

import (
	"fmt"
	"math"
	"strconv"
	"strings"

	"github.com/nixlctl/nixlctl/internal/report"
	"github.com/nixlctl/nixlctl/internal/stats"
)

// runValues is a metric's value in each run a result holds: every run of
// a --repeat result, else its one value.
func runValues(res report.Result, m report.Metric) []float64 {
	if r := res.Header().Repeats; r != nil {
		for _, rm := range r.Metrics {
			if rm.Name == m.Name() {
				return rm.Values
			}
		}
	}
	return []float64{m.Value}
}

// BuildCompare makes the page of report compare: the results side by
// side against the first, each metric's change and noise judgement, and
// each metric's runs as points.
func BuildCompare(labels []string, results []report.Result, selectors []string, version string) (*Page, error) {
	c, err := report.Compare(labels, results, selectors)
	if err != nil {
		return nil, err
	}
	cmd := results[0].Header().Command
	p := &Page{Title: fmt.Sprintf("nixlctl compare: %s, %d results", cmd, len(results)), Kind: "compare", Generator: version,
		Subtitle: "Against " + labels[0] + ": " + strings.Join(labels[1:], ", ")}
	addRuns(p, labels, results)
	t := &Table{ID: "comparison", Caption: "Each metric against " + labels[0],
		Head: []Cell{text("metric"), text("better")}}
	for _, l := range labels {
		t.Head = append(t.Head, Cell{Text: l, Num: true})
	}
	for _, l := range labels[1:] {
		t.Head = append(t.Head, Cell{Text: "Δ " + l, Num: true}, text("noise test "+l))
	}
	byName := make([]map[string]report.Metric, len(results))
	for i, r := range results {
		byName[i] = map[string]report.Metric{}
		for _, m := range r.Metrics() {
			byName[i][m.Name()] = m
		}
	}
	var cs []chart
	for ri, row := range c.Rows {
		cells := []Cell{text(row.Name + unitSuffix(row.Unit)), text(row.Better)}
		for i, v := range row.Values {
			cells = append(cells, metricCell(labels[i], row.Name, v, num(v)))
		}
		for i := 1; i < len(row.Values); i++ {
			ch := numCell(signedPct(row.Changes[i]))
			test := text(row.Tests[i])
			if strings.HasPrefix(row.Tests[i], "slower") || strings.HasPrefix(row.Tests[i], "faster") {
				test.Class = "bad"
			}
			cells = append(cells, ch, test)
		}
		t.Rows = append(t.Rows, cells)
		var vals [][]float64
		for i := range results {
			if m, ok := byName[i][row.Name]; ok {
				vals = append(vals, runValues(results[i], m))
			} else {
				vals = append(vals, nil)
			}
		}
		cs = append(cs, stripChart(fmt.Sprintf("m%d", ri), row.Name+unitSuffix(row.Unit), labels, vals, nil))
	}
	sec := Section{ID: "comparison", Title: "Side by side", Blocks: []Block{
		para("Δ is the change against the first result. The noise test is a Mann-Whitney U test on the latency histograms behind the metric: \"slower\" or \"faster\" only when p < 0.01 and Cliff's |δ| ≥ 0.147, else \"same\"."),
		tableBlock(t)}}
	for _, n := range c.Notes {
		sec.Blocks = append(sec.Blocks, Block{Para: n, Class: "note"})
	}
	p.Sections = append(p.Sections, sec, Section{ID: "runs-as-points", Title: "Each metric's runs", Blocks: []Block{
		para("Every run of every result as a point (a --repeat result has one per run); the bar is the median."),
		charts(cs...)}})
	return p, nil
}

// addRuns puts every result's header and warnings on a page of several.
// A warning several runs share is listed once, naming them all.
func addRuns(p *Page, labels []string, results []report.Result) {
	var order []string
	runs := map[string][]string{}
	for i, r := range results {
		for _, w := range r.Header().Warnings {
			if _, ok := runs[w]; !ok {
				order = append(order, w)
			}
			runs[w] = append(runs[w], labels[i])
		}
		p.Runs = append(p.Runs, runHeader(labels[i], r))
	}
	for _, w := range order {
		who := strings.Join(runs[w], ", ")
		if len(runs[w]) == len(results) && len(results) > 1 {
			who = "all runs"
		}
		p.Warnings = append(p.Warnings, Warning{Run: who, Text: w})
	}
}

func signedPct(x float64) string {
	switch {
	case math.IsNaN(x):
		return "-"
	case math.IsInf(x, 0):
		return fmt.Sprintf("%+.0f", x)
	}
	return fmt.Sprintf("%+.2f%%", x*100)
}

// BuildGate makes the page of a gate judgement: the verdict first, each
// metric's baseline and runs as points with the allowed band around the
// baseline, and the why of each verdict.
func BuildGate(rep *report.GateReport, baseLabel string, base report.Result, runLabels []string, runs []report.Result, version string) *Page {
	verdict := "PASS"
	if !rep.Passed {
		verdict = "FAIL"
	}
	p := &Page{Title: fmt.Sprintf("nixlctl gate: %s — %s", verdict, rep.Command), Kind: "gate", Generator: version,
		Subtitle: rep.Headline()}
	addRuns(p, append([]string{baseLabel}, runLabels...), append([]report.Result{base}, runs...))
	for _, r := range rep.Refused {
		p.Warnings = append([]Warning{{Run: "gate", Text: "refused: " + r}}, p.Warnings...)
	}
	cls := "ok"
	if !rep.Passed {
		cls = "bad"
	}
	t := &Table{ID: "gate", Caption: "Verdict per metric", Head: numHead([]string{"metric", "baseline", "result (median)", "change", "noise test", "verdict", "why"}, 1)}
	t.Head[4].Num, t.Head[5].Num, t.Head[6].Num = false, false, false
	var cs []chart
	for i, row := range rep.Rows {
		v := Cell{Text: string(row.Verdict), Class: "verdict-" + string(row.Verdict)}
		t.Rows = append(t.Rows, []Cell{text(row.Name + unitSuffix(row.Unit)),
			metricCell("baseline", row.Name, row.Baseline, num(row.Baseline)),
			metricCell("result", row.Name, row.Result, num(row.Result)),
			numCell(signedPct(row.Change)), text(row.Test), v, text(row.Why)})
		baseVals := row.BaselineRuns
		if len(baseVals) == 0 {
			baseVals = []float64{row.Baseline}
		}
		band := [2]float64{row.Baseline * (1 - rep.MaxRegression), row.Baseline * (1 + rep.MaxRegression)}
		cs = append(cs, stripChart(fmt.Sprintf("g%d", i), row.Name+unitSuffix(row.Unit)+": "+string(row.Verdict),
			[]string{"baseline", "result"}, [][]float64{baseVals, row.Runs}, &band))
	}
	p.Sections = append(p.Sections, Section{ID: "verdict", Title: "Verdict", Blocks: []Block{
		{Para: rep.Headline(), Class: cls},
		tableBlock(t),
	}}, Section{ID: "runs-as-points", Title: "Each metric's runs", Blocks: []Block{
		para(fmt.Sprintf("Every run as a point, the median as a bar; the shaded band is the baseline ± %s (--max-regression): a result outside it on the worse side is judged by the noise test.", signedPct(rep.MaxRegression)[1:])),
		charts(cs...)}})
	return p
}

// stripChart draws each group's values as points in a column, with the
// median as a bar and an optional band (the gate's allowance).
func stripChart(id, title string, groups []string, values [][]float64, band *[2]float64) chart {
	const w, h, left, right, top, bottom = 300.0, 190.0, 56.0, 10.0, 10.0, 34.0
	var all []float64
	for _, vs := range values {
		for _, v := range vs {
			if !math.IsNaN(v) && !math.IsInf(v, 0) {
				all = append(all, v)
			}
		}
	}
	if band != nil {
		all = append(all, band[0], band[1])
	}
	y := newAxis(report.Linear, all, nil, h-bottom, top)
	var b svgBuilder
	b.f(`<svg class="chart" viewBox="0 0 %d %d" role="img" aria-label="%s">`, int(w), int(h), esc(title))
	for _, t := range y.ticks() {
		py := coord(y.px(t))
		b.f(`<line class="grid" x1="%s" x2="%s" y1="%s" y2="%s"/><text x="%s" y="%s" text-anchor="end" dy="4">%s</text>`,
			coord(left), coord(w-right), py, py, coord(left-5), py, esc(strconv.FormatFloat(t, 'g', 4, 64)))
	}
	if band != nil {
		y0, y1 := y.px(band[1]), y.px(band[0])
		b.f(`<rect x="%s" y="%s" width="%s" height="%s" fill="#1b7f3b" fill-opacity="0.10"><title>allowed: %s – %s</title></rect>`,
			coord(left), coord(y0), coord(w-right-left), coord(math.Max(y1-y0, 0.5)), num(band[0]), num(band[1]))
	}
	b.f(`<rect class="frame" x="%s" y="%s" width="%s" height="%s"/>`, coord(left), coord(top), coord(w-left-right), coord(h-top-bottom))
	colW := (w - left - right) / float64(max(len(groups), 1))
	var legend []legendEntry
	for g, name := range groups {
		cx := left + colW*(float64(g)+0.5)
		label := name
		if len([]rune(label)) > 18 {
			label = string([]rune(label)[:17]) + "…"
		}
		b.f(`<text x="%s" y="%s" text-anchor="middle">%s</text>`, coord(cx), coord(h-bottom+15), esc(label))
		if g >= len(values) || len(values[g]) == 0 {
			continue
		}
		sid := fmt.Sprintf("%s-g%d", id, g)
		col := palette[g%len(palette)]
		legend = append(legend, legendEntry{ID: sid, Label: name, Color: col})
		b.f(`<g data-series="%s" fill="%s">`, sid, col)
		vs := values[g]
		for k, v := range vs {
			if math.IsNaN(v) || math.IsInf(v, 0) {
				continue
			}
			// Spread the points of a column sideways so equal values
			// stay countable.
			dx := 0.0
			if len(vs) > 1 {
				dx = (float64(k)/float64(len(vs)-1) - 0.5) * math.Min(colW*0.5, 60)
			}
			b.f(`<circle class="pt" cx="%s" cy="%s" r="4" fill-opacity="0.8"><title>%s run %d: %s</title></circle>`,
				coord(cx+dx), coord(y.px(v)), esc(name), k+1, num(v))
		}
		med := stats.Median(vs)
		b.f(`<line x1="%s" x2="%s" y1="%s" y2="%s" stroke="%s" stroke-width="2.5"><title>%s median: %s</title></line>`,
			coord(cx-colW*0.35), coord(cx+colW*0.35), coord(y.px(med)), coord(y.px(med)), col, esc(name), num(med))
		b.f(`</g>`)
	}
	b.f(`</svg>`)
	return chart{Title: title, SVG: templateHTML(b.String()), Legend: legend, Class: "small"}
}
