package handoff

import (
	"encoding/json"
	"reflect"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/nixlctl/nixlctl/internal/engine"
	"github.com/nixlctl/nixlctl/internal/kv"
	"github.com/nixlctl/nixlctl/internal/nixl"
	"github.com/nixlctl/nixlctl/internal/runcore/runcoretest"
)

// A knob's hops: the engines' configuration (EngineConfig, what both
// endpoints are set up with) and the result's echo of the options
// (HandoffConfig). A flag the driver alone uses reaches neither.
const (
	hopEngine = "engine"
	hopEcho   = "echo"
)

// knob is where one flag of bench pull|push|sglang must reach, in a run
// it applies to (in: changes to a closed-loop push run first) when it
// changes to another value (to; nil: another of its kind).
type knob struct {
	hops []string
	in   func(*HandoffOptions)
	to   any
	// validate runs Validate on both runs, for knobs it turns into the
	// engine slots.
	validate bool
}

var (
	sglangRun   = func(o *HandoffOptions) { o.Protocol = engine.ProtoSGLang }
	openLoop    = func(o *HandoffOptions) { o.Rate = 5 }
	vramRun     = func(o *HandoffOptions) { o.Mem = nixl.VRAM }
	twoPrefills = func(o *HandoffOptions) { o.Prefills = 2 }
)

// knobHops lists every flag-backed field of HandoffOptions. A new field
// fails the test until it is listed here, and a listed one fails it when
// a hop stops carrying it (a knob wired into the engines but not echoed
// in the result, or the other way round).
var knobHops = map[string]knob{
	// The result's top-level backend is the one resolved (auto -> ucx),
	// set by RunHandoff; each engine is given that one, not the flag.
	"Backend":  {hops: []string{}},
	"DecodeTP": {hops: []string{hopEngine, hopEcho}},
	"Requests": {hops: []string{hopEcho}},
	// Read by Validate into Trace, whose entries reach the echo as the
	// ISL distribution "trace" and the request count.
	"TraceFile":     {hops: []string{}},
	"Warmup":        {hops: []string{hopEcho}},
	"ISL.Dist":      {hops: []string{hopEcho}, to: ISLUniform},
	"ISL.Fixed":     {hops: []string{hopEcho}},
	"ISL.Min":       {hops: []string{hopEcho}},
	"ISL.Max":       {hops: []string{hopEcho}},
	"ISL.Mean":      {hops: []string{hopEcho}},
	"ISL.Std":       {hops: []string{hopEcho}},
	"Rate":          {hops: []string{hopEcho}},
	"Concurrency":   {hops: []string{hopEcho}},
	"MaxInflight":   {hops: []string{hopEcho}, in: openLoop},
	"PrefixHit":     {hops: []string{hopEcho}},
	"Fragmentation": {hops: []string{hopEngine, hopEcho}, to: engine.FragScattered},
	"NoMerge":       {hops: []string{hopEngine, hopEcho}},
	// The pools' size reaches both, as RunHandoff computes it from the
	// flag and the workload (poolBlocks); the test passes it in.
	"NumBlocks": {hops: []string{}},
	// Validation only: a refusal lifted, and unsupportedTP echoes what it let through.
	"AllowUnsupportedTP": {hops: []string{}},
	"ChunkTokens":        {hops: []string{hopEcho}},
	// The driver's stand-in prefill dials it (startEndpoint).
	"Bootstrap":    {hops: []string{hopEcho}, in: sglangRun},
	"Mem":          {hops: []string{hopEngine, hopEcho}, to: nixl.VRAM},
	"Device":       {hops: []string{hopEngine, hopEcho}, in: vramRun},
	"DecodeDevice": {hops: []string{hopEngine, hopEcho}, in: vramRun},
	// RunHandoff echoes the reference as it ran (xfer_reference), rounds
	// included.
	"XferRef":    {hops: []string{}},
	"XferRounds": {hops: []string{}},
	"Inproc":     {hops: []string{hopEcho}},
	"Prefill":    {hops: []string{hopEcho}},
	"Decode":     {hops: []string{hopEcho}},
	"Prefills":   {hops: []string{hopEcho}, validate: true},
	"Decodes":    {hops: []string{hopEcho}, validate: true},
	// Validate reads the file into the engine slots, echoed as the
	// Prefills and Decodes rows show (prefill_engines, decode_engines).
	"Topology":        {hops: []string{}},
	"Router":          {hops: []string{hopEcho}, in: twoPrefills, to: RouterLeastLoaded, validate: true},
	"OnEndpointDeath": {hops: []string{hopEcho}, to: DeathDrain},
	// RunHandoff echoes how the engines met (rendezvous), from the
	// rendezvous itself.
	"Rendezvous": {hops: []string{}},
	"RunID":      {hops: []string{}},
	"Roster":     {hops: []string{}},
	"JoinWindow": {hops: []string{}},
	// The reference's echo says where it crossed to (xfer_reference.target).
	"XferTarget": {hops: []string{}},
	"Seed":       {hops: []string{hopEngine, hopEcho}},
	// Validate reads the file; its bytes reach the engines, which hash
	// them; the result echoes the hash the prefill advertised.
	"CompatFactorsFile": {hops: []string{}},
	"CompatHash":        {hops: []string{hopEngine}},
	"NoCompatCheck":     {hops: []string{hopEngine, hopEcho}},
}

// perturb changes v (a settable field) to another value of its kind.
func perturb(t *testing.T, path string, v reflect.Value) {
	switch v.Kind() {
	case reflect.Bool:
		v.SetBool(!v.Bool())
	case reflect.Int, reflect.Int64:
		if v.Type() == reflect.TypeFor[time.Duration]() {
			v.SetInt(v.Int() + int64(1500*time.Millisecond))
			return
		}
		v.SetInt(v.Int() + 3)
	case reflect.Uint64:
		v.SetUint(v.Uint() + 3)
	case reflect.Float64:
		v.SetFloat(v.Float() + 0.25)
	case reflect.String:
		v.SetString(v.String() + "-changed")
	default:
		t.Fatalf("%s: cannot perturb a %s", path, v.Type())
	}
}

// hopsOf says which hops change when the field at path changes.
func hopsOf(t *testing.T, base HandoffOptions, path string, k knob) []string {
	render := func(o HandoffOptions) (eng, echo string) {
		var b strings.Builder
		for _, role := range []engine.Role{engine.RolePrefill, engine.RoleDecode} {
			j, err := json.Marshal(o.EngineConfig(role, "ucx", 64))
			if err != nil {
				t.Fatal(err)
			}
			b.Write(j)
		}
		j, err := json.Marshal(o.config(64))
		if err != nil {
			t.Fatal(err)
		}
		return b.String(), string(j)
	}
	if k.in != nil {
		k.in(&base)
	}
	o := base
	v := reflect.ValueOf(&o).Elem()
	for _, name := range strings.Split(path, ".") {
		v = v.FieldByName(name)
	}
	if k.to != nil {
		v.Set(reflect.ValueOf(k.to))
	} else {
		perturb(t, path, v)
	}
	if k.validate {
		for _, run := range []*HandoffOptions{&base, &o} {
			if err := run.Validate(); err != nil {
				t.Fatalf("%s: %v", path, err)
			}
		}
	}
	e0, c0 := render(base)
	e1, c1 := render(o)
	hops := []string{}
	if e0 != e1 {
		hops = append(hops, hopEngine)
	}
	if c0 != c1 {
		hops = append(hops, hopEcho)
	}
	return hops
}

// knobFields is every flag-backed field of HandoffOptions, squashed
// structs walked into.
func knobFields(typ reflect.Type, prefix string) []string {
	var out []string
	for i := range typ.NumField() {
		f := typ.Field(i)
		switch tag := f.Tag.Get("mapstructure"); {
		case tag == "-" || tag == "":
		case tag == ",squash":
			out = append(out, knobFields(f.Type, prefix+f.Name+".")...)
		default:
			out = append(out, prefix+f.Name)
		}
	}
	return out
}

// engineKnobHops is where an engine knob (engine.Knobs, embedded in
// HandoffOptions) must reach: both hops, in a run of a protocol it applies
// to, when it changes to another value (of its enum type, the value in
// knobTo). Being embedded in both, a knob reaches them by construction;
// this is what checks it.
func engineKnobHops(t *testing.T, path string) knob {
	f, ok := reflect.TypeFor[HandoffOptions]().FieldByName(strings.TrimPrefix(path, "Knobs."))
	if !ok {
		t.Fatalf("%s: no such field", path)
	}
	k := knob{hops: []string{hopEngine, hopEcho}, to: knobTo[f.Type]}
	if !engine.KnobAppliesTo(f, engine.ProtoPush) {
		k.in = sglangRun
	}
	return k
}

// knobTo is another valid value of each enum type among the knobs.
var knobTo = map[reflect.Type]any{
	reflect.TypeFor[engine.Verify]():         engine.Full,
	reflect.TypeFor[engine.DRAMAlloc]():      engine.AllocUCX,
	reflect.TypeFor[engine.WatchdogAction](): engine.WatchdogDrop,
	reflect.TypeFor[engine.HeartbeatKeys]():  engine.HBKeysFixed,
}

// TestKnobsReachTheirHops changes each flag-backed option alone and checks
// that exactly the hops listed in knobHops (engineKnobHops for the engine
// knobs) see the change.
func TestKnobsReachTheirHops(t *testing.T) {
	base := DefaultHandoffOptions()
	base.Protocol = engine.ProtoPush
	base.Spec = kv.Spec{Model: runcoretest.SmallModel(t), BlockSize: 16, TP: 1}
	fields := knobFields(reflect.TypeFor[HandoffOptions](), "")
	var unlisted []string
	for _, path := range fields {
		k, ok := knobHops[path]
		if strings.HasPrefix(path, "Knobs.") {
			k, ok = engineKnobHops(t, path), true
		}
		if !ok {
			unlisted = append(unlisted, path)
			continue
		}
		if got := hopsOf(t, base, path, k); !slices.Equal(got, k.hops) {
			t.Errorf("--%s (%s) reaches %v, want %v", flagName(path), path, got, k.hops)
		}
	}
	sort.Strings(unlisted)
	if diff := cmp.Diff([]string(nil), unlisted); diff != "" {
		t.Errorf("options with no entry in knobHops (say where each must reach):\n%s", diff)
	}
	for path := range knobHops {
		if !slices.Contains(fields, path) {
			t.Errorf("knobHops lists %s, which HandoffOptions no longer has", path)
		}
	}
}

// flagName is the field's mapstructure name, for messages.
func flagName(path string) string {
	typ := reflect.TypeFor[HandoffOptions]()
	var f reflect.StructField
	for _, name := range strings.Split(path, ".") {
		f, _ = typ.FieldByName(name)
		typ = f.Type
	}
	return f.Tag.Get("mapstructure")
}
