package sidechannel

import (
	"fmt"
	"math"
	"sort"
	"strings"

	"github.com/vmihailenco/msgpack/v5"
)

// Reply is a vLLM handshake reply read field by field, for a probe that
// reports what a live engine sent rather than only whether a decode would
// accept it.
type Reply struct {
	CompatibilityHash string
	// PayloadBytes is the size of the first frame (NixlHandshakePayload),
	// MetadataBytes that of the NixlAgentMetadata inside it, AgentBlobBytes
	// that of the opaque NIXL agent blob inside that.
	PayloadBytes   int
	MetadataBytes  int
	AgentBlobBytes int
	// RemoteClock is the listener's time.perf_counter() in seconds.
	RemoteClock float64
	Meta        AgentMetadata
	// Unknown are NixlAgentMetadata keys that are not vLLM's (msgspec
	// ignores them), sorted.
	Unknown []string
}

// ReplyError names the field of a handshake reply that is wrong, as
// "NixlAgentMetadata.block_lens".
type ReplyError struct {
	Field string
	Err   error
}

func (e *ReplyError) Error() string { return e.Field + ": " + e.Err.Error() }
func (e *ReplyError) Unwrap() error { return e.Err }

func fieldErr(field, format string, a ...any) error {
	return &ReplyError{Field: field, Err: fmt.Errorf(format, a...)}
}

const (
	payloadType  = "NixlHandshakePayload"
	metadataType = "NixlAgentMetadata"
)

// ReadReply checks and decodes the two frames a vLLM side channel answers
// get_meta_msg with, the way msgspec would on the decode side (required
// fields present, types exact, no null where vLLM's type is not Optional)
// plus the consistency a decode relies on (one block length per region,
// positive sizes). It never panics on a peer's bytes: every problem is an
// error naming the frame or field.
func ReadReply(frames [][]byte) (Reply, error) {
	var r Reply
	if len(frames) != 2 {
		return r, fieldErr("reply", "%d frames, want 2 (payload, timestamp)", len(frames))
	}
	ts, err := decodeValue(frames[1])
	if err != nil {
		return r, fieldErr("timestamp", "%v", err)
	}
	switch x := ts.(type) {
	case float64:
		r.RemoteClock = x
	case float32:
		r.RemoteClock = float64(x)
	default:
		if n, ok := asInt64(ts); ok {
			r.RemoteClock = float64(n)
		} else {
			return r, fieldErr("timestamp", "want a float (the listener's perf_counter), got %s", typeName(ts))
		}
	}
	if math.IsNaN(r.RemoteClock) || math.IsInf(r.RemoteClock, 0) {
		return r, fieldErr("timestamp", "%v is not a clock reading", r.RemoteClock)
	}
	r.PayloadBytes = len(frames[0])
	pv, err := decodeValue(frames[0])
	if err != nil {
		return r, fieldErr(payloadType, "%v", err)
	}
	payload, ok := pv.(map[string]any)
	if !ok {
		return r, fieldErr(payloadType, "want a map, got %s", typeName(pv))
	}
	if e, ok := payload["error"].(string); ok && len(payload) == 1 {
		// nixlctl's own engines answer an unknown rank this way.
		return r, fmt.Errorf("engine refused: %s", e)
	}
	f := fields{m: payload, typ: payloadType}
	r.CompatibilityHash = f.str("compatibility_hash", true)
	mdBytes := f.bin("agent_metadata_bytes", true)
	if f.err != nil {
		return r, f.err
	}
	r.MetadataBytes = len(mdBytes)
	mv, err := decodeValue(mdBytes)
	if err != nil {
		return r, fieldErr(payloadType+".agent_metadata_bytes", "%v", err)
	}
	mm, ok := mv.(map[string]any)
	if !ok {
		return r, fieldErr(metadataType, "want a map, got %s", typeName(mv))
	}
	r.Meta, r.Unknown, err = readMetadata(mm)
	r.AgentBlobBytes = len(r.Meta.AgentMetadata)
	return r, err
}

// vllmMetadataFields are NixlAgentMetadata's fields (connector version 12).
var vllmMetadataFields = []string{"engine_id", "agent_metadata", "kv_caches_base_addr", "device_id", "num_blocks",
	"block_lens", "block_strides", "kv_cache_layout", "block_size", "ssm_sizes", "attn_backend_name",
	"physical_blocks_per_logical_kv_block", "region_num_blocks", "region_group_ids", "region_names",
	"region_mem_types", "dcp_size", "pcp_size", "region_members"}

func readMetadata(m map[string]any) (AgentMetadata, []string, error) {
	f := fields{m: m, typ: metadataType}
	var md AgentMetadata
	md.EngineID = f.str("engine_id", true)
	md.AgentMetadata = f.bin("agent_metadata", true)
	md.KVCachesBaseAddr = f.addrs("kv_caches_base_addr")
	md.DeviceID = f.int("device_id", true, math.MinInt32, 0) // vLLM puts no bound on it
	md.NumBlocks = f.int("num_blocks", true, 1, 0)
	md.BlockLens = f.ints64("block_lens", true, 1)
	md.BlockStrides = f.ints64("block_strides", true, 0)
	md.KVCacheLayout = f.str("kv_cache_layout", true)
	md.BlockSize = f.int("block_size", true, 1, 0)
	md.SSMSizes = f.ints64("ssm_sizes", true, 0)
	md.AttnBackendName = f.str("attn_backend_name", true)
	md.PhysicalBlocksPerLogical = f.int("physical_blocks_per_logical_kv_block", true, 1, 1)
	md.RegionNumBlocks = f.intsOpt("region_num_blocks", 0)
	md.RegionGroupIDs = f.intsOpt("region_group_ids", 0)
	md.RegionNames = f.strsOpt("region_names")
	md.RegionMemTypes = f.strsOpt("region_mem_types")
	md.DCPSize = f.int("dcp_size", false, 1, 1)
	md.PCPSize = f.int("pcp_size", false, 1, 1)
	md.RegionMembers = f.members("region_members")
	if x, ok := m["nixlctl"].(map[string]any); ok {
		// nixlctl's own engines say more; a wrong extension is ignored
		// like any other unknown key.
		b, _ := msgpack.Marshal(x)
		var e Extra
		if msgpack.Unmarshal(b, &e) == nil {
			md.Nixlctl = &e
		}
	}
	if f.err != nil {
		return md, nil, f.err
	}
	// What a decode relies on beyond the types.
	regions := len(md.KVCachesBaseAddr)
	switch {
	case regions == 0:
		return md, nil, fieldErr(metadataType+".kv_caches_base_addr", "empty: the engine registered no KV regions")
	case len(md.AgentMetadata) == 0:
		return md, nil, fieldErr(metadataType+".agent_metadata", "empty: no NIXL agent blob to load")
	case md.EngineID == "":
		return md, nil, fieldErr(metadataType+".engine_id", "empty")
	case md.KVCacheLayout != "HND" && md.KVCacheLayout != "NHD":
		return md, nil, fieldErr(metadataType+".kv_cache_layout", "%q, want HND or NHD", md.KVCacheLayout)
	case len(md.SSMSizes) != 2:
		return md, nil, fieldErr(metadataType+".ssm_sizes", "%d elements, want 2 (conv bytes, ssm bytes)", len(md.SSMSizes))
	}
	for _, l := range []struct {
		name      string
		n         int
		emptyOK   bool
		mustEqual bool
	}{
		{"block_lens", len(md.BlockLens), false, true},
		{"block_strides", len(md.BlockStrides), true, true},
		{"region_num_blocks", len(md.RegionNumBlocks), true, true},
		{"region_group_ids", len(md.RegionGroupIDs), true, true},
		{"region_names", len(md.RegionNames), true, true},
		{"region_mem_types", len(md.RegionMemTypes), true, true},
		{"region_members", len(md.RegionMembers), true, true},
	} {
		if l.n != regions && !(l.emptyOK && l.n == 0) {
			return md, nil, fieldErr(metadataType+"."+l.name, "%d entries for %d regions (kv_caches_base_addr)", l.n, regions)
		}
	}
	known := map[string]bool{}
	for _, k := range vllmMetadataFields {
		known[k] = true
	}
	var unknown []string
	for k := range m {
		if !known[k] {
			unknown = append(unknown, k)
		}
	}
	sort.Strings(unknown)
	return md, unknown, nil
}

// decodeValue decodes one msgpack value after checking its shape, so
// that no input can make the decoder recurse without bound.
func decodeValue(b []byte) (any, error) {
	if len(b) == 0 {
		return nil, fmt.Errorf("empty frame")
	}
	if err := scanMsgpack(b, maxReplyDepth); err != nil {
		return nil, fmt.Errorf("not msgpack: %w", err)
	}
	var v any
	if err := msgpack.Unmarshal(b, &v); err != nil {
		// Well formed but not what msgspec writes (a map with non-string
		// keys, say).
		return nil, fmt.Errorf("not decodable: %w", err)
	}
	return v, nil
}

// fields reads typed fields from a decoded msgpack map, keeping the first
// error.
type fields struct {
	m   map[string]any
	typ string
	err error
}

func (f *fields) fail(name, format string, a ...any) {
	if f.err == nil {
		f.err = fieldErr(f.typ+"."+name, format, a...)
	}
}

// get returns the field; a missing required field or a null in a
// non-Optional one is an error, as msgspec makes it.
func (f *fields) get(name string, required bool) (any, bool) {
	v, ok := f.m[name]
	if !ok {
		if required {
			f.fail(name, "missing (a required field of vLLM's %s)", f.typ)
		}
		return nil, false
	}
	if v == nil {
		f.fail(name, "null (vLLM's type is not Optional, msgspec rejects it)")
		return nil, false
	}
	return v, true
}

func (f *fields) str(name string, required bool) string {
	v, ok := f.get(name, required)
	if !ok {
		return ""
	}
	s, isStr := v.(string)
	if !isStr {
		f.fail(name, "want str, got %s", typeName(v))
	}
	return s
}

func (f *fields) bin(name string, required bool) []byte {
	v, ok := f.get(name, required)
	if !ok {
		return nil
	}
	b, isBin := v.([]byte)
	if !isBin {
		f.fail(name, "want bin (Python bytes), got %s", typeName(v))
	}
	return b
}

// int reads an integer of at least lo (hi 0: no upper bound); def is the
// value of an absent optional field.
func (f *fields) int(name string, required bool, lo, def int) int {
	v, ok := f.get(name, required)
	if !ok {
		return def
	}
	n, isInt := asInt64(v)
	if !isInt {
		f.fail(name, "want int, got %s", typeName(v))
		return def
	}
	if n < int64(lo) || n > math.MaxInt32 {
		if lo == math.MinInt32 {
			f.fail(name, "%d out of range (a 32-bit int)", n)
		} else {
			f.fail(name, "%d out of range (want %d..%d)", n, lo, math.MaxInt32)
		}
		return def
	}
	return int(n)
}

// elems reads v, which must be an array (field name), an element at a
// time by conv, which names a bad element as elem ("name[i]") and says
// whether it was good; nil at the first bad one.
func elems[T any](f *fields, name string, v any, conv func(elem string, e any) (T, bool)) []T {
	a, ok := v.([]any)
	if !ok {
		f.fail(name, "want array, got %s", typeName(v))
		return nil
	}
	out := make([]T, 0, len(a))
	for i, e := range a {
		x, ok := conv(fmt.Sprintf("%s[%d]", name, i), e)
		if !ok {
			return nil
		}
		out = append(out, x)
	}
	return out
}

func (f *fields) ints64(name string, required bool, lo int64) []int64 {
	v, ok := f.get(name, required)
	if !ok {
		return nil
	}
	return elems(f, name, v, func(elem string, e any) (int64, bool) {
		n, isInt := asInt64(e)
		if !isInt {
			f.fail(elem, "want int, got %s", typeName(e))
			return 0, false
		}
		if n < lo {
			f.fail(elem, "%d, want >= %d", n, lo)
			return 0, false
		}
		return n, true
	})
}

// addrs reads kv_caches_base_addr: addresses up to 2^64-1.
func (f *fields) addrs(name string) []uint64 {
	v, ok := f.get(name, true)
	if !ok {
		return nil
	}
	return elems(f, name, v, func(elem string, e any) (uint64, bool) {
		if x, ok := e.(uint64); ok {
			return x, true
		}
		n, isInt := asInt64(e)
		if !isInt || n < 0 {
			f.fail(elem, "want an address (int >= 0), got %s", describe(e))
			return 0, false
		}
		return uint64(n), true
	})
}

// intsOpt reads a list[int] | None field.
func (f *fields) intsOpt(name string, lo int64) []int {
	if v, ok := f.m[name]; !ok || v == nil {
		return nil
	}
	ns := f.ints64(name, false, lo)
	out := make([]int, 0, len(ns))
	for i, n := range ns {
		if n > math.MaxInt32 {
			f.fail(fmt.Sprintf("%s[%d]", name, i), "%d out of range", n)
			return nil
		}
		out = append(out, int(n))
	}
	return out
}

func (f *fields) strsIn(name string, v any) []string {
	return elems(f, name, v, func(elem string, e any) (string, bool) {
		s, isStr := e.(string)
		if !isStr {
			f.fail(elem, "want str, got %s", typeName(e))
		}
		return s, isStr
	})
}

// strsOpt reads a list[str] | None field.
func (f *fields) strsOpt(name string) []string {
	v, ok := f.m[name]
	if !ok || v == nil {
		return nil
	}
	return f.strsIn(name, v)
}

// members reads region_members, a list[list[str]] defaulting to [].
func (f *fields) members(name string) [][]string {
	v, ok := f.get(name, false)
	if !ok {
		return nil
	}
	return elems(f, name, v, func(elem string, e any) ([]string, bool) {
		s := f.strsIn(elem, e)
		return s, f.err == nil
	})
}

// typeName is the msgpack type of a decoded value, in msgspec's words.
func typeName(v any) string {
	switch v.(type) {
	case nil:
		return "null"
	case bool:
		return "bool"
	case string:
		return "str"
	case []byte:
		return "bin"
	case float32, float64:
		return "float"
	case []any:
		return "array"
	case map[string]any:
		return "map"
	}
	if _, ok := asInt64(v); ok {
		return "int"
	}
	if _, ok := v.(uint64); ok {
		return "int"
	}
	return "ext"
}

func describe(v any) string {
	if n, ok := asInt64(v); ok {
		return fmt.Sprint(n)
	}
	return typeName(v)
}

// ShortHash is a hash cut for a table ("c5d032bc3fab…").
func ShortHash(h string) string {
	if len(h) > 12 {
		return h[:12] + "…"
	}
	return strings.TrimSpace(h)
}
