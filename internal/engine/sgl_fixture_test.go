package engine

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/nixlctl/nixlctl/internal/wirefixture"
)

// SGLang's side of the wire fixtures (see fixture_test.go): the ZMQ frames
// decode sends a prefill rank and the bootstrap server's JSON answers.

func sameFrames(t *testing.T, what string, got, want [][]byte) {
	t.Helper()
	if len(got) != len(want) {
		t.Errorf("%s: %d frames, upstream has %d", what, len(got), len(want))
	}
	for i := range min(len(got), len(want)) {
		sameWire(t, fmt.Sprintf("%s frame %d", what, i), got[i], want[i])
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

func TestFixtureSGLBootstrapRoute(t *testing.T) {
	t.Parallel()
	b := newSGLBootstrap(func() int64 { return 0 }, func() {})
	srv := httptest.NewServer(b.mux())
	defer srv.Close()
	do := func(method, path, body string) (int, string, string) {
		t.Helper()
		req, err := http.NewRequest(method, srv.URL+path, strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		resp, err := srv.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		got, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, resp.Header.Get("Content-Type"), string(got)
	}
	// One prefill rank registers, as SGLang's register_to_bootstrap does.
	if code, _, body := do(http.MethodPut, "/route", `{"attn_tp_size": 1, "attn_tp_rank": 0, "attn_cp_size": 1, "attn_cp_rank": 0, `+
		`"attn_dp_size": 1, "attn_dp_rank": 0, "pp_size": 1, "pp_rank": 0, "system_dp_size": 1, "system_dp_rank": 0, `+
		`"rank_ip": "10.0.0.1", "rank_port": 41235, "page_size": 16, "kv_cache_dtype": "auto", `+
		`"load_balance_method": "follow_bootstrap_room"}`); code != 200 {
		t.Fatalf("PUT /route: %d %s", code, body)
	}
	for _, tc := range []struct{ query, fixture string }{
		{"prefill_dp_rank=-1&prefill_cp_rank=-1&target_tp_rank=-1&target_pp_rank=-1", "sglang_route_info.json"},
		{"prefill_dp_rank=0&prefill_cp_rank=0&target_tp_rank=0&target_pp_rank=0", "sglang_route_rank.json"},
	} {
		want := string(wirefixture.Raw(t, tc.fixture))
		code, ctype, got := do(http.MethodGet, "/route?"+tc.query, "")
		if code != 200 || got != want {
			t.Errorf("GET /route?%s: %d\n got %s\nwant %s", tc.query, code, got, want)
		}
		// What SGLang's own server answered to the same registration.
		if up := string(wirefixture.Upstream(t, tc.fixture)); got != up || want != up {
			t.Errorf("GET /route?%s differs from SGLang's own answer:\n  got %s\n hand %s\nsglang %s", tc.query, got, want, up)
		}
		if ctype != "application/json; charset=utf-8" {
			t.Errorf("content type %q, aiohttp's json_response sends application/json; charset=utf-8", ctype)
		}
	}
	// /query_dp_ranks answers {str(room): dp_rank} in the order asked, for
	// the rooms registered.
	for _, reg := range []string{`{"bootstrap_room": 99, "dp_rank": 1}`, `{"bootstrap_room": 12345678901234567, "dp_rank": 0}`} {
		if code, _, body := do(http.MethodPost, "/register_dp_rank", reg); code != 200 {
			t.Fatalf("register_dp_rank: %d %s", code, body)
		}
	}
	want := string(wirefixture.Raw(t, "sglang_query_dp_ranks.json"))
	code, _, got := do(http.MethodPost, "/query_dp_ranks", `{"bootstrap_rooms": [12345678901234567, 7, 99]}`)
	if code != 200 || got != want {
		t.Errorf("query_dp_ranks: %d\n got %s\nwant %s", code, got, want)
	}
	if up := string(wirefixture.Upstream(t, "sglang_query_dp_ranks.json")); got != up || want != up {
		t.Errorf("query_dp_ranks differs from SGLang's own answer:\n  got %s\n hand %s\nsglang %s", got, want, up)
	}

	// The decode side reads upstream's bodies.
	var info sglPrefillInfo
	if err := json.Unmarshal(wirefixture.Raw(t, "sglang_route_info.json"), &info); err != nil {
		t.Fatal(err)
	}
	if d := cmp.Diff(sglPrefillInfo{AttnTPSize: 1, AttnCPSize: 1, DPSize: 1, PPSize: 1, PageSize: 16, KVCacheDType: ptr("auto"),
		FollowBootstrapRoom: true}, info); d != "" {
		t.Errorf("PrefillServerInfo (-upstream +nixlctl):\n%s", d)
	}
	var rank sglRankEntry
	if err := json.Unmarshal(wirefixture.Raw(t, "sglang_route_rank.json"), &rank); err != nil || rank != (sglRankEntry{"10.0.0.1", 41235}) {
		t.Errorf("rank entry %+v, %v", rank, err)
	}
}

func TestFixtureSGLNotifs(t *testing.T) {
	t.Parallel()
	const room = 12345678901234567
	for _, tc := range []struct {
		fixture string
		got     []byte
		want    sglNotif
	}{
		{"sglang_notif_kv.hex", sglKVNotif(room, 3, true, 1), sglNotif{room: room, kind: "kv", chunk: 3, last: true, sender: 1}},
		{"sglang_notif_aux.hex", sglAuxNotif(room), sglNotif{room: room, kind: "aux"}},
		{"sglang_notif_aux_nokv.hex", sglNoKVNotif(room, 1), sglNotif{room: room, kind: "nokv", sender: 1}},
	} {
		want := wirefixture.Hex(t, tc.fixture)
		sameWire(t, tc.fixture, tc.got, want)
		n, err := parseSGLNotif(string(want))
		if err != nil || n != tc.want {
			t.Errorf("%s parsed %+v, %v; want %+v", tc.fixture, n, err, tc.want)
		}
	}
}

// Decode's ABORT (sent on its waiting timeout) is SGLang's, and prefill
// reads SGLang's.
func TestFixtureSGLAbort(t *testing.T) {
	t.Parallel()
	sameFrames(t, "ABORT", sglAbort(12345678901234567, "10.0.0.2", 41235), wirefixture.Frames(t, "sglang_abort.hex"))
	reg, info, room, err := DecodeSGLMessage(wirefixture.Frames(t, "sglang_abort.hex"))
	if err != nil || reg != nil || info != nil || room != 12345678901234567 {
		t.Errorf("ABORT decoded to room %d, %v %v %v", room, reg, info, err)
	}
}
