package htmlreport

import (
	"fmt"
	"html/template"
	"math"
	"sort"
	"strconv"
	"strings"

	"github.com/nixlctl/nixlctl/internal/report"
	"github.com/nixlctl/nixlctl/internal/stats"
)

// Chart geometry in SVG user units; the viewBox scales it to the page's
// width, so a printed page keeps the proportions.
const (
	chartW  = 640
	chartH  = 340
	marginL = 70
	marginR = 16
	marginT = 14
	marginB = 46
)

// palette is Okabe and Ito's colour-blind safe set (with black last), so
// series stay apart on screen, in grey print and for most readers.
var palette = []string{"#0072B2", "#E69F00", "#009E73", "#CC79A7", "#D55E00", "#56B4E9", "#F0E442", "#000000"}

func colorOf(l report.Line, i int) string {
	c := l.Color
	if c <= 0 {
		c = i + 1
	}
	return palette[(c-1)%len(palette)]
}

// axis maps data values to pixels on one axis, linear or logarithmic.
type axis struct {
	scale      report.Scale
	lo, hi     float64 // data range, already transformed for log scales
	pxLo, pxHi float64
}

func (a axis) tr(v float64) float64 {
	switch a.scale {
	case report.Log10:
		return math.Log10(v)
	case report.Log2:
		return math.Log2(v)
	}
	return v
}

func (a axis) px(v float64) float64 {
	t := a.tr(v)
	if a.hi == a.lo {
		return (a.pxLo + a.pxHi) / 2
	}
	return a.pxLo + (t-a.lo)/(a.hi-a.lo)*(a.pxHi-a.pxLo)
}

// usable says whether v can be placed on the axis: log scales drop values
// at or below zero rather than clamping them to a made-up place.
func (a axis) usable(v float64) bool {
	if math.IsNaN(v) || math.IsInf(v, 0) {
		return false
	}
	return a.scale == report.Linear || v > 0
}

// newAxis spans the values vs (log scales: the positive ones).
func newAxis(scale report.Scale, vs []float64, pin *float64, pxLo, pxHi float64) axis {
	a := axis{scale: scale, pxLo: pxLo, pxHi: pxHi}
	lo, hi := math.Inf(1), math.Inf(-1)
	for _, v := range vs {
		if !a.usable(v) {
			continue
		}
		lo, hi = math.Min(lo, v), math.Max(hi, v)
	}
	if pin != nil && a.usable(*pin) {
		lo = math.Min(lo, *pin)
	}
	if math.IsInf(lo, 1) {
		lo, hi = 0, 1
		if scale != report.Linear {
			lo = 1
		}
	}
	if scale == report.Linear {
		if hi == lo {
			lo, hi = lo-1, hi+1
			if lo < 0 && pin != nil {
				lo = *pin
			}
		}
		pad := (hi - lo) * 0.04
		if pin == nil || lo > *pin {
			lo -= pad
		}
		hi += pad
		a.lo, a.hi = lo, hi
		return a
	}
	a.lo, a.hi = a.tr(lo), a.tr(hi)
	if a.hi-a.lo < 0.2 {
		a.lo, a.hi = a.lo-0.1, a.hi+0.1
	}
	pad := (a.hi - a.lo) * 0.04
	a.lo, a.hi = a.lo-pad, a.hi+pad
	return a
}

// ticks are the values at which the axis is labelled.
func (a axis) ticks() []float64 {
	switch a.scale {
	case report.Log10, report.Log2:
		base := 10.0
		if a.scale == report.Log2 {
			base = 2
		}
		var out []float64
		step := 1.0
		if n := math.Floor(a.hi) - math.Ceil(a.lo); n > 8 {
			step = math.Ceil(n / 8)
		}
		for e := math.Ceil(a.lo); e <= a.hi; e += step {
			out = append(out, math.Pow(base, e))
		}
		if len(out) < 2 && a.scale == report.Log10 {
			// Less than a decade: linear ticks read better.
			return linearTicks(math.Pow(10, a.lo), math.Pow(10, a.hi))
		}
		return out
	}
	return linearTicks(a.lo, a.hi)
}

func linearTicks(lo, hi float64) []float64 {
	span := hi - lo
	if span <= 0 {
		return []float64{lo}
	}
	raw := span / 6
	mag := math.Pow(10, math.Floor(math.Log10(raw)))
	step := mag
	for _, m := range []float64{1, 2, 2.5, 5, 10} {
		if m*mag >= raw {
			step = m * mag
			break
		}
	}
	var out []float64
	for v := math.Ceil(lo/step) * step; v <= hi+step*1e-9; v += step {
		if math.Abs(v) < step*1e-9 {
			v = 0
		}
		out = append(out, v)
	}
	return out
}

// tickLabel writes a tick: sizes in binary units on Log2 axes (block
// sizes), else a short number.
func tickLabel(a axis, v float64) string {
	if a.scale == report.Log2 && v >= 1 && v == math.Trunc(v) {
		return report.Bytes(int64(v))
	}
	// Ticks are round numbers: no trailing zeros ("0.2", not "0.200").
	return strconv.FormatFloat(v, 'g', 4, 64)
}

// num writes a value the way the tables do: three significant digits.
func num(v float64) string {
	if math.IsNaN(v) {
		return "-"
	}
	return report.Float(v)
}

// svgBuilder collects one chart's markup.
type svgBuilder struct {
	strings.Builder
}

func (b *svgBuilder) f(format string, args ...any) { fmt.Fprintf(b, format, args...) }

func esc(s string) string { return template.HTMLEscapeString(s) }

func coord(x float64) string { return strconv.FormatFloat(x, 'f', 1, 64) }

// chart is a rendered panel: its SVG and the legend entries that toggle
// its series.
type chart struct {
	Title  string
	SVG    template.HTML
	Legend []legendEntry
	// Note says what the chart does not show (points dropped on a log
	// axis) so a reader is not misled.
	Note string
	// Class sizes the figure: "" (a full chart), "small" or "heat".
	Class string
}

type legendEntry struct {
	ID, Label, Color string
	Dashed           bool
}

// renderPanel draws a report.Panel as an inline SVG. id prefixes the
// series' ids (data-series) so the page script can toggle them.
func renderPanel(id string, p report.Panel) chart {
	if p.Heatmap != nil {
		return renderHeatmap(p)
	}
	var b svgBuilder
	c := chart{Title: p.Title}
	var xs, ys []float64
	for _, l := range p.Lines {
		xs, ys = append(xs, l.X...), append(ys, l.Y...)
	}
	if p.Bars != nil {
		xs = append(xs, p.Bars.Edges...)
		ys = append(ys, p.Bars.Counts...)
		zero := 0.0
		if p.YMin == nil && p.YScale == report.Linear {
			p.YMin = &zero
		}
	}
	var spanRows []string
	if len(p.Spans) > 0 {
		seen := map[string]bool{}
		for _, s := range p.Spans {
			xs = append(xs, s.Start, s.End)
			if !seen[s.Row] {
				seen[s.Row] = true
				spanRows = append(spanRows, s.Row)
			}
		}
	}
	x := newAxis(p.XScale, xs, nil, marginL, chartW-marginR)
	y := newAxis(p.YScale, ys, p.YMin, chartH-marginB, marginT)
	if len(spanRows) > 0 {
		y = axis{scale: report.Linear, lo: 0, hi: float64(len(spanRows)), pxLo: marginT, pxHi: chartH - marginB}
	}
	b.f(`<svg class="chart" viewBox="0 0 %d %d" role="img" aria-label="%s">`, chartW, chartH, esc(p.Title))
	// Frame, grid and ticks.
	b.f(`<g class="axes">`)
	for _, t := range x.ticks() {
		px := coord(x.px(t))
		b.f(`<line class="grid" x1="%s" x2="%s" y1="%d" y2="%d"/><text x="%s" y="%d" text-anchor="middle">%s</text>`,
			px, px, marginT, chartH-marginB, px, chartH-marginB+16, esc(tickLabel(x, t)))
	}
	if len(spanRows) == 0 {
		for _, t := range y.ticks() {
			py := coord(y.px(t))
			b.f(`<line class="grid" x1="%d" x2="%d" y1="%s" y2="%s"/><text x="%d" y="%s" text-anchor="end" dy="4">%s</text>`,
				marginL, chartW-marginR, py, py, marginL-6, py, esc(tickLabel(y, t)))
		}
	}
	b.f(`<rect class="frame" x="%d" y="%d" width="%d" height="%d"/>`, marginL, marginT, chartW-marginL-marginR, chartH-marginT-marginB)
	b.f(`<text class="label" x="%d" y="%d" text-anchor="middle">%s</text>`, (marginL+chartW-marginR)/2, chartH-8, esc(p.XLabel))
	b.f(`<text class="label" transform="translate(14 %d) rotate(-90)" text-anchor="middle">%s</text>`, (marginT+chartH-marginB)/2, esc(p.YLabel))
	b.f(`</g>`)
	dropped := 0
	if p.Bars != nil {
		sid := id + "-bars"
		col := palette[0]
		c.Legend = append(c.Legend, legendEntry{ID: sid, Label: orDefault(p.Bars.Label, "count"), Color: col})
		b.f(`<g data-series="%s" fill="%s" fill-opacity="0.75">`, sid, col)
		base := y.pxLo // the bottom of the plot area
		for i, n := range p.Bars.Counts {
			x0, x1 := p.Bars.Edges[i], p.Bars.Edges[i+1]
			if !x.usable(x0) || !x.usable(x1) || n <= 0 || !y.usable(n) {
				continue
			}
			px0, px1, py := x.px(x0), x.px(x1), y.px(n)
			b.f(`<rect x="%s" y="%s" width="%s" height="%s"><title>%s – %s: %s</title></rect>`,
				coord(px0), coord(py), coord(math.Max(px1-px0-0.5, 0.5)), coord(base-py), num(x0), num(x1), num(n))
		}
		b.f(`</g>`)
	}
	for i, l := range p.Lines {
		sid := fmt.Sprintf("%s-s%d", id, i)
		col := colorOf(l, i)
		c.Legend = append(c.Legend, legendEntry{ID: sid, Label: l.Label, Color: col, Dashed: l.Style == report.Dashed})
		var pts [][2]float64
		var vals [][2]float64
		for j := range l.X {
			if j >= len(l.Y) {
				break
			}
			if !x.usable(l.X[j]) || !y.usable(l.Y[j]) {
				dropped++
				continue
			}
			pts = append(pts, [2]float64{x.px(l.X[j]), y.px(l.Y[j])})
			vals = append(vals, [2]float64{l.X[j], l.Y[j]})
		}
		if len(pts) == 0 {
			continue
		}
		b.f(`<g data-series="%s">`, sid)
		var d strings.Builder
		for j, pt := range pts {
			switch {
			case j == 0:
				fmt.Fprintf(&d, "M%s %s", coord(pt[0]), coord(pt[1]))
			case l.Style == report.Steps:
				fmt.Fprintf(&d, "H%sV%s", coord(pt[0]), coord(pt[1]))
			default:
				fmt.Fprintf(&d, "L%s %s", coord(pt[0]), coord(pt[1]))
			}
		}
		dash := ""
		if l.Style == report.Dashed {
			dash = ` stroke-dasharray="6 4"`
		}
		b.f(`<path d="%s" fill="none" stroke="%s" stroke-width="1.8"%s/>`, d.String(), col, dash)
		// Hover targets: every point of a short series, or about 120 of a
		// long one (a CDF), each with its values as a tooltip.
		step := 1
		if len(pts) > 120 {
			step = len(pts) / 120
		}
		r, cls := "6", "hit"
		if l.Points {
			r, cls = "3.5", "pt"
		}
		for j := 0; j < len(pts); j += step {
			b.f(`<circle class="%s" cx="%s" cy="%s" r="%s" fill="%s"><title>%s: %s %s, %s %s</title></circle>`,
				cls, coord(pts[j][0]), coord(pts[j][1]), r, col, esc(l.Label), esc(p.XLabel), esc(tickLabelFor(x, vals[j][0])), esc(p.YLabel), num(vals[j][1]))
		}
		b.f(`</g>`)
	}
	if len(spanRows) > 0 {
		rowIdx := map[string]int{}
		for i, r := range spanRows {
			rowIdx[r] = i
		}
		rowH := (y.pxHi - y.pxLo) / float64(len(spanRows))
		classes := map[string]string{}
		var order []string
		for _, s := range p.Spans {
			if _, ok := classes[s.Class]; !ok {
				classes[s.Class] = palette[len(classes)%len(palette)]
				order = append(order, s.Class)
			}
		}
		for _, cl := range order {
			sid := id + "-c-" + cssID(cl)
			c.Legend = append(c.Legend, legendEntry{ID: sid, Label: cl, Color: classes[cl]})
			b.f(`<g data-series="%s" fill="%s">`, sid, classes[cl])
			for _, s := range p.Spans {
				if s.Class != cl {
					continue
				}
				x0, x1 := x.px(s.Start), x.px(s.End)
				top := y.pxLo + float64(rowIdx[s.Row])*rowH
				b.f(`<rect x="%s" y="%s" width="%s" height="%s"><title>%s: %s s – %s s (%s)</title></rect>`,
					coord(x0), coord(top+rowH*0.1), coord(math.Max(x1-x0, 1)), coord(math.Max(rowH*0.8, 0.5)), esc(s.Row), num(s.Start), num(s.End), esc(cl))
			}
			b.f(`</g>`)
		}
	}
	b.f(`</svg>`)
	c.SVG = template.HTML(b.String()) //nolint:gosec // built here with every text escaped
	if dropped > 0 {
		c.Note = fmt.Sprintf("%d point(s) at or below zero are not drawn on the log axis.", dropped)
	}
	return c
}

func tickLabelFor(a axis, v float64) string {
	if a.scale == report.Log2 && v >= 1 && v == math.Trunc(v) {
		return report.Bytes(int64(v))
	}
	return num(v)
}

func orDefault(s, d string) string {
	if s == "" {
		return d
	}
	return s
}

// cssID keeps letters and digits of s, so any label can name an element.
func cssID(s string) string {
	var b strings.Builder
	for _, r := range s {
		if r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' {
			b.WriteRune(r)
		} else {
			b.WriteByte('_')
		}
	}
	return b.String()
}

// renderHeatmap draws a matrix of cells labelled with their values.
func renderHeatmap(p report.Panel) chart {
	h := p.Heatmap
	var b svgBuilder
	cellW, cellH := 110.0, 40.0
	left, top := 110.0, 30.0
	w := left + cellW*float64(len(h.Cols)) + 10
	ht := top + cellH*float64(len(h.Rows)) + 10
	lo, hi := math.Inf(1), math.Inf(-1)
	for _, row := range h.Values {
		for _, v := range row {
			if !math.IsNaN(v) {
				lo, hi = math.Min(lo, v), math.Max(hi, v)
			}
		}
	}
	b.f(`<svg class="heatmap" viewBox="0 0 %s %s" role="img" aria-label="%s">`, coord(w), coord(ht), esc(p.Title))
	for j, col := range h.Cols {
		b.f(`<text x="%s" y="%s" text-anchor="middle">%s</text>`, coord(left+cellW*(float64(j)+0.5)), coord(top-10), esc(col))
	}
	for i, row := range h.Rows {
		b.f(`<text x="%s" y="%s" text-anchor="end" dy="4">%s</text>`, coord(left-8), coord(top+cellH*(float64(i)+0.5)), esc(row))
		for j := range h.Cols {
			v := math.NaN()
			if i < len(h.Values) && j < len(h.Values[i]) {
				v = h.Values[i][j]
			}
			x0, y0 := left+cellW*float64(j), top+cellH*float64(i)
			label := "-"
			fill := "#eeeeee"
			if !math.IsNaN(v) {
				label = num(v)
				if h.Format != "" {
					label = fmt.Sprintf(h.Format, v)
				}
				t := 0.5
				if hi > lo {
					t = (v - lo) / (hi - lo)
				}
				if !h.HighIsGood {
					t = 1 - t
				}
				fill = heat(t)
			}
			b.f(`<rect x="%s" y="%s" width="%s" height="%s" fill="%s" stroke="#fff"><title>%s → %s: %s</title></rect>`,
				coord(x0), coord(y0), coord(cellW), coord(cellH), fill, esc(h.Rows[i]), esc(h.Cols[j]), label)
			b.f(`<text x="%s" y="%s" text-anchor="middle" dy="4">%s</text>`, coord(x0+cellW/2), coord(y0+cellH/2), esc(label))
		}
	}
	b.f(`</svg>`)
	return chart{Title: p.Title, SVG: template.HTML(b.String()), Class: "heat"} //nolint:gosec // escaped above
}

// heat maps t in [0, 1] (1 good) from a warm red to a cool blue-green,
// light enough for black labels.
func heat(t float64) string {
	t = math.Max(0, math.Min(1, t))
	r := int(240 - 110*t)
	g := int(150 + 60*t)
	bl := int(130 + 90*t)
	return fmt.Sprintf("#%02x%02x%02x", r, g, bl)
}

// quantilePoints reduces sorted values to a CDF drawn at fixed quantiles:
// every value for small samples, else n points spread over the body with
// the tail (p99 to max) kept dense, so 10,000 requests cost the same as
// a few hundred and the tail stays exact.
func quantilePoints(sorted []float64, n int) (xs, ps []float64) {
	m := len(sorted)
	if m == 0 {
		return nil, nil
	}
	if m <= n {
		return stats.ECDF(sorted)
	}
	idx := map[int]bool{}
	for i := 0; i < n; i++ {
		// Denser towards the tail: q = 1 - (1-u)^2 puts half the points
		// above the 75th percentile.
		u := float64(i) / float64(n-1)
		q := 1 - (1-u)*(1-u)
		idx[int(math.Round(q*float64(m-1)))] = true
	}
	for i := m - m/100 - 1; i < m; i++ { // the top 1% value by value
		if i >= 0 {
			idx[i] = true
		}
	}
	keys := make([]int, 0, len(idx))
	for i := range idx {
		keys = append(keys, i)
	}
	sort.Ints(keys)
	for _, i := range keys {
		if i+1 < m && sorted[i+1] == sorted[i] {
			continue
		}
		xs, ps = append(xs, sorted[i]), append(ps, float64(i+1)/float64(m))
	}
	return xs, ps
}

// templateHTML marks markup built here, with every text in it escaped by
// esc, as safe for the page template.
func templateHTML(s string) template.HTML { return template.HTML(s) } //nolint:gosec // escaped where built
