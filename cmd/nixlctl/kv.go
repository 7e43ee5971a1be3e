package main

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/spf13/cobra"

	"github.com/nixlctl/nixlctl/internal/errkind"
	"github.com/nixlctl/nixlctl/internal/kv"
	"github.com/nixlctl/nixlctl/internal/report"
	"github.com/nixlctl/nixlctl/internal/userfile"
)

func newKVCmd(a *app) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "kv",
		Short: "KV cache sizing and layout",
		Long:  "Commands that describe a model's paged KV cache without moving any data.",
	}
	cmd.AddCommand(newKVLayoutCmd(a))
	return cmd
}

// kvLayoutOptions are the inputs of `nixlctl kv layout`.
type kvLayoutOptions struct {
	Model         string `mapstructure:"model"`
	ModelConfig   string `mapstructure:"model-config"`
	ISL           string `mapstructure:"isl"` // a list here (a sweep); --tokens before one vocabulary
	TP            int    `mapstructure:"tp"`
	PP            int    `mapstructure:"pp"`
	PrefillTP     int    `mapstructure:"prefill-tp"`
	DecodeTP      int    `mapstructure:"decode-tp"`
	BlockSize     int    `mapstructure:"block-size"`
	KVDType       string `mapstructure:"kv-dtype"`
	Layout        string `mapstructure:"layout"`
	KVCacheLayout string `mapstructure:"kv-cache-layout"`
	FullWindow    bool   `mapstructure:"full-window"`
	LinkGbps      string `mapstructure:"link-gbps"`
}

const kvLayoutLong = `Print the exact KV-cache sizes of a model as vLLM and SGLang lay out their
paged cache: bytes per token (whole model and per rank), per request and per
block, the memory regions each rank registers, the transfer descriptors one
request needs, and how long the request takes at the line rate of common links.

The model is a built-in preset (--model) or a HuggingFace config.json
(--model-config). The cache dtype is the model's torch_dtype unless --kv-dtype
says otherwise (fp8, bf16, fp16, fp32).

Layouts: flash-attn registers K and V of every layer as two regions (vLLM's
FlashAttention backend; SGLang likewise); flashinfer keeps K|V together in one
region per layer. MLA models (DeepSeek, Kimi) have one latent region per layer,
whole on every TP rank. HND/NHD is the order inside a block: with NHD a head
slice (heterogeneous TP) needs one descriptor per token.

TP splits KV heads across ranks; with more ranks than KV heads each rank holds
one whole head, replicated (never half a head). PP splits layers the way vLLM
does. "Per rank" numbers are for the rank with the most layers. With
--prefill-tp and --decode-tp different, it also prints which prefill ranks each
decode rank reads which heads from, with the descriptors that takes.

Sliding-window layers (gpt-oss) keep only the blocks overlapping the window;
--full-window sizes them as full attention (an engine without a hybrid
allocator).`

const kvLayoutExample = `  nixlctl kv layout --model llama-3.1-70b --isl 4096
  nixlctl kv layout --model deepseek-r1 --tp 8 --isl 1024,4096,8192,32768,131072
  nixlctl kv layout --model-config ./config.json --kv-dtype fp8 --block-size 64 --isl 8k
  nixlctl kv layout --model llama-3.1-70b --prefill-tp 4 --decode-tp 2 --isl 4096 -o json`

func newKVLayoutCmd(a *app) *cobra.Command {
	cmd := &cobra.Command{
		Use:     "layout",
		Short:   "Per-token, per-rank and per-request KV sizes, descriptors and transfer estimates",
		Long:    kvLayoutLong,
		Example: kvLayoutExample,
		Args:    cobra.NoArgs,
		RunE:    bound(a.runKVLayout),
	}
	f := cmd.Flags()
	f.String("model", "", "model preset ("+strings.Join(kv.PresetNames(), ", ")+"); default "+kv.DefaultModel)
	f.String("model-config", "", "path to a HuggingFace config.json instead of a preset")
	f.String("isl", "4096", "tokens per request; a comma-separated list prints a sweep (1024,4096,8k,128k)")
	f.Int("tp", 1, "tensor-parallel size")
	f.Int("pp", 1, "pipeline-parallel size")
	f.Int("prefill-tp", 0, "prefill TP size for a heterogeneous P/D pair (with --decode-tp)")
	f.Int("decode-tp", 0, "decode TP size for a heterogeneous P/D pair (with --prefill-tp)")
	f.Int("block-size", 16, "tokens per KV block (page)")
	f.String("kv-dtype", "", "KV cache dtype: fp8, bf16, fp16 or fp32 (default: the model's dtype)")
	f.String("layout", "flash-attn", "attention layout: flash-attn (K and V regions) or flashinfer (K|V region)")
	f.String("kv-cache-layout", "HND", "order inside a block: HND or NHD")
	f.Bool("full-window", false, "size sliding-window layers as full attention")
	f.String("link-gbps", "", "extra link speeds in Gb/s to estimate, comma-separated (e.g. 800,1600)")
	aliasFlag(f, "tokens", "isl") // docs/reports.md, "Flag names"
	return cmd
}

// loadModel resolves --model / --model-config into a Model: one of them,
// the default preset for neither.
func loadModel(name, configPath string) (kv.Model, error) {
	switch {
	case name != "" && configPath != "":
		return kv.Model{}, errkind.BadInputf("use --model or --model-config, not both")
	case configPath != "":
		return readModel("--model-config", configPath, true)
	case name == "":
		name = kv.DefaultModel
	}
	return readModel("--model", name, false)
}

// readModel is the one model loader behind every flag that names a
// model: a preset, or a HuggingFace config.json read as every file a user
// names is (userfile: regular files only, under a size limit). Its errors
// name the flag first.
func readModel(flag, s string, file bool) (kv.Model, error) {
	var m kv.Model
	var err error
	if file {
		var data []byte
		if data, err = userfile.ReadFile(s, userfile.MaxSmall); err == nil {
			m, err = kv.ParseHFConfig(s, data)
		}
	} else {
		m, err = kv.Preset(s)
	}
	if err != nil {
		return kv.Model{}, errkind.BadInputf("%s: %v", flag, err)
	}
	return m, nil
}

// kvSpec builds the deployment spec shared by every command that sizes a
// KV cache.
func kvSpec(m kv.Model, dtype string, blockSize int, layout, order string, tp, pp int, fullWindow bool) (kv.Spec, error) {
	s := kv.Spec{Model: m, BlockSize: blockSize, TP: tp, PP: pp, KeepFullWindow: fullWindow}
	var err error
	if dtype != "" && dtype != "auto" {
		if s.DType, err = kv.ParseDType(dtype); err != nil {
			return s, errkind.BadInputf("--kv-dtype: %v", err)
		}
	}
	if s.Layout, err = kv.ParseAttnLayout(layout); err != nil {
		return s, errkind.BadInputf("--layout: %v", err)
	}
	if s.Order, err = kv.ParseCacheOrder(order); err != nil {
		return s, errkind.BadInputf("--kv-cache-layout: %v", err)
	}
	if blockSize <= 0 {
		return s, errkind.BadInputf("--block-size must be > 0 (got %d)", blockSize)
	}
	if tp <= 0 {
		return s, errkind.BadInputf("--tp and --pp must be > 0 (got %d and %d)", tp, pp)
	}
	if err := checkPP(m, pp); err != nil {
		return s, err
	}
	return s, errkind.BadInput(s.Validate())
}

// checkPP refuses pipeline stages the model cannot hold, naming --pp
// (kv.Spec.Validate refuses them too, in its own words).
func checkPP(m kv.Model, pp int) error {
	switch {
	case pp < 1:
		return errkind.BadInputf("--pp must be at least 1 (got %d)", pp)
	case pp > m.NumLayers:
		return errkind.BadInputf("--pp %d: more pipeline stages than the %d layers of %s (each stage holds at least one)", pp, m.NumLayers, m.Name)
	}
	return nil
}

// The link speeds kv layout estimates with: 1 Mb/s to 1 Pb/s, well past
// any link, and the slowest still moves the largest cache in a time a
// duration holds.
const minLinkGbps, maxLinkGbps = 0.001, 1e6

func parseLinks(s string) ([]kv.Link, error) {
	var links []kv.Link
	if strings.TrimSpace(s) == "" {
		return nil, nil
	}
	for _, f := range strings.Split(s, ",") {
		f = strings.TrimSpace(f)
		if f == "" {
			return nil, errkind.BadInputf("--link-gbps: %q: %v", s, errEmptyItem)
		}
		// NaN passed a "g <= 0" check and printed a NaNG column with a
		// wrapped time; the bounds also keep bytes/speed a duration.
		g, err := strconv.ParseFloat(f, 64)
		if err != nil || !(g >= minLinkGbps && g <= maxLinkGbps) {
			return nil, errkind.BadInputf("--link-gbps: %q is not a number of Gb/s between %g and %g", f, minLinkGbps, maxLinkGbps)
		}
		links = append(links, kv.Link{Name: strconv.FormatFloat(g, 'f', -1, 64) + "G", Gbps: g})
	}
	return links, nil
}

func (a *app) runKVLayout(_ context.Context, o kvLayoutOptions) error {
	m, err := loadModel(o.Model, o.ModelConfig)
	if err != nil {
		return err
	}
	tokens, err := kv.ParseTokens(o.ISL)
	if err != nil {
		return errkind.BadInputf("--isl: %v", err)
	}
	links, err := parseLinks(o.LinkGbps)
	if err != nil {
		return err
	}
	tp, decodeTP := o.TP, 0
	switch {
	case o.PrefillTP < 0 || o.DecodeTP < 0:
		return errkind.BadInputf("--prefill-tp and --decode-tp must be > 0")
	case (o.PrefillTP > 0) != (o.DecodeTP > 0):
		return errkind.BadInputf("--prefill-tp and --decode-tp go together")
	case o.PrefillTP > 0:
		if tp != 1 && tp != o.PrefillTP && tp != o.DecodeTP {
			return errkind.BadInputf("--tp %d conflicts with --prefill-tp %d / --decode-tp %d", tp, o.PrefillTP, o.DecodeTP)
		}
		tp, decodeTP = o.PrefillTP, o.DecodeTP
		// Both sides must be deployable on their own.
		if _, err := kvSpec(m, o.KVDType, o.BlockSize, o.Layout, o.KVCacheLayout, decodeTP, o.PP, o.FullWindow); err != nil {
			return fmt.Errorf("decode: %w", err)
		}
	}
	spec, err := kvSpec(m, o.KVDType, o.BlockSize, o.Layout, o.KVCacheLayout, tp, o.PP, o.FullWindow)
	if err != nil {
		return err
	}
	var out []kv.Analysis
	for _, n := range tokens {
		an, err := kv.Analyze(spec, n, decodeTP, links...)
		if err != nil {
			return errkind.BadInput(err)
		}
		out = append(out, an)
	}
	if err := report.WriteKVLayout(a.io.Out, a.format, out); err != nil {
		if errors.Is(err, report.ErrFormat) {
			return errkind.BadInput(err)
		}
		return err
	}
	return nil
}
