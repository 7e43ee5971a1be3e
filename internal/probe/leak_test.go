package probe

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"github.com/nixlctl/nixlctl/internal/kv"
)

// quickLeak is a short probe of one configuration: seconds, not minutes,
// and a slow transfer rate, so that it holds on a busy 2-core machine.
func quickLeak(t *testing.T) LeakOptions {
	m, err := kv.Preset("llama-3.2-1b")
	if err != nil {
		t.Fatal(err)
	}
	th := DefaultThresholds
	th.WarmupS = 4 // a new receiver settles in about 5 s (UCX pools, Go heap)
	return LeakOptions{Backends: []string{"ucx"}, Axes: []EnvAxis{{Key: HookModeVar, Values: []string{""}}},
		Duration: 12 * time.Second, Interval: 250 * time.Millisecond, Thresholds: th,
		Spec: kv.Spec{Model: m, BlockSize: 16}, Tokens: 256, Rate: 20,
		Churn: ChurnConfig{Rate: 200, Slots: 16, Min: 256 << 10, Max: 8 << 20}, Peer: testPeer(t)}
}

// A receiver that maps and touches 3 MB a second and never frees it is
// a LEAK at about 180 MB/min.
func TestUCXLeakSeesADeliberateLeak(t *testing.T) {
	o := quickLeak(t)
	o.SelfTestLeakMBPerS = 3
	var progress bytes.Buffer
	o.Progress = &progress
	res, err := RunUCXLeak(context.Background(), o)
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Configs) != 1 {
		t.Fatalf("%d configurations, want 1", len(res.Configs))
	}
	c := res.Configs[0]
	if c.Verdict != Leak {
		t.Fatalf("verdict %s (%s), want LEAK; samples %+v\n%s", c.Verdict, c.Reason, c.Samples, progress.String())
	}
	if d := cmp.Diff(180.0, c.SlopeMBPerMin, cmpopts.EquateApprox(0.2, 0)); d != "" {
		t.Errorf("slope (-want +got):\n%s", d)
	}
	if c.Sender.Requests == 0 || c.Receiver.Leaked == 0 || c.Receiver.ChurnOps == 0 || c.Receiver.Notifs == 0 {
		t.Errorf("the run did not do what it says: sender %+v receiver %+v", c.Sender, c.Receiver)
	}
	if !strings.Contains(progress.String(), "LEAK") || !strings.Contains(progress.String(), "requests sent") {
		t.Errorf("progress lines:\n%s", progress.String())
	}
}

// The same receiver without the deliberate leak is STABLE: transfers,
// notifications and churn alone do not grow it.
func TestUCXLeakStableReceiver(t *testing.T) {
	o := quickLeak(t)
	res, err := RunUCXLeak(context.Background(), o)
	if err != nil {
		t.Fatal(err)
	}
	c := res.Configs[0]
	if c.Verdict != Stable {
		t.Fatalf("verdict %s (%s), want STABLE; samples %+v", c.Verdict, c.Reason, c.Samples)
	}
	if c.Sender.Requests < 20 || c.Sender.Errors != 0 {
		t.Errorf("sender: %+v", c.Sender)
	}
	if c.Transport == "" || len(c.Samples) < 20 {
		t.Errorf("transport %q, %d samples", c.Transport, len(c.Samples))
	}
	if res.Env.UCX == "" || res.Schema == "" || res.Command != "probe ucx-leak" {
		t.Errorf("result does not describe itself: %+v", res.Meta)
	}
}
