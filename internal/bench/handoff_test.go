package bench

import (
	"context"
	"fmt"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nixlctl/nixlctl/internal/engine"
	"github.com/nixlctl/nixlctl/internal/kv"
)

func smallModel(t *testing.T) kv.Model {
	t.Helper()
	m, err := kv.Preset("llama-3.1-8b")
	if err != nil {
		t.Fatal(err)
	}
	m.NumLayers = 4
	return m
}

// handoffOpts runs both endpoints as child processes (this test binary).
func handoffOpts(t *testing.T, proto string, ptp, dtp int) HandoffOptions {
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	return HandoffOptions{Protocol: proto, Backend: "ucx", Spec: kv.Spec{Model: smallModel(t), BlockSize: 16, TP: ptp}, DecodeTP: dtp,
		Requests: 6, Warmup: 1, ISL: ISL{Dist: "uniform", Min: 1, Max: 400}, Concurrency: 3, Merge: true, DRAMAlloc: "mmap",
		Verify: engine.Full, Lease: 20 * time.Second, RegTimeout: 20 * time.Second, ChunkTokens: 64,
		Exe: exe, ExeArgs: []string{"-test.run=^$"}, ChildEnv: []string{"NIXLCTL_BENCH_TEST_CHILD=1"}, Seed: 3}
}

// Every protocol, every TP pair, across real processes: every byte
// verified, nothing left allocated.
func TestHandoffAcrossProcesses(t *testing.T) {
	for _, proto := range []string{engine.ProtoPull, engine.ProtoPush, engine.ProtoSGLang} {
		for _, tps := range [][2]int{{1, 1}, {2, 1}, {1, 2}, {4, 2}} {
			t.Run(fmt.Sprintf("%s/%d-%d", proto, tps[0], tps[1]), func(t *testing.T) {
				res, err := RunHandoff(context.Background(), handoffOpts(t, proto, tps[0], tps[1]))
				if err != nil {
					t.Fatal(err)
				}
				s := res.Summary
				if s.Requests != 6 || s.Failed != 0 || s.CorruptBlocks != 0 || s.LeakedBlocks != 0 {
					for _, r := range res.Records {
						if r.Error != "" {
							t.Log(r.Error)
						}
					}
					t.Fatalf("summary %+v", s)
				}
				if s.HandoffLatencyMS.P50 <= 0 || s.Bytes <= 0 || s.BandwidthGBps <= 0 || s.FirstHandshakeMS <= 0 {
					t.Errorf("empty measurements: %+v", s)
				}
				if res.Prefill.MalformedNotifs+res.Decode.MalformedNotifs+res.Prefill.UnknownNotifs+res.Decode.UnknownNotifs != 0 {
					t.Errorf("protocol noise: prefill %+v decode %+v", res.Prefill, res.Decode)
				}
				if proto == engine.ProtoPush {
					for _, r := range res.Records {
						if r.Freed != "pushed" {
							t.Errorf("%s freed %q, want pushed", r.ID, r.Freed)
						}
					}
				}
			})
		}
	}
}

func TestHandoffOpenLoopPrefixHitScatteredRecords(t *testing.T) {
	o := handoffOpts(t, engine.ProtoPull, 1, 1)
	o.Inproc, o.Rate, o.PrefixHit, o.Scattered, o.Requests = true, 200, 0.25, true, 12
	res, err := RunHandoff(context.Background(), o)
	if err != nil {
		t.Fatal(err)
	}
	var recs strings.Builder
	if n, err := res.WriteRecords(&recs); err != nil || n != 13 {
		t.Fatalf("WriteRecords: %d, %v", n, err)
	}
	if res.Summary.Failed != 0 || res.Summary.CorruptBlocks != 0 {
		t.Fatalf("%+v", res.Summary)
	}
	lines := strings.Split(strings.TrimSpace(recs.String()), "\n")
	if len(lines) != 1+13 || !strings.Contains(lines[0], `"schema":"nixlctl.records/v1"`) || !strings.Contains(lines[1], `"handoff_ms"`) {
		t.Fatalf("records file: %d lines, first %q", len(lines), lines[0])
	}
	for _, r := range res.Records {
		if r.PrefixTokens != int(float64(r.ISL)*0.25) {
			t.Errorf("prefix %d of %d", r.PrefixTokens, r.ISL)
		}
	}
}

func TestHandoffTrace(t *testing.T) {
	tr, err := ReadTrace(strings.NewReader("# arrival isl\n{\"arrival\": 0, \"isl\": 100}\n\n{\"arrival\": 0.01, \"isl\": 300}\n"))
	if err != nil || len(tr) != 2 {
		t.Fatalf("%v %v", tr, err)
	}
	for _, bad := range []string{"", "{\"arrival\": 1, \"isl\": 0}", "{\"arrival\": 2, \"isl\": 5}\n{\"arrival\": 1, \"isl\": 5}", "not json"} {
		if _, err := ReadTrace(strings.NewReader(bad)); err == nil {
			t.Errorf("trace %q accepted", bad)
		}
	}
	o := handoffOpts(t, engine.ProtoPush, 1, 1)
	o.Inproc, o.Trace, o.ISL, o.Rate, o.Warmup = true, tr, ISL{Dist: "trace"}, 1, 0
	res, err := RunHandoff(context.Background(), o)
	if err != nil || res.Summary.Requests != 2 || res.Summary.Failed != 0 {
		t.Fatalf("%v %+v", err, res.Summary)
	}
}

func TestHandoffValidate(t *testing.T) {
	base := handoffOpts(t, engine.ProtoPull, 1, 1)
	tests := []struct {
		mut  func(*HandoffOptions)
		want string
	}{
		{func(o *HandoffOptions) { o.Protocol = "carrier-pigeon" }, "protocol"},
		{func(o *HandoffOptions) { o.Requests = 0 }, "--requests"},
		{func(o *HandoffOptions) { o.Concurrency = 0 }, "--rate"},
		{func(o *HandoffOptions) { o.PrefixHit = 1 }, "--prefix-hit"},
		{func(o *HandoffOptions) { o.ISL = ISL{Dist: "uniform", Min: 5, Max: 1} }, "uniform"},
		{func(o *HandoffOptions) { o.DecodeTP = 3 }, "decode"},
		{func(o *HandoffOptions) { o.Prefill = "x:1" }, "--prefill and --decode"},
	}
	for _, tc := range tests {
		o := base
		tc.mut(&o)
		if err := o.Validate(); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("want %q, got %v", tc.want, err)
		}
	}
}

// A decode killed while requests are in flight: those requests fail, the
// run ends, and prefill gets its blocks back through the lease.
func TestHandoffDecodeKilledMidTransfer(t *testing.T) {
	o := handoffOpts(t, engine.ProtoPull, 1, 1)
	o.Requests, o.Warmup, o.ISL, o.Concurrency, o.Lease = 16, 0, ISL{Dist: "fixed", Fixed: 2048}, 4, 300*time.Millisecond
	o.Spec.Model.NumLayers = 32
	o.OnStart = func(_, d *Endpoint) {
		time.AfterFunc(150*time.Millisecond, func() { _ = d.Signal(syscall.SIGKILL) })
	}
	done := make(chan struct{})
	var res *HandoffResult
	go func() {
		defer close(done)
		res, _ = RunHandoff(context.Background(), o)
	}()
	select {
	case <-done:
	case <-time.After(60 * time.Second):
		t.Fatal("the run hung after decode died")
	}
	if res == nil || res.Summary.Failed == 0 {
		t.Fatalf("killing decode failed no request: %+v", res)
	}
	if res.Summary.CorruptBlocks != 0 {
		t.Errorf("corrupt blocks: %d", res.Summary.CorruptBlocks)
	}
	if res.Prefill.BlocksInUse != 0 || res.Prefill.ExpiredLeases == 0 {
		t.Errorf("prefill should free the dead decode's blocks by lease: %+v", res.Prefill)
	}
}

// A prefill killed before it WRITEs: decode's registration watchdog fails
// the requests and decode frees its pre-allocated blocks.
func TestHandoffPrefillKilledBeforeWrite(t *testing.T) {
	o := handoffOpts(t, engine.ProtoPush, 1, 1)
	o.Requests, o.Warmup, o.Concurrency, o.RegTimeout = 4, 0, 4, 500*time.Millisecond
	o.OnStart = func(p, _ *Endpoint) { _ = p.Signal(syscall.SIGKILL) }
	res, _ := RunHandoff(context.Background(), o)
	if res == nil || res.Summary.Failed != 4 {
		t.Fatalf("all requests should fail: %+v", res)
	}
	if res.Decode.BlocksInUse != 0 || res.Decode.RegTimeouts+res.Decode.HandshakeFails == 0 {
		t.Errorf("decode after: %+v", res.Decode)
	}
	for _, r := range res.Records {
		if r.Error == "" {
			t.Errorf("%s did not fail", r.ID)
		}
	}
}
