package handoff

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/nixlctl/nixlctl/internal/cpuspeed"
	"github.com/nixlctl/nixlctl/internal/engine"
	"github.com/nixlctl/nixlctl/internal/hostload"
	"github.com/nixlctl/nixlctl/internal/kv"
	"github.com/nixlctl/nixlctl/internal/report"
	"github.com/nixlctl/nixlctl/internal/runcore"
)

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
	PoolSizedFor string `json:"pool_sized_for,omitempty"`
	// Knobs are the engines' settings as the run's protocol uses them
	// (engine.Knobs.Echo: push's watchdog only in push results, SGLang's
	// timeouts only in SGLang's).
	engine.Knobs
	// UnsupportedTP: the TP pairs vLLM refuses that the run measured
	// anyway (--allow-unsupported-tp), with vLLM's reason.
	UnsupportedTP []string `json:"unsupported_tp,omitempty"`
	ChunkTokens   int      `json:"chunk_tokens"`
	SGLBootstrap  string   `json:"sglang_bootstrap,omitempty"` // an external SGLang prefill's
	Mem           string   `json:"mem"`
	// PrefillDevice and DecodeDevice are the GPUs the pools were on
	// (--device, --decode-device), with --mem vram only.
	PrefillDevice      *int           `json:"prefill_device,omitempty"`
	DecodeDevice       *int           `json:"decode_device,omitempty"`
	Endpoints          string         `json:"endpoints"`
	PoolBytesPerEngine int64          `json:"pool_bytes_per_engine"`
	Alloc              string         `json:"alloc"`
	XferReference      *XferReference `json:"xfer_reference,omitempty"`
	// CompatHash is the vLLM compatibility hash the endpoints advertised
	// (from --compat-factors, --compat-hash or derived); NoCompatCheck
	// that they accepted any peer's.
	CompatHash    string `json:"compat_hash,omitempty"`
	NoCompatCheck bool   `json:"no_compat_check,omitempty"`
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
	// Target is the serve target --listen address the reference crossed
	// to (--xfer-target); absent: a target the driver started.
	Target string `json:"target,omitempty"`
	// SpanBytes is the memory each side of the rounds' references
	// walked, a rank's KV pool, as the handoff's requests take their
	// blocks from across it; absent: the reference reused its pipeline's
	// slots (block x batch x depth), as before it, or when a pool's
	// worth did not fit.
	SpanBytes int64 `json:"span_bytes,omitempty"`
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
	// RoundIdleFraction is the rounds' median share of their span in
	// which no request was in its handoff stage (every one in its
	// prefill, in decode's checks after it, or between requests): time
	// EfficiencyXfer leaves out. SpanEfficiencyXfer is the median of the
	// rounds' SpanGBps / XferGBps, that time included: the pipeline's
	// ratio, which a regression outside the handoff stage (a decode that
	// checks every byte, a slower prefill) lowers while EfficiencyXfer
	// holds; the gate judges both.
	RoundIdleFraction  float64 `json:"round_idle_fraction,omitempty"`
	SpanEfficiencyXfer float64 `json:"span_efficiency_vs_xfer,omitempty"`
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
	NetPath runcore.NetPath `json:"net_path,omitempty"`
	// Endpoints says where prefill and decode ran and how their clocks
	// were related to the driver's; Placement whether they shared a host.
	Endpoints   []runcore.EndpointInfo `json:"endpoints,omitempty"`
	Placement   string                 `json:"placement,omitempty"`
	Interrupted bool                   `json:"interrupted,omitempty"`
	// HostCPU says how steady the host's CPU speed was: readings of a
	// fixed loop before, between the rounds of, and after the timed phase.
	HostCPU *cpuspeed.Summary `json:"host_cpu,omitempty"`
	// HostOthers is the CPU time processes other than the run's (this
	// one, the endpoints it started, and those on this host it reached)
	// took of this host while it measured: a neighbour on a small host
	// takes the CPUs UCX's progress threads spin on.
	hostload.Field
	// EndpointDied names the endpoint that died during the timed phase and
	// how ("decode: signal: killed"); the run stopped there.
	EndpointDied string          `json:"endpoint_died,omitempty"`
	Records      []HandoffRecord `json:"-"`
}

// The gate reads these through interfaces: a method lost would drop the
// run's problems or its neighbour silently.
var (
	_ report.HealthReporter = (*HandoffResult)(nil)
	_ report.HostSharer     = (*HandoffResult)(nil)
)

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

// ppOrOmit is pp as results record it: absent for one stage, so results
// without pipeline stages read as they always have.
func ppOrOmit(pp int) int {
	if pp <= 1 {
		return 0
	}
	return pp
}

// handoffPairBytes is what crossed the endpoints' devices during the
// timed phase, per pair of ends (n prefills, then the decodes): every
// request that moved its bytes, warm-up ones included (the counters saw
// them too).
func handoffPairBytes(records []HandoffRecord, n int) runcore.PairBytes {
	by := map[[2]int]int64{}
	for _, r := range records {
		if r.Error == "" {
			by[[2]int{r.Prefill, n + r.Decode}] += r.Bytes
		}
	}
	return func(i, j int) int64 {
		if i > j {
			i, j = j, i
		}
		return by[[2]int{i, j}]
	}
}

// XferRound is one round of an interleaved reference: the handoff's
// requests of the round, then bench xfer on the same bytes, then (on one
// host with the ucx backend) the same transfers between UCX-allocated
// shared memory, the fastest path UCX offers two processes. The
// references' rates are their bytes over their timed pipelines, always
// busy; the handoff's is the round's bytes over the time at least one of
// its requests was in its handoff stage (prefill done to ready), so that
// both sides count the time there was something to move. A closed loop of
// equal requests runs in waves (equal transfers sharing the copy finish
// together) and between waves every request is in its prefill, nothing
// outstanding: 5-7% of an SGLang round on a 2-core host (the medians of
// ten runs, docs/bench-pull-push-sglang.md), which a rate
// over the round's whole span (SpanGBps) charged to the transfer path.
type XferRound struct {
	Round       int     `json:"round"`
	Requests    int     `json:"requests"`
	HandoffGBps float64 `json:"handoff_gbps"`
	// SpanGBps is the round's bytes over its span (first start to last
	// ready); IdleFraction the share of that span with no handoff
	// outstanding.
	SpanGBps     float64 `json:"span_gbps,omitempty"`
	IdleFraction float64 `json:"idle_fraction,omitempty"`
	XferGBps     float64 `json:"xfer_gbps"`
	LimitGBps    float64 `json:"limit_gbps,omitempty"`
	// CPUNSPerStep is the host's speed just before the round's reference
	// (cpuspeed: the slowest CPU's ns per step of a fixed loop).
	CPUNSPerStep float64 `json:"cpu_ns_per_step,omitempty"`
	// TouchMS is how long the slowest endpoint took to read a byte of
	// each page of its pools after the round's references, so that the
	// next handoff round starts warm as each reference does
	// (engine.TouchPools); absent after the last round, which no handoff
	// round follows, and in results from before it.
	TouchMS float64 `json:"touch_ms,omitempty"`
}

// Ratio is the round's handoff rate over its bench xfer rate (0 without
// one).
func (r XferRound) Ratio() float64 {
	if r.XferGBps <= 0 {
		return 0
	}
	return r.HandoffGBps / r.XferGBps
}

// limitRatio is the round's handoff rate over the host's limit (0
// without one).
func (r XferRound) limitRatio() float64 {
	if r.LimitGBps <= 0 {
		return 0
	}
	return r.HandoffGBps / r.LimitGBps
}

// PairSummary is one (prefill, decode) pair of an xPyD run, from its
// measured requests.
type PairSummary struct {
	Prefill       int   `json:"prefill"`
	Decode        int   `json:"decode"`
	Requests      int   `json:"requests"`
	Failed        int   `json:"failed"`
	CorruptBlocks int   `json:"corrupt_blocks"`
	Bytes         int64 `json:"bytes"`
	// ActiveSeconds is the pair's active time: its first measured
	// request's start to its last one's decode ready.
	ActiveSeconds float64 `json:"active_seconds"`
	// ActiveGBps is Bytes / ActiveSeconds: what the pair moved while it
	// had work (not over the whole run's time).
	ActiveGBps       float64            `json:"active_bandwidth_gbps"`
	HandoffLatencyMS report.Percentiles `json:"handoff_latency_ms"`
}

// RendezvousInfo records how a run found its engines through a
// rendezvous (--rendezvous): where the driver waited, for which run and
// roster, how long, and who came.
type RendezvousInfo struct {
	Addr     string             `json:"addr"`
	RunID    string             `json:"run_id"`
	Roster   string             `json:"roster"`
	WaitedMS float64            `json:"waited_ms"`
	Members  []RendezvousMember `json:"members"`
}

// RendezvousMember is one endpoint that registered.
type RendezvousMember struct {
	Role string `json:"role"`
	Rank int    `json:"rank"`
	Host string `json:"host"`
	// Addr is the control address the driver dialled, or "reverse" for an
	// endpoint served over its registration's connection.
	Addr string `json:"addr"`
	From string `json:"from"` // where the hello came from (TCP peer, or etcd key)
}

// label is the text report's line: where, which run, who from which host
// ("[::]:7500, run 4242, 12 ms: prefill rank 0 on node1 (10.0.0.1:7400),
// decode rank 1 on node2 (reverse)").
func (r *RendezvousInfo) label() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s, run %q, %s ms:", r.Addr, r.RunID, strconv.FormatFloat(r.WaitedMS, 'f', 0, 64))
	for i, m := range r.Members {
		if i > 0 {
			b.WriteByte(',')
		}
		fmt.Fprintf(&b, " %s rank %d on %s (%s)", m.Role, m.Rank, m.Host, m.Addr)
	}
	return b.String()
}
