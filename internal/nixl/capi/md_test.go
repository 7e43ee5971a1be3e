package capi

import (
	"encoding/binary"
	"errors"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/nixlctl/nixlctl/internal/nixl"
)

// serdesWriter writes NIXL's serdes format, for blobs made up in tests.
type serdesWriter struct{ b []byte }

func newSerdes() *serdesWriter { return &serdesWriter{b: []byte(serdesMagic)} }

func (w *serdesWriter) field(tag string, data []byte) *serdesWriter {
	w.b = append(w.b, tag...)
	w.b = binary.LittleEndian.AppendUint64(w.b, uint64(len(data)))
	w.b = append(w.b, data...)
	w.b = append(w.b, '|')
	return w
}

func u64(v uint64) []byte { return binary.LittleEndian.AppendUint64(nil, v) }
func u32(v uint32) []byte { return binary.LittleEndian.AppendUint32(nil, v) }

// encodeMD writes md the way NIXL's getLocalMD does.
func encodeMD(md nixlMD) []byte {
	w := newSerdes().field("Agent", []byte(md.Agent)).field("Conns", u64(uint64(len(md.Conns))))
	for _, c := range md.Conns {
		w.field("t", []byte(c.Backend)).field("c", c.Info)
	}
	w.field("", []byte("MemSection")).field("nixlSecElms", u64(uint64(len(md.Sections))))
	for _, s := range md.Sections {
		w.field("bknd", []byte(s.Backend)).field("nixlDList", []byte("nixlSDList")).
			field("t", u32(s.Mem)).field("n", u64(uint64(len(s.Descs))))
		for _, d := range s.Descs {
			e := append(append(append(u64(d.Addr), u64(d.Len)...), u64(d.Dev)...), d.Key...)
			w.field("", e)
		}
	}
	return w.b
}

var sampleMD = nixlMD{
	Agent: "target",
	Conns: []nixlConn{{Backend: "UCX", Info: []byte{0x20, 0xe0, 0x36, '|', 0, 0x7c, 0xff}}},
	Sections: []nixlSection{
		{Backend: "UCX", Mem: 0, Descs: []nixlRegDesc{
			{Addr: 0x7f0000000000, Len: 1 << 20, Key: []byte{1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff}},
			{Addr: 0x7f0000200000, Len: 4096, Key: []byte{'|', '|'}},
		}},
		{Backend: "UCX", Mem: 1, Descs: []nixlRegDesc{{Addr: 0x1000, Len: 64, Dev: 3, Key: []byte("k")}}},
	},
}

func TestParseNIXLMD(t *testing.T) {
	b := encodeMD(sampleMD)
	got, err := parseNIXLMD(b)
	if err != nil {
		t.Fatal(err)
	}
	if d := cmp.Diff(sampleMD, got); d != "" {
		t.Errorf("parsed (-want +got):\n%s", d)
	}
	noMem := nixlMD{Agent: "idle", Conns: sampleMD.Conns}
	if got, err := parseNIXLMD(encodeMD(noMem)); err != nil || got.Agent != "idle" {
		t.Errorf("agent without memory: %+v, %v", got, err)
	}

	// Every truncation is caught, and so is anything after the end.
	for n := 0; n < len(b); n++ {
		if _, err := parseNIXLMD(b[:n]); !errors.Is(err, nixl.ErrBadMetadata) {
			t.Fatalf("truncated to %d of %d bytes: %v", n, len(b), err)
		}
	}
	if _, err := parseNIXLMD(append(b[:len(b):len(b)], 0)); !errors.Is(err, nixl.ErrBadMetadata) {
		t.Errorf("trailing byte: %v", err)
	}

	bad := map[string]nixlMD{
		"empty agent name":      {Agent: "", Conns: sampleMD.Conns},
		"empty connection":      {Agent: "a", Conns: []nixlConn{{Backend: "UCX"}}},
		"unknown memory type":   {Agent: "a", Sections: []nixlSection{{Backend: "UCX", Mem: 9, Descs: sampleMD.Sections[0].Descs}}},
		"section without descs": {Agent: "a", Sections: []nixlSection{{Backend: "UCX"}}},
		"section w/o backend":   {Agent: "a", Sections: []nixlSection{{Descs: sampleMD.Sections[0].Descs}}},
		"empty descriptor":      {Agent: "a", Sections: []nixlSection{{Backend: "UCX", Descs: []nixlRegDesc{{Addr: 1}}}}},
		"wrapping descriptor":   {Agent: "a", Sections: []nixlSection{{Backend: "UCX", Descs: []nixlRegDesc{{Addr: ^uint64(0), Len: 2}}}}},
	}
	for name, md := range bad {
		if _, err := parseNIXLMD(encodeMD(md)); !errors.Is(err, nixl.ErrBadMetadata) {
			t.Errorf("%s: %v", name, err)
		}
	}

	// Lengths and counts that point past the end, or wrap when added.
	huge := newSerdes().field("Agent", []byte("a")).b
	huge = append(huge, "Conns"...)
	huge = append(huge, u64(^uint64(0))...)
	if _, err := parseNIXLMD(huge); !errors.Is(err, nixl.ErrBadMetadata) {
		t.Errorf("huge length: %v", err)
	}
	manyConns := newSerdes().field("Agent", []byte("a")).field("Conns", u64(1<<62)).b
	if _, err := parseNIXLMD(manyConns); !errors.Is(err, nixl.ErrBadMetadata) {
		t.Errorf("huge count: %v", err)
	}
	for _, junk := range [][]byte{nil, []byte("garbage"), []byte("nixlSerDes|"), []byte("NXMD\x01")} {
		if _, err := parseNIXLMD(junk); !errors.Is(err, nixl.ErrBadMetadata) {
			t.Errorf("%q: %v", junk, err)
		}
	}
}

func TestSeal(t *testing.T) {
	blob := encodeMD(sampleMD)
	sealed := seal(blob)
	// The NIXL blob is untouched: NIXL reads it from the front.
	if string(sealed[:len(blob)]) != string(blob) {
		t.Fatal("seal changed the blob")
	}
	got, err := unseal(sealed)
	if err != nil || string(got) != string(blob) {
		t.Fatalf("unseal: %v", err)
	}
	// An unsealed blob (from another NIXL program) passes through.
	if got, err := unseal(blob); err != nil || string(got) != string(blob) {
		t.Fatalf("unseal of a plain blob: %v", err)
	}
	// Any flipped bit is caught, by the checksum or, where it hits the
	// seal's magic, by the structure check that then sees trailing bytes.
	for i := range sealed {
		for _, bit := range []byte{0x01, 0x80} {
			f := append([]byte(nil), sealed...)
			f[i] ^= bit
			b, err := unseal(f)
			if err == nil {
				_, err = parseNIXLMD(b)
			}
			if !errors.Is(err, nixl.ErrBadMetadata) {
				t.Fatalf("byte %d ^%#x: %v", i, bit, err)
			}
		}
	}
}

// FuzzParseNIXLMD: no input makes the check panic, loop or allocate beyond
// its input, and whatever it accepts reads back as the same blob.
func FuzzParseNIXLMD(f *testing.F) {
	f.Add(encodeMD(sampleMD))
	f.Add(seal(encodeMD(sampleMD)))
	f.Add(encodeMD(nixlMD{Agent: "x", Conns: sampleMD.Conns}))
	f.Add([]byte("nixlSerDes|Agent"))
	f.Fuzz(func(t *testing.T, b []byte) {
		blob, err := unseal(b)
		if err != nil {
			return
		}
		md, err := parseNIXLMD(blob)
		if err != nil {
			if !errors.Is(err, nixl.ErrBadMetadata) {
				t.Fatalf("error does not wrap ErrBadMetadata: %v", err)
			}
			return
		}
		if md.Agent == "" {
			t.Fatal("accepted an empty agent name")
		}
		if re := encodeMD(md); string(re) != string(blob) {
			t.Fatalf("accepted blob does not re-encode to itself")
		}
	})
}
