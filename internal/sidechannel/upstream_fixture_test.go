package sidechannel

import (
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/nixlctl/nixlctl/internal/wirefixture"
)

// The hand fixtures could share a misreading of msgspec's rules with
// nixlctl's encoder; testdata/wire/upstream holds what vLLM's own classes
// and msgspec emitted for the same values, so that cannot go unseen.
func TestFixtureUpstreamVLLMHandshake(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		upstream, hand string
		encode         func() ([]byte, error)
		decode         func(t *testing.T, b []byte)
	}{
		{"vllm_get_meta_req.msgpack", "vllm_get_meta_req.hex",
			func() ([]byte, error) { return EncodeGetMeta(1, 3) },
			func(t *testing.T, b []byte) {
				if pp, tp, err := DecodeGetMeta(b); err != nil || pp != 1 || tp != 3 {
					t.Errorf("decoded pp %d tp %d, %v; want 1, 3", pp, tp, err)
				}
			}},
		{"vllm_agent_metadata.msgpack", "vllm_agent_metadata.hex",
			func() ([]byte, error) { return EncodeAgentMetadata(fixtureMetadata()) },
			func(t *testing.T, b []byte) {
				// The metadata travels inside the payload; wrapped in
				// nixlctl's payload it must read back to the same value.
				p, err := EncodeHandshakePayload(fixtureHash, b)
				if err != nil {
					t.Fatal(err)
				}
				md, _, err := DecodeHandshakeReply([][]byte{p, EncodeClock(1)}, fixtureHash)
				if err != nil {
					t.Fatal(err)
				}
				if d := cmp.Diff(fixtureMetadata(), md); d != "" {
					t.Errorf("decoded (-want +nixlctl):\n%s", d)
				}
			}},
		{"vllm_handshake_payload.msgpack", "vllm_handshake_payload.hex",
			func() ([]byte, error) {
				md, err := EncodeAgentMetadata(fixtureMetadata())
				if err != nil {
					return nil, err
				}
				return EncodeHandshakePayload(fixtureHash, md)
			},
			func(t *testing.T, b []byte) {
				md, _, err := DecodeHandshakeReply([][]byte{b, wirefixture.Upstream(t, "vllm_handshake_ts.msgpack")}, fixtureHash)
				if err != nil {
					t.Fatal(err)
				}
				if d := cmp.Diff(fixtureMetadata(), md); d != "" {
					t.Errorf("decoded (-want +nixlctl):\n%s", d)
				}
				if r, err := ReadReply([][]byte{b, wirefixture.Upstream(t, "vllm_handshake_ts.msgpack")}); err != nil || len(r.Unknown) != 0 {
					t.Errorf("inspect: unknown keys %v, %v", r.Unknown, err)
				}
			}},
		{"vllm_handshake_ts.msgpack", "vllm_handshake_ts.hex",
			func() ([]byte, error) { return EncodeClock(12345.5), nil },
			func(t *testing.T, b []byte) {
				_, ts, err := DecodeHandshakeReply([][]byte{wirefixture.Upstream(t, "vllm_handshake_payload.msgpack"), b}, fixtureHash)
				if err != nil || ts != 12345.5 {
					t.Errorf("clock %v, %v; want 12345.5", ts, err)
				}
			}},
	} {
		t.Run(tc.upstream, func(t *testing.T) {
			want := wirefixture.Upstream(t, tc.upstream)
			got, err := tc.encode()
			if err != nil {
				t.Fatal(err)
			}
			sameBytes(t, "nixlctl's encoding", got, want)
			sameBytes(t, "the hand fixture "+tc.hand, wirefixture.Hex(t, tc.hand), want)
			tc.decode(t, want)
		})
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
		{"sglang_abort.hex", SGLAbort(room, "10.0.0.2", 41235), func(t *testing.T, frames [][]byte) {
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
		want SGLNotif
	}{
		{"sglang_notif_kv", SGLKVNotif(room, 3, true, 1), SGLNotif{Room: room, Kind: "kv", Chunk: 3, Last: true, Sender: 1}},
		{"sglang_notif_aux", SGLAuxNotif(room), SGLNotif{Room: room, Kind: "aux"}},
		{"sglang_notif_aux_nokv", SGLNoKVNotif(room, 1), SGLNotif{Room: room, Kind: "nokv", Sender: 1}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			want := wirefixture.Upstream(t, tc.name+".bin")
			sameBytes(t, "hand fixture "+tc.name+".hex", wirefixture.Hex(t, tc.name+".hex"), want)
			sameBytes(t, "nixlctl's "+tc.name, tc.got, want)
			if n, err := ParseSGLNotif(string(want)); err != nil || n != tc.want {
				t.Errorf("parsed %+v, %v; want %+v", n, err, tc.want)
			}
		})
	}
}
