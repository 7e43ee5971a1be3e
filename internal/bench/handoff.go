package bench

import (
	"cmp"
	"context"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/nixlctl/nixlctl/internal/cpuspeed"
	"github.com/nixlctl/nixlctl/internal/ctl"
	"github.com/nixlctl/nixlctl/internal/engine"
	"github.com/nixlctl/nixlctl/internal/errkind"
	"github.com/nixlctl/nixlctl/internal/kv"
	"github.com/nixlctl/nixlctl/internal/lease"
	"github.com/nixlctl/nixlctl/internal/live"
	"github.com/nixlctl/nixlctl/internal/mono"
	"github.com/nixlctl/nixlctl/internal/nixl"
	"github.com/nixlctl/nixlctl/internal/nixl/cuda"
	"github.com/nixlctl/nixlctl/internal/procfs"
	"github.com/nixlctl/nixlctl/internal/rendezvous"
	"github.com/nixlctl/nixlctl/internal/report"
	"github.com/nixlctl/nixlctl/internal/sidechannel"
	"github.com/nixlctl/nixlctl/internal/stats"
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
	Spec        kv.Spec      `mapstructure:"-"`
	DecodeTP    int          `mapstructure:"decode-tp"`
	Requests    int          `mapstructure:"requests"`
	Warmup      int          `mapstructure:"warmup"` // requests run first and left out of the summary; WarmupPoolPass: one pass over the pool
	ISL         ISL          `mapstructure:",squash"`
	Trace       []TraceEntry `mapstructure:"-"`           // arrivals and prompt lengths; overrides ISL and the load
	Rate        float64      `mapstructure:"rate"`        // open loop, requests per second (Poisson); 0 = closed loop
	Concurrency int          `mapstructure:"concurrency"` // closed loop
	// MaxInflight caps an open loop's (or a trace's) requests in flight:
	// an arrival past it waits for one to finish, as behind a router's
	// queue, and is counted. Uncapped, a rate the endpoints could not keep
	// up with grew goroutines and waits without bound.
	MaxInflight   int                  `mapstructure:"max-inflight"`
	PrefixHit     float64              `mapstructure:"prefix-hit"` // fraction of each prompt decode already holds
	Fragmentation engine.Fragmentation `mapstructure:"fragmentation"`
	NoMerge       bool                 `mapstructure:"no-merge"`   // one descriptor per block per region, not merged as NIXL does
	NumBlocks     int                  `mapstructure:"num-blocks"` // per engine; 0 = enough for the workload
	PrefillPerTok time.Duration        `mapstructure:"prefill-time"`
	Lease         time.Duration        `mapstructure:"kv-lease-duration"`
	RegTimeout    time.Duration        `mapstructure:"registration-timeout"` // push watchdog
	// RegWatchdog is what push's registration watchdog does when it
	// fires: fail the request (this bench's default, so that a run ends)
	// or drop the registration and keep waiting (upstream's).
	RegWatchdog engine.WatchdogAction `mapstructure:"registration-watchdog"`
	// PushHeartbeatKeys keys push mode's heartbeats: upstream (they never
	// renew, vLLM #53095) or fixed (they do; not upstream behaviour).
	PushHeartbeatKeys engine.HeartbeatKeys `mapstructure:"push-heartbeat-keys"`
	// AllowUnsupportedTP runs a prefill/decode TP pair that vLLM refuses
	// (kv.VLLMRefusesTP) instead of refusing it as bad input.
	AllowUnsupportedTP bool `mapstructure:"allow-unsupported-tp"`
	ChunkTokens        int  `mapstructure:"chunk-tokens"` // SGLang chunked prefill; 0 = one chunk
	// SGLang's own timeouts, upstream's by default (the CLI reads
	// upstream's environment variables for them): prefill's bootstrap
	// timeout, decode's waiting timeout, and decode's /health heartbeat
	// (interval, failures in a row that give a prefill up).
	SGLBootstrapTimeout     time.Duration `mapstructure:"sglang-bootstrap-timeout"`
	SGLWaitingTimeout       time.Duration `mapstructure:"sglang-waiting-timeout"`
	SGLHeartbeatInterval    time.Duration `mapstructure:"sglang-heartbeat-interval"`
	SGLHeartbeatMaxFailures int           `mapstructure:"sglang-heartbeat-max-failures"`
	// SGLKVDType is SGLang's --kv-cache-dtype string, registered by the
	// prefill and compared by the decode as SGLang does ("auto" unless a
	// peer sets it).
	SGLKVDType string `mapstructure:"sglang-kv-dtype"`
	// Bootstrap is an external SGLang prefill's bootstrap server,
	// http://HOST:PORT: that prefill replaces nixlctl's (sglext.go).
	Bootstrap    string           `mapstructure:"bootstrap"`
	Verify       engine.Verify    `mapstructure:"verify"`
	DRAMAlloc    engine.DRAMAlloc `mapstructure:"dram-alloc"`
	Mem          nixl.MemType     `mapstructure:"mem"`            // where both engines' KV pools live
	Device       int              `mapstructure:"device"`         // prefill's GPU (VRAM)
	DecodeDevice int              `mapstructure:"decode-device"`  // decode's GPU (VRAM)
	XferRef      bool             `mapstructure:"xfer-reference"` // measure bench xfer on the same bytes for efficiency
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
	// NetDevices is UCX_NET_DEVICES for both endpoints (recorded).
	NetDevices string `mapstructure:"net-devices"`
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
		Concurrency: 8, Fragmentation: engine.FragContiguous, Lease: lease.DefaultDuration, RegTimeout: BenchRegTimeout,
		RegWatchdog: engine.WatchdogFail, PushHeartbeatKeys: engine.HBKeysUpstream,
		SGLBootstrapTimeout: engine.SGLDefaultBootstrapTimeout, SGLWaitingTimeout: engine.SGLDefaultWaitingTimeout,
		SGLHeartbeatInterval: engine.SGLDefaultHeartbeatInterval, SGLHeartbeatMaxFailures: engine.SGLDefaultHeartbeatMaxFailures,
		SGLKVDType: engine.SGLDefaultKVCacheDType, Verify: engine.Sparse, DRAMAlloc: engine.AllocMmap, Mem: nixl.DRAM, Seed: 1, Prefills: 1, Decodes: 1, Router: RouterRoundRobin,
		JoinWindow: 60 * time.Second, XferRounds: 8, MaxInflight: DefaultMaxInflight}
}

// DefaultMaxInflight is --max-inflight's default: four times what the
// automatic pools are sized to hold in flight.
const DefaultMaxInflight = 4 * openLoopInflight

// Validate checks the options. Problems with one field are
// errkind.FieldErrors (so the CLI can name the flag), all of them joined
// and marked bad input.
func (o *HandoffOptions) Validate() error {
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
	if !valid(o.Verify, engine.Verifies) {
		bad("Verify", "unknown verify mode %v (want sparse or full)", o.Verify)
	}
	if !o.DRAMAlloc.Valid() {
		bad("DRAMAlloc", "unknown DRAM allocation %q (want mmap or ucx)", o.DRAMAlloc)
	}
	if o.Mem != nixl.DRAM && o.Mem != nixl.VRAM {
		bad("Mem", "unknown memory type %v", o.Mem)
	}
	if o.NumBlocks < 0 {
		bad("NumBlocks", "must not be negative")
	}
	if o.PrefillPerTok < 0 {
		bad("PrefillPerTok", "must not be negative")
	}
	if o.Lease <= 0 {
		bad("Lease", "must be positive")
	}
	if o.RegTimeout <= 0 {
		bad("RegTimeout", "must be positive")
	}
	// Options built without DefaultHandoffOptions get its push defaults.
	o.RegWatchdog = cmpOr(o.RegWatchdog, engine.WatchdogFail)
	o.PushHeartbeatKeys = cmpOr(o.PushHeartbeatKeys, engine.HBKeysUpstream)
	if !o.RegWatchdog.Valid() {
		bad("RegWatchdog", "unknown registration watchdog action %q (want drop or fail)", o.RegWatchdog)
	}
	if !o.PushHeartbeatKeys.Valid() {
		bad("PushHeartbeatKeys", "unknown push heartbeat keys %q (want upstream or fixed)", o.PushHeartbeatKeys)
	}
	if o.NetDevices != "" && !o.remote() && o.Rendezvous == "" {
		// Remote endpoints' devices are their hosts', not this one's.
		if err := checkNetDevices(sysClassRoot, o.NetDevices); err != nil {
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
	o.validateSGL(bad)
	o.validateBootstrap(bad)
	if o.DecodeTP <= 0 {
		bad("DecodeTP", "must be positive")
	} else if o.DecodeTP > kv.MaxParallel {
		// Named here: the decode layout's own error lost its flag.
		bad("DecodeTP", "must be between 1 and %d (got %d)", kv.MaxParallel, o.DecodeTP)
	}
	if err := engine.CheckPP(o.Protocol, o.Spec.PP); err != nil {
		bad("PP", "%d: %v", o.Spec.PP, err)
	}
	if o.validateBounds(bad) {
		o.resolveEngines(func(err error) { errs = append(errs, err) }, bad)
		o.validateLocalEngines(bad)
	}
	if o.Inproc && o.remote() {
		bad("Inproc", "excludes remote endpoints (prefill and decode addresses)")
	}
	if o.Router != "" && !valid(o.Router, Routers) {
		bad("Router", "unknown router %q (want round-robin or least-loaded)", o.Router)
	}
	if o.OnEndpointDeath != "" && !valid(o.OnEndpointDeath, DeathPolicies) {
		bad("OnEndpointDeath", "unknown policy %q (want stop or drain)", o.OnEndpointDeath)
	}
	if o.XferTarget != "" {
		if err := checkAddr(o.XferTarget); err != nil {
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
		if err := o.checkPoolMemory(hostMemRoom()); err != nil {
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
			per += blockBytesAllRanks(spec, s.TP)
		}
	}
	return per
}

// checkPoolMemory refuses, before anything starts, KV pools this host
// cannot hold: --num-blocks as asked (1 Ti blocks ran the driver out of
// memory), or, when the pools are sized for the workload, one request of
// its longest prompt (the run cuts automatic pools to fit, down to that).
func (o *HandoffOptions) checkPoolMemory(room memRoom) error {
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
		if !room.fits(int64(o.NumBlocks), per) {
			return errkind.Field("NumBlocks", "%d blocks per engine do not fit on this host: %s",
				o.NumBlocks, room.need(int64(o.NumBlocks), per, what))
		}
		return nil
	}
	// RunHandoff cuts automatic pools to half of what is available: the
	// same half must hold one request, or every request would fail.
	t := *o
	t.usesTrace()
	n := int64(t.blocksPerRequest())
	if (room / 2).fits(n, per) {
		return nil
	}
	msg := fmt.Sprintf("one request of %d tokens does not fit on this host: %s (automatic pools take at most half)",
		t.longestPrompt(), room.need(n, per, what))
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
	if o.Requests > MaxRequests {
		bad("Requests", "%d: at most %d", o.Requests, MaxRequests)
	}
	if o.Warmup > MaxRequests {
		bad("Warmup", "%d: at most %d", o.Warmup, MaxRequests)
	}
	if len(o.Trace) > 0 && o.Warmup >= len(o.Trace) {
		bad("Warmup", "%d: the trace has %d requests, so none would be measured", o.Warmup, len(o.Trace))
	}
	if o.MaxInflight < 0 || o.MaxInflight > MaxConcurrency {
		bad("MaxInflight", "%d: want 1 to %d requests in flight", o.MaxInflight, MaxConcurrency)
	}
	if o.Concurrency > MaxConcurrency {
		bad("Concurrency", "%d: at most %d requests in flight", o.Concurrency, MaxConcurrency)
	}
	for _, c := range []struct {
		field string
		n     int
	}{{"Prefills", o.Prefills}, {"Decodes", o.Decodes}} {
		if c.n > MaxEngines {
			bad(c.field, "%d: at most %d engines", c.n, MaxEngines)
			enginesOK = false
		}
	}
	if len(o.Trace) == 0 && o.Rate > 0 && o.Requests > 0 && o.Requests <= MaxRequests {
		// An arrival past a Duration's range wrapped and fired at once.
		n := o.Requests + max(o.Warmup, 0)
		if secs := float64(n) / o.Rate; secs > MaxRunTime.Seconds() {
			bad("Rate", "%g: %d requests at this rate arrive over about %.3g s; a run may last at most %v", o.Rate, n, secs, MaxRunTime)
		}
	}
	if o.PrefillPerTok > 0 {
		t := *o
		t.usesTrace()
		if longest := t.longestPrompt(); longest > 0 && o.PrefillPerTok > MaxPrefillTime/time.Duration(longest) {
			bad("PrefillPerTok", "%v per token: the longest prompt (%d tokens) would take %.3g s to prefill; at most %v a request",
				o.PrefillPerTok, longest, o.PrefillPerTok.Seconds()*float64(longest), MaxPrefillTime)
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
	if local <= MaxLocalEngines {
		return
	}
	switch {
	case o.Topology != "":
		bad("Topology", "%d engines would run on this host; at most %d", local, MaxLocalEngines)
	case o.Decodes > o.Prefills:
		bad("Decodes", "%d with --prefills %d: %d engines would run on this host; at most %d", o.Decodes, max(o.Prefills, 1), local, MaxLocalEngines)
	default:
		bad("Prefills", "%d with --decodes %d: %d engines would run on this host; at most %d", o.Prefills, max(o.Decodes, 1), local, MaxLocalEngines)
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
	}{{"ChunkTokens", o.ChunkTokens > 0}, {"PrefillPerTok", o.PrefillPerTok > 0}, {"PrefixHit", o.PrefixHit > 0}, {"XferRef", o.XferRef}} {
		if c.set {
			bad(c.field, "not with --bootstrap: it shapes nixlctl's own prefill; the external SGLang prefill chunks, computes and caches by itself")
		}
	}
}

// validateSGL checks SGLang's timeouts; options built without
// DefaultHandoffOptions get upstream's.
func (o *HandoffOptions) validateSGL(bad func(field, format string, a ...any)) {
	if o.Protocol != engine.ProtoSGLang {
		return
	}
	o.SGLBootstrapTimeout = cmpOr(o.SGLBootstrapTimeout, engine.SGLDefaultBootstrapTimeout)
	o.SGLWaitingTimeout = cmpOr(o.SGLWaitingTimeout, engine.SGLDefaultWaitingTimeout)
	o.SGLHeartbeatInterval = cmpOr(o.SGLHeartbeatInterval, engine.SGLDefaultHeartbeatInterval)
	o.SGLHeartbeatMaxFailures = cmpOr(o.SGLHeartbeatMaxFailures, engine.SGLDefaultHeartbeatMaxFailures)
	o.SGLKVDType = cmpOr(o.SGLKVDType, engine.SGLDefaultKVCacheDType)
	if strings.TrimSpace(o.SGLKVDType) != o.SGLKVDType {
		bad("SGLKVDType", "%q has surrounding spaces: SGLang compares the strings exactly", o.SGLKVDType)
	}
	if o.SGLBootstrapTimeout < 0 {
		bad("SGLBootstrapTimeout", "must be positive")
	}
	if o.SGLWaitingTimeout < 0 {
		bad("SGLWaitingTimeout", "must be positive")
	}
	// SGLang's decode raises smaller settings to these floors; a flag
	// that asks for less would be silently changed, so it is refused.
	if o.SGLHeartbeatInterval < engine.SGLMinHeartbeatInterval {
		bad("SGLHeartbeatInterval", "%v is below SGLang's floor of %v", o.SGLHeartbeatInterval, engine.SGLMinHeartbeatInterval)
	}
	if o.SGLHeartbeatMaxFailures < 1 {
		bad("SGLHeartbeatMaxFailures", "must be at least 1")
	}
}

// BenchRegTimeout is the bench's registration timeout by default, shorter
// than upstream's 480 s (engine.DefaultRegTimeout) so that a run whose
// requests lose their KV ends in minutes.
const BenchRegTimeout = 60 * time.Second

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
		if o.RegWatchdog != engine.WatchdogDrop || o.RegTimeout != engine.DefaultRegTimeout {
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

func valid[T comparable](v T, all []T) bool {
	for _, x := range all {
		if x == v {
			return true
		}
	}
	return false
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
		BlockSize: spec.BlockSize, Layout: spec.Layout, Order: spec.Order, PP: spec.PP, NumBlocks: numBlocks, DRAMAlloc: o.DRAMAlloc,
		Scattered: o.Fragmentation == engine.FragScattered, Merge: !o.NoMerge, Verify: o.Verify, Lease: o.Lease,
		RegTimeout: o.RegTimeout, RegWatchdog: o.RegWatchdog, PushHeartbeatKeys: o.PushHeartbeatKeys, PrefillPerToken: o.PrefillPerTok, Mem: o.Mem,
		CompatFactors: o.compatFactors, CompatHashHex: o.CompatHash, NoCompatCheck: o.NoCompatCheck, NetDevices: o.NetDevices,
		SGLBootstrapTimeout: o.SGLBootstrapTimeout, SGLWaitingTimeout: o.SGLWaitingTimeout,
		SGLHeartbeatInterval: o.SGLHeartbeatInterval, SGLHeartbeatMaxFailures: o.SGLHeartbeatMaxFailures, SGLKVCacheDType: o.SGLKVDType}
	switch role {
	case engine.RolePrefill:
		c.TP, c.EngineID, c.Device, c.Seed = spec.TP, "prefill-0", o.Device, o.Seed
	case engine.RoleDecode:
		c.TP, c.EngineID, c.Device, c.Seed = o.DecodeTP, "decode-0", o.DecodeDevice, o.Seed+1
	}
	return c
}

// HandoffConfig is what a handoff result says was asked: the options as
// run, under the JSON names results have always used.
type HandoffConfig struct {
	Protocol  engine.Protocol `json:"protocol"`
	Model     string          `json:"model"`
	KVDType   kv.DType        `json:"kv_dtype"`
	BlockSize int             `json:"block_size"`
	Layout    kv.AttnLayout   `json:"layout"`
	Order     kv.CacheOrder   `json:"kv_cache_layout"`
	PrefillTP int             `json:"prefill_tp"`
	DecodeTP  int             `json:"decode_tp"`
	// PP is both sides' pipeline stages (absent: 1).
	PP       int `json:"pp,omitempty"`
	Requests int `json:"requests"`
	Warmup   int `json:"warmup"`
	// Seed is --seed: with the options above it draws the same prompt
	// lengths, arrivals and blocks again. A pointer so that a seed of 0
	// is written while results from before it read back without one.
	Seed        *uint64 `json:"seed,omitempty"`
	ISL         ISL     `json:"isl"`
	Rate        float64 `json:"rate"`
	Concurrency int     `json:"concurrency"`
	// MaxInflight is an open loop's cap on requests in flight (absent for
	// a closed loop).
	MaxInflight   int                  `json:"max_inflight,omitempty"`
	PrefixHit     float64              `json:"prefix_hit"`
	Fragmentation engine.Fragmentation `json:"fragmentation"`
	Merge         bool                 `json:"merge_descriptors"`
	NumBlocks     int                  `json:"num_blocks"`
	// PoolSizedFor says what the automatic pools were sized for (the
	// workload: requests in flight and the longest prompt), or
	// "--num-blocks".
	PoolSizedFor    string   `json:"pool_sized_for,omitempty"`
	PrefillPerToken Duration `json:"prefill_time_per_token"`
	Lease           Duration `json:"lease"`
	RegTimeout      Duration `json:"registration_timeout,omitempty"`
	// Push: what the registration watchdog did when it fired, and what
	// heartbeats were keyed by (upstream: they never renew, vLLM #53095).
	RegWatchdog       engine.WatchdogAction `json:"registration_watchdog,omitempty"`
	PushHeartbeatKeys engine.HeartbeatKeys  `json:"push_heartbeat_keys,omitempty"`
	// UnsupportedTP: the TP pairs vLLM refuses that the run measured
	// anyway (--allow-unsupported-tp), with vLLM's reason.
	UnsupportedTP []string `json:"unsupported_tp,omitempty"`
	ChunkTokens   int      `json:"chunk_tokens"`
	// SGLang's timeouts and decode's /health heartbeat.
	SGLBootstrapTimeout     Duration         `json:"sglang_bootstrap_timeout,omitempty"`
	SGLWaitingTimeout       Duration         `json:"sglang_waiting_timeout,omitempty"`
	SGLHeartbeatInterval    Duration         `json:"sglang_heartbeat_interval,omitempty"`
	SGLHeartbeatMaxFailures int              `json:"sglang_heartbeat_max_failures,omitempty"`
	SGLKVDType              string           `json:"sglang_kv_cache_dtype,omitempty"`
	SGLBootstrap            string           `json:"sglang_bootstrap,omitempty"` // an external SGLang prefill's
	Verify                  engine.Verify    `json:"verify"`
	DRAMAlloc               engine.DRAMAlloc `json:"dram_alloc"`
	Mem                     string           `json:"mem"`
	Endpoints               string           `json:"endpoints"`
	PoolBytesPerEngine      int64            `json:"pool_bytes_per_engine"`
	Alloc                   string           `json:"alloc"`
	XferReference           *XferReference   `json:"xfer_reference,omitempty"`
	// CompatHash is the vLLM compatibility hash the endpoints advertised
	// (from --compat-factors, --compat-hash or derived); NoCompatCheck
	// that they accepted any peer's.
	CompatHash    string `json:"compat_hash,omitempty"`
	NoCompatCheck bool   `json:"no_compat_check,omitempty"`
	// NetDevices is --net-devices: UCX_NET_DEVICES at both endpoints.
	NetDevices string `json:"net_devices,omitempty"`
	// An xPyD run's engines (addr "local" for a child of the driver) and
	// its router; absent with one prefill and one decode.
	PrefillEngines []EngineSlot `json:"prefill_engines,omitempty"`
	DecodeEngines  []EngineSlot `json:"decode_engines,omitempty"`
	Router         Router       `json:"router,omitempty"`
	// OnEndpointDeath is "drain" when the run went on past a dead
	// endpoint (absent: it stops there).
	OnEndpointDeath DeathPolicy `json:"on_endpoint_death,omitempty"`
	// Rendezvous says how the engines were found, when they registered.
	Rendezvous *RendezvousInfo `json:"rendezvous,omitempty"`
}

// XferReference is the `bench xfer` point a handoff compared itself with.
type XferReference struct {
	Op            string `json:"op"`
	BlockSize     int    `json:"block_size"`
	BatchSize     int    `json:"batch_size"`
	PipelineDepth int    `json:"pipeline_depth"`
	Iterations    int    `json:"iterations,omitempty"` // after the run; rounds size each to their handoff round's bytes
	// Rounds and RoundRequests say the reference ran in rounds between
	// the handoff's, of this many requests each (absent: once, after the
	// whole run).
	Rounds        int `json:"rounds,omitempty"`
	RoundRequests int `json:"round_requests,omitempty"`
	// Limit names the host-limit reference measured in the same rounds,
	// when there was one.
	Limit string `json:"limit,omitempty"`
	// Polling is how the reference waited for its requests: "paced", as
	// the endpoints wait (XferOptions.Paced); absent in results from
	// before it, whose reference spun.
	Polling string `json:"polling,omitempty"`
}

// Duration is a time.Duration written as Go writes it ("30s"), as results
// always had it.
type Duration time.Duration

func (d Duration) String() string               { return time.Duration(d).String() }
func (d Duration) MarshalText() ([]byte, error) { return []byte(d.String()), nil }

// UnmarshalText reads a Go duration ("30s", "1m0s").
func (d *Duration) UnmarshalText(b []byte) error {
	v, err := time.ParseDuration(string(b))
	*d = Duration(v)
	return err
}

// config echoes the options a run used (numBlocks being its pool size).
func (o *HandoffOptions) config(numBlocks int) HandoffConfig {
	s := o.Spec
	c := HandoffConfig{Protocol: o.Protocol, Model: s.Model.Name, KVDType: s.DType, BlockSize: s.BlockSize, Layout: s.Layout,
		Order: s.Order, PrefillTP: s.TP, DecodeTP: o.DecodeTP, PP: ppOrOmit(s.PP), Requests: o.Requests, Warmup: o.Warmup, Seed: new(o.Seed), ISL: o.ISL, Rate: o.Rate,
		Concurrency: o.Concurrency, MaxInflight: o.openLoopCap(), PrefixHit: o.PrefixHit, Fragmentation: o.Fragmentation, Merge: !o.NoMerge, NumBlocks: numBlocks,
		PrefillPerToken: Duration(o.PrefillPerTok), Lease: Duration(o.Lease), RegTimeout: Duration(o.RegTimeout),
		ChunkTokens: o.ChunkTokens, Verify: o.Verify, DRAMAlloc: o.DRAMAlloc, Mem: o.Mem.String(), Endpoints: "process",
		NetDevices: o.NetDevices, UnsupportedTP: o.unsupportedTP()}
	if len(o.Trace) > 0 {
		// The trace's requests ran, not --requests (32 by default).
		c.Requests = len(o.Trace) - max(o.Warmup, 0)
	}
	switch o.Protocol {
	case engine.ProtoPush:
		c.RegWatchdog, c.PushHeartbeatKeys = o.RegWatchdog, o.PushHeartbeatKeys
	case engine.ProtoSGLang:
		c.RegTimeout = 0 // push's
		c.SGLBootstrapTimeout, c.SGLWaitingTimeout = Duration(o.SGLBootstrapTimeout), Duration(o.SGLWaitingTimeout)
		c.SGLHeartbeatInterval, c.SGLHeartbeatMaxFailures = Duration(o.SGLHeartbeatInterval), o.SGLHeartbeatMaxFailures
		c.SGLKVDType, c.SGLBootstrap = o.SGLKVDType, o.Bootstrap
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

// HandoffRecord is one request, as written to --records. Durations are
// milliseconds; stages that do not apply to the protocol are zero.
type HandoffRecord struct {
	Index   int    `json:"index"`
	ID      string `json:"id"`
	Prefill int    `json:"prefill,omitempty"` // the engines the router picked (xPyD)
	Decode  int    `json:"decode,omitempty"`
	Warmup  bool   `json:"warmup,omitempty"`
	// Round is the interleaved reference's round the request ran in
	// (0-based; --xfer-reference in a closed loop).
	Round          int                `json:"round,omitempty"`
	ISL            int                `json:"isl"`
	PrefixTokens   int                `json:"prefix_tokens"`
	Blocks         int                `json:"blocks"`
	Descriptors    int                `json:"descriptors"`
	LogicalDescs   int                `json:"logical_descriptors"`
	Bytes          int64              `json:"bytes"`
	FirstHandshake bool               `json:"first_handshake"`
	HandshakeMS    float64            `json:"handshake_ms"`
	RegRTTMS       float64            `json:"registration_rtt_ms,omitempty"` // push: registration sent -> matched at prefill
	FinishToPostMS float64            `json:"finish_to_post_ms"`             // KV ready -> transfer posted
	PostMS         float64            `json:"post_ms"`
	TransferMS     float64            `json:"transfer_ms"`            // posted -> data in place
	CompletionMS   float64            `json:"completion_to_ready_ms"` // data in place -> decode knows
	HandoffMS      float64            `json:"handoff_ms"`             // KV ready at prefill -> decode ready
	PrefillMS      float64            `json:"prefill_ms"`
	CorruptBlocks  int                `json:"corrupt_blocks"`
	Error          string             `json:"error,omitempty"`
	Freed          engine.FreedReason `json:"prefill_freed,omitempty"` // why prefill released the blocks
	TStart         int64              `json:"t_start"`
	TFinish        int64              `json:"t_finish"`
	TReady         int64              `json:"t_ready"`

	// push: decode's side of the stages prefill's release completes.
	tRegSent, tXferDone int64
}

// applyPushFreed fills a push record's WRITE stages from prefill's
// release of the request (the WRITE is prefill's).
func (r *HandoffRecord) applyPushFreed(f engine.FreedEvent) {
	r.Descriptors, r.LogicalDescs, r.Bytes = f.Descriptors, f.LogicalDescs, f.Bytes
	r.RegRTTMS = stageMS(r.tRegSent, f.TRegReceived)
	r.FinishToPostMS = stageMS(r.TFinish, f.TPostStart)
	r.PostMS = stageMS(f.TPostStart, f.TPostEnd)
	// Both ends on prefill's clock: its agent saw the WRITE posted and
	// done. Decode's notification stamp may come before prefill's own
	// view of the post's end (UCX's progress thread finishes first), and
	// subtracting across processes assumes one clock.
	r.TransferMS = stageMS(f.TPostEnd, f.TWriteDone)
}

// stageMS is the milliseconds from a to b, monotonic nanoseconds; 0 when
// either stamp is missing (a stage the protocol does not have). A stage
// whose end comes before its start is returned negative, never clamped:
// the summary counts it and the run warns (clocks that disagree, or a
// stamp taken on the wrong side).
func stageMS(a, b int64) float64 {
	if a == 0 || b == 0 {
		return 0
	}
	return float64(b-a) / 1e6
}

// HandoffSummary is the headline of a run (fields named in the issue stay
// where scripts read them).
type HandoffSummary struct {
	Requests          int                `json:"requests"`
	Failed            int                `json:"failed"`
	CorruptBlocks     int                `json:"corrupt_blocks"`
	Bytes             int64              `json:"bytes"`
	Seconds           float64            `json:"seconds"`
	BandwidthGBps     float64            `json:"bandwidth_gbps"`
	RequestsPerS      float64            `json:"requests_per_s"`
	HandoffLatencyMS  report.Percentiles `json:"handoff_latency_ms"`
	TransferMS        report.Percentiles `json:"transfer_ms"`
	PostMS            report.Percentiles `json:"post_ms"`
	FinishToPostMS    report.Percentiles `json:"finish_to_post_ms"`
	CompletionMS      report.Percentiles `json:"completion_to_ready_ms"`
	RegRTTMS          report.Percentiles `json:"registration_rtt_ms"`
	FirstHandshakeMS  float64            `json:"first_handshake_ms"`
	SteadyHandshakeMS float64            `json:"steady_handshake_ms"`
	DescriptorsPerReq float64            `json:"descriptors_per_request"`
	LogicalDescsReq   float64            `json:"logical_descriptors_per_request"`
	BytesPerRequest   float64            `json:"bytes_per_request"`
	TransferGBps      float64            `json:"transfer_gbps_p50"` // one request's bytes / its post + transfer time, median
	MemcpyGBps        float64            `json:"memcpy_gbps"`
	EfficiencyMemcpy  float64            `json:"efficiency_vs_memcpy"`
	XferGBps          float64            `json:"xfer_gbps,omitempty"`
	EfficiencyXfer    float64            `json:"efficiency_vs_xfer,omitempty"`
	// EfficiencyXferSpread is the per-round ratio's spread when the
	// reference ran in rounds beside the handoff's (EfficiencyXfer is then
	// its median, XferGBps the rounds' median rate).
	EfficiencyXferSpread *report.Spread `json:"efficiency_vs_xfer_spread,omitempty"`
	// LimitGBps is the median rate of the same transfers between
	// UCX-allocated shared memory, measured in the same rounds: the
	// fastest path UCX offers two processes on this host. EfficiencyLimit
	// is the median of the rounds' handoff / limit.
	LimitGBps       float64     `json:"limit_gbps,omitempty"`
	EfficiencyLimit float64     `json:"efficiency_vs_limit,omitempty"`
	Rounds          []XferRound `json:"xfer_rounds,omitempty"`
	LeakedBlocks    int64       `json:"leaked_blocks"`
	// StallMS is the longest stretch in which a request was in flight
	// and none finished, when it was a stall (stall.go): at least a
	// second and 20 median requests long; absent otherwise.
	StallMS float64 `json:"stall_ms,omitempty"`
	// ArrivalsDelayed counts an open loop's arrivals that found
	// --max-inflight requests in flight and waited for one to finish; the
	// wait is not in their latencies.
	ArrivalsDelayed int `json:"arrivals_delayed,omitempty"`
	// NegativeStages counts, per stage, the requests whose stage ended
	// before it started by the stamps (left out of that stage's
	// histogram): clocks that disagree, or a stamp on the wrong side.
	NegativeStages map[string]int `json:"negative_stages,omitempty"`
	// FailuresByReason counts the failed requests by what failed them
	// (their errors with ids and numbers folded, or "corrupt blocks").
	FailuresByReason map[string]int `json:"failures_by_reason,omitempty"`
	// FailureExamples holds, per reason of FailuresByReason, the first
	// failed request's whole error: the folded reason keeps the count
	// readable, the example keeps the address and the error that point to
	// the cause.
	FailureExamples map[string]string `json:"failure_examples,omitempty"`
	Histogram       string            `json:"handoff_histogram,omitempty"`
	// StageHistograms holds the other stages' histograms (same encoding,
	// nanoseconds), keyed by their summary field: "transfer_ms", "post_ms",
	// "finish_to_post_ms", "completion_to_ready_ms", "registration_rtt_ms".
	StageHistograms map[string]string `json:"stage_histograms,omitempty"`
	// Pairs are an xPyD run's (prefill, decode) pairs, prefill-major
	// (SummarizePairs); absent with one of each.
	Pairs []PairSummary `json:"pairs,omitempty"`
}

// HandoffResult is the whole run.
type HandoffResult struct {
	report.Meta
	Protocol string         `json:"protocol"`
	Backend  string         `json:"backend"`
	Model    string         `json:"model"`
	Config   HandoffConfig  `json:"config"`
	Summary  HandoffSummary `json:"summary"`
	// Prefill and Decode are the engines' counters, summed over the
	// engines of an xPyD run, which PrefillEngines and DecodeEngines keep
	// one by one.
	Prefill        engine.Stats      `json:"prefill_stats"`
	Decode         engine.Stats      `json:"decode_stats"`
	PrefillEngines []engine.Stats    `json:"prefill_engine_stats,omitempty"`
	DecodeEngines  []engine.Stats    `json:"decode_engine_stats,omitempty"`
	Transports     map[string]string `json:"transports,omitempty"`
	// NetPath says which devices carried the payload at prefill (tx) and
	// decode (rx).
	NetPath NetPath `json:"net_path,omitempty"`
	// Endpoints says where prefill and decode ran and how their clocks
	// were related to the driver's; Placement whether they shared a host.
	Endpoints   []EndpointInfo `json:"endpoints,omitempty"`
	Placement   string         `json:"placement,omitempty"`
	Interrupted bool           `json:"interrupted,omitempty"`
	// HostCPU says how steady the host's CPU speed was: readings of a
	// fixed loop before, between the rounds of, and after the timed phase.
	HostCPU *cpuspeed.Summary `json:"host_cpu,omitempty"`
	// EndpointDied names the endpoint that died during the timed phase and
	// how ("decode: signal: killed"); the run stopped there.
	EndpointDied string          `json:"endpoint_died,omitempty"`
	Records      []HandoffRecord `json:"-"`
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

type handoff struct {
	o        *HandoffOptions
	pes, des []*Endpoint
	psetups  []engine.SetupReply
	dtp      []int // each decode's TP
	router   *router
	// arrivalsDelayed counts open-loop arrivals that waited for a slot
	// (--max-inflight); only the dispatching goroutine touches it.
	arrivalsDelayed int
	mu              sync.Mutex
	records         []HandoffRecord
	freed           map[string]engine.FreedEvent // by router id
	waiting         map[string]chan engine.FreedEvent
	start           int64
	end             int64
	// rounds, when set, interleaves the bench xfer reference with the
	// closed loop's requests, a round at a time.
	rounds *interleave
	cpuMu  sync.Mutex
	cpu    []cpuspeed.Reading
	// unstreamed holds the finished requests whose records wait for
	// prefill's release before they are streamed (o.Records): their
	// position in records, by router id.
	unstreamed map[string]int
	// lost is told, by the request that found it, that an engine's
	// control channel is gone: its watcher would say so too, but a
	// closed loop can fail hundreds of requests on the dead engine
	// before the watcher runs (pull sent 300 in one run).
	lost func(role string, idx int)
}

// readCPU takes a reading of the host's CPU speed (cpuspeed), while no
// request is in flight.
func (h *handoff) readCPU() {
	r, err := cpuspeed.Measure()
	if err != nil {
		h.o.Log.Debug("cpu speed reading", "err", err)
		return
	}
	h.cpuMu.Lock()
	h.cpu = append(h.cpu, r)
	h.cpuMu.Unlock()
}

func (h *handoff) cpuReadings() []cpuspeed.Reading {
	h.cpuMu.Lock()
	defer h.cpuMu.Unlock()
	return slices.Clone(h.cpu)
}

// roundOf is request i's round of the interleaved reference (0 without
// rounds, and for the warm-up).
func (h *handoff) roundOf(i int) int {
	if h.rounds == nil || i < h.o.Warmup {
		return 0
	}
	return (i - h.o.Warmup) / h.rounds.size
}

// finished streams request i's record (o.Records) when it is final, else
// leaves it in unstreamed until collectFreed or streamRest does. A record
// is final once prefill's release of its blocks is known, since that fills
// the release reason and, for a push whose release came late, the WRITE
// stages (applyFreed). Streaming the final record, rather than streaming
// at once and appending a fix-up line for readers to merge, keeps the file
// one line per request, which every reader (older nixlctl included)
// already counts right; the price is that a kill loses the few records
// still waiting for their release. SGLang's prefill reports no releases,
// so its records are final when their requests finish.
func (h *handoff) finished(i int) {
	if h.o.Records == nil {
		return
	}
	h.mu.Lock()
	r := &h.records[i]
	f, ok := h.freed[r.ID]
	switch {
	case ok:
		h.applyFreed(r, f)
	case h.o.Protocol != engine.ProtoSGLang: // SGLang's prefill reports no releases: final now
		h.unstreamed[r.ID] = i
		h.mu.Unlock()
		return
	}
	rec := *r
	h.mu.Unlock()
	_ = h.o.Records.Record(rec)
}

// streamRest streams the records still waiting for a release at the end
// of the run, as drainFreed left them (final now), in request order.
func (h *handoff) streamRest() {
	if h.o.Records == nil {
		return
	}
	h.mu.Lock()
	pos := make([]int, 0, len(h.unstreamed))
	for _, i := range h.unstreamed {
		pos = append(pos, i)
	}
	clear(h.unstreamed)
	sort.Ints(pos)
	recs := make([]HandoffRecord, len(pos))
	for k, i := range pos {
		recs[k] = h.records[i]
	}
	h.mu.Unlock()
	for _, r := range recs {
		_ = h.o.Records.Record(r)
	}
}

// applyFreed completes a finished request's record with prefill's release
// of its blocks. Applying it twice changes nothing.
func (h *handoff) applyFreed(r *HandoffRecord, f engine.FreedEvent) {
	r.Freed = engine.FreedReason(f.Reason)
	// A push whose release came after the request's own short wait gets
	// its WRITE stages now.
	if h.o.Protocol == engine.ProtoPush && r.Error == "" && r.Bytes == 0 && f.Bytes > 0 {
		r.applyPushFreed(f)
	}
}

// collectFreed reads one prefill's releases (every request id is the
// run's own, so one map serves every prefill).
func (h *handoff) collectFreed(pe *Endpoint) {
	forEachEvent(pe, func(ev ctl.Event) {
		if ev.Name != "freed" {
			return
		}
		var f engine.FreedEvent
		if json.Unmarshal(ev.Data, &f) != nil {
			return
		}
		f.OnClock(pe.toDriver)
		h.mu.Lock()
		h.freed[f.RouterID] = f
		ch := h.waiting[f.RouterID]
		delete(h.waiting, f.RouterID)
		var final *HandoffRecord // a finished record this release completes
		if i, ok := h.unstreamed[f.RouterID]; ok {
			delete(h.unstreamed, f.RouterID)
			h.applyFreed(&h.records[i], f)
			rec := h.records[i]
			final = &rec
		}
		h.mu.Unlock()
		if ch != nil {
			ch <- f
		}
		if final != nil {
			_ = h.o.Records.Record(*final)
		}
	})
}

// waitFreed waits (bounded) for prefill to report a request's release.
func (h *handoff) waitFreed(ctx context.Context, id string, d time.Duration) (engine.FreedEvent, bool) {
	h.mu.Lock()
	if f, ok := h.freed[id]; ok {
		h.mu.Unlock()
		return f, true
	}
	ch := make(chan engine.FreedEvent, 1)
	h.waiting[id] = ch
	h.mu.Unlock()
	select {
	case f := <-ch:
		return f, true
	case <-ctx.Done():
		// The run stopped: drainFreed applies what still comes.
	case <-time.After(d):
	}
	h.mu.Lock()
	delete(h.waiting, id)
	h.mu.Unlock()
	return engine.FreedEvent{}, false
}

// drainFreed waits up to d for vLLM prefill's release of every request
// that did not fail, and applies the releases to the records. SGLang's
// prefill reports no releases (its blocks go back when the transfer
// ends): waiting for them cost every SGLang run the whole 2 s.
func (h *handoff) drainFreed(d time.Duration) {
	if h.o.Protocol == engine.ProtoSGLang {
		return
	}
	deadline := time.Now().Add(d)
	for time.Now().Before(deadline) {
		h.mu.Lock()
		all := true
		for i := range h.records {
			if _, ok := h.freed[h.records[i].ID]; !ok && h.records[i].Error == "" {
				all = false
			}
		}
		h.mu.Unlock()
		if all {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	for i := range h.records {
		r := &h.records[i]
		if f, ok := h.freed[r.ID]; ok {
			h.applyFreed(r, f)
		}
	}
}

func (h *handoff) run(ctx context.Context) error {
	o := h.o
	rng := rand.New(rand.NewPCG(o.Seed, 0x15e))
	n := o.Requests + o.Warmup
	isls := make([]int, n)
	var arrivals []time.Duration
	if len(o.Trace) > 0 {
		n = len(o.Trace)
		isls = make([]int, n)
		arrivals = make([]time.Duration, n)
		for i, e := range o.Trace {
			isls[i], arrivals[i] = e.ISL, time.Duration(e.Arrival*float64(time.Second))
		}
	} else {
		for i := range isls {
			isls[i] = o.ISL.Draw(rng)
		}
		if o.Rate > 0 {
			arrivals = Arrivals(n, o.Rate, rng)
		}
	}
	h.records = make([]HandoffRecord, n)
	h.start = mono.Now()
	live.Emit(o.Live, live.Start{Title: "bench " + o.Protocol.String(), Total: n, Unit: "requests"})
	live.Emit(o.Live, live.Phase{Text: "measuring"})
	var wg sync.WaitGroup
	var firstErr error
	var errMu sync.Mutex
	runOne := func(i int) {
		defer wg.Done()
		p, d, ok := h.router.pick()
		if !ok {
			// Drained: no pair of live engines is left; the watcher ends
			// the run, and this request was never sent.
			return
		}
		r := h.one(ctx, i, isls[i], p, d)
		if r.Error != "" && h.lost != nil {
			// Before the next request goes out: an engine whose channel
			// is gone ends the run (or is drained) now.
			if h.pes[p].rpc.Lost() {
				h.lost("prefill", p)
			}
			if h.des[d].rpc.Lost() {
				h.lost("decode", d)
			}
		}
		h.router.done(p, d)
		var death *endpointDeath
		if r.Error != "" && errors.As(context.Cause(ctx), &death) {
			r.Error = "stopped: " + death.Error() // not the context's "canceled"
		}
		r.Warmup = i < o.Warmup
		r.Round = h.roundOf(i)
		h.mu.Lock()
		h.records[i] = r
		h.mu.Unlock()
		h.finished(i)
		live.Emit(o.Live, live.Request{Bytes: r.Bytes, Latency: time.Duration(r.HandoffMS * 1e6),
			OK: r.Error == "" && r.CorruptBlocks == 0, Warmup: r.Warmup})
		if r.Error != "" && ctx.Err() != nil {
			errMu.Lock()
			firstErr = ctx.Err()
			errMu.Unlock()
		}
	}
	if arrivals != nil { // open loop
		t0 := time.Now()
		slots := make(chan struct{}, o.openLoopCap())
		for i := 0; i < n && ctx.Err() == nil; i++ {
			if d := time.Until(t0.Add(arrivals[i])); d > 0 {
				select {
				case <-time.After(d):
				case <-ctx.Done():
				}
			}
			select {
			case slots <- struct{}{}:
			default:
				h.arrivalsDelayed++
				select {
				case slots <- struct{}{}:
				case <-ctx.Done():
				}
			}
			if ctx.Err() != nil {
				break
			}
			wg.Add(1)
			go func() {
				defer func() { <-slots }()
				runOne(i)
			}()
		}
	} else { // closed loop
		next := make(chan int)
		for w := 0; w < min(o.Concurrency, n); w++ { // no idle workers past the requests
			go func() {
				for i := range next {
					runOne(i)
				}
			}()
		}
		for i := 0; i < n; i++ {
			if o.Warmup > 0 && i == o.Warmup {
				wg.Wait() // warm-up first, alone
			}
			if h.rounds != nil && i > o.Warmup && h.roundOf(i) != h.roundOf(i-1) {
				wg.Wait() // the round's requests are done: its reference runs alone
				h.rounds.between(ctx, h.roundOf(i-1))
			}
			wg.Add(1)
			select {
			case next <- i:
			case <-ctx.Done():
				wg.Done()
			}
			if ctx.Err() != nil {
				break
			}
		}
		close(next)
	}
	wg.Wait()
	if h.rounds != nil && arrivals == nil && n > o.Warmup {
		h.rounds.between(ctx, h.roundOf(n-1))
	}
	h.end = mono.Now()
	h.mu.Lock()
	kept := h.records[:0]
	for _, r := range h.records {
		if r.ID != "" {
			kept = append(kept, r)
		}
	}
	h.records = kept
	// The records waiting to be streamed moved with the compaction.
	for pos, r := range h.records {
		if _, ok := h.unstreamed[r.ID]; ok {
			h.unstreamed[r.ID] = pos
		}
	}
	h.mu.Unlock()
	if ctx.Err() != nil {
		return ctx.Err()
	}
	return firstErr
}

// settlePrefill polls prefill's stats until the calls the run gave up on
// have returned (up to busy), then until its blocks are back (up to the
// lease and a second, at most 6 s), and returns the last stats.
func settlePrefill(ctx context.Context, pe *Endpoint, lease, busy time.Duration) (engine.Stats, error) {
	busyEnd := time.Now().Add(busy)
	var settle time.Time
	var last engine.Stats
	for {
		// A fresh struct each time: Stats leaves zero counters out
		// (in_flight is omitempty), so decoding into the last answer
		// would keep its in_flight once the calls are done, and the wait
		// would run to busyEnd whatever prefill says.
		var st engine.Stats
		if err := pe.rpc.Call(ctx, "stats", nil, &st); err != nil {
			return last, err
		}
		last = st
		if st.InFlight > 0 && time.Now().Before(busyEnd) {
			time.Sleep(50 * time.Millisecond)
			continue
		}
		if settle.IsZero() {
			settle = time.Now().Add(min(lease, 5*time.Second) + time.Second)
		}
		if st.BlocksInUse == 0 || time.Now().After(settle) {
			return st, nil
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// one runs one request through the protocol, as the router would.
func (h *handoff) one(ctx context.Context, i, isl, p, d int) HandoffRecord {
	o := h.o
	pe, de, psetup := h.pes[p], h.des[d], h.psetups[p]
	id := fmt.Sprintf("cmpl-%06d-0", i)
	key := o.Seed<<20 ^ uint64(i+1)
	prefix := int(float64(isl) * o.PrefixHit)
	rec := HandoffRecord{Index: i, ID: id, Prefill: p, Decode: d, ISL: isl, PrefixTokens: prefix, TStart: mono.Now()}
	var pr engine.PrefillReply
	var lr engine.LoadReply
	var perr, derr error
	switch o.Protocol {
	case engine.ProtoPull:
		perr = pe.rpc.Call(ctx, "prefill", engine.PrefillRequest{ID: id, Tokens: isl, Key: key, CheckTP: h.dtp[d]}, &pr)
		if perr == nil {
			derr = de.rpc.Call(ctx, "load", engine.LoadRequest{ID: id, Tokens: isl, PrefixTokens: prefix, Key: key, Params: pr.Params}, &lr)
		}
	case engine.ProtoPush:
		host, port, _ := splitHostPort(psetup.SideChannel)
		coords := engine.TransferParams{DoRemotePrefill: true, RemoteEngineID: psetup.EngineID, RemoteRequestID: id,
			RemoteHost: host, RemotePort: port, TPSize: psetup.TP, PPSize: max(psetup.PP, 1), TransferMode: "push"}
		var wg sync.WaitGroup
		wg.Add(1)
		go func() {
			defer wg.Done()
			derr = de.rpc.Call(ctx, "load", engine.LoadRequest{ID: id, Tokens: isl, PrefixTokens: prefix, Key: key, Params: coords}, &lr)
		}()
		perr = pe.rpc.Call(ctx, "prefill", engine.PrefillRequest{ID: id, Tokens: isl, Key: key, CheckTP: h.dtp[d]}, &pr)
		wg.Wait()
	case engine.ProtoSGLang:
		room := rand.Uint64() >> 1 // 63 bits, as the router draws it
		var wg sync.WaitGroup
		wg.Add(1)
		go func() {
			defer wg.Done()
			derr = de.rpc.Call(ctx, "load", engine.LoadRequest{ID: id, Tokens: isl, PrefixTokens: prefix, Key: key, Room: room, Bootstrap: psetup.Bootstrap,
				Foreign: o.Bootstrap != ""}, &lr)
		}()
		perr = pe.rpc.Call(ctx, "prefill", engine.PrefillRequest{ID: id, Tokens: isl, Key: key, CheckTP: h.dtp[d], Room: room, ChunkTokens: o.ChunkTokens}, &pr)
		wg.Wait()
	}
	// Every stamp onto the driver's clock before anything subtracts
	// stamps of two processes (a no-op on one host).
	pr.OnClock(pe.toDriver)
	lr.OnClock(de.toDriver)
	switch {
	case perr != nil:
		rec.Error = "prefill: " + perr.Error()
	case derr != nil:
		rec.Error = "decode: " + derr.Error()
	case lr.Error != "":
		rec.Error = "decode: " + lr.Error
	}
	if o.Protocol == engine.ProtoPull && perr == nil && derr == nil && strings.Contains(lr.Error, engine.ErrHandshake.Error()) {
		h.abortUnread(ctx, pe, pr.RequestID)
	}
	rec.Blocks, rec.Descriptors, rec.LogicalDescs, rec.Bytes = lr.Blocks, lr.Descriptors, lr.LogicalDescriptors, lr.Bytes
	rec.FirstHandshake, rec.HandshakeMS, rec.CorruptBlocks = lr.FirstHandshake, lr.HandshakeMS, lr.CorruptBlocks
	if lr.Corrupt != "" && rec.Error == "" {
		rec.Error = "corrupt: " + lr.Corrupt
	}
	rec.TFinish, rec.TReady = pr.TFinish, lr.TReady
	ms := stageMS
	rec.PrefillMS = ms(pr.TStart, pr.TFinish)
	rec.HandoffMS = ms(pr.TFinish, lr.TReady)
	rec.CompletionMS = ms(lr.TXferDone, lr.TReady)
	switch o.Protocol {
	case engine.ProtoPull:
		rec.FinishToPostMS = ms(pr.TFinish, lr.TPostStart)
		rec.PostMS = ms(lr.TPostStart, lr.TPostEnd)
		rec.TransferMS = ms(lr.TPostEnd, lr.TXferDone)
	case engine.ProtoPush:
		// The WRITE is prefill's: its stage times come with the release
		// (or, when that comes late, at the end of the run: drainFreed).
		rec.tRegSent, rec.tXferDone = lr.TRegSent, lr.TXferDone
		// A failed request has no release to wait for (a dead decode
		// never sends the completion that triggers it): waiting cost
		// every run whose decode died 3 s.
		if rec.Error == "" {
			if f, ok := h.waitFreed(ctx, id, 3*time.Second); ok {
				rec.applyPushFreed(f)
			}
		}
	case engine.ProtoSGLang:
		rec.RegRTTMS = ms(lr.TRegSent, pr.TBootstrapped)
		rec.FinishToPostMS = ms(max(pr.TFinish, pr.TBootstrapped), pr.TPostStart)
		// Both ends on prefill's clock: the WRITEs posted, and done
		// (sendRoom returns when they are).
		rec.TransferMS = ms(pr.TPostStart, pr.TSent)
		rec.Descriptors, rec.LogicalDescs = pr.Descriptors, pr.LogicalDescs
		rec.Bytes = int64(lr.Blocks) * blockBytesAllRanks(h.o.Spec, h.dtp[d])
	}
	return rec
}

// abortUnread tells a prefill that nobody will read a request's blocks: its
// decode could not handshake with it. A router does the same, and without
// it the blocks stay held for a whole lease, so that one unreachable path
// turned into dozens of "out of KV blocks" failures that hid the cause.
func (h *handoff) abortUnread(ctx context.Context, pe *Endpoint, id string) {
	actx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	var ar engine.AbortReply
	if err := pe.rpc.Call(actx, "abort", engine.AbortRequest{ID: id}, &ar); err != nil {
		h.o.Log.Debug("aborting unread blocks at prefill", "request", id, "err", err)
	}
}

// blockBytesAllRanks is what one block weighs on all ranks of an engine,
// every TP rank of every pipeline stage.
func blockBytesAllRanks(spec kv.Spec, tp int) int64 {
	spec.TP = tp
	var b int64
	for pp := 0; pp < max(spec.PP, 1); pp++ {
		for r := 0; r < tp; r++ {
			for _, reg := range spec.Rank(r, pp).Regions {
				b += reg.BlockBytes
			}
		}
	}
	return b
}

// memAvailable is MemAvailable from /proc/meminfo in bytes (0: unknown).
func memAvailable() int64 {
	m, err := procfs.ReadMemInfo()
	if err != nil {
		return 0
	}
	return m.AvailableBytes
}

func splitHostPort(ep string) (string, int, error) {
	host, port, err := net.SplitHostPort(strings.TrimPrefix(ep, "tcp://"))
	if err != nil {
		return "", 0, err
	}
	var p int
	_, err = fmt.Sscanf(port, "%d", &p)
	return host, p, err
}

// SummarizeHandoff computes a run's summary from its records (warm-up
// ones left out), with memcpy the reference bandwidth in GB/s. The
// references and leak counts that do not come from records stay zero.
func SummarizeHandoff(records []HandoffRecord, memcpy float64) HandoffSummary {
	s := HandoffSummary{MemcpyGBps: memcpy}
	hand, xfer, post, f2p, comp, reg := report.NewHistogram(), report.NewHistogram(), report.NewHistogram(), report.NewHistogram(), report.NewHistogram(), report.NewHistogram()
	var firstHS, steadyHS []float64
	var gbps []float64
	// The timed span is each round's (first start to last end) added up:
	// between rounds the interleaved reference ran, not the handoff.
	type span struct{ first, last int64 }
	spans := map[int]*span{}
	ms := func(x float64) time.Duration { return time.Duration(x * 1e6) }
	for _, r := range records {
		if r.FirstHandshake {
			firstHS = append(firstHS, r.HandshakeMS)
		}
		if r.Warmup {
			continue
		}
		s.Requests++
		if r.Error != "" || r.CorruptBlocks > 0 {
			s.Failed++
			reason := "corrupt blocks"
			if r.Error != "" {
				reason = failureReason(r.Error)
			}
			if s.FailuresByReason == nil {
				s.FailuresByReason, s.FailureExamples = map[string]int{}, map[string]string{}
			}
			s.FailuresByReason[reason]++
			if _, seen := s.FailureExamples[reason]; !seen {
				if r.Error != "" {
					s.FailureExamples[reason] = failureExample(r.Error)
				}
			}
		}
		s.CorruptBlocks += r.CorruptBlocks
		if r.Error != "" {
			continue
		}
		if !r.FirstHandshake {
			steadyHS = append(steadyHS, r.HandshakeMS)
		}
		s.Bytes += r.Bytes
		s.DescriptorsPerReq += float64(r.Descriptors)
		s.LogicalDescsReq += float64(r.LogicalDescs)
		// Every measured request has a handoff and a transfer stage, even
		// one that read 0 (a copy done inside the post): the histograms
		// count every request that moved bytes. Other stages a protocol
		// lacks are 0 and stay out. A negative stage is counted, not
		// recorded, and the run warns.
		for _, st := range []struct {
			name   string
			h      *report.Histogram
			v      float64
			always bool
		}{{"handoff_ms", hand, r.HandoffMS, true}, {"transfer_ms", xfer, r.TransferMS, r.Bytes > 0}, {"post_ms", post, r.PostMS, false},
			{"finish_to_post_ms", f2p, r.FinishToPostMS, false}, {"completion_to_ready_ms", comp, r.CompletionMS, false},
			{"registration_rtt_ms", reg, r.RegRTTMS, false}} {
			switch {
			case st.v < 0:
				if s.NegativeStages == nil {
					s.NegativeStages = map[string]int{}
				}
				s.NegativeStages[st.name]++
			case st.v > 0 || st.always:
				st.h.Record(ms(st.v))
			}
		}
		// Post and transfer together: where a transport copies inside the
		// post (UCX-allocated shared memory), the transfer stage is ~0.
		if t := r.PostMS + r.TransferMS; t > 0 && r.Bytes > 0 {
			gbps = append(gbps, float64(r.Bytes)/1e6/t)
		}
		sp := spans[r.Round]
		if sp == nil {
			sp = &span{first: r.TStart}
			spans[r.Round] = sp
		}
		sp.first = min(sp.first, r.TStart)
		sp.last = max(sp.last, r.TReady)
	}
	var timed int64
	for _, sp := range spans {
		if sp.last > sp.first {
			timed += sp.last - sp.first
		}
	}
	ok := s.Requests - s.Failed
	if ok > 0 {
		s.DescriptorsPerReq /= float64(ok)
		s.LogicalDescsReq /= float64(ok)
		s.BytesPerRequest = float64(s.Bytes) / float64(ok)
	}
	if timed > 0 {
		s.Seconds = float64(timed) / 1e9
		s.BandwidthGBps = float64(s.Bytes) / 1e9 / s.Seconds
		s.RequestsPerS = float64(ok) / s.Seconds
	}
	u := time.Millisecond
	s.HandoffLatencyMS, s.TransferMS, s.PostMS, s.FinishToPostMS, s.CompletionMS, s.RegRTTMS =
		hand.In(u), xfer.In(u), post.In(u), f2p.In(u), comp.In(u), reg.In(u)
	s.Histogram, _ = hand.Encode()
	s.StageHistograms = map[string]string{}
	for k, h := range map[string]*report.Histogram{"transfer_ms": xfer, "post_ms": post, "finish_to_post_ms": f2p,
		"completion_to_ready_ms": comp, "registration_rtt_ms": reg} {
		if h.Count() > 0 {
			s.StageHistograms[k], _ = h.Encode()
		}
	}
	s.FirstHandshakeMS = mean(firstHS)
	s.SteadyHandshakeMS = mean(steadyHS)
	s.TransferGBps = stats.Median(gbps)
	if _, gap := stallWarning(records); gap > 0 {
		s.StallMS = float64(gap) / 1e6
	}
	if memcpy > 0 {
		s.EfficiencyMemcpy = s.BandwidthGBps / memcpy
	}
	return s
}

func mean(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	t := 0.0
	for _, x := range xs {
		t += x
	}
	return t / float64(len(xs))
}

// xferReference runs `bench xfer` on the same bytes: one point with the
// run's mean descriptor size and count, as many in flight as the run had.
func (h *handoff) xferReference(ctx context.Context, backend string, res *HandoffResult) (float64, error) {
	s := res.Summary
	if s.DescriptorsPerReq < 1 || s.BytesPerRequest <= 0 {
		return 0, nil
	}
	batch := int(s.DescriptorsPerReq + 0.5)
	block := int(s.BytesPerRequest / float64(batch))
	block = max(8, block/8*8)
	xo := h.referenceOptions(backend, block, batch, h.o.DRAMAlloc)
	// Ten rounds of the pipeline and at least 4 GB, so it runs full for
	// nearly all of the timed phase: with three rounds (12 requests of
	// 256 MiB at depth 4) the ramp at both ends made the reference read
	// 1.3-3.7 GB/s for the same work and the handoff 2.4x "faster" than
	// it. One round of warm-up fills the pipeline first.
	xo.NumIter = max(10*xo.PipelineDepth, min(400, int(4e9/float64(block*batch))+1))
	xr, err := RunXfer(ctx, xo)
	if err != nil {
		return 0, err
	}
	if xr.Failure != "" {
		return 0, errors.New(xr.Failure)
	}
	if len(xr.Points) == 0 {
		return 0, nil
	}
	res.Config.XferReference = &XferReference{Op: xo.Op.String(), BlockSize: block, BatchSize: batch, PipelineDepth: xo.PipelineDepth, Iterations: xo.NumIter, Polling: "paced"}
	return xr.Points[0].BandwidthGBps, nil
}

// tagWorkWarning is the result's warning when an endpoint ran its tag
// fill and check at normal priority, taking CPU from the transfers it
// measured; "" when every one ran them at idle priority.
func tagWorkWarning(stats []engine.Stats) string {
	for _, st := range stats {
		if strings.HasPrefix(st.TagWork, "normal") {
			return "an endpoint ran its tag fill and check at " + st.TagWork + ": they took CPU from the transfers, which may read slower than the link allows"
		}
	}
	return ""
}

// endpointDeath is why a run stopped when an endpoint died.
type endpointDeath struct{ role, why string }

// String is "decode (signal: killed)".
func (e *endpointDeath) String() string { return e.role + " (" + e.why + ")" }

func (e *endpointDeath) Error() string { return "the " + e.String() + " endpoint died" }

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

// ppOrOmit is pp as results record it: absent for one stage, so results
// without pipeline stages read as they always have.
func ppOrOmit(pp int) int {
	if pp <= 1 {
		return 0
	}
	return pp
}
