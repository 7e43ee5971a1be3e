package bench

import (
	"context"
	"strings"
	"testing"

	"github.com/nixlctl/nixlctl/internal/engine"
	"github.com/nixlctl/nixlctl/internal/netpath"
	"github.com/nixlctl/nixlctl/internal/nixl"
	"github.com/nixlctl/nixlctl/internal/runcore"
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

func TestNetPathLocalRun(t *testing.T) {
	t.Setenv("UCX_NET_DEVICES", "")
	t.Run("handoff", func(t *testing.T) {
		o := handoffOpts(t, engine.ProtoPull, 1, 1)
		o.Requests = 3
		res, err := RunHandoff(context.Background(), o)
		if err != nil {
			t.Fatal(err)
		}
		payload := handoffPairBytes(res.Records, 1)(0, 1)
		checkLocalPath(t, res.NetPath, res.Warnings, payload, "prefill", "decode")
		if payload < res.Summary.Bytes {
			t.Errorf("payload %d is less than the summary's %d bytes", payload, res.Summary.Bytes)
		}
	})
	t.Run("xfer", func(t *testing.T) {
		o := smallXfer(nixl.Read)
		o.MaxBlock, o.MaxBatch = 8<<10, 2
		res, err := RunXfer(context.Background(), o)
		if err != nil {
			t.Fatal(err)
		}
		checkLocalPath(t, res.NetPath, res.Warnings, xferPayload(&o, res.Points), "initiator", "target")
		if res.NetPath["initiator"].Direction != netpath.Receive {
			t.Error("a READ's initiator receives")
		}
	})

}

func checkLocalPath(t *testing.T, np runcore.NetPath, warnings []string, payload int64, roles ...string) {
	t.Helper()
	for _, w := range warnings {
		if strings.HasPrefix(w, "net path") {
			t.Errorf("a local run warns: %s", w)
		}
	}
	for _, r := range roles {
		v, ok := np[r]
		if !ok || v.Error != "" || v.Payload != payload || payload <= 0 || v.Host == "" {
			t.Errorf("%s: verdict %+v (payload %d)", r, v, payload)
		}
	}
	if runcore.PathLine(np) == "" {
		t.Error("no path line")
	}
	t.Logf("path: %s", runcore.PathLine(np))
}
