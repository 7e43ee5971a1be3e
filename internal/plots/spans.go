package plots

import (
	"image/color"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"

	"github.com/nixlctl/nixlctl/internal/report"
)

// spans draws timeline intervals as bars, one row per distinct Row (the
// first row at the top), coloured by class. It is also the Y axis's tick
// marker, so rows are labelled by name when there are few enough.
type spans struct {
	s       []report.Span
	rows    map[string]int
	names   []string
	classes []string
}

func newSpans(s []report.Span) *spans {
	sp := &spans{s: s, rows: map[string]int{}}
	seen := map[string]bool{}
	for _, x := range s {
		if _, ok := sp.rows[x.Row]; !ok {
			sp.rows[x.Row] = len(sp.names)
			sp.names = append(sp.names, x.Row)
		}
		if !seen[x.Class] {
			seen[x.Class] = true
			sp.classes = append(sp.classes, x.Class)
		}
	}
	return sp
}

// y puts the first row on top.
func (sp *spans) y(row string) float64 { return float64(len(sp.names) - 1 - sp.rows[row]) }

func (sp *spans) Plot(c draw.Canvas, p *plot.Plot) {
	trX, trY := p.Transforms(&c)
	h := (trY(1) - trY(0)) * 0.35
	if len(sp.names) == 1 {
		h = vg.Points(6)
	}
	for _, x := range sp.s {
		y := trY(sp.y(x.Row))
		x0, x1 := trX(x.Start), trX(x.End)
		if x1-x0 < vg.Points(1) {
			x1 = x0 + vg.Points(1)
		}
		c.SetColor(classColor(x.Class, sp.classes))
		var path vg.Path
		path.Move(vg.Point{X: x0, Y: y - h})
		path.Line(vg.Point{X: x1, Y: y - h})
		path.Line(vg.Point{X: x1, Y: y + h})
		path.Line(vg.Point{X: x0, Y: y + h})
		path.Close()
		c.Fill(path)
	}
	c.SetColor(color.Black)
}

func (sp *spans) DataRange() (xmin, xmax, ymin, ymax float64) {
	xmin, xmax = sp.s[0].Start, sp.s[0].End
	for _, x := range sp.s {
		xmin, xmax = min(xmin, x.Start), max(xmax, x.End)
	}
	return xmin, xmax, -0.7, float64(len(sp.names)) - 0.3
}

// Ticks labels rows by name when there are at most 24 of them (more would
// overlap), else every row unlabelled.
func (sp *spans) Ticks(min, max float64) []plot.Tick {
	var t []plot.Tick
	every := 1
	if len(sp.names) > 24 {
		every = len(sp.names)/12 + 1
	}
	for i, n := range sp.names {
		label := ""
		if i%every == 0 {
			label = n
		}
		t = append(t, plot.Tick{Value: sp.y(n), Label: label})
	}
	return t
}
