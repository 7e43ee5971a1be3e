package main

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/nixlctl/nixlctl/internal/engine"
	"github.com/nixlctl/nixlctl/internal/errkind"
	"github.com/nixlctl/nixlctl/internal/kv"
	"github.com/nixlctl/nixlctl/internal/nixl"
	"github.com/nixlctl/nixlctl/internal/runcore"
	"github.com/nixlctl/nixlctl/internal/standin"
)

// standinOptions are serve prefill's flags for running without a driver
// (--side-channel): the engine's own configuration, which a driver would
// otherwise send.
type standinOptions struct {
	SideChannel  string `mapstructure:"side-channel"`
	HTTP         string `mapstructure:"http"`
	EngineID     string `mapstructure:"engine-id"`
	ServedModel  string `mapstructure:"served-model-name"`
	PromptTokens int    `mapstructure:"prompt-tokens"`
	TP           int    `mapstructure:"tp"`
	NumBlocks    int    `mapstructure:"num-blocks"`
	Backend      string `mapstructure:"backend"`
	Mem          string `mapstructure:"mem"`
	Device       int    `mapstructure:"device"`
	Lease        string `mapstructure:"kv-lease-duration"`
	specFlags    `mapstructure:",squash"`
}

// standinFlags are the flags only the stand-in reads.
var standinFlags = []string{"side-channel", "http", "engine-id", "served-model-name", "prompt-tokens", "tp", "num-blocks",
	"backend", "mem", "device", "kv-lease-duration", "model", "model-config", "kv-dtype", "block-size", "layout", "kv-cache-layout"}

const standinHelp = `
Without a driver (--side-channel HOST:PORT), "serve prefill" stands in for a
vLLM prefill engine next to a real vLLM decode: it serves vLLM's NIXL handshake
on HOST:PORT (VLLM_NIXL_SIDE_CHANNEL_HOST:VLLM_NIXL_SIDE_CHANNEL_PORT, 5600 by
default upstream) and the slice of vLLM's OpenAI API a disaggregated proxy uses
on --http: POST /v1/completions and /v1/chat/completions with
"kv_transfer_params": {"do_remote_decode": true}, GET /health, GET /v1/models,
and GET /nixlctl/stats (the engine's counters). A prefill leg allocates the
prompt's blocks in a KV cache laid out like the model's (--model, --tp,
--block-size, --kv-dtype, --kv-cache-layout), fills them with tags, holds them
under a lease (--kv-lease-duration, renewed by the decode's heartbeats) and
answers with vLLM's kv_transfer_params; the decode handshakes, READs the blocks
and sends its completion notification, which frees them. With --backend nixl
(the default here) the handshake carries NIXL's own agent blob, the one a vLLM
decode's NIXL agent loads. --compat-factors FILE makes the compatibility hash
exactly the one vLLM computes from those factors (give the decode's); without it
the hash is nixlctl's own and a vLLM decode refuses it unless started with
enforce_handshake_compat=false.

What is emulated: the pull protocol's wire (handshake payload and metadata,
kv_transfer_params, notifications, heartbeats, leases) and a real NIXL/UCX KV
region. What is not: no model runs (the completion text is empty, one token is
reported); text prompts are counted without a tokenizer (their bytes plus 8, an
upper bound, so the decode finds at least the blocks it needs; token-id prompts
are exact; --prompt-tokens N fixes the count); push mode, SGLang, PP > 1 and
several DP ranks are not served.`

func addStandinFlags(cmd *cobra.Command) {
	f := cmd.Flags()
	f.String("side-channel", "", "run without a driver: serve vLLM's NIXL handshake on [tcp://]HOST:PORT and stand in for a prefill engine (see above)")
	f.String("http", "127.0.0.1:8100", "with --side-channel: the OpenAI-style API's [HOST]:PORT")
	addStandinEngineFlags(cmd, "--side-channel", "prefill",
		"the engine id to advertise (default: prefill-<random>)",
		"count every text prompt as this many tokens (default: its bytes + 8)",
		"transfer backend (nixl: NIXL's agent blob, what a vLLM decode loads; ucx: nixlctl decodes only)")
	f.String("kv-lease-duration", "30s", "with --side-channel: how long a finished request's blocks are held without heartbeats (vLLM's kv_lease_duration)")
}

// addStandinEngineFlags adds the engine flags both stand-ins read, each
// help line saying which flag (with) starts the stand-in; the three
// whose meaning differs between the roles bring their own words.
func addStandinEngineFlags(cmd *cobra.Command, with, role, engineIDHelp, promptTokensHelp, backendHelp string) {
	f := cmd.Flags()
	w := "with " + with + ": "
	f.String("engine-id", "", w+engineIDHelp)
	f.String("served-model-name", "", w+"the model name /v1/models lists (default: --model)")
	f.Int("prompt-tokens", 0, w+promptTokensHelp)
	f.Int("tp", 1, w+"tensor-parallel ranks of this "+role+" (one agent and region each)")
	f.Int("num-blocks", 4096, w+"KV blocks per rank")
	f.String("backend", "nixl", w+backendHelp)
	f.String("mem", "dram", w+"where the KV cache lives: dram or vram")
	f.Int("device", 0, "with "+with+" --mem vram: the GPU")
	f.String("model", "", w+"model preset (default "+kv.DefaultModel+")")
	f.String("model-config", "", w+"a HuggingFace config.json instead of --model")
	f.String("kv-dtype", "", w+"KV cache dtype (default: the model's)")
	f.Int("block-size", 16, w+"tokens per KV block")
	f.String("layout", "", w+"attention layout (default: the model's)")
	f.String("kv-cache-layout", "", w+"HND or NHD (default HND)")
}

// standinConfig checks the stand-in's flags and builds its engine's
// configuration, before anything is allocated.
func standinConfig(so serveEngineOptions) (engine.Config, kv.Spec, error) {
	o := so.standinOptions
	side := strings.TrimPrefix(o.SideChannel, "tcp://")
	host, port, err := net.SplitHostPort(side)
	if err != nil || port == "" {
		return engine.Config{}, kv.Spec{}, errkind.BadInputf("--side-channel %q: want [tcp://]HOST:PORT (vLLM's default port is 5600)", o.SideChannel)
	}
	if err := o.checkHTTPSide(); err != nil {
		return engine.Config{}, kv.Spec{}, err
	}
	lease, err := parseDurationFlag("kv-lease-duration", o.Lease, false)
	if err != nil {
		return engine.Config{}, kv.Spec{}, err
	}
	cfg, spec, err := so.standinEngineConfig(engine.RolePrefill, engine.Knobs{DRAMAlloc: engine.AllocMmap, Verify: engine.Sparse, Lease: runcore.Duration(lease)},
		func(cfg *engine.Config) {
			cfg.SideChannel, cfg.Advertise = "tcp://"+net.JoinHostPort(host, port), so.Advertise
		})
	if err != nil {
		return cfg, spec, err
	}
	if cfg.Advertise == "" && engine.Unroutable(host) {
		return cfg, spec, errkind.BadInput(engine.NoAdvertise("--side-channel " + o.SideChannel))
	}
	return cfg, spec, nil
}

// standinEngineConfig is the engine configuration both stand-ins build
// from their checked layout flags and identity; role adds what only it
// sets before the identity is applied.
func (so serveEngineOptions) standinEngineConfig(r engine.Role, knobs engine.Knobs, role func(*engine.Config)) (engine.Config, kv.Spec, error) {
	o := so.standinOptions
	spec, mem, err := o.engineSpec()
	if err != nil {
		return engine.Config{}, kv.Spec{}, err
	}
	cfg := engine.Config{Role: r, EngineID: o.EngineID, Backend: o.Backend, Protocol: engine.ProtoPull,
		Model: spec.Model, KVDType: spec.DType, BlockSize: spec.BlockSize, Layout: spec.Layout, Order: spec.Order, TP: spec.TP,
		NumBlocks: o.NumBlocks, Mem: mem, Device: o.Device, Knobs: knobs}
	if role != nil {
		role(&cfg)
	}
	if err := so.applyIdentity(&cfg); err != nil {
		return cfg, spec, err
	}
	return cfg, spec, nil
}

// runStandin serves until interrupted.
func runStandin(ctx context.Context, a *app, so serveEngineOptions) error {
	o := so.standinOptions
	cfg, spec, err := standinConfig(so)
	if err != nil {
		return err
	}
	// The side channel binds inside NewEngine, after the pools are
	// allocated and filled (8 GiB for llama-3.1-8b's defaults): a taken
	// port (--http's own, say) is found first, in a moment.
	checkSide := func() error {
		side, err := net.Listen("tcp", strings.TrimPrefix(o.SideChannel, "tcp://"))
		if err != nil {
			return errkind.BadInputf("--side-channel: %v", err)
		}
		return side.Close()
	}
	ln, eng, rep, err := startStandin(ctx, a, cfg, spec, o.HTTP, checkSide)
	if err != nil {
		return err
	}
	defer ln.Close()
	defer eng.Close()
	if cfg.Backend == "ucx" {
		fmt.Fprintln(a.io.ErrOut, "warning: --backend ucx advertises nixlctl's own agent blob: only nixlctl decodes can load it, a vLLM decode needs --backend nixl")
	}
	if cfg.CompatFactors == nil && cfg.CompatHashHex == "" {
		fmt.Fprintln(a.io.ErrOut, "warning: no --compat-factors: the compatibility hash is nixlctl's own, which a vLLM decode refuses unless enforce_handshake_compat=false")
	}
	fmt.Fprintf(a.io.ErrOut, "side channel %s (compatibility hash %s)\nAPI http://%s/v1/completions\n", rep.SideChannel, rep.CompatHash, ln.Addr())
	api := standin.New(eng, o.apiOptions(spec), a.log)
	start := time.Now()
	err = api.Serve(ctx, ln)
	c, st := api.Counts(), eng.Stats()
	// The stand-in serves handshakes, it makes none: report those its
	// side channel answered (Stats.Handshakes counts the ones an engine
	// makes, always 0 here).
	fmt.Fprintf(a.io.ErrOut, "stand-in stopped after %v: %d legs served, %d refused, %d failed; %d handshakes served, %d for unknown ranks left unanswered; %d blocks still held\n",
		time.Since(start).Round(time.Second), c.Served, c.Rejected, c.Failed, st.HandshakesServed, st.UnknownRankHandshakes, st.BlocksInUse)
	return standinExit(ctx, err)
}

// startStandin listens on a stand-in's --http address, runs check (nil:
// none) and starts its engine, saying what it serves; the caller closes
// the listener and the engine.
func startStandin(ctx context.Context, a *app, cfg engine.Config, spec kv.Spec, httpAddr string, check func() error) (net.Listener, *engine.Engine, engine.SetupReply, error) {
	ln, err := net.Listen("tcp", httpAddr)
	if err != nil {
		return nil, nil, engine.SetupReply{}, errkind.BadInputf("--http: %v", err)
	}
	if check != nil {
		if err := check(); err != nil {
			ln.Close()
			return nil, nil, engine.SetupReply{}, err
		}
	}
	eng, err := engine.NewEngine(ctx, cfg, a.log, nil)
	if err != nil {
		ln.Close()
		return nil, nil, engine.SetupReply{}, fmt.Errorf("%s engine: %w", cfg.Role, err)
	}
	rep := eng.Setup()
	fmt.Fprintf(a.io.ErrOut, "stand-in %s %s: %s, tp %d, %d blocks of %d tokens per rank (%s, %s), backend %s %s\n",
		cfg.Role, rep.EngineID, spec.Model.Name, spec.TP, cfg.NumBlocks, spec.BlockSize, spec.DType, spec.Order, rep.Backend, rep.Version)
	return ln, eng, rep, nil
}

// apiOptions are what a stand-in's OpenAI-style API needs to know.
func (o standinOptions) apiOptions(spec kv.Spec) standin.Options {
	return standin.Options{ServedModel: cmp.Or(o.ServedModel, spec.Model.Name), PromptTokens: o.PromptTokens, MaxModelLen: spec.Model.MaxPositions}
}

// standinExit is how a stand-in's serve ends: stopped by a signal, it
// exits as every other command does (130), not 0, so that a supervisor
// can tell a stop from a clean finish.
func standinExit(ctx context.Context, err error) error {
	var intr errInterrupted
	if err == nil && errors.As(context.Cause(ctx), &intr) {
		return intr
	}
	return err
}

// checkHTTPSide checks the flags of a stand-in's OpenAI-style HTTP side,
// which the prefill and the decode stand-ins share.
func (o standinOptions) checkHTTPSide() error {
	if _, _, err := net.SplitHostPort(o.HTTP); err != nil {
		return errkind.BadInputf("--http %q: want [HOST]:PORT", o.HTTP)
	}
	if o.PromptTokens < 0 || o.PromptTokens > kv.MaxTokens {
		return errkind.BadInputf("--prompt-tokens %d: want 0 (count bytes) to %d", o.PromptTokens, kv.MaxTokens)
	}
	if o.NumBlocks <= 0 || o.NumBlocks > 1<<24 {
		return errkind.BadInputf("--num-blocks %d: want 1 to %d", o.NumBlocks, 1<<24)
	}
	return nil
}

// engineSpec is a stand-in's KV layout, memory type and backend, checked:
// what its engine is built from, the same for the prefill and the decode.
func (o standinOptions) engineSpec() (kv.Spec, nixl.MemType, error) {
	m, err := loadModel(o.Model, o.ModelConfig)
	if err != nil {
		return kv.Spec{}, 0, err
	}
	spec, err := kvSpec(m, o.KVDType, o.BlockSize, o.Layout, o.KVCacheLayout, o.TP, 1, false)
	if err != nil {
		return kv.Spec{}, 0, err
	}
	if spec, err = spec.Normalize(); err != nil {
		return kv.Spec{}, 0, errkind.BadInput(err)
	}
	mem, err := nixl.ParseMemType(o.Mem)
	if err != nil {
		return kv.Spec{}, 0, errkind.BadInputf("--mem %q: %v", o.Mem, err)
	}
	if err := checkBackendName(o.Backend); err != nil {
		return kv.Spec{}, 0, err
	}
	if _, err := nixl.Resolve(o.Backend); err != nil {
		return kv.Spec{}, 0, errkind.BadInputf("--backend %s: %v", o.Backend, err)
	}
	return spec, mem, nil
}
