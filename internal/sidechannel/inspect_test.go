package sidechannel

import (
	"bytes"
	"context"
	"errors"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/vmihailenco/msgpack/v5"

	"github.com/nixlctl/nixlctl/internal/testkit"
)

func goodMetadata() AgentMetadata {
	return AgentMetadata{EngineID: "prefill-e", AgentMetadata: []byte("blob"), KVCachesBaseAddr: []uint64{1 << 40, 1<<63 + 4096},
		DeviceID: 0, NumBlocks: 64, BlockLens: []int64{4096, 4096}, BlockStrides: []int64{4096, 4096}, KVCacheLayout: "HND",
		BlockSize: 16, AttnBackendName: "FLASH_ATTN", PhysicalBlocksPerLogical: 1, DCPSize: 1, PCPSize: 1,
		RegionNames: []string{"layer0.k", "layer0.v"}, Nixlctl: &Extra{Backend: "ucx", TPSize: 2, PPSize: 1}}.Wire()
}

// wireMap is v as a peer's decoder sees it: its msgpack encoding read
// back as a map, keyed by the names on the wire.
func wireMap[T any](t testing.TB, v T) map[string]any {
	t.Helper()
	b, err := msgpack.Marshal(&v)
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := msgpack.Unmarshal(b, &m); err != nil {
		t.Fatal(err)
	}
	return m
}

// replyFrames builds a reply whose metadata map is md's with edit applied.
func replyFrames(t testing.TB, hash string, edit func(m map[string]any)) [][]byte {
	t.Helper()
	m := wireMap(t, goodMetadata())
	if edit != nil {
		edit(m)
	}
	b, err := msgpack.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	p, err := msgpack.Marshal(&HandshakePayload{CompatibilityHash: hash, AgentMetadataBytes: b})
	if err != nil {
		t.Fatal(err)
	}
	ts, _ := msgpack.Marshal(12.5)
	return [][]byte{p, ts}
}

func TestReadReplyGood(t *testing.T) {
	t.Parallel()
	frames := replyFrames(t, "abc", nil)
	r, err := ReadReply(frames)
	if err != nil {
		t.Fatal(err)
	}
	if r.CompatibilityHash != "abc" || r.RemoteClock != 12.5 || r.Meta.EngineID != "prefill-e" || len(r.Meta.BlockLens) != 2 ||
		r.Meta.KVCachesBaseAddr[1] != 1<<63+4096 || r.Meta.Nixlctl == nil || r.Meta.Nixlctl.TPSize != 2 ||
		r.PayloadBytes != len(frames[0]) || r.MetadataBytes == 0 || r.AgentBlobBytes != 4 {
		t.Errorf("%+v", r)
	}
	if len(r.Unknown) != 1 || r.Unknown[0] != "nixlctl" {
		t.Errorf("unknown keys %v, want [nixlctl]", r.Unknown)
	}
	// Optional fields vLLM gives defaults to may be absent.
	r, err = ReadReply(replyFrames(t, "abc", func(m map[string]any) {
		for _, k := range []string{"region_num_blocks", "region_group_ids", "region_names", "region_mem_types", "dcp_size", "pcp_size", "region_members"} {
			delete(m, k)
		}
	}))
	if err != nil || r.Meta.DCPSize != 1 || r.Meta.PCPSize != 1 {
		t.Errorf("defaults: %v %+v", err, r.Meta)
	}
}

// Every way a misbehaving peer can get a field wrong is an error that
// names the field.
func TestReadReplyNamesTheField(t *testing.T) {
	t.Parallel()
	str := func(s string) []byte { b, _ := msgpack.Marshal(s); return b }
	ts, _ := msgpack.Marshal(1.0)
	good := replyFrames(t, "h", nil)
	for _, tc := range []struct {
		name   string
		frames [][]byte
		edit   func(m map[string]any)
		want   string
	}{
		{name: "one frame", frames: good[:1], want: "reply: 1 frames, want 2"},
		{name: "garbage payload", frames: [][]byte{[]byte("\xc1garbage"), ts}, want: "NixlHandshakePayload: not msgpack: invalid msgpack byte 0xc1"},
		{name: "truncated payload", frames: [][]byte{good[0][:len(good[0])-7], ts}, want: "NixlHandshakePayload: not msgpack: truncated"},
		{name: "trailing bytes", frames: [][]byte{append(bytes.Clone(good[0]), 0xc0), ts}, want: "1 bytes after the value"},
		{name: "payload not a map", frames: [][]byte{str("hi"), ts}, want: "NixlHandshakePayload: want a map, got str"},
		{name: "timestamp a string", frames: [][]byte{good[0], str("now")}, want: "timestamp: want a float"},
		{name: "empty timestamp", frames: [][]byte{good[0], nil}, want: "timestamp: empty frame"},
		{name: "deep nesting", frames: [][]byte{bytes.Repeat([]byte{0x91}, 100000), ts}, want: "nested deeper than 16"},
		{name: "forged array length", frames: [][]byte{{0xdd, 0xff, 0xff, 0xff, 0xff, 0x01}, ts}, want: "truncated"},
		{name: "no engine id", edit: func(m map[string]any) { delete(m, "engine_id") }, want: "NixlAgentMetadata.engine_id: missing"},
		{name: "null ssm sizes", edit: func(m map[string]any) { m["ssm_sizes"] = nil }, want: "NixlAgentMetadata.ssm_sizes: null"},
		{name: "null region members", edit: func(m map[string]any) { m["region_members"] = nil }, want: "NixlAgentMetadata.region_members: null"},
		{name: "blob as str", edit: func(m map[string]any) { m["agent_metadata"] = "blob" }, want: "NixlAgentMetadata.agent_metadata: want bin (Python bytes), got str"},
		{name: "num blocks a float", edit: func(m map[string]any) { m["num_blocks"] = 1.5 }, want: "NixlAgentMetadata.num_blocks: want int, got float"},
		{name: "zero blocks", edit: func(m map[string]any) { m["num_blocks"] = 0 }, want: "NixlAgentMetadata.num_blocks: 0 out of range"},
		{name: "block length a string", edit: func(m map[string]any) { m["block_lens"] = []any{4096, "x"} }, want: "NixlAgentMetadata.block_lens[1]: want int, got str"},
		{name: "negative address", edit: func(m map[string]any) { m["kv_caches_base_addr"] = []any{-1} }, want: "NixlAgentMetadata.kv_caches_base_addr[0]: want an address (int >= 0), got -1"},
		{name: "lens per region", edit: func(m map[string]any) { m["block_lens"] = []any{4096} }, want: "NixlAgentMetadata.block_lens: 1 entries for 2 regions"},
		{name: "layout", edit: func(m map[string]any) { m["kv_cache_layout"] = "XYZ" }, want: `NixlAgentMetadata.kv_cache_layout: "XYZ", want HND or NHD`},
		{name: "ssm triple", edit: func(m map[string]any) { m["ssm_sizes"] = []any{0, 0, 0} }, want: "NixlAgentMetadata.ssm_sizes: 3 elements, want 2"},
		{name: "members of ints", edit: func(m map[string]any) { m["region_members"] = []any{[]any{1}} }, want: "NixlAgentMetadata.region_members[0][0]: want str, got int"},
		{name: "no regions", edit: func(m map[string]any) {
			m["kv_caches_base_addr"], m["block_lens"], m["block_strides"], m["region_names"] = []any{}, []any{}, []any{}, []any{}
		}, want: "NixlAgentMetadata.kv_caches_base_addr: empty"},
		{name: "metadata not msgpack", edit: nil, want: "NixlHandshakePayload.agent_metadata_bytes: not msgpack"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			frames := tc.frames
			if frames == nil && tc.edit != nil {
				frames = replyFrames(t, "h", tc.edit)
			}
			if frames == nil { // metadata bytes that are not msgpack
				p, _ := msgpack.Marshal(&HandshakePayload{CompatibilityHash: "h", AgentMetadataBytes: []byte{0xc1}})
				frames = [][]byte{p, ts}
			}
			_, err := ReadReply(frames)
			testkit.WantErr(t, err, tc.want)
			var re *ReplyError
			if !errors.As(err, &re) {
				t.Errorf("%v is not a ReplyError", err)
			}
		})
	}
}

// A payload field of the wrong type or missing.
func TestReadReplyPayloadFields(t *testing.T) {
	t.Parallel()
	ts, _ := msgpack.Marshal(1.0)
	for _, tc := range []struct {
		payload map[string]any
		want    string
	}{
		{map[string]any{"agent_metadata_bytes": []byte{0x80}}, "NixlHandshakePayload.compatibility_hash: missing"},
		{map[string]any{"compatibility_hash": 7, "agent_metadata_bytes": []byte{0x80}}, "NixlHandshakePayload.compatibility_hash: want str, got int"},
		{map[string]any{"compatibility_hash": "h"}, "NixlHandshakePayload.agent_metadata_bytes: missing"},
		{map[string]any{"compatibility_hash": "h", "agent_metadata_bytes": []byte{0x93, 1, 2, 3}}, "NixlAgentMetadata: want a map, got array"},
		{map[string]any{"compatibility_hash": "h", "agent_metadata_bytes": []byte{0x80}}, "NixlAgentMetadata.engine_id: missing"},
	} {
		p, _ := msgpack.Marshal(tc.payload)
		if _, err := ReadReply([][]byte{p, ts}); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: got %v, want %q", tc.payload, err, tc.want)
		}
	}
}

// What the engine's own encoder sends reads back the same.
func TestReadReplyMatchesDecodeHandshakeReply(t *testing.T) {
	t.Parallel()
	frames := replyFrames(t, "h", nil)
	want, _, err := DecodeHandshakeReply(frames, "h")
	if err != nil {
		t.Fatal(err)
	}
	got, err := ReadReply(frames)
	if err != nil {
		t.Fatal(err)
	}
	a, _ := msgpack.Marshal(&want)
	b, _ := msgpack.Marshal(&got.Meta)
	if !bytes.Equal(a, b) {
		t.Errorf("ReadReply %+v\nDecodeHandshakeReply %+v", got.Meta, want)
	}
}

// FuzzReadReply: no bytes a peer sends make the reader panic, and
// whatever it accepts is consistent.
func FuzzReadReply(f *testing.F) {
	good := replyFrames(f, "h", nil)
	f.Add(good[0], good[1])
	f.Add(good[0][:len(good[0])/2], good[1])
	f.Add([]byte{0x91, 0x91, 0x91, 0x90}, []byte{0xcb, 0, 0, 0, 0, 0, 0, 0, 0})
	f.Add([]byte{0xdf, 0xff, 0xff, 0xff, 0xff}, []byte{0xca})
	f.Add([]byte{0x81, 0xa5, 'e', 'r', 'r', 'o', 'r', 0xa1, 'x'}, []byte{0x01})
	f.Fuzz(func(t *testing.T, payload, ts []byte) {
		r, err := ReadReply([][]byte{payload, ts})
		if err != nil {
			return
		}
		md := r.Meta
		if len(md.KVCachesBaseAddr) == 0 || len(md.BlockLens) != len(md.KVCachesBaseAddr) || md.NumBlocks < 1 || md.BlockSize < 1 ||
			len(md.SSMSizes) != 2 || md.EngineID == "" {
			t.Fatalf("accepted an inconsistent reply: %+v", md)
		}
	})
}

func TestScanMsgpackAcceptsWhatTheEncoderWrites(t *testing.T) {
	t.Parallel()
	for _, v := range []any{nil, true, -33, 1 << 40, uint64(1 << 63), 1.5, float32(2), "s", strings.Repeat("x", 70000), []byte("b"),
		[]any{1, []any{2, map[string]any{"k": []any{}}}}, map[string]any{"a": 1, "b": bytes.Repeat([]byte{1}, 300)}} {
		b, err := msgpack.Marshal(v)
		if err != nil {
			t.Fatal(err)
		}
		if err := scanMsgpack(b, maxReplyDepth); err != nil {
			t.Errorf("%T: %v", v, err)
		}
	}
}

// A peer's frame of nothing but nested array headers used to recurse in
// the msgpack decoder until the Go runtime killed the process (a stack
// overflow is fatal, recover() does not catch it): a prefill's listener
// through get_meta_msg, a decode through the handshake reply. Both are
// refused now, as is a forged length.
func TestDecodersRefuseDeepNesting(t *testing.T) {
	t.Parallel()
	deep := bytes.Repeat([]byte{0x91}, 20<<20)
	ts, _ := msgpack.Marshal(1.0)
	if _, _, err := DecodeGetMeta(deep); err == nil || !strings.Contains(err.Error(), "nested deeper than 16") {
		t.Errorf("get_meta_msg: %v", err)
	}
	if _, _, err := DecodeHandshakeReply([][]byte{deep, ts}, AnyHash); err == nil || !strings.Contains(err.Error(), "nested deeper") {
		t.Errorf("reply: %v", err)
	}
	p, _ := msgpack.Marshal(&HandshakePayload{CompatibilityHash: "h", AgentMetadataBytes: deep})
	if _, _, err := DecodeHandshakeReply([][]byte{p, ts}, AnyHash); err == nil || !strings.Contains(err.Error(), "agent metadata: not msgpack") {
		t.Errorf("metadata: %v", err)
	}
	if err := CheckMsgpack([]byte{0xdd, 0xff, 0xff, 0xff, 0xff}); err == nil {
		t.Error("a forged array length passed")
	}
	// Trailing bytes stay the decoder's business.
	if err := CheckMsgpack([]byte{0x01, 0x02}); err != nil {
		t.Error(err)
	}
}

// An IPv6 side channel ("tcp://[::1]:port") answers: libzmq needs ZMQ_IPV6
// on both sockets for such an address.
func TestHandshakeOverIPv6(t *testing.T) {
	ln, err := net.Listen("tcp", "[::1]:0")
	if err != nil {
		t.Skipf("no IPv6 loopback here: %v", err)
	}
	ln.Close()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	s, err := ServeHandshake(ctx, "tcp://[::1]:0", "h", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Wait()
	defer cancel()
	if err := s.Set(0, 0, goodMetadata()); err != nil {
		t.Fatal(err)
	}
	frames, err := Request(ctx, s.Endpoint(), [][]byte{mustGetMeta(t)}, 5*time.Second)
	if err != nil {
		t.Fatalf("%s: %v", s.Endpoint(), err)
	}
	if r, err := ReadReply(frames); err != nil || r.Meta.EngineID != "prefill-e" {
		t.Errorf("%+v %v", r, err)
	}
}

func mustGetMeta(t *testing.T) []byte {
	b, err := EncodeGetMeta(0, 0)
	if err != nil {
		t.Fatal(err)
	}
	return b
}
