package handoff

import (
	"strings"
	"testing"

	"github.com/nixlctl/nixlctl/internal/engine"
	"github.com/nixlctl/nixlctl/internal/errkind"
	"github.com/nixlctl/nixlctl/internal/kv"
	"github.com/nixlctl/nixlctl/internal/nixl"
	"github.com/nixlctl/nixlctl/internal/runcore/runcoretest"
)

// Each protocol and mode ignores exactly what RunHandoff does not read.
func TestHandoffIgnored(t *testing.T) {
	tests := []struct {
		name      string
		mut       func(*HandoffOptions)
		want, not []string
	}{
		{"pull", func(o *HandoffOptions) { o.Protocol = engine.ProtoPull }, []string{"ChunkTokens", "RegTimeout", "ISL.Min", "Device"}, []string{"Lease", "ISL.Fixed", "Concurrency"}},
		{"push", func(o *HandoffOptions) { o.Protocol = engine.ProtoPush }, []string{"ChunkTokens", "SGLWaitingTimeout", "SGLHeartbeatInterval"}, []string{"RegTimeout", "Lease"}},
		{"sglang", func(o *HandoffOptions) { o.Protocol = engine.ProtoSGLang }, []string{"Lease", "RegTimeout", "RegWatchdog"},
			[]string{"ChunkTokens", "SGLBootstrapTimeout", "SGLWaitingTimeout", "SGLHeartbeatInterval", "SGLHeartbeatMaxFailures"}},
		{"vram", func(o *HandoffOptions) { o.Mem = nixl.VRAM }, []string{"DRAMAlloc"}, []string{"Device", "DecodeDevice"}},
		{"dram", func(o *HandoffOptions) { o.Mem = nixl.DRAM }, []string{"Device", "DecodeDevice"}, []string{"DRAMAlloc"}},
		{"uniform", func(o *HandoffOptions) { o.ISL.Dist = ISLUniform }, []string{"ISL.Fixed", "ISL.Mean", "ISL.Std"}, []string{"ISL.Min", "ISL.Max"}},
		{"normal", func(o *HandoffOptions) { o.ISL.Dist = ISLNormal }, []string{"ISL.Fixed"}, []string{"ISL.Mean", "ISL.Std", "ISL.Min"}},
		{"open loop", func(o *HandoffOptions) { o.Rate = 5 }, []string{"Concurrency"}, []string{"Rate"}},
		{"open loop, xfer reference", func(o *HandoffOptions) { o.Rate, o.XferRef = 5, true }, nil, []string{"Concurrency"}},
		{"trace", func(o *HandoffOptions) { o.Trace = []TraceEntry{{ISL: 64}} }, []string{"Rate", "Concurrency", "ISL.Fixed", "ISL.Dist"}, nil},
		{"local endpoints", func(o *HandoffOptions) {}, []string{"RunID", "Roster", "JoinWindow", "XferTarget"}, nil},
		{"remote endpoints", func(o *HandoffOptions) { o.Prefill, o.Decode = "10.0.0.1:7400", "10.0.0.2:7400" },
			[]string{"RunID", "Roster", "JoinWindow"}, []string{"XferTarget"}},
		{"rendezvous", func(o *HandoffOptions) { o.Rendezvous = "127.0.0.1:0" }, nil, []string{"RunID", "Roster", "JoinWindow", "XferTarget"}},
	}
	for _, tc := range tests {
		o := DefaultHandoffOptions()
		o.Protocol = engine.ProtoPush
		tc.mut(&o)
		runcoretest.CheckIgnored(t, tc.name, o.Ignored(), tc.want, tc.not)
	}
}

// A pool that cannot hold the longest prompt is refused, naming the field.
func TestHandoffNumBlocksTooSmall(t *testing.T) {
	tests := []struct {
		name   string
		mut    func(*HandoffOptions)
		blocks int
		ok     bool
	}{
		{"fixed fits", func(o *HandoffOptions) { o.ISL.Fixed = 64 }, 4, true},
		{"fixed short", func(o *HandoffOptions) { o.ISL.Fixed = 65 }, 4, false},
		{"uniform max", func(o *HandoffOptions) { o.ISL.Dist, o.ISL.Min, o.ISL.Max = ISLUniform, 16, 160 }, 9, false},
		{"trace", func(o *HandoffOptions) { o.Trace = []TraceEntry{{ISL: 16}, {ISL: 800}} }, 49, false},
		{"default pool", func(o *HandoffOptions) {}, 0, true},
	}
	for _, tc := range tests {
		o := DefaultHandoffOptions()
		o.Protocol, o.Spec = engine.ProtoPull, testSpec(t)
		tc.mut(&o)
		o.NumBlocks = tc.blocks
		err := o.Validate()
		bad := err != nil && strings.Contains(err.Error(), "cannot hold one request")
		if bad == tc.ok {
			t.Errorf("%s: %v", tc.name, err)
		}
		if _, ok := errkind.FieldIn(err, "NumBlocks"); bad && !ok {
			t.Errorf("%s: not a NumBlocks field error: %v", tc.name, err)
		}
	}
}

func testSpec(t *testing.T) kv.Spec {
	return kv.Spec{Model: runcoretest.SmallModel(t), BlockSize: 16, TP: 1}
}
