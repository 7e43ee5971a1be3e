package leasechaos

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"sort"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/nixlctl/nixlctl/internal/ctl"
	"github.com/nixlctl/nixlctl/internal/engine"
	"github.com/nixlctl/nixlctl/internal/errkind"
	"github.com/nixlctl/nixlctl/internal/fleet"
	"github.com/nixlctl/nixlctl/internal/kv"
	"github.com/nixlctl/nixlctl/internal/lease"
	"github.com/nixlctl/nixlctl/internal/leasesim"
	"github.com/nixlctl/nixlctl/internal/live"
	"github.com/nixlctl/nixlctl/internal/mono"
	"github.com/nixlctl/nixlctl/internal/nixl"
	"github.com/nixlctl/nixlctl/internal/report"
	"github.com/nixlctl/nixlctl/internal/runcore"
)

// LeaseChaosOptions configure `nixlctl lease-chaos`: every selected
// scenario under every selected policy, each on a fresh pair of prefill
// and decode processes with compressed time.
//
// The CLI decodes its flags into it (mapstructure tags are the flag names,
// "-" is not a flag); the simulator's options derive from it (Sim).
type LeaseChaosOptions struct {
	Scenarios []string       `mapstructure:"scenario"`
	Policies  []lease.Policy `mapstructure:"policy"`
	// Lease is kv_lease_duration, compressed; 0: 3 s on real processes,
	// vLLM's 30 s in the simulator.
	Lease    time.Duration    `mapstructure:"kv-lease-duration"`
	Timeout  time.Duration    `mapstructure:"timeout"` // the fixed policy's timeout; 0: 16 leases, as 480 s is to 30 s
	Reaper   lease.ReaperMode `mapstructure:"reaper"`
	Protocol engine.Protocol  `mapstructure:"protocol"` // pull or push
	// PushHeartbeatKeys (push): upstream's, which never renew (vLLM
	// #53095), or fixed.
	PushHeartbeatKeys engine.HeartbeatKeys `mapstructure:"push-heartbeat-keys"`
	Backend           string               `mapstructure:"backend"`
	Spec              kv.Spec              `mapstructure:"-"` // resolved by the CLI from the model flags
	ISL               int                  `mapstructure:"isl"`
	// Slack is how late a free may come beyond what the protocol promises
	// before a scenario fails (process scheduling, RPC hops).
	Slack    time.Duration `mapstructure:"slack"`
	Exe      string        `mapstructure:"-"` // endpoint children; default this program
	ExeArgs  []string      `mapstructure:"-"` // arguments before the role; default serve
	ChildEnv []string      `mapstructure:"-"`
	// ChildStderr receives the endpoint children's stderr (nil: this
	// process's stderr).
	ChildStderr io.Writer    `mapstructure:"-"`
	Version     string       `mapstructure:"-"`
	Seed        uint64       `mapstructure:"seed"`
	Log         *slog.Logger `mapstructure:"-"`
	Live        live.Sink    `mapstructure:"-"`
}

// DefaultLeaseChaosOptions are the defaults of every knob that has one
// (the CLI's flag defaults come from here); the lease and the timeout
// depend on the mode (settle).
func DefaultLeaseChaosOptions() LeaseChaosOptions {
	return LeaseChaosOptions{Scenarios: leasesim.Scenarios(), Policies: []lease.Policy{lease.PolicyLease, lease.PolicyFixed},
		Reaper: lease.ReapFull, Protocol: engine.ProtoPull, PushHeartbeatKeys: engine.HBKeysUpstream, Backend: "auto", ISL: 256, Slack: 250 * time.Millisecond, Seed: 1}
}

// settle fills the lease and the fixed timeout left to their defaults,
// which depend on whether time is real (compressed: 3 s) or simulated
// (vLLM's 30 s).
func (o *LeaseChaosOptions) settle(sim bool) {
	if o.Lease == 0 {
		o.Lease = 3 * time.Second
		if sim {
			o.Lease = lease.DefaultDuration
		}
	}
	// A lease beyond the maximum is refused by its validation; sixteen of
	// them could wrap into a negative timeout first.
	if o.Timeout == 0 && o.Lease <= lease.MaxDuration {
		o.Timeout = 16 * o.Lease
	}
}

// Validate checks the options for a run on real processes, as field
// errors (errkind.FieldError) joined and marked bad input.
func (o *LeaseChaosOptions) Validate() error {
	v := *o
	v.settle(false)
	var errs []error
	if len(v.Scenarios) == 0 {
		errs = append(errs, errkind.Field("Scenarios", "no scenario selected"))
	}
	if v.Protocol != engine.ProtoPull && v.Protocol != engine.ProtoPush {
		errs = append(errs, errkind.Field("Protocol", "lease-chaos runs pull or push, not %s (SGLang has no leases)", v.Protocol))
	}
	switch {
	case v.PushHeartbeatKeys != "" && !v.PushHeartbeatKeys.Valid():
		errs = append(errs, errkind.Field("PushHeartbeatKeys", "unknown push heartbeat keys %q (want upstream or fixed)", v.PushHeartbeatKeys))
	case v.PushHeartbeatKeys == engine.HBKeysFixed && v.Protocol != engine.ProtoPush:
		errs = append(errs, errkind.Field("PushHeartbeatKeys", "fixed keys are push mode's (pull heartbeats name prefill's own id)"))
	}
	if v.Lease < 300*time.Millisecond {
		errs = append(errs, errkind.Field("Lease", "want at least 300ms (got %v; real processes need the margin)", v.Lease))
	}
	errs = append(errs, validateChaos(v.Scenarios, v.Policies, v.Lease, v.Timeout, v.Reaper, v.Spec, v.ISL)...)
	return errkind.BadInput(errors.Join(errs...))
}

// Sim is the simulator's options for the same choices, with its own
// defaults: the one translation from the lease-chaos options.
func (o LeaseChaosOptions) Sim(traffic leasesim.TrafficOptions, sweep []time.Duration) LeaseSimOptions {
	o.settle(true)
	traffic.Seed = o.Seed
	return LeaseSimOptions{Scenarios: o.Scenarios, Policies: o.Policies, Lease: o.Lease, Timeout: o.Timeout, Reaper: o.Reaper,
		Spec: o.Spec, ISL: o.ISL, Traffic: traffic, Sweep: sweep, Version: o.Version, Live: o.Live}
}

// validateChaos checks what real and simulated runs share.
func validateChaos(scenarios []string, policies []lease.Policy, leaseDur, timeout time.Duration, reaper lease.ReaperMode, spec kv.Spec, isl int) []error {
	var errs []error
	bad := func(field, format string, a ...any) { errs = append(errs, errkind.Field(field, format, a...)) }
	for _, s := range scenarios {
		if !slices.Contains(leasesim.Scenarios(), s) {
			bad("Scenarios", "unknown scenario %q (want one of %s)", s, strings.Join(leasesim.Scenarios(), ", "))
		}
	}
	if len(policies) == 0 {
		bad("Policies", "no policy selected")
	}
	for _, p := range policies {
		if p != lease.PolicyLease && p != lease.PolicyFixed {
			bad("Policies", "unknown policy %q (want lease or fixed)", p)
		}
	}
	if isl <= 0 || isl > kv.MaxTokens {
		bad("ISL", "must be between 1 and %d", kv.MaxTokens)
	}
	if reaper != lease.ReapFull && reaper != lease.ReapHeadOnly {
		bad("Reaper", "unknown reaper %q (want full or head-only)", reaper)
		reaper = lease.ReapFull // reported: the lease's own check need not repeat it
	}
	if _, err := (lease.Config{Policy: lease.PolicyFixed, Duration: leaseDur, Timeout: timeout, Reaper: reaper}).Normalize(); err != nil {
		errs = append(errs, err)
	}
	if err := spec.Validate(); err != nil {
		errs = append(errs, err)
	}
	return errs
}

func policyNames(ps []lease.Policy) []string {
	var out []string
	for _, p := range ps {
		out = append(out, string(p))
	}
	return out
}

// LeaseChaosConfig is what a lease-chaos result says was asked, under the
// JSON names results have always used; the fields only one mode has are
// left out of the other's.
type LeaseChaosConfig struct {
	Scenarios []string         `json:"scenarios"`
	Policies  []string         `json:"policies"`
	Lease     runcore.Duration `json:"lease"`
	Timeout   runcore.Duration `json:"timeout"`
	Reaper    string           `json:"reaper"`
	Protocol  string           `json:"protocol,omitempty"` // real
	// HeartbeatKeys (push): upstream or fixed; RegWatchdog (push) what
	// the harness's decode watchdog does (fail: a request whose KV
	// never comes ends, as the scenarios need; upstream drops and waits).
	HeartbeatKeys string           `json:"push_heartbeat_keys,omitempty"`
	RegTimeout    runcore.Duration `json:"registration_timeout,omitempty"`
	RegWatchdog   string           `json:"registration_watchdog,omitempty"`
	Model         string           `json:"model"`
	ISL           int              `json:"isl"`
	// Seed is --seed, without which a run cannot be drawn again (a
	// pointer: 0 is written, results from before it read back without).
	Seed      *uint64          `json:"seed,omitempty"`
	KVDType   kv.DType         `json:"kv_dtype,omitempty"`   // real
	BlockSize int              `json:"block_size,omitempty"` // real
	Slack     runcore.Duration `json:"slack,omitempty"`      // real
	Backend   string           `json:"backend,omitempty"`    // real
	// BytesPerRequest is what one request's KV weighs (sim).
	BytesPerRequest int64 `json:"bytes_per_request,omitempty"`
}

// LeaseChaosResult is a whole lease-chaos run (real processes, or the
// simulator with --sim).
type LeaseChaosResult struct {
	report.Meta
	Mode      string                    `json:"mode"` // real or sim
	Protocol  string                    `json:"protocol,omitempty"`
	Backend   string                    `json:"backend,omitempty"`
	Model     string                    `json:"model"`
	Config    LeaseChaosConfig          `json:"config"`
	Scenarios []leasesim.ScenarioResult `json:"scenarios"`
	Passed    int                       `json:"passed"`
	Failed    int                       `json:"failed"`
	// --sim: requests simulated in all (traffic and sweep) and the wall
	// time it took; the long traffic run and the lease sweep.
	SimulatedRequests int                     `json:"simulated_requests,omitempty"`
	WallSeconds       float64                 `json:"wall_seconds,omitempty"`
	Traffic           *leasesim.TrafficResult `json:"traffic,omitempty"`
	Sweep             *leasesim.Sweep         `json:"sweep,omitempty"`
	Interrupted       bool                    `json:"interrupted,omitempty"`
}

// finish closes the result; an interrupted run keeps what it measured and
// says so.
func (res *LeaseChaosResult) finish(ctx context.Context) error {
	res.Finish()
	if ctx.Err() != nil {
		res.Interrupted = true
		res.Warn("interrupted: the run stopped early")
	}
	return ctx.Err()
}

// add keeps one scenario's result and tells the live view.
func (res *LeaseChaosResult) add(r leasesim.ScenarioResult, sink live.Sink) {
	res.Scenarios = append(res.Scenarios, r)
	if r.Passed {
		res.Passed++
	} else {
		res.Failed++
	}
	live.Emit(sink, live.Request{OK: r.Passed})
}

// RunLeaseChaos runs the scenarios. A scenario that fails its expectation
// is a result, not an error; errors are for runs that could not happen.
func RunLeaseChaos(ctx context.Context, o LeaseChaosOptions) (*LeaseChaosResult, error) {
	if o.Log == nil {
		o.Log = slog.New(slog.DiscardHandler)
	}
	if err := o.Validate(); err != nil {
		return nil, err
	}
	o.settle(false)
	spec, _ := o.Spec.Normalize()
	o.Spec = spec
	backend, err := nixl.Resolve(o.Backend)
	if err != nil {
		return nil, err
	}
	res := &LeaseChaosResult{Meta: report.NewMeta("lease-chaos", o.Version), Mode: "real", Protocol: string(o.Protocol),
		Backend: backend.Name, Model: spec.Model.Name}
	runcore.RecordBackend(&res.Meta, backend.Name, backend.Version())
	res.Config = LeaseChaosConfig{Scenarios: o.Scenarios, Policies: policyNames(o.Policies), Lease: runcore.Duration(o.Lease), Timeout: runcore.Duration(o.Timeout),
		Reaper: string(o.Reaper), Protocol: string(o.Protocol), Model: spec.Model.Name, ISL: o.ISL, Seed: new(o.Seed), KVDType: spec.DType,
		BlockSize: spec.BlockSize, Slack: runcore.Duration(o.Slack), Backend: backend.Name}
	if o.Protocol == engine.ProtoPush {
		keys := cmp.Or(o.PushHeartbeatKeys, engine.HBKeysUpstream)
		res.Config.HeartbeatKeys = string(keys)
		res.Config.RegTimeout, res.Config.RegWatchdog = runcore.Duration(chaosRegTimeout(o.Lease)), string(engine.WatchdogFail)
		if keys == engine.HBKeysFixed {
			res.Warn("--push-heartbeat-keys fixed: not upstream behaviour; decode heartbeats its own id and prefill matches it by base id (vLLM's push heartbeats never renew: #53095)")
		}
	}
	total := len(o.Scenarios) * len(o.Policies)
	live.Emit(o.Live, live.Start{Title: "lease-chaos", Total: total, Unit: "scenarios"})
	t0 := time.Now()
	for _, sc := range o.Scenarios {
		for _, pol := range o.Policies {
			if ctx.Err() != nil {
				break
			}
			lc, _ := lease.Config{Policy: pol, Duration: o.Lease, Timeout: o.Timeout, Reaper: o.Reaper}.Normalize()
			live.Emit(o.Live, live.Phase{Text: fmt.Sprintf("%s under %s", sc, pol)})
			r, err := runScenario(ctx, &o, backend.Name, sc, lc, t0)
			if err != nil {
				if ctx.Err() != nil {
					break
				}
				r.Errors = append(r.Errors, err.Error())
				r.Passed = false
				res.Warn(fmt.Sprintf("%s under %s: %v", sc, pol, err))
			}
			res.add(r, o.Live)
		}
	}
	return res, res.finish(ctx)
}

// chaosRun is one scenario on one pair of endpoints.
type chaosRun struct {
	o      *LeaseChaosOptions
	plan   leasesim.ChaosPlan
	lc     lease.Config
	base   engine.Config
	t0     int64 // mono ns of request 0
	live   live.Sink
	liveT0 time.Time

	mu         sync.Mutex
	pe, de     *fleet.Conn
	pGen       int
	psetup     engine.SetupReply
	freed      map[string]engine.FreedEvent // by router id
	samples    []engine.LeaseSample
	heartbeats []int64
	// what the heartbeats prefill applied named, renewed, did not know
	hbIDs, hbRenewed, hbUnknown int64
	faults                      []leasesim.TimelineFault
	grants                      map[string]int64 // router id -> lease granted (mono)
	loads                       map[string]engine.LoadReply
	loadErr                     map[string]string
	tKill                       int64 // decode killed
	tAbort                      int64
	aborted                     map[string]bool
	lastD                       engine.Stats
	decodeDead                  bool
	stalled                     bool
	lastGauge                   int64
	// inQueue[i] closes when request i took its place on decode (or will
	// not): request i+1 waits for it, so the queue keeps the plan's order.
	inQueue []chan struct{}
	inOnce  []sync.Once
	// granted[i] closes when request i's prefill call returned: request
	// i+1's prefill waits for it, so prefill grants the leases in the
	// plan's order. Sent at once, a loaded machine could grant a later
	// request first, and a head-only reaper then found an aborted lease at
	// the head and passed a scenario it must fail.
	granted   []chan struct{}
	grantOnce []sync.Once
}

func (c *chaosRun) markQueued(i int) {
	c.markGranted(i)
	if i >= 0 && i < len(c.inQueue) {
		c.inOnce[i].Do(func() { close(c.inQueue[i]) })
	}
}

func (c *chaosRun) markGranted(i int) {
	if i >= 0 && i < len(c.granted) {
		c.grantOnce[i].Do(func() { close(c.granted[i]) })
	}
}

// after waits for ch (a previous request's event) as the plan's order
// asks, but not past ctx or a generous bound: a loaded machine delays
// the event, and a lost one must not hang the run.
func after(ctx context.Context, ch <-chan struct{}) {
	select {
	case <-ch:
	case <-time.After(10 * time.Second):
	case <-ctx.Done():
	}
}

func reqID(i int) string { return fmt.Sprintf("chaos-%03d", i) }

// chaosRegTimeout is push decode's registration watchdog in lease-chaos:
// a lease (at least 1 s), failing the request, so that a request whose
// KV never comes (its prefill killed, its lease lapsed) ends and counts.
// Upstream's (480 s, drop and keep waiting) would leave it hanging.
func chaosRegTimeout(leaseDur time.Duration) time.Duration { return max(leaseDur, time.Second) }

func runScenario(ctx context.Context, o *LeaseChaosOptions, backend, scenario string, lc lease.Config, liveT0 time.Time) (leasesim.ScenarioResult, error) {
	r := leasesim.ScenarioResult{Scenario: scenario, Policy: string(lc.Policy), Reaper: string(lc.Reaper), Protocol: string(o.Protocol), Mode: "real",
		LeaseS: lc.Duration.Seconds(), TimeoutS: lc.Timeout.Seconds(), ExtensionS: lc.Extension().Seconds(), IntervalS: lc.HeartbeatInterval().Seconds()}
	keys := cmp.Or(o.PushHeartbeatKeys, engine.HBKeysUpstream)
	if o.Protocol == engine.ProtoPush {
		r.HeartbeatKeys = string(keys)
	}
	plan, err := leasesim.PlanFor(scenario, lc)
	if err != nil {
		return r, err
	}
	r.StepS, r.Requests = plan.Step.Seconds(), plan.Requests
	per := o.Spec.BlocksFor(kv.FullAttention, o.ISL)
	base := engine.Config{Backend: backend, Protocol: engine.Protocol(o.Protocol), Model: o.Spec.Model, KVDType: o.Spec.DType, BlockSize: o.Spec.BlockSize,
		Layout: o.Spec.Layout, Order: o.Spec.Order, TP: 1, NumBlocks: per*plan.Requests*2 + 16, Merge: true, LeasePolicy: lc.Policy, FixedTimeout: lc.Timeout, Reaper: lc.Reaper,
		Step: plan.Step, LeaseEvents: true, Seed: o.Seed, Knobs: engine.Knobs{DRAMAlloc: "mmap", Verify: engine.Sparse, Lease: runcore.Duration(lc.Duration), RegTimeout: runcore.Duration(chaosRegTimeout(lc.Duration)), RegWatchdog: engine.WatchdogFail, PushHeartbeatKeys: keys}}
	c := &chaosRun{o: o, plan: plan, lc: lc, base: base, live: o.Live, liveT0: liveT0, freed: map[string]engine.FreedEvent{},
		grants: map[string]int64{}, loads: map[string]engine.LoadReply{}, loadErr: map[string]string{}, aborted: map[string]bool{},
		inQueue: make([]chan struct{}, plan.Requests), inOnce: make([]sync.Once, plan.Requests),
		granted: make([]chan struct{}, plan.Requests), grantOnce: make([]sync.Once, plan.Requests)}
	for i := range c.inQueue {
		c.inQueue[i], c.granted[i] = make(chan struct{}), make(chan struct{})
	}
	defer c.close()
	if err := c.startPrefill(ctx); err != nil {
		return r, err
	}
	if err := c.startDecode(ctx); err != nil {
		return r, err
	}
	start := time.Now()
	c.drive(ctx)
	c.settle(ctx)
	r.Seconds = time.Since(start).Seconds()
	c.finish(&r, per)
	leasesim.Judge(plan, lc, &r, o.Slack)
	if ctx.Err() != nil {
		return r, ctx.Err()
	}
	return r, nil
}

// endpointGrace is how long an endpoint may take to close its engine
// (agents, pools) before it is killed.
const endpointGrace = 15 * time.Second

// startEndpoint starts a prefill or decode endpoint: a child of this
// program, always. It outlives the run's context: an interrupted run
// still asks it for its stats.
func (c *chaosRun) startEndpoint(ctx context.Context, role string) (*fleet.Conn, error) {
	p := fleet.Proc{Name: role, Exe: c.o.Exe, DefaultArgs: []string{"serve", role, "--stdio"}, Env: c.o.ChildEnv, Stderr: c.o.ChildStderr, Outlive: true}
	if c.o.ExeArgs != nil {
		p.Args = append(slices.Clone(c.o.ExeArgs), role, "--stdio")
	}
	return fleet.Start(ctx, p)
}

// closeEndpoint closes an endpoint started so far (nil: none was).
func closeEndpoint(ep *fleet.Conn) {
	if ep != nil {
		_ = ep.Close(endpointGrace, nil)
	}
}

func (c *chaosRun) startPrefill(ctx context.Context) error {
	ep, err := c.startEndpoint(ctx, "prefill")
	if err != nil {
		return err
	}
	cfg := c.base
	cfg.Role, cfg.EngineID = engine.RolePrefill, fmt.Sprintf("prefill-%d", c.pGen)
	var setup engine.SetupReply
	if err := ep.Call(ctx, "setup", cfg, &setup); err != nil {
		closeEndpoint(ep)
		return fmt.Errorf("prefill setup: %w", err)
	}
	c.mu.Lock()
	c.pe, c.psetup = ep, setup
	c.mu.Unlock()
	go c.collectPrefill(ep)
	return nil
}

func (c *chaosRun) startDecode(ctx context.Context) error {
	ep, err := c.startEndpoint(ctx, "decode")
	if err != nil {
		return err
	}
	cfg := c.base
	cfg.Role, cfg.EngineID, cfg.Seed = engine.RoleDecode, "decode-0", c.base.Seed+1
	cfg.DecodeSlots, cfg.DecodeHold = c.plan.DecodeSlots, c.plan.DecodeHold
	if c.plan.HBLoss > 0 {
		cfg.Faults = &nixl.Faults{DropSend: c.plan.HBLoss, DropSendEvenly: true, NotifPrefix: "HB:"}
	}
	if k := c.plan.KillDecodeOnSchedule; k >= 0 {
		// Decode kills itself right after posting request k's transfer: a
		// signal from here could come after a short READ had finished.
		cfg.CrashAt = reqID(k)
	}
	if err := ep.Call(ctx, "setup", cfg, nil); err != nil {
		closeEndpoint(ep)
		return fmt.Errorf("decode setup: %w", err)
	}
	c.mu.Lock()
	c.de = ep
	c.mu.Unlock()
	go c.collectDecode(ctx, ep)
	return nil
}

func (c *chaosRun) close() {
	c.mu.Lock()
	pe, de, stalled := c.pe, c.de, c.stalled
	c.mu.Unlock()
	if stalled && de != nil {
		_ = de.Signal(syscall.SIGCONT)
	}
	closeEndpoint(de)
	closeEndpoint(pe)
}

// collectPrefill keeps what a prefill generation reports: frees, lease
// table samples, heartbeats applied.
func (c *chaosRun) collectPrefill(ep *fleet.Conn) {
	ep.EachEvent(func(ev ctl.Event) {
		c.mu.Lock()
		switch ev.Name {
		case "freed":
			var f engine.FreedEvent
			if json.Unmarshal(ev.Data, &f) == nil {
				c.freed[f.RouterID] = f
			}
		case "leases":
			var s engine.LeaseSample
			if json.Unmarshal(ev.Data, &s) == nil {
				c.samples = append(c.samples, s)
				// Every step is too often for a sparkline: one sample in 250 ms.
				if s.T-c.lastGauge >= int64(250*time.Millisecond) {
					c.lastGauge = s.T
					live.Emit(c.live, live.Gauge{Series: "leases held", At: time.Since(c.liveT0), Value: float64(s.Held), Unit: "leases"})
				}
			}
		case "heartbeat":
			var h engine.HeartbeatEvent
			if json.Unmarshal(ev.Data, &h) == nil {
				c.heartbeats = append(c.heartbeats, h.T)
				c.hbIDs += int64(h.IDs)
				c.hbRenewed += int64(h.Renewed)
				c.hbUnknown += int64(h.Unknown)
			}
		}
		c.mu.Unlock()
	})
}

// collectDecode kills decode on the plan's cue and keeps its last stats
// (a killed decode answers no more).
func (c *chaosRun) collectDecode(ctx context.Context, ep *fleet.Conn) {
	stop := make(chan struct{})
	go func() {
		defer close(stop)
		ep.EachEvent(func(ev ctl.Event) {
			var s engine.DecodeEvent
			if json.Unmarshal(ev.Data, &s) != nil {
				return
			}
			switch {
			case ev.Name == "queued":
				var i int
				if _, err := fmt.Sscanf(s.RouterID, "chaos-%d", &i); err == nil {
					c.markQueued(i)
				}
			case ev.Name == "crashing":
				c.decodeDied(s.T, "decode SIGKILLed itself with "+s.RouterID+"'s transfer in flight")
			}
		})
	}()
	t := time.NewTicker(50 * time.Millisecond)
	defer t.Stop()
	for {
		select {
		case <-stop:
			return
		case <-t.C:
		}
		c.mu.Lock()
		skip := c.stalled || c.decodeDead
		c.mu.Unlock()
		if skip {
			continue
		}
		var st engine.Stats
		cctx, cancel := context.WithTimeout(ctx, time.Second)
		if ep.Call(cctx, "stats", nil, &st) == nil {
			c.mu.Lock()
			c.lastD = st
			c.mu.Unlock()
		}
		cancel()
	}
}

func (c *chaosRun) fault(what string) int64 {
	now := mono.Now()
	c.mu.Lock()
	c.faults = append(c.faults, leasesim.TimelineFault{T: float64(now-c.t0) / 1e9, What: what})
	c.mu.Unlock()
	live.Emit(c.live, live.Phase{Text: what})
	return now
}

// decodeDied records a crash decode did to itself (at t, mono ns).
func (c *chaosRun) decodeDied(t int64, what string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.decodeDead {
		return
	}
	c.decodeDead, c.tKill = true, t
	c.faults = append(c.faults, leasesim.TimelineFault{T: float64(t-c.t0) / 1e9, What: what})
	live.Emit(c.live, live.Phase{Text: what})
}

func (c *chaosRun) killDecode(what string) {
	c.mu.Lock()
	if c.decodeDead {
		c.mu.Unlock()
		return
	}
	c.decodeDead = true
	de := c.de
	c.mu.Unlock()
	_ = de.Signal(syscall.SIGKILL)
	t := c.fault(what)
	c.mu.Lock()
	c.tKill = t
	c.mu.Unlock()
}

// drive plays the plan: arrivals, faults, and each request's way through
// prefill and decode, until every request has an outcome.
func (c *chaosRun) drive(ctx context.Context) {
	p := c.plan
	c.t0 = mono.Now()
	at := func(d time.Duration) <-chan time.Time { return time.After(time.Duration(c.t0 + int64(d) - mono.Now())) }
	var faults sync.WaitGroup
	faultAt := func(d time.Duration, f func()) {
		faults.Add(1)
		go func() {
			defer faults.Done()
			select {
			case <-at(d):
				f()
			case <-ctx.Done():
			}
		}()
	}
	if p.KillDecodeAt > 0 {
		faultAt(p.KillDecodeAt, func() { c.killDecode("SIGKILL decode") })
	}
	if p.StallDecodeAt > 0 {
		faultAt(p.StallDecodeAt, func() {
			c.mu.Lock()
			c.stalled = true
			de := c.de
			c.mu.Unlock()
			_ = de.Signal(syscall.SIGSTOP)
			c.fault(fmt.Sprintf("SIGSTOP decode for %v", p.StallFor))
			select {
			case <-time.After(p.StallFor):
			case <-ctx.Done():
			}
			_ = de.Signal(syscall.SIGCONT)
			c.mu.Lock()
			c.stalled = false
			c.mu.Unlock()
			c.fault("SIGCONT decode")
		})
	}
	if len(p.Abort) > 0 {
		faultAt(p.AbortAt, func() {
			// The requests to abort must be queued on decode first: on a
			// busy machine they arrive later than the plan's clock says,
			// and an abort that finds one not yet queued only skips it
			// (4 expired leases read 1 under a loaded CI).
			for _, i := range p.Abort {
				after(ctx, c.inQueue[i])
			}
			t := c.fault(fmt.Sprintf("router aborts %d queued requests", len(p.Abort)))
			c.mu.Lock()
			c.tAbort = t
			de := c.de
			c.mu.Unlock()
			for _, i := range p.Abort {
				var ar engine.AbortReply
				if err := de.Call(ctx, "abort", engine.AbortRequest{ID: reqID(i)}, &ar); err == nil && ar.Aborted {
					c.mu.Lock()
					c.aborted[reqID(i)] = true
					c.mu.Unlock()
				}
			}
		})
	}
	restarted := make(chan struct{})
	if p.KillPrefillAt > 0 {
		faultAt(p.KillPrefillAt, func() {
			defer close(restarted)
			c.mu.Lock()
			pe := c.pe
			c.mu.Unlock()
			_ = pe.Signal(syscall.SIGKILL)
			c.fault("SIGKILL prefill")
			closeEndpoint(pe)
			c.mu.Lock()
			c.pGen++
			c.mu.Unlock()
			if err := c.startPrefill(ctx); err != nil {
				c.o.Log.Error("restarting prefill", "err", err)
				return
			}
			c.fault("new prefill up")
		})
	} else {
		close(restarted)
	}
	var wg sync.WaitGroup
	for i := range p.Requests {
		select {
		case <-at(p.Arrival(i)):
		case <-ctx.Done():
		}
		if ctx.Err() != nil {
			break
		}
		if p.KillPrefillAt > 0 && i >= p.RestartWave {
			<-restarted
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			c.one(ctx, i)
		}()
	}
	wg.Wait()
	faults.Wait()
}

// one takes request i through prefill and decode as the router does.
func (c *chaosRun) one(ctx context.Context, i int) {
	defer c.markQueued(i)
	id := reqID(i)
	// Send the load after the previous request is in decode's queue, and
	// the prefill after the previous one's was granted.
	inOrder := func() {
		if i > 0 {
			after(ctx, c.inQueue[i-1])
		}
	}
	if i > 0 {
		after(ctx, c.granted[i-1])
	}
	key := c.o.Seed<<20 ^ uint64(i+1)
	c.mu.Lock()
	pe, de, psetup := c.pe, c.de, c.psetup
	c.mu.Unlock()
	var pr engine.PrefillReply
	var lr engine.LoadReply
	var perr, derr error
	// Pull's decode gets the prefill's kv_transfer_params; push's the
	// coordinates the router sends it with the request. The router sends
	// push's two at once; decode's arrival is when prefill is done, as in
	// the plan, so prefill goes first there too.
	perr = pe.Call(ctx, "prefill", engine.PrefillRequest{ID: id, Tokens: c.o.ISL, Key: key}, &pr)
	c.markGranted(i)
	if perr == nil {
		c.mu.Lock()
		c.grants[id] = pr.TFinish
		c.mu.Unlock()
		inOrder()
		params := pr.Params
		if c.o.Protocol == engine.ProtoPush {
			host, port, _ := runcore.SplitHostPort(psetup.SideChannel)
			params = engine.TransferParams{DoRemotePrefill: true, RemoteEngineID: psetup.EngineID, RemoteRequestID: id,
				RemoteHost: host, RemotePort: port, TPSize: psetup.TP, PPSize: 1, TransferMode: string(engine.ProtoPush)}
		}
		derr = de.Call(ctx, "load", engine.LoadRequest{ID: id, Tokens: c.o.ISL, Key: key, Params: params}, &lr)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	switch {
	case perr != nil:
		c.loadErr[id] = "prefill: " + perr.Error()
	case derr != nil:
		c.loadErr[id] = "decode: " + derr.Error()
	default:
		c.loads[id] = lr
	}
}

// settle waits until prefill holds no lease (or the leases that are left
// could not end in time), so expiries are seen.
func (c *chaosRun) settle(ctx context.Context) {
	wait := c.lc.Initial() + c.lc.Extension() + 2*time.Second
	deadline := time.Now().Add(wait)
	for time.Now().Before(deadline) && ctx.Err() == nil {
		c.mu.Lock()
		pe := c.pe
		c.mu.Unlock()
		var st engine.Stats
		if err := pe.Call(ctx, "stats", nil, &st); err != nil {
			return
		}
		if st.LeasesHeld == 0 && st.BlocksInUse == 0 {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	time.Sleep(3 * c.plan.Step) // the last events
}

// finish turns what the run saw into the scenario's numbers.
func (c *chaosRun) finish(r *leasesim.ScenarioResult, blocksPerRequest int) {
	c.mu.Lock()
	pe, de, dead := c.pe, c.de, c.decodeDead
	c.mu.Unlock()
	var ps, ds engine.Stats
	if err := pe.Call(context.Background(), "stats", nil, &ps); err != nil {
		r.Errors = append(r.Errors, "prefill stats: "+err.Error())
	}
	if !dead {
		if err := de.Call(context.Background(), "stats", nil, &ds); err != nil {
			r.Errors = append(r.Errors, "decode stats: "+err.Error())
		}
	} else {
		c.mu.Lock()
		ds = c.lastD
		ds.BlocksInUse = 0 // its memory died with it
		c.mu.Unlock()
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	end := mono.Now()
	sec := func(ns int64) float64 { return float64(ns-c.t0) / 1e9 }
	reclaim, death := report.NewHistogram(), report.NewHistogram()
	tl := &leasesim.LeaseTimeline{Faults: c.faults}
	var deadGBs float64
	for i := range c.plan.Requests {
		id := reqID(i)
		f, freed := c.freed[id]
		lr, loaded := c.loads[id]
		reason := engine.FreedReason(f.Reason)
		consumed := freed && reason.Consumed()
		expired := freed && reason == engine.FreedExpired
		var tGone int64 // when decode gave the request up
		switch {
		case c.aborted[id]:
			r.Aborted++
			tGone = c.tAbort
		case loaded && lr.Error == "" && lr.CorruptBlocks == 0:
			r.Completed++
			if expired && f.TFreed < lr.TXferDone {
				r.CorruptAccepted++ // decode took data prefill had freed
			}
		case loaded:
			r.Failed++
			r.Recomputed++ // decode is alive: kv_load_failure_policy=recompute
			if expired && (lr.CorruptBlocks > 0 || strings.Contains(lr.Error, "watchdog")) {
				r.LateReadsDetected++
			}
		case dead && !consumed:
			r.Lost++
			tGone = c.tKill
		case dead:
			r.Completed++ // the KV was read; decode died after
		default:
			r.Failed++
			if msg := c.loadErr[id]; msg != "" {
				r.Errors = append(r.Errors, id+": "+msg)
			}
		}
		if loaded && lr.TScheduled > 0 {
			r.MaxQueueWaitS = max(r.MaxQueueWaitS, float64(lr.TScheduled-lr.TArrive)/1e9)
		}
		if consumed {
			r.Consumed++
		}
		gt := c.grants[id]
		if gt == 0 {
			continue
		}
		out := "held"
		tEnd := end
		if freed {
			out, tEnd = map[bool]string{true: string(engine.FreedConsumed), false: string(f.Reason)}[consumed], f.TFreed
		}
		tl.Leases = append(tl.Leases, leasesim.TimelineLease{Request: i, Start: sec(gt), End: sec(tEnd), Outcome: out, Renewals: f.Renewals})
		if expired {
			r.ExpiredLeases++
			if tGone == 0 { // decode was alive and meant to read it
				r.PrematureFrees++
			}
			reclaim.Record(time.Duration(f.TFreed - max(f.TLastRenew, f.TFinish)))
			if tGone > 0 {
				death.Record(time.Duration(f.TFreed - tGone))
			}
		}
		// Dead from when decode gave it up, or (alive) from its deadline.
		start := tGone
		if start == 0 && freed && f.TDeadline > 0 && f.TFreed > f.TDeadline && expired {
			start = f.TDeadline
		}
		if start > 0 && tEnd > start {
			bytes := f.HeldBytes
			if bytes == 0 {
				bytes = int64(blocksPerRequest) * c.o.Spec.BlockBytesAllRanks(1)
			}
			deadGBs += float64(bytes) / 1e9 * float64(tEnd-start) / 1e9
		}
	}
	r.DeadBlockGBs = deadGBs
	r.ReclaimLatencyS, r.DeathToFreeS = reclaim.In(time.Second), death.In(time.Second)
	for _, s := range c.samples {
		r.ExpiredUnreleased = max(r.ExpiredUnreleased, s.ExpiredHeld)
	}
	if n := len(c.samples); n > 0 {
		r.ExpiredUnreleasedEnd = c.samples[n-1].ExpiredHeld
	}
	r.HeartbeatsSent, r.HeartbeatsLost = ds.HeartbeatsSent, ds.HeartbeatsLost
	r.HeartbeatsRecvd = int64(len(c.heartbeats))
	r.HeartbeatIDs, r.Renewals, r.UnknownIDs = c.hbIDs, c.hbRenewed, c.hbUnknown
	r.LeakedBlocks = ps.BlocksInUse + ds.BlocksInUse
	sort.Slice(tl.Leases, func(i, j int) bool { return tl.Leases[i].Start < tl.Leases[j].Start })
	for _, h := range c.heartbeats {
		tl.Heartbeats = append(tl.Heartbeats, sec(h))
	}
	// Samples every step: keep at most about 2,000.
	stride := max(1, len(c.samples)/2000)
	for k, s := range c.samples {
		if k%stride == 0 || k == len(c.samples)-1 {
			tl.Held = append(tl.Held, leasesim.TimelineSample{T: sec(s.T), Held: s.Held, ExpiredHeld: s.ExpiredHeld, HeldBytes: s.HeldBytes})
		}
	}
	r.Timeline = tl
	r.Outcome = leasesim.OutcomeLine(r)
}

// LeaseSimOptions configure `lease-chaos --sim`: the same scenarios in
// virtual time, a long traffic run, and an optional lease sweep over it.
type LeaseSimOptions struct {
	Scenarios []string
	Policies  []lease.Policy
	Lease     time.Duration
	Timeout   time.Duration
	Reaper    lease.ReaperMode
	Spec      kv.Spec
	ISL       int
	// Traffic is the long run (its Lease and BytesPerRequest are filled
	// from the fields above); Requests 0 skips it.
	Traffic leasesim.TrafficOptions
	// Sweep lists lease durations to compare on the same traffic.
	Sweep   []time.Duration
	Version string
	Live    live.Sink
}

// RunLeaseSim runs the simulator.
func RunLeaseSim(ctx context.Context, o LeaseSimOptions) (*LeaseChaosResult, error) {
	errs := validateChaos(o.Scenarios, o.Policies, o.Lease, o.Timeout, o.Reaper, o.Spec, o.ISL)
	if len(o.Scenarios) == 0 && o.Traffic.Requests <= 0 {
		errs = append(errs, errors.New("nothing to simulate: no scenario and no traffic"))
	}
	if o.Traffic.Requests < 0 {
		errs = append(errs, errkind.Field("Traffic.Requests", "%d: want 0 (scenarios only) or more", o.Traffic.Requests))
	}
	if len(o.Sweep) > 0 && o.Traffic.Requests <= 0 {
		errs = append(errs, errors.New("--sweep-lease needs traffic: --requests > 0"))
	}
	var geo leasesim.SimGeometry
	if err := errors.Join(errs...); err == nil {
		spec, _ := o.Spec.Normalize()
		a, err := kv.Analyze(spec, o.ISL, spec.TP)
		if err != nil {
			errs = append(errs, err)
		}
		geo = leasesim.SimGeometry{BytesPerRequest: a.BytesPerRequest, BlocksPerRequest: a.BlocksPerRequest}
	}
	// The traffic run's lease is the one under test (the first policy when
	// only one is selected), and its requests weigh what the model says.
	to := o.Traffic
	to.Lease = lease.Config{Policy: lease.PolicyLease, Duration: o.Lease, Timeout: o.Timeout, Reaper: o.Reaper}
	if len(o.Policies) == 1 {
		to.Lease.Policy = o.Policies[0]
	}
	to.BytesPerRequest = geo.BytesPerRequest
	if o.Traffic.Requests > 0 && len(errs) == 0 {
		var err error
		if to, err = to.Validate(); err != nil {
			errs = append(errs, err)
		}
	}
	if err := errors.Join(errs...); err != nil {
		return nil, errkind.BadInput(err)
	}
	spec, _ := o.Spec.Normalize()
	res := &LeaseChaosResult{Meta: report.NewMeta("lease-chaos", o.Version), Mode: "sim", Model: spec.Model.Name}
	res.Config = LeaseChaosConfig{Scenarios: o.Scenarios, Policies: policyNames(o.Policies), Lease: runcore.Duration(o.Lease), Timeout: runcore.Duration(o.Timeout),
		Reaper: string(o.Reaper), Model: spec.Model.Name, ISL: o.ISL, Seed: new(o.Traffic.Seed), BytesPerRequest: geo.BytesPerRequest}
	t0 := time.Now()
	total := len(o.Scenarios) * len(o.Policies)
	if o.Traffic.Requests > 0 {
		total += 1 + len(o.Sweep)
		if len(o.Sweep) > 0 {
			total++ // the fixed row
		}
	}
	live.Emit(o.Live, live.Start{Title: "lease-chaos --sim", Total: total, Unit: "runs"})
	for _, sc := range o.Scenarios {
		for _, pol := range o.Policies {
			if ctx.Err() != nil {
				break
			}
			lc, _ := lease.Config{Policy: pol, Duration: o.Lease, Timeout: o.Timeout, Reaper: o.Reaper}.Normalize()
			p, _ := leasesim.PlanFor(sc, lc)
			r := leasesim.SimulatePlan(p, lc, geo)
			res.add(r, o.Live)
		}
	}
	if o.Traffic.Requests > 0 && ctx.Err() == nil {
		live.Emit(o.Live, live.Phase{Text: fmt.Sprintf("traffic: %s requests", report.Int(int64(to.Requests)))})
		tr, err := leasesim.SimulateTraffic(to)
		if err != nil {
			return nil, err
		}
		res.Traffic = &tr
		res.SimulatedRequests += tr.SimulatedRequests
		live.Emit(o.Live, live.Request{OK: true})
		if len(o.Sweep) > 0 && ctx.Err() == nil {
			live.Emit(o.Live, live.Phase{Text: fmt.Sprintf("sweeping %d lease durations", len(o.Sweep))})
			sw, err := leasesim.SweepLease(to, o.Sweep)
			if err != nil {
				return nil, err
			}
			res.Sweep = &sw
			for _, r := range sw.Rows {
				res.SimulatedRequests += r.Result.SimulatedRequests
				live.Emit(o.Live, live.Request{OK: true})
			}
		}
	}
	res.WallSeconds = time.Since(t0).Seconds()
	return res, res.finish(ctx)
}

// Ignored lists the options of o that the simulator does not read (it
// runs no processes and moves no bytes); the traffic options that only
// the simulator reads are leasesim.TrafficOptions, outside o.
func (o *LeaseChaosOptions) Ignored(sim bool) []runcore.IgnoredField {
	if !sim {
		if o.Protocol != engine.ProtoPush {
			return []runcore.IgnoredField{{Field: "PushHeartbeatKeys", Why: "push only (pull heartbeats name prefill's own id)"}}
		}
		return nil
	}
	const why = "--sim runs no processes and does not use it"
	return []runcore.IgnoredField{{Field: "Backend", Why: why}, {Field: "Protocol", Why: why}, {Field: "Slack", Why: why}, {Field: "PushHeartbeatKeys", Why: "--sim models pull's heartbeats (exact ids), not push"}}
}
