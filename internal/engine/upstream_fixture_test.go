package engine

import (
	"encoding/json"
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

// The SGLang frames and notifications come from SGLang's own frame builders
// (send_metadata, _register_kv_args, _send_abort_notification, send_aux) run
// on the hand fixtures' values.
func TestFixtureUpstreamSGLFrames(t *testing.T) {
	t.Parallel()
	const room = 12345678901234567
	info := SGLTransferInfo{Room: room, DecodeIP: "10.0.0.2", DecodePort: 41235, AgentName: "agent-d0",
		DstPages: []int32{7, 8, 300}, DstAux: 5, RequiredDst: 1, PrefixLen: 0}
	reg := SGLRegistration{DecodeIP: "10.0.0.2", DecodePort: 41235, AgentName: "agent-d0", AgentMD: []byte("\x00\x01nixl"),
		KVPtrs: []uint64{0x7f0000000000, 0x7f0000100000}, AuxPtrs: []uint64{0x55000000}, GPUID: 0, DecodeTP: 1,
		DecodeRank: 0, KVItemLen: 32768}
	for _, tc := range []struct {
		name string
		got  [][]byte
		// check decodes upstream's frames with nixlctl.
		check func(t *testing.T, frames [][]byte)
	}{
		{"sglang_transfer_info.hex", info.Encode(), func(t *testing.T, frames [][]byte) {
			r, got, _, err := DecodeSGLMessage(frames)
			if err != nil || r != nil || got == nil {
				t.Fatalf("decoded %v %v %v", r, got, err)
			}
			if d := cmp.Diff(info, *got); d != "" {
				t.Errorf("decoded (-upstream +nixlctl):\n%s", d)
			}
		}},
		{"sglang_kv_args.hex", reg.Encode(), func(t *testing.T, frames [][]byte) {
			got, i, _, err := DecodeSGLMessage(frames)
			if err != nil || i != nil || got == nil {
				t.Fatalf("decoded %v %v %v", got, i, err)
			}
			if d := cmp.Diff(reg, *got); d != "" {
				t.Errorf("decoded (-upstream +nixlctl):\n%s", d)
			}
		}},
		{"sglang_abort.hex", sglAbort(room, "10.0.0.2", 41235), func(t *testing.T, frames [][]byte) {
			r, i, gotRoom, err := DecodeSGLMessage(frames)
			if err != nil || r != nil || i != nil || gotRoom != room {
				t.Errorf("ABORT decoded to room %d, %v %v %v", gotRoom, r, i, err)
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			want := wirefixture.Frames(t, "upstream/"+tc.name)
			sameFrames(t, "hand fixture "+tc.name, wirefixture.Frames(t, tc.name), want)
			sameFrames(t, "nixlctl's "+tc.name, tc.got, want)
			tc.check(t, want)
		})
	}
	for _, tc := range []struct {
		name string
		got  []byte
		want sglNotif
	}{
		{"sglang_notif_kv", sglKVNotif(room, 3, true, 1), sglNotif{room: room, kind: "kv", chunk: 3, last: true, sender: 1}},
		{"sglang_notif_aux", sglAuxNotif(room), sglNotif{room: room, kind: "aux"}},
		{"sglang_notif_aux_nokv", sglNoKVNotif(room, 1), sglNotif{room: room, kind: "nokv", sender: 1}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			want := wirefixture.Upstream(t, tc.name+".bin")
			sameWire(t, "hand fixture "+tc.name+".hex", wirefixture.Hex(t, tc.name+".hex"), want)
			sameWire(t, "nixlctl's "+tc.name, tc.got, want)
			if n, err := parseSGLNotif(string(want)); err != nil || n != tc.want {
				t.Errorf("parsed %+v, %v; want %+v", n, err, tc.want)
			}
		})
	}
}

// vLLM's request_finished built these dicts and Starlette's JSONResponse
// (what vLLM's API server answers with) rendered them.
func TestFixtureUpstreamTransferParams(t *testing.T) {
	t.Parallel()
	for _, mode := range []string{"pull", "push"} {
		t.Run(mode, func(t *testing.T) {
			name := "vllm_kv_transfer_params_" + mode + ".json"
			want := wirefixture.Upstream(t, name)
			sameWire(t, "hand fixture "+name, wirefixture.Raw(t, name), want)
			p := TransferParams{DoRemotePrefill: true, RemoteBlockIDs: []int{4, 5, 6}, RemoteEngineID: "prefill-0",
				RemoteRequestID: "cmpl-1-0-1a2b3c4d", RemoteHost: "10.0.0.1", RemotePort: 5600, TPSize: 2, DCPSize: 1, PPSize: 1,
				RemoteNumTokens: 40, TransferMode: mode}
			got, err := json.Marshal(p)
			if err != nil {
				t.Fatal(err)
			}
			sameWire(t, "nixlctl's kv_transfer_params", got, want)
			var back TransferParams
			if err := json.Unmarshal(want, &back); err != nil {
				t.Fatal(err)
			}
			if d := cmp.Diff(p, back); d != "" {
				t.Errorf("decoded (-upstream +nixlctl):\n%s", d)
			}
		})
	}
}
