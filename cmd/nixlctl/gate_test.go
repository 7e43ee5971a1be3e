package main

import (
	"testing"

	"github.com/google/go-cmp/cmp"
)

// A re-run keeps the measurement's flags and drops where the first run
// wrote its output, in every form a flag can take.
func TestRerunArgs(t *testing.T) {
	in := []string{"bench", "push", "--isl", "512", "--save", "run1", "--plot=p.png", "-o", "table", "--records", "r.jsonl",
		"--tui", "--concurrency=4", "-ojson", "--output", "csv", "--config", "c.yaml"}
	want := []string{"bench", "push", "--isl", "512", "--concurrency=4", "--config", "c.yaml", "-o", "json", "--tui=off"}
	if diff := cmp.Diff(want, rerunArgs(in)); diff != "" {
		t.Error(diff)
	}
}

func TestParseFraction(t *testing.T) {
	for in, want := range map[string]float64{"5%": 0.05, "0.05": 0.05, " 12.5% ": 0.125, "0": 0} {
		if got, err := parseFraction(in); err != nil || got != want {
			t.Errorf("%q: %v %v", in, got, err)
		}
	}
	for _, bad := range []string{"", "x", "-5%", "%"} {
		if _, err := parseFraction(bad); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}
