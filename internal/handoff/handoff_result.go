package handoff

import (
	"cmp"
	"fmt"
	"strings"
	"time"

	"github.com/nixlctl/nixlctl/internal/cpuspeed"
	"github.com/nixlctl/nixlctl/internal/engine"
	"github.com/nixlctl/nixlctl/internal/kv"
	"github.com/nixlctl/nixlctl/internal/nixl"
	"github.com/nixlctl/nixlctl/internal/report"
	"github.com/nixlctl/nixlctl/internal/runcore"
	"github.com/nixlctl/nixlctl/internal/stats"
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
	NetPath runcore.NetPath `json:"net_path,omitempty"`
	// Endpoints says where prefill and decode ran and how their clocks
	// were related to the driver's; Placement whether they shared a host.
	Endpoints   []runcore.EndpointInfo `json:"endpoints,omitempty"`
	Placement   string                 `json:"placement,omitempty"`
	Interrupted bool                   `json:"interrupted,omitempty"`
	// HostCPU says how steady the host's CPU speed was: readings of a
	// fixed loop before, between the rounds of, and after the timed phase.
	HostCPU *cpuspeed.Summary `json:"host_cpu,omitempty"`
	// EndpointDied names the endpoint that died during the timed phase and
	// how ("decode: signal: killed"); the run stopped there.
	EndpointDied string          `json:"endpoint_died,omitempty"`
	Records      []HandoffRecord `json:"-"`
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
