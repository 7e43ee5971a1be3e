package ec

import (
	"bytes"
	"errors"
	"fmt"
	"math"

	"github.com/vmihailenco/msgpack/v5"
	"github.com/vmihailenco/msgpack/v5/msgpcode"

	"github.com/nixlctl/nixlctl/internal/nixl"
	"github.com/nixlctl/nixlctl/internal/sidechannel"
)

// The encoder-cache (EC) control plane of vLLM's ECCPUConnector: a
// consumer's DEALER sends XferReq to the producer's ROUTER and gets one
// XferAck back. Both are msgspec tagged structs, encoded as msgpack maps
// whose first key is "type" ("req" or "ack") followed by the fields in
// declaration order, with fields equal to their default left out
// (omit_defaults). The encoders here produce the same bytes msgspec does;
// the decoders accept any key order, skip unknown keys (as msgspec does)
// and fill missing fields with their defaults.
//
// nixlctl's own additions ride as extra keys prefixed "nixlctl_", which a
// vLLM peer ignores: a request id echoed in the ack (so a late ack of a
// timed-out request is never taken for a newer one), and for the WRITE
// direction the consumer's destination blocks, agent and descriptors.

// ECConnectorVersion is EC_CONNECTOR_VERSION of the merged connector
// (2 added NACK_NOT_READY).
const ECConnectorVersion = 2

// XferStatus is the status an XferAck carries.
type Status int

// Statuses, with their wire values.
const (
	StatusOK       Status = 0
	StatusMissing  Status = 1 // the producer does not hold the mm_hash
	StatusIncompat Status = 2 // compatibility hash mismatch
	StatusVersion  Status = 3 // connector version mismatch
	StatusInternal Status = 4 // anything else, e.g. an empty session id
	StatusNotReady Status = 5 // held but still being encoded
)

var statusNames = [...]string{"OK", "MISSING", "INCOMPAT", "VERSION", "INTERNAL", "NOT_READY"}

func (s Status) String() string {
	if s >= 0 && int(s) < len(statusNames) {
		return statusNames[s]
	}
	return fmt.Sprintf("STATUS_%d", int(s))
}

// Retryable reports whether a consumer asks again later (only NOT_READY);
// every other NACK makes vLLM fall back to encoding locally.
func (s Status) Retryable() bool { return s == StatusNotReady }

// XferReq asks a producer for one encoding.
type Request struct {
	MMHash            string
	CompatibilityHash string
	SessionID         string // default ""
	ConnectorVersion  int    // default ECConnectorVersion

	// nixlctl extensions (omitted when zero).
	ReqID uint64
	// Set for the WRITE direction: the producer writes the encoding into
	// these blocks of the consumer's region, described by MemDescriptor,
	// on the agent in AgentMetadata.
	DstBlockIndices []int
	AgentMetadata   []byte
	MemDescriptor   []byte
}

// XferAck answers an XferReq.
type Ack struct {
	MMHash          string
	Status          Status
	SessionID       string // echo; default ""
	SrcBlockIndices []int  // default []
	AgentMetadata   []byte // producer's agent; default b""
	MemDescriptor   []byte // msgpack [[addr, size, dev], ...]; default b""

	// nixlctl extensions (omitted when zero).
	ReqID   uint64
	WriteNS int64 // WRITE direction: how long the producer's WRITE took
}

// Limits a decoder enforces before it allocates.
const (
	maxECIndices = 1 << 24
	maxECDescs   = 1 << 24
)

// Encode serialises the request as msgspec does.
func (r *Request) Encode() ([]byte, error) {
	w := newECWriter()
	w.str("type", "req")
	w.str("mm_hash", r.MMHash)
	w.str("compatibility_hash", r.CompatibilityHash)
	if r.SessionID != "" {
		w.str("session_id", r.SessionID)
	}
	if r.ConnectorVersion != ECConnectorVersion {
		w.int("connector_version", int64(r.ConnectorVersion))
	}
	if r.ReqID != 0 {
		w.uint("nixlctl_req_id", r.ReqID)
	}
	if len(r.DstBlockIndices) > 0 {
		w.ints("nixlctl_dst_block_indices", r.DstBlockIndices)
	}
	if len(r.AgentMetadata) > 0 {
		w.bin("nixlctl_agent_metadata", r.AgentMetadata)
	}
	if len(r.MemDescriptor) > 0 {
		w.bin("nixlctl_mem_descriptor", r.MemDescriptor)
	}
	return w.asMap()
}

// Encode serialises the ack as msgspec does.
func (a *Ack) Encode() ([]byte, error) {
	w := newECWriter()
	w.str("type", "ack")
	w.str("mm_hash", a.MMHash)
	w.int("status", int64(a.Status))
	if a.SessionID != "" {
		w.str("session_id", a.SessionID)
	}
	if len(a.SrcBlockIndices) > 0 {
		w.ints("src_block_indices", a.SrcBlockIndices)
	}
	if len(a.AgentMetadata) > 0 {
		w.bin("agent_metadata", a.AgentMetadata)
	}
	if len(a.MemDescriptor) > 0 {
		w.bin("mem_descriptor", a.MemDescriptor)
	}
	if a.ReqID != 0 {
		w.uint("nixlctl_req_id", a.ReqID)
	}
	if a.WriteNS != 0 {
		w.int("nixlctl_write_ns", a.WriteNS)
	}
	return w.asMap()
}

// ecWriter encodes a message's fields, counting them, and keeps the first
// encoding error, so the field list reads plainly: asMap puts the map
// header with that count in front.
type ecWriter struct {
	b   bytes.Buffer
	e   *msgpack.Encoder
	n   int // fields written
	err error
}

func newECWriter() *ecWriter {
	w := &ecWriter{}
	w.e = msgpack.NewEncoder(&w.b)
	return w
}

// asMap is the fields written as one msgpack map.
func (w *ecWriter) asMap() ([]byte, error) {
	var h bytes.Buffer
	w.keep(msgpack.NewEncoder(&h).EncodeMapLen(w.n))
	return append(h.Bytes(), w.b.Bytes()...), w.err
}

func (w *ecWriter) keep(err error) {
	if w.err == nil {
		w.err = err
	}
}
func (w *ecWriter) key(k string) {
	w.n++
	w.keep(w.e.EncodeString(k))
}
func (w *ecWriter) str(k, v string) {
	w.key(k)
	w.keep(w.e.EncodeString(v))
}
func (w *ecWriter) int(k string, v int64) {
	w.key(k)
	w.keep(w.e.EncodeInt(v))
}
func (w *ecWriter) uint(k string, v uint64) {
	w.key(k)
	w.keep(w.e.EncodeUint(v))
}
func (w *ecWriter) bin(k string, v []byte) {
	w.key(k)
	w.keep(w.e.EncodeBytes(v))
}
func (w *ecWriter) ints(k string, v []int) {
	w.key(k)
	w.keep(w.e.EncodeArrayLen(len(v)))
	for _, x := range v {
		w.keep(w.e.EncodeInt(int64(x)))
	}
}

// ErrWrongType is returned when a message carries the other tag.
var ErrWrongType = errors.New("wrong message type")

// DecodeXferReq parses an XferReq, applying defaults for missing fields.
func DecodeRequest(b []byte) (Request, error) {
	r := Request{ConnectorVersion: ECConnectorVersion}
	var hasHash, hasCompat bool
	err := decodeTagged(b, "req", func(d *ecReader, key string) error {
		switch key {
		case "mm_hash":
			hasHash = true
			return d.str(&r.MMHash)
		case "compatibility_hash":
			hasCompat = true
			return d.str(&r.CompatibilityHash)
		case "session_id":
			return d.str(&r.SessionID)
		case "connector_version":
			return d.int(&r.ConnectorVersion)
		case "nixlctl_req_id":
			return d.uint(&r.ReqID)
		case "nixlctl_dst_block_indices":
			return d.indices(&r.DstBlockIndices)
		case "nixlctl_agent_metadata":
			return d.bin(&r.AgentMetadata)
		case "nixlctl_mem_descriptor":
			return d.bin(&r.MemDescriptor)
		}
		return d.d.Skip()
	})
	if err != nil {
		return Request{}, fmt.Errorf("XferReq: %w", err)
	}
	if !hasHash || !hasCompat {
		return Request{}, errors.New("XferReq: missing mm_hash or compatibility_hash")
	}
	return r, nil
}

// DecodeXferAck parses an XferAck, applying defaults for missing fields.
func DecodeAck(b []byte) (Ack, error) {
	var a Ack
	var hasHash, hasStatus bool
	err := decodeTagged(b, "ack", func(d *ecReader, key string) error {
		switch key {
		case "mm_hash":
			hasHash = true
			return d.str(&a.MMHash)
		case "status":
			hasStatus = true
			var s int
			err := d.int(&s)
			a.Status = Status(s)
			return err
		case "session_id":
			return d.str(&a.SessionID)
		case "src_block_indices":
			return d.indices(&a.SrcBlockIndices)
		case "agent_metadata":
			return d.bin(&a.AgentMetadata)
		case "mem_descriptor":
			return d.bin(&a.MemDescriptor)
		case "nixlctl_req_id":
			return d.uint(&a.ReqID)
		case "nixlctl_write_ns":
			var ns int
			err := d.int(&ns)
			a.WriteNS = int64(ns)
			return err
		}
		return d.d.Skip()
	})
	if err != nil {
		return Ack{}, fmt.Errorf("XferAck: %w", err)
	}
	if !hasHash || !hasStatus {
		return Ack{}, errors.New("XferAck: missing mm_hash or status")
	}
	return a, nil
}

// decodeTagged walks a msgpack map whose "type" must equal tag, handing
// every other key to field. Trailing bytes are an error, as in msgspec.
func decodeTagged(b []byte, tag string, field func(d *ecReader, key string) error) error {
	// The decoder skips unknown fields by recursing into them: a peer's
	// value nested a few million levels deep would overflow the stack and
	// abort the process, which no recover() catches. A scan without
	// recursion refuses it first, as the vLLM side channel does.
	if err := sidechannel.CheckMsgpack(b); err != nil {
		return err
	}
	rd := bytes.NewReader(b)
	d := &ecReader{d: msgpack.NewDecoder(rd), rd: rd}
	n, err := d.d.DecodeMapLen()
	if err != nil {
		return fmt.Errorf("not a msgpack map: %w", err)
	}
	if n < 0 || n > rd.Len()/2 {
		return fmt.Errorf("map of %d entries in %d bytes", n, len(b))
	}
	seen := map[string]bool{}
	gotTag := false
	for i := 0; i < n; i++ {
		key, err := d.d.DecodeString()
		if err != nil {
			return fmt.Errorf("key %d: %w", i, err)
		}
		if seen[key] {
			return fmt.Errorf("duplicate key %q", key)
		}
		seen[key] = true
		if key == "type" {
			var t string
			if err := d.str(&t); err != nil {
				return fmt.Errorf("type: %w", err)
			}
			if t != tag {
				return fmt.Errorf("%w: type %q, want %q", ErrWrongType, t, tag)
			}
			gotTag = true
			continue
		}
		if err := field(d, key); err != nil {
			return fmt.Errorf("%s: %w", key, err)
		}
	}
	if !gotTag {
		return errors.New(`no "type" tag`)
	}
	if rd.Len() > 0 {
		return fmt.Errorf("%d trailing bytes", rd.Len())
	}
	return nil
}

type ecReader struct {
	d  *msgpack.Decoder
	rd *bytes.Reader
}

func (r *ecReader) code() (byte, error) {
	c, err := r.d.PeekCode()
	if err != nil {
		return 0, err
	}
	return c, nil
}

func (r *ecReader) str(out *string) error {
	c, err := r.code()
	if err != nil {
		return err
	}
	if !msgpcode.IsString(c) {
		return fmt.Errorf("want a string, got code %#x", c)
	}
	*out, err = r.d.DecodeString()
	return err
}

func (r *ecReader) bin(out *[]byte) error {
	c, err := r.code()
	if err != nil {
		return err
	}
	if !msgpcode.IsBin(c) {
		return fmt.Errorf("want bytes, got code %#x", c)
	}
	*out, err = r.d.DecodeBytes()
	if len(*out) == 0 {
		*out = nil // the default; an explicit b"" means the same
	}
	return err
}

func isIntCode(c byte) bool {
	return msgpcode.IsFixedNum(c) || (c >= msgpcode.Uint8 && c <= msgpcode.Uint64) || (c >= msgpcode.Int8 && c <= msgpcode.Int64)
}

func (r *ecReader) int(out *int) error {
	c, err := r.code()
	if err != nil {
		return err
	}
	if !isIntCode(c) {
		return fmt.Errorf("want an integer, got code %#x", c)
	}
	if c == msgpcode.Uint64 {
		u, err := r.d.DecodeUint64()
		if err != nil {
			return err
		}
		if u > math.MaxInt64 {
			return fmt.Errorf("integer %d out of range", u)
		}
		*out = int(u)
		return nil
	}
	v, err := r.d.DecodeInt64()
	*out = int(v)
	return err
}

func (r *ecReader) uint(out *uint64) error {
	c, err := r.code()
	if err != nil {
		return err
	}
	if !isIntCode(c) {
		return fmt.Errorf("want an integer, got code %#x", c)
	}
	if c >= msgpcode.Int8 && c <= msgpcode.Int64 || msgpcode.IsFixedNum(c) && c >= msgpcode.NegFixedNumLow {
		v, err := r.d.DecodeInt64()
		if err != nil {
			return err
		}
		if v < 0 {
			return fmt.Errorf("negative %d", v)
		}
		*out = uint64(v)
		return nil
	}
	*out, err = r.d.DecodeUint64()
	return err
}

// indices reads a list of block indices (non-negative, int32 range since
// NIXL takes C ints).
func (r *ecReader) indices(out *[]int) error {
	n, err := r.d.DecodeArrayLen()
	if err != nil {
		return err
	}
	if n < 0 || n > r.rd.Len() || n > maxECIndices {
		return fmt.Errorf("array of %d in %d bytes", n, r.rd.Len())
	}
	if n == 0 {
		*out = nil // the default; an explicit [] means the same
		return nil
	}
	v := make([]int, n)
	for i := range v {
		if err := r.int(&v[i]); err != nil {
			return fmt.Errorf("[%d]: %w", i, err)
		}
		if v[i] < 0 || v[i] > math.MaxInt32 {
			return fmt.Errorf("[%d]: block index %d out of range", i, v[i])
		}
	}
	*out = v
	return nil
}

// EncodeMemDescriptor is the per-block descriptor list peers prep their
// remote list from: msgpack [[addr, size, dev], ...], descriptor i being
// block i.
func EncodeMemDescriptor(descs []nixl.Desc) ([]byte, error) {
	w := newECWriter()
	w.keep(w.e.EncodeArrayLen(len(descs)))
	for _, d := range descs {
		w.keep(w.e.EncodeArrayLen(3))
		w.keep(w.e.EncodeUint(d.Addr))
		w.keep(w.e.EncodeUint(d.Len))
		w.keep(w.e.EncodeUint(uint64(d.Dev)))
	}
	return w.b.Bytes(), w.err
}

// DecodeMemDescriptor parses EncodeMemDescriptor's output; every
// descriptor needs a length above zero that does not wrap the address.
func DecodeMemDescriptor(b []byte) ([]nixl.Desc, error) {
	if err := sidechannel.CheckMsgpack(b); err != nil {
		return nil, fmt.Errorf("mem descriptor: %w", err)
	}
	rd := bytes.NewReader(b)
	r := &ecReader{d: msgpack.NewDecoder(rd), rd: rd}
	n, err := r.d.DecodeArrayLen()
	if err != nil {
		return nil, fmt.Errorf("mem descriptor: not a msgpack array: %w", err)
	}
	// Each entry takes at least 4 bytes ([a, s, d] as fixints).
	if n < 0 || n > rd.Len()/4 || n > maxECDescs {
		return nil, fmt.Errorf("mem descriptor: %d entries in %d bytes", n, len(b))
	}
	out := make([]nixl.Desc, n)
	for i := range out {
		m, err := r.d.DecodeArrayLen()
		if err != nil || m != 3 {
			return nil, fmt.Errorf("mem descriptor %d: want [addr, size, dev] (%v)", i, err)
		}
		var dev uint64
		if err := errors.Join(r.uint(&out[i].Addr), r.uint(&out[i].Len), r.uint(&dev)); err != nil {
			return nil, fmt.Errorf("mem descriptor %d: %w", i, err)
		}
		if out[i].Len == 0 || out[i].Addr+out[i].Len < out[i].Addr || dev > math.MaxUint32 {
			return nil, fmt.Errorf("mem descriptor %d: bad range (%#x, %d, dev %d)", i, out[i].Addr, out[i].Len, dev)
		}
		out[i].Dev = uint32(dev)
	}
	if rd.Len() > 0 {
		return nil, fmt.Errorf("mem descriptor: %d trailing bytes", rd.Len())
	}
	return out, nil
}
