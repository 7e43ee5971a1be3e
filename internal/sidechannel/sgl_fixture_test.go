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
		wirefixture.Same(t, fmt.Sprintf("%s frame %d", what, i), got[i], want[i])
	}
}

// sglRoom and the values below are what every SGLang fixture holds, the
// hand ones here and upstream's (upstream_fixture_test.go).
const sglRoom = 12345678901234567

func fixtureTransferInfo() SGLTransferInfo {
	return SGLTransferInfo{Room: sglRoom, DecodeIP: "10.0.0.2", DecodePort: 41235, AgentName: "agent-d0",
		DstPages: []int32{7, 8, 300}, DstAux: 5, RequiredDst: 1, PrefixLen: 0}
}

func fixtureRegistration() SGLRegistration {
	return SGLRegistration{DecodeIP: "10.0.0.2", DecodePort: 41235, AgentName: "agent-d0", AgentMD: []byte("\x00\x01nixl"),
		KVPtrs: []uint64{0x7f0000000000, 0x7f0000100000}, AuxPtrs: []uint64{0x55000000}, GPUID: 0, DecodeTP: 1,
		DecodeRank: 0, KVItemLen: 32768}
}

func fixtureAbort() [][]byte { return SGLAbort(sglRoom, "10.0.0.2", 41235) }

// sglNotifFixture is a notification prefill's WRITEs carry: the fixture's
// name (without .hex or upstream's .bin), nixlctl's bytes and what they
// parse to.
type sglNotifFixture struct {
	name string
	got  []byte
	want SGLNotif
}

func sglNotifFixtures() []sglNotifFixture {
	return []sglNotifFixture{
		{"sglang_notif_kv", SGLKVNotif(sglRoom, 3, true, 1), SGLNotif{Room: sglRoom, Kind: "kv", Chunk: 3, Last: true, Sender: 1}},
		{"sglang_notif_aux", SGLAuxNotif(sglRoom), SGLNotif{Room: sglRoom, Kind: "aux"}},
		{"sglang_notif_aux_nokv", SGLNoKVNotif(sglRoom, 1), SGLNotif{Room: sglRoom, Kind: "nokv", Sender: 1}},
	}
}

// checkTransferInfo, checkRegistration and checkAbort decode a fixture's
// frames with nixlctl and compare them with the values above.
func checkTransferInfo(t *testing.T, frames [][]byte) {
	t.Helper()
	reg, got, _, err := DecodeSGLMessage(frames)
	if err != nil || reg != nil || got == nil {
		t.Fatalf("decoded %v %v %v", reg, got, err)
	}
	if d := cmp.Diff(fixtureTransferInfo(), *got); d != "" {
		t.Errorf("decoded (-upstream +nixlctl):\n%s", d)
	}
}

func checkRegistration(t *testing.T, frames [][]byte) {
	t.Helper()
	got, info, _, err := DecodeSGLMessage(frames)
	if err != nil || info != nil || got == nil {
		t.Fatalf("decoded %v %v %v", got, info, err)
	}
	if d := cmp.Diff(fixtureRegistration(), *got); d != "" {
		t.Errorf("decoded (-upstream +nixlctl):\n%s", d)
	}
}

func checkAbort(t *testing.T, frames [][]byte) {
	t.Helper()
	reg, info, room, err := DecodeSGLMessage(frames)
	if err != nil || reg != nil || info != nil || room != sglRoom {
		t.Errorf("ABORT decoded to room %d, %v %v %v", room, reg, info, err)
	}
}

func TestFixtureSGLTransferInfo(t *testing.T) {
	t.Parallel()
	want := wirefixture.Frames(t, "sglang_transfer_info.hex")
	sameFrames(t, "TransferInfo", fixtureTransferInfo().Encode(), want)
	checkTransferInfo(t, want)
}

func TestFixtureSGLRegistration(t *testing.T) {
	t.Parallel()
	want := wirefixture.Frames(t, "sglang_kv_args.hex")
	sameFrames(t, "KV-args registration", fixtureRegistration().Encode(), want)
	checkRegistration(t, want)
}

func TestFixtureSGLNotifs(t *testing.T) {
	t.Parallel()
	for _, tc := range sglNotifFixtures() {
		t.Run(tc.name, func(t *testing.T) {
			fixture := tc.name + ".hex"
			want := wirefixture.Hex(t, fixture)
			wirefixture.Same(t, fixture, tc.got, want)
			if n, err := ParseSGLNotif(string(want)); err != nil || n != tc.want {
				t.Errorf("%s parsed %+v, %v; want %+v", fixture, n, err, tc.want)
			}
		})
	}
}

// Decode's ABORT (sent on its waiting timeout) is SGLang's, and prefill
// reads SGLang's.
func TestFixtureSGLAbort(t *testing.T) {
	t.Parallel()
	want := wirefixture.Frames(t, "sglang_abort.hex")
	sameFrames(t, "ABORT", fixtureAbort(), want)
	checkAbort(t, want)
}
