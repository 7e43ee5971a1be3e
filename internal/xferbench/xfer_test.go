package xferbench

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nixlctl/nixlctl/internal/ctl"
	"github.com/nixlctl/nixlctl/internal/runcore"
	"github.com/nixlctl/nixlctl/internal/runcore/runcoretest"

	"github.com/nixlctl/nixlctl/internal/engine"
	"github.com/nixlctl/nixlctl/internal/errkind"
	"github.com/nixlctl/nixlctl/internal/live"
	"github.com/nixlctl/nixlctl/internal/nixl"
	"github.com/nixlctl/nixlctl/internal/nixl/cuda"
	"github.com/nixlctl/nixlctl/internal/nixl/cuda/cudatest"
	_ "github.com/nixlctl/nixlctl/internal/nixl/cudaipc"
	_ "github.com/nixlctl/nixlctl/internal/nixl/ucx"
	"github.com/nixlctl/nixlctl/internal/testkit"
	"github.com/nixlctl/nixlctl/internal/xfertarget"
)

// TestMain lets this test binary double as bench xfer's target process
// ("target" among its arguments).
func TestMain(m *testing.M) {
	runcoretest.ServeChildIfAsked(func(args []string, log *slog.Logger) (ctl.Role, error) {
		if !slices.Contains(args, "target") {
			return nil, errors.New("want the target role among the arguments")
		}
		return xfertarget.Role(log), nil
	})
	os.Exit(m.Run())
}

// The CUDA driver for the VRAM runs (the fake one on machines without a
// GPU), chosen before any test runs; target children inherit the choice.
var _ = cudatest.MustSetup()

func smallXfer(op nixl.Op) XferOptions {
	exe, _ := os.Executable()
	return XferOptions{Backend: "ucx", Op: op, StartBlock: 4 << 10, MaxBlock: 16 << 10, StartBatch: 1, MaxBatch: 4,
		NumIter: 50, WarmupIter: 5, LargeBlkIterFtr: 16, PipelineDepth: 2, DRAMAlloc: engine.AllocMmap, DescOrder: DescSequential, CheckConsistency: true,
		Target: TargetSpec{Exe: exe, Args: []string{"-test.run=^$", "target"}, Env: []string{runcoretest.ChildEnv + "=1"}}}
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
		if res.HostOthers == nil || res.HostOthers.Samples != 1+len(res.Points) {
			t.Errorf("%v: host others %+v, want a sample before the sweep and after each point", op, res.HostOthers)
		}
		if res.Env.Backend != "ucx" || res.Config.Target != "process" || res.Env.Transport == "" {
			t.Errorf("result does not describe itself: %+v %+v", res.Env, res.Config)
		}
	}
}

// A target reached by address on this host is the run's own: its CPU
// time (a core, spinning on notifications) counted as a neighbour's, and
// every such run warned that it had shared the host (0.40 CPUs, where
// 0.05-0.07 remained once it was counted as the run's). Served here from
// this test process, the run must learn its PID and its placement.
func TestRunXferDialedTargetIsOwn(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() {
		served <- ctl.ServeListener(ctx, ln, xfertarget.Role(slog.New(slog.DiscardHandler)), slog.New(slog.DiscardHandler))
	}()
	defer func() {
		cancel()
		<-served
	}()
	o := smallXfer(nixl.Write)
	o.MaxBlock, o.MaxBatch = 4<<10, 1
	o.Target = TargetSpec{Addr: ln.Addr().String()}
	res, err := RunXfer(context.Background(), o)
	if err != nil {
		t.Fatal(err)
	}
	if res.Placement != runcore.PlacementOneHost || len(res.Endpoints) != 2 || res.Endpoints[1].PID != os.Getpid() {
		t.Fatalf("placement %q, endpoints %+v: want one host and the target's PID (this process's)", res.Placement, res.Endpoints)
	}
}

func TestRunXferInprocWithNotifsAndRecreate(t *testing.T) {
	o := smallXfer(nixl.Write)
	o.Target = TargetSpec{Inproc: true}
	o.Notif, o.RecreateXfer, o.DescOrder, o.DRAMAlloc = true, true, DescRandom, engine.AllocUCX
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

func TestRunXferInterrupted(t *testing.T) {
	o := smallXfer(nixl.Write)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	o.Live = live.Func(func(e live.Event) { // cancel once the first point is in
		if _, ok := e.(live.Point); ok {
			cancel()
		}
	})
	res, err := RunXfer(ctx, o)
	if err == nil || res == nil || !res.Interrupted || len(res.Points) != 1 {
		t.Fatalf("interrupted after the first point: err %v, result %+v", err, res)
	}
}

// A spread run's requests walk the whole buffer, block slot after block
// slot, wrapping at its end; without spread each pipeline slot keeps its
// own offsets.
func TestSlotWalk(t *testing.T) {
	const block, batch, depth, slots = 4096, 4, 2, 24
	r := &xferRun{o: &XferOptions{DescOrder: DescSequential}, rlen: slots * block}
	fixed := [][]int{r.offsets(block, batch, 0, nil), r.offsets(block, batch, 1, nil)}
	for _, spread := range []bool{false, true} {
		w := slotWalk{r: r, block: block, batch: batch, fixed: fixed, spread: spread, next: depth}
		seen := map[int]int{}
		for _, offs := range fixed {
			for _, off := range offs {
				seen[off/block]++
			}
		}
		for post := range 2 * slots / batch {
			for _, off := range w.offsets(post % depth) {
				seen[off/block]++
			}
		}
		want := depth * batch
		if spread {
			want = slots
		}
		if len(seen) != want {
			t.Errorf("spread %v: %d distinct block slots touched, want %d", spread, len(seen), want)
		}
		if spread {
			if got := w.offsets(0); got[0] != ((depth+2*slots/batch)*batch%slots)*block {
				t.Errorf("the walk did not wrap where it should: next offsets %v", got)
			}
		}
	}
}

// A spread reference (a pool's worth of buffer) runs through the real
// agents and measures.
func TestRunXferSpread(t *testing.T) {
	o := smallXfer(nixl.Read)
	o.Target = TargetSpec{Inproc: true}
	o.CheckConsistency, o.Spread, o.Notif = false, true, true
	o.StartBlock, o.MaxBlock, o.StartBatch, o.MaxBatch = 4<<10, 4<<10, 4, 4
	o.TotalBufferSize = 64 * 4 << 10
	res, err := RunXfer(context.Background(), o)
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Points) != 1 || res.Points[0].BandwidthGBps <= 0 || res.Points[0].PrepUS.Count < 50 {
		t.Fatalf("points %+v", res.Points)
	}
}

func TestXferValidate(t *testing.T) {
	base := smallXfer(nixl.Write)
	tests := []struct {
		name string
		mut  func(*XferOptions)
		want []string // the fields at fault
	}{
		{"block range", func(o *XferOptions) { o.MaxBlock = 1 }, []string{"MaxBlock"}},
		{"no block", func(o *XferOptions) { o.StartBlock = 0 }, []string{"StartBlock"}},
		{"batch", func(o *XferOptions) { o.StartBatch = 0 }, []string{"StartBatch"}},
		{"iterations", func(o *XferOptions) { o.NumIter, o.WarmupIter = 0, -1 }, []string{"NumIter", "WarmupIter"}},
		{"pipeline", func(o *XferOptions) { o.PipelineDepth = 0 }, []string{"PipelineDepth"}},
		{"buffer smaller than a block", func(o *XferOptions) { o.TotalBufferSize = 1024 }, []string{"MaxBlock", "CheckConsistency"}},
		{"dram alloc", func(o *XferOptions) { o.DRAMAlloc = "malloc" }, []string{"DRAMAlloc"}},
		{"desc order", func(o *XferOptions) { o.DescOrder = "backwards" }, []string{"DescOrder"}},
		{"device", func(o *XferOptions) { o.Device = -1 }, []string{"Device"}},
		{"target device", func(o *XferOptions) { o.TargetDevice = -2 }, []string{"TargetDevice"}},
		{"inproc and address", func(o *XferOptions) { o.Target.Inproc, o.Target.Addr = true, "x:1" }, []string{"Target.Inproc"}},
		{"spread and a consistency check", func(o *XferOptions) { o.Spread = true }, []string{"Spread"}},
		// Bounds (issue 29): maxint panicked in makeslice or ran until killed.
		{"iterations at maxint", func(o *XferOptions) { o.NumIter, o.WarmupIter = math.MaxInt, math.MaxInt }, []string{"NumIter", "WarmupIter"}},
		{"pipeline at maxint", func(o *XferOptions) { o.PipelineDepth = math.MaxInt }, []string{"PipelineDepth"}},
		{"batch past a request", func(o *XferOptions) { o.MaxBatch = 1 << 40 }, []string{"MaxBatch"}},
		{"depth x batch", func(o *XferOptions) { o.PipelineDepth, o.MaxBatch, o.MaxBlock = 1024, 8192, 4096 }, []string{"PipelineDepth"}},
		{"block x batch wraps", func(o *XferOptions) { o.MaxBlock, o.MaxBatch = 1<<50, 1<<20 }, []string{"MaxBatch"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			o := base
			tc.mut(&o)
			testkit.WantBadInput(t, o.Validate(), tc.want, "")
		})
	}
	d := DefaultXferOptions()
	if err := d.Validate(); err != nil {
		t.Errorf("the defaults: %v", err)
	}
}

// Buffers the host cannot hold are refused with the numbers; only the
// sides whose DRAM is this host's count. The room is given.
func TestXferBufferFits(t *testing.T) {
	base := smallXfer(nixl.Write)
	tests := []struct {
		name  string
		mut   func(*XferOptions)
		field string // "": fits
		msg   string
	}{
		{"fits", func(o *XferOptions) { o.TotalBufferSize = 1 << 30 }, "", ""},
		{"both sides here", func(o *XferOptions) { o.TotalBufferSize = 3 << 29 }, "TotalBufferSize", "2 x 1.5 GiB (--total-buffer-size on 2 sides here) = 3 GiB; 2 GiB of memory available"},
		{"a remote target's is not ours", func(o *XferOptions) { o.TotalBufferSize, o.Target.Addr = 3<<29, "x:1" }, "", ""},
		{"vram is not ours", func(o *XferOptions) {
			o.TotalBufferSize, o.InitiatorSeg, o.TargetSeg = 3<<30, nixl.VRAM, nixl.VRAM
		}, "", ""},
		{"block x batch", func(o *XferOptions) { o.MaxBlock, o.MaxBatch = 1<<30, 2 }, "MaxBatch", "--total-buffer-size caps it"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			o := base
			tc.mut(&o)
			var got []errkind.FieldError
			o.validateBounds(func(field, format string, a ...any) {
				got = append(got, errkind.FieldError{Field: field, Err: fmt.Errorf(format, a...)})
			}, runcore.MemRoom(2<<30))
			switch {
			case tc.field == "" && len(got) > 0:
				t.Errorf("refused: %v", got)
			case tc.field != "" && (len(got) != 1 || got[0].Field != tc.field || !strings.Contains(got[0].Error(), tc.msg)):
				t.Errorf("got %v, want %s: ...%s", got, tc.field, tc.msg)
			}
		})
	}
}

// DescOrder parses itself, naming the valid values when it cannot.
func TestDescOrderParses(t *testing.T) {
	runcoretest.CheckEnumParses(t, []runcoretest.EnumCase{
		{Dst: new(DescOrder), In: "random", Want: DescRandom},
		{Dst: new(DescOrder), In: "sequential", Want: DescSequential},
		{Dst: new(DescOrder), In: "zigzag", WantErr: "sequential, random"},
	})
}

// VRAM through the cuda-ipc backend, across two processes: every byte
// checked, the reference is the device-to-device copy of the same pattern.
func TestRunXferVRAM(t *testing.T) {
	cudatest.Require(t)
	devs := [][2]int{{0, 0}}
	if cuda.DeviceCount() > 1 {
		devs = append(devs, [2]int{0, 1})
	}
	for _, d := range devs {
		for _, op := range []nixl.Op{nixl.Write, nixl.Read} {
			o := smallXfer(op)
			o.Backend, o.InitiatorSeg, o.TargetSeg, o.Device, o.TargetDevice = "cuda-ipc", nixl.VRAM, nixl.VRAM, d[0], d[1]
			o.Notif = true
			res, err := RunXfer(context.Background(), o)
			if err != nil {
				t.Fatal(err)
			}
			c := res.Config
			if res.Env.Backend != "cuda-ipc" || c.Reference != "cuda-d2d" || c.InitiatorAlloc != "cuda" || c.TargetAlloc != "cuda" ||
				c.TargetDevice == nil || *c.TargetDevice != d[1] || res.Env.CUDA == "" || !strings.Contains(res.Env.Transport, "CUDA IPC") {
				t.Errorf("result does not describe itself: %+v %+v", res.Env, c)
			}
			if cuda.Fake() && !strings.Contains(strings.Join(res.Warnings, ";"), "FAKE") {
				t.Errorf("a run on the fake driver must say so: %q", res.Warnings)
			}
			for _, p := range res.Points {
				if !strings.HasPrefix(p.Consistency, "ok") || p.MemcpyGBps <= 0 || p.Efficiency <= 0 || p.LatencyUS.Count != 50 {
					t.Errorf("%v GPU %d->%d point %d x %d: %+v", op, d[0], d[1], p.BlockSize, p.BatchSize, p)
				}
			}
		}
	}
}

// A backend that cannot move the chosen memory says so before any target
// starts, as bad input naming the side.
func TestRunXferMemTypeRefused(t *testing.T) {
	cases := []struct {
		backend    string
		init, targ nixl.MemType
		want       string
	}{
		{"ucx", nixl.VRAM, nixl.VRAM, "--mem VRAM"},
		{"ucx", nixl.DRAM, nixl.VRAM, "--target-mem VRAM"},
		{"cuda-ipc", nixl.DRAM, nixl.DRAM, "--mem DRAM"},
		{"cuda-ipc", nixl.VRAM, nixl.DRAM, "--target-mem DRAM"},
	}
	for _, tc := range cases {
		o := smallXfer(nixl.Write)
		o.Target = TargetSpec{Exe: "/nonexistent/never-started"}
		o.Backend, o.InitiatorSeg, o.TargetSeg = tc.backend, tc.init, tc.targ
		_, err := RunXfer(context.Background(), o)
		if ok, why := cuda.Available(); !ok {
			// Without a driver: VRAM runs stop at the driver, cuda-ipc at Resolve.
			if err == nil || !strings.Contains(err.Error(), why) {
				t.Errorf("%s %v->%v without CUDA: %v (want %q)", tc.backend, tc.init, tc.targ, err, why)
			}
			continue
		}
		if !errors.Is(err, nixl.ErrMemType) || !errkind.IsBadInput(err) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s %v->%v: %v", tc.backend, tc.init, tc.targ, err)
		}
	}
}

// Mixed DRAM<->VRAM runs (a CUDA-enabled NIXL can do them; no backend
// here can) measure host<->device copies in the direction data moves.
func TestMixedReference(t *testing.T) {
	cudatest.Require(t)
	const size, block = 1 << 20, 64 << 10
	for _, tc := range []struct {
		init, targ nixl.MemType
		op         nixl.Op
		want       string
	}{
		{nixl.DRAM, nixl.VRAM, nixl.Write, "cuda-h2d"},
		{nixl.DRAM, nixl.VRAM, nixl.Read, "cuda-d2h"},
		{nixl.VRAM, nixl.DRAM, nixl.Write, "cuda-d2h"},
		{nixl.VRAM, nixl.DRAM, nixl.Read, "cuda-h2d"},
	} {
		r := &xferRun{o: &XferOptions{InitiatorSeg: tc.init, TargetSeg: tc.targ, Op: tc.op}}
		var err error
		if r.local, err = cuda.AllocSeg(nil, tc.init, 0, size, "mmap", false); err != nil {
			t.Fatal(err)
		}
		if err := r.setupReference(size); err != nil {
			t.Fatal(err)
		}
		gbps, err := r.reference(block, []int{0, 4 * block}, time.Millisecond)
		if r.ref != tc.want || err != nil || gbps <= 0 {
			t.Errorf("%v %v->%v: reference %s %v GB/s: %v", tc.op, tc.init, tc.targ, r.ref, gbps, err)
		}
		r.close()
	}
}

// TestRunXferPaced runs the handoff reference's settings: paced polling
// moves and verifies the same bytes as spinning, with notifications, and
// without, then with, the copy reference the handoff leaves out because
// it measures its own.
func TestRunXferPaced(t *testing.T) {
	for _, noCopy := range []bool{false, true} {
		o := smallXfer(nixl.Read)
		o.Target = TargetSpec{Inproc: true}
		o.Paced, o.Notif, o.MaxBlock, o.MaxBatch, o.NoCopyReference = true, true, 4<<10, 2, noCopy
		res, err := RunXfer(context.Background(), o)
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range res.Points {
			if p.BandwidthGBps <= 0 || p.TxUS.Count != int64(p.Iterations) || !strings.HasPrefix(p.Consistency, "ok") {
				t.Errorf("NoCopyReference %v: point %+v", noCopy, p)
			}
			if copied := p.MemcpyGBps > 0 && p.Efficiency > 0; copied == noCopy {
				t.Errorf("NoCopyReference %v: memcpy_gbps %v, efficiency %v", noCopy, p.MemcpyGBps, p.Efficiency)
			}
		}
	}
}
