package handoff

import (
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/nixlctl/nixlctl/internal/engine"
	"github.com/nixlctl/nixlctl/internal/errkind"
	"github.com/nixlctl/nixlctl/internal/kv"
	"github.com/nixlctl/nixlctl/internal/nixl"
	"github.com/nixlctl/nixlctl/internal/nixl/cuda"
	"github.com/nixlctl/nixlctl/internal/runcore"
	"github.com/nixlctl/nixlctl/internal/sidechannel"
	"github.com/nixlctl/nixlctl/internal/userfile"
)

// Validate checks the options. Problems with one field are
// errkind.FieldErrors (so the CLI can name the flag), all of them joined
// and marked bad input.
func (o *HandoffOptions) Validate() error {
	if err := o.readTrace(); err != nil {
		return errkind.BadInput(err) // nothing else is judged without the workload
	}
	var errs []error
	bad := func(field, format string, a ...any) { errs = append(errs, errkind.Field(field, format, a...)) }
	o.validateCompat(bad)
	if !o.Protocol.Valid() {
		bad("Protocol", "unknown protocol %q (want pull, push or sglang)", o.Protocol)
	}
	if o.XferRef && o.XferRounds < 1 {
		bad("XferRounds", "must be at least 1 (1: one reference round after the whole run)")
	}
	if o.Requests <= 0 && len(o.Trace) == 0 {
		bad("Requests", "must be positive")
	}
	if o.Warmup < WarmupPoolPass {
		bad("Warmup", "must not be negative (or -1: one pass over the KV pool)")
	}
	// A trace gives the prompt lengths and the arrivals (usesTrace).
	if len(o.Trace) == 0 {
		if o.Rate < 0 {
			bad("Rate", "must not be negative")
		} else if o.Rate == 0 && o.Concurrency <= 0 {
			bad("Rate", "0 means a closed loop, which needs a positive concurrency; use a rate > 0 (open loop) or a concurrency > 0")
		}
		if o.ISL.Dist == ISLTrace {
			bad("ISL.Dist", "trace needs a trace file")
		} else if err := o.ISL.Validate(); err != nil {
			errs = append(errs, prefixFields("ISL.", err)...)
		}
	}
	if o.PrefixHit < 0 || o.PrefixHit >= 1 {
		bad("PrefixHit", "must be in [0, 1)")
	}
	if !o.Fragmentation.Valid() {
		bad("Fragmentation", "unknown fragmentation %q (want contiguous or scattered)", o.Fragmentation)
	}
	o.Knobs.Validate(o.Protocol, bad)
	if o.Mem != nixl.DRAM && o.Mem != nixl.VRAM {
		bad("Mem", "unknown memory type %v", o.Mem)
	}
	if o.NumBlocks < 0 {
		bad("NumBlocks", "must not be negative")
	}
	if o.NetDevices != "" && !o.remote() && o.Rendezvous == "" {
		// Remote endpoints' devices are their hosts', not this one's.
		if err := runcore.CheckNetDevices(runcore.SysClassRoot, o.NetDevices); err != nil {
			bad("NetDevices", "%v", err)
		}
	}
	if o.ChunkTokens < 0 {
		bad("ChunkTokens", "must not be negative")
	} else if bs := o.Spec.BlockSize; o.ChunkTokens > 0 && bs > 0 && o.ChunkTokens%bs != 0 {
		// SGLang's chunks end on page boundaries; a chunk of 7 tokens
		// with 16-token pages was run as if aligned.
		bad("ChunkTokens", "%d is not a multiple of the page size (--block-size %d)", o.ChunkTokens, bs)
	}
	o.validateBootstrap(bad)
	if o.DecodeTP <= 0 {
		bad("DecodeTP", "must be positive")
	} else if o.DecodeTP > kv.MaxParallel {
		// Named here: the decode layout's own error lost its flag.
		bad("DecodeTP", "must be between 1 and %d (got %d)", kv.MaxParallel, o.DecodeTP)
	}
	if err := engine.CheckPP(o.Protocol, o.Spec.PP); err != nil {
		bad("PP", "%v; got %d", err, o.Spec.PP)
	}
	if o.validateBounds(bad) {
		o.resolveEngines(func(err error) { errs = append(errs, err) }, bad)
		o.validateLocalEngines(bad)
	}
	if o.Inproc && o.remote() {
		bad("Inproc", "excludes remote endpoints (prefill and decode addresses)")
	}
	if o.Router != "" && !slices.Contains(Routers, o.Router) {
		bad("Router", "unknown router %q (want round-robin or least-loaded)", o.Router)
	}
	if o.OnEndpointDeath != "" && !slices.Contains(DeathPolicies, o.OnEndpointDeath) {
		bad("OnEndpointDeath", "unknown policy %q (want stop or drain)", o.OnEndpointDeath)
	}
	if o.XferTarget != "" {
		if err := runcore.CheckAddr(o.XferTarget); err != nil {
			bad("XferTarget", "%v", err)
		}
	}
	if err := o.Spec.Validate(); err != nil {
		errs = append(errs, fmt.Errorf("prefill: %w", err))
	} else if o.NumBlocks > 0 {
		// Validate runs before RunHandoff marks a trace's workload.
		t := *o
		t.usesTrace()
		if per := t.blocksPerRequest(); o.NumBlocks < per {
			bad("NumBlocks", "%d blocks per engine cannot hold one request: the longest prompt (%d tokens) needs %d",
				o.NumBlocks, t.longestPrompt(), per)
		}
	}
	if o.DecodeTP > 0 && o.DecodeTP <= kv.MaxParallel {
		d := o.Spec
		d.TP = o.DecodeTP
		if err := d.Validate(); err != nil {
			errs = append(errs, fmt.Errorf("decode: %w", err))
		} else if _, err := kv.Plan(o.Spec, d); err != nil {
			errs = append(errs, err)
		} else if kv.VLLMRefusesTP(o.Spec, d) && !o.AllowUnsupportedTP && o.Protocol != engine.ProtoSGLang {
			bad("DecodeTP", "%s (--allow-unsupported-tp runs it anyway)", tpRefusal(o.Spec, d))
		}
	}
	errs = append(errs, o.checkTopologyTPs()...)
	if len(errs) == 0 {
		if err := o.checkPoolMemory(runcore.HostMemRoom()); err != nil {
			errs = append(errs, err)
		}
	}
	return errkind.BadInput(errors.Join(errs...))
}

// checkLocalVRAM refuses --mem vram before anything starts when an engine
// of this host needs the CUDA driver and it is not there: before, the
// endpoints started and the first set-up failed.
func (o *HandoffOptions) checkLocalVRAM() error {
	if o.Mem != nixl.VRAM || o.Rendezvous != "" {
		return nil
	}
	ps, ds := o.engines()
	for _, s := range append(append([]EngineSlot(nil), ps...), ds...) {
		if s.Local() {
			if err := cuda.Err(); err != nil {
				return errkind.BadInput(errkind.Field("Mem", "VRAM: the engines this host starts need the CUDA driver: %s", cuda.Unavailable()))
			}
			return nil
		}
	}
	return nil
}

// localBlockBytes is what one block of every engine's pool weighs on the
// engines that run on this host (every rank of each), in its memory: 0
// for VRAM pools, which the GPUs hold.
func (o *HandoffOptions) localBlockBytes(spec kv.Spec) int64 {
	if o.Mem == nixl.VRAM {
		return 0
	}
	ps, ds := o.engines()
	var per int64
	for _, s := range append(append([]EngineSlot(nil), ps...), ds...) {
		if s.Local() {
			per += spec.BlockBytesAllRanks(s.TP)
		}
	}
	return per
}

// checkPoolMemory refuses, before anything starts, KV pools this host
// cannot hold: --num-blocks as asked (1 Ti blocks ran the driver out of
// memory), or, when the pools are sized for the workload, one request of
// its longest prompt (the run cuts automatic pools to fit, down to that).
func (o *HandoffOptions) checkPoolMemory(room runcore.MemRoom) error {
	spec, err := o.Spec.Normalize()
	if err != nil || room <= 0 {
		return nil
	}
	per := o.localBlockBytes(spec)
	if per <= 0 {
		return nil
	}
	what := fmt.Sprintf("a block on every rank of the %d local engines", o.localEngines())
	if o.NumBlocks > 0 {
		if !room.Fits(int64(o.NumBlocks), per) {
			return errkind.Field("NumBlocks", "%d blocks per engine do not fit on this host: %s",
				o.NumBlocks, room.Need(int64(o.NumBlocks), per, what))
		}
		return nil
	}
	// RunHandoff cuts automatic pools to half of what is available: the
	// same half must hold one request, or every request would fail.
	t := *o
	t.usesTrace()
	n := int64(t.blocksPerRequest())
	if (room / 2).Fits(n, per) {
		return nil
	}
	msg := fmt.Sprintf("one request of %d tokens does not fit on this host: %s (automatic pools take at most half)",
		t.longestPrompt(), room.Need(n, per, what))
	switch t.ISL.Dist {
	case ISLTrace:
		return fmt.Errorf("--trace: its longest prompt: %s", msg)
	case ISLUniform, ISLNormal:
		return errkind.Field("ISL.Max", "%s", msg)
	}
	return errkind.Field("ISL.Fixed", "%s", msg)
}

// validateBounds refuses counts and times past the limits (limits.go),
// which ran out of memory, wrapped, or ran until killed. It says whether
// the engine counts are within bounds (else the engines are not resolved:
// a slot each would not fit).
func (o *HandoffOptions) validateBounds(bad func(field, format string, a ...any)) (enginesOK bool) {
	enginesOK = true
	if o.Requests > runcore.MaxRequests {
		bad("Requests", "%d: at most %d", o.Requests, runcore.MaxRequests)
	}
	if o.Warmup > runcore.MaxRequests {
		bad("Warmup", "%d: at most %d", o.Warmup, runcore.MaxRequests)
	}
	if len(o.Trace) > 0 && o.Warmup >= len(o.Trace) {
		bad("Warmup", "%d: the trace has %d requests, so none would be measured", o.Warmup, len(o.Trace))
	}
	if o.MaxInflight < 0 || o.MaxInflight > runcore.MaxConcurrency {
		bad("MaxInflight", "%d: want 1 to %d requests in flight", o.MaxInflight, runcore.MaxConcurrency)
	}
	if o.Concurrency > runcore.MaxConcurrency {
		bad("Concurrency", "%d: at most %d requests in flight", o.Concurrency, runcore.MaxConcurrency)
	}
	for _, c := range []struct {
		field string
		n     int
	}{{"Prefills", o.Prefills}, {"Decodes", o.Decodes}} {
		if c.n > runcore.MaxEngines {
			bad(c.field, "%d: at most %d engines", c.n, runcore.MaxEngines)
			enginesOK = false
		}
	}
	if len(o.Trace) == 0 && o.Rate > 0 && o.Requests > 0 && o.Requests <= runcore.MaxRequests {
		// An arrival past a Duration's range wrapped and fired at once.
		n := o.Requests + max(o.Warmup, 0)
		if secs := float64(n) / o.Rate; secs > runcore.MaxRunTime.Seconds() {
			bad("Rate", "%g: %d requests at this rate arrive over about %.3g s; a run may last at most %v", o.Rate, n, secs, runcore.MaxRunTime)
		}
	}
	if o.PrefillPerToken > 0 {
		t := *o
		t.usesTrace()
		if longest := t.longestPrompt(); longest > 0 && time.Duration(o.PrefillPerToken) > runcore.MaxPrefillTime/time.Duration(longest) {
			bad("PrefillPerToken", "%v per token: the longest prompt (%d tokens) would take %.3g s to prefill; at most %v a request",
				o.PrefillPerToken, longest, time.Duration(o.PrefillPerToken).Seconds()*float64(longest), runcore.MaxPrefillTime)
		}
	}
	return enginesOK
}

// localEngines counts the engines that run on this host.
func (o *HandoffOptions) localEngines() int {
	ps, ds := o.engines()
	local := 0
	for _, s := range append(append([]EngineSlot(nil), ps...), ds...) {
		if s.Local() {
			local++
		}
	}
	return local
}

// validateLocalEngines refuses more engines on this host than it can
// start: each is a process of its own (a topology of 200 local prefills
// forked 200 UCX processes).
func (o *HandoffOptions) validateLocalEngines(bad func(field, format string, a ...any)) {
	local := o.localEngines()
	if local <= runcore.MaxLocalEngines {
		return
	}
	switch {
	case o.Topology != "":
		bad("Topology", "%d engines would run on this host; at most %d", local, runcore.MaxLocalEngines)
	case o.Decodes > o.Prefills:
		bad("Decodes", "%d with --prefills %d: %d engines would run on this host; at most %d", o.Decodes, max(o.Prefills, 1), local, runcore.MaxLocalEngines)
	default:
		bad("Prefills", "%d with --decodes %d: %d engines would run on this host; at most %d", o.Prefills, max(o.Decodes, 1), local, runcore.MaxLocalEngines)
	}
}

// validateBootstrap checks --bootstrap and refuses what it conflicts
// with: other prefill engines, and the options of nixlctl's own prefill
// (the external one chunks, computes and caches by itself).
func (o *HandoffOptions) validateBootstrap(bad func(field, format string, a ...any)) {
	if o.Bootstrap == "" || o.Protocol != engine.ProtoSGLang {
		return // other protocols: Ignored names it
	}
	if _, err := ParseBootstrapURL(o.Bootstrap); err != nil {
		bad("Bootstrap", "%v", err)
		return
	}
	for _, c := range []struct {
		field string
		set   bool
	}{{"Prefill", o.Prefill != ""}, {"Prefills", o.Prefills > 1}, {"Topology", o.Topology != ""}, {"Rendezvous", o.Rendezvous != ""}} {
		if c.set {
			bad(c.field, "not with --bootstrap: the external SGLang prefill is the run's one prefill")
		}
	}
	for _, c := range []struct {
		field string
		set   bool
	}{{"ChunkTokens", o.ChunkTokens > 0}, {"PrefillPerToken", o.PrefillPerToken > 0}, {"PrefixHit", o.PrefixHit > 0}, {"XferRef", o.XferRef}} {
		if c.set {
			bad(c.field, "not with --bootstrap: it shapes nixlctl's own prefill; the external SGLang prefill chunks, computes and caches by itself")
		}
	}
}

// prefixFields puts prefix before the field of every FieldError err joins
// (a nested struct's errors, named from the outer struct).
func prefixFields(prefix string, err error) []error {
	errs := []error{err}
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		errs = j.Unwrap()
	}
	out := make([]error, 0, len(errs))
	for _, e := range errs {
		if fe, ok := e.(errkind.FieldError); ok {
			fe.Field = prefix + fe.Field
			e = fe
		}
		out = append(out, e)
	}
	return out
}

// readTrace reads TraceFile into Trace, once: a second Validate keeps the
// entries the first one read.
func (o *HandoffOptions) readTrace() error {
	if o.TraceFile == "" || o.Trace != nil {
		return nil
	}
	f, err := userfile.Open(o.TraceFile, userfile.MaxLarge)
	if err != nil {
		return fmt.Errorf("--trace: %v", err)
	}
	defer f.Close()
	if o.Trace, err = ReadTrace(f); err != nil {
		return fmt.Errorf("--trace %s: %v", o.TraceFile, err)
	}
	return nil
}

// validateCompat reads --compat-factors and checks the compatibility
// options before anything starts.
func (o *HandoffOptions) validateCompat(bad func(field, format string, a ...any)) {
	if o.Protocol == engine.ProtoSGLang {
		for field, set := range map[string]bool{"CompatFactorsFile": o.CompatFactorsFile != "", "CompatHash": o.CompatHash != "", "NoCompatCheck": o.NoCompatCheck} {
			if set {
				bad(field, "vLLM's compatibility hash does not apply to SGLang")
			}
		}
		return
	}
	if o.CompatFactorsFile != "" && o.CompatHash != "" {
		bad("CompatHash", "give --compat-factors or --compat-hash, not both")
	}
	if h := o.CompatHash; h != "" {
		if _, err := hex.DecodeString(h); err != nil || len(h) != 64 {
			bad("CompatHash", "%q is not a sha256 in hex (64 characters)", h)
		}
	}
	if o.CompatFactorsFile != "" {
		b, err := userfile.ReadFile(o.CompatFactorsFile, userfile.MaxSmall)
		if err != nil {
			bad("CompatFactorsFile", "%v", err)
			return
		}
		if _, _, err := sidechannel.ParseCompatFactors(b); err != nil {
			bad("CompatFactorsFile", "%s: %v", o.CompatFactorsFile, err)
			return
		}
		o.compatFactors = b
	}
}
