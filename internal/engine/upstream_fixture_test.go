package engine

import (
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/nixlctl/nixlctl/internal/wirefixture"
)

// testdata/wire/upstream holds what upstream's own encoders emitted for the
// hand fixtures' values: nixlctl must match those bytes too, in case a
// hand fixture and nixlctl's encoder share a misread rule.
func TestFixtureUpstreamPushReg(t *testing.T) {
	t.Parallel()
	want := wirefixture.Upstream(t, "vllm_push_reg.bin")
	sameWire(t, "hand fixture vllm_push_reg.hex", wirefixture.Hex(t, "vllm_push_reg.hex"), want)
	reg := PushReg{RequestID: "r1-0a1b2c3d", DecodeEngineID: "decode-0", DecodeHost: "10.0.0.2", DecodePort: 5600,
		DecodeTPSize: 2, LocalBlockIDs: [][]int{{3, 4, 200}}, RemoteEngineID: "prefill-0", RemoteHost: "10.0.0.1",
		RemotePort: 5600, RemoteTPSize: 1, RemotePPSize: 1}
	got, err := EncodePushReg(reg)
	if err != nil {
		t.Fatal(err)
	}
	sameWire(t, "PUSH_REG", got, want)
	payload, ok := strings.CutPrefix(string(want), PushRegPrefix)
	if !ok {
		t.Fatal("upstream's bytes lack the PUSH_REG: prefix")
	}
	back, ids, err := DecodePushReg([]byte(payload))
	if err != nil {
		t.Fatal(err)
	}
	back.LocalBlockIDs, reg.LocalBlockIDs = nil, nil
	if d := cmp.Diff(reg, back); d != "" || !cmp.Equal(ids, []int{3, 4, 200}) {
		t.Errorf("decoded (-upstream +nixlctl):\n%s\nblocks %v", d, ids)
	}
}
