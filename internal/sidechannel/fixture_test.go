package sidechannel

import (
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/nixlctl/nixlctl/internal/wirefixture"
)

// The fixtures under testdata/wire are written by hand from upstream's
// encoding rules (msgspec msgpack for vLLM's structs); nixlctl's encoders
// must produce them byte for byte and its decoders read them back.

const fixtureHash = "f16d05ec6b29248d2c61adb1e9263f78e4f7bace1b955014a2d17872cfe4064d"

// fixtureMetadata is vllm_agent_metadata.hex's logical value.
func fixtureMetadata() AgentMetadata {
	return AgentMetadata{EngineID: "prefill-0", AgentMetadata: []byte("\x00\x01nixl"),
		KVCachesBaseAddr: []uint64{0x7f3a00000000, 0x7f3a40000000}, DeviceID: 0, NumBlocks: 1000,
		BlockLens: []int64{32768, 32768}, BlockStrides: []int64{32768, 32768}, KVCacheLayout: "HND", BlockSize: 16,
		SSMSizes: []int64{0, 0}, AttnBackendName: "FLASH_ATTN", PhysicalBlocksPerLogical: 1, DCPSize: 1, PCPSize: 1,
		RegionMembers: [][]string{}}
}

func TestFixtureGetMetaRequest(t *testing.T) {
	t.Parallel()
	want := wirefixture.Hex(t, "vllm_get_meta_req.hex")
	got, err := EncodeGetMeta(1, 3)
	if err != nil {
		t.Fatal(err)
	}
	wirefixture.Same(t, "get_meta_msg request", got, want)
	pp, tp, err := DecodeGetMeta(want)
	if err != nil || pp != 1 || tp != 3 {
		t.Errorf("decoded pp %d tp %d, %v; want 1, 3", pp, tp, err)
	}
}

func TestFixtureAgentMetadata(t *testing.T) {
	t.Parallel()
	want := wirefixture.Hex(t, "vllm_agent_metadata.hex")
	got, err := EncodeAgentMetadata(fixtureMetadata())
	if err != nil {
		t.Fatal(err)
	}
	wirefixture.Same(t, "NixlAgentMetadata", got, want)
	// Unset lists fill in as a vLLM worker's defaults would: the same bytes.
	sparse := fixtureMetadata()
	sparse.SSMSizes, sparse.RegionMembers = nil, nil
	got, err = EncodeAgentMetadata(sparse)
	if err != nil {
		t.Fatal(err)
	}
	wirefixture.Same(t, "NixlAgentMetadata with defaults left unset", got, want)
}

func TestFixtureHandshakeReply(t *testing.T) {
	t.Parallel()
	wantPayload := wirefixture.Hex(t, "vllm_handshake_payload.hex")
	wantTS := wirefixture.Hex(t, "vllm_handshake_ts.hex")
	got, err := EncodeHandshakePayload(fixtureHash, wirefixture.Hex(t, "vllm_agent_metadata.hex"))
	if err != nil {
		t.Fatal(err)
	}
	wirefixture.Same(t, "NixlHandshakePayload", got, wantPayload)
	wirefixture.Same(t, "listener clock", EncodeClock(12345.5), wantTS)

	// The listener's answer to the fixture request is the fixture payload.
	s := &HandshakeServer{hash: fixtureHash, ranks: map[[2]int][]byte{}}
	if err := s.Set(1, 3, fixtureMetadata()); err != nil {
		t.Fatal(err)
	}
	frames, err := s.handle([][]byte{wirefixture.Hex(t, "vllm_get_meta_req.hex")})
	if err != nil || len(frames) != 2 {
		t.Fatalf("listener answered %d frames, %v", len(frames), err)
	}
	wirefixture.Same(t, "listener payload", frames[0], wantPayload)

	// And the client reads upstream's reply back to the same values.
	md, ts, err := DecodeHandshakeReply([][]byte{wantPayload, wantTS}, fixtureHash)
	if err != nil {
		t.Fatal(err)
	}
	if ts != 12345.5 {
		t.Errorf("clock %v, want 12345.5", ts)
	}
	if d := cmp.Diff(fixtureMetadata(), md); d != "" {
		t.Errorf("decoded metadata (-upstream +nixlctl):\n%s", d)
	}
	if _, _, err := DecodeHandshakeReply([][]byte{wantPayload, wantTS}, "other"); err == nil {
		t.Error("a different compatibility hash was accepted")
	}
	// The inspector reads it too, with no unknown keys.
	r, err := ReadReply([][]byte{wantPayload, wantTS})
	if err != nil || len(r.Unknown) != 0 || r.Meta.NumBlocks != 1000 {
		t.Errorf("inspect: %+v, %v", r, err)
	}
}
