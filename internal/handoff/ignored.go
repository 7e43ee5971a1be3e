package handoff

import (
	"fmt"
	"reflect"

	"github.com/nixlctl/nixlctl/internal/engine"
	"github.com/nixlctl/nixlctl/internal/nixl"
	"github.com/nixlctl/nixlctl/internal/runcore"
)

// sglOnly are the options only bench sglang reads, besides the engine
// knobs tagged for it (ignoredKnobs).
var sglOnly = []string{"ChunkTokens", "Bootstrap"}

// protocolNames says which protocols a knob's protocols tag names.
var protocolNames = map[string]string{"push": "push", "sglang": "SGLang", "pull,push": "pull and push"}

// ignoredKnobs lists the engine knobs whose protocols tag leaves p out.
func ignoredKnobs(p engine.Protocol, ig func(why string, fields ...string)) {
	for _, f := range reflect.VisibleFields(reflect.TypeFor[engine.Knobs]()) {
		if engine.KnobAppliesTo(f, p) {
			continue
		}
		only := protocolNames[f.Tag.Get("protocols")]
		why := fmt.Sprintf("bench %s does not use it (%s only", p, only)
		if p == engine.ProtoSGLang && only == "push" {
			why += "; SGLang has --sglang-waiting-timeout"
		}
		ig(why+")", f.Name)
	}
}

// Ignored lists the options RunHandoff does not read for o's protocol
// and mode. pull, push and sglang share one flag set, so a flag that one
// of them ignores would otherwise be accepted and change nothing, and the
// result would read as if it had been measured; the CLI refuses each one
// the user set. Call it after Validate, which reads the trace (Trace decides the mode).
func (o *HandoffOptions) Ignored() []runcore.IgnoredField {
	var out []runcore.IgnoredField
	ig := func(why string, fields ...string) {
		for _, f := range fields {
			out = append(out, runcore.IgnoredField{Field: f, Why: why})
		}
	}
	p := o.Protocol.String()
	// The registration watchdog is decode's wait for pushed KV; SGLang's
	// rooms have no lease (prefill frees on the aux row).
	ignoredKnobs(o.Protocol, ig)
	switch o.Protocol {
	case engine.ProtoPull, engine.ProtoPush:
		// The chunks are SGLang's (the prefill request's ChunkTokens).
		ig("bench "+p+" does not use it (SGLang only)", sglOnly...)
	case engine.ProtoSGLang:
		ig("bench "+p+" does not use it (pull and push only)", "Lease", "AllowUnsupportedTP")
	}
	if o.Mem != nixl.VRAM {
		ig("only with --mem vram", "Device", "DecodeDevice")
	} else {
		ig("--mem vram pools come from the CUDA driver", "DRAMAlloc") // cuda.AllocSeg
	}
	if o.Rendezvous == "" {
		// The run id, roster and join window are the rendezvous's; named
		// or listed endpoints are there from the start.
		ig("only with --rendezvous", "RunID", "Roster", "JoinWindow")
		if !o.remote() {
			// Local endpoints' --xfer-reference runs on this host.
			ig("only with remote endpoints (--prefill/--decode HOST:PORT, --topology or --rendezvous)", "XferTarget")
		}
	}
	if o.Rate == 0 && len(o.Trace) == 0 {
		ig("only with an open loop (--rate or --trace); a closed loop has --concurrency in flight", "MaxInflight")
	}
	if len(o.Trace) > 0 {
		// usesTrace: the trace's arrivals and prompt lengths replace the
		// load and the distribution.
		why := "--trace gives the arrivals and prompt lengths"
		ig(why, "Rate", "Concurrency", "ISL.Fixed", "ISL.Min", "ISL.Max", "ISL.Mean", "ISL.Std")
		if o.ISL.Dist != ISLTrace { // --isl-dist trace says the same as --trace
			ig(why, "ISL.Dist")
		}
		return out
	}
	switch o.ISL.Dist {
	case ISLFixed:
		ig("--isl-dist fixed uses --isl only", "ISL.Min", "ISL.Max", "ISL.Mean", "ISL.Std")
	case ISLUniform:
		ig("--isl-dist uniform uses --isl-min and --isl-max only", "ISL.Fixed", "ISL.Mean", "ISL.Std")
	case ISLNormal:
		ig("--isl-dist normal draws from --isl-mean and --isl-std", "ISL.Fixed")
	}
	switch {
	case !o.XferRef:
		ig("--xfer-rounds splits the --xfer-reference run into rounds", "XferRounds")
	case o.Rate > 0 || len(o.Trace) > 0:
		ig("an open loop or a trace runs its bench xfer reference once, after the run (rounds need a closed loop)", "XferRounds")
	}
	if o.Rate > 0 && !o.XferRef {
		// The open loop's arrivals set what is in flight; only the xfer
		// reference reads the concurrency (as its pipeline depth).
		ig("--rate runs an open loop; --concurrency is the closed loop's", "Concurrency")
	}
	return out
}
