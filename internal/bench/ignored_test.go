package bench

import (
	"slices"
	"testing"

	"github.com/nixlctl/nixlctl/internal/engine"
	"github.com/nixlctl/nixlctl/internal/nixl"
)

func ignoredFields(ig []IgnoredField) []string {
	var out []string
	for _, f := range ig {
		out = append(out, f.Field)
	}
	return out
}

// Each protocol and mode ignores exactly what RunHandoff does not read.
func TestHandoffIgnored(t *testing.T) {
	tests := []struct {
		name      string
		mut       func(*HandoffOptions)
		want, not []string
	}{
		{"pull", func(o *HandoffOptions) { o.Protocol = engine.ProtoPull }, []string{"ChunkTokens", "RegTimeout", "ISL.Min", "Device"}, []string{"Lease", "ISL.Fixed", "Concurrency"}},
		{"push", func(o *HandoffOptions) { o.Protocol = engine.ProtoPush }, []string{"ChunkTokens"}, []string{"RegTimeout", "Lease"}},
		{"sglang", func(o *HandoffOptions) { o.Protocol = engine.ProtoSGLang }, []string{"Lease"}, []string{"ChunkTokens", "RegTimeout"}},
		{"vram", func(o *HandoffOptions) { o.Mem = nixl.VRAM }, nil, []string{"Device", "DecodeDevice"}},
		{"uniform", func(o *HandoffOptions) { o.ISL.Dist = ISLUniform }, []string{"ISL.Fixed", "ISL.Mean", "ISL.Std"}, []string{"ISL.Min", "ISL.Max"}},
		{"normal", func(o *HandoffOptions) { o.ISL.Dist = ISLNormal }, []string{"ISL.Fixed"}, []string{"ISL.Mean", "ISL.Std", "ISL.Min"}},
		{"open loop", func(o *HandoffOptions) { o.Rate = 5 }, []string{"Concurrency"}, []string{"Rate"}},
		{"open loop, xfer reference", func(o *HandoffOptions) { o.Rate, o.XferRef = 5, true }, nil, []string{"Concurrency"}},
		{"trace", func(o *HandoffOptions) { o.Trace = []TraceEntry{{ISL: 64}} }, []string{"Rate", "Concurrency", "ISL.Fixed", "ISL.Dist"}, nil},
	}
	for _, tc := range tests {
		o := DefaultHandoffOptions()
		o.Protocol = engine.ProtoPush
		tc.mut(&o)
		got := ignoredFields(o.Ignored())
		for _, f := range tc.want {
			if !slices.Contains(got, f) {
				t.Errorf("%s: %s not ignored (%v)", tc.name, f, got)
			}
		}
		for _, f := range tc.not {
			if slices.Contains(got, f) {
				t.Errorf("%s: %s ignored, but it is used", tc.name, f)
			}
		}
	}
}
