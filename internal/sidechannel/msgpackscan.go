package sidechannel

import "fmt"

// maxReplyDepth bounds how deeply a peer's msgpack may nest before it is
// decoded: the decoders recurse, and a frame of nothing but array headers
// would otherwise grow the goroutine stack until the runtime kills the
// process. vLLM's deepest value (region_members, a list of lists inside
// the metadata map) is 3 levels down.
const maxReplyDepth = 16

// CheckMsgpack checks that b starts with one well-formed msgpack value no
// deeper than 16 levels, before a recursive decoder sees it: a frame of
// nothing but array headers (0x91 0x91 ...) otherwise recurses until the
// Go runtime aborts the whole process with a stack overflow, which no
// recover() catches. Bytes after the value are left to the decoder.
func CheckMsgpack(b []byte) error {
	_, err := scanMsgpackPrefix(b, maxReplyDepth)
	return err
}

// scanMsgpack checks that b is exactly one well-formed msgpack value no
// deeper than maxDepth.
func scanMsgpack(b []byte, maxDepth int) error {
	n, err := scanMsgpackPrefix(b, maxDepth)
	if err == nil && n != len(b) {
		return fmt.Errorf("%d bytes after the value", len(b)-n)
	}
	return err
}

// scanMsgpackPrefix walks the msgpack value at the start of b without
// recursion and without allocating per element (a stack of item counts)
// and returns its length. Each item takes at least one byte, so a forged
// count runs out of input instead of looping. The error says what is
// wrong and where.
func scanMsgpackPrefix(b []byte, maxDepth int) (int, error) {
	pending := []uint64{1} // items still to read at each open level
	off := 0
	need := func(n uint64) error {
		if uint64(len(b)-off) < n {
			return fmt.Errorf("truncated at byte %d of %d (want %d more)", off, len(b), n)
		}
		return nil
	}
	be := func(n int) uint64 { // a big-endian length of n bytes at off
		var v uint64
		for _, c := range b[off : off+n] {
			v = v<<8 | uint64(c)
		}
		off += n
		return v
	}
	for len(pending) > 0 {
		top := len(pending) - 1
		if pending[top] == 0 {
			pending = pending[:top]
			continue
		}
		pending[top]--
		if err := need(1); err != nil {
			return 0, err
		}
		c := b[off]
		off++
		var skip, items uint64
		container := false
		switch {
		case c <= 0x7f || c >= 0xe0, c == 0xc0, c == 0xc2, c == 0xc3:
		case c >= 0x80 && c <= 0x8f:
			items, container = 2*uint64(c&0x0f), true
		case c >= 0x90 && c <= 0x9f:
			items, container = uint64(c&0x0f), true
		case c >= 0xa0 && c <= 0xbf:
			skip = uint64(c & 0x1f)
		case c == 0xc4 || c == 0xd9: // bin8, str8
			if err := need(1); err != nil {
				return 0, err
			}
			skip = be(1)
		case c == 0xc5 || c == 0xda: // bin16, str16
			if err := need(2); err != nil {
				return 0, err
			}
			skip = be(2)
		case c == 0xc6 || c == 0xdb: // bin32, str32
			if err := need(4); err != nil {
				return 0, err
			}
			skip = be(4)
		case c == 0xc7, c == 0xc8, c == 0xc9: // ext8/16/32: length, type, data
			n := 1 << (c - 0xc7)
			if err := need(uint64(n) + 1); err != nil {
				return 0, err
			}
			skip = be(n) + 1
		case c == 0xca:
			skip = 4
		case c == 0xcb:
			skip = 8
		case c >= 0xcc && c <= 0xcf: // uint8..uint64
			skip = 1 << (c - 0xcc)
		case c >= 0xd0 && c <= 0xd3: // int8..int64
			skip = 1 << (c - 0xd0)
		case c >= 0xd4 && c <= 0xd8: // fixext1..16: type, data
			skip = 1 + 1<<(c-0xd4)
		case c == 0xdc || c == 0xdd: // array16/32
			n := 2 << (c - 0xdc)
			if err := need(uint64(n)); err != nil {
				return 0, err
			}
			items, container = be(n), true
		case c == 0xde || c == 0xdf: // map16/32
			n := 2 << (c - 0xde)
			if err := need(uint64(n)); err != nil {
				return 0, err
			}
			items, container = 2*be(n), true
		default: // 0xc1 is never used
			return 0, fmt.Errorf("invalid msgpack byte 0x%02x at byte %d", c, off-1)
		}
		if container {
			if items == 0 {
				continue
			}
			if len(pending) >= maxDepth {
				return 0, fmt.Errorf("nested deeper than %d levels at byte %d", maxDepth, off)
			}
			if items > uint64(len(b)-off) {
				return 0, fmt.Errorf("truncated at byte %d of %d (a container of %d items)", off, len(b), items)
			}
			pending = append(pending, items)
			continue
		}
		if err := need(skip); err != nil {
			return 0, err
		}
		off += int(skip)
	}
	return off, nil
}
