package handoff

import (
	"context"
	"testing"

	"github.com/nixlctl/nixlctl/internal/engine"
	"github.com/nixlctl/nixlctl/internal/runcore/runcoretest"
)

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
		runcoretest.CheckLocalPath(t, res.NetPath, res.Warnings, payload, "prefill", "decode")
		if payload < res.Summary.Bytes {
			t.Errorf("payload %d is less than the summary's %d bytes", payload, res.Summary.Bytes)
		}
	})

}
