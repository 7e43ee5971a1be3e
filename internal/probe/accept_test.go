package probe

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/nixlctl/nixlctl/internal/kv"
)

func preset(t testing.TB, name string) kv.Model {
	t.Helper()
	m, err := kv.Preset(name)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// prefillOf is what the handshakes of a prefill deployed as s show: each
// rank's block lengths as kv lays them out (the way nixlctl's engines and
// vLLM register them), every TP rank of pp stage 0.
func prefillOf(t testing.TB, s kv.Spec, hash string) PrefillFacts {
	t.Helper()
	s, err := s.Normalize()
	if err != nil {
		t.Fatal(err)
	}
	p := PrefillFacts{TP: s.TP, PP: s.PP, BlockSize: s.BlockSize, Layout: string(s.Order), AttnBackend: "FLASH_ATTN", CompatHash: hash}
	for tp := 0; tp < s.TP; tp++ {
		r := s.Rank(tp, 0)
		var lens []int64
		for _, reg := range r.Regions {
			lens = append(lens, reg.BlockBytes)
		}
		p.Ranks = append(p.Ranks, RankLens{PP: 0, TP: tp, BlockLens: lens})
		p.Regions = len(lens)
	}
	return p
}

func TestAccept(t *testing.T) {
	t.Parallel()
	llama := preset(t, "llama-3.1-8b") // 32 layers, 8 KV heads of 128, bf16
	ds := preset(t, "deepseek-v3")
	gptoss := preset(t, "gpt-oss-20b") // alternating sliding-window layers
	fewerHeads := llama
	fewerHeads.Name, fewerHeads.NumKVHeads = "llama-4-heads", 4
	hashA, hashB := strings.Repeat("a", 64), strings.Repeat("b", 64)
	spec := func(m kv.Model, tp, bs int, order kv.CacheOrder) kv.Spec {
		return kv.Spec{Model: m, TP: tp, BlockSize: bs, Order: order}
	}
	for _, tc := range []struct {
		name    string
		prefill PrefillFacts
		decode  DecodeSpec
		refused string // the first refusing check; "" accepted
		why     string // in that check's why (or, accepted, in the verdict)
	}{
		{"same tp", prefillOf(t, spec(llama, 2, 16, kv.HND), hashA), DecodeSpec{Model: &llama, WantHash: hashA}, "", "a decode with tp=2, block 16, HND would be accepted"},
		{"decode tp defaults to the prefill's", prefillOf(t, spec(llama, 4, 16, kv.HND), hashA), DecodeSpec{Model: &llama}, "", "tp=4, block 16, HND would be accepted (not checked: compatibility hash)"},
		{"head split P2 D4", prefillOf(t, spec(llama, 2, 16, kv.HND), ""), DecodeSpec{Model: &llama, TP: 4}, "", "would be accepted"},
		{"gather P4 D2", prefillOf(t, spec(llama, 4, 16, kv.HND), ""), DecodeSpec{Model: &llama, TP: 2}, "", "would be accepted"},
		{"head split needs HND on the decode", prefillOf(t, spec(llama, 2, 16, kv.HND), ""), DecodeSpec{Model: &llama, TP: 4, Layout: "NHD"}, "head split layout", "needs HND"},
		{"gather needs HND on the prefill", prefillOf(t, spec(llama, 4, 16, kv.NHD), ""), DecodeSpec{Model: &llama, TP: 2, Layout: "NHD"}, "head split layout", "needs HND"},
		{"NHD at equal TP is fine", prefillOf(t, spec(llama, 2, 16, kv.NHD), ""), DecodeSpec{Model: &llama, Layout: "NHD"}, "", "would be accepted"},
		{"layouts differ", prefillOf(t, spec(llama, 2, 16, kv.NHD), ""), DecodeSpec{Model: &llama}, "kv cache layout", "a NHD block in a HND cache"},
		{"tp sizes do not divide", PrefillFacts{TP: 3, PP: 1, BlockSize: 16, Layout: "HND"}, DecodeSpec{Model: &llama, TP: 2}, "tp ratio", "do not divide one another"},
		{"replicated heads P16 D8", prefillOf(t, spec(llama, 16, 16, kv.HND), ""), DecodeSpec{Model: &llama, TP: 8}, "replicated kv heads", kv.VLLMTPRefusal},
		{"replicated heads P16 D32 reads one rank", prefillOf(t, spec(llama, 16, 16, kv.HND), ""), DecodeSpec{Model: &llama, TP: 32}, "", "would be accepted"},
		{"MLA P8 D2 is not refused", prefillOf(t, spec(ds, 8, 64, kv.HND), ""), DecodeSpec{Model: &ds, TP: 2, BlockSize: 64}, "", "would be accepted"},
		{"MLA decode block twice the prefill's", prefillOf(t, spec(ds, 4, 32, kv.HND), ""), DecodeSpec{Model: &ds, TP: 4, BlockSize: 64}, "", "would be accepted"},
		{"decode block 2x", prefillOf(t, spec(llama, 2, 16, kv.HND), ""), DecodeSpec{Model: &llama, BlockSize: 32}, "", "would be accepted"},
		{"decode block 2x with P TP > D TP", prefillOf(t, spec(llama, 4, 16, kv.HND), ""), DecodeSpec{Model: &llama, TP: 2, BlockSize: 32}, "block size", "not supported when P TP > D TP"},
		{"MLA decode block 2x with P TP > D TP", prefillOf(t, spec(ds, 4, 32, kv.HND), ""), DecodeSpec{Model: &ds, TP: 2, BlockSize: 64}, "", "would be accepted"},
		{"prefill block larger", prefillOf(t, spec(llama, 2, 32, kv.HND), ""), DecodeSpec{Model: &llama, BlockSize: 16}, "block size", "prefill block 32 larger than decode block 16 is not supported"},
		{"decode block not a multiple", prefillOf(t, spec(llama, 2, 16, kv.HND), ""), DecodeSpec{Model: &llama, BlockSize: 24}, "block size", "not a multiple"},
		// HMA refuses a block-size ratio only when required: on, and a
		// group that is not full attention (issue 26: llama-3.1-8b, all
		// full attention, was refused).
		{"block ratio with HMA, full attention only", prefillOf(t, spec(llama, 2, 16, kv.HND), ""), DecodeSpec{Model: &llama, BlockSize: 32, Factors: map[string]any{"is_hma_enabled": true}},
			"", "would be accepted"},
		{"block ratio with HMA required", prefillOf(t, spec(gptoss, 1, 16, kv.HND), ""), DecodeSpec{Model: &gptoss, BlockSize: 32, Factors: map[string]any{"is_hma_enabled": true}},
			"block size", "HMA does not support different remote block size yet"},
		{"block ratio, HMA off, sliding layers", prefillOf(t, spec(gptoss, 1, 16, kv.HND), ""), DecodeSpec{Model: &gptoss, BlockSize: 32, Factors: map[string]any{"is_hma_enabled": false}},
			"", "would be accepted"},
		{"block ratio, HMA unknown, sliding layers", prefillOf(t, spec(gptoss, 1, 16, kv.HND), ""), DecodeSpec{Model: &gptoss, BlockSize: 32},
			"", "not checked: compatibility hash, block size"},
		// A prefill that replicates KV heads splits none, so vLLM skips the
		// HND requirement (issue 26: P16 -> D32 NHD was refused).
		{"replicated heads P16 D32 NHD", prefillOf(t, spec(llama, 16, 16, kv.NHD), ""), DecodeSpec{Model: &llama, TP: 32, Layout: "NHD"}, "", "would be accepted"},
		{"MLA layouts are not compared", prefillOf(t, spec(ds, 4, 64, kv.NHD), ""), DecodeSpec{Model: &ds, BlockSize: 64}, "", "would be accepted"},
		{"decode model with fewer heads", prefillOf(t, spec(llama, 2, 16, kv.HND), ""), DecodeSpec{Model: &fewerHeads}, "block_len", "expects 8192 B"},
		{"decode kv dtype fp8", prefillOf(t, spec(llama, 2, 16, kv.HND), ""), DecodeSpec{Model: &llama, DType: kv.FP8}, "block_len", "holds 16384 B a block"},
		{"decode model with other layers", prefillOf(t, spec(llama, 2, 16, kv.HND), ""), DecodeSpec{Model: ptr(preset(t, "qwen3-8b"))}, "block_len", "vLLM refuses a different number of regions"},
		{"hybrid model, regions shared", PrefillFacts{TP: 1, PP: 1, BlockSize: 16, Layout: "HND", AttnBackend: "FLASH_ATTN", Regions: 30,
			Ranks: []RankLens{{BlockLens: []int64{16384}}}}, DecodeSpec{Model: ptr(preset(t, "gpt-oss-20b"))}, "", "would be accepted (not checked: compatibility hash, block_len)"},
		{"hash equal", prefillOf(t, spec(llama, 2, 16, kv.HND), hashA), DecodeSpec{Model: &llama, WantHash: hashA, HashFrom: "--compat-hash"}, "", "would be accepted"},
		{"hash differs: attention backend", prefillOf(t, spec(llama, 2, 16, kv.HND), hashA), DecodeSpec{Model: &llama, WantHash: hashB,
			Factors: map[string]any{"attn_backend_name": "FLASHINFER"}}, "compatibility hash", "attn_backend_name differs: the prefill runs FLASH_ATTN, the decode's factors say FLASHINFER"},
		{"hash differs: cache dtype", prefillOf(t, spec(llama, 2, 16, kv.HND), hashA), DecodeSpec{Model: &llama, DType: kv.FP8, WantHash: hashB},
			"compatibility hash", "num_kv_heads, head_size or cache_dtype differ"},
		{"hash differs: the factors' heads", prefillOf(t, spec(llama, 2, 16, kv.HND), hashA), DecodeSpec{WantHash: hashB,
			Factors: map[string]any{"num_kv_heads": json.Number("4"), "head_size": json.Number("128"), "dtype": "torch.bfloat16", "cache_dtype": "auto"}},
			"compatibility hash", "the decode's factors (num_kv_heads 4, head_size 128, bf16) give 8192 B a block at tp 2, block 16; the prefill holds 16384 B"},
		{"hash differs: the factors' cache dtype", prefillOf(t, spec(llama, 2, 16, kv.HND), hashA), DecodeSpec{WantHash: hashB,
			Factors: map[string]any{"num_kv_heads": json.Number("8"), "head_size": json.Number("128"), "dtype": "torch.bfloat16", "cache_dtype": "fp8"}},
			"compatibility hash", "num_kv_heads, head_size or the cache dtype differ"},
		{"hash differs: the factors fit the blocks", prefillOf(t, spec(llama, 2, 16, kv.HND), hashA), DecodeSpec{WantHash: hashB,
			Factors: map[string]any{"num_kv_heads": json.Number("8"), "head_size": json.Number("128"), "dtype": "torch.bfloat16", "cache_dtype": "auto"}},
			"compatibility hash", "the hash alone cannot tell which factor"},
		{"hash differs: cannot tell", prefillOf(t, spec(llama, 2, 16, kv.HND), hashA), DecodeSpec{Model: &llama, WantHash: hashB,
			Factors: map[string]any{"attn_backend_name": "FLASH_ATTN"}}, "compatibility hash", "the hash alone cannot tell which factor"},
		{"no model: what needs one is not checked", prefillOf(t, spec(llama, 2, 16, kv.HND), ""), DecodeSpec{TP: 4}, "", "not checked: compatibility hash, replicated kv heads, head split layout, block_len"},
		{"prefill TP unknown", PrefillFacts{BlockSize: 16, Layout: "HND"}, DecodeSpec{Model: &llama, TP: 2}, "", "not checked: compatibility hash, tp ratio"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a := Accept(tc.prefill, tc.decode)
			first := ""
			for _, c := range a.Checks {
				if c.OK != nil && !*c.OK {
					first = c.Check
					if !strings.Contains(c.Why, tc.why) {
						t.Errorf("%s: why %q lacks %q", c.Check, c.Why, tc.why)
					}
					break
				}
			}
			if first != tc.refused || a.Accepted != (tc.refused == "") {
				t.Fatalf("refused by %q (accepted %v), want %q\n%s", first, a.Accepted, tc.refused, dumpChecks(a))
			}
			if tc.refused == "" && !strings.Contains(a.Verdict, tc.why) {
				t.Errorf("verdict %q lacks %q", a.Verdict, tc.why)
			}
			if tc.refused != "" && !strings.Contains(a.Verdict, "would be refused: "+tc.refused+": ") {
				t.Errorf("verdict %q does not name %q", a.Verdict, tc.refused)
			}
			if len(a.Checks) != 7 {
				t.Errorf("%d checks, want all 7", len(a.Checks))
			}
		})
	}
}

func dumpChecks(a Acceptance) string {
	var b strings.Builder
	for _, c := range a.Checks {
		fmt.Fprintf(&b, "  %s | %s | %s | %s | %s\n", c.Check, c.Prefill, c.Decode, okWord(c.OK), c.Why)
	}
	return b.String() + "  " + a.Verdict
}

// Accept agrees with kv's rules for every TP pair: it refuses for
// replicated heads exactly where kv.VLLMRefusesTP says vLLM does, for
// sizes exactly where kv.Plan cannot pair them, and otherwise accepts a
// decode whose cache kv lays out (its block_len check agrees with kv's
// layouts).
func TestAcceptAgreesWithKV(t *testing.T) {
	t.Parallel()
	for _, name := range []string{"llama-3.1-8b", "qwen3-30b-a3b", "deepseek-r1"} {
		m := preset(t, name)
		for _, ptp := range []int{1, 2, 4, 8, 16} {
			for _, dtp := range []int{1, 2, 4, 8, 16} {
				ps, dsp := kv.Spec{Model: m, TP: ptp}, kv.Spec{Model: m, TP: dtp}
				if ps.Validate() != nil || dsp.Validate() != nil {
					continue
				}
				a := Accept(prefillOf(t, ps, ""), DecodeSpec{Model: &m, TP: dtp})
				refusedBy := ""
				for _, c := range a.Checks {
					if c.OK != nil && !*c.OK {
						refusedBy = c.Check
						break
					}
				}
				_, planErr := kv.Plan(ps, dsp)
				want := ""
				switch {
				case planErr != nil:
					want = "tp ratio"
				case kv.VLLMRefusesTP(ps, dsp):
					want = "replicated kv heads"
				}
				if refusedBy != want {
					t.Errorf("%s P%d D%d: refused by %q, want %q (plan: %v)\n%s", name, ptp, dtp, refusedBy, want, planErr, dumpChecks(a))
				}
			}
		}
	}
}

func TestInferTP(t *testing.T) {
	t.Parallel()
	llama := preset(t, "llama-3.1-8b") // 8 KV heads of 128 values: 4096 B a head at block 16, bf16
	for _, tc := range []struct {
		name     string
		m        kv.Model
		dtype    kv.DType
		bs, regs int
		backend  string
		blockLen int64
		tp       int
		atLeast  bool
		err      string
	}{
		{"flash-attn tp 2", llama, "", 16, 64, "FLASH_ATTN", 16384, 2, false, ""},
		{"flash-attn tp 1", llama, "", 16, 64, "", 32768, 1, false, ""},
		{"one head a rank", llama, "", 16, 64, "FLASH_ATTN", 4096, 8, true, ""},
		{"fp8 cache", llama, kv.FP8, 16, 64, "FLASH_ATTN", 8192, 2, false, ""},
		{"flashinfer by name", llama, "", 16, 32, "FLASHINFER", 32768, 2, false, ""},
		{"one region a layer, backend unknown", llama, "", 16, 32, "", 32768, 0, false, "give --tp"},
		{"not whole heads", llama, "", 16, 64, "FLASH_ATTN", 1000, 0, false, "not a whole number"},
		{"more heads than the model", llama, "", 16, 64, "FLASH_ATTN", 65536, 0, false, "not a whole number"},
		{"MLA", preset(t, "deepseek-v3"), "", 64, 61, "", 73728, 0, false, "is MLA"},
		{"no block size", llama, "", 0, 64, "", 4096, 0, false, "nothing to infer"},
	} {
		tp, atLeast, _, err := InferTP(tc.m, tc.dtype, tc.bs, tc.regs, tc.backend, tc.blockLen)
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("%s: %d %v, want error %q", tc.name, tp, err, tc.err)
			}
			continue
		}
		if err != nil || tp != tc.tp || atLeast != tc.atLeast {
			t.Errorf("%s: tp %d at least %v (%v), want %d %v", tc.name, tp, atLeast, err, tc.tp, tc.atLeast)
		}
	}
}

// FuzzAcceptPeerFacts: the prefill's side of Accept and InferTP comes from
// a peer's metadata; no values make them panic, allocate without bound,
// or give no verdict.
func FuzzAcceptPeerFacts(f *testing.F) {
	f.Add(2, 1, 16, 64, int64(16384), "HND", "FLASH_ATTN", 4, 16, "HND")
	f.Add(16, 1, 16, 64, int64(4096), "NHD", "FLASHINFER", 1, 8, "NHD")
	f.Add(0, 0, 0, 0, int64(0), "", "", 0, 0, "")
	f.Add(1<<30, 1<<30, 1<<31-1, 1<<20, int64(-1), "x", "y", -3, -1, "HND")
	llama := preset(f, "llama-3.1-8b")
	ds := preset(f, "deepseek-v3")
	f.Fuzz(func(t *testing.T, ptp, ppp, pbs, regions int, blockLen int64, layout, backend string, dtp, dbs int, dlayout string) {
		// Sizes are bounded where they enter (the probe's checks of the
		// extension and the flags); lengths are whatever the peer sent.
		ptp, ppp, dtp = ptp%(kv.MaxParallel+1), ppp%(kv.MaxParallel+1), dtp%(kv.MaxParallel+1)
		regions = regions % 4096
		if ptp < 0 || ppp < 0 || dtp < 0 || regions < 0 {
			return
		}
		p := PrefillFacts{TP: ptp, PP: ppp, BlockSize: pbs, Layout: layout, AttnBackend: backend, CompatHash: "h", Regions: regions,
			Ranks: []RankLens{{BlockLens: []int64{blockLen, blockLen}}}}
		for _, m := range []*kv.Model{nil, &llama, &ds} {
			a := Accept(p, DecodeSpec{Model: m, TP: dtp, BlockSize: dbs, Layout: dlayout, WantHash: "g",
				Factors: map[string]any{"num_kv_heads": json.Number("8"), "head_size": json.Number("128"), "dtype": "torch.bfloat16"}})
			if a.Verdict == "" || len(a.Checks) != 7 {
				t.Fatalf("%+v", a)
			}
			if m != nil {
				if tp, _, _, err := InferTP(*m, "", pbs, regions, backend, blockLen); err == nil && (tp < 1 || tp > m.NumKVHeads) {
					t.Fatalf("inferred tp %d", tp)
				}
			}
		}
	})
}
