package engine

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/nixlctl/nixlctl/internal/sidechannel"
)

// SGLang's bootstrap server (CommonKVBootstrapServer in
// disaggregation/common/conn.py @0094505d), answered as SGLang answers:
//
//	PUT  /route            a prefill rank registers; "OK"
//	GET  /route            all four parameters -1: PrefillServerInfo (503
//	                       until dp×cp×tp×pp registrations arrived); else
//	                       that rank's {rank_ip, rank_port} (503, then 404)
//	POST /register_dp_rank {bootstrap_room, dp_rank}; "OK"
//	POST /query_dp_ranks   {bootstrap_rooms: [...]} -> {"<room>": dp_rank}
//	                       for the rooms it knows
//	GET  /health           "OK"
//
// A room's DP rank is forgotten by a sweep every sglDPRankTTL that drops
// entries older than sglDPRankTTL (so after 120 to 240 s), as SGLang's
// _cleanup_expired_entries does. Where SGLang answers a malformed body with
// 500 (an exception in its handler), this one says 400 and why.

// sglDPRankTTL is SGLANG_DISAGGREGATION_BOOTSTRAP_ENTRY_CLEANUP_INTERVAL's
// default.
const sglDPRankTTL = 120 * time.Second

// sglBootstrap is the bootstrap server's state.
type sglBootstrap struct {
	now       func() int64
	malformed func()

	mu         sync.Mutex
	info       *sglPrefillInfo         // from the first registration
	table      map[[4]int]sglRankEntry // (dp group, cp, tp, pp) -> rank
	registered int                     // PUTs, as SGLang counts them
	rooms      map[uint64]sglDPRoom
	nextSweep  int64
}

type sglDPRoom struct {
	dpRank int
	at     int64
}

func newSGLBootstrap(now func() int64, malformed func()) *sglBootstrap {
	return &sglBootstrap{now: now, malformed: malformed, table: map[[4]int]sglRankEntry{}, rooms: map[uint64]sglDPRoom{},
		nextSweep: now() + int64(sglDPRankTTL)}
}

func (b *sglBootstrap) mux() *http.ServeMux {
	mux := http.NewServeMux()
	mux.HandleFunc("/route", b.route)
	mux.HandleFunc("/register_dp_rank", b.registerDPRank)
	mux.HandleFunc("/query_dp_ranks", b.queryDPRanks)
	mux.HandleFunc("/health", b.health)
	return mux
}

// sglRegistration is a prefill rank's PUT /route body.
type sglRegistration struct {
	AttnTPSize   *int         `json:"attn_tp_size"`
	AttnTPRank   *int         `json:"attn_tp_rank"`
	AttnCPSize   *int         `json:"attn_cp_size"`
	AttnCPRank   *int         `json:"attn_cp_rank"`
	AttnDPSize   *int         `json:"attn_dp_size"`
	AttnDPRank   *int         `json:"attn_dp_rank"`
	PPSize       *int         `json:"pp_size"`
	PPRank       *int         `json:"pp_rank"`
	SystemDPSize *int         `json:"system_dp_size"`
	SystemDPRank *int         `json:"system_dp_rank"`
	RankIP       *string      `json:"rank_ip"`
	RankPort     *int         `json:"rank_port"`
	PageSize     *int         `json:"page_size"`
	KVCacheDType sglOptString `json:"kv_cache_dtype"` // required, may be null
	// Optional in SGLang's handler.
	LoadBalanceMethod        *string `json:"load_balance_method"`
	EnableDSACacheLayerSplit bool    `json:"enable_dsa_cache_layer_split"`
	PrefillHTTPPort          *int    `json:"prefill_http_port"`
}

// sglOptString is a key SGLang's handler reads as data[key] (so it must be
// there) whose value may be null (PrefillServerInfo's Optional[str]).
type sglOptString struct {
	present bool
	v       *string
}

func (o *sglOptString) UnmarshalJSON(b []byte) error {
	o.present = true
	return json.Unmarshal(b, &o.v)
}

func (r sglRegistration) check() error {
	for name, v := range map[string]*int{"attn_tp_size": r.AttnTPSize, "attn_tp_rank": r.AttnTPRank, "attn_cp_size": r.AttnCPSize,
		"attn_cp_rank": r.AttnCPRank, "attn_dp_size": r.AttnDPSize, "attn_dp_rank": r.AttnDPRank, "pp_size": r.PPSize,
		"pp_rank": r.PPRank, "system_dp_size": r.SystemDPSize, "system_dp_rank": r.SystemDPRank, "rank_port": r.RankPort,
		"page_size": r.PageSize} {
		if v == nil {
			return fmt.Errorf("%s missing", name)
		}
		if *v < 0 || *v > 1<<20 {
			return fmt.Errorf("%s %d out of range", name, *v)
		}
	}
	if r.RankIP == nil || *r.RankIP == "" {
		return fmt.Errorf("rank_ip missing")
	}
	if !r.KVCacheDType.present {
		return fmt.Errorf("kv_cache_dtype missing")
	}
	if *r.RankPort == 0 || *r.RankPort > 65535 {
		return fmt.Errorf("rank_port %d out of range", *r.RankPort)
	}
	return nil
}

func (b *sglBootstrap) bad(w http.ResponseWriter, format string, a ...any) {
	b.malformed()
	http.Error(w, fmt.Sprintf(format, a...), http.StatusBadRequest)
}

func (b *sglBootstrap) route(w http.ResponseWriter, r *http.Request) {
	switch r.Method {
	case http.MethodPut:
		b.putRoute(w, r)
	case http.MethodGet:
		b.getRoute(w, r)
	default:
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusMethodNotAllowed)
		_, _ = w.Write([]byte("Method not allowed"))
	}
}

func (b *sglBootstrap) putRoute(w http.ResponseWriter, r *http.Request) {
	var reg sglRegistration
	if err := json.NewDecoder(http.MaxBytesReader(w, r.Body, 1<<16)).Decode(&reg); err != nil {
		b.bad(w, "bad registration: %v", err)
		return
	}
	if err := reg.check(); err != nil {
		b.bad(w, "bad registration: %v", err)
		return
	}
	dp := *reg.SystemDPSize
	group := *reg.SystemDPRank
	if dp == 1 {
		dp, group = *reg.AttnDPSize, *reg.AttnDPRank
	}
	b.mu.Lock()
	if b.info == nil {
		// The first registration describes the server's sizes, its load
		// balancing and DSA split, as in SGLang.
		follow := reg.LoadBalanceMethod == nil || *reg.LoadBalanceMethod == "follow_bootstrap_room"
		b.info = &sglPrefillInfo{AttnTPSize: *reg.AttnTPSize, AttnCPSize: *reg.AttnCPSize, DPSize: dp, PPSize: *reg.PPSize,
			PageSize: *reg.PageSize, FollowBootstrapRoom: follow, EnableDSACacheLayerSplit: reg.EnableDSACacheLayerSplit}
	}
	// kv_cache_dtype and prefill_http_port are Optional: SGLang's
	// _handle_route_put (common/conn.py CommonKVBootstrapServer @0094505d)
	// takes each from the first registration that gives one ("if
	// self.x is None and x is not None"), so a later rank fills what an
	// earlier one left null.
	if b.info.KVCacheDType == nil && reg.KVCacheDType.v != nil {
		b.info.KVCacheDType = reg.KVCacheDType.v
	}
	if b.info.PrefillHTTPPort == nil && reg.PrefillHTTPPort != nil {
		b.info.PrefillHTTPPort = reg.PrefillHTTPPort
	}
	b.table[[4]int{group, *reg.AttnCPRank, *reg.AttnTPRank, *reg.PPRank}] = sglRankEntry{RankIP: *reg.RankIP, RankPort: *reg.RankPort}
	b.registered++
	b.mu.Unlock()
	_, _ = w.Write([]byte("OK"))
}

// readyLocked: every dp×cp×tp×pp rank registered.
func (b *sglBootstrap) readyLocked() bool {
	i := b.info
	return i != nil && b.registered >= i.DPSize*i.AttnCPSize*i.AttnTPSize*i.PPSize
}

func (b *sglBootstrap) getRoute(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	var key [4]int
	for i, p := range sglRouteParams {
		if q.Get(p) == "" {
			http.Error(w, "Missing inputs for bootstrap server.", http.StatusBadRequest)
			return
		}
		n, err := strconv.Atoi(q.Get(p))
		if err != nil {
			b.bad(w, "%s %q is not an integer", p, q.Get(p))
			return
		}
		key[i] = n
	}
	b.mu.Lock()
	ready, registered := b.readyLocked(), b.registered
	var info sglPrefillInfo
	if b.info != nil {
		info = *b.info
	}
	entry, found := b.table[key]
	b.mu.Unlock()
	if !ready {
		http.Error(w, fmt.Sprintf("Prefill server not fully registered yet (%d workers registered).", registered), http.StatusServiceUnavailable)
		return
	}
	if key == [4]int{-1, -1, -1, -1} {
		writePyJSON(w, info.pyDict())
		return
	}
	if !found {
		http.Error(w, fmt.Sprintf("Bootstrap info not found for dp_rank=%d cp_rank=%d tp_rank=%d pp_rank=%d", key[0], key[1], key[2], key[3]),
			http.StatusNotFound)
		return
	}
	writePyJSON(w, entry.pyDict())
}

// writePyJSON answers as aiohttp's web.json_response does: json.dumps with
// its default separators (", ", ": "), keys in the dict's order, no
// trailing newline.
func writePyJSON(w http.ResponseWriter, d sidechannel.PyDict) {
	body, err := sidechannel.PyJSON(d)
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/json; charset=utf-8")
	_, _ = w.Write([]byte(body))
}

// postOnly answers a non-POST with 405, as aiohttp's add_post does.
func postOnly(w http.ResponseWriter, r *http.Request) bool {
	if r.Method == http.MethodPost {
		return true
	}
	w.Header().Set("Allow", http.MethodPost)
	http.Error(w, "405: Method Not Allowed", http.StatusMethodNotAllowed)
	return false
}

// parseSGLRoom reads a bootstrap room as SGLang's int() does: a JSON integer or
// a string of one. Rooms are 63-bit.
func parseSGLRoom(raw json.RawMessage) (uint64, error) {
	var n json.Number
	if err := json.Unmarshal(raw, &n); err != nil {
		var s string
		if json.Unmarshal(raw, &s) != nil {
			return 0, fmt.Errorf("room %s is not an integer", raw)
		}
		n = json.Number(s)
	}
	room, err := strconv.ParseUint(string(n), 10, 63)
	if err != nil {
		return 0, fmt.Errorf("room %s is not a 63-bit integer", raw)
	}
	return room, nil
}

// sweepLocked drops DP-rank entries the way SGLang's periodic sweep would
// have by now: at the latest sweep tick, every entry older than the TTL.
func (b *sglBootstrap) sweepLocked(now int64) {
	if now < b.nextSweep {
		return
	}
	ttl := int64(sglDPRankTTL)
	tick := b.nextSweep + (now-b.nextSweep)/ttl*ttl
	for room, e := range b.rooms {
		if tick-e.at > ttl {
			delete(b.rooms, room)
		}
	}
	b.nextSweep = tick + ttl
}

func (b *sglBootstrap) registerDPRank(w http.ResponseWriter, r *http.Request) {
	if !postOnly(w, r) {
		return
	}
	var body struct {
		Room   json.RawMessage `json:"bootstrap_room"`
		DPRank *json.Number    `json:"dp_rank"`
	}
	if err := json.NewDecoder(http.MaxBytesReader(w, r.Body, 1<<16)).Decode(&body); err != nil {
		b.bad(w, "bad body: %v", err)
		return
	}
	if body.Room == nil || body.DPRank == nil {
		b.bad(w, "want {bootstrap_room, dp_rank}")
		return
	}
	room, err := parseSGLRoom(body.Room)
	if err != nil {
		b.bad(w, "bootstrap_room: %v", err)
		return
	}
	dp, err := strconv.Atoi(body.DPRank.String())
	if err != nil || dp < 0 || dp > 1<<20 {
		b.bad(w, "dp_rank %s is not a rank", body.DPRank.String())
		return
	}
	b.mu.Lock()
	now := b.now()
	b.sweepLocked(now)
	b.rooms[room] = sglDPRoom{dpRank: dp, at: now}
	b.mu.Unlock()
	_, _ = w.Write([]byte("OK"))
}

// sglMaxQueryRooms bounds one /query_dp_ranks (decode batches its rooms).
const sglMaxQueryRooms = 1 << 16

func (b *sglBootstrap) queryDPRanks(w http.ResponseWriter, r *http.Request) {
	if !postOnly(w, r) {
		return
	}
	var body struct {
		Rooms *[]json.RawMessage `json:"bootstrap_rooms"`
	}
	if err := json.NewDecoder(http.MaxBytesReader(w, r.Body, 4<<20)).Decode(&body); err != nil {
		b.bad(w, "bad body: %v", err)
		return
	}
	if body.Rooms == nil || len(*body.Rooms) > sglMaxQueryRooms {
		b.bad(w, "want {bootstrap_rooms: [room, ...]} (at most %d)", sglMaxQueryRooms)
		return
	}
	rooms := make([]uint64, 0, len(*body.Rooms))
	for _, raw := range *body.Rooms {
		room, err := parseSGLRoom(raw)
		if err != nil {
			b.bad(w, "bootstrap_rooms: %v", err)
			return
		}
		rooms = append(rooms, room)
	}
	// SGLang fills its result dict in the order of the rooms asked for.
	var out sidechannel.PyDict
	seen := map[uint64]bool{}
	b.mu.Lock()
	b.sweepLocked(b.now())
	for _, room := range rooms {
		if e, ok := b.rooms[room]; ok && !seen[room] {
			seen[room] = true
			out = append(out, sidechannel.PyItem{Key: strconv.FormatUint(room, 10), Value: e.dpRank})
		}
	}
	b.mu.Unlock()
	writePyJSON(w, out)
}

// health is aiohttp's add_get: GET and HEAD.
func (b *sglBootstrap) health(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		w.Header().Set("Allow", "GET, HEAD")
		http.Error(w, "405: Method Not Allowed", http.StatusMethodNotAllowed)
		return
	}
	_, _ = w.Write([]byte("OK"))
}
