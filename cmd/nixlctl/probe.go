package main

import (
	"context"
	"os"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/nixlctl/nixlctl/internal/errkind"
	"github.com/nixlctl/nixlctl/internal/kv"
	"github.com/nixlctl/nixlctl/internal/live"
	"github.com/nixlctl/nixlctl/internal/probe"
	"github.com/nixlctl/nixlctl/internal/report"
)

func newProbeCmd(a *app) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "probe",
		Short: "Diagnose the transfer stack: UCX memory growth, transports, live side channels",
		Long: `Diagnostics that are not benchmarks: "probe ucx-leak" measures whether the receiving
(decode) side's memory grows under KV transfers and which UCX settings stop it;
"probe env" tells what UCX, NIXL, CUDA and the system offer, warns about risky
settings, and proves the path with a short transfer; "probe sidechannel" asks a
live vLLM or SGLang prefill's side channel what a decode would ask it, every
rank, and says whether a given decode would be accepted.`,
	}
	cmd.AddCommand(newProbeUCXLeakCmd(a), newProbeEnvCmd(a), newProbeSideChannelCmd(a))
	return cmd
}

type probeUCXLeakOptions struct {
	Backend          string   `mapstructure:"backend"` // a list here; --backends before one vocabulary
	Env              []string `mapstructure:"env"`
	Duration         string   `mapstructure:"duration"`
	Interval         string   `mapstructure:"interval"`
	WarmupTime       string   `mapstructure:"warmup-time"` // a duration; --warmup elsewhere counts requests
	Model            string   `mapstructure:"model"`
	ModelConfig      string   `mapstructure:"model-config"`
	ISL              int      `mapstructure:"isl"`
	BlockSize        int      `mapstructure:"block-size"`
	Rate             float64  `mapstructure:"rate"`
	ChurnRate        float64  `mapstructure:"churn-rate"`
	ChurnSlots       int      `mapstructure:"churn-slots"`
	ChurnMin         string   `mapstructure:"churn-min"`
	ChurnMax         string   `mapstructure:"churn-max"`
	ProgressInterval string   `mapstructure:"progress-interval"`
	SelfTestLeak     float64  `mapstructure:"self-test-leak"`
	measureOptions   `mapstructure:",squash"`
}

const probeUCXLeakLong = `Does the decode side's memory grow while it receives KV caches, and which UCX
settings stop it? For each configuration of a matrix of UCX settings, start a
fresh receiver process (decode-like: a registered KV pool, notifications drained,
and an allocation churn of mmap/munmap calls made through libc, sized like
Python's arenas and PyTorch's CPU buffers: the calls UCX's memory hooks intercept)
and a fresh sender (prefill-like: KV-shaped WRITEs into the receiver's pool, one
descriptor per block per layer region, with a notification each), sample the
receiver's RSS, VmData, mappings and open fds every --interval for --duration, and
fit a least-squares line to RSS after --warmup.

The default matrix is UCX_MEM_MMAP_HOOK_MODE = library default and none, times
UCX_RCACHE_MAX_UNRELEASED = library default and 1024 where the UCX library knows
that variable (UCX 1.13 does not: the result says so). --env KEY=V1,V2 adds an
axis (or replaces a default one); separate values that contain commas with '|':
--env 'UCX_TLS=tcp,self|all'; "default" means the variable unset. Every backend
of --backend runs the whole matrix; one that is not built in or cannot run here
is skipped with the reason.

Verdicts (MB = 10^6 bytes):
  LEAK          slope >= 2 MB/min with R² >= 0.9, and both halves of the window
                grow at >= 1 MB/min (a single step is not a leak)
  STABLE        slope < 2 MB/min and fitted growth < 4 MB
  INCONCLUSIVE  anything else: run longer
then a recommendation naming the settings that were stable.

--progress-interval D makes the receiver's UCX worker progress only every D (ucx
backend), starving it the way a busy engine thread can, so that work UCX defers
to progress (its registration cache's invalidation queue) piles up.

Progress goes to stderr, one line per sample. Ctrl-C stops and prints what was
measured.`

const probeUCXLeakExample = `  nixlctl probe ucx-leak
  nixlctl probe ucx-leak --duration 10m --progress-interval 200ms
  nixlctl probe ucx-leak --env 'UCX_TLS=default|tcp,self' -o json > leak.json
  nixlctl probe ucx-leak --backend ucx --self-test-leak 2 --duration 30s`

func newProbeUCXLeakCmd(a *app) *cobra.Command {
	cmd := &cobra.Command{
		Use:     "ucx-leak",
		Short:   "Measure the decode side's memory growth under KV transfers per UCX setting",
		Long:    probeUCXLeakLong,
		Example: probeUCXLeakExample,
		Args:    cobra.NoArgs,
		RunE:    bound(a.runProbeUCXLeak),
	}
	d := probe.DefaultChurn
	f := cmd.Flags()
	f.String("backend", "ucx,nixl", "backends to probe, comma-separated (one that cannot run here is skipped)")
	f.StringArray("env", nil, "another matrix axis KEY=V1,V2 (repeatable; '|' separates values that contain commas)")
	f.String("duration", "30s", "sampling time per configuration")
	f.String("interval", "1s", "time between samples")
	f.String("warmup-time", "10s", "samples before this are not fitted")
	f.String("model", "llama-3.2-1b", "model preset whose KV blocks are moved")
	f.String("model-config", "", "like --model, from a HuggingFace config.json")
	f.Int("isl", 1024, "tokens per request")
	f.Int("block-size", 16, "KV block size in tokens")
	f.Float64("rate", 10, "requests per second (0: back to back)")
	f.Float64("churn-rate", d.Rate, "receiver allocation replacements per second (0: none)")
	f.Int("churn-slots", d.Slots, "receiver live allocations")
	f.String("churn-min", "256K", "smallest churn allocation")
	f.String("churn-max", "32M", "largest churn allocation")
	f.String("progress-interval", "0", "progress the receiver's UCX worker only this often (ucx backend; 0: normal)")
	f.Float64("self-test-leak", 0, "make the receiver leak this many MB a second on purpose (checks the probe)")
	// This command's first spellings (docs/reports.md, "Flag names").
	aliasFlag(f, "backends", "backend")
	aliasFlag(f, "warmup", "warmup-time")
	aliasFlag(f, "tokens", "isl")
	aliasFlag(f, "kv-block-size", "block-size")
	addMeasureFlags(cmd, false)
	return cmd
}

func parseDurationFlag(flag, s string, allowZero bool) (time.Duration, error) {
	d, err := time.ParseDuration(strings.TrimSpace(s))
	if err != nil {
		return 0, errkind.BadInputf("--%s %q: not a duration (like 500ms, 30s, 10m)", flag, s)
	}
	if d < 0 || (d == 0 && !allowZero) {
		return 0, errkind.BadInputf("--%s must be > 0 (got %s)", flag, s)
	}
	return d, nil
}

func (a *app) runProbeUCXLeak(ctx context.Context, o probeUCXLeakOptions) error {
	x := probe.LeakOptions{Rate: o.Rate, Tokens: o.ISL, SelfTestLeakMBPerS: o.SelfTestLeak, Thresholds: probe.DefaultThresholds,
		Version: version, Log: a.log}
	if !a.io.StderrTTY {
		// A log (CI) gets a line per sample; a terminal gets the live view.
		x.Progress = a.io.ErrOut
	}
	var err error
	if x.Duration, err = parseDurationFlag("duration", o.Duration, false); err != nil {
		return err
	}
	if x.Interval, err = parseDurationFlag("interval", o.Interval, false); err != nil {
		return err
	}
	warm, err := parseDurationFlag("warmup-time", o.WarmupTime, true)
	if err != nil {
		return err
	}
	x.Thresholds.WarmupS = warm.Seconds()
	if x.ProgressInterval, err = parseDurationFlag("progress-interval", o.ProgressInterval, true); err != nil {
		return err
	}
	for _, b := range strings.Split(o.Backend, ",") {
		if b = strings.TrimSpace(b); b == "" && strings.TrimSpace(o.Backend) != "" {
			return errkind.BadInputf("--backend: %q: %v", o.Backend, errEmptyItem)
		} else if b != "" {
			x.Backends = append(x.Backends, b)
		}
	}
	for _, e := range o.Env {
		ax, err := probe.ParseEnvAxis(e)
		if err != nil {
			return errkind.BadInput(err)
		}
		x.Axes = append(x.Axes, ax)
	}
	x.Churn = probe.ChurnConfig{Rate: o.ChurnRate, Slots: o.ChurnSlots}
	for _, s := range []struct {
		flag, v string
		dst     *int64
	}{{"churn-min", o.ChurnMin, &x.Churn.Min}, {"churn-max", o.ChurnMax, &x.Churn.Max}} {
		n, err := report.ParseSize(s.v)
		if err != nil {
			return errkind.BadInputf("--%s: %v", s.flag, err)
		}
		*s.dst = n
	}
	m, err := loadModel(o.Model, o.ModelConfig)
	if err != nil {
		return err
	}
	if x.Spec, err = kvSpec(m, "", o.BlockSize, "flash-attn", "HND", 1, 1, false); err != nil {
		return err
	}
	if err := x.Validate(); err != nil {
		return errkind.BadInput(err)
	}
	if _, err := probe.KVShape(x.Spec, x.Tokens); err != nil {
		return errkind.BadInput(err)
	}
	if err := o.measureOptions.validate(); err != nil {
		return err
	}
	_, err = a.measureAndRender(ctx, o.measureOptions, func(ctx context.Context, sink live.Sink) (report.Result, error) {
		x.Live = sink
		res, err := probe.RunUCXLeak(ctx, x)
		if res == nil {
			return nil, err
		}
		return res, err
	})
	return err
}

type probeEnvOptions struct {
	Backend  string `mapstructure:"backend"`
	Requests int    `mapstructure:"requests"`
	PeerMode bool   `mapstructure:"peer-mode"`
}

const probeEnvLong = `One screen that tells what transfers on this host will really use:

  UCX       the library nixlctl loaded and ucx_info's view of it (version, build
            flags), transports and devices (ucx_info -d), the settings that
            decide the path (UCX_TLS, UCX_NET_DEVICES, the memory-hook and
            rcache variables), set or default
  NIXL      whether the nixl backend is built in and can run, its library and
            plugins (NIXL_PLUGIN_DIR)
  CUDA      driver version and GPUs (libcuda.so.1 loaded at run time), or why not
  system    RLIMIT_MEMLOCK and huge pages
  path      proof: a short loopback between a receiver and a sender process over
            the real backend (--backend, auto = nixl when available), KV-shaped
            WRITEs, every written block verified at the receiver, with
            UCX_PROTO_INFO=y (and UCX_PROTO_ENABLE=y on UCX 1.13) and nixlctl's
            own lane report: "this transfer used <transport> on <device>"
  path with peer error handling
            (--peer-mode, ucx backend) the same loopback with UCX's peer error
            handling, NIXL's default, to show what NIXL agents here would get

then warnings for risky settings: TCP only, no shared memory between processes on
one host, transports or devices UCX lacks, the decode-side leak settings, peer
error handling on UCX 1.13, VRAM without UCX CUDA transports, a low memlock limit
with RDMA, and a loud one when the transfer fell back to TCP. Warnings do not
change the exit code.`

func newProbeEnvCmd(a *app) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "env",
		Short: "The transport doctor: what UCX/NIXL/CUDA offer, risky settings, and a proof transfer",
		Long:  probeEnvLong,
		Example: `  nixlctl probe env
  UCX_TLS=tcp,self nixlctl probe env
  nixlctl probe env --requests 0 -o json`,
		Args: cobra.NoArgs,
		RunE: bound(a.runProbeEnv),
	}
	f := cmd.Flags()
	f.String("backend", "auto", "backend for the loopback: auto, ucx or nixl (auto: nixl when available, else ucx)")
	f.Int("requests", 20, "loopback requests (0: no loopback)")
	f.Bool("peer-mode", true, "also run the loopback with peer error handling (ucx backend)")
	return cmd
}

func (a *app) runProbeEnv(ctx context.Context, o probeEnvOptions) error {
	if o.Requests < 0 || o.Requests > 10000 {
		return errkind.BadInputf("--requests must be between 0 and 10000 (got %d)", o.Requests)
	}
	switch o.Backend {
	case "auto", "ucx", "nixl":
	default:
		return errkind.BadInputf("--backend %q: want auto, ucx or nixl", o.Backend)
	}
	res, err := probe.RunEnv(ctx, probe.EnvOptions{Backend: o.Backend, Requests: o.Requests, PeerModeCheck: o.PeerMode,
		Version: version, Log: a.log})
	if res != nil {
		if werr := report.Write(a.io.Out, a.format, res); werr != nil {
			return werr
		}
	}
	return err
}

type probeSideChannelOptions struct {
	Protocol      string `mapstructure:"protocol"`
	Timeout       string `mapstructure:"timeout"`
	PPRank        int    `mapstructure:"pp-rank"`
	TPRank        int    `mapstructure:"tp-rank"`
	CompatFactors string `mapstructure:"compat-factors"`
	CompatHash    string `mapstructure:"compat-hash"`
	TP            int    `mapstructure:"tp"`
	PP            int    `mapstructure:"pp"`
	Model         string `mapstructure:"model"`
	KVDType       string `mapstructure:"kv-dtype"`
	DecodeTP      int    `mapstructure:"decode-tp"`
	DecodeBlock   int    `mapstructure:"decode-block-size"`
	DecodeLayout  string `mapstructure:"decode-layout"`
	// set from the command line, not bound: which of the flags were given
	oneRank, verdict bool
}

const probeSideChannelLong = `Ask a live engine's side channel what a decode would ask it, and report what it
said, before benchmarking against it (or to see why a decode cannot reach it).

--protocol vllm (default): TARGET is HOST:PORT (or tcp://HOST:PORT) of vLLM's NIXL
handshake listener, a ZMQ ROUTER on VLLM_NIXL_SIDE_CHANNEL_HOST at
VLLM_NIXL_SIDE_CHANNEL_PORT + DP rank (5600 by default). nixlctl sends the request
a vLLM decode sends, msgpack [b"get_meta_msg", pp_rank, tp_rank] on one ZMQ REQ
socket, rank after rank in vLLM's order (every tp rank of pp 0, then of pp 1...),
and reads each two-frame reply: the NixlHandshakePayload map {compatibility_hash,
agent_metadata_bytes} and the listener's clock. Every field of NixlAgentMetadata
is checked as vLLM's msgspec decoder checks it; a reply that is not what vLLM
sends is an error naming the rank and the field.

Which ranks: vLLM's listener fails on a rank the engine does not have and never
answers, so only ranks known to exist are asked. --tp N --pp N: all N x N.
Otherwise rank (0,0) first; nixlctl's own engines say their TP and PP sizes in
the metadata; a real vLLM does not (its TP travels in kv_transfer_params), so
with --model its TP is inferred from rank 0's block_len (KV heads a rank x head
size x dtype x block size, K and V apart or together as the regions show; one
head a rank only bounds it from below; without --kv-dtype, an fp8 cache would
read as half the TP, so only the ranks that exist either way are asked); PP
is 1 when rank 0's regions cover every layer, and when they cover neither every
layer nor the first stage of --pp, the model's fit is in doubt and only rank
(0,0) is asked; without --model only (0,0) is asked, and
the output says why. --pp-rank/--tp-rank ask that one rank. Each rank gets
--timeout; one that does not answer is an error naming it.

It prints rank 0 in full: the engine id, the agent name (where the NIXL agent
blob's format is known), the compatibility hash, the KV layout, block size,
number of blocks, regions with their block lengths and strides, bytes
registered, the sizes of the payload, metadata and agent blob, the round trip
and the listener clock's offset from this host's (close to 0 on the same host);
then one row per rank (pp, tp, engine id, agent, regions, bytes registered,
block length, blocks, round trip, clock offset) and the clock offset of the
fastest round trip, the one a vLLM decode keeps.

Acceptance verdict: with any of --decode-tp, --decode-block-size,
--decode-layout, --compat-factors FILE (a JSON object of the decode's vLLM hash
factors, as for bench pull|push) or --compat-hash HEX, nixlctl applies the rules
a vLLM decode applies at handshake (connector version 12) and lists each check
with the prefill's value, the decode's, ok, and why:
  compatibility hash   equal to the decode's; when not, what the metadata shows
                       (attn_backend_name against the factors', block_len
                       against --model's or the factors' KV heads, head size
                       and dtype, regions against the layers) names the likely
                       factor, or it says the hash alone cannot tell
  tp ratio             the TP sizes divide one another (tp_ratio D/P or -P/D)
  replicated kv heads  vLLM refuses P_tp > D_tp for a non-MLA model whose
                       prefill replicates KV heads (P_tp > num_kv_heads)
  head split layout    different TP sizes move head slices: HND on both sides
  block size           the decode's block a multiple of the prefill's (a
                       larger prefill block is unsupported; a ratio with the
                       hybrid allocator too)
  block_len            every region of every rank holds what the decode's cache
                       implies (vLLM's runtime validation), as many regions
  kv cache layout      the same HND/NHD order on both sides
then one line: "a decode with tp=2, block 16, HND would be accepted" or "...
would be refused: <first reason>". Unset decode values are the prefill's (TP,
block size) or vLLM's (HND; --kv-dtype auto: the model's dtype). Checks that
need what neither side said (the model, the prefill's TP) show "?" and are
listed as not checked.

--protocol sglang: TARGET is HOST:PORT of an SGLang prefill's bootstrap server
(--disaggregation-bootstrap-port, 8998 by default). nixlctl calls GET /health,
GET /route with every parameter -1 (PrefillServerInfo: attention TP, CP, DP and
PP sizes, page size, KV cache dtype, follow_bootstrap_room, the prefill's HTTP
port), then GET /route for every (prefill_dp_rank, prefill_cp_rank,
target_tp_rank, target_pp_rank) as a decode does, listing each rank's ZMQ
address, and POST /query_dp_ranks with no rooms to see that the route exists.
--timeout bounds the whole SGLang probe.

nixlctl's own endpoints ("serve prefill --log-level info") log where their side
channel and bootstrap server listen.

Exit codes: 0 when every asked rank answered and (with a decode spec) the decode
would be accepted; 1 when a rank does not answer in time, a reply is not the
protocol's, or the decode would be refused (a differing compatibility hash
included); 2 for a missing or malformed TARGET or flag (a --decode-tp the
--model cannot be split into, say), found before anything is sent.

Output: a table on a terminal, JSON otherwise (-o json; -o markdown; -o csv for
key,value rows).`

const probeSideChannelExample = `  nixlctl probe sidechannel 10.0.0.2:5600
  nixlctl probe sidechannel 10.0.0.2:5600 --model meta-llama/config.json --decode-tp 4
  nixlctl probe sidechannel 10.0.0.2:5600 --tp 4 --compat-factors factors.json --decode-tp 2 --decode-block-size 32
  nixlctl probe sidechannel tcp://10.0.0.2:5601 --tp-rank 1
  nixlctl probe sidechannel --protocol sglang 10.0.0.2:8998 -o json`

func (o probeSideChannelOptions) checkExplicit(set explicitOptions) error {
	// 0 is "discover", as if not given.
	return refuseExplicitZero(set,
		zeroFlag{"tp", o.TP == 0, "at least 1", "discovering it"},
		zeroFlag{"pp", o.PP == 0, "at least 1", "discovering it"},
	)
}

func newProbeSideChannelCmd(a *app) *cobra.Command {
	cmd := &cobra.Command{
		Use:     "sidechannel TARGET",
		Short:   "Ask a live vLLM NIXL side channel or SGLang bootstrap server what a decode would",
		Long:    probeSideChannelLong,
		Example: probeSideChannelExample,
		Args:    cobra.ArbitraryArgs, // checked in runProbeSideChannel, with a clearer message
		RunE: func(cmd *cobra.Command, args []string) error {
			o, _, err := bindLeaf[probeSideChannelOptions](cmd)
			if err != nil {
				return err
			}
			f := cmd.Flags()
			o.oneRank = f.Changed("pp-rank") || f.Changed("tp-rank")
			for _, n := range []string{"decode-tp", "decode-block-size", "decode-layout", "compat-factors", "compat-hash"} {
				o.verdict = o.verdict || f.Changed(n)
			}
			return runProbeSideChannel(cmd.Context(), a, o, args)
		},
	}
	f := cmd.Flags()
	f.String("protocol", probe.ProtoVLLM, "side channel: vllm (NIXL handshake, ZMQ) or sglang (bootstrap server, HTTP)")
	f.String("timeout", "3s", "give up after this long (vllm: each rank; sglang: the whole probe)")
	f.Int("pp-rank", 0, "vllm: ask only this pipeline-parallel rank")
	f.Int("tp-rank", 0, "vllm: ask only this tensor-parallel rank")
	f.Int("tp", 0, "vllm: the engine's TP size: ask every tp rank (default: discover)")
	f.Int("pp", 0, "vllm: the engine's PP size: ask every pp rank (default: discover)")
	f.String("model", "", "vllm: model preset or HuggingFace config.json (infers a vLLM's TP from block_len; the decode's model)")
	f.String("kv-dtype", "auto", "vllm: KV cache dtype of both sides (auto: the model's)")
	f.Int("decode-tp", 0, "vllm: judge a decode with this TP size (default: the prefill's)")
	f.Int("decode-block-size", 0, "vllm: the decode's block size in tokens (default: the prefill's)")
	f.String("decode-layout", "HND", "vllm: the decode's kv cache layout, HND or NHD")
	f.String("compat-factors", "", "vllm: JSON file of the decode's compatibility factors; check the engine's hash against theirs")
	f.String("compat-hash", "", "vllm: the decode's compatibility hash (sha256 hex); check the engine's against it")
	return cmd
}

func runProbeSideChannel(ctx context.Context, a *app, o probeSideChannelOptions, args []string) error {
	switch {
	case len(args) == 0:
		return errkind.BadInputf("no target: give the side channel as HOST:PORT (vllm: VLLM_NIXL_SIDE_CHANNEL_PORT + DP rank; sglang: the bootstrap port)")
	case len(args) > 1:
		return errkind.BadInputf("one target, got %d: %s", len(args), strings.Join(args, " "))
	}
	x := probe.SideChannelOptions{Protocol: strings.ToLower(strings.TrimSpace(o.Protocol)), Target: args[0], OneRank: o.oneRank,
		PPRank: o.PPRank, TPRank: o.TPRank, TP: o.TP, PP: o.PP}
	var err error
	if x.Timeout, err = parseDurationFlag("timeout", o.Timeout, false); err != nil {
		return err
	}
	var d probe.DecodeSpec
	cf, err := readCompatFlags(o.CompatFactors, o.CompatHash)
	if err != nil {
		return err
	}
	d.Factors, x.WantHash, x.HashFrom = cf.factors, cf.hash, cf.from
	if x.TP < 0 || x.PP < 0 {
		return errkind.BadInputf("--tp and --pp must be > 0 (got %d and %d)", x.TP, x.PP)
	}
	if o.KVDType != "" && o.KVDType != "auto" {
		if x.KVDType, err = kv.ParseDType(o.KVDType); err != nil {
			return errkind.BadInputf("--kv-dtype: %v", err)
		}
	}
	if o.Model != "" {
		m, err := loadProbeModel(o.Model)
		if err != nil {
			return err
		}
		x.Model = &m
	}
	if o.verdict {
		if err := decodeSpec(&d, o, x); err != nil {
			return err
		}
		d.WantHash, d.HashFrom = x.WantHash, x.HashFrom
		x.Decode = &d
	}
	if err := x.Validate(); err != nil {
		return err
	}
	res, err := probe.RunSideChannel(ctx, x)
	if res != nil {
		res.Version = version
		if werr := report.Write(a.io.Out, a.format, res); werr != nil {
			return werr
		}
	}
	return err
}

// loadProbeModel reads probe sidechannel's --model, which takes either
// kind: a preset name, or a path to a HuggingFace config.json (any name
// ending in .json, or an existing file).
func loadProbeModel(s string) (kv.Model, error) {
	st, err := os.Stat(s)
	return readModel("--model", s, strings.HasSuffix(s, ".json") || (err == nil && st.Mode().IsRegular()))
}

// decodeSpec checks the --decode-* flags before anything is sent: a
// decode the model cannot be deployed as is the user's mistake, not the
// prefill's refusal.
func decodeSpec(d *probe.DecodeSpec, o probeSideChannelOptions, x probe.SideChannelOptions) error {
	if o.DecodeTP < 0 || o.DecodeTP > kv.MaxParallel {
		return errkind.BadInputf("--decode-tp must be between 1 and %d (got %d)", kv.MaxParallel, o.DecodeTP)
	}
	if o.DecodeBlock < 0 || o.DecodeBlock > kv.MaxBlockSize {
		return errkind.BadInputf("--decode-block-size must be between 1 and %d (got %d)", kv.MaxBlockSize, o.DecodeBlock)
	}
	order, err := kv.ParseCacheOrder(o.DecodeLayout)
	if err != nil {
		return errkind.BadInputf("--decode-layout: %v", err)
	}
	d.TP, d.BlockSize, d.Layout, d.Model, d.DType = o.DecodeTP, o.DecodeBlock, string(order), x.Model, x.KVDType
	if x.Model != nil && d.TP > 0 {
		s := kv.Spec{Model: *x.Model, DType: d.DType, BlockSize: max(d.BlockSize, 1), TP: d.TP}
		if err := s.Validate(); err != nil {
			return errkind.BadInputf("--decode-tp %d with --model %s: %v", d.TP, x.Model.Name, err)
		}
	}
	return nil
}
