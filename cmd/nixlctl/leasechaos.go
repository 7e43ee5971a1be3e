package main

import (
	"context"
	"reflect"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/nixlctl/nixlctl/internal/errkind"
	"github.com/nixlctl/nixlctl/internal/kv"
	"github.com/nixlctl/nixlctl/internal/lease"
	"github.com/nixlctl/nixlctl/internal/leasechaos"
	"github.com/nixlctl/nixlctl/internal/leasesim"
	"github.com/nixlctl/nixlctl/internal/live"
	"github.com/nixlctl/nixlctl/internal/report"
	"github.com/nixlctl/nixlctl/internal/runcore"
)

// leaseChaosOptions is leasechaos.LeaseChaosOptions and, for --sim, the
// simulator's traffic (leasesim.TrafficOptions), which the flags decode
// into, plus the model flags that resolve to its kv.Spec, the lease sweep
// and the measuring flags.
type leaseChaosOptions struct {
	leasechaos.LeaseChaosOptions `mapstructure:",squash"`
	Traffic                      leasesim.TrafficOptions `mapstructure:",squash"`
	Model                        string                  `mapstructure:"model"`
	ModelConfig                  string                  `mapstructure:"model-config"`
	KVDType                      string                  `mapstructure:"kv-dtype"`
	BlockSize                    int                     `mapstructure:"block-size"`
	Sim                          bool                    `mapstructure:"sim"`
	SweepLease                   []string                `mapstructure:"sweep-lease"`
	measureOptions               `mapstructure:",squash"`
}

const leaseChaosLong = `The KV lease protocol (vLLM PR #41383) under injected faults, with real
prefill and decode processes and compressed time.

Prefill grants each finished request a lease (--kv-lease-duration, vLLM's
kv_lease_duration: 30 s there, 3 s here by default); decode heartbeats the
requests it waits for from the moment they arrive ("HB:<id>,<id>,..." to every
prefill rank, every lease/6); each heartbeat extends a lease to at least now +
2/3 of the lease; prefill frees a request's blocks when its KV was read or its
lease expired. The old policy (--policy fixed) has no heartbeats and one fixed
--timeout (VLLM_NIXL_ABORT_REQUEST_TIMEOUT: 480 s against the 30 s lease, so 16
leases here by default). --reaper head-only reproduces vLLM issue #58222: the
reaper stops at the first unexpired lease, so expired ones behind a renewed one
are never freed.

--protocol push keys heartbeats as upstream vLLM does (--push-heartbeat-keys
upstream): decode heartbeats the router's request id, prefill leases its own
suffixed id and looks ids up exactly, so no heartbeat renews a lease and the
lease policy's scenarios fail with "push heartbeats never renewed a lease: vLLM
#53095 reproduced". --push-heartbeat-keys fixed (decode's own id, matched by
base id, as vLLM PR #53244 proposes) shows the renewals working; the result
warns that it is not upstream behaviour. Push decode's registration watchdog
here is one lease (at least 1 s) and fails the request, so that a request whose
KV never comes ends (upstream: 480 s, drop and keep waiting); the result records
it.

Each scenario runs on a fresh pair of "nixlctl serve prefill|decode" processes
over the transfer backend, with decode running one request at a time so
requests queue for several leases:

  decode-overload    the queue holds requests 4.2 leases: heartbeats keep them
  heartbeat-loss     the same with every other heartbeat dropped (fault wrapper)
  slow-step          the same with quarter-lease engine steps (heartbeats late)
  decode-crash       decode is SIGKILLed with a request's transfer in flight, 4 queued
  decode-stall       SIGSTOP decode for two leases, then SIGCONT
  abort-before-read  the router aborts queued requests behind a waiting one
  prefill-restart    SIGKILL prefill with requests queued; a new one takes more

For each scenario and policy it reports: requests completed, leases expired,
premature frees (prefill freed blocks decode was still going to read; late
reads are caught by the block tags, since freed blocks are overwritten),
leases expired but not released, dead-block GB·s (bytes held x seconds after
their decode was gone), reclaim latency (last heartbeat -> free), fault -> free,
the longest queue wait and the heartbeats sent, lost and applied; and a
PASS/FAIL line with the expectation it checks. The exit status is 1 when a
scenario fails. The JSON result carries every lease's timeline for plots
(--plot) and the TUI.

--sim drives the same state machines (prefill's lease table, decode's
heartbeat tracker) with a virtual clock and an event queue instead of
processes: the scenarios above in virtual time (judged the same way), then a
long run of traffic: --requests arriving at --rate (Poisson) on --decodes
decode engines of --slots slots, each request decoding for --decode-time
(exponential), each decode crashing every --crash-every on average and coming
back after --restart-after, each heartbeat lost with probability --hb-loss.
--sweep-lease 5s,10s,30s,60s,120s runs the same traffic (same seed: the same
arrivals and crashes) for each lease and the fixed timeout, prints dead-block
GB·s, premature frees, expired leases and heartbeat traffic side by side, and
recommends the lease with the least dead KV among those that free nothing
early. With --sim the lease defaults to vLLM's 30 s (timeout 480 s).`

const leaseChaosExample = `  nixlctl lease-chaos
  nixlctl lease-chaos --scenario decode-crash,decode-overload --policy lease
  nixlctl lease-chaos --policy fixed --timeout 3s --scenario decode-overload   # a short fixed timeout frees too early
  nixlctl lease-chaos --reaper head-only --scenario abort-before-read          # vLLM #58222
  nixlctl lease-chaos --protocol push --kv-lease-duration 2s --plot leases.png
  nixlctl lease-chaos --sim --sweep-lease 5s,10s,30s,60s,120s
  nixlctl lease-chaos --sim --scenario decode-crash --requests 200000 --rate 500 --hb-loss 0.3 --sweep-lease 10s,30s`

func newLeaseChaosCmd(a *app) *cobra.Command {
	cmd := &cobra.Command{
		Use:     "lease-chaos",
		Short:   "The KV lease/heartbeat protocol under injected faults (real processes, or a simulator)",
		Long:    leaseChaosLong,
		Example: leaseChaosExample,
		Args:    cobra.NoArgs,
		RunE:    bound(a.runLeaseChaos),
	}
	d, t := leasechaos.DefaultLeaseChaosOptions(), leasesim.DefaultTrafficOptions()
	var policies []string
	for _, p := range d.Policies {
		policies = append(policies, string(p))
	}
	f := cmd.Flags()
	f.StringSlice("scenario", d.Scenarios, "scenarios to run: "+strings.Join(leasesim.Scenarios(), ", "))
	f.StringSlice("policy", policies, "policies: lease (heartbeat-renewed) and/or fixed (one timeout)")
	f.Duration("kv-lease-duration", d.Lease, "lease duration, heartbeats every sixth, extension two thirds (default 3s; 30s with --sim)")
	f.Duration("timeout", d.Timeout, "the fixed policy's timeout (default 16 x the lease, as 480 s is to 30 s)")
	f.String("reaper", string(d.Reaper), "how prefill looks for expired leases: full (every entry) or head-only (vLLM before PR #50789)")
	f.String("protocol", d.Protocol.String(), "pull (decode READs) or push (prefill WRITEs)")
	f.String("push-heartbeat-keys", d.PushHeartbeatKeys.String(), "push: upstream (heartbeats keyed by the router's id never renew a lease: vLLM #53095) or fixed (decode's id matched by base id; not upstream behaviour)")
	transferBackendFlag(f, d.Backend, "")
	f.String("model", "", "model preset (default "+kv.DefaultModel+")")
	f.String("model-config", "", "HuggingFace config.json instead of a preset")
	f.String("kv-dtype", "", "KV cache dtype (default: the model's)")
	f.Int("block-size", 16, "tokens per KV block")
	f.Int("isl", d.ISL, "prompt tokens of each request")
	f.Duration("slack", d.Slack, "how late a free may be beyond the protocol's promise before a scenario fails")
	f.Uint64("seed", d.Seed, "seed")
	f.Bool("sim", false, "simulate in virtual time instead of running processes")
	f.Int("requests", t.Requests, "--sim: requests of the traffic run (0: scenarios only)")
	f.Float64("rate", t.Rate, "--sim: arrivals per second (Poisson)")
	f.Int("decodes", t.Decodes, "--sim: decode engines")
	f.Int("slots", t.Slots, "--sim: requests each decode runs at once")
	f.Duration("decode-time", t.DecodeTime, "--sim: mean time a request keeps its slot (exponential)")
	f.Duration("prefill-time", t.PrefillTime, "--sim: prefill time per request")
	f.Duration("transfer-time", t.TransferTime, "--sim: KV transfer time per request")
	f.Duration("step", t.Step, "--sim: engine step (heartbeats and reaping happen at steps)")
	f.Duration("crash-every", t.CrashEvery, "--sim: mean time between crashes of each decode (0: none)")
	f.Duration("restart-after", t.RestartAfter, "--sim: how long a crashed decode stays down")
	f.Float64("hb-loss", t.HBLoss, "--sim: probability that a heartbeat message is lost")
	f.StringSlice("sweep-lease", nil, "--sim: lease durations to compare on the same traffic (e.g. 5s,10s,30s,60s,120s)")
	addMeasureFlags(cmd, false)
	return cmd
}

func (o leaseChaosOptions) checkExplicit(set explicitOptions) error {
	if err := ignoredErrors(set, o, o.ignored()); err != nil {
		return err
	}
	// 0 is "the default" (settle), as if not given.
	return refuseExplicitZero(set,
		zeroFlag{"kv-lease-duration", o.Lease == 0, "a positive duration", "3s, or 30s with --sim"},
		zeroFlag{"timeout", o.Timeout == 0, "a positive duration", "16 x the lease"},
	)
}

// ignored lists what the mode does not read: without --sim, every
// traffic option (each tagged field of leasesim.TrafficOptions but the
// seed, which both modes use) and --sweep-lease; with --sim, what only
// real processes use.
func (o leaseChaosOptions) ignored() []runcore.IgnoredField {
	if o.Sim {
		return o.LeaseChaosOptions.Ignored(true)
	}
	const why = "only with --sim (real processes run the scenarios only)"
	var out []runcore.IgnoredField
	t := reflect.TypeFor[leasesim.TrafficOptions]()
	for i := range t.NumField() {
		if name, _, _ := strings.Cut(t.Field(i).Tag.Get("mapstructure"), ","); name != "" && name != "-" && name != "seed" {
			out = append(out, runcore.IgnoredField{Field: "Traffic." + t.Field(i).Name, Why: why})
		}
	}
	return append(out, runcore.IgnoredField{Field: "SweepLease", Why: why})
}

func (a *app) runLeaseChaos(ctx context.Context, o leaseChaosOptions) error {
	if err := o.measureOptions.validate(); err != nil {
		return err
	}
	if err := checkBackendName(o.Backend); err != nil {
		return err
	}
	m, err := loadModel(o.Model, o.ModelConfig)
	if err != nil {
		return err
	}
	x := o.LeaseChaosOptions
	x.Version, x.Log = version, a.log
	for i, p := range x.Policies { // "lease, fixed" as well as "lease,fixed"
		x.Policies[i] = lease.Policy(strings.TrimSpace(string(p)))
	}
	if x.Spec, err = kvSpec(m, o.KVDType, o.BlockSize, "flash-attn", "HND", 1, 1, false); err != nil {
		return err
	}
	if o.Sim {
		return runLeaseSim(ctx, a, o, x)
	}
	if err := x.Validate(); err != nil {
		return flagErrors(err, o)
	}
	x.ChildStderr = a.childStderr(o.measureOptions)
	return a.runChaos(ctx, o.measureOptions, "scenarios", func(ctx context.Context, sink live.Sink) (*leasechaos.LeaseChaosResult, error) {
		x.Live = sink
		return leasechaos.RunLeaseChaos(ctx, x)
	})
}

// runChaos runs real or simulated lease-chaos, renders the result and
// fails the command (exit 1) when a scenario failed.
func (a *app) runChaos(ctx context.Context, mo measureOptions, what string, run func(context.Context, live.Sink) (*leasechaos.LeaseChaosResult, error)) error {
	var res *leasechaos.LeaseChaosResult
	_, err := a.measureAndRender(ctx, mo, func(ctx context.Context, sink live.Sink) (report.Result, error) {
		var err error
		if res, err = run(ctx, sink); res == nil {
			return nil, err
		}
		return res, err
	})
	if err != nil || res == nil {
		return err
	}
	if res.Failed > 0 {
		return errkind.CheckFailedf("%d of %d %s failed", res.Failed, res.Failed+res.Passed, what)
	}
	return nil
}

func runLeaseSim(ctx context.Context, a *app, o leaseChaosOptions, lo leasechaos.LeaseChaosOptions) error {
	if n := o.Traffic.Requests; n > leasesim.MaxTrafficRequests {
		return errkind.BadInputf("--requests %d: want 0 (scenarios only) to %d", n, leasesim.MaxTrafficRequests)
	}
	var sweep []time.Duration
	for _, s := range o.SweepLease {
		d, err := time.ParseDuration(strings.TrimSpace(s))
		if err != nil || d <= 0 {
			return errkind.BadInputf("--sweep-lease %q: want durations like 5s,30s,2m", s)
		}
		if d > lease.MaxDuration {
			return errkind.BadInputf("--sweep-lease %q: want at most %v", s, lease.MaxDuration)
		}
		sweep = append(sweep, d)
	}
	x := lo.Sim(o.Traffic, sweep)
	return a.runChaos(ctx, o.measureOptions, "simulated scenarios", func(ctx context.Context, sink live.Sink) (*leasechaos.LeaseChaosResult, error) {
		x.Live = sink
		res, err := leasechaos.RunLeaseSim(ctx, x)
		if res == nil && errkind.IsBadInput(err) {
			err = flagErrors(err, o) // the options were refused before anything ran
		}
		return res, err
	})
}
