package capi

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"hash/crc32"

	"github.com/nixlctl/nixlctl/internal/nixl"
)

// NIXL's agent metadata is a chain of fields in its "serdes" format:
//
//	"nixlSerDes|" then, per field: tag, 8-byte little-endian length, data, "|"
//
// holding the agent name, one connection blob per backend (for UCX, the
// worker address) and the registered memory, per backend and memory type,
// as descriptors of (addr, len, devId) followed by the backend's key.
//
// NIXL parses it with few checks and hands the backend's parts straight
// to UCX, which trusts them; a truncated or corrupted blob can make it
// misread lengths or give UCX garbage. So the backend parses the whole blob
// here first and passes on only one that is consistent from end to end.
// This is a check, not a reimplementation: NIXL still does the loading.
//
// A check of the structure cannot see a flipped byte inside UCX's own
// parts, and UCX aborts the process on some of those (an address version
// it does not know, an rkey whose map names more keys than it holds). So
// nixlctl seals the metadata it hands out: NIXL's blob, unchanged, then a
// trailer of sealMagic and a CRC32 of the blob. NIXL reads its fields in
// order and ignores what follows them, so any NIXL agent loads a sealed
// blob as it is; nixlctl agents check the CRC and give NIXL only the blob.
// Blobs from other NIXL programs have no seal and get the structural check.

const (
	sealMagic = "NXCTLMD1"
	sealSize  = len(sealMagic) + 4
)

// seal appends the trailer to a blob NIXL produced.
func seal(blob []byte) []byte {
	out := make([]byte, 0, len(blob)+sealSize)
	out = append(out, blob...)
	out = append(out, sealMagic...)
	return binary.LittleEndian.AppendUint32(out, crc32.ChecksumIEEE(blob))
}

// unseal returns the NIXL blob inside md after checking its trailer, or
// md itself when it has none.
func unseal(md []byte) ([]byte, error) {
	n := len(md) - sealSize
	if n < len(serdesMagic) || string(md[n:n+len(sealMagic)]) != sealMagic {
		return md, nil
	}
	blob := md[:n]
	if crc32.ChecksumIEEE(blob) != binary.LittleEndian.Uint32(md[n+len(sealMagic):]) {
		return nil, badMD("checksum mismatch (corrupted in transit or storage)")
	}
	return blob, nil
}

// nixlMD is what the check learns from a metadata blob.
type nixlMD struct {
	Agent    string
	Conns    []nixlConn
	Sections []nixlSection
}

type nixlConn struct {
	Backend string
	Info    []byte
}

type nixlSection struct {
	Backend string
	Mem     uint32 // nixl_mem_t: DRAM 0, VRAM 1, BLK 2, OBJ 3, FILE 4
	Descs   []nixlRegDesc
}

type nixlRegDesc struct {
	Addr, Len, Dev uint64
	Key            []byte // the backend's part, for UCX a packed rkey
}

const (
	serdesMagic = "nixlSerDes|"
	// nixlBasicDesc is uintptr_t addr, size_t len, uint64_t devId.
	basicDescSize = 24
	maxMemType    = 4
)

// parseNIXLMD checks a metadata blob as NIXL 1.4.0 writes it. Every error
// wraps nixl.ErrBadMetadata.
func parseNIXLMD(b []byte) (nixlMD, error) {
	var md nixlMD
	if !bytes.HasPrefix(b, []byte(serdesMagic)) {
		n := min(len(b), len(serdesMagic))
		return md, badMD("not NIXL agent metadata (starts with %q)", b[:n])
	}
	r := &serdes{b: b, off: len(serdesMagic)}
	md.Agent = string(r.str("Agent"))
	if r.err == nil && md.Agent == "" {
		return md, badMD("empty agent name")
	}
	nConns := r.count("Conns")
	for i := uint64(0); i < nConns && r.err == nil; i++ {
		c := nixlConn{Backend: string(r.str("t")), Info: r.str("c")}
		if r.err == nil && (c.Backend == "" || len(c.Info) == 0) {
			return md, badMD("connection %d of %s is empty", i, md.Agent)
		}
		md.Conns = append(md.Conns, c)
	}
	if s := r.str(""); r.err == nil && string(s) != "MemSection" {
		return md, badMD("no memory section after the connections (found %q)", s)
	}
	nSecs := r.count("nixlSecElms")
	for i := uint64(0); i < nSecs && r.err == nil; i++ {
		sec := nixlSection{Backend: string(r.str("bknd"))}
		if r.err == nil && sec.Backend == "" {
			return md, badMD("memory section %d has no backend", i)
		}
		if kind := r.str("nixlDList"); r.err == nil && string(kind) != "nixlSDList" {
			return md, badMD("memory section %d is a %q, not a registration list", i, kind)
		}
		mem := r.buf("t", 4)
		n := r.count("n")
		if r.err != nil {
			break
		}
		sec.Mem = binary.LittleEndian.Uint32(mem)
		if sec.Mem > maxMemType {
			return md, badMD("memory section %d has unknown memory type %d", i, sec.Mem)
		}
		for j := uint64(0); j < n && r.err == nil; j++ {
			d := r.str("")
			if r.err != nil {
				break
			}
			if len(d) < basicDescSize {
				return md, badMD("descriptor %d of section %d is %d bytes, less than %d", j, i, len(d), basicDescSize)
			}
			desc := nixlRegDesc{
				Addr: binary.LittleEndian.Uint64(d[0:]),
				Len:  binary.LittleEndian.Uint64(d[8:]),
				Dev:  binary.LittleEndian.Uint64(d[16:]),
				Key:  d[basicDescSize:],
			}
			if desc.Len == 0 || desc.Addr+desc.Len < desc.Addr {
				return md, badMD("descriptor %d of section %d (%#x+%d) is empty or wraps around", j, i, desc.Addr, desc.Len)
			}
			sec.Descs = append(sec.Descs, desc)
		}
		if r.err == nil && len(sec.Descs) == 0 {
			return md, badMD("memory section %d has no descriptors", i)
		}
		md.Sections = append(md.Sections, sec)
	}
	if r.err != nil {
		return md, badMD("%v", r.err)
	}
	if r.off != len(b) {
		return md, badMD("%d bytes after the end of the metadata", len(b)-r.off)
	}
	return md, nil
}

func badMD(format string, a ...any) error {
	return fmt.Errorf("%w: %s", nixl.ErrBadMetadata, fmt.Sprintf(format, a...))
}

// serdes reads fields; the first error sticks and later reads return nil.
type serdes struct {
	b   []byte
	off int
	err error
}

func (r *serdes) field(tag string) []byte {
	if r.err != nil {
		return nil
	}
	rest := r.b[r.off:]
	if len(rest) < len(tag)+8 {
		r.err = fmt.Errorf("truncated at field %q (offset %d)", tag, r.off)
		return nil
	}
	if string(rest[:len(tag)]) != tag {
		r.err = fmt.Errorf("expected field %q at offset %d", tag, r.off)
		return nil
	}
	n := binary.LittleEndian.Uint64(rest[len(tag):])
	rest = rest[len(tag)+8:]
	// The length is checked against what is left before it is used, so a
	// corrupted one cannot wrap around or ask for more than is there.
	if n >= uint64(len(rest)) {
		r.err = fmt.Errorf("field %q at offset %d claims %d bytes, %d remain", tag, r.off, n, len(rest))
		return nil
	}
	if rest[n] != '|' {
		r.err = fmt.Errorf("field %q at offset %d does not end in '|'", tag, r.off)
		return nil
	}
	r.off += len(tag) + 8 + int(n) + 1
	return rest[:n]
}

func (r *serdes) str(tag string) []byte { return r.field(tag) }

// buf reads a field that must be exactly size bytes.
func (r *serdes) buf(tag string, size int) []byte {
	d := r.field(tag)
	if r.err == nil && len(d) != size {
		r.err = fmt.Errorf("field %q is %d bytes, want %d", tag, len(d), size)
		return nil
	}
	return d
}

// count reads a size_t count; one that could not fit in the bytes left
// (each item takes at least a tag, a length and a '|') is an error, so a
// corrupted count cannot make a reader loop or allocate for long.
func (r *serdes) count(tag string) uint64 {
	d := r.buf(tag, 8)
	if d == nil {
		return 0
	}
	n := binary.LittleEndian.Uint64(d)
	if left := uint64(len(r.b) - r.off); n > left/9 {
		r.err = fmt.Errorf("count %q of %d cannot fit in the %d bytes left", tag, n, left)
		return 0
	}
	return n
}
