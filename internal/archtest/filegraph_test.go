package archtest

import (
	"fmt"
	"strings"
	"testing"
)

const module = "github.com/nixlctl/nixlctl/"

// acyclicOnly are the packages whose files must read bottom up: the run
// kinds and what they share (issue 30). A file there may use only files
// it is built on, never one that uses it back, directly or through others.
var acyclicOnly = []string{
	"internal/runcore", "internal/fleet", "internal/xferbench", "internal/handoff",
	"internal/ecbench", "internal/leasechaos",
}

// knownMutual caps, per package whose files still use each other, the
// pairs of files that do so directly: none may be added. A package not
// listed here must have no cycle among its files at all.
var knownMutual = map[string]int{
	"cmd/nixlctl":         16,
	"internal/ctl":        3,
	"internal/engine":     14,
	"internal/htmlreport": 3,
	"internal/kv":         1,
	"internal/nixl":       2,
	"internal/nixl/capi":  1,
	"internal/plots":      1,
	"internal/probe":      2,
	"internal/rendezvous": 2,
	"internal/report":     2,
	"internal/standin":    1,
}

func TestFileGraphs(t *testing.T) {
	graphs, err := Load("../..", "./...")
	if err != nil {
		t.Fatal(err)
	}
	if len(graphs) < 30 {
		t.Fatalf("loaded %d packages; the pattern did not reach the module", len(graphs))
	}
	seen := map[string]bool{}
	for _, g := range graphs {
		pkg := strings.TrimPrefix(g.Package, module)
		seen[pkg] = true
		cycles := g.Cycles()
		limit, known := knownMutual[pkg]
		switch {
		case !known && len(cycles) > 0:
			t.Errorf("%s: files that use one another (each group a cycle): %v\n%s", pkg, cycles, explain(g, cycles))
		case known:
			if n := len(g.MutualPairs()); n > limit {
				t.Errorf("%s: %d pairs of files use each other, up from %d: %v\n%s", pkg, n, limit, g.MutualPairs(), explain(g, cycles))
			} else if n < limit {
				t.Logf("%s: %d pairs of files use each other, down from %d: lower knownMutual", pkg, n, limit)
			}
		}
	}
	for _, pkg := range acyclicOnly {
		if !seen[pkg] {
			t.Errorf("%s: not loaded (renamed? update acyclicOnly)", pkg)
		}
		if _, ok := knownMutual[pkg]; ok {
			t.Errorf("%s is both acyclic-only and allowed cycles", pkg)
		}
	}
	for pkg := range knownMutual {
		if !seen[pkg] {
			t.Errorf("%s: listed in knownMutual but not loaded", pkg)
		}
	}
}

// explain lists, for each edge inside a cycle, the names it uses.
func explain(g FileGraph, cycles [][]string) string {
	var b strings.Builder
	for _, c := range cycles {
		for _, from := range c {
			for _, to := range g.Edges[from] {
				if contains(c, to) {
					fmt.Fprintf(&b, "  %s uses %s: %s\n", from, to, strings.Join(g.Names[from+">"+to], " "))
				}
			}
		}
	}
	return b.String()
}

// A graph built by hand: a cycle is found, a chain is not.
func TestCycles(t *testing.T) {
	for _, tc := range []struct {
		edges map[string][]string
		want  string
	}{
		{map[string][]string{"a.go": {"b.go"}, "b.go": {"c.go"}}, "[]"},
		{map[string][]string{"a.go": {"b.go"}, "b.go": {"c.go"}, "c.go": {"a.go"}}, "[[a.go b.go c.go]]"},
		{map[string][]string{"a.go": {"b.go"}, "b.go": {"a.go"}, "c.go": {"d.go"}, "d.go": {"c.go"}}, "[[a.go b.go] [c.go d.go]]"},
	} {
		g := FileGraph{Files: []string{"a.go", "b.go", "c.go", "d.go"}, Edges: tc.edges}
		if got := fmt.Sprint(g.Cycles()); got != tc.want && !(tc.want == "[]" && got == "[]") {
			t.Errorf("Cycles(%v) = %s, want %s", tc.edges, got, tc.want)
		}
	}
}
