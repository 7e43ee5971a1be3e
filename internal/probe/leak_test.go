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
	"github.com/nixlctl/nixlctl/internal/testkit"
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
	if !strings.Contains(res.Recommendation, "The probe saw it in every configuration") {
		t.Errorf("self-test recommendation: %s", res.Recommendation)
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

// cancelAfter cancels a context at the n-th sample line.
type cancelAfter struct {
	n      int
	cancel func()
}

func (c *cancelAfter) Write(p []byte) (int, error) {
	if strings.Contains(string(p), " rss ") {
		if c.n--; c.n == 0 {
			c.cancel()
		}
	}
	return len(p), nil
}

// Ctrl-C: the run stops, and what was measured comes back.
func TestUCXLeakInterrupted(t *testing.T) {
	o := quickLeak(t)
	o.Axes = []EnvAxis{{Key: HookModeVar, Values: []string{"", "none"}}}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	o.Progress = &cancelAfter{n: 4, cancel: cancel}
	res, err := RunUCXLeak(ctx, o)
	if err == nil || res == nil || !res.Interrupted {
		t.Fatalf("err %v, result %+v", err, res)
	}
	if len(res.Configs) != 1 || !res.Configs[0].Interrupted || len(res.Configs[0].Samples) < 4 {
		t.Fatalf("want the first configuration's samples so far: %+v", res.Configs)
	}
	if res.Configs[0].Verdict != Inconclusive || !strings.Contains(res.Configs[0].Reason, "interrupted") {
		t.Errorf("verdict of a cut-short run: %s (%s)", res.Configs[0].Verdict, res.Configs[0].Reason)
	}
}

func TestParseEnvAxis(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want EnvAxis
		err  string
	}{
		{"UCX_TLS=tcp,self|default", EnvAxis{Key: "UCX_TLS", Values: []string{"tcp,self", ""}}, ""},
		{"UCX_RNDV_THRESH=8K,64K,8K", EnvAxis{Key: "UCX_RNDV_THRESH", Values: []string{"8K", "64K"}}, ""},
		{" UCX_X = a ", EnvAxis{Key: "UCX_X", Values: []string{"a"}}, ""},
		{"UCX_TLS", EnvAxis{}, "want KEY=VALUE"},
		{"=x", EnvAxis{}, "not a variable name"},
		{"9X=1", EnvAxis{}, "not a variable name"},
		{"UCX_TLS=a,,b", EnvAxis{}, "empty value"},
		{"UCX_TLS=", EnvAxis{}, "empty value"},
	} {
		t.Run(tc.in, func(t *testing.T) {
			got, err := ParseEnvAxis(tc.in)
			testkit.WantResult(t, got, err, tc.want, tc.err)
		})
	}
}

func TestMatrixAndChildEnv(t *testing.T) {
	axes, cs := matrix([]string{"ucx", "nixl"}, []EnvAxis{{Key: HookModeVar, Values: []string{"", "none"}}, {Key: "UCX_TLS", Values: []string{"tcp,self", "all"}}})
	if len(axes) != 2 || len(cs) != 8 {
		t.Fatalf("%d axes, %d configurations", len(axes), len(cs))
	}
	if cs[0].label != "UCX_MEM_MMAP_HOOK_MODE=default UCX_TLS=tcp,self" || cs[3].label != "UCX_MEM_MMAP_HOOK_MODE=none UCX_TLS=all" || cs[4].backend != "nixl" {
		t.Errorf("order: %+v", cs)
	}
	t.Setenv(HookModeVar, "bistro") // the user's own setting must not leak into "default"
	env := childEnv(axes, cs[1].set)
	var got []string
	for _, kv := range env {
		if strings.HasPrefix(kv, "UCX_") {
			got = append(got, kv)
		}
	}
	if d := cmp.Diff([]string{"UCX_TLS=all"}, got); d != "" {
		t.Errorf("child UCX env (-want +got):\n%s", d)
	}
}

func TestLeakValidate(t *testing.T) {
	base := quickLeak(t)
	for _, tc := range []struct {
		mut  func(*LeakOptions)
		want string
	}{
		{func(o *LeakOptions) { o.Interval = 0 }, "--interval must be > 0"},
		{func(o *LeakOptions) { o.Duration = -time.Second }, "--duration must be > 0"},
		{func(o *LeakOptions) { o.Interval = time.Minute }, "longer than --duration"},
		{func(o *LeakOptions) { o.Thresholds.WarmupS = 60 }, "--warmup-time"},
		{func(o *LeakOptions) { o.Backends = []string{"rdma"} }, `unknown backend "rdma"`},
		{func(o *LeakOptions) { o.Churn.Max = 1 }, "churn sizes"},
		{func(o *LeakOptions) { o.Axes = append(o.Axes, o.Axes[0]) }, "given twice"},
		// Rates that measure nothing, or leak past the host, refused
		// before the peers start (issue 29).
		{func(o *LeakOptions) { o.Rate = 1e-30 }, "less than one request in --duration"},
		{func(o *LeakOptions) { o.Rate = 1e9 }, "between 0 (back to back) and 1e+06"},
		{func(o *LeakOptions) { o.SelfTestLeakMBPerS = 1e30 }, "at most half of the"},
	} {
		o := base
		tc.mut(&o)
		if err := o.Validate(); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("want %q, got %v", tc.want, err)
		}
	}
	o := base
	o.Backends = []string{"nixl"} // known by name even when not built in: skipped, not an error
	if err := o.Validate(); err != nil {
		t.Error(err)
	}
}
