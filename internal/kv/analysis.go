package kv

import (
	"fmt"
	"strings"
)

// Link is a transfer path with a nominal one-direction line rate.
type Link struct {
	Name string  `json:"name"`
	Gbps float64 `json:"gbps"` // gigabits per second, one direction
}

// BytesPerSecond converts the line rate to decimal bytes per second.
func (l Link) BytesPerSecond() float64 { return l.Gbps * 1e9 / 8 }

// LinkPresets are the paths users compare against, at line rate: IB HDR and
// NDR per port, 100 GbE, PCIe Gen5 x16 (32 GT/s x 16 lanes, 128b/130b),
// and NVLink 4 (H100: 900 GB/s both directions, 450 GB/s each way).
var LinkPresets = []Link{
	{Name: "IB HDR 200G", Gbps: 200},
	{Name: "IB NDR 400G", Gbps: 400},
	{Name: "100GbE", Gbps: 100},
	{Name: "PCIe5 x16", Gbps: 504},
	{Name: "NVLink4", Gbps: 3600},
}

// Estimate is the time one request's cache takes on a link at line rate.
type Estimate struct {
	Link    string  `json:"link"`
	Gbps    float64 `json:"gbps"`
	Seconds float64 `json:"seconds"`
}

// Analysis is everything `nixlctl kv layout` reports for one token count.
// "Per rank" figures are for the rank with the most layers; transfers of
// different ranks run in parallel, each over its own link.
type Analysis struct {
	Model          string     `json:"model"`
	ModelSource    string     `json:"model_source"`
	Tokens         int        `json:"tokens"`
	KVDType        DType      `json:"kv_dtype"`
	BlockSize      int        `json:"block_size"`
	Layout         AttnLayout `json:"layout"`
	KVCacheLayout  CacheOrder `json:"kv_cache_layout"`
	TP             int        `json:"tp"`
	PP             int        `json:"pp"`
	MLA            bool       `json:"mla"`
	SlidingWindow  int        `json:"sliding_window,omitempty"`
	SlidingLayers  int        `json:"sliding_layers,omitempty"`
	HeadsPerRank   int        `json:"kv_heads_per_rank"`
	HeadReplicas   int        `json:"kv_head_replicas"`
	LayersPerStage []int      `json:"layers_per_stage"`

	// BytesPerToken is the whole model's cache for one token, each head
	// counted once; BytesPerTokenAllRanks adds the copies tensor-parallel
	// ranks keep of replicated heads and MLA latents.
	BytesPerToken         int64 `json:"bytes_per_token"`
	BytesPerTokenPerRank  int64 `json:"bytes_per_token_per_rank"`
	BytesPerTokenAllRanks int64 `json:"bytes_per_token_all_ranks"`

	// BytesPerRequest counts whole blocks of the whole model (each head
	// once); per rank is what one rank moves; all ranks is what crosses the
	// wire when every decode rank reads its prefill twin.
	BytesPerRequest         int64 `json:"bytes_per_request"`
	BytesPerRequestPerRank  int64 `json:"bytes_per_request_per_rank"`
	BytesPerRequestAllRanks int64 `json:"bytes_per_request_all_ranks"`

	BlocksPerRequest        int `json:"blocks_per_request"`
	SlidingBlocksPerRequest int `json:"sliding_blocks_per_request,omitempty"`
	RegionsPerRank          int `json:"regions_per_rank"`
	// DescriptorsPerRequest is one rank's descriptor count for the request
	// (what vLLM's nixl_num_descriptors records per transfer).
	DescriptorsPerRequest         int   `json:"descriptors_per_request"`
	DescriptorsPerRequestAllRanks int   `json:"descriptors_per_request_all_ranks"`
	BytesPerDescriptor            int64 `json:"bytes_per_descriptor"`
	BytesPerBlockPerRank          int64 `json:"bytes_per_block_per_rank"`

	Estimates []Estimate `json:"transfer_estimates"`
	Hetero    *Hetero    `json:"hetero_tp,omitempty"`
}

// Hetero describes a prefill/decode pair with different TP sizes.
type Hetero struct {
	PrefillTP int          `json:"prefill_tp"`
	DecodeTP  int          `json:"decode_tp"`
	Ranks     []HeteroRank `json:"decode_ranks"`
	Consumers []int        `json:"consumers_per_prefill_rank"`
}

// HeteroRank is one decode rank's share of a request.
type HeteroRank struct {
	Rank                  int    `json:"rank"`
	Heads                 string `json:"heads"`
	Sources               []int  `json:"prefill_sources"`
	NotifyOnly            []int  `json:"notify_only,omitempty"`
	DescriptorsPerRequest int    `json:"descriptors_per_request"`
	BytesPerDescriptor    int64  `json:"bytes_per_descriptor"`
	BytesPerRequest       int64  `json:"bytes_per_request"`
}

// Analyze sizes a request of `tokens` tokens. Extra links are estimated
// after the presets. If decodeTP > 0 and differs from spec.TP, spec.TP is
// taken as the prefill's and the hetero section describes the decode's
// reads; per-rank figures are then the decode's.
func Analyze(spec Spec, tokens int, decodeTP int, extra ...Link) (Analysis, error) {
	spec, err := spec.Normalize()
	if err != nil {
		return Analysis{}, err
	}
	if tokens <= 0 || tokens > MaxTokens {
		return Analysis{}, fmt.Errorf("tokens must be between 1 and %d (got %d)", MaxTokens, tokens)
	}
	prefill := spec
	var plan *TransferPlan
	if decodeTP > 0 && decodeTP != spec.TP {
		d := spec
		d.TP = decodeTP
		p, err := Plan(prefill, d)
		if err != nil {
			return Analysis{}, err
		}
		plan = &p
		spec = d
	}
	stage := spec.LargestStage()
	rank := spec.Rank(0, stage)
	rr := spec.RankRequest(rank, tokens)
	counts := stageLayerCounts(spec.Model.NumLayers, spec.PP)

	a := Analysis{
		Model: spec.Model.Name, ModelSource: spec.Model.Source, Tokens: tokens,
		KVDType: spec.DType, BlockSize: spec.BlockSize, Layout: spec.Layout, KVCacheLayout: spec.Order,
		TP: spec.TP, PP: spec.PP, MLA: spec.Model.IsMLA(),
		SlidingWindow: spec.Model.SlidingWindow, SlidingLayers: spec.Model.NumSlidingLayers(),
		HeadsPerRank: rank.Heads.Len(), HeadReplicas: spec.HeadReplicas(), LayersPerStage: counts,
		BytesPerToken:          spec.Model.BytesPerToken(spec.DType),
		BytesPerTokenPerRank:   rank.BytesPerToken,
		BytesPerRequest:        spec.RequestBytes(tokens),
		BytesPerRequestPerRank: rr.Bytes,
		BlocksPerRequest:       spec.BlocksFor(FullAttention, tokens),
		RegionsPerRank:         len(rank.Regions),
		DescriptorsPerRequest:  rr.Descriptors,
		BytesPerBlockPerRank:   spec.BlockBytes(rank.Heads),
	}
	if a.SlidingLayers > 0 {
		a.SlidingBlocksPerRequest = spec.BlocksFor(SlidingAttention, tokens)
	}
	a.BytesPerDescriptor = a.BytesPerBlockPerRank
	for pp := 0; pp < spec.PP; pp++ {
		for tp := 0; tp < spec.TP; tp++ {
			r := spec.Rank(tp, pp)
			a.BytesPerTokenAllRanks += r.BytesPerToken
			q := spec.RankRequest(r, tokens)
			a.BytesPerRequestAllRanks += q.Bytes
			a.DescriptorsPerRequestAllRanks += q.Descriptors
		}
	}
	if plan != nil {
		h := &Hetero{PrefillTP: plan.PrefillTP, DecodeTP: plan.DecodeTP, Consumers: plan.Consumers}
		a.DescriptorsPerRequest, a.DescriptorsPerRequestAllRanks = 0, 0
		a.BytesPerRequestAllRanks = 0
		for i, dr := range plan.Decode {
			blocks := rr.Descriptors // blocks summed over the rank's regions
			hr := HeteroRank{Rank: dr.Rank, Heads: headsLabel(spec, dr.Heads), NotifyOnly: dr.NotifyOnly,
				DescriptorsPerRequest: blocks * dr.DescriptorsPerBlock(),
				BytesPerRequest:       int64(blocks) * dr.BytesPerBlock()}
			for _, rd := range dr.Reads {
				hr.Sources = append(hr.Sources, rd.PrefillRank)
			}
			if n := dr.DescriptorsPerBlock(); n > 0 {
				hr.BytesPerDescriptor = dr.BytesPerBlock() / int64(n)
			}
			h.Ranks = append(h.Ranks, hr)
			a.DescriptorsPerRequestAllRanks += hr.DescriptorsPerRequest * spec.PP
			a.BytesPerRequestAllRanks += hr.BytesPerRequest * int64(spec.PP)
			if i == 0 {
				a.DescriptorsPerRequest = hr.DescriptorsPerRequest
				a.BytesPerDescriptor = hr.BytesPerDescriptor
				a.BytesPerRequestPerRank = hr.BytesPerRequest
			}
		}
		a.Hetero = h
	}
	for _, l := range append(append([]Link(nil), LinkPresets...), extra...) {
		a.Estimates = append(a.Estimates, Estimate{Link: l.Name, Gbps: l.Gbps,
			Seconds: float64(a.BytesPerRequestPerRank) / l.BytesPerSecond()})
	}
	return a, nil
}

func headsLabel(s Spec, h HeadRange) string {
	if s.Model.IsMLA() {
		return "latent"
	}
	if h.Len() == 1 {
		return fmt.Sprintf("%d", h.Start)
	}
	return fmt.Sprintf("%d-%d", h.Start, h.End-1)
}

// ParseTokens parses "4096" or a comma-separated sweep "1024,4096,8k,128k".
func ParseTokens(s string) ([]int, error) {
	var out []int
	for _, f := range strings.Split(s, ",") {
		f = strings.TrimSpace(f)
		if f == "" {
			// "4096," or "1k,,4k": a stray comma, not a sweep's point.
			return nil, fmt.Errorf("%q: an empty item in the list (a stray comma?)", s)
		}
		orig := f
		mult := 1
		switch {
		case strings.HasSuffix(f, "k") || strings.HasSuffix(f, "K"):
			mult, f = 1024, f[:len(f)-1]
		case strings.HasSuffix(f, "m") || strings.HasSuffix(f, "M"):
			mult, f = 1024*1024, f[:len(f)-1]
		}
		var n int
		if _, err := fmt.Sscanf(f, "%d", &n); err != nil || fmt.Sprint(n) != f {
			return nil, fmt.Errorf("tokens: %q is not a whole number", f)
		}
		// Checked before multiplying: 18014398509481985k wraps to 1024.
		if n <= 0 || n > MaxTokens/mult {
			return nil, fmt.Errorf("tokens must be between 1 and %d (got %s)", MaxTokens, orig)
		}
		n *= mult
		out = append(out, n)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("tokens: no value given")
	}
	return out, nil
}
