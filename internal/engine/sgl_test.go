package engine

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/nixlctl/nixlctl/internal/kv"
	"github.com/nixlctl/nixlctl/internal/nixl"
	"github.com/nixlctl/nixlctl/internal/sglrooms"
	"github.com/nixlctl/nixlctl/internal/sidechannel"
)

// A peer that sends its TransferInfo again while prefill is writing the
// room must not touch what the writer reads (it was a map shared with the
// inbox goroutine: Go's "concurrent map read and map write"). Run with
// -race. With two decode ranks the room holds two TransferInfos, so the
// writer's loop over them lasts long enough for the race detector to
// catch the old code (about one run in five).
func TestSGLangDuplicateTransferInfoDuringSend(t *testing.T) {
	p, d, _ := engines(t, ProtoSGLang, 1, 2, nil)
	push, err := sidechannel.DialPush(p.sgl.ranks[0].inbox.Endpoint(), time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer push.Close()
	ctx := context.Background()
	const room, tokens = uint64(4242), 1000
	prefilled := make(chan error, 1)
	go func() {
		_, err := p.sgl.prefill(ctx, PrefillRequest{ID: "r", Tokens: tokens, Key: room, Room: room, ChunkTokens: 16})
		prefilled <- err
	}()
	loaded := make(chan LoadReply, 1)
	go func() {
		lr, _ := d.dec.Load(ctx, LoadRequest{ID: "r", Tokens: tokens, Key: room, Room: room, Bootstrap: p.sgl.bootstrapAddr})
		loaded <- lr
	}()
	// Once decode's own TransferInfo is in, repeat it (other pages, so a
	// duplicate that won would corrupt the transfer) until prefill is done.
	waitFor(t, "the room to be bootstrapped", func() bool {
		p.sgl.mu.Lock()
		defer p.sgl.mu.Unlock()
		st, ok := p.sgl.rooms[0].State(room)
		return ok && st != sglrooms.Bootstrapping
	})
	dup := sidechannel.SGLTransferInfo{Room: room, DecodeIP: "127.0.0.1", DecodePort: 1, AgentName: d.ranks[0].agent.Name(),
		DstPages: []int32{0}, RequiredDst: 1}.Encode()
	var perr error
	sent := 0
send:
	for {
		select {
		case perr = <-prefilled:
			break send
		default:
		}
		if err := push.Send(dup); err != nil {
			t.Fatal(err)
		}
		sent++
	}
	lr := <-loaded
	if perr != nil || lr.Error != "" || lr.CorruptBlocks != 0 {
		t.Fatalf("prefill %v, decode %s (corrupt %d: %s)", perr, lr.Error, lr.CorruptBlocks, lr.Corrupt)
	}
	// Every duplicate is counted once the inbox has read it.
	waitStat(t, "stale control messages", func() int64 { return p.Stats().StaleControl }, int64(sent))
	if st := p.Stats(); st.MalformedControl != 0 || st.StaleControl != int64(sent) {
		t.Errorf("prefill after %d duplicates: %+v", sent, st)
	}
}

// Decode's rooms with notifications duplicated and held back behind later
// ones (out of order): every room still completes once, with its data.
func TestSGLangDuplicateAndReorderedNotifs(t *testing.T) {
	for _, tps := range [][2]int{{1, 1}, {2, 1}, {1, 2}} {
		t.Run(fmt.Sprintf("%d-%d", tps[0], tps[1]), func(t *testing.T) {
			p, d, _ := engines(t, ProtoSGLang, tps[0], tps[1], func(c *Config) {
				// Prefill receives no notifications in SGLang: this is decode's.
				c.Faults = &nixl.Faults{DupNotif: 0.3, DelayNotif: 0.3, DelayNotifs: 2 * time.Millisecond, Seed: 7}
			})
			ctx := context.Background()
			for i := range 4 {
				room := uint64(900 + i)
				var wg sync.WaitGroup
				var perr error
				wg.Add(1)
				go func() {
					defer wg.Done()
					_, perr = p.sgl.prefill(ctx, PrefillRequest{ID: "r", Tokens: 200, Key: room, Room: room, ChunkTokens: 32})
				}()
				lr, _ := d.dec.Load(ctx, LoadRequest{ID: "r", Tokens: 200, Key: room, Room: room, Bootstrap: p.sgl.bootstrapAddr})
				wg.Wait()
				if perr != nil || lr.Error != "" || lr.CorruptBlocks != 0 {
					t.Fatalf("room %d: prefill %v, decode %s (corrupt %d: %s)", room, perr, lr.Error, lr.CorruptBlocks, lr.Corrupt)
				}
			}
			var injected nixl.FaultStats
			for _, rk := range d.ranks {
				fs := rk.agent.(*nixl.FaultyAgent).Stats()
				injected.DuplicatedNotifs += fs.DuplicatedNotifs
				injected.DelayedNotifs += fs.DelayedNotifs
			}
			if injected.DuplicatedNotifs == 0 || injected.DelayedNotifs == 0 {
				t.Fatalf("no faults injected: %+v", injected)
			}
			if st := d.Stats(); st.DuplicateNotifs == 0 || st.MalformedNotifs != 0 || st.BlocksInUse != 0 {
				t.Errorf("decode after %+v: %+v", injected, st)
			}
		})
	}
}

// The bootstrap server answers as SGLang's does: 400 for a GET /route
// missing a parameter, every PrefillServerInfo field for the all -1
// query, and rank_port as an integer; /health says OK.
func TestSGLangBootstrapWire(t *testing.T) {
	p, _, _ := engines(t, ProtoSGLang, 2, 1, nil)
	addr := "http://" + p.Setup().Bootstrap
	get := func(path string) (int, map[string]any) {
		t.Helper()
		resp, err := http.Get(addr + path)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var m map[string]any
		_ = json.NewDecoder(resp.Body).Decode(&m)
		return resp.StatusCode, m
	}
	if code, _ := get("/route?target_tp_rank=0"); code != http.StatusBadRequest {
		t.Errorf("missing parameters: %d, want 400", code)
	}
	code, info := get("/route?prefill_dp_rank=-1&prefill_cp_rank=-1&target_tp_rank=-1&target_pp_rank=-1")
	if code != http.StatusOK {
		t.Fatalf("server info: %d", code)
	}
	for _, f := range []string{"attn_tp_size", "attn_cp_size", "dp_size", "pp_size", "page_size", "kv_cache_dtype",
		"follow_bootstrap_room", "enable_dsa_cache_layer_split", "prefill_http_port"} {
		if _, ok := info[f]; !ok {
			t.Errorf("PrefillServerInfo lacks %s: %v", f, info)
		}
	}
	if info["prefill_http_port"] != nil || info["follow_bootstrap_room"] != true || info["page_size"] != 16.0 {
		t.Errorf("PrefillServerInfo %v: want prefill_http_port null (no HTTP API), follow_bootstrap_room, page_size 16", info)
	}
	if info["attn_tp_size"] != 2.0 {
		t.Errorf("attn_tp_size %v, want 2", info["attn_tp_size"])
	}
	// SGLang registers its --kv-cache-dtype setting, "auto" by default,
	// and a default SGLang decode compares it as a string (it refused
	// nixlctl's "bf16").
	if info["kv_cache_dtype"] != "auto" {
		t.Errorf("kv_cache_dtype %v, want SGLang's default \"auto\"", info["kv_cache_dtype"])
	}
	code, rank := get("/route?prefill_dp_rank=0&prefill_cp_rank=0&target_tp_rank=1&target_pp_rank=0")
	if _, isNum := rank["rank_port"].(float64); code != http.StatusOK || !isNum {
		t.Errorf("rank 1: %d %v: rank_port must be an integer", code, rank)
	}
	if code, _ := get("/route?prefill_dp_rank=0&prefill_cp_rank=0&target_tp_rank=7&target_pp_rank=0"); code != http.StatusNotFound {
		t.Errorf("unknown rank: %d, want 404", code)
	}
	resp, err := http.Get(addr + "/health")
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Errorf("health: %v %v", resp, err)
	}
	if resp != nil {
		resp.Body.Close()
	}
}

// The DP-rank routes answer as SGLang's: POST /register_dp_rank
// {bootstrap_room, dp_rank} says OK; POST /query_dp_ranks
// {bootstrap_rooms} maps the rooms it knows, as strings, to their rank;
// a sweep every 120 s drops entries older than 120 s. Other methods get
// 405, a body without the fields 400; a rank of another DP, CP or PP
// group is 404 on GET /route.
func TestSGLangBootstrapDPRanks(t *testing.T) {
	clk := newFakeClock()
	p, _, _ := engines(t, ProtoSGLang, 1, 1, func(c *Config) { c.Clock = clk })
	addr := "http://" + p.Setup().Bootstrap
	post := func(path, body string) (int, string) {
		t.Helper()
		resp, err := http.Post(addr+path, "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, strings.TrimSpace(string(b))
	}
	const room = uint64(1<<62 + 7)
	if code, body := post("/register_dp_rank", fmt.Sprintf(`{"bootstrap_room": %d, "dp_rank": 3}`, room)); code != 200 || body != "OK" {
		t.Fatalf("register: %d %q", code, body)
	}
	clk.Advance(60 * time.Second)
	if code, body := post("/register_dp_rank", `{"bootstrap_room": "12", "dp_rank": 1}`); code != 200 || body != "OK" {
		t.Fatalf("register a room given as a string: %d %q", code, body)
	}
	query := fmt.Sprintf(`{"bootstrap_rooms": [%d, 12, 99]}`, room)
	want := func(wantBody string) {
		t.Helper()
		code, body := post("/query_dp_ranks", query)
		var got, exp map[string]int
		if err := json.Unmarshal([]byte(body), &got); err != nil || code != 200 {
			t.Fatalf("query: %d %q %v", code, body, err)
		}
		_ = json.Unmarshal([]byte(wantBody), &exp)
		if diff := cmp.Diff(exp, got); diff != "" {
			t.Errorf("at %v: %s", time.Duration(clk.Now()), diff)
		}
	}
	want(fmt.Sprintf(`{"%d": 3, "12": 1}`, room))
	// The first sweep (120 s after start) finds the first room 120 s old,
	// not older: both stay.
	clk.Advance(60 * time.Second)
	want(fmt.Sprintf(`{"%d": 3, "12": 1}`, room))
	// The second (240 s) drops both (240 and 180 s old).
	clk.Advance(120 * time.Second)
	want(`{}`)

	for _, tc := range []struct{ path, body string }{
		{"/register_dp_rank", `{"dp_rank": 1}`},
		{"/register_dp_rank", `{"bootstrap_room": -1, "dp_rank": 1}`},
		{"/register_dp_rank", `{"bootstrap_room": 1, "dp_rank": "x"}`},
		{"/register_dp_rank", `not json`},
		{"/query_dp_ranks", `{}`},
		{"/query_dp_ranks", `{"bootstrap_rooms": ["x"]}`},
	} {
		if code, body := post(tc.path, tc.body); code != http.StatusBadRequest {
			t.Errorf("%s %s: %d %q, want 400", tc.path, tc.body, code, body)
		}
	}
	for _, path := range []string{"/register_dp_rank", "/query_dp_ranks"} {
		if resp, err := http.Get(addr + path); err != nil || resp.StatusCode != http.StatusMethodNotAllowed {
			t.Errorf("GET %s: %v %v, want 405", path, resp, err)
		} else {
			resp.Body.Close()
		}
	}
	if code, _ := post("/health", ""); code != http.StatusMethodNotAllowed {
		t.Errorf("POST /health: %d, want 405", code)
	}
	for _, q := range []string{"prefill_dp_rank=1&prefill_cp_rank=0&target_tp_rank=0&target_pp_rank=0",
		"prefill_dp_rank=0&prefill_cp_rank=0&target_tp_rank=0&target_pp_rank=1"} {
		resp, err := http.Get(addr + "/route?" + q)
		if err != nil || resp.StatusCode != http.StatusNotFound {
			t.Errorf("%s: %v %v, want 404", q, resp, err)
		} else {
			resp.Body.Close()
		}
	}
}

// TestSGLangBootstrapFillsUnsetFields: SGLang's _handle_route_put takes
// kv_cache_dtype and prefill_http_port from the first registration that
// gives them, so a later rank fills what the first left null; the
// server's sizes stay the first's. kv_cache_dtype may be null but must be
// there.
func TestSGLangBootstrapFillsUnsetFields(t *testing.T) {
	t.Parallel()
	b := newSGLBootstrap(func() int64 { return 0 }, func() {})
	srv := httptest.NewServer(b.mux())
	defer srv.Close()
	put := func(rank int, extra string) int {
		t.Helper()
		body := fmt.Sprintf(`{"attn_tp_size": 3, "attn_tp_rank": %d, "attn_cp_size": 1, "attn_cp_rank": 0, "attn_dp_size": 1, "attn_dp_rank": 0, `+
			`"pp_size": 1, "pp_rank": 0, "system_dp_size": 1, "system_dp_rank": 0, "rank_ip": "10.0.0.1", "rank_port": %d, "page_size": 16%s}`,
			rank, 41000+rank, extra)
		req, _ := http.NewRequest(http.MethodPut, srv.URL+"/route", strings.NewReader(body))
		resp, err := srv.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	if code := put(0, ``); code != http.StatusBadRequest {
		t.Errorf("registration without kv_cache_dtype: %d, want 400 (SGLang reads data[\"kv_cache_dtype\"])", code)
	}
	for i, extra := range []string{`, "kv_cache_dtype": null`, `, "kv_cache_dtype": "fp8_e4m3", "prefill_http_port": 30000`,
		`, "kv_cache_dtype": "auto", "prefill_http_port": 30001`} {
		if code := put(i, extra); code != http.StatusOK {
			t.Fatalf("registration %d: %d", i, code)
		}
	}
	resp, err := srv.Client().Get(srv.URL + "/route?prefill_dp_rank=-1&prefill_cp_rank=-1&target_tp_rank=-1&target_pp_rank=-1")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var info map[string]any
	if err := json.NewDecoder(resp.Body).Decode(&info); err != nil {
		t.Fatal(err)
	}
	if info["kv_cache_dtype"] != "fp8_e4m3" || info["prefill_http_port"] != 30000.0 || info["attn_tp_size"] != 3.0 {
		t.Errorf("server info %v: want kv_cache_dtype fp8_e4m3 and prefill_http_port 30000 from the second registration", info)
	}
}

// TestSGLCompatible: SGLang decode's check of a prefill's server info
// (try_ensure_parallel_info): equal page sizes, and equal --kv-cache-dtype
// strings unless the prefill registered none.
func TestSGLCompatible(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name   string
		decode string // Config.SGLKVCacheDType after defaults
		page   int
		dtype  *string
		want   string // "" accepted
	}{
		{"both default", "auto", 16, ptr("auto"), ""},
		{"prefill registered none", "auto", 16, nil, ""},
		{"explicit on both", "bf16", 16, ptr("bf16"), ""},
		{"auto against bf16", "auto", 16, ptr("bf16"), "KV cache dtype mismatch: prefill server has kv_cache_dtype=bf16, but decode has auto"},
		{"bf16 against auto", "bf16", 16, ptr("auto"), "KV cache dtype mismatch"},
		{"page size", "auto", 32, ptr("auto"), "page size mismatch"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := &Engine{cfg: Config{Knobs: Knobs{SGLKVCacheDType: tc.decode}}, spec: kv.Spec{BlockSize: 16}}
			err := e.sglCompatible(sglPrefillInfo{PageSize: tc.page, KVCacheDType: tc.dtype})
			if (tc.want == "") != (err == nil) || (err != nil && !strings.Contains(err.Error(), tc.want)) {
				t.Errorf("got %v, want %q", err, tc.want)
			}
		})
	}
}

// Rooms set up at once against a prefill rank the decode has not met
// register its KV args there once, as SGLang's decode does (one
// _register_kv_args per connection). Run against SGLang's own bootstrap
// server, two rooms in flight sent it twice, and the second PUSH socket
// replaced the first without closing it.
func TestSGLangRegistersOnceUnderConcurrentRooms(t *testing.T) {
	p, d, _ := engines(t, ProtoSGLang, 1, 1, nil)
	addr := p.sgl.bootstrapAddr
	const n = 8
	var (
		wg    sync.WaitGroup
		start = make(chan struct{})
		mu    sync.Mutex
		fresh int
		socks = map[*sidechannel.Push]bool{}
	)
	for range n {
		wg.Go(func() {
			<-start
			push, isNew, err := d.sgl.ensureRegistered(context.Background(), addr, d.ranks[0], 0)
			if err != nil {
				t.Error(err)
				return
			}
			mu.Lock()
			defer mu.Unlock()
			socks[push] = true
			if isNew {
				fresh++
			}
		})
	}
	close(start)
	wg.Wait()
	if fresh != 1 || len(socks) != 1 {
		t.Errorf("%d concurrent rooms: %d registrations sent over %d sockets, want 1 over 1", n, fresh, len(socks))
	}
}
