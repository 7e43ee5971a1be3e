package handoff

import (
	"cmp"
	"fmt"
	"reflect"
	"strings"

	"github.com/nixlctl/nixlctl/internal/engine"
	"github.com/nixlctl/nixlctl/internal/errkind"
	"github.com/nixlctl/nixlctl/internal/kv"
	"github.com/nixlctl/nixlctl/internal/runcore"
)

// resolveEngines settles the prefill and decode engines from --topology
// or from --prefill/--decode and --prefills/--decodes (Validate).
func (o *HandoffOptions) resolveEngines(add func(error), bad func(field, format string, a ...any)) {
	o.prefills, o.decodes = nil, nil
	if o.Rendezvous != "" {
		o.resolveRendezvous(bad)
		return
	}
	if o.Topology != "" {
		if o.Prefill != "" || o.Decode != "" || o.Prefills > 1 || o.Decodes > 1 {
			bad("Topology", "the file lists the engines: give it or --prefill/--decode/--prefills/--decodes, not both")
			return
		}
		t, err := ReadTopology(o.Topology)
		if err != nil {
			bad("Topology", "%v", err)
			return
		}
		for _, s := range t.Prefill {
			o.prefills = append(o.prefills, EngineSlot{Addr: cmp.Or(s.Addr, "local"), TP: cmp.Or(s.TP, o.Spec.TP)})
		}
		for _, s := range t.Decode {
			o.decodes = append(o.decodes, EngineSlot{Addr: cmp.Or(s.Addr, "local"), TP: cmp.Or(s.TP, o.DecodeTP)})
		}
		return
	}
	var err error
	if o.prefills, err = parseEngineList("Prefill", "Prefills", o.Prefill, o.Prefills, o.Spec.TP); err != nil {
		add(err)
	}
	if o.decodes, err = parseEngineList("Decode", "Decodes", o.Decode, o.Decodes, o.DecodeTP); err != nil {
		add(err)
	}
}

// checkTopologyTPs checks every TP pair a topology gives that the
// --prefill-tp/--decode-tp checks did not: each layout valid, and every
// prefill able to hand off to every decode.
func (o *HandoffOptions) checkTopologyTPs() []error {
	if o.Topology == "" || o.Spec.Validate() != nil {
		return nil
	}
	var errs []error
	seen := map[[2]int]bool{{o.Spec.TP, o.DecodeTP}: true}
	for _, p := range o.prefills {
		for _, d := range o.decodes {
			if seen[[2]int{p.TP, d.TP}] {
				continue
			}
			seen[[2]int{p.TP, d.TP}] = true
			ps, ds := o.Spec, o.Spec
			ps.TP, ds.TP = p.TP, d.TP
			if err := ps.Validate(); err != nil {
				errs = append(errs, errkind.Field("Topology", "prefill tp %d: %v", p.TP, err))
			} else if err := ds.Validate(); err != nil {
				errs = append(errs, errkind.Field("Topology", "decode tp %d: %v", d.TP, err))
			} else if _, err := kv.Plan(ps, ds); err != nil {
				errs = append(errs, errkind.Field("Topology", "prefill tp %d -> decode tp %d: %v", p.TP, d.TP, err))
			} else if kv.VLLMRefusesTP(ps, ds) && !o.AllowUnsupportedTP && o.Protocol != engine.ProtoSGLang {
				errs = append(errs, errkind.Field("Topology", "%s (--allow-unsupported-tp runs it anyway)", tpRefusal(ps, ds)))
			}
		}
	}
	return errs
}

// engineConfig is engine i of a role's configuration: EngineConfig with
// its own TP, engine id ("prefill-1": every engine's agents are named by
// it, so peers tell them apart) and seed.
func (o *HandoffOptions) engineConfig(role engine.Role, backend string, numBlocks, i, tp int) engine.Config {
	c := o.EngineConfig(role, backend, numBlocks)
	c.TP = tp
	c.EngineID = fmt.Sprintf("%s-%d", role, i)
	c.Seed += uint64(2 * i)
	return c
}

// sumStats adds b's counters into a: integer fields add up, those named
// ...Max take the larger, nested structs (the lease table's) recurse.
func sumStats(a *engine.Stats, b engine.Stats) {
	sumInts(reflect.ValueOf(a).Elem(), reflect.ValueOf(b))
}

func sumInts(a, b reflect.Value) {
	for i := 0; i < a.NumField(); i++ {
		fa, fb := a.Field(i), b.Field(i)
		switch fa.Kind() {
		case reflect.Int, reflect.Int64:
			if strings.HasSuffix(a.Type().Field(i).Name, "Max") {
				fa.SetInt(max(fa.Int(), fb.Int()))
			} else {
				fa.SetInt(fa.Int() + fb.Int())
			}
		case reflect.Pointer:
			if fb.IsNil() || fb.Elem().Kind() != reflect.Struct {
				continue
			}
			if fa.IsNil() {
				fa.Set(reflect.New(fb.Elem().Type()))
			}
			sumInts(fa.Elem(), fb.Elem())
		}
	}
}

// heldByEngine says which engines still hold blocks ("prefill-0 3,
// decode-1 2").
func heldByEngine(prefills, decodes []engine.Stats) string {
	var parts []string
	for _, r := range []struct {
		role  string
		stats []engine.Stats
	}{{"prefill", prefills}, {"decode", decodes}} {
		for i, s := range r.stats {
			if s.BlocksInUse > 0 {
				parts = append(parts, fmt.Sprintf("%s %d", engineName(r.role, i, len(r.stats)), s.BlocksInUse))
			}
		}
	}
	return strings.Join(parts, ", ")
}

// placementAll is the widest placement of any (prefill, decode) pair:
// cross-host if one pair crosses hosts.
func placementAll(pes, des []*Endpoint) string {
	rank := map[string]int{runcore.PlacementOneHost: 0, runcore.PlacementNamespaces: 1, runcore.PlacementCrossHost: 2}
	out := runcore.PlacementOneHost
	for _, pe := range pes {
		for _, de := range des {
			if p := runcore.Placement(pe.host, de.host); rank[p] > rank[out] {
				out = p
			}
		}
	}
	return out
}
