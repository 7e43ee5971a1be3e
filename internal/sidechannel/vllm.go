package sidechannel

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"sync"
	"sync/atomic"
	"time"

	"github.com/vmihailenco/msgpack/v5"

	"github.com/nixlctl/nixlctl/internal/mono"
)

// The vLLM NIXL handshake (connector version 12): a REQ client sends
// msgpack [bin "get_meta_msg", pp_rank, tp_rank]; the engine's ROUTER
// answers two frames: a msgpack map {compatibility_hash, agent_metadata_bytes}
// and the listener's clock as a msgpack float (seconds). The client checks
// the hash before it decodes the metadata, so engines of different shapes
// refuse each other cleanly.

// GetMetaMsg opens a handshake request.
const GetMetaMsg = "get_meta_msg"

// ConnectorVersion is the vLLM NIXL connector version whose wire format
// this package speaks.
const ConnectorVersion = 12

// HandshakeTimeout is vLLM's REQ receive timeout.
const HandshakeTimeout = 5 * time.Second

// AnyHash as the wanted hash accepts any peer, as vLLM does with
// enforce_handshake_compat=false.
const AnyHash = ""

// ErrIncompatible is returned when the peer's compatibility hash differs.
var ErrIncompatible = errors.New("incompatible KV layout (compatibility hash mismatch)")

// AgentMetadata is vLLM's NixlAgentMetadata, msgpack-encoded as a map with
// vLLM's field names; nixlctl's own additions ride in Nixlctl, which
// msgspec ignores.
type AgentMetadata struct {
	EngineID                 string     `msgpack:"engine_id"`
	AgentMetadata            []byte     `msgpack:"agent_metadata"`
	KVCachesBaseAddr         []uint64   `msgpack:"kv_caches_base_addr"`
	DeviceID                 int        `msgpack:"device_id"`
	NumBlocks                int        `msgpack:"num_blocks"`
	BlockLens                []int64    `msgpack:"block_lens"`
	BlockStrides             []int64    `msgpack:"block_strides"`
	KVCacheLayout            string     `msgpack:"kv_cache_layout"`
	BlockSize                int        `msgpack:"block_size"`
	SSMSizes                 []int64    `msgpack:"ssm_sizes"`
	AttnBackendName          string     `msgpack:"attn_backend_name"`
	PhysicalBlocksPerLogical int        `msgpack:"physical_blocks_per_logical_kv_block"`
	RegionNumBlocks          []int      `msgpack:"region_num_blocks"`
	RegionGroupIDs           []int      `msgpack:"region_group_ids"`
	RegionNames              []string   `msgpack:"region_names"`
	RegionMemTypes           []string   `msgpack:"region_mem_types"`
	DCPSize                  int        `msgpack:"dcp_size"`
	PCPSize                  int        `msgpack:"pcp_size"`
	RegionMembers            [][]string `msgpack:"region_members"`
	Nixlctl                  *Extra     `msgpack:"nixlctl,omitempty"`
}

// Extra is what nixlctl's endpoints add to the handshake.
type Extra struct {
	Backend string `msgpack:"backend"`
	TPRank  int    `msgpack:"tp_rank"`
	TPSize  int    `msgpack:"tp_size"`
	PPRank  int    `msgpack:"pp_rank"`
	PPSize  int    `msgpack:"pp_size"`
	Control string `msgpack:"control,omitempty"` // where this engine's endpoint takes requests
}

// HandshakePayload is vLLM's NixlHandshakePayload.
type HandshakePayload struct {
	CompatibilityHash  string `msgpack:"compatibility_hash"`
	AgentMetadataBytes []byte `msgpack:"agent_metadata_bytes"`
}

// EncodeGetMeta builds the request frame.
func EncodeGetMeta(ppRank, tpRank int) ([]byte, error) {
	return marshalMsgspec([]any{[]byte(GetMetaMsg), ppRank, tpRank})
}

// DecodeGetMeta parses a request frame. A wrong first element is reported
// but the ranks are still returned, as vLLM's listener still answers.
func DecodeGetMeta(frame []byte) (pp, tp int, err error) {
	if err := CheckMsgpack(frame); err != nil {
		return 0, 0, fmt.Errorf("handshake request: not msgpack: %w", err)
	}
	var parts []any
	if err := msgpack.Unmarshal(frame, &parts); err != nil {
		return 0, 0, fmt.Errorf("handshake request: not a msgpack array: %w", err)
	}
	switch len(parts) {
	case 3:
	case 2: // connector v2 era: [msg, tp_rank]
		parts = []any{parts[0], int64(0), parts[1]}
	default:
		return 0, 0, fmt.Errorf("handshake request: %d elements, want [get_meta_msg, pp_rank, tp_rank]", len(parts))
	}
	pp, ok1 := AsInt(parts[1])
	tp, ok2 := AsInt(parts[2])
	if !ok1 || !ok2 || pp < 0 || tp < 0 {
		return 0, 0, fmt.Errorf("handshake request: ranks must be non-negative integers, got %v and %v", parts[1], parts[2])
	}
	var name []byte
	switch x := parts[0].(type) {
	case []byte:
		name = x
	case string:
		name = []byte(x)
	}
	if !bytes.Equal(name, []byte(GetMetaMsg)) {
		return pp, tp, fmt.Errorf("handshake request: unexpected message %q (answered anyway)", name)
	}
	return pp, tp, nil
}

// AsInt reads an integer msgpack decoded into any (its width depends on
// the value), refusing one that does not fit an int.
func AsInt(v any) (int, bool) {
	if x, ok := v.(uint64); ok {
		// AsInt has always refused a uint64 from 2^31 up (an int32's
		// range), where asInt64 takes up to 2^63-1.
		return int(x), x < 1<<31
	}
	n, ok := asInt64(v)
	return int(n), ok && n == int64(int(n))
}

// asInt64 reads any msgpack integer that fits an int64.
func asInt64(v any) (int64, bool) {
	switch x := v.(type) {
	case int8:
		return int64(x), true
	case int16:
		return int64(x), true
	case int32:
		return int64(x), true
	case int64:
		return x, true
	case uint8:
		return int64(x), true
	case uint16:
		return int64(x), true
	case uint32:
		return int64(x), true
	case uint64:
		return int64(x), x <= math.MaxInt64
	}
	return 0, false
}

// HandshakeServer answers get_meta_msg for the (pp, tp) ranks of one engine.
type HandshakeServer struct {
	router *Router
	hash   string
	mu     sync.Mutex
	ranks  map[[2]int][]byte // encoded AgentMetadata
	// served counts the handshakes answered with a rank's metadata,
	// unknown the requests for ranks this engine lacks (left unanswered).
	served, unknown atomic.Int64
}

// ServeHandshake starts the engine's side-channel ROUTER.
func ServeHandshake(ctx context.Context, endpoint, compatHash string, log *slog.Logger) (*HandshakeServer, error) {
	s := &HandshakeServer{hash: compatHash, ranks: map[[2]int][]byte{}}
	r, err := ListenRouter(ctx, endpoint, s.handle, log)
	if err != nil {
		return nil, err
	}
	s.router = r
	return s, nil
}

// Endpoint is where the engine's side channel listens.
func (s *HandshakeServer) Endpoint() string { return s.router.Endpoint() }

// Errors counts malformed requests and requests for unknown ranks.
func (s *HandshakeServer) Errors() (int, error) { return s.router.Errors() }

// Served counts the handshakes answered with a rank's metadata.
func (s *HandshakeServer) Served() int64 { return s.served.Load() }

// UnknownRanks counts the requests for ranks this engine lacks, which get
// no reply.
func (s *HandshakeServer) UnknownRanks() int64 { return s.unknown.Load() }

// Wait waits for the listener to close after its context ended.
func (s *HandshakeServer) Wait() { s.router.Wait() }

// Wire returns md as a vLLM peer must receive it. msgspec rejects null
// for a non-Optional field ("Expected array, got null") even with
// enforce_handshake_compat off, so unset lists of the required fields go
// out empty, and ssm_sizes, a tuple[int, int], as (0, 0) for a model with
// no SSM state. The four region_* lists are Optional upstream (default
// None) and stay null when unset, as a stock vLLM worker sends them: a
// peer may read an empty list as "zero regions" where null means "not
// described".
func (md AgentMetadata) Wire() AgentMetadata {
	if len(md.SSMSizes) != 2 {
		md.SSMSizes = []int64{0, 0}
	}
	if md.AgentMetadata == nil {
		md.AgentMetadata = []byte{}
	}
	if md.KVCachesBaseAddr == nil {
		md.KVCachesBaseAddr = []uint64{}
	}
	if md.BlockLens == nil {
		md.BlockLens = []int64{}
	}
	if md.BlockStrides == nil {
		md.BlockStrides = []int64{}
	}
	if md.RegionMembers == nil {
		md.RegionMembers = [][]string{}
	}
	return md
}

// marshalMsgspec encodes v as msgspec.msgpack does: every integer in its
// smallest msgpack form (msgpack's Go encoder otherwise writes int64 and
// uint64 values at full width), floats as float64, []byte as bin.
func marshalMsgspec(v any) ([]byte, error) {
	var b bytes.Buffer
	e := msgpack.NewEncoder(&b)
	e.UseCompactInts(true)
	if err := e.Encode(v); err != nil {
		return nil, err
	}
	return b.Bytes(), nil
}

// EncodeAgentMetadata encodes a rank's NixlAgentMetadata as a vLLM worker
// does (msgspec: a map of the fields in declaration order).
func EncodeAgentMetadata(md AgentMetadata) ([]byte, error) {
	md = md.Wire()
	return marshalMsgspec(&md)
}

// EncodeHandshakePayload builds the reply's first frame, the
// NixlHandshakePayload map around already encoded agent metadata.
func EncodeHandshakePayload(compatHash string, agentMetadata []byte) ([]byte, error) {
	return marshalMsgspec(&HandshakePayload{CompatibilityHash: compatHash, AgentMetadataBytes: agentMetadata})
}

// EncodeClock builds the reply's second frame: the listener's clock in
// seconds, a msgpack float64.
func EncodeClock(seconds float64) []byte {
	b, _ := marshalMsgspec(seconds) // a float always encodes
	return b
}

// Set publishes a rank's metadata.
func (s *HandshakeServer) Set(pp, tp int, md AgentMetadata) error {
	b, err := EncodeAgentMetadata(md)
	if err != nil {
		return err
	}
	s.mu.Lock()
	s.ranks[[2]int{pp, tp}] = b
	s.mu.Unlock()
	return nil
}

func (s *HandshakeServer) handle(frames [][]byte) ([][]byte, error) {
	if len(frames) != 1 {
		return nil, fmt.Errorf("handshake request of %d frames, want 1", len(frames))
	}
	pp, tp, err := DecodeGetMeta(frames[0])
	var warn error
	if err != nil {
		if pp == 0 && tp == 0 && !bytes.Contains([]byte(err.Error()), []byte("answered anyway")) {
			return nil, err
		}
		warn = err
	}
	s.mu.Lock()
	md, ok := s.ranks[[2]int{pp, tp}]
	s.mu.Unlock()
	if !ok {
		// vLLM's listener looks the rank up with encoded_data[(pp, tp)]
		// (nixl/base_scheduler.py, _nixl_handshake_listener @0050936b): a
		// rank it lacks raises and nothing is sent, so the client times
		// out. nixlctl does not answer either: an error map in place of
		// the payload made a vLLM decode report a misleading "missing
		// compatibility_hash". It counts and logs the request (the router
		// logs the returned error) and keeps serving.
		s.unknown.Add(1)
		return nil, fmt.Errorf("handshake for unknown rank pp=%d tp=%d: not answered, as vLLM's listener does not", pp, tp)
	}
	payload, err := EncodeHandshakePayload(s.hash, md)
	if err != nil {
		return nil, err
	}
	s.served.Add(1)
	return [][]byte{payload, tsFrame()}, warn
}

func tsFrame() []byte { return EncodeClock(float64(mono.Now()) / 1e9) }

// Handshake is a completed metadata exchange.
type Handshake struct {
	Meta AgentMetadata
	// ClockOffset is the peer's clock minus ours, from the midpoint of the
	// round trip (vLLM keeps the lowest-RTT sample the same way).
	ClockOffset time.Duration
	RTT         time.Duration
}

// FetchAgentMetadata performs one handshake with an engine's side channel.
func FetchAgentMetadata(ctx context.Context, endpoint string, pp, tp int, wantHash string, timeout time.Duration) (Handshake, error) {
	req, err := EncodeGetMeta(pp, tp)
	if err != nil {
		return Handshake{}, err
	}
	t0 := mono.Now()
	frames, err := Request(ctx, endpoint, [][]byte{req}, timeout)
	t1 := mono.Now()
	if err != nil {
		return Handshake{}, fmt.Errorf("handshake with %s: %w", endpoint, err)
	}
	md, remoteTS, err := DecodeHandshakeReply(frames, wantHash)
	if err != nil {
		return Handshake{}, fmt.Errorf("handshake with %s (pp %d, tp %d): %w", endpoint, pp, tp, err)
	}
	mid := float64(t0+t1) / 2 / 1e9
	return Handshake{Meta: md, RTT: time.Duration(t1 - t0), ClockOffset: time.Duration((remoteTS - mid) * 1e9)}, nil
}

// DecodeHandshakeReply checks and decodes the two reply frames: the hash
// first, the metadata only if it matches.
func DecodeHandshakeReply(frames [][]byte, wantHash string) (AgentMetadata, float64, error) {
	if len(frames) != 2 {
		return AgentMetadata{}, 0, fmt.Errorf("reply has %d frames, want 2 (payload, timestamp)", len(frames))
	}
	for i, f := range frames {
		if err := CheckMsgpack(f); err != nil {
			return AgentMetadata{}, 0, fmt.Errorf("reply frame %d: not msgpack: %w", i, err)
		}
	}
	var ts float64
	if err := msgpack.Unmarshal(frames[1], &ts); err != nil {
		return AgentMetadata{}, 0, fmt.Errorf("reply timestamp: %w", err)
	}
	var probe map[string]any
	if err := msgpack.Unmarshal(frames[0], &probe); err != nil {
		return AgentMetadata{}, 0, fmt.Errorf("reply payload: not a msgpack map: %w", err)
	}
	if e, ok := probe["error"].(string); ok {
		return AgentMetadata{}, 0, fmt.Errorf("engine refused: %s", e)
	}
	var p HandshakePayload
	if err := msgpack.Unmarshal(frames[0], &p); err != nil {
		return AgentMetadata{}, 0, fmt.Errorf("reply payload: %w", err)
	}
	if wantHash != AnyHash && p.CompatibilityHash != wantHash {
		return AgentMetadata{}, 0, fmt.Errorf("%w: ours %.12s…, theirs %.12s… (model, dtype, heads, layers, attention backend, cache dtype or transfer mode differ)",
			ErrIncompatible, wantHash, p.CompatibilityHash)
	}
	if err := CheckMsgpack(p.AgentMetadataBytes); err != nil {
		return AgentMetadata{}, 0, fmt.Errorf("agent metadata: not msgpack: %w", err)
	}
	var md AgentMetadata
	if err := msgpack.Unmarshal(p.AgentMetadataBytes, &md); err != nil {
		return AgentMetadata{}, 0, fmt.Errorf("agent metadata: %w", err)
	}
	if md.EngineID == "" || md.NumBlocks <= 0 || len(md.KVCachesBaseAddr) == 0 || len(md.KVCachesBaseAddr) != len(md.BlockLens) {
		return AgentMetadata{}, 0, fmt.Errorf("agent metadata incomplete: engine %q, %d blocks, %d base addresses, %d block lengths",
			md.EngineID, md.NumBlocks, len(md.KVCachesBaseAddr), len(md.BlockLens))
	}
	return md, ts, nil
}

// FetchRanks handshakes the given (pp, tp) ranks of one engine in order on
// one REQ socket, as vLLM's client does (itertools.product over pp ranks
// and target tp ranks, strict send/recv). Each Handshake carries its own
// RTT and clock sample; vLLM keeps the lowest-RTT one (BestClock).
func FetchRanks(ctx context.Context, endpoint string, ranks [][2]int, wantHash string, timeout time.Duration) ([]Handshake, error) {
	c, err := dialReq(endpoint)
	if err != nil {
		return nil, fmt.Errorf("handshake with %s: %w", endpoint, err)
	}
	defer c.Close()
	out := make([]Handshake, 0, len(ranks))
	for _, r := range ranks {
		req, err := EncodeGetMeta(r[0], r[1])
		if err != nil {
			return nil, err
		}
		t0 := mono.Now()
		if _, err := c.SendMessage(toAny([][]byte{req})...); err != nil {
			return nil, fmt.Errorf("handshake with %s (pp %d, tp %d): send: %w", endpoint, r[0], r[1], err)
		}
		frames, err := recvWithin(ctx, c, endpoint, timeout)
		t1 := mono.Now()
		if err != nil {
			// A REQ socket that missed its reply cannot send again.
			return nil, fmt.Errorf("handshake with %s (pp %d, tp %d): %w", endpoint, r[0], r[1], err)
		}
		md, remoteTS, err := DecodeHandshakeReply(frames, wantHash)
		if err != nil {
			return nil, fmt.Errorf("handshake with %s (pp %d, tp %d): %w", endpoint, r[0], r[1], err)
		}
		mid := float64(t0+t1) / 2 / 1e9
		out = append(out, Handshake{Meta: md, RTT: time.Duration(t1 - t0), ClockOffset: time.Duration((remoteTS - mid) * 1e9)})
	}
	return out, nil
}

// BestClock is the clock offset of the lowest-RTT handshake (zero for none).
func BestClock(hs []Handshake) time.Duration {
	best := -1
	for i, h := range hs {
		if best < 0 || h.RTT < hs[best].RTT {
			best = i
		}
	}
	if best < 0 {
		return 0
	}
	return hs[best].ClockOffset
}
