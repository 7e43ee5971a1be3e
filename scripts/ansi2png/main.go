// Command ansi2png renders a terminal capture (tmux capture-pane -p -e:
// text with ANSI colour codes) as a PNG, so the docs can show what the
// live view looks like. It understands the SGR codes lipgloss emits (bold,
// faint, 16/256/true colours) and draws block characters (▁..█, ░, ▌) as
// rectangles, since the bundled monospace font may not have them.
//
//	go run ./scripts/ansi2png < capture.ansi > capture.png
package main

import (
	"bufio"
	"fmt"
	"image"
	"image/color"
	"image/draw"
	"image/png"
	"io"
	"os"
	"strconv"
	"strings"

	"codeberg.org/go-fonts/liberation/liberationmonobold"
	"codeberg.org/go-fonts/liberation/liberationmonoregular"
	"golang.org/x/image/font"
	"golang.org/x/image/font/opentype"
	"golang.org/x/image/math/fixed"
)

const (
	size     = 15.0 // font size in points at 72 dpi: pixels
	cellW    = 9
	cellH    = 19
	margin   = 12
	trimRows = true // drop empty rows at the bottom
)

var (
	bg = color.RGBA{0x1e, 0x1e, 0x2e, 0xff}
	fg = color.RGBA{0xdc, 0xdc, 0xdc, 0xff}
	// The 16 basic colours, as a dark terminal theme shows them.
	basic = []color.RGBA{
		{0x45, 0x47, 0x5a, 0xff}, {0xf3, 0x8b, 0xa8, 0xff}, {0xa6, 0xe3, 0xa1, 0xff}, {0xf9, 0xe2, 0xaf, 0xff},
		{0x89, 0xb4, 0xfa, 0xff}, {0xf5, 0xc2, 0xe7, 0xff}, {0x94, 0xe2, 0xd5, 0xff}, {0xba, 0xc2, 0xde, 0xff},
		{0x58, 0x5b, 0x70, 0xff}, {0xf3, 0x8b, 0xa8, 0xff}, {0xa6, 0xe3, 0xa1, 0xff}, {0xf9, 0xe2, 0xaf, 0xff},
		{0x89, 0xb4, 0xfa, 0xff}, {0xf5, 0xc2, 0xe7, 0xff}, {0x94, 0xe2, 0xd5, 0xff}, {0xa6, 0xad, 0xc8, 0xff},
	}
)

type style struct {
	fg        color.RGBA
	bold, dim bool
	hasFg     bool
}

type cell struct {
	r rune
	s style
}

func main() {
	if err := run(os.Stdin, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "ansi2png:", err)
		os.Exit(1)
	}
}

func run(in io.Reader, out io.Writer) error {
	rows, err := parse(in)
	if err != nil {
		return err
	}
	if trimRows {
		for len(rows) > 0 && blank(rows[len(rows)-1]) {
			rows = rows[:len(rows)-1]
		}
	}
	cols := 0
	for _, r := range rows {
		cols = max(cols, len(r))
	}
	img := image.NewRGBA(image.Rect(0, 0, cols*cellW+2*margin, len(rows)*cellH+2*margin))
	draw.Draw(img, img.Bounds(), image.NewUniform(bg), image.Point{}, draw.Src)
	regular, err := face(liberationmonoregular.TTF)
	if err != nil {
		return err
	}
	bold, err := face(liberationmonobold.TTF)
	if err != nil {
		return err
	}
	for y, row := range rows {
		for x, c := range row {
			col := fg
			if c.s.hasFg {
				col = c.s.fg
			}
			if c.s.dim {
				col = color.RGBA{uint8(int(col.R) * 3 / 5), uint8(int(col.G) * 3 / 5), uint8(int(col.B) * 3 / 5), 0xff}
			}
			x0, y0 := margin+x*cellW, margin+y*cellH
			if blockRune(img, c.r, x0, y0, col) {
				continue
			}
			f := regular
			if c.s.bold {
				f = bold
			}
			d := font.Drawer{Dst: img, Src: image.NewUniform(col), Face: f, Dot: fixed.P(x0, y0+cellH-5)}
			d.DrawString(string(c.r))
		}
	}
	return png.Encode(out, img)
}

func blank(r []cell) bool {
	for _, c := range r {
		if c.r != ' ' {
			return false
		}
	}
	return true
}

func face(ttf []byte) (font.Face, error) {
	f, err := opentype.Parse(ttf)
	if err != nil {
		return nil, err
	}
	return opentype.NewFace(f, &opentype.FaceOptions{Size: size, DPI: 72, Hinting: font.HintingFull})
}

// blockRune draws the block elements as rectangles.
func blockRune(img *image.RGBA, r rune, x0, y0 int, col color.RGBA) bool {
	fill := func(x1, y1, x2, y2 int, c color.Color) {
		draw.Draw(img, image.Rect(x1, y1, x2, y2), image.NewUniform(c), image.Point{}, draw.Over)
	}
	switch {
	case r >= '▁' && r <= '█':
		h := int(r-'▁'+1) * cellH / 8
		fill(x0, y0+cellH-h, x0+cellW, y0+cellH, col)
	case r == '░':
		fill(x0, y0+2, x0+cellW, y0+cellH-2, color.RGBA{col.R, col.G, col.B, 0x60})
	case r == '▌':
		fill(x0, y0, x0+cellW/2, y0+cellH, col)
	default:
		return false
	}
	return true
}

// parse reads lines of text with SGR escape sequences into styled cells.
func parse(in io.Reader) ([][]cell, error) {
	var rows [][]cell
	var st style
	sc := bufio.NewScanner(in)
	for sc.Scan() {
		line := []rune(sc.Text())
		var row []cell
		for i := 0; i < len(line); i++ {
			if line[i] == 0x1b && i+1 < len(line) && line[i+1] == '[' {
				j := i + 2
				for j < len(line) && (line[j] < 0x40 || line[j] > 0x7e) {
					j++
				}
				if j < len(line) && line[j] == 'm' {
					st = sgr(st, string(line[i+2:j]))
				}
				i = j
				continue
			}
			row = append(row, cell{line[i], st})
		}
		rows = append(rows, row)
	}
	return rows, sc.Err()
}

func sgr(st style, params string) style {
	if params == "" {
		return style{}
	}
	ps := strings.Split(params, ";")
	for i := 0; i < len(ps); i++ {
		n, _ := strconv.Atoi(ps[i])
		switch {
		case n == 0:
			st = style{}
		case n == 1:
			st.bold = true
		case n == 2:
			st.dim = true
		case n == 22:
			st.bold, st.dim = false, false
		case n >= 30 && n <= 37:
			st.fg, st.hasFg = basic[n-30], true
		case n >= 90 && n <= 97:
			st.fg, st.hasFg = basic[n-90+8], true
		case n == 39:
			st.hasFg = false
		case n == 38 && i+1 < len(ps):
			switch ps[i+1] {
			case "5":
				if i+2 < len(ps) {
					c, _ := strconv.Atoi(ps[i+2])
					st.fg, st.hasFg = xterm256(c), true
					i += 2
				}
			case "2":
				if i+4 < len(ps) {
					r, _ := strconv.Atoi(ps[i+2])
					g, _ := strconv.Atoi(ps[i+3])
					b, _ := strconv.Atoi(ps[i+4])
					st.fg, st.hasFg = color.RGBA{uint8(r), uint8(g), uint8(b), 0xff}, true
					i += 4
				}
			}
		}
	}
	return st
}

func xterm256(n int) color.RGBA {
	switch {
	case n < 16:
		return basic[n]
	case n < 232:
		n -= 16
		lv := func(v int) uint8 {
			if v == 0 {
				return 0
			}
			return uint8(55 + v*40)
		}
		return color.RGBA{lv(n / 36), lv(n / 6 % 6), lv(n % 6), 0xff}
	}
	g := uint8(8 + (n-232)*10)
	return color.RGBA{g, g, g, 0xff}
}
