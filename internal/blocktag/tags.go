package blocktag

import (
	"encoding/binary"
	"fmt"
)

// Tags make every byte of a transferred block checkable: word k of a block
// keyed `key` holds mix(key, k). Keys derive from what the block is
// (request, region, block; or sweep point and descriptor), so a block that
// lands in the wrong place, a stale block and a partial copy are all
// detected — whole-buffer fill patterns would pass all three.

// Key combines the identity of a block into one key.
func Key(parts ...uint64) uint64 {
	h := uint64(0x9e3779b97f4a7c15)
	for _, p := range parts {
		h = mix(h ^ p)
	}
	return h
}

// mix is the splitmix64 finaliser: cheap, and every input bit changes
// about half the output bits.
func mix(x uint64) uint64 {
	x += 0x9e3779b97f4a7c15
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9
	x = (x ^ (x >> 27)) * 0x94d049bb133111eb
	return x ^ (x >> 31)
}

// Fill writes the tag pattern of key into b. A trailing partial word
// gets the leading bytes of its tag.
func Fill(b []byte, key uint64) {
	n := len(b) / 8
	for k := 0; k < n; k++ {
		binary.LittleEndian.PutUint64(b[8*k:], mix(key+uint64(k)))
	}
	if r := len(b) % 8; r > 0 {
		var w [8]byte
		binary.LittleEndian.PutUint64(w[:], mix(key+uint64(n)))
		copy(b[8*n:], w[:r])
	}
}

// Mismatch describes the first wrong word of a block.
type Mismatch struct {
	Offset int // byte offset inside the block
	Want   uint64
	Got    uint64
}

func (m Mismatch) Error() string {
	return fmt.Sprintf("tag mismatch at byte %d: want %#x, got %#x", m.Offset, m.Want, m.Got)
}

// Check verifies b against the pattern of key; nil means every byte
// matches.
func Check(b []byte, key uint64) *Mismatch {
	n := len(b) / 8
	for k := 0; k < n; k++ {
		want := mix(key + uint64(k))
		if got := binary.LittleEndian.Uint64(b[8*k:]); got != want {
			return &Mismatch{Offset: 8 * k, Want: want, Got: got}
		}
	}
	if r := len(b) % 8; r > 0 {
		var w [8]byte
		binary.LittleEndian.PutUint64(w[:], mix(key+uint64(n)))
		for i := 0; i < r; i++ {
			if b[8*n+i] != w[i] {
				var g [8]byte
				copy(g[:], b[8*n:])
				return &Mismatch{Offset: 8 * n, Want: binary.LittleEndian.Uint64(w[:]), Got: binary.LittleEndian.Uint64(g[:])}
			}
		}
	}
	return nil
}

// FillEnds writes key's tag words at the start and at the end of b (one
// word each; b shorter than a word gets none): enough for a check to catch
// a misplaced, stale or truncated piece without touching the cache lines
// between, which on a host whose copy is memory-bound cost as much as a
// quarter of the transfer (see Pool.Check).
func FillEnds(b []byte, key uint64) {
	n := int64(len(b))
	if n < 8 {
		return
	}
	binary.LittleEndian.PutUint64(b, FirstWord(key))
	binary.LittleEndian.PutUint64(b[n-8:], LastWord(key, n))
}

// FirstWord is the word FillEnds (and Fill) writes at the start of a piece
// keyed key: what a caller batching many pieces' words writes or expects.
func FirstWord(key uint64) uint64 { return mix(key) }

// LastWord is the word FillEnds writes at the end of a piece of n >= 8
// bytes keyed key.
func LastWord(key uint64, n int64) uint64 { return mix(key + uint64(n-8)) }

// CheckFirst checks the first word FillEnds (or Fill) wrote into b; nil
// when it is there.
func CheckFirst(b []byte, key uint64) *Mismatch {
	if len(b) < 8 {
		return nil
	}
	if got, want := binary.LittleEndian.Uint64(b), FirstWord(key); got != want {
		return &Mismatch{Offset: 0, Want: want, Got: got}
	}
	return nil
}

// CheckLast checks the last word FillEnds wrote into b; nil when it is
// there. (Fill's last word differs: it counts words, FillEnds bytes.)
func CheckLast(b []byte, key uint64) *Mismatch {
	n := int64(len(b))
	if n < 8 {
		return nil
	}
	if got, want := binary.LittleEndian.Uint64(b[n-8:]), LastWord(key, n); got != want {
		return &Mismatch{Offset: int(n - 8), Want: want, Got: got}
	}
	return nil
}
