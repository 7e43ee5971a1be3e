package xferbench

import (
	"context"
	"strings"
	"testing"

	"github.com/nixlctl/nixlctl/internal/nixl"
	_ "github.com/nixlctl/nixlctl/internal/nixl/capi"
)

// TestAgentTransport: a backend that describes the peer's path gives that;
// one that does not (NIXL) gives everything it says about itself.
func TestAgentTransport(t *testing.T) {
	ucxInfo := nixl.Info{Details: map[string]string{"transport:t": "rma: cma/memory", "progress": "x"}}
	if got := agentTransport(ucxInfo, "t"); got != "rma: cma/memory" {
		t.Errorf("ucx: %q", got)
	}
	nixlInfo := nixl.Info{Details: map[string]string{"plugin": "UCX", "ucx_library": "/p/libucp.so.0", "ucx:num_workers": "1"}}
	if got, want := agentTransport(nixlInfo, "t"), "plugin=UCX; ucx:num_workers=1; ucx_library=/p/libucp.so.0"; got != want {
		t.Errorf("nixl: %q, want %q", got, want)
	}
}

// TestRunXferNIXLRecordsUCX: with the nixl backend the result names the
// libucp NIXL ran on and what NIXL says about its UCX backend, as bench
// push/pull do. Skipped where NIXL cannot run (docs/backends.md).
func TestRunXferNIXLRecordsUCX(t *testing.T) {
	if _, err := nixl.Resolve("nixl"); err != nil {
		t.Skip(err)
	}
	o := smallXfer(nixl.Write)
	o.Backend, o.MaxBlock, o.MaxBatch, o.Notif = "nixl", 4<<10, 2, true
	res, err := RunXfer(context.Background(), o)
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Points) != 2 {
		t.Fatalf("%d points, want 2", len(res.Points))
	}
	if res.Env.Backend != "nixl" || res.Env.UCX == "" || res.Env.NIXL == "" {
		t.Errorf("environment does not name NIXL and its UCX: %+v", res.Env)
	}
	if res.Transports["ucx_library"] == "" || res.Transports["plugin"] != "UCX" {
		t.Errorf("transports: %v", res.Transports)
	}
	if !strings.Contains(res.Env.Transport, "ucx_library=") || res.Points[0].Transport != res.Env.Transport {
		t.Errorf("transport %q, point's %q", res.Env.Transport, res.Points[0].Transport)
	}
}

func TestXferProgress(t *testing.T) {
	for _, tc := range []struct {
		p                 XferProgress
		initiator, target nixl.Progress
	}{{XferPoll, nixl.ProgressCaller, nixl.ProgressSpin}, {XferThread, nixl.ProgressBackground, nixl.ProgressBackground}} {
		i, tg := tc.p.agents()
		if i != tc.initiator || tg != tc.target {
			t.Errorf("%s: %v, %v", tc.p, i, tg)
		}
		// The target's progress crosses the control channel by name.
		if back, err := nixl.ParseProgress(tg.String()); err != nil || back != tg {
			t.Errorf("%v does not parse back: %v, %v", tg, back, err)
		}
	}
	var p XferProgress
	if err := p.UnmarshalText([]byte("spin")); err == nil {
		t.Error("--progress spin accepted")
	}
	o := smallXfer(nixl.Write)
	o.Progress = "sometimes"
	if err := o.Validate(); err == nil || !strings.Contains(err.Error(), "unknown progress") {
		t.Errorf("Validate: %v", err)
	}
	if DefaultXferOptions().Progress != XferPoll {
		t.Error("bench xfer does not poll by default")
	}
}
