package plots

import (
	"fmt"
	"image/color"
	"math"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/palette"
	"gonum.org/v1/plot/palette/moreland"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"

	"github.com/nixlctl/nixlctl/internal/report"
)

// heatPanel draws a report.Heatmap: one cell per value, coloured from
// blue (cool) to red (hot) over the values' range, labelled with the
// value; rows and columns labelled by name.
func heatPanel(pn report.Panel) (*plot.Plot, error) {
	hm := pn.Heatmap
	if len(hm.Rows) == 0 || len(hm.Cols) == 0 || len(hm.Values) != len(hm.Rows) {
		return nil, fmt.Errorf("panel %q: heatmap of %d rows, %d columns and %d rows of values", pn.Title, len(hm.Rows), len(hm.Cols), len(hm.Values))
	}
	for r, row := range hm.Values {
		if len(row) != len(hm.Cols) {
			return nil, fmt.Errorf("panel %q: heatmap row %d has %d values for %d columns", pn.Title, r, len(row), len(hm.Cols))
		}
	}
	p := plot.New()
	p.Title.Text = pn.Title
	p.Title.TextStyle.Font.Size = vg.Points(11)
	p.X.Label.Text, p.Y.Label.Text = pn.XLabel, pn.YLabel
	h := &heat{hm: hm}
	p.Add(h)
	p.X.Tick.Marker = labels{hm.Cols, func(i int) float64 { return float64(i) }}
	p.Y.Tick.Marker = labels{hm.Rows, h.y}
	p.X.Min, p.X.Max = -0.5, float64(len(hm.Cols))-0.5
	p.Y.Min, p.Y.Max = -0.5, float64(len(hm.Rows))-0.5
	return p, nil
}

type heat struct{ hm *report.Heatmap }

// y puts the first row on top.
func (h *heat) y(row int) float64 { return float64(len(h.hm.Rows) - 1 - row) }

func (h *heat) DataRange() (xmin, xmax, ymin, ymax float64) {
	return -0.5, float64(len(h.hm.Cols)) - 0.5, -0.5, float64(len(h.hm.Rows)) - 0.5
}

func (h *heat) Plot(c draw.Canvas, p *plot.Plot) {
	lo, hi := math.Inf(1), math.Inf(-1)
	for _, row := range h.hm.Values {
		for _, v := range row {
			if !math.IsNaN(v) && !math.IsInf(v, 0) {
				lo, hi = math.Min(lo, v), math.Max(hi, v)
			}
		}
	}
	var cm palette.ColorMap = moreland.SmoothBlueRed()
	if h.hm.HighIsGood {
		cm = palette.Reverse(cm)
	}
	if lo <= hi {
		if hi == lo { // one value: the middle of the map
			lo, hi = lo-1, hi+1
		}
		cm.SetMin(lo)
		cm.SetMax(hi)
	}
	format := h.hm.Format
	trX, trY := p.Transforms(&c)
	sty := draw.TextStyle{Color: color.Black, Font: p.Title.TextStyle.Font, XAlign: draw.XCenter, YAlign: draw.YCenter, Handler: p.Title.TextStyle.Handler}
	sty.Font.Size = vg.Points(10)
	for r, row := range h.hm.Values {
		for col, v := range row {
			x0, x1 := trX(float64(col)-0.5), trX(float64(col)+0.5)
			y0, y1 := trY(h.y(r)-0.5), trY(h.y(r)+0.5)
			fill, label := color.Color(color.Gray{Y: 0xee}), "-"
			if !math.IsNaN(v) && !math.IsInf(v, 0) {
				if cc, err := cm.At(v); err == nil {
					fill = cc
				}
				label = cellLabel(format, v)
			}
			var path vg.Path
			path.Move(vg.Point{X: x0, Y: y0})
			path.Line(vg.Point{X: x1, Y: y0})
			path.Line(vg.Point{X: x1, Y: y1})
			path.Line(vg.Point{X: x0, Y: y1})
			path.Close()
			c.SetColor(fill)
			c.Fill(path)
			c.SetColor(color.White)
			c.SetLineWidth(vg.Points(1))
			c.Stroke(path)
			sty.Color = color.Black
			if r, g, b, _ := fill.RGBA(); 0.299*float64(r)+0.587*float64(g)+0.114*float64(b) < 0.45*0xffff {
				sty.Color = color.White // dark cells: white text
			}
			c.FillText(sty, vg.Point{X: (x0 + x1) / 2, Y: (y0 + y1) / 2}, label)
		}
	}
	c.SetColor(color.Black)
}

// labels is a tick marker that labels position pos(i) with names[i].
type labels struct {
	names []string
	pos   func(int) float64
}

func (t labels) Ticks(_, _ float64) []plot.Tick {
	out := make([]plot.Tick, len(t.names))
	for i, n := range t.names {
		out[i] = plot.Tick{Value: t.pos(i), Label: n}
	}
	return out
}

// cellLabel formats a cell's value: with format when given, else three
// significant digits without an exponent for the usual range.
func cellLabel(format string, v float64) string {
	if format != "" {
		return fmt.Sprintf(format, v)
	}
	switch a := math.Abs(v); {
	case a >= 100 && a < 1e7:
		return fmt.Sprintf("%.0f", v)
	case a >= 10 && a < 100:
		return fmt.Sprintf("%.1f", v)
	}
	return fmt.Sprintf("%.3g", v)
}
