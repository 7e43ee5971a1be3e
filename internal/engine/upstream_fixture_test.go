package engine

import (
	"testing"

	"github.com/nixlctl/nixlctl/internal/wirefixture"
)

// testdata/wire/upstream holds what upstream's own encoders emitted for the
// hand fixtures' values: nixlctl must match those bytes too, in case a
// hand fixture and nixlctl's encoder share a misread rule.
func TestFixtureUpstreamPushReg(t *testing.T) {
	t.Parallel()
	want := wirefixture.Upstream(t, "vllm_push_reg.bin")
	wirefixture.Same(t, "hand fixture vllm_push_reg.hex", wirefixture.Hex(t, "vllm_push_reg.hex"), want)
	checkPushReg(t, want)
}

// vLLM's request_finished built these dicts and Starlette's JSONResponse
// (what vLLM's API server answers with) rendered them.
func TestFixtureUpstreamTransferParams(t *testing.T) {
	t.Parallel()
	for _, mode := range []string{"pull", "push"} {
		t.Run(mode, func(t *testing.T) {
			name := "vllm_kv_transfer_params_" + mode + ".json"
			want := wirefixture.Upstream(t, name)
			wirefixture.Same(t, "hand fixture "+name, wirefixture.Raw(t, name), want)
			checkTransferParams(t, mode, want)
		})
	}
}
