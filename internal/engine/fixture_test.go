package engine

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/nixlctl/nixlctl/internal/lease"
	"github.com/nixlctl/nixlctl/internal/wirefixture"
)

// The fixtures under testdata/wire are written by hand from upstream's
// encoding rules (msgspec msgpack, Python's json, SGLang's frame packing);
// nixlctl's encoders must produce them byte for byte and its decoders read
// them back.

func TestFixturePushReg(t *testing.T) {
	t.Parallel()
	checkPushReg(t, wirefixture.Hex(t, "vllm_push_reg.hex"))
}

// checkPushReg encodes the fixtures' registration and compares it with
// want byte for byte, then decodes want back to the same registration.
func checkPushReg(t *testing.T, want []byte) {
	t.Helper()
	reg := PushReg{RequestID: "r1-0a1b2c3d", DecodeEngineID: "decode-0", DecodeHost: "10.0.0.2", DecodePort: 5600,
		DecodeTPSize: 2, LocalBlockIDs: [][]int{{3, 4, 200}}, RemoteEngineID: "prefill-0", RemoteHost: "10.0.0.1",
		RemotePort: 5600, RemoteTPSize: 1, RemotePPSize: 1}
	got, err := EncodePushReg(reg)
	if err != nil {
		t.Fatal(err)
	}
	wirefixture.Same(t, "PUSH_REG", got, want)
	payload, ok := strings.CutPrefix(string(want), PushRegPrefix)
	if !ok {
		t.Fatal("the bytes lack the PUSH_REG: prefix")
	}
	back, ids, err := DecodePushReg([]byte(payload))
	if err != nil {
		t.Fatal(err)
	}
	back.LocalBlockIDs, reg.LocalBlockIDs = nil, nil
	if d := cmp.Diff(reg, back); d != "" || !cmp.Equal(ids, []int{3, 4, 200}) {
		t.Errorf("decoded (-want +nixlctl):\n%s\nblocks %v", d, ids)
	}
}

func TestFixtureHeartbeat(t *testing.T) {
	t.Parallel()
	want := wirefixture.Hex(t, "vllm_heartbeat.hex")
	idsIn := []string{"cmpl-1-0-1a2b3c4d", "cmpl-2-0-5e6f7a8b"}
	wirefixture.Same(t, "HB", lease.HeartbeatBatch{IDs: idsIn}.Message(), want)
	ids, ok := lease.ParseHeartbeat(string(want))
	if !ok || !cmp.Equal(ids, idsIn) {
		t.Errorf("parsed %v, %v", ids, ok)
	}
}

func TestFixtureTransferParams(t *testing.T) {
	t.Parallel()
	for _, mode := range []string{"pull", "push"} {
		t.Run(mode, func(t *testing.T) {
			checkTransferParams(t, mode, wirefixture.Raw(t, "vllm_kv_transfer_params_"+mode+".json"))
		})
	}
}

// checkTransferParams encodes the fixtures' kv_transfer_params for mode
// and compares them with want byte for byte, then decodes want back to
// the same params.
func checkTransferParams(t *testing.T, mode string, want []byte) {
	t.Helper()
	p := TransferParams{DoRemotePrefill: true, RemoteBlockIDs: []int{4, 5, 6}, RemoteEngineID: "prefill-0",
		RemoteRequestID: "cmpl-1-0-1a2b3c4d", RemoteHost: "10.0.0.1", RemotePort: 5600, TPSize: 2, DCPSize: 1, PPSize: 1,
		RemoteNumTokens: 40, TransferMode: mode}
	got, err := json.Marshal(p)
	if err != nil {
		t.Fatal(err)
	}
	if string(got) != string(want) {
		t.Errorf("kv_transfer_params differ from the fixture:\n got %s\nwant %s", got, want)
	}
	var back TransferParams
	if err := json.Unmarshal(want, &back); err != nil {
		t.Fatal(err)
	}
	if d := cmp.Diff(p, back); d != "" {
		t.Errorf("decoded (-upstream +nixlctl):\n%s", d)
	}
}

func TestFixtureCompletionNotif(t *testing.T) {
	t.Parallel()
	want := wirefixture.Hex(t, "vllm_completion_notif.hex")
	wirefixture.Same(t, "completion notification", completionNotif("cmpl-1-0-1a2b3c4d", 2), want)
	id, n, ok := parseCompletion(string(want))
	if !ok || id != "cmpl-1-0-1a2b3c4d" || n != 2 {
		t.Errorf("parsed %q %d %v", id, n, ok)
	}
}
