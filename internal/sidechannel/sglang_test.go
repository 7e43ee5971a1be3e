package sidechannel

import (
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestSGLMessagesRoundTrip(t *testing.T) {
	reg := SGLRegistration{DecodeIP: "10.0.0.2", DecodePort: 5000, AgentName: "decode-0-tp1", AgentMD: []byte("md"),
		KVPtrs: []uint64{1 << 40, 1<<40 + 4096}, AuxPtrs: []uint64{7, 8, 9}, GPUID: 1, DecodeTP: 2, DecodeRank: 1, KVItemLen: 4096, DstNumSlots: 512}
	r, info, _, err := DecodeSGLMessage(reg.Encode())
	if err != nil || info != nil || r == nil {
		t.Fatalf("registration: %v", err)
	}
	if diff := cmp.Diff(reg, *r); diff != "" {
		t.Error(diff)
	}
	ti := SGLTransferInfo{Room: 1<<62 + 5, DecodeIP: "10.0.0.2", DecodePort: 5000, AgentName: "decode-0-tp1", DstPages: []int32{3, 4, 9},
		DstAux: 7, RequiredDst: 2, PrefixLen: 32}
	_, got, _, err := DecodeSGLMessage(ti.Encode())
	if err != nil || got == nil {
		t.Fatalf("transfer info: %v", err)
	}
	if diff := cmp.Diff(ti, *got); diff != "" {
		t.Error(diff)
	}
	if _, _, room, err := DecodeSGLMessage([][]byte{[]byte("ABORT"), []byte("42"), []byte("ip"), []byte("1")}); err != nil || room != 42 {
		t.Errorf("abort: %d %v", room, err)
	}
	for _, m := range []string{"5_kv_0_1_2", "5_aux", "5_aux_nokv_3"} {
		if _, err := ParseSGLNotif(m); err != nil {
			t.Errorf("%s: %v", m, err)
		}
	}
	for _, m := range []string{"x_kv_0_1_2", "5_kv_0_2_2", "5_kv_-1_1_2", "5_aux_2", "5"} {
		if _, err := ParseSGLNotif(m); err == nil {
			t.Errorf("%s accepted", m)
		}
	}
}

func FuzzSGLang(f *testing.F) {
	f.Add("12_kv_0_1_3")
	f.Add("12_aux")
	f.Add("12_aux_nokv_1")
	f.Fuzz(func(t *testing.T, s string) {
		n, err := ParseSGLNotif(s)
		if err == nil && (n.Kind == "" || n.Chunk < 0 || n.Sender < 0) {
			t.Fatalf("%q -> %+v", s, n)
		}
		frames := [][]byte{}
		for _, part := range strings.Split(s, "|") {
			frames = append(frames, []byte(part))
		}
		_, _, _, _ = DecodeSGLMessage(frames)
		_, _, _, _ = DecodeSGLMessage(append([][]byte{[]byte(SGLGuard)}, frames...))
	})
}
