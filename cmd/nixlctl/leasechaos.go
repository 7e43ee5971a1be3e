package main

import (
	"context"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/nixlctl/nixlctl/internal/bench"
	"github.com/nixlctl/nixlctl/internal/errkind"
	"github.com/nixlctl/nixlctl/internal/kv"
	"github.com/nixlctl/nixlctl/internal/lease"
	"github.com/nixlctl/nixlctl/internal/leasesim"
	"github.com/nixlctl/nixlctl/internal/live"
	"github.com/nixlctl/nixlctl/internal/nixl"
	"github.com/nixlctl/nixlctl/internal/report"
)

type leaseChaosOptions struct {
	Scenario    []string      `mapstructure:"scenario"`
	Policy      []string      `mapstructure:"policy"`
	Lease       time.Duration `mapstructure:"kv-lease-duration"`
	Timeout     time.Duration `mapstructure:"timeout"`
	Reaper      string        `mapstructure:"reaper"`
	Protocol    string        `mapstructure:"protocol"`
	Backend     string        `mapstructure:"backend"`
	Model       string        `mapstructure:"model"`
	ModelConfig string        `mapstructure:"model-config"`
	KVDType     string        `mapstructure:"kv-dtype"`
	BlockSize   int           `mapstructure:"block-size"`
	ISL         int           `mapstructure:"isl"`
	Slack       time.Duration `mapstructure:"slack"`
	Seed        uint64        `mapstructure:"seed"`
	// --sim
	Sim            bool          `mapstructure:"sim"`
	Requests       int           `mapstructure:"requests"`
	Rate           float64       `mapstructure:"rate"`
	Decodes        int           `mapstructure:"decodes"`
	Slots          int           `mapstructure:"slots"`
	DecodeTime     time.Duration `mapstructure:"decode-time"`
	PrefillTime    time.Duration `mapstructure:"prefill-time"`
	TransferTime   time.Duration `mapstructure:"transfer-time"`
	Step           time.Duration `mapstructure:"step"`
	CrashEvery     time.Duration `mapstructure:"crash-every"`
	RestartAfter   time.Duration `mapstructure:"restart-after"`
	HBLoss         float64       `mapstructure:"hb-loss"`
	SweepLease     []string      `mapstructure:"sweep-lease"`
	measureOptions `mapstructure:",squash"`
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
		RunE: func(cmd *cobra.Command, _ []string) error {
			var o leaseChaosOptions
			if err := bindOptions(cmd, &o); err != nil {
				return err
			}
			return runLeaseChaos(cmd.Context(), a, o)
		},
	}
	f := cmd.Flags()
	f.StringSlice("scenario", leasesim.Scenarios(), "scenarios to run: "+strings.Join(leasesim.Scenarios(), ", "))
	f.StringSlice("policy", []string{"lease", "fixed"}, "policies: lease (heartbeat-renewed) and/or fixed (one timeout)")
	f.Duration("kv-lease-duration", 0, "lease duration, heartbeats every sixth, extension two thirds (default 3s; 30s with --sim)")
	f.Duration("timeout", 0, "the fixed policy's timeout (default 16 x the lease, as 480 s is to 30 s)")
	f.String("reaper", "full", "how prefill looks for expired leases: full (every entry) or head-only (vLLM before PR #50789)")
	f.String("protocol", "pull", "pull (decode READs) or push (prefill WRITEs)")
	f.String("backend", "auto", "transfer backend: "+strings.Join(append([]string{"auto"}, nixl.Backends()...), ", "))
	f.String("model", "", "model preset (default "+kv.DefaultModel+")")
	f.String("model-config", "", "HuggingFace config.json instead of a preset")
	f.String("kv-dtype", "", "KV cache dtype (default: the model's)")
	f.Int("block-size", 16, "tokens per KV block")
	f.Int("isl", 256, "prompt tokens of each request")
	f.Duration("slack", 250*time.Millisecond, "how late a free may be beyond the protocol's promise before a scenario fails")
	f.Uint64("seed", 1, "seed")
	f.Bool("sim", false, "simulate in virtual time instead of running processes")
	f.Int("requests", 1_000_000, "--sim: requests of the traffic run (0: scenarios only)")
	f.Float64("rate", 200, "--sim: arrivals per second (Poisson)")
	f.Int("decodes", 4, "--sim: decode engines")
	f.Int("slots", 16, "--sim: requests each decode runs at once")
	f.Duration("decode-time", 250*time.Millisecond, "--sim: mean time a request keeps its slot (exponential)")
	f.Duration("prefill-time", 50*time.Millisecond, "--sim: prefill time per request")
	f.Duration("transfer-time", 5*time.Millisecond, "--sim: KV transfer time per request")
	f.Duration("step", 20*time.Millisecond, "--sim: engine step (heartbeats and reaping happen at steps)")
	f.Duration("crash-every", 10*time.Minute, "--sim: mean time between crashes of each decode (0: none)")
	f.Duration("restart-after", 30*time.Second, "--sim: how long a crashed decode stays down")
	f.Float64("hb-loss", 0.05, "--sim: probability that a heartbeat message is lost")
	f.StringSlice("sweep-lease", nil, "--sim: lease durations to compare on the same traffic (e.g. 5s,10s,30s,60s,120s)")
	addMeasureFlags(cmd, false)
	return cmd
}

func runLeaseChaos(ctx context.Context, a *app, o leaseChaosOptions) error {
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
	spec, err := kvSpec(m, o.KVDType, o.BlockSize, "flash-attn", "HND", 1, 1, false)
	if err != nil {
		return err
	}
	if o.Lease == 0 {
		o.Lease = 3 * time.Second
		if o.Sim {
			o.Lease = lease.DefaultDuration
		}
	}
	// A lease beyond the maximum is refused by its validation; sixteen of
	// them could wrap into a negative timeout first.
	if o.Timeout == 0 && o.Lease <= lease.MaxDuration {
		o.Timeout = 16 * o.Lease
	}
	var policies []lease.Policy
	for _, p := range o.Policy {
		policies = append(policies, lease.Policy(strings.TrimSpace(p)))
	}
	if o.Sim {
		return runLeaseSim(ctx, a, o, spec, policies)
	}
	x := bench.LeaseChaosOptions{Scenarios: o.Scenario, Policies: policies, Lease: o.Lease, Timeout: o.Timeout, Reaper: lease.ReaperMode(o.Reaper),
		Protocol: o.Protocol, Backend: o.Backend, Spec: spec, ISL: o.ISL, Slack: o.Slack, Version: version, Seed: o.Seed, Log: a.log}
	if err := x.Validate(); err != nil {
		return errkind.BadInput(err)
	}
	return a.runChaos(ctx, o.measureOptions, "scenarios", func(ctx context.Context, sink live.Sink) (*bench.LeaseChaosResult, error) {
		x.Live = sink
		return bench.RunLeaseChaos(ctx, x)
	})
}

// runChaos runs real or simulated lease-chaos, renders the result and
// fails the command (exit 1) when a scenario failed.
func (a *app) runChaos(ctx context.Context, mo measureOptions, what string, run func(context.Context, live.Sink) (*bench.LeaseChaosResult, error)) error {
	var res *bench.LeaseChaosResult
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

func runLeaseSim(ctx context.Context, a *app, o leaseChaosOptions, spec kv.Spec, policies []lease.Policy) error {
	x := bench.LeaseSimOptions{Scenarios: o.Scenario, Policies: policies, Lease: o.Lease, Timeout: o.Timeout,
		Reaper: lease.ReaperMode(o.Reaper), Spec: spec, ISL: o.ISL, Version: version,
		Traffic: leasesim.TrafficOptions{Requests: o.Requests, Rate: o.Rate, Decodes: o.Decodes, Slots: o.Slots, DecodeTime: o.DecodeTime,
			PrefillTime: o.PrefillTime, TransferTime: o.TransferTime, Step: o.Step, CrashEvery: o.CrashEvery,
			RestartAfter: o.RestartAfter, HBLoss: o.HBLoss, Seed: o.Seed}}
	if o.Requests < 0 || o.Requests > leasesim.MaxTrafficRequests {
		return errkind.BadInputf("--requests %d: want 0 (scenarios only) to %d", o.Requests, leasesim.MaxTrafficRequests)
	}
	for _, s := range o.SweepLease {
		d, err := time.ParseDuration(strings.TrimSpace(s))
		if err != nil || d <= 0 {
			return errkind.BadInputf("--sweep-lease %q: want durations like 5s,30s,2m", s)
		}
		if d > lease.MaxDuration {
			return errkind.BadInputf("--sweep-lease %q: want at most %v", s, lease.MaxDuration)
		}
		x.Sweep = append(x.Sweep, d)
	}
	return a.runChaos(ctx, o.measureOptions, "simulated scenarios", func(ctx context.Context, sink live.Sink) (*bench.LeaseChaosResult, error) {
		x.Live = sink
		return bench.RunLeaseSim(ctx, x)
	})
}
