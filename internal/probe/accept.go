package probe

import (
	"encoding/json"
	"fmt"
	"strings"

	"github.com/nixlctl/nixlctl/internal/kv"
	"github.com/nixlctl/nixlctl/internal/sidechannel"
)

// PrefillFacts is what the handshakes revealed about a prefill engine,
// the input of Accept alongside the decode a user has in mind.
type PrefillFacts struct {
	// TP and PP are 0 when neither the metadata nor the user said.
	TP, PP int
	// TPLowerBound marks a TP inferred from block_len when every rank
	// holds one replicated head: the engine may run at any multiple.
	TPLowerBound bool
	BlockSize    int    // kernel block size, tokens
	Layout       string // kv_cache_layout: HND or NHD
	AttnBackend  string
	CompatHash   string
	Regions      int // on Ranks[0]
	Ranks        []RankLens
}

// RankLens is one handshaken rank's per-region block lengths.
type RankLens struct {
	PP, TP    int
	BlockLens []int64
}

// DecodeSpec is the decode a user asks about. Zero values mean "as the
// prefill" (TP, block size) or vLLM's default (HND, the model's dtype).
type DecodeSpec struct {
	Model     *kv.Model // nil: the checks that need heads and sizes are not made
	DType     kv.DType
	TP        int
	BlockSize int
	Layout    string
	// WantHash is the decode's compatibility hash ("" unchecked), HashFrom
	// where it came from; Factors the factors behind it, when given.
	WantHash, HashFrom string
	Factors            map[string]any
}

// Check is one rule vLLM applies when a decode handshakes with a prefill.
type Check struct {
	Check   string `json:"check"`
	Prefill string `json:"prefill"`
	Decode  string `json:"decode"`
	// OK is nil when the handshake and the flags cannot tell.
	OK  *bool  `json:"ok"`
	Why string `json:"why"`
}

// Acceptance is the verdict on a decode spec.
type Acceptance struct {
	Accepted bool    `json:"accepted"`
	Verdict  string  `json:"verdict"`
	Checks   []Check `json:"checks"`
}

// Accept says whether a vLLM decode built as d would be accepted by the
// prefill the handshakes describe, and if not which rule refuses it. It
// follows vLLM's NIXL worker (connector version 12): the compatibility
// hash first (base_worker.py _nixl_handshake), then the rules of
// _validate_remote_agent_handshake (nixl/base_worker.py @00bd5131), each
// cited where it is checked. What nixlctl does not model (Mamba state,
// enable_permute_local_kv, the CPU_ATTN post-process) is left as upstream
// leaves it by default.
func Accept(p PrefillFacts, d DecodeSpec) Acceptance {
	if d.TP == 0 {
		d.TP = p.TP
	}
	if d.BlockSize == 0 {
		d.BlockSize = p.BlockSize
	}
	if d.Layout == "" {
		d.Layout = string(kv.HND)
	}
	if d.Model != nil && d.DType == "" {
		d.DType = d.Model.DType
	}
	var a Acceptance
	add := func(name, pv, dv string, ok *bool, why string, args ...any) {
		a.Checks = append(a.Checks, Check{Check: name, Prefill: pv, Decode: dv, OK: ok, Why: fmt.Sprintf(why, args...)})
	}
	yes, no := ptr(true), ptr(false)
	mla := d.Model != nil && d.Model.IsMLA()
	ptp := tpString(p)

	// 1. The compatibility hash: a decode compares it before anything else.
	switch {
	case d.WantHash == "":
		add("compatibility hash", sidechannel.ShortHash(p.CompatHash), "not given", nil, "give --compat-factors or --compat-hash to check it")
	case strings.EqualFold(d.WantHash, p.CompatHash):
		add("compatibility hash", sidechannel.ShortHash(p.CompatHash), sidechannel.ShortHash(d.WantHash), yes, "equal (%s)", d.HashFrom)
	default:
		add("compatibility hash", sidechannel.ShortHash(p.CompatHash), sidechannel.ShortHash(d.WantHash), no, "%s", hashDiagnosis(p, d))
	}

	// 2. TP sizes must divide one another; tp_ratio says who reads whom.
	knownTP := p.TP > 0 && d.TP > 0
	switch {
	case !knownTP:
		add("tp ratio", ptp, tpOrUnknown(d.TP), nil, "the prefill's TP is unknown: nixlctl's engines say it, a vLLM's must be given (--tp) or inferred (--model)")
	case p.TP%d.TP != 0 && d.TP%p.TP != 0:
		add("tp ratio", ptp, fmt.Sprint(d.TP), no, "prefill tp %d and decode tp %d do not divide one another", p.TP, d.TP)
	case d.TP >= p.TP:
		add("tp ratio", ptp, fmt.Sprint(d.TP), yes, "tp_ratio %d: each decode rank reads from prefill rank tp_rank/%d", d.TP/p.TP, d.TP/p.TP)
	default:
		add("tp ratio", ptp, fmt.Sprint(d.TP), yes, "tp_ratio -%d: each decode rank reads from %d prefill ranks", p.TP/d.TP, p.TP/d.TP)
	}
	divides := knownTP && (p.TP%d.TP == 0 || d.TP%p.TP == 0)

	// 3. vLLM asserts against reading replicated KV heads from several
	// prefill ranks: _validate_remote_agent_handshake, for non-MLA,
	// non-Mamba models, `assert not (tp_ratio < 0 and
	// is_kv_replicated(remote))`, where the remote replicates when its
	// tp_size > total_num_kv_heads.
	switch {
	case !divides:
		add("replicated kv heads", ptp, tpOrUnknown(d.TP), nil, "needs both TP sizes (see tp ratio)")
	case d.Model == nil:
		add("replicated kv heads", ptp, fmt.Sprint(d.TP), nil, "needs the model's KV heads: give --model")
	case mla:
		add("replicated kv heads", ptp, fmt.Sprint(d.TP), yes, "MLA: one latent per rank, read whole from one prefill rank")
	case p.TP > d.TP && p.TP > d.Model.NumKVHeads:
		add("replicated kv heads", fmt.Sprintf("tp %d > %d kv heads", p.TP, d.Model.NumKVHeads), fmt.Sprint(d.TP), no,
			"vLLM refuses P_tp > D_tp when the prefill replicates KV heads: %q", kv.VLLMTPRefusal)
	case p.TP > d.TP && p.TPLowerBound:
		add("replicated kv heads", ptp, fmt.Sprint(d.TP), nil,
			"the prefill holds one head per rank, so its TP may be above the %d kv heads, which vLLM refuses with P_tp > D_tp; give --tp", d.Model.NumKVHeads)
	default:
		add("replicated kv heads", ptp, fmt.Sprint(d.TP), yes, "no prefill rank replicates a head the decode reads from several ranks")
	}

	// 4. Heterogeneous TP moves head slices: a decode with more ranks
	// reads a slice of each prefill block, one with fewer lands each
	// prefill rank's heads in a slice of its own block. A slice is one
	// contiguous range only when heads are outermost in a block (HND).
	// _validate_remote_agent_handshake raises "Heterogeneous TP
	// head-dimension splitting requires contiguous heads" only when
	// abs(tp_ratio) != 1, not MLA, the remote does not replicate its KV
	// heads (tp_size > total_num_kv_heads: its blocks hold whole heads, so
	// nothing is split) and the decode's own layout is not HND (the
	// layouts are equal by rule 7).
	split := divides && d.TP != p.TP && !mla
	switch {
	case !divides:
		add("head split layout", p.Layout, d.Layout, nil, "needs both TP sizes (see tp ratio)")
	case !split:
		add("head split layout", p.Layout, d.Layout, yes, "no head split (%s): whole blocks move", cond(mla, "MLA", "equal TP"))
	case d.Model == nil:
		add("head split layout", p.Layout, d.Layout, nil, "needs the model (MLA is never split, replicated heads are not): give --model")
	case p.TP > d.Model.NumKVHeads:
		add("head split layout", p.Layout, d.Layout, yes, "the prefill replicates KV heads (tp %d > %d kv heads): no head split, any layout", p.TP, d.Model.NumKVHeads)
	case p.TP > d.TP && p.TPLowerBound:
		add("head split layout", p.Layout, d.Layout, nil, "the prefill's TP may be above the %d kv heads (then nothing is split); give --tp", d.Model.NumKVHeads)
	case d.Layout != string(kv.HND):
		add("head split layout", p.Layout, d.Layout, no, "prefill tp %d and decode tp %d split blocks by heads, which needs HND (heads contiguous in a block); vLLM: \"Use HND layout on the prefill side\"", p.TP, d.TP)
	default:
		add("head split layout", p.Layout, d.Layout, yes, "HND: each head slice is one contiguous range")
	}

	// 5. Block-size ratio: the decode maps each of its blocks onto whole
	// prefill blocks; the other way round is not supported.
	bsr := 0
	switch {
	case p.BlockSize <= 0 || d.BlockSize <= 0:
		add("block size", fmt.Sprint(p.BlockSize), fmt.Sprint(d.BlockSize), nil, "unknown block size")
	case p.BlockSize > d.BlockSize:
		add("block size", fmt.Sprint(p.BlockSize), fmt.Sprint(d.BlockSize), no, "prefill block %d larger than decode block %d is not supported", p.BlockSize, d.BlockSize)
	case d.BlockSize%p.BlockSize != 0:
		add("block size", fmt.Sprint(p.BlockSize), fmt.Sprint(d.BlockSize), no, "decode block %d is not a multiple of prefill block %d", d.BlockSize, p.BlockSize)
	case d.BlockSize > p.BlockSize && knownTP && p.TP > d.TP && !mla && d.Model != nil:
		// The per-region block_len validation's P TP > D TP branch for a
		// split (not replicated) region asserts block_size_ratio == 1.
		bsr = d.BlockSize / p.BlockSize
		add("block size", fmt.Sprint(p.BlockSize), fmt.Sprint(d.BlockSize), no,
			"block_size_ratio %d with prefill tp %d > decode tp %d: vLLM asserts \"Different local/remote block sizes are not supported when P TP > D TP\"", bsr, p.TP, d.TP)
	case d.BlockSize > p.BlockSize && hmaRequired(d) == nil:
		bsr = d.BlockSize / p.BlockSize
		add("block size", fmt.Sprint(p.BlockSize), fmt.Sprint(d.BlockSize), nil,
			"block_size_ratio %d is refused only if the hybrid allocator is required (on, and a layer that is not full attention): give --model and --compat-factors (is_hma_enabled)", bsr)
	case d.BlockSize > p.BlockSize && *hmaRequired(d):
		bsr = d.BlockSize / p.BlockSize
		add("block size", fmt.Sprint(p.BlockSize), fmt.Sprint(d.BlockSize), no,
			"block_size_ratio %d is not supported when the hybrid allocator is required (is_hma_enabled, and %s has sliding-window layers): vLLM asserts \"HMA does not support different remote block size yet\"", bsr, d.Model.Name)
	default:
		bsr = d.BlockSize / p.BlockSize
		add("block size", fmt.Sprint(p.BlockSize), fmt.Sprint(d.BlockSize), yes, "block_size_ratio %d%s", bsr, cond(bsr > 1, ": each decode block takes that many prefill blocks", ""))
	}

	// 6. The block lengths vLLM validates at handshake time, region by
	// region, against what the decode's own cache implies.
	a.Checks = append(a.Checks, blockLenCheck(p, d, divides, bsr))

	// 7. Blocks are read byte for byte: the token/head order must agree.
	// _validate_remote_agent_handshake compares kv_cache_layout for
	// non-MLA models only (MLA has no head dimension), and raises unless
	// enable_permute_local_kv (off by default) handles a HND prefill for an
	// NHD decode.
	switch {
	case mla:
		add("kv cache layout", cond(p.Layout == "", "?", p.Layout), d.Layout, yes, "MLA: a latent has no heads to order, vLLM does not compare layouts")
	case p.Layout == "":
		add("kv cache layout", "?", d.Layout, nil, "the prefill did not say")
	case p.Layout != d.Layout:
		add("kv cache layout", p.Layout, d.Layout, no, "blocks are read byte for byte: a %s block in a %s cache mixes tokens and heads", p.Layout, d.Layout)
	default:
		add("kv cache layout", p.Layout, d.Layout, yes, "same order of tokens and heads")
	}

	a.Accepted = true
	var unknown []string
	first := ""
	for _, c := range a.Checks {
		switch {
		case c.OK == nil:
			unknown = append(unknown, c.Check)
		case !*c.OK && first == "":
			a.Accepted = false
			first = c.Check + ": " + c.Why
		}
	}
	who := fmt.Sprintf("a decode with tp=%s, block %d, %s", tpOrUnknown(d.TP), d.BlockSize, d.Layout)
	if a.Accepted {
		a.Verdict = who + " would be accepted"
		if len(unknown) > 0 {
			a.Verdict += " (not checked: " + strings.Join(unknown, ", ") + ")"
		}
	} else {
		a.Verdict = who + " would be refused: " + first
	}
	return a
}

// blockLenCheck mirrors vLLM's runtime validation: replicated regions
// (MLA) hold local_len / bsr bytes a block on the prefill, split regions
// local_len x remote_heads / local_heads / bsr, where a side's heads are
// max(1, kv_heads / tp); and both sides have as many regions.
func blockLenCheck(p PrefillFacts, d DecodeSpec, divides bool, bsr int) Check {
	c := Check{Check: "block_len"}
	if len(p.Ranks) > 0 {
		c.Prefill = runs(p.Ranks[0].BlockLens, " B")
	}
	switch {
	case d.Model == nil:
		c.Why = "needs the model's heads, head size and dtype: give --model"
		return c
	case !divides || bsr == 0:
		c.Why = "needs valid TP sizes and block sizes (see above)"
		return c
	case p.PP == 0:
		c.Why = "the prefill's PP size is unknown, so its layers per rank are too: give --pp"
		return c
	case p.PP > d.Model.NumLayers:
		c.OK = ptr(false)
		c.Why = fmt.Sprintf("the prefill's pp %d is more than %s's %d layers: another model", p.PP, d.Model.Name, d.Model.NumLayers)
		return c
	}
	m := *d.Model
	stage := kv.Spec{Model: m, TP: p.TP, PP: p.PP}.StageLayers(firstPP(p))
	layout, ok := attnLayoutFor(m, p.AttnBackend, p.Regions, len(stage))
	if !ok && m.NumSlidingLayers() > 0 {
		// vLLM's hybrid allocator may share one tensor among layers of
		// different kinds, so the region count of a hybrid model is not
		// one or two a layer; what it should be is not known here.
		c.Why = fmt.Sprintf("%s mixes sliding-window and full layers: its %d regions on pp rank %d cannot be matched to layers", m.Name, p.Regions, firstPP(p))
		return c
	}
	if !ok {
		c.OK = ptr(false)
		c.Why = fmt.Sprintf("the prefill registers %d regions on pp rank %d; %s has %d layers there at pp %d, so a decode registers %d or %d: vLLM refuses a different number of regions (num_hidden_layers or the model differ)",
			p.Regions, firstPP(p), m.Name, len(stage), p.PP, len(stage), 2*len(stage))
		return c
	}
	ds := kv.Spec{Model: m, DType: d.DType, BlockSize: d.BlockSize, Layout: layout, TP: d.TP, PP: p.PP}
	localLen := ds.BlockBytes(ds.Heads(d.TP, 0))
	c.Decode = fmt.Sprintf("%d B", localLen)
	want := localLen / int64(bsr)
	if !m.IsMLA() {
		remote, local := max(1, m.NumKVHeads/p.TP), max(1, m.NumKVHeads/d.TP)
		want = localLen * int64(remote) / int64(local) / int64(bsr)
	}
	for _, r := range p.Ranks {
		for i, l := range r.BlockLens {
			if l != want {
				c.OK = ptr(false)
				c.Why = fmt.Sprintf("prefill rank (pp %d, tp %d) region %d holds %d B a block; a decode with %s, %s, tp %d, block %d expects %d B: vLLM's handshake validation fails (model, kv heads, head size or kv dtype differ)",
					r.PP, r.TP, i, l, m.Name, ds.DType, d.TP, d.BlockSize, want)
				return c
			}
		}
	}
	c.OK = ptr(true)
	c.Why = fmt.Sprintf("every region of %d rank(s) holds the %d B a block the decode expects (%s, %s)", len(p.Ranks), want, layout, ds.DType)
	return c
}

// attnLayoutFor tells from the number of regions per layer whether the
// engine keeps K and V apart (FlashAttention: two) or together
// (FlashInfer, MLA: one); the attention backend's name, where it is one
// of those two, must agree.
func attnLayoutFor(m kv.Model, backend string, regions, layers int) (kv.AttnLayout, bool) {
	fa, fi := strings.EqualFold(backend, "FLASH_ATTN"), strings.EqualFold(backend, "FLASHINFER")
	switch {
	case layers == 0:
		return "", false
	case regions == layers && (m.IsMLA() || !fa):
		return kv.FlashInfer, true
	case regions == 2*layers && !m.IsMLA() && !fi:
		return kv.FlashAttn, true
	}
	return "", false
}

// hashDiagnosis names the factor a differing hash most likely comes
// from, out of what the metadata reveals, and says so when it cannot.
func hashDiagnosis(p PrefillFacts, d DecodeSpec) string {
	var why []string
	if b, ok := d.Factors["attn_backend_name"].(string); ok && p.AttnBackend != "" && b != p.AttnBackend {
		why = append(why, fmt.Sprintf("attn_backend_name differs: the prefill runs %s, the decode's factors say %s", p.AttnBackend, b))
	}
	if d.Model != nil && p.TP > 0 && p.PP > 0 && p.PP <= d.Model.NumLayers && len(p.Ranks) > 0 && len(p.Ranks[0].BlockLens) > 0 {
		m := *d.Model
		if layout, ok := attnLayoutFor(m, p.AttnBackend, p.Regions, len(kv.Spec{Model: m, TP: p.TP, PP: p.PP}.StageLayers(firstPP(p)))); ok {
			s := kv.Spec{Model: m, DType: d.DType, BlockSize: p.BlockSize, Layout: layout, TP: p.TP, PP: p.PP}
			if want, got := s.BlockBytes(s.Heads(p.TP, p.Ranks[0].TP)), p.Ranks[0].BlockLens[0]; want != got {
				why = append(why, fmt.Sprintf("the prefill's block_len %d B is not %s's %d B at tp %d, block %d, %s: num_kv_heads, head_size or cache_dtype differ",
					got, m.Name, want, p.TP, p.BlockSize, s.DType))
			}
		} else if m.NumSlidingLayers() == 0 {
			why = append(why, fmt.Sprintf("the prefill's %d regions do not fit %s's %d layers: num_hidden_layers or the model differ", p.Regions, m.Name, m.NumLayers))
		}
	}
	if w := factorsDiagnosis(p, d.Factors); w != "" {
		why = append(why, w)
	}
	if len(why) > 0 {
		return "hashes differ; likely: " + strings.Join(why, "; ")
	}
	if d.Model == nil && d.Factors == nil {
		return "hashes differ, and the hash alone cannot tell which factor: give --compat-factors (or --model) to compare them with what the metadata shows"
	}
	return "hashes differ, and the hash alone cannot tell which factor: what the metadata shows (attention backend, block lengths) agrees; vllm_version, the model name, is_hma_enabled, speculative_config and transfer_mode are not in the handshake"
}

// factorsDiagnosis compares the decode's own factors with the prefill's
// block lengths: a rank holds max(1, num_kv_heads / tp) heads of
// head_size values of the cache dtype per token (MLA: one latent, which
// vLLM hashes as one KV head), so a block_len that is neither that nor
// twice it (K|V together) names num_kv_heads, head_size or the dtype.
func factorsDiagnosis(p PrefillFacts, f map[string]any) string {
	heads, ok1 := factorInt(f, "num_kv_heads")
	size, ok2 := factorInt(f, "head_size")
	if !ok1 || !ok2 || heads < 1 || size < 1 || p.TP == 0 || p.BlockSize <= 0 || len(p.Ranks) == 0 || len(p.Ranks[0].BlockLens) == 0 {
		return ""
	}
	dname, _ := f["cache_dtype"].(string)
	if dname == "" || dname == "auto" {
		dname, _ = f["dtype"].(string)
	}
	dt, err := kv.ParseDType(dname)
	if err != nil {
		return ""
	}
	want := int64(max(1, heads/p.TP)) * int64(size) * int64(dt.Bytes()) * int64(p.BlockSize)
	got := p.Ranks[0].BlockLens[0]
	fa, fi := strings.EqualFold(p.AttnBackend, "FLASH_ATTN"), strings.EqualFold(p.AttnBackend, "FLASHINFER")
	if (got == want && !fi) || (got == 2*want && !fa) {
		return ""
	}
	return fmt.Sprintf("the decode's factors (num_kv_heads %d, head_size %d, %s) give %d B a block at tp %d, block %d; the prefill holds %d B: num_kv_heads, head_size or the cache dtype differ",
		heads, size, dt, want, p.TP, p.BlockSize, got)
}

func factorInt(f map[string]any, name string) (int, bool) {
	switch v := f[name].(type) {
	case json.Number:
		n, err := v.Int64()
		return int(n), err == nil && n == int64(int(n))
	case int:
		return v, true
	case float64:
		return int(v), v == float64(int(v))
	}
	return 0, false
}

// InferTP tells an engine's TP size from rank 0's block_len, for a
// vLLM that does not say it: per-rank KV heads = block_len / (head size x
// dtype x block size, doubled where K and V share a region). One head per
// rank means any TP from the number of KV heads up (atLeast); MLA latents
// are the same at every TP, so they tell nothing.
func InferTP(m kv.Model, dtype kv.DType, blockSize, regions int, attnBackend string, blockLen int64) (tp int, atLeast bool, layout kv.AttnLayout, err error) {
	if dtype == "" {
		dtype = m.DType
	}
	if m.IsMLA() {
		return 0, false, "", fmt.Errorf("%s is MLA: every rank holds the same latent, so block_len does not depend on TP", m.Name)
	}
	if blockSize <= 0 || blockLen <= 0 || dtype.Bytes() == 0 || m.HeadDim <= 0 || m.NumKVHeads <= 0 {
		return 0, false, "", fmt.Errorf("block size %d, block_len %d, dtype %q: nothing to infer from", blockSize, blockLen, dtype)
	}
	perHead := int64(m.HeadDim) * int64(dtype.Bytes()) * int64(blockSize)
	// FlashAttention registers K and V apart (1 head-size a head), FlashInfer
	// K|V in one region (2); the backend's name or more regions than layers
	// rule one out.
	apart, together := -1, -1
	for _, parts := range []int64{1, 2} {
		switch {
		case parts == 2 && (regions > m.NumLayers || strings.EqualFold(attnBackend, "FLASH_ATTN")),
			parts == 1 && strings.EqualFold(attnBackend, "FLASHINFER"),
			blockLen%(perHead*parts) != 0:
			continue
		}
		heads := blockLen / (perHead * parts)
		if heads >= 1 && heads <= int64(m.NumKVHeads) && int64(m.NumKVHeads)%heads == 0 {
			if parts == 1 {
				apart = m.NumKVHeads / int(heads)
			} else {
				together = m.NumKVHeads / int(heads)
			}
		}
	}
	switch {
	case apart < 0 && together < 0:
		return 0, false, "", fmt.Errorf("block_len %d B is not a whole number of %s's KV heads (%d B a head at block %d, %s): another model or kv dtype", blockLen, m.Name, perHead, blockSize, dtype)
	case apart > 0 && together > 0:
		return 0, false, "", fmt.Errorf("block_len %d B fits %s at tp %d (K and V apart) and at tp %d (K|V together): give --tp", blockLen, m.Name, apart, together)
	}
	tp, layout = apart, kv.FlashAttn
	if together > 0 {
		tp, layout = together, kv.FlashInfer
	}
	return tp, tp == m.NumKVHeads, layout, nil
}

// firstPP is the pipeline stage of the first rank handshaken, whose
// regions PrefillFacts.Regions counts; PP must be known and hold it.
func firstPP(p PrefillFacts) int {
	if len(p.Ranks) == 0 || p.Ranks[0].PP >= p.PP {
		return 0
	}
	return p.Ranks[0].PP
}

// hmaRequired is vLLM's _is_hma_required (nixl/base_scheduler.py
// __init__ @0050936b, the worker's likewise): the hybrid allocator is on
// (not disable_hybrid_kv_cache_manager, hashed as is_hma_enabled) and a
// KV-cache group is not full attention. nil: unknown (no factors saying
// whether it is on, for a model with other layers, or no model).
func hmaRequired(d DecodeSpec) *bool {
	on, known := d.Factors["is_hma_enabled"].(bool)
	switch {
	case known && !on:
		return ptr(false)
	case d.Model == nil:
		return nil
	case d.Model.NumSlidingLayers() == 0:
		return ptr(false) // every group is full attention
	case !known:
		return nil
	}
	return ptr(true)
}

func tpString(p PrefillFacts) string {
	switch {
	case p.TP == 0:
		return "unknown"
	case p.TPLowerBound:
		return fmt.Sprintf("≥%d", p.TP)
	}
	return fmt.Sprint(p.TP)
}

func tpOrUnknown(tp int) string {
	if tp == 0 {
		return "?"
	}
	return fmt.Sprint(tp)
}

func cond(c bool, a, b string) string {
	if c {
		return a
	}
	return b
}

func ptr[T any](v T) *T { return &v }
