package ec

import (
	"bytes"
	"strings"
	"testing"
)

// deepNest is n nested one-element containers: arrays (0x91) or
// single-entry maps (0x81 "k"), ending in nil.
func deepNest(n int, mapped bool) []byte {
	unit := []byte{0x91}
	if mapped {
		unit = []byte{0x81, 0xa1, 'k'}
	}
	return append(bytes.Repeat(unit, n), 0xc0)
}

// taggedWith is {"type": tag, "x": v}: a well-formed message whose unknown
// field the decoder would skip, recursing into v.
func taggedWith(tag string, v []byte) []byte {
	b := []byte{0x82, 0xa4, 't', 'y', 'p', 'e', 0xa0 | byte(len(tag))}
	b = append(b, tag...)
	b = append(b, 0xa1, 'x')
	return append(b, v...)
}

// deepSeeds are peers' messages nested far deeper than any EC message is:
// each decoder must refuse them with the depth error, not recurse on them.
func deepSeeds() map[string][]byte {
	return map[string][]byte{
		"arrays":              deepNest(100000, false),
		"maps":                deepNest(100000, true),
		"req, unknown field":  taggedWith("req", deepNest(100000, false)),
		"ack, unknown field":  taggedWith("ack", deepNest(100000, true)),
		"one level too deep":  taggedWith("req", deepNest(16, false)),
		"descriptor of lists": append([]byte{0x91}, deepNest(100000, false)...),
	}
}

// addDeepSeeds gives a fuzz target the deeply nested seeds.
func addDeepSeeds(f *testing.F) {
	for _, b := range deepSeeds() {
		f.Add(b)
	}
}

func TestDecodersRefuseDeepNesting(t *testing.T) {
	t.Parallel()
	decoders := map[string]func([]byte) error{
		"DecodeRequest":       func(b []byte) error { _, err := DecodeRequest(b); return err },
		"DecodeAck":           func(b []byte) error { _, err := DecodeAck(b); return err },
		"DecodeMemDescriptor": func(b []byte) error { _, err := DecodeMemDescriptor(b); return err },
	}
	for seed, b := range deepSeeds() {
		for name, decode := range decoders {
			err := decode(b)
			if err == nil || !strings.Contains(err.Error(), "nested deeper than 16 levels") {
				t.Errorf("%s(%s): %v, want the depth error", name, seed, err)
			}
		}
	}
	// As deep as a real message goes is fine: 15 levels under the map.
	if _, err := DecodeRequest(taggedWith("req", deepNest(14, false))); err == nil || strings.Contains(err.Error(), "deeper") {
		t.Errorf("a 15-level message: %v, want only the missing-fields error", err)
	}
}
