package handoff

import (
	"cmp"
	"fmt"
	"io"
	"log/slog"
	"net"
	"strings"
	"time"

	"github.com/nixlctl/nixlctl/internal/engine"
	"github.com/nixlctl/nixlctl/internal/kv"
	"github.com/nixlctl/nixlctl/internal/live"
	"github.com/nixlctl/nixlctl/internal/nixl"
	"github.com/nixlctl/nixlctl/internal/rendezvous"
	"github.com/nixlctl/nixlctl/internal/report"
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

// config echoes the options a run used (numBlocks being its pool size).
func (o *HandoffOptions) config(numBlocks int) HandoffConfig {
	s := o.Spec
	c := HandoffConfig{Protocol: o.Protocol, Model: s.Model.Name, KVDType: s.DType, BlockSize: s.BlockSize, Layout: s.Layout,
		Order: s.Order, PrefillTP: s.TP, DecodeTP: o.DecodeTP, PP: ppOrOmit(s.PP), Requests: o.Requests, Warmup: o.Warmup, Seed: new(o.Seed), ISL: o.ISL, Rate: o.Rate,
		Concurrency: o.Concurrency, MaxInflight: o.openLoopCap(), PrefixHit: o.PrefixHit, Fragmentation: o.Fragmentation, Merge: !o.NoMerge, NumBlocks: numBlocks,
		Knobs: o.Knobs.Echo(o.Protocol), ChunkTokens: o.ChunkTokens, Mem: o.Mem.String(), Endpoints: "process",
		UnsupportedTP: o.unsupportedTP(), NoCompatCheck: o.NoCompatCheck}
	if o.Mem == nixl.VRAM {
		c.PrefillDevice, c.DecodeDevice = new(o.Device), new(o.DecodeDevice)
	}
	if len(o.Trace) > 0 {
		// The trace's requests ran, not --requests (32 by default).
		c.Requests = len(o.Trace) - max(o.Warmup, 0)
	}
	if o.Protocol == engine.ProtoSGLang {
		c.SGLBootstrap = o.Bootstrap
	}
	ps, ds := o.engines()
	switch {
	case o.remote():
		c.Endpoints = "prefill " + slotsLabel(ps) + " / decode " + slotsLabel(ds)
	case o.Inproc:
		c.Endpoints = "inproc"
	}
	if len(ps)*len(ds) > 1 {
		c.PrefillEngines, c.DecodeEngines, c.Router = ps, ds, cmp.Or(o.Router, RouterRoundRobin)
		if !o.remote() {
			c.Endpoints = fmt.Sprintf("%s, %d prefill x %d decode", c.Endpoints, len(ps), len(ds))
		}
	}
	if o.OnEndpointDeath == DeathDrain {
		c.OnEndpointDeath = DeathDrain
	}
	return c
}

// engines are the prefill and decode engines (one local child of each
// when Validate has not run).
func (o *HandoffOptions) engines() (p, d []EngineSlot) {
	p, d = o.prefills, o.decodes
	if len(p) == 0 {
		p = []EngineSlot{{Addr: cmp.Or(o.Prefill, "local"), TP: o.Spec.TP}}
	}
	if len(d) == 0 {
		d = []EngineSlot{{Addr: cmp.Or(o.Decode, "local"), TP: o.DecodeTP}}
	}
	return p, d
}

// remote says whether any engine runs elsewhere.
func (o *HandoffOptions) remote() bool {
	p, d := o.engines()
	for _, s := range append(append([]EngineSlot(nil), p...), d...) {
		if !s.Local() {
			return true
		}
	}
	return false
}

// slotsLabel names engines for the result's endpoints line.
func slotsLabel(slots []EngineSlot) string {
	names := make([]string, len(slots))
	for i, s := range slots {
		names[i] = cmp.Or(s.remoteAddr(), "local child")
	}
	return strings.Join(names, ", ")
}
