// Package wirefixture loads the wire fixtures under testdata/wire at the
// repository root for the packages' tests. Each fixture is either derived
// by hand from upstream's encoding rules or, under upstream/, produced by
// upstream's own encoder (see the README there); never by nixlctl's.
//
// A .hex fixture is annotated hex: on each line, everything after '#'
// is a comment and whitespace is ignored; "@include NAME" splices another
// fixture's bytes in; a line starting "--- frame" begins the next frame of
// a ZMQ multipart message. Other fixtures (.json) are taken byte for byte.
package wirefixture

import (
	"bufio"
	"bytes"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
)

// Dir is the fixtures' directory.
func Dir() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..", "testdata", "wire")
}

// Raw returns a fixture's bytes as stored.
func Raw(t testing.TB, name string) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(Dir(), name))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// Upstream returns a fixture under testdata/wire/upstream: bytes upstream's
// own encoder produced (see the README), stored raw.
func Upstream(t testing.TB, name string) []byte {
	t.Helper()
	return Raw(t, filepath.Join("upstream", name))
}

// Hex returns a single-frame .hex fixture's bytes.
func Hex(t testing.TB, name string) []byte {
	t.Helper()
	frames, err := parse(name, 0)
	if err != nil {
		t.Fatal(err)
	}
	if len(frames) != 1 {
		t.Fatalf("%s: %d frames, want one", name, len(frames))
	}
	return frames[0]
}

// Same reports, as a test error, encoded bytes (got) that differ from a
// fixture's (want), both in hex: a byte-level diff is what tells which
// field an encoder got wrong.
func Same(t testing.TB, what string, got, want []byte) {
	t.Helper()
	if string(got) != string(want) {
		t.Errorf("%s differs from the upstream fixture:\n got %s\nwant %s", what, hex.EncodeToString(got), hex.EncodeToString(want))
	}
}

// Frames returns a multipart .hex fixture's frames.
func Frames(t testing.TB, name string) [][]byte {
	t.Helper()
	frames, err := parse(name, 0)
	if err != nil {
		t.Fatal(err)
	}
	return frames
}

func parse(name string, depth int) ([][]byte, error) {
	if depth > 4 {
		return nil, fmt.Errorf("%s: includes nest too deep", name)
	}
	b, err := os.ReadFile(filepath.Join(Dir(), name))
	if err != nil {
		return nil, err
	}
	var frames [][]byte
	cur := []byte{}
	framed := false
	sc := bufio.NewScanner(bytes.NewReader(b))
	for n := 1; sc.Scan(); n++ {
		line := sc.Text()
		switch {
		case strings.HasPrefix(line, "--- frame"):
			if framed {
				frames = append(frames, cur)
			}
			cur, framed = []byte{}, true
			continue
		case strings.HasPrefix(line, "@include "):
			inc, err := parse(strings.TrimSpace(strings.TrimPrefix(line, "@include ")), depth+1)
			if err != nil {
				return nil, err
			}
			if len(inc) != 1 {
				return nil, fmt.Errorf("%s:%d: included fixture has %d frames", name, n, len(inc))
			}
			cur = append(cur, inc[0]...)
			continue
		}
		if i := strings.IndexByte(line, '#'); i >= 0 {
			line = line[:i]
		}
		digits := strings.Join(strings.Fields(line), "")
		x, err := hex.DecodeString(digits)
		if err != nil {
			return nil, fmt.Errorf("%s:%d: %w", name, n, err)
		}
		cur = append(cur, x...)
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	return append(frames, cur), nil
}
