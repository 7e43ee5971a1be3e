package engine

import (
	"strings"
	"testing"
)

// The factors and hash of the compatibility section of
// docs/bench-pull-push-sglang.md (CPython's sha256 of json.dumps(sort_keys=True)).
const (
	factorsJSON = `{"vllm_version": "0.11.1", "nixl_connector_version": 12, "model": "meta-llama/Llama-3.1-8B-Instruct",
 "dtype": "torch.bfloat16", "num_kv_heads": 8, "head_size": 128, "num_hidden_layers": 32,
 "attn_backend_name": "FLASH_ATTN", "cache_dtype": "auto", "is_hma_enabled": false,
 "speculative_config": null, "transfer_mode": "pull"}`
	factorsHash = "c5d032bc3fabbf32974fde0fbafa3cd4b7657e9c703fcab1739f79d71df8230f"
)

func TestIdentityApply(t *testing.T) {
	t.Parallel()
	const hashA = "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"
	const hashB = "bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb"
	base := Config{Protocol: ProtoPull, Model: testModel(), BlockSize: 16, TP: 1}
	derived, err := base.CompatHash()
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name     string
		id       Identity
		driver   func(*Config)
		wantHash string // after apply
		wantNo   bool
		wantErr  []string // all in the error
	}{
		{"none: the driver's", Identity{}, func(c *Config) { c.CompatHashHex = hashB }, hashB, false, nil},
		{"driver sent none: the endpoint's", Identity{HashHex: hashA, Source: "serve --compat-hash"}, nil, hashA, false, nil},
		{"driver sent none: no check", Identity{NoCheck: true, Source: "serve --no-compat-check"}, nil, derived, true, nil},
		{"same hash", Identity{HashHex: hashA, Source: "serve --compat-hash"}, func(c *Config) { c.CompatHashHex = hashA }, hashA, false, nil},
		{"other hash", Identity{HashHex: hashA, Source: "serve --compat-hash"}, func(c *Config) { c.CompatHashHex = hashB }, "", false,
			[]string{"the driver's --compat-hash gives " + hashB, "this endpoint's serve --compat-hash gives " + hashA}},
		{"driver's factors differ", Identity{HashHex: hashA, Source: "serve --compat-hash"},
			func(c *Config) { c.CompatFactors = []byte(factorsJSON) }, "", false,
			[]string{"the driver's --compat-factors gives " + factorsHash, "this endpoint's serve --compat-hash gives " + hashA}},
		{"check differs", Identity{HashHex: hashA, NoCheck: true, Source: "serve --compat-hash"}, func(c *Config) { c.CompatHashHex = hashA }, "", false,
			[]string{"the driver's --no-compat-check=false", "this endpoint's serve --compat-hash has --no-compat-check=true"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := base
			if tc.driver != nil {
				tc.driver(&cfg)
			}
			err := tc.id.apply(&cfg)
			if tc.wantErr != nil {
				if err == nil {
					t.Fatalf("applied, want an error naming %q", tc.wantErr)
				}
				for _, w := range tc.wantErr {
					if !strings.Contains(err.Error(), w) {
						t.Errorf("error %q does not say %q", err, w)
					}
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			h, err := cfg.CompatHash()
			if err != nil || h != tc.wantHash || cfg.NoCompatCheck != tc.wantNo {
				t.Errorf("hash %s no-check %t (%v), want %s %t", h, cfg.NoCompatCheck, err, tc.wantHash, tc.wantNo)
			}
		})
	}
}
