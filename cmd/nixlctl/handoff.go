package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/nixlctl/nixlctl/internal/engine"
	"github.com/nixlctl/nixlctl/internal/errkind"
	"github.com/nixlctl/nixlctl/internal/handoff"
	"github.com/nixlctl/nixlctl/internal/kv"
	"github.com/nixlctl/nixlctl/internal/live"
	"github.com/nixlctl/nixlctl/internal/rendezvous"
	"github.com/nixlctl/nixlctl/internal/report"
	"github.com/nixlctl/nixlctl/internal/runcore"
)

// handoffOptions is handoff.HandoffOptions, which the flags decode into,
// plus what only the command line has: the model flags that resolve to
// its kv.Spec, and the measuring flags.
type handoffOptions struct {
	handoff.HandoffOptions `mapstructure:",squash"`
	specFlags              `mapstructure:",squash"`
	measureOptions         `mapstructure:",squash"`
}

// specFlags are the flags that describe a deployed model's KV cache
// (resolved by kvSpec); TP is the prefill's.
type specFlags struct {
	Model         string `mapstructure:"model"`
	ModelConfig   string `mapstructure:"model-config"`
	KVDType       string `mapstructure:"kv-dtype"`
	BlockSize     int    `mapstructure:"block-size"`
	Layout        string `mapstructure:"layout"`
	KVCacheLayout string `mapstructure:"kv-cache-layout"`
	PrefillTP     int    `mapstructure:"prefill-tp"`
	PP            int    `mapstructure:"pp"`
}

var protocolHelp = map[engine.Protocol]string{
	engine.ProtoPull: `vLLM's default NixlConnector flow. Prefill computes the request, arms a lease on
its blocks and returns kv_transfer_params (block ids, engine id, side channel);
the router forwards them to decode, which handshakes with prefill's side
channel (ZMQ ROUTER, msgpack get_meta_msg, compatibility hash checked) the first
time, allocates its blocks, and READs them with the notification
"<prefill request id>:<consumers>"; prefill frees the blocks when every consumer
reported, or when the lease (--kv-lease-duration) expires.`,
	engine.ProtoPush: `vLLM's NixlPushConnector. The router dispatches both legs at once; decode
allocates its blocks and sends "PUSH_REG:<msgpack>" with them to every prefill
rank; each prefill rank's writer matches registrations and finished requests in
either arrival order (exact request id, then the id without its random
"-<8 hex>" suffix) and WRITEs straight into decode's blocks with the
notification "<decode request id>:<prefill tp>"; decode is done when the
expected notifications arrived. A failed WRITE is not reported to decode, as in
vLLM.

Heartbeats are keyed as upstream keys them (--push-heartbeat-keys upstream):
decode heartbeats the router's request id, prefill leases its own suffixed id
and looks heartbeat ids up exactly, so push heartbeats never renew a lease
(vLLM issue #53095); prefill's stats count the unknown ids
(leases.unknown_renewals). --push-heartbeat-keys fixed heartbeats decode's own
id, matched by base id as vLLM PR #53244 proposes: not upstream behaviour, and
the result says so.

The registration watchdog (--registration-timeout) fails the request here by
default after 60 s (--registration-watchdog fail), so that a run whose prefill
never writes ends: this bench default is not upstream's. vLLM's
push_registration_timeout is 480 s, and when it fires vLLM only drops the
registration and logs; the request keeps waiting (--registration-timeout 480s
--registration-watchdog drop). A served engine given no timeout uses 480 s and
drop. Results record both and warn when they differ from upstream.`,
	engine.ProtoSGLang: `SGLang's NIXL disaggregation. The router gives both legs a 63-bit bootstrap
room; prefill runs the bootstrap HTTP server (/route, /health, /register_dp_rank,
/query_dp_ranks) where its ranks register; decode looks the ranks up, registers its KV buffers with each once
(ZMQ PUSH to the rank's PULL inbox, room "None"), pre-allocates pages and an aux
(metadata) row and sends a TransferInfo with the page indices; prefill WRITEs
the pages chunk by chunk (--chunk-tokens, page-aligned) with
"{room}_kv_{chunk}_{last}_{rank}" notifications and the aux row with
"{room}_aux"; decode polls until every chunk and the aux arrived and checks
that the aux row carries its room.

Timeouts are upstream's by default: a prefill room waits up to
--sglang-bootstrap-timeout for decode's TransferInfo and a decode room up to
--sglang-waiting-timeout for its KV, 300 s each. A dead prefill is noticed
sooner: decode GETs /health on every prefill's bootstrap server each
--sglang-heartbeat-interval (5 s, at least 2 s; connect 2 s, read 3 s) and
after --sglang-heartbeat-max-failures (2) failed checks in a row it forgets
that prefill and fails every room waiting on it, naming the prefill and the
failures. Each default comes from SGLang's own environment variable when set
(SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT, _WAITING_TIMEOUT, _HEARTBEAT_INTERVAL,
_HEARTBEAT_MAX_FAILURE); a flag wins. The result counts the checks, the failed
ones, the prefills given up on and the rooms that failed with them.`,
}

const handoffCommon = `

Both endpoints are real: child processes ("nixlctl serve prefill|decode") on
loopback by default, goroutines with --inproc, or endpoints started elsewhere
with --prefill HOST:PORT --decode HOST:PORT. Every TP rank is its own agent with
a paged KV pool laid out like the engine's (see "nixlctl kv layout"); prefill
"computes" by writing tags derived from (request, layer, block, head) into the
request's blocks (plus --prefill-time per token, to mimic compute), and decode
verifies the tags of every block it receives: corrupt blocks must be 0. Freed
blocks are overwritten so a late reader is caught. --prefill-tp and --decode-tp
may differ: the rank mapping, head-slice descriptors and expected notification
counts follow the engines' own rules. A pair vLLM refuses (pull and push: a
non-MLA model with --prefill-tp > --decode-tp and more prefill ranks than KV
heads, "num_kv_heads > tp_size with P_TP > D_TP not supported for non-mamba")
is refused as bad input unless --allow-unsupported-tp, which runs it, records
it in the result (config.unsupported_tp) and warns.

--pp N gives prefill and decode N pipeline stages each (pull and push; sglang
refuses it): every (pp, tp) rank is its own agent holding its stage's layers,
decode handshakes every (pp, target tp) prefill rank on one socket in vLLM's
order, decode stage k reads (push: receives) its layers from prefill stage k,
heartbeats and registrations reach every pp x tp rank, and prefill frees a
request's blocks once every rank of every stage reported. Both sides have the
same pp, as vLLM's pull requires; vLLM's push rejects pp on decode, so push
with --pp > 1 warns that it is not upstream behaviour.

Workload: --requests of --isl tokens (or --isl-dist uniform|normal with
--isl-min/--isl-max/--isl-mean/--isl-std, or --trace FILE of JSON lines
{"arrival": seconds, "isl": tokens}); closed loop with --concurrency, or open
loop with --rate (Poisson); --prefix-hit fraction of each prompt decode already
holds (the remote block list is end-trimmed); --fragmentation scattered gives
fragmented block tables (descriptors cannot merge).

Per request it measures: handshake (first vs steady), registration (decode -> prefill, one way),
KV ready at prefill -> transfer posted, post time, transfer time, transfer done
-> decode ready, and the handoff latency (KV ready -> decode ready); the summary
has p50/p90/p99/p99.9/max, bandwidth, requests/s, failures, corrupt blocks,
blocks still held after the run, and efficiency against memcpy (measured in the
decode process) and against "bench xfer" on the same bytes (--xfer-reference).
--records FILE writes one JSON line per request.

xPyD: --prefills N --decodes M run N prefill and M decode engines here, or
--prefill and --decode list several endpoints (comma separated, "local" for a
child here), or --topology FILE lists them with their own TP. --router
round-robin cycles through every (prefill, decode) pair; least-loaded picks
the decode with the fewest requests in flight, then the prefill. The result
adds each pair's requests, GB/s (over the pair's active time) and handoff p99
as prefill x decode matrices (and heatmaps with --plot), so incast on one
decode and a slow pair show up.

Rendezvous: instead of naming the endpoints, --rendezvous HOST:PORT listens
(or etcd://HOST:PORT watches an etcd) for endpoints started with "nixlctl
serve prefill|decode --register ADDR" (rank, world size and run id from
their launcher: Slurm, torchrun, Open MPI, a Kubernetes Indexed Job). The
driver prints where it waits, waits up to --join-window for prefill ranks
0..--prefills-1 and decode ranks after them (or --roster
prefill=0,decode=1), checks --run-id (default: $NIXLCTL_JOB_ID, else the
launcher's job id; required with etcd), and uses the members as its engines;
when the window ends first the run fails naming the missing ranks. The
result's config.rendezvous records the members and their hosts.`

func newHandoffCmd(a *app, proto engine.Protocol) *cobra.Command {
	short := map[engine.Protocol]string{
		engine.ProtoPull:   "vLLM pull: decode READs prefill's blocks",
		engine.ProtoPush:   "vLLM push: prefill WRITEs into decode's pre-allocated blocks",
		engine.ProtoSGLang: "SGLang: bootstrap room, pre-allocated pages, chunked WRITEs",
	}[proto]
	cmd := &cobra.Command{
		Use:   proto.String(),
		Short: short,
		Long:  protocolHelp[proto] + handoffCommon,
		Example: fmt.Sprintf(`  nixlctl bench %[1]s
  nixlctl bench %[1]s --model llama-3.1-8b --isl 4096 --requests 64 --concurrency 8 --xfer-reference
  nixlctl bench %[1]s --model llama-3.1-70b --prefill-tp 4 --decode-tp 2 --isl 2048 --requests 16
  nixlctl bench %[1]s --prefills 2 --decodes 2 --router least-loaded --isl 2048 --requests 32 --plot xpyd.png
  nixlctl bench %[1]s --rendezvous 0.0.0.0:7500 --roster prefill=0,decode=1 --run-id "$SLURM_JOB_ID" --join-window 5m
  nixlctl bench %[1]s --isl-dist normal --isl-mean 4000 --isl-std 1500 --isl-min 256 --isl-max 8192 --rate 20 --records out.jsonl`, proto),
		Args: cobra.NoArgs,
		RunE: boundExplicit(func(ctx context.Context, o handoffOptions, set explicitOptions) error {
			return runHandoff(ctx, a, proto, o, set)
		}),
	}
	d := handoff.DefaultHandoffOptions()
	f := cmd.Flags()
	transferBackendFlag(f, d.Backend, "")
	f.String("model", "", "model preset (default "+kv.DefaultModel+")")
	f.String("model-config", "", "HuggingFace config.json instead of a preset")
	f.String("kv-dtype", "", "KV cache dtype (default: the model's)")
	f.Int("block-size", 16, "tokens per KV block (page)")
	f.String("layout", "flash-attn", "attention layout: flash-attn or flashinfer")
	f.String("kv-cache-layout", "HND", "order inside a block: HND or NHD (SGLang is always NHD)")
	f.Int("prefill-tp", 1, "prefill tensor-parallel size")
	f.Int("decode-tp", d.DecodeTP, "decode tensor-parallel size")
	f.Int("pp", 1, "pipeline-parallel size of both prefill and decode: each (pp, tp) rank is its own agent holding its stage's layers (pull and push)")
	f.Int("requests", d.Requests, "measured requests")
	f.Int("warmup", d.Warmup, "requests run first and left out of the summary (-1: as many as use every block of the KV pool once, at least 2, so that no measured request is the first to touch a block)")
	f.Int("isl", d.ISL.Fixed, "prompt tokens (fixed distribution)")
	f.String("isl-dist", d.ISL.Dist.String(), "prompt length distribution: fixed, uniform, normal (or use --trace)")
	f.Int("isl-min", d.ISL.Min, "smallest prompt (uniform, normal)")
	f.Int("isl-max", d.ISL.Max, "largest prompt (uniform, normal)")
	f.Float64("isl-mean", d.ISL.Mean, "mean prompt (normal)")
	f.Float64("isl-std", d.ISL.Std, "prompt standard deviation (normal)")
	f.String("trace", "", "JSON-lines trace of {\"arrival\": s, \"isl\": n}")
	f.Float64("rate", d.Rate, "open loop: requests per second (Poisson); 0 = closed loop")
	f.Int("concurrency", d.Concurrency, "closed loop: requests in flight")
	f.Int("max-inflight", d.MaxInflight, "open loop (--rate, --trace): at most this many requests in flight; an arrival past it waits for one to finish, and is counted (summary.arrivals_delayed)")
	f.Float64("prefix-hit", d.PrefixHit, "fraction of each prompt decode already holds")
	f.String("fragmentation", d.Fragmentation.String(), "block tables: contiguous or scattered")
	f.Bool("no-merge", d.NoMerge, "post one descriptor per block per region (do not merge contiguous runs as NIXL does)")
	f.Int("num-blocks", d.NumBlocks, "KV blocks per engine (default: enough for the workload)")
	knobFlags(f, d.Knobs)
	f.Bool("allow-unsupported-tp", d.AllowUnsupportedTP, "run a prefill/decode TP pair vLLM refuses (non-MLA, --prefill-tp > --decode-tp, prefill TP > KV heads) instead of refusing it")
	f.String("compat-factors", "", "JSON file of vLLM's compatibility factors (vllm_version, nixl_connector_version, model, dtype, num_kv_heads, head_size, num_hidden_layers, attn_backend_name, cache_dtype, is_hma_enabled, speculative_config, transfer_mode): advertise and check the hash a vLLM engine with them computes (pull, push)")
	f.String("compat-hash", "", "adopt this compatibility hash (sha256 hex) as a vLLM engine advertises it (pull, push)")
	f.Bool("no-compat-check", false, "accept any peer's compatibility hash, as vLLM's enforce_handshake_compat=false (pull, push)")
	f.Int("chunk-tokens", d.ChunkTokens, "SGLang chunked prefill size (default: one chunk)")
	f.String("bootstrap", "", "SGLang: an external SGLang prefill's bootstrap server, http://HOST:PORT: its prefill serves the prefill legs (POST /generate on its registered prefill_http_port) and nixlctl's decode receives the KV, unverified (the bytes are the model's)")
	f.String("mem", strings.ToLower(d.Mem.String()), "where the KV pools live: dram or vram (GPU memory through the CUDA driver; use --backend cuda-ipc on one node)")
	f.Int("device", d.Device, "prefill's GPU for --mem vram")
	f.Int("decode-device", d.DecodeDevice, "decode's GPU for --mem vram")
	f.Bool("xfer-reference", d.XferRef, "also run bench xfer on the same bytes, in rounds between the handoff's, for an efficiency ratio (and, on one host with the ucx backend, against UCX's fastest shared-memory path)")
	f.Int("xfer-rounds", d.XferRounds, "with --xfer-reference in a closed loop: alternate this many handoff rounds with bench xfer rounds (at most one per 4 x --concurrency requests); the ratio is the median of the rounds'")
	f.Bool("inproc", d.Inproc, "run both endpoints in this process")
	f.String("prefill", d.Prefill, "use prefill endpoints started with serve prefill --listen (host:port, comma separated; \"local\" for a child here); alone, decode runs here as a child")
	f.String("decode", d.Decode, "use decode endpoints started with serve decode --listen (host:port, comma separated; \"local\" for a child here); alone, prefill runs here as a child")
	f.Int("prefills", d.Prefills, "xPyD: prefill engines to run here as children (without --prefill addresses), or with --rendezvous to wait for")
	f.Int("decodes", d.Decodes, "xPyD: decode engines to run here as children (without --decode addresses), or with --rendezvous to wait for")
	f.String("topology", d.Topology, "xPyD: JSON (or .yaml) file of engines instead: {\"prefill\": [{\"addr\": \"local\", \"tp\": 2}, ...], \"decode\": [...]}")
	f.String("router", d.Router.String(), "xPyD: how requests are assigned to (prefill, decode) pairs: round-robin or least-loaded")
	f.String("on-endpoint-death", "stop", "when an endpoint dies: stop (cancel what is in flight and end the run) or drain (let its requests in flight fail by themselves and go on with the engines left); the run fails either way")
	f.String("rendezvous", d.Rendezvous, "instead of --prefill/--decode/--topology: wait for endpoints started with serve prefill|decode --register to register here, a TCP [tcp://]host:port to listen on (port 0: any, printed) or etcd://host:port")
	f.String("run-id", d.RunID, "rendezvous: the run id the endpoints must give (default: $NIXLCTL_JOB_ID, else the launcher's job id; required with etcd)")
	f.String("roster", d.Roster, "rendezvous: the ranks to wait for, e.g. prefill=0,decode=1 or prefill=0-1,decode=2-3 (default: prefill ranks 0..--prefills-1, decode ranks after them)")
	f.Duration("join-window", d.JoinWindow, "rendezvous: how long to wait for the roster; the run fails naming the ranks that did not come")
	f.String("xfer-target", d.XferTarget, "with remote endpoints: a serve target --listen on the remote host, for the bench xfer reference over the same link")
	f.Uint64("seed", d.Seed, "random seed (prompt lengths, arrivals, block placement)")
	addMeasureFlags(cmd, true)
	return cmd
}

func runHandoff(ctx context.Context, a *app, proto engine.Protocol, o handoffOptions, set explicitOptions) error {
	h := o.HandoffOptions
	h.Protocol, h.Version, h.Log = proto, version, a.log
	m, err := loadModel(o.Model, o.ModelConfig)
	if err != nil {
		return err
	}
	if err := checkPP(m, o.PP); err != nil {
		return err // both sides' stages: not the prefill's spec alone
	}
	if h.Bootstrap != "" && proto == engine.ProtoSGLang && set("prefill-tp") {
		return errkind.BadInputf("--prefill-tp: not with --bootstrap: the external SGLang prefill's TP is its own (attn_tp_size in its server info)")
	}
	if h.Spec, err = kvSpec(m, o.KVDType, o.BlockSize, o.Layout, o.KVCacheLayout, o.PrefillTP, o.PP, false); err != nil {
		return fmt.Errorf("prefill: %w", err)
	}
	if h.Rendezvous != "" {
		if h.RunID == "" {
			h.RunID = launcherJobID()
		}
		h.OnRendezvous = func(addr string, r rendezvous.Roster) {
			fmt.Fprintf(a.io.ErrOut, "rendezvous: waiting at %s for %s (run %q, up to %v)\n", addr, r, r.Run, h.JoinWindow)
		}
	}
	if err := refuseExplicitZero(set,
		zeroFlag{"prefills", h.Prefills == 0, "at least 1", "one prefill engine"},
		zeroFlag{"decodes", h.Decodes == 0, "at least 1", "one decode engine"},
		zeroFlag{"max-inflight", h.MaxInflight == 0, "at least 1", fmt.Sprintf("%d", handoff.DefaultMaxInflight)},
		zeroFlag{"sglang-bootstrap-timeout", h.SGLBootstrapTimeout == 0, "a positive duration", "$" + envSGLBootstrapTimeout + " or upstream's 300s"},
		zeroFlag{"sglang-waiting-timeout", h.SGLWaitingTimeout == 0, "a positive duration", "$" + envSGLWaitingTimeout + " or upstream's 300s"},
		zeroFlag{"sglang-heartbeat-interval", h.SGLHeartbeatInterval == 0, "at least SGLang's floor of 2s", "$" + envSGLHeartbeatIntvl + " or upstream's 5s"},
		zeroFlag{"sglang-heartbeat-max-failures", h.SGLHeartbeatMaxFailures == 0, "at least 1", "$" + envSGLHeartbeatMax + " or upstream's 2"},
	); err != nil {
		return err
	}
	if proto == engine.ProtoSGLang {
		if err := applySGLEnv(&h, set, os.LookupEnv); err != nil {
			return err
		}
	}
	if err := h.Validate(); err != nil {
		return flagErrors(err, o) // o: the spec flags too (--pp)
	}
	if err := ignoredErrors(set, h, h.Ignored()); err != nil {
		return err
	}
	// The engine lays SGLang's pages out token-major whatever it is told.
	if proto == engine.ProtoSGLang && set("kv-cache-layout") && !strings.EqualFold(o.KVCacheLayout, "NHD") {
		return errkind.BadInputf("--kv-cache-layout %s: bench sglang is always NHD", o.KVCacheLayout)
	}
	if err := checkBackendName(h.Backend); err != nil {
		return err
	}
	if err := o.measureOptions.validate(); err != nil {
		return err
	}
	h.ChildStderr = a.childStderr(o.measureOptions)
	var res *handoff.HandoffResult
	mo := o.measureOptions
	if mo.Repeat <= 1 {
		// Streamed as they come; with --repeat the representative run's
		// records are written at the end (keep), not every run's.
		h.Records = mo.streamRecords(a.args)
	}
	_, err = a.measureAndRender(ctx, mo, func(ctx context.Context, sink live.Sink) (report.Result, error) {
		h.Live = sink
		var err error
		if res, err = handoff.RunHandoff(ctx, h); res == nil {
			if errkind.IsBadInput(err) {
				err = flagErrors(err, o) // refused before a request ran: name the flag
			}
			return nil, err
		}
		return res, err
	})
	if err != nil || res == nil {
		return err
	}
	if res.Summary.CorruptBlocks > 0 {
		return errkind.CheckFailedf("%d corrupt blocks", res.Summary.CorruptBlocks)
	}
	if res.Summary.Failed > 0 && res.Summary.Failed == res.Summary.Requests {
		return errors.New("every request failed")
	}
	return nil
}

type serveEngineOptions struct {
	Stdio     bool   `mapstructure:"stdio"`
	Listen    string `mapstructure:"listen"`
	Advertise string `mapstructure:"advertise"`
	Register  string `mapstructure:"register"`
	RunID     string `mapstructure:"run-id"`
	Rank      int    `mapstructure:"rank"`
	WorldSize int    `mapstructure:"world-size"`
	// RegisterTimeout bounds the retries of an unreachable --register
	// driver (0: forever).
	RegisterTimeout time.Duration `mapstructure:"register-timeout"`
	// The stand-in's flags (serve prefill only).
	standinOptions `mapstructure:",squash"`
	// The vLLM compatibility identity this endpoint stands for.
	CompatFactors string `mapstructure:"compat-factors"`
	CompatHash    string `mapstructure:"compat-hash"`
	NoCompatCheck bool   `mapstructure:"no-compat-check"`
}

// identity reads the endpoint's compatibility flags, refusing bad ones
// before the endpoint serves anything.
func (o serveEngineOptions) identity() (engine.Identity, error) {
	cf, err := readCompatFlags(o.CompatFactors, o.CompatHash)
	if err != nil {
		return engine.Identity{}, err
	}
	id := engine.Identity{Factors: cf.raw, NoCheck: o.NoCompatCheck}
	if cf.raw == nil {
		id.HashHex = cf.hash
	}
	var srcs []string
	if cf.from != "" {
		srcs = append(srcs, cf.from)
	}
	if o.NoCompatCheck {
		srcs = append(srcs, "--no-compat-check")
	}
	id.Source = "serve " + strings.Join(srcs, " ")
	return id, nil
}

// applyIdentity sets a stand-in engine's compatibility identity from the
// flags (a stand-in has no driver to hand it over).
func (o serveEngineOptions) applyIdentity(cfg *engine.Config) error {
	id, err := o.identity()
	if err != nil {
		return err
	}
	cfg.CompatHashHex, cfg.NoCompatCheck = id.HashHex, id.NoCheck
	if len(id.Factors) > 0 {
		cfg.CompatFactors = json.RawMessage(id.Factors)
	}
	return nil
}

func newServeEngineCmd(a *app, role string) *cobra.Command {
	cmd := &cobra.Command{
		Use:   role,
		Short: fmt.Sprintf("Serve a %s endpoint for bench pull|push|sglang", role),
		Long: fmt.Sprintf(`Serve a %[1]s engine endpoint. The bench driver (nixlctl bench pull|push|sglang)
sets it up (model, layout, TP, protocol, backend) and sends it requests over a
control channel of JSON lines; the KV cache itself moves over the transfer
backend, and the engines talk to each other over their own side channels
(vLLM's ZMQ handshake, SGLang's bootstrap server and ZMQ inboxes).

--stdio takes the control channel on standard input and output (how the bench
starts its children); --listen [tcp://]HOST:PORT accepts drivers over TCP, one
at a time, for endpoints on other hosts or started by hand (under a debugger,
with other UCX settings).

With --listen, the engine's side channels (vLLM's handshake socket, SGLang's
bootstrap server and inboxes, push notifications) bind on the same HOST, and
every message names --advertise HOST (default: the listen host; for 0.0.0.0 or
::, the local address the driver's connection came in on). The driver dials
the advertised addresses before the run and fails at once, naming the
address, when it cannot reach them.

--compat-factors FILE, --compat-hash HEX and --no-compat-check make the
endpoint stand for a vLLM engine whose compatibility identity you know
(pull, push): it advertises and checks that hash in its handshakes whatever
the driver is told. A driver that sends none lets the endpoint's stand; one
that sends a different hash, or a different --no-compat-check, fails the
setup with an error naming both.`, role),
		Example: `  # on host A (10.0.0.1) and host B (10.0.0.2):
  nixlctl serve prefill --listen 0.0.0.0:7400
  nixlctl serve decode --listen 10.0.0.2:7401
  # the driver, anywhere that reaches both:
  nixlctl bench push --prefill 10.0.0.1:7400 --decode 10.0.0.2:7401
  # or with decode as a local child of the driver on host B:
  nixlctl bench pull --prefill 10.0.0.1:7400
  # rendezvous: the endpoints find the driver (10.0.0.3) instead
  nixlctl bench pull --rendezvous 0.0.0.0:7500 --run-id r1
  nixlctl serve prefill --listen 0.0.0.0:7400 --register 10.0.0.3:7500 --run-id r1 --rank 0 --world-size 2
  nixlctl serve decode --register 10.0.0.3:7500 --run-id r1 --rank 1 --world-size 2`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			o, set, err := bindLeaf[serveEngineOptions](cmd)
			if err != nil {
				return err
			}
			if _, err := o.identity(); err != nil {
				return err
			}
			standIn := standIns[role]
			if standIn.asked(o) {
				if o.Stdio || o.Listen != "" || o.Register != "" {
					return errkind.BadInputf("--%s runs without a driver: not with --stdio, --listen or --register", standIn.flags[0])
				}
				return standIn.run(cmd.Context(), a, o)
			}
			// Only the command line counts: a driven endpoint inherits
			// its driver's environment, whose NIXLCTL_BACKEND or
			// NIXLCTL_MODEL (the bench's own flags) refused every
			// child of "NIXLCTL_BACKEND=ucx nixlctl bench pull".
			for _, f := range standIn.flags[1:] {
				if cmd.Flags().Changed(f) {
					return errkind.BadInputf("--%s goes with --%s (a driven %s gets its configuration from the driver)", f, standIn.flags[0], role)
				}
			}
			if o.Register != "" {
				return runRegisteredEngine(cmd.Context(), a, role, o, set)
			}
			for _, f := range []string{"run-id", "rank", "world-size", "register-timeout"} {
				if set(f) {
					return errkind.BadInputf("--%s goes with --register", f)
				}
			}
			return runServeEngine(cmd.Context(), a, o)
		},
	}
	cmd.Flags().Bool("stdio", false, "control channel on stdin/stdout")
	cmd.Flags().String("listen", "", "control channel on this TCP address ([tcp://]host:port; port 0: any); the side channels bind on its host")
	cmd.Flags().String("advertise", "", "host to name in side-channel messages (default: the listen host, or for 0.0.0.0 the address the driver reached)")
	cmd.Flags().String("register", "", "register with a bench --rendezvous driver at [tcp://]host:port or etcd://host:port (see above)")
	cmd.Flags().String("run-id", "", "with --register: the run id (default: $NIXLCTL_JOB_ID, else the launcher's job id)")
	cmd.Flags().Int("rank", 0, "with --register: this endpoint's rank in the run (default: from the launcher's environment)")
	cmd.Flags().Int("world-size", 0, "with --register: how many endpoints the run has (default: from the launcher's environment)")
	cmd.Flags().Duration("register-timeout", 5*time.Minute, "with --register: give up (exit 1) when a TCP driver cannot be reached for this long; 0 retries until interrupted")
	cmd.Flags().String("compat-factors", "", "stand for a vLLM engine with these compatibility factors (JSON file, as bench pull|push --compat-factors): advertise and check the hash they give; a driver that sends another fails its setup")
	cmd.Flags().String("compat-hash", "", "stand for a vLLM engine that advertises this compatibility hash (sha256 hex); a driver that sends another fails its setup")
	cmd.Flags().Bool("no-compat-check", false, "accept any peer's compatibility hash (vLLM's enforce_handshake_compat=false); a driver that says otherwise fails its setup")
	standIn := standIns[role]
	cmd.Long += "\n" + standIn.help
	cmd.Example += standIn.example
	standIn.addFlags(cmd)
	return cmd
}

// standIn is how serve prefill or serve decode runs without a driver,
// standing in for a vLLM engine: the flags only it reads (the first one
// asks for it), whether the options ask for it, what runs it, and what it
// adds to the command's help.
type standIn struct {
	flags         []string
	asked         func(serveEngineOptions) bool
	run           func(context.Context, *app, serveEngineOptions) error
	help, example string
	addFlags      func(*cobra.Command)
}

var standIns = map[string]standIn{
	"prefill": {flags: standinFlags, asked: func(o serveEngineOptions) bool { return o.SideChannel != "" }, run: runStandin,
		help: standinHelp, addFlags: addStandinFlags, example: `
  # stand in for a prefill next to a real vLLM decode (its proxy sends prefill legs to :8100)
  nixlctl serve prefill --side-channel 10.0.0.1:5600 --http 0.0.0.0:8100 \
    --model llama-3.1-8b --compat-factors factors.json`},
	"decode": {flags: standinDecodeFlags, asked: func(o serveEngineOptions) bool { return o.HTTP != "" }, run: runStandinDecode,
		help: standinDecodeHelp, addFlags: addStandinDecodeFlags, example: `
  # stand in for a decode behind a disaggregated proxy (it sends decode legs to :8200)
  nixlctl serve decode --http 0.0.0.0:8200 --model llama-3.1-8b`},
}

func runServeEngine(ctx context.Context, a *app, o serveEngineOptions) error {
	var side engine.SideChannelHost
	if o.Listen != "" {
		host, _, err := net.SplitHostPort(strings.TrimPrefix(o.Listen, "tcp://"))
		if err != nil {
			return errkind.BadInputf("--listen %q: want [tcp://]host:port", o.Listen)
		}
		if host == "" {
			host = "0.0.0.0" // ":7400" listens everywhere
		}
		side = engine.SideChannelHost{Bind: host, Advertise: o.Advertise}
	} else if o.Advertise != "" {
		return errkind.BadInputf("--advertise goes with --listen: a --stdio endpoint advertises what its driver sets up")
	}
	if err := checkAdvertise(o.Advertise); err != nil {
		return err
	}
	var err error
	if side.Identity, err = o.identity(); err != nil {
		return err
	}
	return serveRole(ctx, a, o.Stdio, o.Listen, engine.EndpointRole(a.log, side))
}

// checkAdvertise is the one check of --advertise (serve and serve
// --register): a host alone, which messages name with their own ports.
func checkAdvertise(host string) error {
	if host != "" && !runcore.ValidHost(host) {
		return errkind.BadInputf("--advertise %q: want a host name or an IP address, no port or scheme", host)
	}
	return nil
}
