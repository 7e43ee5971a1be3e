package main

import (
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// A re-run keeps the measurement's flags and drops where the first run
// wrote its output, in every form a flag can take.
func TestRerunArgs(t *testing.T) {
	t.Parallel()
	in := []string{"bench", "push", "--isl", "512", "--save", "run1", "--plot=p.png", "-o", "table", "--records", "r.jsonl",
		"--tui", "--concurrency=4", "-ojson", "--output", "csv", "--config", "c.yaml"}
	want := []string{"bench", "push", "--isl", "512", "--concurrency=4", "--config", "c.yaml", "-o", "json", "--tui=off"}
	if diff := cmp.Diff(want, rerunArgs(in)); diff != "" {
		t.Error(diff)
	}
}

func TestParseFraction(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]float64{"5%": 0.05, "0.05": 0.05, " 12.5% ": 0.125, "0": 0, "1000%": 10, "5 %": 0.05, "0.999": 0.999, "0%": 0} {
		if got, err := parseFraction("max-regression", in); err != nil || got != want {
			t.Errorf("%q: %v %v", in, got, err)
		}
	}
	for in, want := range map[string]string{"": "want a percentage", "x": "want a percentage", "-5%": "want a percentage", "%": "want a percentage",
		"NaN": "want a percentage", "Inf%": "want a percentage", "-0.05": "want a percentage",
		// A bare 5 was a 500% allowance.
		"5": "must be below 1; write 5% for 5 percent", "1": "must be below 1", "50": "write 50%"} {
		if got, err := parseFraction("max-regression", in); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%q: %v, %v; want an error with %q", in, got, err, want)
		}
	}
}
