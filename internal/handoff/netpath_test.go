package handoff

import (
	"context"
	"strings"
	"testing"

	"github.com/nixlctl/nixlctl/internal/engine"
	"github.com/nixlctl/nixlctl/internal/runcore"
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
		checkLocalPath(t, res.NetPath, res.Warnings, payload, "prefill", "decode")
		if payload < res.Summary.Bytes {
			t.Errorf("payload %d is less than the summary's %d bytes", payload, res.Summary.Bytes)
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
