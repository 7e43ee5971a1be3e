package probe

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/nixlctl/nixlctl/internal/errkind"
	"github.com/nixlctl/nixlctl/internal/kv"
	"github.com/nixlctl/nixlctl/internal/mono"
	"github.com/nixlctl/nixlctl/internal/nixl"
	"github.com/nixlctl/nixlctl/internal/sidechannel"
)

// Side-channel protocols probe sidechannel speaks.
const (
	ProtoVLLM   = "vllm"
	ProtoSGLang = "sglang"
)

// SideChannelOptions configure a probe of a live engine's side channel.
type SideChannelOptions struct {
	Protocol string // ProtoVLLM or ProtoSGLang
	Target   string // host:port (tcp:// or http:// allowed)
	Timeout  time.Duration
	// vLLM: OneRank asks only (PPRank, TPRank); otherwise every rank of
	// TP x PP is asked, where 0 means "discover" (nixlctl's metadata, or
	// Model's block_len). vLLM's listener does not guard the lookup, so a
	// rank the engine does not have is never answered: only ranks known to
	// exist are asked.
	OneRank        bool
	PPRank, TPRank int
	TP, PP         int
	// Model and KVDType let a vLLM engine's TP be inferred from block_len.
	Model   *kv.Model
	KVDType kv.DType
	// Decode, when set, asks for the acceptance verdict of that decode.
	Decode *DecodeSpec
	// WantHash is the compatibility hash the user expects (from
	// --compat-factors or --compat-hash); "" checks nothing. HashFrom
	// says where it came from, for the report.
	WantHash, HashFrom string
}

// maxVLLMRanks bounds how many ranks of one vLLM engine are asked, so
// that sizes a peer claims cannot keep the probe busy for hours.
const maxVLLMRanks = 4096

// maxSGLRanks bounds how many rank entries are listed.
const maxSGLRanks = 1024

// ParseTarget checks a target and returns the address to dial: a ZMQ
// endpoint (tcp://host:port) for vLLM, host:port for SGLang's HTTP server.
// Every error is bad input, found before any network I/O.
func ParseTarget(protocol, target string) (string, error) {
	t := strings.TrimSpace(target)
	var scheme string
	switch protocol {
	case ProtoVLLM:
		scheme = "tcp://"
	case ProtoSGLang:
		scheme = "http://"
		t = strings.TrimSuffix(t, "/")
	default:
		return "", errkind.BadInputf("--protocol %q: want vllm or sglang", protocol)
	}
	t = strings.TrimPrefix(t, scheme)
	if t == "" {
		return "", errkind.BadInputf("no target: give the side channel as HOST:PORT")
	}
	if i := strings.Index(t, "://"); i >= 0 {
		return "", errkind.BadInputf("target %q: want HOST:PORT or %sHOST:PORT for --protocol %s", target, scheme, protocol)
	}
	host, port, err := net.SplitHostPort(t)
	if err != nil {
		return "", errkind.BadInputf("target %q: want HOST:PORT (%v)", target, err)
	}
	if host == "" || strings.ContainsAny(host, "/?#@ ") {
		return "", errkind.BadInputf("target %q: no host", target)
	}
	p, err := strconv.Atoi(port)
	if err != nil || p < 1 || p > 65535 {
		return "", errkind.BadInputf("target %q: port %q is not a port (1-65535)", target, port)
	}
	addr := net.JoinHostPort(host, strconv.Itoa(p))
	if protocol == ProtoVLLM {
		return "tcp://" + addr, nil
	}
	return addr, nil
}

// Validate checks the options before any network I/O.
func (o SideChannelOptions) Validate() error {
	if _, err := ParseTarget(o.Protocol, o.Target); err != nil {
		return err
	}
	if o.Timeout <= 0 {
		return errkind.BadInputf("--timeout must be > 0 (got %v)", o.Timeout)
	}
	if o.PPRank < 0 || o.TPRank < 0 || o.PPRank > 1<<16 || o.TPRank > 1<<16 {
		return errkind.BadInputf("--pp-rank and --tp-rank must be between 0 and 65536")
	}
	if o.TP < 0 || o.PP < 0 || o.TP > kv.MaxParallel || o.PP > kv.MaxParallel {
		return errkind.BadInputf("--tp and --pp must be between 1 and %d", kv.MaxParallel)
	}
	if max(o.TP, 1)*max(o.PP, 1) > maxVLLMRanks {
		return errkind.BadInputf("--tp %d x --pp %d is more than the %d ranks nixlctl asks one engine", o.TP, o.PP, maxVLLMRanks)
	}
	if o.OneRank && (o.TP > 0 || o.PP > 0) {
		return errkind.BadInputf("--pp-rank/--tp-rank ask one rank, --tp/--pp every rank: give one or the other")
	}
	if o.Protocol == ProtoSGLang && (o.WantHash != "" || o.OneRank || o.TP > 0 || o.PP > 0 || o.Model != nil || o.Decode != nil) {
		return errkind.BadInputf("--compat-factors, --compat-hash, --pp-rank, --tp-rank, --tp, --pp, --model and the --decode-* flags are for --protocol vllm")
	}
	return nil
}

// SideChannelResult is what probe sidechannel found.
type SideChannelResult struct {
	Command  string `json:"command"`
	Version  string `json:"nixlctl_version,omitempty"`
	Protocol string `json:"protocol"`
	Target   string `json:"target"`
	// VLLM is the first rank handshaken, in full; Ranks every rank, in
	// the order asked (VLLM is Ranks[0]).
	VLLM  *VLLMHandshake   `json:"vllm,omitempty"`
	Ranks []*VLLMHandshake `json:"vllm_ranks,omitempty"`
	// Discovery says how the ranks asked were chosen.
	Discovery string `json:"vllm_rank_discovery,omitempty"`
	// ClockOffsetMs is the listener clock's offset measured on the
	// lowest round trip, as a vLLM decode keeps it (ClockRank says where).
	ClockOffsetMs *float64         `json:"clock_offset_ms,omitempty"`
	ClockRank     string           `json:"clock_offset_rank,omitempty"`
	Accept        *Acceptance      `json:"acceptance,omitempty"`
	SGLang        *SGLangBootstrap `json:"sglang,omitempty"`
	Notes         []string         `json:"notes,omitempty"`
}

// VLLMHandshake is one handshake with a vLLM NIXL side channel.
type VLLMHandshake struct {
	PPRank int     `json:"pp_rank"`
	TPRank int     `json:"tp_rank"`
	RTTMs  float64 `json:"rtt_ms"`

	EngineID string `json:"engine_id"`
	// AgentName is read from the agent blob where nixlctl knows its
	// format (AgentBlobFormat); "" otherwise.
	AgentName       string `json:"agent_name,omitempty"`
	AgentBlobFormat string `json:"agent_blob_format"`

	CompatHash     string `json:"compat_hash"`
	CompatExpected string `json:"compat_hash_expected,omitempty"`
	CompatFrom     string `json:"compat_hash_expected_from,omitempty"`
	CompatMatch    *bool  `json:"compat_match,omitempty"`

	// TPSize is 0 when the handshake does not say (vLLM sends it in
	// kv_transfer_params; nixlctl's engines add it to the metadata).
	TPSize int `json:"tp_size,omitempty"`
	PPSize int `json:"pp_size,omitempty"`

	KVCacheLayout            string   `json:"kv_cache_layout"`
	BlockSize                int      `json:"block_size"`
	NumBlocks                int      `json:"num_blocks"`
	DeviceID                 int      `json:"device_id"`
	AttnBackend              string   `json:"attn_backend_name"`
	Regions                  int      `json:"regions"`
	BlockLens                []int64  `json:"block_lens"`
	BlockStrides             []int64  `json:"block_strides"`
	RegionMemTypes           []string `json:"region_mem_types,omitempty"`
	RegionNames              []string `json:"region_names,omitempty"`
	SSMSizes                 []int64  `json:"ssm_sizes"`
	PhysicalBlocksPerLogical int      `json:"physical_blocks_per_logical_kv_block"`
	DCPSize                  int      `json:"dcp_size"`
	PCPSize                  int      `json:"pcp_size"`
	Backend                  string   `json:"nixlctl_backend,omitempty"`

	PayloadBytes   int `json:"payload_bytes"`
	MetadataBytes  int `json:"metadata_bytes"`
	AgentBlobBytes int `json:"agent_blob_bytes"`
	// RegisteredBytes is what the rank's regions span: blocks x stride.
	RegisteredBytes int64 `json:"registered_bytes"`

	// RemoteClockS is the listener's perf_counter; ClockOffsetMs its
	// offset to this host's CLOCK_MONOTONIC at the round trip's midpoint
	// (close to 0 on the same host, where both are that clock).
	RemoteClockS  float64  `json:"remote_clock_s"`
	ClockOffsetMs float64  `json:"clock_offset_ms"`
	UnknownFields []string `json:"unknown_fields,omitempty"`
}

// SGLangBootstrap is what an SGLang prefill's bootstrap server said.
type SGLangBootstrap struct {
	Health       string             `json:"health"`
	HealthMs     float64            `json:"health_ms"`
	RouteMs      float64            `json:"route_ms"`
	Info         *SGLangPrefillInfo `json:"prefill_server_info,omitempty"`
	Ranks        []SGLangRank       `json:"ranks,omitempty"`
	RanksOmitted int                `json:"ranks_omitted,omitempty"`
	// QueryDPRanks is how POST /query_dp_ranks with no rooms answered:
	// "ok" or why not (an older SGLang has no such route).
	QueryDPRanks string `json:"query_dp_ranks"`
}

// SGLangPrefillInfo is SGLang's PrefillServerInfo.
type SGLangPrefillInfo struct {
	AttnTPSize               int     `json:"attn_tp_size"`
	AttnCPSize               int     `json:"attn_cp_size"`
	DPSize                   int     `json:"dp_size"`
	PPSize                   int     `json:"pp_size"`
	PageSize                 *int    `json:"page_size"`
	KVCacheDType             *string `json:"kv_cache_dtype"`
	FollowBootstrapRoom      bool    `json:"follow_bootstrap_room"`
	EnableDSACacheLayerSplit bool    `json:"enable_dsa_cache_layer_split"`
	PrefillHTTPPort          *int    `json:"prefill_http_port"`
}

// SGLangRank is one prefill rank's entry (PrefillRankInfo).
type SGLangRank struct {
	DPRank   int    `json:"prefill_dp_rank"`
	CPRank   int    `json:"prefill_cp_rank"`
	TPRank   int    `json:"target_tp_rank"`
	PPRank   int    `json:"target_pp_rank"`
	RankIP   string `json:"rank_ip"`
	RankPort int    `json:"rank_port"`
}

// RunSideChannel probes a live side channel. A result comes back with
// what was learnt even when err is not nil (a hash mismatch, a bootstrap
// server whose ranks are still registering).
func RunSideChannel(ctx context.Context, o SideChannelOptions) (*SideChannelResult, error) {
	if err := o.Validate(); err != nil {
		return nil, err
	}
	addr, _ := ParseTarget(o.Protocol, o.Target)
	res := &SideChannelResult{Command: "probe sidechannel", Protocol: o.Protocol, Target: addr}
	if o.Protocol == ProtoSGLang {
		// SGLang: --timeout bounds the whole probe.
		ctx, cancel := context.WithTimeout(ctx, o.Timeout)
		defer cancel()
		res.Target = "http://" + addr
		res.SGLang = &SGLangBootstrap{}
		err := probeSGLang(ctx, addr, o.Timeout, res)
		if err != nil && res.SGLang.Health == "" {
			return nil, err // nothing learnt
		}
		return res, err
	}
	// vLLM: each rank gets --timeout (a rank that does not answer is named).
	return runVLLM(ctx, addr, o, res)
}

// runVLLM handshakes the ranks on one REQ socket, in vLLM's order
// (product(range(pp), tp ranks)), then judges the decode spec if any.
func runVLLM(ctx context.Context, addr string, o SideChannelOptions, res *SideChannelResult) (*SideChannelResult, error) {
	conn, err := sidechannel.DialReq(addr)
	if err != nil {
		return nil, fmt.Errorf("vLLM side channel %s: %w", addr, err)
	}
	defer conn.Close()
	pp0, tp0 := 0, 0
	if o.OneRank {
		pp0, tp0 = o.PPRank, o.TPRank
	}
	h, err := probeVLLM(ctx, conn, addr, o, pp0, tp0)
	if err != nil {
		return nil, err
	}
	res.VLLM, res.Ranks = h, []*VLLMHandshake{h}
	facts := PrefillFacts{TP: h.TPSize, PP: h.PPSize, BlockSize: h.BlockSize, Layout: h.KVCacheLayout, AttnBackend: h.AttnBackend,
		CompatHash: h.CompatHash, Regions: h.Regions}
	if h.TPSize > 0 {
		facts.PP = max(h.PPSize, 1)
	}
	tp, pp := discoverRanks(o, h, &facts, res)
	var errs []error
	for p := 0; p < pp && len(errs) == 0; p++ {
		for t := 0; t < tp; t++ {
			if p == 0 && t == 0 {
				continue
			}
			r, err := probeVLLM(ctx, conn, addr, o, p, t)
			if err != nil {
				errs = append(errs, err)
				break
			}
			res.Ranks = append(res.Ranks, r)
		}
	}
	best := res.Ranks[0]
	for _, r := range res.Ranks {
		facts.Ranks = append(facts.Ranks, RankLens{PP: r.PPRank, TP: r.TPRank, BlockLens: r.BlockLens})
		if r.RTTMs < best.RTTMs {
			best = r
		}
		if r.CompatHash != h.CompatHash {
			res.Notes = append(res.Notes, fmt.Sprintf("rank (pp %d, tp %d) advertises compatibility hash %s, rank (pp %d, tp %d) %s: a decode accepts at most one of them",
				r.PPRank, r.TPRank, sidechannel.ShortHash(r.CompatHash), h.PPRank, h.TPRank, sidechannel.ShortHash(h.CompatHash)))
		}
		if r.EngineID != h.EngineID {
			res.Notes = append(res.Notes, fmt.Sprintf("rank (pp %d, tp %d) says engine %q, rank (pp %d, tp %d) %q: a decode checks the engine id and refuses one of them",
				r.PPRank, r.TPRank, r.EngineID, h.PPRank, h.TPRank, h.EngineID))
		}
	}
	off := best.ClockOffsetMs
	res.ClockOffsetMs, res.ClockRank = &off, fmt.Sprintf("pp %d, tp %d", best.PPRank, best.TPRank)
	if len(errs) > 0 {
		return res, errs[0]
	}
	if o.Decode != nil {
		a := Accept(facts, *o.Decode)
		res.Accept = &a
		if !a.Accepted {
			return res, errkind.CheckFailedf("%s", a.Verdict)
		}
		return res, nil
	}
	if h.CompatMatch != nil && !*h.CompatMatch {
		return res, errkind.CheckFailedf("compatibility hash mismatch: the engine advertises %s, %s gives %s: a vLLM decode with that hash refuses this engine",
			h.CompatHash, h.CompatFrom, h.CompatExpected)
	}
	return res, nil
}

// discoverRanks decides how many TP and PP ranks to ask, from the flags,
// nixlctl's metadata extension or the model's block_len, and records in
// facts what is known of the engine's sizes. It never guesses a rank into
// existence: a vLLM listener asked for a rank it lacks fails its thread.
func discoverRanks(o SideChannelOptions, h *VLLMHandshake, facts *PrefillFacts, res *SideChannelResult) (tp, pp int) {
	if o.OneRank {
		res.Discovery = fmt.Sprintf("one rank (--pp-rank %d, --tp-rank %d)", o.PPRank, o.TPRank)
		if facts.TP == 0 && o.Model != nil {
			inferSizes(o, h, facts)
		}
		return 0, 0
	}
	switch {
	case o.TP > 0 || o.PP > 0:
		// What the flags leave out comes from the metadata or the model,
		// else 1: rank 0 of a dimension always exists.
		how, ppHow, askTP := "", "", 0
		if facts.TP == 0 && facts.PP == 0 && o.Model != nil {
			how, ppHow, askTP = inferSizes(o, h, facts)
		}
		if o.TP > 0 {
			facts.TP, facts.TPLowerBound, askTP = o.TP, false, o.TP
		}
		if o.PP > 0 {
			facts.PP = o.PP
		}
		askTP = max(askTP, 1)
		switch {
		case o.TP == 0 && how != "":
			res.Discovery = fmt.Sprintf("given: pp %d; tp %s", facts.PP, how)
			if strings.HasPrefix(ppHow, "; but") {
				res.Discovery += ppHow // why only tp rank 0 is asked
			}
		case o.PP == 0 && facts.PP == 1:
			res.Discovery = fmt.Sprintf("given: tp %d; pp 1 (rank 0's regions cover every layer of %s)", askTP, o.Model.Name)
		case facts.PP == 0:
			res.Discovery = fmt.Sprintf("given: tp %d; pp unknown, only pp rank 0 asked (give --pp)", askTP)
		default:
			res.Discovery = fmt.Sprintf("given: tp %d, pp %d", askTP, facts.PP)
		}
		return askTP, max(facts.PP, 1)
	case h.TPSize > 0:
		facts.PP = max(h.PPSize, 1)
		res.Discovery = fmt.Sprintf("nixlctl metadata: tp %d, pp %d", h.TPSize, facts.PP)
		return h.TPSize, facts.PP
	case o.Model != nil:
		why, ppHow, askTP := inferSizes(o, h, facts)
		if facts.TP == 0 {
			res.Discovery = "rank (0, 0) only: " + why
			return 1, 1
		}
		res.Discovery = why + ppHow
		return askTP, max(facts.PP, 1)
	}
	res.Discovery = "rank (0, 0) only: vLLM's handshake does not carry the TP size; give --tp N [--pp N], or --model to infer it"
	return 1, 1
}

// inferSizes fills facts.TP (and PP when the regions cover every layer)
// from rank 0's block_len, and says how, or why not. askTP is how many TP
// ranks surely exist: with the cache dtype left to "auto", an fp8 cache
// would explain the same block_len with half the TP, and a rank beyond
// the engine's would fail a vLLM listener, so only the smaller TP's
// ranks are asked.
func inferSizes(o SideChannelOptions, h *VLLMHandshake, facts *PrefillFacts) (how, ppHow string, askTP int) {
	m := *o.Model
	if len(h.BlockLens) == 0 {
		return "no block lengths to infer the TP size from", "", 1
	}
	tp, atLeast, layout, err := InferTP(m, o.KVDType, h.BlockSize, h.Regions, h.AttnBackend, h.BlockLens[0])
	if err != nil {
		return "TP not inferred: " + err.Error(), "", 1
	}
	facts.TP, facts.TPLowerBound = tp, atLeast
	facts.PP = 0
	if perLayer := map[kv.AttnLayout]int{kv.FlashAttn: 2, kv.FlashInfer: 1}[layout]; h.Regions == perLayer*m.NumLayers {
		facts.PP = 1 // every layer is on pp rank 0; a larger PP is not guessed
	}
	dt := o.KVDType
	if dt == "" {
		dt = m.DType
	}
	s := fmt.Sprintf("inferred from rank 0's block_len %d B and %s with a %s cache: tp %d", h.BlockLens[0], m.Name, dt, tp)
	if atLeast {
		s = fmt.Sprintf("inferred from rank 0's block_len %d B and %s with a %s cache: tp ≥ %d (one replicated KV head a rank; ranks beyond %d are not asked)",
			h.BlockLens[0], m.Name, dt, tp, tp)
	}
	askTP = tp
	if o.KVDType == "" && m.DType != kv.FP8 {
		if alt, _, _, err := InferTP(m, kv.FP8, h.BlockSize, h.Regions, h.AttnBackend, h.BlockLens[0]); err == nil && alt < tp {
			askTP = alt
			which := "only tp rank 0, which exists either way, is asked"
			if alt > 1 {
				which = fmt.Sprintf("only tp ranks 0-%d, which exist either way, are asked", alt-1)
			}
			s += fmt.Sprintf(" (tp %d with an fp8 cache: %s; give --kv-dtype or --tp)", alt, which)
		}
	}
	// The TP is trusted only where the regions fit the model too (all its
	// layers at pp 1, or its first stage at the --pp given): a block_len
	// alone also fits another model at another TP.
	perLayer := map[kv.AttnLayout]int{kv.FlashAttn: 2, kv.FlashInfer: 1}[layout]
	switch {
	case facts.PP == 1:
		return s, ", pp 1 (its regions cover every layer)", askTP
	case o.PP > 0 && o.PP <= m.NumLayers && h.Regions == perLayer*len(kv.Spec{Model: m, PP: o.PP}.StageLayers(0)):
		return s, "", askTP
	case h.Regions > perLayer*m.NumLayers:
		return s, fmt.Sprintf("; but %d regions are more than %s's %d layers have (%s): another model? only rank (0, 0) asked", h.Regions, m.Name, m.NumLayers, layout), 1
	}
	return s, fmt.Sprintf("; but %d regions do not cover %s's %d layers (pp > 1, or another model whose blocks look alike): only rank (0, 0) asked; give --pp, or --tp and --pp", h.Regions, m.Name, m.NumLayers), 1
}

func probeVLLM(ctx context.Context, conn *sidechannel.ReqConn, endpoint string, o SideChannelOptions, pp, tp int) (*VLLMHandshake, error) {
	req, err := sidechannel.EncodeGetMeta(pp, tp)
	if err != nil {
		return nil, err
	}
	t0 := mono.Now()
	frames, err := conn.Request(ctx, [][]byte{req}, o.Timeout)
	t1 := mono.Now()
	if err != nil {
		if (ctx.Err() != nil && !errors.Is(ctx.Err(), context.Canceled)) || strings.Contains(err.Error(), "no reply within") {
			err = fmt.Errorf("no reply within %v", o.Timeout)
		}
		return nil, fmt.Errorf("vLLM side channel %s: %w (nothing answered get_meta_msg for pp %d, tp %d: is this VLLM_NIXL_SIDE_CHANNEL_PORT + DP rank of a running engine, and does it have that rank?)",
			endpoint, err, pp, tp)
	}
	r, err := sidechannel.ReadReply(frames)
	if err != nil {
		return nil, fmt.Errorf("vLLM side channel %s answered get_meta_msg for pp %d, tp %d, but not as vLLM does: %w", endpoint, pp, tp, err)
	}
	md := r.Meta
	h := &VLLMHandshake{PPRank: pp, TPRank: tp, RTTMs: float64(t1-t0) / 1e6, EngineID: md.EngineID,
		CompatHash: r.CompatibilityHash, KVCacheLayout: md.KVCacheLayout, BlockSize: md.BlockSize, NumBlocks: md.NumBlocks,
		DeviceID: md.DeviceID, AttnBackend: md.AttnBackendName, Regions: len(md.KVCachesBaseAddr), BlockLens: md.BlockLens,
		BlockStrides: md.BlockStrides, RegionMemTypes: md.RegionMemTypes, RegionNames: md.RegionNames, SSMSizes: md.SSMSizes,
		PhysicalBlocksPerLogical: md.PhysicalBlocksPerLogical, DCPSize: md.DCPSize, PCPSize: md.PCPSize,
		PayloadBytes: r.PayloadBytes, MetadataBytes: r.MetadataBytes, AgentBlobBytes: r.AgentBlobBytes,
		RemoteClockS: r.RemoteClock, UnknownFields: r.Unknown}
	h.RegisteredBytes = registeredBytes(md)
	h.ClockOffsetMs = (r.RemoteClock - float64(t0+t1)/2/1e9) * 1e3
	h.AgentName, h.AgentBlobFormat = AgentName(md.AgentMetadata)
	if x := md.Nixlctl; x != nil {
		h.Backend = x.Backend
		// The extension is a peer's word: sizes out of range are not used.
		if x.TPSize >= 1 && x.TPSize <= kv.MaxParallel && x.PPSize >= 0 && x.PPSize <= kv.MaxParallel && x.TPSize*max(x.PPSize, 1) <= maxVLLMRanks {
			h.TPSize, h.PPSize = x.TPSize, x.PPSize
		} else {
			h.UnknownFields = append(h.UnknownFields, fmt.Sprintf("nixlctl.tp_size %d / pp_size %d (out of range, ignored)", x.TPSize, x.PPSize))
		}
	}
	if o.WantHash != "" {
		match := strings.EqualFold(o.WantHash, r.CompatibilityHash)
		h.CompatExpected, h.CompatFrom, h.CompatMatch = o.WantHash, o.HashFrom, &match
	}
	return h, nil
}

// registeredBytes is what a rank's regions span: each region's blocks
// (region_num_blocks where given) times its stride (block_len without one).
func registeredBytes(md sidechannel.AgentMetadata) int64 {
	var total int64
	for i, l := range md.BlockLens {
		n := int64(md.NumBlocks)
		if len(md.RegionNumBlocks) == len(md.BlockLens) {
			n = int64(md.RegionNumBlocks[i])
		}
		if i < len(md.BlockStrides) && md.BlockStrides[i] > 0 {
			l = md.BlockStrides[i]
		}
		total += n * l
	}
	return total
}

// AgentName reads the agent's name from the blob an engine advertises,
// where nixlctl knows the format: its own ucx backend's, or NIXL's
// classic serialisation ("nixlSerDes|", tag "Agent", a size_t length,
// the name). Other blobs are opaque: the name is "".
func AgentName(blob []byte) (name, format string) {
	if md, err := nixl.DecodeMetadata(blob); err == nil {
		return md.Name, "nixlctl " + md.Backend
	}
	const header, tag = "nixlSerDes|", "Agent"
	if rest, ok := bytes.CutPrefix(blob, []byte(header)); ok {
		if rest, ok := bytes.CutPrefix(rest, []byte(tag)); ok && len(rest) >= 8 {
			n := binary.LittleEndian.Uint64(rest)
			if n > 0 && n <= 1024 && n <= uint64(len(rest)-8) {
				return string(rest[8 : 8+n]), "NIXL"
			}
		}
		return "", "NIXL (name not read)"
	}
	return "", "opaque"
}

func probeSGLang(ctx context.Context, addr string, timeout time.Duration, res *SideChannelResult) error {
	b := res.SGLang
	client := &http.Client{Timeout: timeout}
	base := "http://" + addr
	do := func(method, path string, body []byte) (int, []byte, float64, error) {
		req, err := http.NewRequestWithContext(ctx, method, base+path, bytes.NewReader(body))
		if err != nil {
			return 0, nil, 0, err
		}
		if body != nil {
			req.Header.Set("Content-Type", "application/json")
		}
		t0 := mono.Now()
		resp, err := client.Do(req)
		if err != nil {
			if ctx.Err() != nil && !errors.Is(ctx.Err(), context.Canceled) {
				err = fmt.Errorf("no answer within %v", timeout)
			}
			return 0, nil, 0, fmt.Errorf("SGLang bootstrap %s %s: %w", method, base+path, err)
		}
		defer resp.Body.Close()
		out, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
		ms := float64(mono.Now()-t0) / 1e6
		if err != nil {
			return 0, nil, 0, fmt.Errorf("SGLang bootstrap %s %s: %w", method, base+path, err)
		}
		return resp.StatusCode, out, ms, nil
	}
	code, body, ms, err := do(http.MethodGet, "/health", nil)
	if err != nil {
		return err
	}
	b.HealthMs = ms
	if code != http.StatusOK {
		b.Health = fmt.Sprintf("%d %s", code, firstLine(body))
		return fmt.Errorf("SGLang bootstrap %s: GET /health answered %d %q (SGLang answers 200 OK)", base, code, firstLine(body))
	}
	b.Health = strings.TrimSpace(string(body))
	q := url.Values{"prefill_dp_rank": {"-1"}, "prefill_cp_rank": {"-1"}, "target_tp_rank": {"-1"}, "target_pp_rank": {"-1"}}
	code, body, ms, err = do(http.MethodGet, "/route?"+q.Encode(), nil)
	if err != nil {
		return err
	}
	b.RouteMs = ms
	switch code {
	case http.StatusOK:
	case http.StatusServiceUnavailable:
		return fmt.Errorf("SGLang bootstrap %s: the prefill's ranks are still registering (GET /route: 503 %q)", base, firstLine(body))
	default:
		return fmt.Errorf("SGLang bootstrap %s: GET /route answered %d %q", base, code, firstLine(body))
	}
	info, err := ReadPrefillServerInfo(body)
	if err != nil {
		return fmt.Errorf("SGLang bootstrap %s: GET /route: %w", base, err)
	}
	b.Info = info
	n := info.DPSize * info.AttnCPSize * info.AttnTPSize * info.PPSize
	if n > maxSGLRanks {
		b.RanksOmitted = n - maxSGLRanks
	}
	// The per-rank entries, asked for as a decode does.
	listed := 0
	for dp := 0; dp < info.DPSize && listed < maxSGLRanks; dp++ {
		for cp := 0; cp < info.AttnCPSize && listed < maxSGLRanks; cp++ {
			for tp := 0; tp < info.AttnTPSize && listed < maxSGLRanks; tp++ {
				for pp := 0; pp < info.PPSize && listed < maxSGLRanks; pp++ {
					q := url.Values{"prefill_dp_rank": {strconv.Itoa(dp)}, "prefill_cp_rank": {strconv.Itoa(cp)},
						"target_tp_rank": {strconv.Itoa(tp)}, "target_pp_rank": {strconv.Itoa(pp)}}
					code, body, _, err := do(http.MethodGet, "/route?"+q.Encode(), nil)
					if err != nil {
						return err
					}
					where := fmt.Sprintf("dp %d, cp %d, tp %d, pp %d", dp, cp, tp, pp)
					if code != http.StatusOK {
						return fmt.Errorf("SGLang bootstrap %s: rank %s: GET /route answered %d %q (the server info promised %d ranks)",
							base, where, code, firstLine(body), n)
					}
					ip, port, err := ReadPrefillRankInfo(body)
					if err != nil {
						return fmt.Errorf("SGLang bootstrap %s: rank %s: %w", base, where, err)
					}
					b.Ranks = append(b.Ranks, SGLangRank{DPRank: dp, CPRank: cp, TPRank: tp, PPRank: pp, RankIP: ip, RankPort: port})
					listed++
				}
			}
		}
	}
	code, body, _, err = do(http.MethodPost, "/query_dp_ranks", []byte(`{"bootstrap_rooms": []}`))
	switch {
	case err != nil:
		return err
	case code == http.StatusOK && strings.TrimSpace(string(body)) == "{}":
		b.QueryDPRanks = "ok"
	default:
		b.QueryDPRanks = fmt.Sprintf("%d %s", code, firstLine(body))
		if !info.FollowBootstrapRoom {
			res.Notes = append(res.Notes, "follow_bootstrap_room is false, so a decode asks /query_dp_ranks for each room's DP rank, and this server does not answer it as SGLang does")
		}
	}
	return nil
}

func firstLine(b []byte) string {
	s, _, _ := strings.Cut(strings.TrimSpace(string(b)), "\n")
	if len(s) > 200 {
		s = s[:200] + "…"
	}
	return s
}

// jsonFields reads a JSON object's fields by name, with errors that name
// the field ("PrefillServerInfo.attn_tp_size: want an integer, got string").
type jsonFields struct {
	typ string
	m   map[string]any
	err error
}

func readJSONObject(typ string, b []byte) (*jsonFields, error) {
	d := json.NewDecoder(bytes.NewReader(b))
	d.UseNumber()
	var v any
	if err := d.Decode(&v); err != nil {
		return nil, fmt.Errorf("%s: not JSON: %v", typ, err)
	}
	if d.More() {
		return nil, fmt.Errorf("%s: data after the JSON value", typ)
	}
	m, ok := v.(map[string]any)
	if !ok {
		return nil, fmt.Errorf("%s: want a JSON object, got %s", typ, jsonType(v))
	}
	return &jsonFields{typ: typ, m: m}, nil
}

func jsonType(v any) string {
	switch v.(type) {
	case nil:
		return "null"
	case bool:
		return "bool"
	case json.Number:
		return "number"
	case string:
		return "string"
	case []any:
		return "array"
	}
	return "object"
}

func (f *jsonFields) fail(name, format string, a ...any) {
	if f.err == nil {
		f.err = fmt.Errorf("%s.%s: %s", f.typ, name, fmt.Sprintf(format, a...))
	}
}

// value is field name's value; false when it is missing, or null (an
// error unless nullable).
func (f *jsonFields) value(name string, nullable bool) (any, bool) {
	v, ok := f.m[name]
	switch {
	case !ok:
		f.fail(name, "missing")
	case v == nil && !nullable:
		f.fail(name, "null")
	}
	return v, ok && v != nil
}

// int reads an integer in [lo, hi]; nullable fields return nil for null.
func (f *jsonFields) int(name string, lo, hi int64, nullable bool) *int {
	v, ok := f.value(name, nullable)
	if !ok {
		return nil
	}
	n, isNum := v.(json.Number)
	i, err := strconv.ParseInt(string(n), 10, 64)
	if !isNum || err != nil {
		f.fail(name, "want an integer, got %s", jsonType(v))
		return nil
	}
	if i < lo || i > hi {
		f.fail(name, "%d out of range (%d..%d)", i, lo, hi)
		return nil
	}
	x := int(i)
	return &x
}

func (f *jsonFields) str(name string, nullable bool) *string {
	v, ok := f.value(name, nullable)
	if !ok {
		return nil
	}
	s, isStr := v.(string)
	if !isStr {
		f.fail(name, "want a string, got %s", jsonType(v))
		return nil
	}
	return &s
}

func (f *jsonFields) bool(name string) bool {
	v, ok := f.m[name]
	if !ok {
		f.fail(name, "missing")
		return false
	}
	b, isBool := v.(bool)
	if !isBool {
		f.fail(name, "want a bool, got %s", jsonType(v))
	}
	return b
}

func deref(p *int) int {
	if p == nil {
		return 0
	}
	return *p
}

// ReadPrefillServerInfo checks every field of a PrefillServerInfo reply.
// The sizes must be at least 1 (a decode divides by them).
func ReadPrefillServerInfo(b []byte) (*SGLangPrefillInfo, error) {
	f, err := readJSONObject("PrefillServerInfo", b)
	if err != nil {
		return nil, err
	}
	info := &SGLangPrefillInfo{AttnTPSize: deref(f.int("attn_tp_size", 1, 1<<16, false)),
		AttnCPSize: deref(f.int("attn_cp_size", 1, 1<<16, false)), DPSize: deref(f.int("dp_size", 1, 1<<16, false)),
		PPSize: deref(f.int("pp_size", 1, 1<<16, false)), PageSize: f.int("page_size", 1, 1<<20, true),
		KVCacheDType: f.str("kv_cache_dtype", true), FollowBootstrapRoom: f.bool("follow_bootstrap_room")}
	// Newer fields: a server from before them leaves them out.
	if _, ok := f.m["enable_dsa_cache_layer_split"]; ok {
		info.EnableDSACacheLayerSplit = f.bool("enable_dsa_cache_layer_split")
	}
	if _, ok := f.m["prefill_http_port"]; ok {
		info.PrefillHTTPPort = f.int("prefill_http_port", 1, 65535, true)
	}
	return info, f.err
}

// ReadPrefillRankInfo checks a PrefillRankInfo reply.
func ReadPrefillRankInfo(b []byte) (ip string, port int, err error) {
	f, err := readJSONObject("PrefillRankInfo", b)
	if err != nil {
		return "", 0, err
	}
	s := f.str("rank_ip", false)
	p := f.int("rank_port", 1, 65535, false)
	if f.err != nil {
		return "", 0, f.err
	}
	if *s == "" {
		return "", 0, fmt.Errorf("PrefillRankInfo.rank_ip: empty")
	}
	return *s, *p, nil
}
