// Package plots draws report.Figure descriptions as PNG or SVG with
// gonum/plot. Result kinds describe what to draw (report.SweepFigure,
// report.LatencyFigure, report.RSSFigure, report.LeaseTimelineFigure, or
// their own Figure); this package owns every gonum dependency, so runners
// and result types stay free of it.
package plots

import (
	"bytes"
	"fmt"
	"image/color"
	"io"
	"math"
	"path/filepath"
	"strings"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"
	"gonum.org/v1/plot/vg/vgsvg"

	"github.com/nixlctl/nixlctl/internal/report"
	"github.com/nixlctl/nixlctl/internal/userfile"
)

// Panel size in the output; a figure is as wide as its panels side by side.
const (
	panelWidth  = 5 * vg.Inch
	panelHeight = 3.6 * vg.Inch
	titleHeight = 0.35 * vg.Inch
)

// FormatOf returns "png" or "svg" from a file name, or an error naming
// the supported extensions.
func FormatOf(path string) (string, error) {
	switch ext := strings.ToLower(strings.TrimPrefix(filepath.Ext(path), ".")); ext {
	case "png", "svg":
		return ext, nil
	}
	return "", fmt.Errorf("--plot %s: want a .png or .svg file", path)
}

// Save draws f into path, the format from its extension. The picture is
// rendered in memory first, so a failure leaves no empty file behind
// (gonum's own Save creates the file before drawing).
func Save(path string, f report.Figure) error {
	format, err := FormatOf(path)
	if err != nil {
		return err
	}
	var b bytes.Buffer
	if err := Write(&b, format, f); err != nil {
		return err
	}
	return userfile.WriteFile(path, b.Bytes())
}

// Write draws f to w as "png" or "svg".
func Write(w io.Writer, format string, f report.Figure) (err error) {
	if len(f.Panels) == 0 {
		return fmt.Errorf("nothing to plot")
	}
	// gonum panics on impossible axes (a log scale over values <= 0 left
	// by a bug here); turn that into an error, not a crash.
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("plot: %v", r)
		}
	}()
	ps := make([]*plot.Plot, len(f.Panels))
	for i, p := range f.Panels {
		if ps[i], err = panel(p); err != nil {
			return err
		}
	}
	cols := len(ps)
	if f.Columns > 0 && f.Columns < cols {
		cols = f.Columns
	}
	rows := (len(ps) + cols - 1) / cols
	width := panelWidth * vg.Length(cols)
	height := panelHeight*vg.Length(rows) + titleHeight
	var canvas interface {
		vg.CanvasSizer
		io.WriterTo
	}
	switch format {
	case "png":
		canvas = vgimg.PngCanvas{Canvas: vgimg.New(width, height)}
	case "svg":
		canvas = vgsvg.New(width, height)
	default:
		return fmt.Errorf("plot format %q: want png or svg", format)
	}
	dc := draw.New(canvas)
	dc.SetColor(color.White)
	dc.Fill(dc.Rectangle.Path())
	if f.Title != "" {
		sty := plot.New().Title.TextStyle
		sty.Font.Size = vg.Points(13)
		sty.XAlign, sty.YAlign = draw.XCenter, draw.YTop
		dc.FillText(sty, vg.Point{X: width / 2, Y: height - vg.Points(6)}, f.Title)
	}
	area := draw.Crop(dc, 0, 0, 0, -titleHeight)
	tiles := draw.Tiles{Rows: rows, Cols: cols, PadX: vg.Points(12), PadY: vg.Points(10), PadTop: vg.Points(4), PadBottom: vg.Points(4), PadLeft: vg.Points(4), PadRight: vg.Points(8)}
	grid := make([][]*plot.Plot, rows)
	for r := range grid {
		grid[r] = make([]*plot.Plot, cols)
	}
	for i, p := range ps {
		grid[i/cols][i%cols] = p
	}
	cs := plot.Align(grid, tiles, area)
	for i, p := range ps {
		p.Draw(cs[i/cols][i%cols])
	}
	_, err = canvas.WriteTo(w)
	return err
}

var classColors = map[string]color.Color{
	"released": color.RGBA{R: 0x2c, G: 0xa0, B: 0x2c, A: 0xff},
	"consumed": color.RGBA{R: 0x2c, G: 0xa0, B: 0x2c, A: 0xff},
	"held":     color.RGBA{R: 0x7f, G: 0x7f, B: 0x7f, A: 0xff},
	"lost":     color.RGBA{R: 0xd6, G: 0x27, B: 0x28, A: 0xff},
	"ok":       color.RGBA{R: 0x2c, G: 0xa0, B: 0x2c, A: 0xff},
	"expired":  color.RGBA{R: 0xff, G: 0x7f, B: 0x0e, A: 0xff},
	"failed":   color.RGBA{R: 0xd6, G: 0x27, B: 0x28, A: 0xff},
}

func panel(pn report.Panel) (*plot.Plot, error) {
	if pn.Heatmap != nil {
		return heatPanel(pn)
	}
	p := plot.New()
	p.Title.Text = pn.Title
	p.X.Label.Text, p.Y.Label.Text = pn.XLabel, pn.YLabel
	p.Title.TextStyle.Font.Size = vg.Points(11)
	p.Add(plotter.NewGrid())
	p.Legend.Top, p.Legend.Left = true, false
	p.Legend.TextStyle.Font.Size = vg.Points(8)
	xlog, ylog := pn.XScale != report.Linear, pn.YScale != report.Linear
	drawn := 0
	var pts plotter.XYs // everything drawn, to keep the legend off it
	entries := 0        // legend entries
	integerY := true
	for i, l := range pn.Lines {
		xys := make(plotter.XYs, 0, len(l.X))
		for j := range l.X {
			x, y := l.X[j], l.Y[j]
			if (xlog && x <= 0) || (ylog && y <= 0) || math.IsNaN(x) || math.IsNaN(y) || math.IsInf(x, 0) || math.IsInf(y, 0) {
				continue // a log axis cannot show it; drop it rather than panic
			}
			xys = append(xys, plotter.XY{X: x, Y: y})
		}
		if len(xys) == 0 {
			continue
		}
		pts = append(pts, xys...)
		for _, xy := range xys {
			integerY = integerY && xy.Y == math.Trunc(xy.Y)
		}
		ci := i
		if l.Color > 0 {
			ci = l.Color - 1
		}
		c := plotutil.Color(ci)
		line, err := plotter.NewLine(xys)
		if err != nil {
			return nil, err
		}
		line.Color, line.Width = c, vg.Points(1.5)
		switch l.Style {
		case report.Dashed:
			line.Dashes = []vg.Length{vg.Points(5), vg.Points(3)}
		case report.Steps:
			line.StepStyle = plotter.PostStep
		}
		p.Add(line)
		thumb := []plot.Thumbnailer{line}
		if l.Points {
			sc, err := plotter.NewScatter(xys)
			if err != nil {
				return nil, err
			}
			sc.GlyphStyle = draw.GlyphStyle{Color: c, Radius: vg.Points(2.5), Shape: plotutil.Shape(ci)}
			p.Add(sc)
			thumb = append(thumb, sc)
		}
		if l.Label != "" {
			p.Legend.Add(l.Label, thumb...)
			entries++
		}
		drawn++
	}
	if b := pn.Bars; b != nil && len(b.Counts) > 0 {
		h := &plotter.Histogram{FillColor: color.NRGBA{R: 0x1f, G: 0x77, B: 0xb4, A: 0xff}, LineStyle: draw.LineStyle{Color: color.White, Width: vg.Points(0.4)}}
		for i, c := range b.Counts {
			h.Bins = append(h.Bins, plotter.HistogramBin{Min: b.Edges[i], Max: b.Edges[i+1], Weight: c})
			pts = append(pts, plotter.XY{X: (b.Edges[i] + b.Edges[i+1]) / 2, Y: c})
		}
		h.Width = (b.Edges[len(b.Edges)-1] - b.Edges[0]) / float64(len(b.Counts))
		p.Add(h)
		if b.Label != "" {
			p.Legend.Add(b.Label, h)
			entries++
		}
		drawn++
	}
	if len(pn.Spans) > 0 {
		sp := newSpans(pn.Spans)
		p.Add(sp)
		for _, x := range pn.Spans {
			pts = append(pts, plotter.XY{X: x.Start, Y: sp.y(x.Row)}, plotter.XY{X: x.End, Y: sp.y(x.Row)})
		}
		integerY = false
		p.Y.Tick.Marker = sp
		for _, cl := range sp.classes {
			p.Legend.Add(cl, swatch{classColor(cl, sp.classes)})
			entries++
		}
		drawn++
	}
	if drawn == 0 {
		return nil, fmt.Errorf("panel %q has nothing to draw", pn.Title)
	}
	if xlog {
		p.X.Scale = plot.LogScale{}
		p.X.Tick.Marker = logTicks{base2: pn.XScale == report.Log2, bytes: pn.XScale == report.Log2}
	}
	if ylog {
		p.Y.Scale = plot.LogScale{}
		p.Y.Tick.Marker = logTicks{base2: pn.YScale == report.Log2}
	}
	if !xlog {
		p.X.Tick.Marker = linTicks{}
	}
	if !ylog && len(pn.Spans) == 0 {
		p.Y.Tick.Marker = linTicks{integer: integerY}
	}
	if pn.YMin != nil && !ylog {
		p.Y.Min = *pn.YMin
	}
	placeLegend(p, entries, pts, xlog, ylog)
	return p, nil
}

// placeLegend puts the legend in the top corner where the data is lowest
// and, if the data still reaches up there, raises the Y axis so the
// legend sits above it rather than on it.
func placeLegend(p *plot.Plot, n int, pts plotter.XYs, xlog, ylog bool) {
	if n == 0 || len(pts) == 0 {
		return
	}
	norm := func(v, lo, hi float64, log bool) float64 {
		if log {
			v, lo, hi = math.Log(v), math.Log(lo), math.Log(hi)
		}
		if hi <= lo {
			return 0.5
		}
		return (v - lo) / (hi - lo)
	}
	var left, right float64 // highest normalised y in each third
	for _, xy := range pts {
		x, y := norm(xy.X, p.X.Min, p.X.Max, xlog), norm(xy.Y, p.Y.Min, p.Y.Max, ylog)
		if x <= 0.4 {
			left = math.Max(left, y)
		}
		if x >= 0.6 {
			right = math.Max(right, y)
		}
	}
	top := right
	p.Legend.Left = left < right
	if p.Legend.Left {
		top = left
	}
	// The legend takes about 11 points per entry of a ~200-point-high
	// plot area.
	room := math.Min(0.5, (float64(n)*11+10)/200)
	if top <= 1-room {
		return
	}
	grow := top / (1 - room) // the new range in units of the old one
	if ylog {
		lo, hi := math.Log(p.Y.Min), math.Log(p.Y.Max)
		p.Y.Max = math.Exp(lo + (hi-lo)*grow)
		return
	}
	p.Y.Max = p.Y.Min + (p.Y.Max-p.Y.Min)*grow
}

func classColor(class string, classes []string) color.Color {
	if c, ok := classColors[class]; ok {
		return c
	}
	for i, cl := range classes {
		if cl == class {
			return plotutil.Color(i + 3)
		}
	}
	return color.Black
}

// swatch is a legend thumbnail: a filled square.
type swatch struct{ c color.Color }

func (s swatch) Thumbnail(c *draw.Canvas) {
	c.SetColor(s.c)
	c.Fill(c.Rectangle.Path())
}
