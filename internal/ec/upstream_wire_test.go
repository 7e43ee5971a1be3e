package ec

import (
	"encoding/hex"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"github.com/nixlctl/nixlctl/internal/nixl"
	"github.com/nixlctl/nixlctl/internal/wirefixture"
)

// testdata/wire/upstream holds what vLLM's own XferReq/XferAck Structs and
// mem-descriptor helper emitted through msgspec for the hand fixtures'
// values. The hand fixtures were cross-checked with msgpack-python packing
// dicts, which cannot show a misread omit_defaults or tag rule; these can.
func TestECWireMatchesUpstreamBytes(t *testing.T) {
	t.Parallel()
	descs := []nixl.Desc{{Addr: 0x7f0000001000, Len: 5120}, {Addr: 0x7f0000002400, Len: 5120}}
	md, err := EncodeMemDescriptor(descs)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		upstream, hand string
		msg            any
	}{
		{"ec_mem_descriptor.msgpack", vecMemDesc, descs},
		{"ec_xfer_req_defaults.msgpack", vecReqDefaults, &Request{MMHash: strings.Repeat("ab", 32),
			CompatibilityHash: strings.Repeat("cd", 32), ConnectorVersion: ECConnectorVersion}},
		{"ec_xfer_req_v1.msgpack", vecReqV1, &Request{MMHash: "h1", CompatibilityHash: "c", SessionID: "s-1", ConnectorVersion: 1}},
		{"ec_xfer_ack_ok.msgpack", vecAckFull, &Ack{MMHash: "h1", Status: StatusOK, SessionID: "s-1",
			SrcBlockIndices: []int{0, 1, 300, 70000}, AgentMetadata: []byte("\x00md"), MemDescriptor: md}},
		{"ec_xfer_ack_nack.msgpack", vecAckNack, &Ack{MMHash: "h1", Status: StatusMissing}},
	} {
		t.Run(tc.upstream, func(t *testing.T) {
			want := wirefixture.Upstream(t, tc.upstream)
			if hand := wirefixture.Hex(t, tc.hand); string(hand) != string(want) {
				t.Errorf("hand fixture %s differs from upstream's bytes:\n hand %x\nupstream %x", tc.hand, hand, want)
			}
			var got []byte
			var back any
			var err, derr error
			switch m := tc.msg.(type) {
			case []nixl.Desc:
				got, err = EncodeMemDescriptor(m)
				back, derr = DecodeMemDescriptor(want)
			case *Request:
				got, err = m.Encode()
				var r Request
				r, derr = DecodeRequest(want)
				back = &r
			case *Ack:
				got, err = m.Encode()
				var a Ack
				a, derr = DecodeAck(want)
				back = &a
			}
			if err != nil {
				t.Fatal(err)
			}
			if g, w := hex.EncodeToString(got), hex.EncodeToString(want); g != w {
				t.Errorf("nixlctl's encoding differs from upstream's:\n got %s\nwant %s", g, w)
			}
			if d := cmp.Diff(tc.msg, back, cmpopts.EquateEmpty()); derr != nil || d != "" {
				t.Errorf("decoded (-upstream +nixlctl):\n%s%v", d, derr)
			}
		})
	}
}
