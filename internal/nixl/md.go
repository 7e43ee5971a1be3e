package nixl

import (
	"encoding/binary"
	"fmt"
	"hash/crc32"
)

// Metadata is what one agent tells its peers about itself: who it is, how
// to reach it (Conn, backend-specific, e.g. a UCX worker address) and the
// memory it registered, each region with the backend's remote key.
type Metadata struct {
	Backend string
	Name    string
	Conn    []byte
	Regions []RegionMD
	Proc    Process
}

// Process identifies the process behind an agent, so that a peer on the
// same host (and in the same pid namespace) can tell when it died even if
// the transport cannot (shared memory has no notion of a peer).
type Process struct {
	Host      string // kernel boot id: equal means the same host
	PIDNS     string // pid namespace, e.g. "pid:[4026531836]"
	PID       uint32
	StartTime uint64 // clock ticks after boot (field 22 of /proc/PID/stat)
}

// RegionMD is one registered region as peers see it.
type RegionMD struct {
	Addr uint64
	Len  uint64
	Mem  MemType
	Dev  uint32
	Key  []byte // packed remote key
}

// Contains reports whether d lies inside the region.
func (r RegionMD) Contains(d Desc) bool {
	return d.Addr >= r.Addr && d.Len <= r.Len && d.Addr-r.Addr <= r.Len-d.Len
}

// Wire limits: a decoder never allocates more than the input implies.
const (
	mdMagic      = "NXMD"
	mdVersion    = 1
	maxNameLen   = 255
	maxBlobLen   = 1 << 20
	maxRegions   = 1 << 20
	mdHeaderSize = 4 + 1
)

// Encode serialises the metadata: magic, version, fields with length
// prefixes, and a CRC32 of everything before it, so truncation and
// corruption are detected rather than misread.
func (m Metadata) Encode() ([]byte, error) {
	if len(m.Name) == 0 || len(m.Name) > maxNameLen || len(m.Backend) > maxNameLen {
		return nil, fmt.Errorf("agent name must be 1..%d bytes", maxNameLen)
	}
	if len(m.Conn) > maxBlobLen || len(m.Regions) > maxRegions {
		return nil, fmt.Errorf("metadata too large")
	}
	b := make([]byte, 0, 64+len(m.Conn)+len(m.Regions)*64)
	b = append(b, mdMagic...)
	b = append(b, mdVersion)
	b = appendBlob(b, []byte(m.Backend))
	b = appendBlob(b, []byte(m.Name))
	b = appendBlob(b, m.Conn)
	if len(m.Proc.Host) > maxNameLen || len(m.Proc.PIDNS) > maxNameLen {
		return nil, fmt.Errorf("process identity too long")
	}
	b = appendBlob(b, []byte(m.Proc.Host))
	b = appendBlob(b, []byte(m.Proc.PIDNS))
	b = binary.LittleEndian.AppendUint32(b, m.Proc.PID)
	b = binary.LittleEndian.AppendUint64(b, m.Proc.StartTime)
	b = binary.LittleEndian.AppendUint32(b, uint32(len(m.Regions)))
	for _, r := range m.Regions {
		if len(r.Key) > maxBlobLen {
			return nil, fmt.Errorf("remote key too large")
		}
		b = binary.LittleEndian.AppendUint64(b, r.Addr)
		b = binary.LittleEndian.AppendUint64(b, r.Len)
		b = append(b, byte(r.Mem))
		b = binary.LittleEndian.AppendUint32(b, r.Dev)
		b = appendBlob(b, r.Key)
	}
	return binary.LittleEndian.AppendUint32(b, crc32.ChecksumIEEE(b)), nil
}

func appendBlob(b, blob []byte) []byte {
	b = binary.LittleEndian.AppendUint32(b, uint32(len(blob)))
	return append(b, blob...)
}

// DecodeMetadata parses Encode's output. Any inconsistency is an error
// wrapping ErrBadMetadata.
func DecodeMetadata(data []byte) (Metadata, error) {
	bad := func(format string, a ...any) (Metadata, error) {
		return Metadata{}, fmt.Errorf("%w: %s", ErrBadMetadata, fmt.Sprintf(format, a...))
	}
	if len(data) < mdHeaderSize+4 {
		return bad("%d bytes is too short", len(data))
	}
	if string(data[:4]) != mdMagic {
		return bad("not nixlctl agent metadata (magic %q)", data[:4])
	}
	if data[4] != mdVersion {
		return bad("version %d, this nixlctl reads version %d", data[4], mdVersion)
	}
	body, sum := data[:len(data)-4], binary.LittleEndian.Uint32(data[len(data)-4:])
	if crc32.ChecksumIEEE(body) != sum {
		return bad("checksum mismatch (truncated or corrupted)")
	}
	r := reader{b: body[mdHeaderSize:]}
	var m Metadata
	m.Backend = string(r.blob(maxNameLen))
	m.Name = string(r.blob(maxNameLen))
	m.Conn = r.blob(maxBlobLen)
	m.Proc.Host = string(r.blob(maxNameLen))
	m.Proc.PIDNS = string(r.blob(maxNameLen))
	m.Proc.PID = r.u32()
	m.Proc.StartTime = r.u64()
	n := r.u32()
	if r.err == nil && (n > maxRegions || uint64(n)*25 > uint64(len(r.b))) {
		return bad("%d regions do not fit in %d bytes", n, len(r.b))
	}
	for i := uint32(0); i < n && r.err == nil; i++ {
		var reg RegionMD
		reg.Addr = r.u64()
		reg.Len = r.u64()
		reg.Mem = MemType(r.u8())
		reg.Dev = r.u32()
		reg.Key = r.blob(maxBlobLen)
		if reg.Mem > VRAM {
			return bad("region %d: unknown memory type %d", i, reg.Mem)
		}
		if reg.Addr+reg.Len < reg.Addr {
			return bad("region %d wraps around the address space", i)
		}
		m.Regions = append(m.Regions, reg)
	}
	if r.err != nil {
		return bad("%v", r.err)
	}
	if len(r.b) != 0 {
		return bad("%d trailing bytes", len(r.b))
	}
	if m.Name == "" {
		return bad("empty agent name")
	}
	return m, nil
}

type reader struct {
	b   []byte
	err error
}

func (r *reader) take(n int) []byte {
	if r.err != nil {
		return nil
	}
	if n < 0 || n > len(r.b) {
		r.err = fmt.Errorf("truncated: need %d bytes, have %d", n, len(r.b))
		return nil
	}
	out := r.b[:n]
	r.b = r.b[n:]
	return out
}

func (r *reader) u8() uint8 {
	if b := r.take(1); b != nil {
		return b[0]
	}
	return 0
}

func (r *reader) u32() uint32 {
	if b := r.take(4); b != nil {
		return binary.LittleEndian.Uint32(b)
	}
	return 0
}

func (r *reader) u64() uint64 {
	if b := r.take(8); b != nil {
		return binary.LittleEndian.Uint64(b)
	}
	return 0
}

func (r *reader) blob(limit int) []byte {
	n := r.u32()
	if r.err == nil && int64(n) > int64(limit) {
		r.err = fmt.Errorf("field of %d bytes exceeds the limit of %d", n, limit)
		return nil
	}
	b := r.take(int(n))
	if b == nil {
		return nil
	}
	return append([]byte(nil), b...)
}
