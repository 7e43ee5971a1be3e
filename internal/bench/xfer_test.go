package bench

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/nixlctl/nixlctl/internal/engine"
	"github.com/nixlctl/nixlctl/internal/nixl"
	_ "github.com/nixlctl/nixlctl/internal/nixl/ucx"
)

func TestMain(m *testing.M) {
	// This test binary doubles as the endpoint child processes: an xfer
	// target when "target" is among its arguments, else an engine endpoint.
	if os.Getenv("NIXLCTL_BENCH_TEST_CHILD") == "1" {
		log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelError}))
		serve := engine.ServeEndpoint
		if slices.Contains(os.Args, "target") {
			serve = engine.ServeXferTarget
		}
		if err := serve(context.Background(), os.Stdin, os.Stdout, log); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	// ... and as the encoder of bench ec.
	if os.Getenv("NIXLCTL_BENCH_TEST_ENCODER") == "1" {
		if err := engine.ServeEncoder(context.Background(), os.Stdin, os.Stdout, slog.New(slog.NewTextHandler(os.Stderr, nil))); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

func smallXfer(op nixl.Op) XferOptions {
	exe, _ := os.Executable()
	return XferOptions{Backend: "ucx", Op: op, StartBlock: 4 << 10, MaxBlock: 16 << 10, StartBatch: 1, MaxBatch: 4,
		NumIter: 50, WarmupIter: 5, LargeBlkIterFtr: 16, PipelineDepth: 2, DRAMAlloc: "mmap", CheckConsistency: true,
		Target: TargetSpec{Exe: exe, Args: []string{"-test.run=^$", "target"}, Env: []string{"NIXLCTL_BENCH_TEST_CHILD=1"}}}
}

func TestRunXferAcrossProcesses(t *testing.T) {
	for _, op := range []nixl.Op{nixl.Write, nixl.Read} {
		res, err := RunXfer(context.Background(), smallXfer(op))
		if err != nil {
			t.Fatal(err)
		}
		if len(res.Points) != 3*3 {
			t.Fatalf("%v: %d points, want 9 (3 block sizes x 3 batch sizes)", op, len(res.Points))
		}
		for _, p := range res.Points {
			if p.BandwidthGBps <= 0 || p.LatencyUS.P50 <= 0 || p.LatencyUS.Count != 50 || p.MemcpyGBps <= 0 || p.Efficiency <= 0 {
				t.Errorf("%v point %d x %d has empty measurements: %+v", op, p.BlockSize, p.BatchSize, p)
			}
			if !strings.HasPrefix(p.Consistency, "ok") {
				t.Errorf("%v point %d x %d: consistency %q", op, p.BlockSize, p.BatchSize, p.Consistency)
			}
			if p.Bytes != int64(p.BlockSize*p.BatchSize*p.Iterations) {
				t.Errorf("bytes %d", p.Bytes)
			}
		}
		if res.Env.Backend != "ucx" || res.Config.Target != "process" || res.Env.Transport == "" {
			t.Errorf("result does not describe itself: %+v %+v", res.Env, res.Config)
		}
	}
}

func TestRunXferInprocWithNotifsAndRecreate(t *testing.T) {
	o := smallXfer(nixl.Write)
	o.Target = TargetSpec{Inproc: true}
	o.Notif, o.RecreateXfer, o.RandomOrder, o.DRAMAlloc = true, true, true, "ucx"
	o.MaxBlock, o.MaxBatch = 4<<10, 2
	res, err := RunXfer(context.Background(), o)
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Points) != 2 || res.Config.InitiatorAlloc != "ucx" || res.Config.TargetAlloc != "ucx" {
		t.Fatalf("points %d, allocs %s/%s", len(res.Points), res.Config.InitiatorAlloc, res.Config.TargetAlloc)
	}
	// Every request was created again: prep was measured each time.
	if got := res.Points[0].PrepUS.Count; got < 50 {
		t.Errorf("recreate: %d preps recorded", got)
	}
}

// cancelOnWrite cancels a context at the first progress line.
type cancelOnWrite struct{ cancel func() }

func (c cancelOnWrite) Write(p []byte) (int, error) { c.cancel(); return len(p), nil }

func TestRunXferInterrupted(t *testing.T) {
	o := smallXfer(nixl.Write)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	o.Progress = cancelOnWrite{cancel}
	res, err := RunXfer(ctx, o)
	if err == nil || res == nil || !res.Interrupted || len(res.Points) != 1 {
		t.Fatalf("interrupted after the first point: err %v, result %+v", err, res)
	}
}

func TestXferValidate(t *testing.T) {
	base := smallXfer(nixl.Write)
	tests := []struct {
		mut  func(*XferOptions)
		want string
	}{
		{func(o *XferOptions) { o.MaxBlock = 1 }, "block sizes"},
		{func(o *XferOptions) { o.StartBatch = 0 }, "batch sizes"},
		{func(o *XferOptions) { o.NumIter = 0 }, "--num-iter"},
		{func(o *XferOptions) { o.PipelineDepth = 0 }, "--pipeline-depth"},
		{func(o *XferOptions) { o.TotalBufferSize = 1024 }, "larger than --total-buffer-size"},
		{func(o *XferOptions) { o.DRAMAlloc = "malloc" }, "--dram-alloc"},
	}
	for _, tc := range tests {
		o := base
		tc.mut(&o)
		if err := o.Validate(); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("want %q, got %v", tc.want, err)
		}
	}
	o := base
	o.InitiatorSeg = nixl.VRAM
	if _, err := RunXfer(context.Background(), o); err == nil || !strings.Contains(err.Error(), "VRAM") {
		t.Errorf("VRAM on ucx: %v", err)
	}
}
