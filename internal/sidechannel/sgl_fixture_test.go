package sidechannel

import (
	"fmt"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/nixlctl/nixlctl/internal/wirefixture"
)

// SGLang's side of the wire fixtures (see fixture_test.go): the ZMQ frames
// decode sends a prefill rank and the notifications prefill's WRITEs
// carry. The bootstrap server's JSON answers are internal/engine's
// (sgl_fixture_test.go there).

func sameFrames(t *testing.T, what string, got, want [][]byte) {
	t.Helper()
	if len(got) != len(want) {
		t.Errorf("%s: %d frames, upstream has %d", what, len(got), len(want))
	}
	for i := range min(len(got), len(want)) {
		sameBytes(t, fmt.Sprintf("%s frame %d", what, i), got[i], want[i])
	}
}

func TestFixtureSGLTransferInfo(t *testing.T) {
	t.Parallel()
	want := wirefixture.Frames(t, "sglang_transfer_info.hex")
	info := SGLTransferInfo{Room: 12345678901234567, DecodeIP: "10.0.0.2", DecodePort: 41235, AgentName: "agent-d0",
		DstPages: []int32{7, 8, 300}, DstAux: 5, RequiredDst: 1, PrefixLen: 0}
	sameFrames(t, "TransferInfo", info.Encode(), want)
	reg, got, _, err := DecodeSGLMessage(want)
	if err != nil || reg != nil || got == nil {
		t.Fatalf("decoded %v %v %v", reg, got, err)
	}
	if d := cmp.Diff(info, *got); d != "" {
		t.Errorf("decoded (-upstream +nixlctl):\n%s", d)
	}
}

func TestFixtureSGLRegistration(t *testing.T) {
	t.Parallel()
	want := wirefixture.Frames(t, "sglang_kv_args.hex")
	r := SGLRegistration{DecodeIP: "10.0.0.2", DecodePort: 41235, AgentName: "agent-d0", AgentMD: []byte("\x00\x01nixl"),
		KVPtrs: []uint64{0x7f0000000000, 0x7f0000100000}, AuxPtrs: []uint64{0x55000000}, GPUID: 0, DecodeTP: 1,
		DecodeRank: 0, KVItemLen: 32768}
	sameFrames(t, "KV-args registration", r.Encode(), want)
	got, info, _, err := DecodeSGLMessage(want)
	if err != nil || info != nil || got == nil {
		t.Fatalf("decoded %v %v %v", got, info, err)
	}
	if d := cmp.Diff(r, *got); d != "" {
		t.Errorf("decoded (-upstream +nixlctl):\n%s", d)
	}
}

func TestFixtureSGLNotifs(t *testing.T) {
	t.Parallel()
	const room = 12345678901234567
	for _, tc := range []struct {
		fixture string
		got     []byte
		want    SGLNotif
	}{
		{"sglang_notif_kv.hex", SGLKVNotif(room, 3, true, 1), SGLNotif{Room: room, Kind: "kv", Chunk: 3, Last: true, Sender: 1}},
		{"sglang_notif_aux.hex", SGLAuxNotif(room), SGLNotif{Room: room, Kind: "aux"}},
		{"sglang_notif_aux_nokv.hex", SGLNoKVNotif(room, 1), SGLNotif{Room: room, Kind: "nokv", Sender: 1}},
	} {
		want := wirefixture.Hex(t, tc.fixture)
		sameBytes(t, tc.fixture, tc.got, want)
		n, err := ParseSGLNotif(string(want))
		if err != nil || n != tc.want {
			t.Errorf("%s parsed %+v, %v; want %+v", tc.fixture, n, err, tc.want)
		}
	}
}

// Decode's ABORT (sent on its waiting timeout) is SGLang's, and prefill
// reads SGLang's.
func TestFixtureSGLAbort(t *testing.T) {
	t.Parallel()
	sameFrames(t, "ABORT", SGLAbort(12345678901234567, "10.0.0.2", 41235), wirefixture.Frames(t, "sglang_abort.hex"))
	reg, info, room, err := DecodeSGLMessage(wirefixture.Frames(t, "sglang_abort.hex"))
	if err != nil || reg != nil || info != nil || room != 12345678901234567 {
		t.Errorf("ABORT decoded to room %d, %v %v %v", room, reg, info, err)
	}
}
