package main

import (
	"context"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/nixlctl/nixlctl/internal/bench"
	"github.com/nixlctl/nixlctl/internal/engine"
	"github.com/nixlctl/nixlctl/internal/errkind"
	"github.com/nixlctl/nixlctl/internal/kv"
	"github.com/nixlctl/nixlctl/internal/live"
	"github.com/nixlctl/nixlctl/internal/nixl"
	"github.com/nixlctl/nixlctl/internal/report"
)

type leaseChaosOptions struct {
	Scenario       []string      `mapstructure:"scenario"`
	Policy         []string      `mapstructure:"policy"`
	Lease          time.Duration `mapstructure:"kv-lease-duration"`
	Timeout        time.Duration `mapstructure:"timeout"`
	Reaper         string        `mapstructure:"reaper"`
	Protocol       string        `mapstructure:"protocol"`
	Backend        string        `mapstructure:"backend"`
	Model          string        `mapstructure:"model"`
	ModelConfig    string        `mapstructure:"model-config"`
	KVDType        string        `mapstructure:"kv-dtype"`
	BlockSize      int           `mapstructure:"block-size"`
	ISL            int           `mapstructure:"isl"`
	Slack          time.Duration `mapstructure:"slack"`
	Seed           uint64        `mapstructure:"seed"`
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
  decode-crash       SIGKILL decode as a request starts its transfer, 4 queued
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
(--plot) and the TUI.`

const leaseChaosExample = `  nixlctl lease-chaos
  nixlctl lease-chaos --scenario decode-crash,decode-overload --policy lease
  nixlctl lease-chaos --policy fixed --timeout 3s --scenario decode-overload   # a short fixed timeout frees too early
  nixlctl lease-chaos --reaper head-only --scenario abort-before-read          # vLLM #58222
  nixlctl lease-chaos --protocol push --kv-lease-duration 2s --plot leases.png`

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
	f.StringSlice("scenario", bench.Scenarios(), "scenarios to run: "+strings.Join(bench.Scenarios(), ", "))
	f.StringSlice("policy", []string{"lease", "fixed"}, "policies: lease (heartbeat-renewed) and/or fixed (one timeout)")
	f.Duration("kv-lease-duration", 3*time.Second, "lease duration (heartbeats every sixth, extension two thirds)")
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
	x := bench.LeaseChaosOptions{Scenarios: o.Scenario, Lease: o.Lease, Timeout: o.Timeout, Reaper: engine.ReaperMode(o.Reaper),
		Protocol: o.Protocol, Backend: o.Backend, Spec: spec, ISL: o.ISL, Slack: o.Slack, Version: version, Seed: o.Seed, Log: a.log}
	for _, p := range o.Policy {
		x.Policies = append(x.Policies, engine.LeasePolicy(strings.TrimSpace(p)))
	}
	if x.Timeout == 0 {
		x.Timeout = 16 * x.Lease
	}
	if err := x.Validate(); err != nil {
		return errkind.BadInput(err)
	}
	var res *bench.LeaseChaosResult
	_, runErr := a.measure(ctx, o.measureOptions, func(ctx context.Context, sink live.Sink) (report.Result, error) {
		x.Live = sink
		var err error
		res, err = bench.RunLeaseChaos(ctx, x)
		if res == nil {
			return nil, err
		}
		return res, err
	})
	if res == nil {
		return runErr
	}
	if err := a.render(res); err != nil {
		return err
	}
	if runErr != nil {
		return runErr
	}
	if res.Failed > 0 {
		return errkind.CheckFailedf("%d of %d scenarios failed", res.Failed, res.Failed+res.Passed)
	}
	return nil
}
