// Package archtest checks the shape of the project's own code: how the
// files inside each package refer to one another. It is used by its
// tests and by scripts/filegraph.sh; nothing in the binary imports it.
package archtest

import (
	"fmt"
	"go/ast"
	"go/types"
	"path/filepath"
	"sort"

	"golang.org/x/tools/go/packages"
)

// FileGraph is one package's references between its non-test files: an
// edge from a file that uses a package-level name (a type, function,
// variable, constant, method or field) to the file that declares it.
type FileGraph struct {
	Package string
	Files   []string            // base names, sorted
	Edges   map[string][]string // from file -> files it uses, sorted
	// Names are the names each edge uses ("from>to" -> names, sorted).
	Names map[string][]string
}

// Load type-checks the packages the patterns name (tests left out) and
// returns each one's file graph.
func Load(dir string, patterns ...string) ([]FileGraph, error) {
	cfg := &packages.Config{Dir: dir, Mode: packages.NeedName | packages.NeedFiles | packages.NeedCompiledGoFiles |
		packages.NeedSyntax | packages.NeedTypes | packages.NeedTypesInfo}
	pkgs, err := packages.Load(cfg, patterns...)
	if err != nil {
		return nil, err
	}
	var out []FileGraph
	for _, p := range pkgs {
		if len(p.Errors) > 0 {
			return nil, fmt.Errorf("%s: %v", p.PkgPath, p.Errors[0])
		}
		out = append(out, graphOf(p))
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Package < out[j].Package })
	return out, nil
}

func graphOf(p *packages.Package) FileGraph {
	g := FileGraph{Package: p.PkgPath, Edges: map[string][]string{}, Names: map[string][]string{}}
	// Which file declares each object of the package (positions of
	// cgo-generated files name the .go file they came from).
	declFile := func(obj types.Object) string {
		if obj == nil || obj.Pkg() != p.Types || !obj.Pos().IsValid() {
			return ""
		}
		return filepath.Base(p.Fset.Position(obj.Pos()).Filename)
	}
	seen := map[[2]string]bool{}
	for _, f := range p.Syntax {
		from := filepath.Base(p.Fset.Position(f.Pos()).Filename)
		g.Files = append(g.Files, from)
		ast.Inspect(f, func(n ast.Node) bool {
			id, ok := n.(*ast.Ident)
			if !ok {
				return true
			}
			obj := p.TypesInfo.Uses[id]
			if obj == nil || !packageLevel(obj) {
				return true
			}
			to := declFile(obj)
			if to == "" || to == from {
				return true
			}
			if k := from + ">" + to; !contains(g.Names[k], obj.Name()) {
				g.Names[k] = append(g.Names[k], obj.Name())
			}
			if seen[[2]string{from, to}] {
				return true
			}
			seen[[2]string{from, to}] = true
			g.Edges[from] = append(g.Edges[from], to)
			return true
		})
	}
	sort.Strings(g.Files)
	for k := range g.Edges {
		sort.Strings(g.Edges[k])
	}
	for k := range g.Names {
		sort.Strings(g.Names[k])
	}
	return g
}

// packageLevel says whether obj is declared at package level, or is a
// method or field of a package-level type (what another file can use).
func packageLevel(obj types.Object) bool {
	switch o := obj.(type) {
	case *types.Func:
		return true
	case *types.Var:
		if o.IsField() {
			return true
		}
		return o.Parent() == o.Pkg().Scope()
	case *types.TypeName, *types.Const:
		return o.Parent() == o.Pkg().Scope()
	}
	return false
}

// MutualPairs lists the pairs of files that use each other, directly.
func (g FileGraph) MutualPairs() [][2]string {
	var out [][2]string
	for from, tos := range g.Edges {
		for _, to := range tos {
			if from < to && contains(g.Edges[to], from) {
				out = append(out, [2]string{from, to})
			}
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i][0]+out[i][1] < out[j][0]+out[j][1] })
	return out
}

func contains(s []string, x string) bool {
	for _, v := range s {
		if v == x {
			return true
		}
	}
	return false
}

// Cycles lists the groups of files that reach one another through their
// references (strongly connected components of more than one file), each
// sorted, in order of their first file. An acyclic package has none: its
// files can be read bottom up, each built only on those below it.
func (g FileGraph) Cycles() [][]string {
	index, low := map[string]int{}, map[string]int{}
	onStack := map[string]bool{}
	var stack []string
	var out [][]string
	next := 0
	var visit func(v string)
	visit = func(v string) {
		index[v], low[v] = next, next
		next++
		stack = append(stack, v)
		onStack[v] = true
		for _, w := range g.Edges[v] {
			if _, seen := index[w]; !seen {
				visit(w)
				low[v] = min(low[v], low[w])
			} else if onStack[w] {
				low[v] = min(low[v], index[w])
			}
		}
		if low[v] != index[v] {
			return
		}
		var comp []string
		for {
			w := stack[len(stack)-1]
			stack = stack[:len(stack)-1]
			onStack[w] = false
			comp = append(comp, w)
			if w == v {
				break
			}
		}
		if len(comp) > 1 {
			sort.Strings(comp)
			out = append(out, comp)
		}
	}
	for _, f := range g.Files {
		if _, seen := index[f]; !seen {
			visit(f)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i][0] < out[j][0] })
	return out
}
