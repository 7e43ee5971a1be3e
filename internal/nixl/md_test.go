package nixl

import (
	"errors"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func sampleMD() Metadata {
	return Metadata{Backend: "ucx", Name: "prefill-0", Conn: []byte{1, 2, 3},
		Regions: []RegionMD{{Addr: 0x1000, Len: 4096, Mem: DRAM, Key: []byte("key")}, {Addr: 1 << 40, Len: 1 << 30, Mem: VRAM, Dev: 3}}}
}

func TestMetadataRoundTrip(t *testing.T) {
	t.Parallel()
	in := sampleMD()
	b, err := in.Encode()
	if err != nil {
		t.Fatal(err)
	}
	out, err := DecodeMetadata(b)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(in, out); diff != "" {
		t.Error(diff)
	}
}

func TestMetadataCorruption(t *testing.T) {
	t.Parallel()
	b, _ := sampleMD().Encode()
	for i := 0; i < len(b); i++ {
		if _, err := DecodeMetadata(b[:i]); !errors.Is(err, ErrBadMetadata) {
			t.Fatalf("truncated to %d bytes: %v", i, err)
		}
		c := append([]byte(nil), b...)
		c[i] ^= 0x40
		if _, err := DecodeMetadata(c); !errors.Is(err, ErrBadMetadata) {
			t.Fatalf("bit flip at %d accepted", i)
		}
	}
	if _, err := (Metadata{}).Encode(); err == nil {
		t.Error("empty name must not encode")
	}
}

func TestRegionContains(t *testing.T) {
	t.Parallel()
	r := RegionMD{Addr: 100, Len: 50}
	for _, tc := range []struct {
		d    Desc
		want bool
	}{{Desc{100, 50, 0}, true}, {Desc{149, 1, 0}, true}, {Desc{149, 2, 0}, false}, {Desc{99, 1, 0}, false},
		{Desc{120, 0, 0}, true}, {Desc{1<<64 - 1, 2, 0}, false}, {Desc{100, 1 << 63, 0}, false}} {
		if got := r.Contains(tc.d); got != tc.want {
			t.Errorf("%+v: %v", tc.d, got)
		}
	}
}

func FuzzDecodeMetadata(f *testing.F) {
	b, _ := sampleMD().Encode()
	f.Add(b)
	f.Add([]byte("NXMD\x01"))
	f.Fuzz(func(t *testing.T, data []byte) {
		m, err := DecodeMetadata(data)
		if err != nil {
			if !errors.Is(err, ErrBadMetadata) {
				t.Fatalf("error does not wrap ErrBadMetadata: %v", err)
			}
			return
		}
		again, err := m.Encode()
		if err != nil {
			t.Fatalf("decoded metadata does not re-encode: %v", err)
		}
		m2, err := DecodeMetadata(again)
		if err != nil || !cmp.Equal(m, m2) {
			t.Fatalf("round trip changed it: %v", err)
		}
	})
}
