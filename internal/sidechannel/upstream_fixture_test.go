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
			wirefixture.Same(t, "nixlctl's encoding", got, want)
			wirefixture.Same(t, "the hand fixture "+tc.hand, wirefixture.Hex(t, tc.hand), want)
			tc.decode(t, want)
		})
	}
}

// The SGLang frames and notifications come from SGLang's own frame builders
// (send_metadata, _register_kv_args, _send_abort_notification, send_aux) run
// on the hand fixtures' values.
func TestFixtureUpstreamSGLFrames(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		got  [][]byte
		// check decodes upstream's frames with nixlctl.
		check func(t *testing.T, frames [][]byte)
	}{
		{"sglang_transfer_info.hex", fixtureTransferInfo().Encode(), checkTransferInfo},
		{"sglang_kv_args.hex", fixtureRegistration().Encode(), checkRegistration},
		{"sglang_abort.hex", fixtureAbort(), checkAbort},
	} {
		t.Run(tc.name, func(t *testing.T) {
			want := wirefixture.Frames(t, "upstream/"+tc.name)
			sameFrames(t, "hand fixture "+tc.name, wirefixture.Frames(t, tc.name), want)
			sameFrames(t, "nixlctl's "+tc.name, tc.got, want)
			tc.check(t, want)
		})
	}
	for _, tc := range sglNotifFixtures() {
		t.Run(tc.name, func(t *testing.T) {
			want := wirefixture.Upstream(t, tc.name+".bin")
			wirefixture.Same(t, "hand fixture "+tc.name+".hex", wirefixture.Hex(t, tc.name+".hex"), want)
			wirefixture.Same(t, "nixlctl's "+tc.name, tc.got, want)
			if n, err := ParseSGLNotif(string(want)); err != nil || n != tc.want {
				t.Errorf("parsed %+v, %v; want %+v", n, err, tc.want)
			}
		})
	}
}
