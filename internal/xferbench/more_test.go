package xferbench

import (
	"context"
	"fmt"
	"testing"

	"github.com/nixlctl/nixlctl/internal/engine"
	"github.com/nixlctl/nixlctl/internal/netpath"
	"github.com/nixlctl/nixlctl/internal/nixl"
	"github.com/nixlctl/nixlctl/internal/runcore"
	"github.com/nixlctl/nixlctl/internal/runcore/runcoretest"
)

func TestXferPathEnds(t *testing.T) {
	for _, tc := range []struct {
		op       nixl.Op
		ini, tgt netpath.Direction
	}{{nixl.Write, netpath.Send, netpath.Receive}, {nixl.Read, netpath.Receive, netpath.Send}} {
		e := xferPathEnds(tc.op, nil)
		if e[0].Role != "initiator" || e[0].Dir != tc.ini || e[1].Role != "target" || e[1].Dir != tc.tgt {
			t.Errorf("%v: %+v", tc.op, e)
		}
	}
	o := smallXfer(nixl.Write)
	o.LargeBlkIterFtr = 10
	got := xferPayload(&o, []XferPoint{{BlockSize: 4096, BatchSize: 2}, {BlockSize: 2 << 20, BatchSize: 1}})
	if want := int64(4096*2*(50+5) + 2<<20*(5+0)); got != want {
		t.Errorf("xfer payload %d, want %d", got, want)
	}
}

// A local run, target a child process of this host: each end has a
// verdict on the whole payload and nothing warns.
func TestXferNetPathLocalRun(t *testing.T) {
	t.Setenv("UCX_NET_DEVICES", "")
	o := smallXfer(nixl.Read)
	o.MaxBlock, o.MaxBatch = 8<<10, 2
	res, err := RunXfer(context.Background(), o)
	if err != nil {
		t.Fatal(err)
	}
	runcoretest.CheckLocalPath(t, res.NetPath, res.Warnings, xferPayload(&o, res.Points), "initiator", "target")
	if res.NetPath["initiator"].Direction != netpath.Receive {
		t.Error("a READ's initiator receives")
	}
}

// bench xfer's memory types decide which device and allocation flags
// count.
func TestXferIgnored(t *testing.T) {
	tests := []struct {
		init, targ nixl.MemType
		want, not  []string
	}{
		{nixl.DRAM, nixl.DRAM, []string{"Device", "TargetDevice"}, []string{"DRAMAlloc", "HugePages"}},
		{nixl.DRAM, nixl.VRAM, nil, []string{"Device", "TargetDevice", "DRAMAlloc", "HugePages"}},
		{nixl.VRAM, nixl.DRAM, []string{"TargetDevice"}, []string{"Device", "DRAMAlloc"}},
		{nixl.VRAM, nixl.VRAM, []string{"DRAMAlloc", "HugePages"}, []string{"Device", "TargetDevice"}},
	}
	for _, tc := range tests {
		o := DefaultXferOptions()
		o.InitiatorSeg, o.TargetSeg = tc.init, tc.targ
		runcoretest.CheckIgnored(t, fmt.Sprintf("%v->%v", tc.init, tc.targ), o.Ignored(), tc.want, tc.not)
	}
}

// bench xfer's backend and allocation decide whether --progress and
// --use-hugepages count.
func TestXferBackendIgnored(t *testing.T) {
	tests := []struct {
		name      string
		got       func() []runcore.IgnoredField
		want, not []string
	}{
		{"ucx backend", func() []runcore.IgnoredField {
			o := DefaultXferOptions()
			o.Backend = "ucx"
			return o.Ignored()
		}, []string{"Progress"}, nil},
		{"nixl backend", func() []runcore.IgnoredField {
			o := DefaultXferOptions()
			o.Backend = "nixl"
			return o.Ignored()
		}, nil, []string{"Progress"}},
		{"dram alloc ucx", func() []runcore.IgnoredField {
			o := DefaultXferOptions()
			o.DRAMAlloc = engine.AllocUCX
			return o.Ignored()
		}, []string{"HugePages"}, nil},
		{"dram alloc mmap", func() []runcore.IgnoredField { o := DefaultXferOptions(); return o.Ignored() }, nil, []string{"HugePages"}},
	}
	// --backend auto is ucx where NIXL is not installed: --progress is
	// ignored exactly when it resolves so.
	autoUCX := false
	if b, err := nixl.Resolve("auto"); err == nil && b.Name == "ucx" {
		autoUCX = true
	}
	auto := func() []runcore.IgnoredField {
		o := DefaultXferOptions()
		o.Backend = "auto"
		return o.Ignored()
	}
	if autoUCX {
		tests = append(tests, struct {
			name      string
			got       func() []runcore.IgnoredField
			want, not []string
		}{"auto resolving to ucx", auto, []string{"Progress"}, nil})
	} else {
		tests = append(tests, struct {
			name      string
			got       func() []runcore.IgnoredField
			want, not []string
		}{"auto resolving to nixl", auto, nil, []string{"Progress"}})
	}
	for _, tc := range tests {
		runcoretest.CheckIgnored(t, tc.name, tc.got(), tc.want, tc.not)
	}
}
