package engine

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/nixlctl/nixlctl/internal/wirefixture"
)

// SGLang's bootstrap server against the wire fixtures (see fixture_test.go):
// the JSON answers of its /route, /register_dp_rank and /query_dp_ranks.
// The ZMQ frames and notifications are internal/sidechannel's (sgl_fixture_test.go there).

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
