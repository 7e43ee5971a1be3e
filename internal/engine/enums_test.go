package engine

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestEnumsParse(t *testing.T) {
	parse := func(dst interface{ UnmarshalText([]byte) error }, s string) (any, error) {
		err := dst.UnmarshalText([]byte(s))
		return dst, err
	}
	p, r, v, f, a, fr := new(Protocol), new(Role), new(Verify), new(Fragmentation), new(DRAMAlloc), new(FreedReason)
	tests := []struct {
		name    string
		dst     interface{ UnmarshalText([]byte) error }
		in      string
		want    any
		wantErr string // the valid values the error must name
	}{
		{"protocol pull", p, "pull", ptr(Protocol(ProtoPull)), ""},
		{"protocol sglang", p, "sglang", ptr(Protocol(ProtoSGLang)), ""},
		{"protocol unknown", p, "carrier-pigeon", nil, "pull, push, sglang"},
		{"protocol case matters", p, "Pull", nil, "pull, push, sglang"},
		{"role decode", r, "decode", ptr(Role(RoleDecode)), ""},
		{"role unknown", r, "encoder", nil, "prefill, decode"},
		{"verify full", v, "full", ptr(Full), ""},
		{"verify sparse", v, "sparse", ptr(Sparse), ""},
		{"verify unknown", v, "off", nil, "sparse, full"},
		{"fragmentation scattered", f, "scattered", ptr(FragScattered), ""},
		{"fragmentation unknown", f, "swiss-cheese", nil, "contiguous, scattered"},
		{"dram alloc ucx", a, "ucx", ptr(AllocUCX), ""},
		{"dram alloc thp", a, "thp", ptr(AllocTHP), ""},
		{"dram alloc empty is the default", a, "", ptr(DRAMAlloc("")), ""},
		{"dram alloc unknown", a, "malloc", nil, "mmap, thp, ucx"},
		{"freed expired", fr, "expired", ptr(FreedExpired), ""},
		{"freed unknown", fr, "stolen", nil, "consumed, expired, pushed, failed"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := parse(tc.dst, tc.in)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) || !strings.Contains(err.Error(), tc.in) {
					t.Fatalf("UnmarshalText(%q) = %v, want an error naming %q and the valid values %s", tc.in, err, tc.in, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("UnmarshalText(%q) (-want +got):\n%s", tc.in, diff)
			}
		})
	}
}

func ptr[T any](v T) *T { return &v }

// A Config crosses the RPC with names, not numbers, and a bad name from a
// malformed call fails the decode.
func TestConfigEnumsJSON(t *testing.T) {
	in := Config{Role: RoleDecode, Protocol: ProtoPush, Knobs: Knobs{Verify: Full, DRAMAlloc: AllocUCX}}
	b, err := json.Marshal(in)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{`"role":"decode"`, `"verify":"full"`, `"dram_alloc":"ucx"`} {
		if !strings.Contains(string(b), want) {
			t.Errorf("%s lacks %s", b, want)
		}
	}
	var back Config
	if err := json.Unmarshal(b, &back); err != nil {
		t.Fatal(err)
	}
	if back.Role != in.Role || back.Verify != in.Verify || back.DRAMAlloc != in.DRAMAlloc {
		t.Errorf("round trip: %+v", back)
	}
	if err := json.Unmarshal([]byte(`{"role":"router"}`), &back); err == nil {
		t.Error("a bad role decoded")
	}
}
