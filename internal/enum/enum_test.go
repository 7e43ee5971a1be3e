package enum

import (
	"fmt"
	"testing"
)

type color string

func (c color) String() string { return string(c) }

type level int

func (l level) String() string { return [...]string{"low", "high"}[l] }

func TestParse(t *testing.T) {
	colors := []color{"red", "green"}
	c := color("red")
	if err := Parse(&c, "color", []byte("green"), colors); err != nil || c != "green" {
		t.Errorf("green: %q, %v", c, err)
	}
	err := Parse(&c, "color", []byte("blue"), colors)
	if want := `unknown color "blue" (want red, green)`; fmt.Sprint(err) != want {
		t.Errorf("blue: %v, want %s", err, want)
	}
	if c != "green" {
		t.Errorf("a failed parse changed the value to %q", c)
	}
	var l level
	if err := Parse(&l, "level", []byte("high"), []level{0, 1}); err != nil || l != 1 {
		t.Errorf("high: %v, %v", l, err)
	}
}
