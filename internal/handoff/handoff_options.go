package handoff

import (
	"cmp"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"slices"
	"time"

	"github.com/nixlctl/nixlctl/internal/engine"
	"github.com/nixlctl/nixlctl/internal/errkind"
	"github.com/nixlctl/nixlctl/internal/kv"
	"github.com/nixlctl/nixlctl/internal/live"
	"github.com/nixlctl/nixlctl/internal/nixl"
	"github.com/nixlctl/nixlctl/internal/nixl/cuda"
	"github.com/nixlctl/nixlctl/internal/rendezvous"
	"github.com/nixlctl/nixlctl/internal/report"
	"github.com/nixlctl/nixlctl/internal/runcore"
	"github.com/nixlctl/nixlctl/internal/sidechannel"
	"github.com/nixlctl/nixlctl/internal/userfile"
)

// HandoffOptions configure `bench pull|push|sglang`: real prefill and
// decode endpoints handing KV caches over with one protocol while the
// driver plays the router. It is the one shape of these options: the CLI
// decodes its flags into it (the mapstructure tags are the flag names;
// "-" marks what is not a flag), Validate checks it, EngineConfig turns it
// into both endpoints' configuration, and the result echoes it
// (HandoffConfig). Adding a knob means a field here, its flag, and the
// code that uses it.
type HandoffOptions struct {
	Protocol engine.Protocol `mapstructure:"-"` // the command
	Backend  string          `mapstructure:"backend"`
	// Spec is the prefill's KV layout (its TP is the prefill's), which the
	// CLI resolves from the model flags.
	Spec     kv.Spec      `mapstructure:"-"`
	DecodeTP int          `mapstructure:"decode-tp"`
	Requests int          `mapstructure:"requests"`
	Warmup   int          `mapstructure:"warmup"` // requests run first and left out of the summary; WarmupPoolPass: one pass over the pool
	ISL      ISL          `mapstructure:",squash"`
	Trace    []TraceEntry `mapstructure:"-"` // arrivals and prompt lengths; overrides ISL and the load
	// TraceFile is a JSON-lines file of Trace's entries, which Validate
	// reads (the one place input files are read: --compat-factors and
	// --topology are read there too).
	TraceFile   string  `mapstructure:"trace"`
	Rate        float64 `mapstructure:"rate"`        // open loop, requests per second (Poisson); 0 = closed loop
	Concurrency int     `mapstructure:"concurrency"` // closed loop
	// MaxInflight caps an open loop's (or a trace's) requests in flight:
	// an arrival past it waits for one to finish, as behind a router's
	// queue, and is counted. Uncapped, a rate the endpoints could not keep
	// up with grew goroutines and waits without bound.
	MaxInflight   int                  `mapstructure:"max-inflight"`
	PrefixHit     float64              `mapstructure:"prefix-hit"` // fraction of each prompt decode already holds
	Fragmentation engine.Fragmentation `mapstructure:"fragmentation"`
	NoMerge       bool                 `mapstructure:"no-merge"`   // one descriptor per block per region, not merged as NIXL does
	NumBlocks     int                  `mapstructure:"num-blocks"` // per engine; 0 = enough for the workload
	// Knobs are the engines' settings (engine/knobs.go): flags,
	// defaults and checks are declared there, and both the engines'
	// Config and the result's echo embed them.
	engine.Knobs `mapstructure:",squash"`
	// AllowUnsupportedTP runs a prefill/decode TP pair that vLLM refuses
	// (kv.VLLMRefusesTP) instead of refusing it as bad input.
	AllowUnsupportedTP bool `mapstructure:"allow-unsupported-tp"`
	ChunkTokens        int  `mapstructure:"chunk-tokens"` // SGLang chunked prefill; 0 = one chunk
	// Bootstrap is an external SGLang prefill's bootstrap server,
	// http://HOST:PORT: that prefill replaces nixlctl's (sglext.go).
	Bootstrap    string       `mapstructure:"bootstrap"`
	Mem          nixl.MemType `mapstructure:"mem"`            // where both engines' KV pools live
	Device       int          `mapstructure:"device"`         // prefill's GPU (VRAM)
	DecodeDevice int          `mapstructure:"decode-device"`  // decode's GPU (VRAM)
	XferRef      bool         `mapstructure:"xfer-reference"` // measure bench xfer on the same bytes for efficiency
	// XferRounds splits a closed loop's measured requests into this many
	// rounds with a bench xfer round after each (the reference measured
	// beside the handoff, so that both see the host in the same state).
	XferRounds int  `mapstructure:"xfer-rounds"`
	Inproc     bool `mapstructure:"inproc"`
	// Prefill and Decode are the engines' control addresses, comma
	// separated (host:port of `serve prefill|decode --listen`, or "local"
	// for a child of the driver); "" is Prefills or Decodes local children.
	Prefill  string `mapstructure:"prefill"`
	Decode   string `mapstructure:"decode"`
	Prefills int    `mapstructure:"prefills"` // local prefill engines without addresses (0 = 1)
	Decodes  int    `mapstructure:"decodes"`
	// Topology is a file listing the engines instead (ReadTopology).
	Topology string `mapstructure:"topology"`
	// Router assigns requests to (prefill, decode) pairs ("" = round robin).
	Router Router `mapstructure:"router"`
	// OnEndpointDeath is what the run does when an endpoint dies: stop at
	// once (cancel what is in flight), or drain (let what is in flight
	// end by itself and go on with the engines that are left).
	OnEndpointDeath DeathPolicy `mapstructure:"on-endpoint-death"`
	// Rendezvous, instead of addresses: the endpoints register with the
	// driver (`serve prefill|decode --register`) at this address, a TCP
	// [tcp://]HOST:PORT the driver listens on or etcd://HOST:PORT, and the
	// driver waits up to JoinWindow for the roster: Roster
	// ("prefill=0,decode=1"), or prefill ranks 0..Prefills-1 and decode
	// ranks after them. RunID must match the endpoints' (etcd: required).
	Rendezvous string        `mapstructure:"rendezvous"`
	RunID      string        `mapstructure:"run-id"`
	Roster     string        `mapstructure:"roster"`
	JoinWindow time.Duration `mapstructure:"join-window"`
	// OnRendezvous, if set, is told where the driver waits (the TCP
	// listener's real address, or the etcd address) and for whom, before
	// it waits.
	OnRendezvous func(addr string, roster rendezvous.Roster) `mapstructure:"-"`
	roster       rendezvous.Roster                           `mapstructure:"-"`
	// reverse maps a reverse member's slot address ("reverse@PEER") to its
	// registration connection, its control channel.
	reverse map[string]net.Conn `mapstructure:"-"`
	// registered names who registered each rendezvous member's address.
	registered map[string]registration `mapstructure:"-"`
	// The engines Validate settled on, from the lists or the topology.
	prefills, decodes []EngineSlot `mapstructure:"-"`
	// XferTarget is a `serve target --listen` on the remote endpoint's host,
	// for the bench xfer reference across the same link.
	XferTarget string `mapstructure:"xfer-target"`
	Seed       uint64 `mapstructure:"seed"`
	// The vLLM compatibility hash (pull and push): CompatFactorsFile is a
	// JSON object of vLLM's factors, CompatHash a known hash to adopt,
	// NoCompatCheck accepts any peer's (enforce_handshake_compat=false).
	CompatFactorsFile string `mapstructure:"compat-factors"`
	CompatHash        string `mapstructure:"compat-hash"`
	NoCompatCheck     bool   `mapstructure:"no-compat-check"`
	compatFactors     []byte `mapstructure:"-"` // the file's bytes, read by Validate

	Exe      string   `mapstructure:"-"` // endpoint children; default this program
	ExeArgs  []string `mapstructure:"-"` // arguments before the role; default serve
	ChildEnv []string `mapstructure:"-"`
	// ChildStderr receives the endpoint children's stderr (nil: this
	// process's stderr).
	ChildStderr io.Writer `mapstructure:"-"`
	// OnStart, if set, is called once both endpoints are set up (chaos
	// and fault tests use it to kill or stop them mid-run).
	OnStart func(prefill, decode *Endpoint) `mapstructure:"-"`
	Version string                          `mapstructure:"-"`
	Log     *slog.Logger                    `mapstructure:"-"`
	// Warnings are what the caller changed while settling the options
	// (an SGLang variable raised to upstream's floor); the result carries
	// them, so that what ran is not silently other than what was asked.
	Warnings []string `mapstructure:"-"`
	// Live receives a Start, then a Request per finished request (warm-up
	// ones marked), phases and warnings (nil: nobody listens).
	Live live.Sink `mapstructure:"-"`
	// Records, if set, gets the records header before the timed phase and
	// each request's record once it is final, so that a driver killed
	// mid-run leaves what it measured on disk (--records, --save). Its
	// write errors are its own to report: the run goes on.
	Records report.RecordsSink `mapstructure:"-"`
}

// DefaultHandoffOptions are the defaults of every knob that has one (the
// CLI's flag defaults come from here). The registration timeout is the
// push/SGLang watchdog's only default: the engine uses what it is given.
// The push watchdog's defaults here (60 s, fail) are this bench's, not
// upstream's (480 s, drop: the request keeps waiting), so that a run
// whose prefill never writes ends; results record both and warn.
func DefaultHandoffOptions() HandoffOptions {
	return HandoffOptions{Backend: "auto", DecodeTP: 1, Requests: 32, Warmup: WarmupPoolPass,
		ISL:         ISL{Dist: ISLFixed, Fixed: 4096, Min: 128, Max: 8192, Mean: 4096, Std: 1024},
		Concurrency: 8, Fragmentation: engine.FragContiguous, Knobs: engine.DefaultKnobs(),
		Mem: nixl.DRAM, Seed: 1, Prefills: 1, Decodes: 1, Router: RouterRoundRobin,
		JoinWindow: 60 * time.Second, XferRounds: 8, MaxInflight: DefaultMaxInflight}
}

// DefaultMaxInflight is --max-inflight's default: four times what the
// automatic pools are sized to hold in flight.
const DefaultMaxInflight = 4 * openLoopInflight

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

// notUpstream says, one warning each, where the run does not behave as
// upstream vLLM would: push heartbeats that renew, a push watchdog other
// than 480 s drop-and-log, TP pairs vLLM refuses, push with pipeline
// stages on decode.
func (o *HandoffOptions) notUpstream() []string {
	var out []string
	if o.Protocol == engine.ProtoPush {
		if o.PushHeartbeatKeys == engine.HBKeysFixed {
			out = append(out, "--push-heartbeat-keys fixed: not upstream behaviour; decode heartbeats its own id and prefill matches it by base id, "+
				"so heartbeats renew leases (vLLM's push heartbeats never do: #53095, fix proposed in PR #53244)")
		}
		if o.RegWatchdog != engine.WatchdogDrop || time.Duration(o.RegTimeout) != engine.DefaultRegTimeout {
			out = append(out, fmt.Sprintf("registration watchdog: %s after %v, not upstream behaviour (vLLM drops the registration after 480s, logs, and the request keeps waiting; --registration-timeout 480s --registration-watchdog drop)",
				o.RegWatchdog, o.RegTimeout))
		}
		if o.Spec.PP > 1 {
			out = append(out, fmt.Sprintf("--pp %d with push: not upstream behaviour; vLLM's push connector rejects pipeline parallelism on decode "+
				"(its prefill-only PP writes every stage into one decode), nixlctl runs both sides with %d stages, stage k writing into stage k", o.Spec.PP, o.Spec.PP))
		}
	}
	for _, r := range o.unsupportedTP() {
		out = append(out, "--allow-unsupported-tp: "+r+"; measured anyway")
	}
	return out
}

// tpRefusal says why vLLM refuses a TP pair, naming the flags.
func tpRefusal(p, d kv.Spec) string {
	return fmt.Sprintf("--prefill-tp %d > --decode-tp %d with the %d KV heads of %s replicated across prefill's ranks: vLLM refuses this (%q)",
		p.TP, d.TP, p.Model.NumKVHeads, p.Model.Name, kv.VLLMTPRefusal)
}

// unsupportedTP lists the TP pairs of the run that vLLM refuses (run
// because AllowUnsupportedTP), each with vLLM's reason.
func (o *HandoffOptions) unsupportedTP() []string {
	if o.Protocol == engine.ProtoSGLang {
		return nil
	}
	var out []string
	seen := map[[2]int]bool{}
	ps, ds := o.engines()
	var pairs [][2]int
	for _, p := range ps {
		for _, d := range ds {
			pairs = append(pairs, [2]int{p.TP, d.TP})
		}
	}
	for _, pr := range pairs {
		if seen[pr] || pr[0] <= 0 || pr[1] <= 0 {
			continue
		}
		seen[pr] = true
		p, d := o.Spec, o.Spec
		p.TP, d.TP = pr[0], pr[1]
		if kv.VLLMRefusesTP(p, d) {
			out = append(out, tpRefusal(p, d))
		}
	}
	return out
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

// usesTrace settles what a trace overrides: prompt lengths and arrivals
// come from it, an open loop.
func (o *HandoffOptions) usesTrace() {
	if len(o.Trace) > 0 {
		o.ISL.Dist = ISLTrace
		o.Rate = 1
	}
}

// EngineConfig is one endpoint's configuration: the one translation from
// the options, for both roles. numBlocks is the pool size RunHandoff
// settled on.
func (o *HandoffOptions) EngineConfig(role engine.Role, backend string, numBlocks int) engine.Config {
	spec := o.Spec
	c := engine.Config{Role: role, Backend: backend, Protocol: o.Protocol, Model: spec.Model, KVDType: spec.DType,
		BlockSize: spec.BlockSize, Layout: spec.Layout, Order: spec.Order, PP: spec.PP, NumBlocks: numBlocks, Knobs: o.Knobs,
		Scattered: o.Fragmentation == engine.FragScattered, Merge: !o.NoMerge, Mem: o.Mem,
		CompatFactors: o.compatFactors, CompatHashHex: o.CompatHash, NoCompatCheck: o.NoCompatCheck}
	switch role {
	case engine.RolePrefill:
		c.TP, c.EngineID, c.Device, c.Seed = spec.TP, "prefill-0", o.Device, o.Seed
	case engine.RoleDecode:
		c.TP, c.EngineID, c.Device, c.Seed = o.DecodeTP, "decode-0", o.DecodeDevice, o.Seed+1
	}
	return c
}

// poolBlocks sizes the pools: every request in flight may hold its blocks
// on both sides, plus room for leases that outlive a request.
func (o *HandoffOptions) poolBlocks() int {
	if o.NumBlocks > 0 {
		return o.NumBlocks
	}
	per := o.blocksPerRequest()
	return max(per*o.poolInflight()*3/2+per, 64)
}

// openLoopCap is --max-inflight where it applies (an open loop or a
// trace), else 0.
func (o *HandoffOptions) openLoopCap() int {
	if o.Rate > 0 || len(o.Trace) > 0 {
		return cmp.Or(o.MaxInflight, DefaultMaxInflight)
	}
	return 0
}

// openLoopInflight is what an open loop's (or a trace's) automatic pools
// are sized to hold in flight: arrivals do not wait for the blocks.
const openLoopInflight = 64

// poolInflight is how many requests the automatic pools are sized to hold
// at once: the concurrency, or 64 for an open loop, but never more than
// the run has (a 2-request trace got pools for 64 of the default 4096
// tokens: 24,832 blocks for what 64 hold).
func (o *HandoffOptions) poolInflight() int {
	n := o.Requests + max(o.Warmup, 0)
	if len(o.Trace) > 0 {
		n = len(o.Trace)
	}
	inflight := o.Concurrency
	if o.Rate > 0 || len(o.Trace) > 0 {
		inflight = openLoopInflight
	}
	return max(1, min(inflight, n))
}

// poolSizedFor says in the result what the pools were sized for.
func (o *HandoffOptions) poolSizedFor() string {
	if o.NumBlocks > 0 {
		return "--num-blocks"
	}
	src := "--isl"
	switch o.ISL.Dist {
	case ISLTrace:
		src = "the trace's longest"
	case ISLUniform, ISLNormal:
		src = "--isl-max"
	}
	return fmt.Sprintf("%d requests in flight of %d tokens (%s), %d blocks each, and half as many again for leases that outlive a request",
		o.poolInflight(), o.longestPrompt(), src, o.blocksPerRequest())
}

// WarmupPoolPass, as Warmup, runs as many warm-up requests as take every
// block of the pool once (at least 2; 2 with a trace). The first use of a
// block is slow on a VM (a page fault costs 12-14 us on the project's
// Firecracker hosts, 300 MB/s of first touch) and UCX grows its own
// buffers then: with 2 warm-up requests the first of four rounds of
// llama-3.1-8b at 2048 tokens read 1.26 GB/s against 3.5-5.5 after it;
// with 16, 7.1 against 4.9-6.9.
const WarmupPoolPass = -1

// poolPass is the warm-up that uses each of a pool's blocks once.
func (o *HandoffOptions) poolPass(blocks int) int {
	per := o.blocksPerRequest()
	if len(o.Trace) > 0 {
		// The warm-up is the trace's first requests: leave one measured
		// (a 2-request trace measured none).
		return max(0, min(2, len(o.Trace)-1))
	}
	if per <= 0 {
		return 2
	}
	// Never more than the run measures: an open loop sizes its pool for
	// 64 requests in flight.
	return max(2, min((blocks+per-1)/per, o.Requests))
}

// blocksPerRequest is what the longest prompt of the workload holds on
// one engine: a pool smaller than that cannot run it at all.
func (o *HandoffOptions) blocksPerRequest() int {
	return o.Spec.BlocksFor(kv.FullAttention, o.longestPrompt())
}

func (o *HandoffOptions) longestPrompt() int {
	maxISL := o.ISL.Fixed
	switch o.ISL.Dist {
	case ISLUniform, ISLNormal:
		maxISL = o.ISL.Max
	case ISLTrace:
		maxISL = 0 // the trace's own, not --isl's default
		for _, e := range o.Trace {
			maxISL = max(maxISL, e.ISL)
		}
	}
	return maxISL
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
