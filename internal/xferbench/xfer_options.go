package xferbench

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"slices"

	"github.com/nixlctl/nixlctl/internal/engine"
	"github.com/nixlctl/nixlctl/internal/enum"
	"github.com/nixlctl/nixlctl/internal/errkind"
	"github.com/nixlctl/nixlctl/internal/live"
	"github.com/nixlctl/nixlctl/internal/nixl"
	"github.com/nixlctl/nixlctl/internal/report"
	"github.com/nixlctl/nixlctl/internal/runcore"
)

// XferOptions configure `bench xfer`, nixlbench's sweep with KV-minded
// extras. Sizes are bytes.
//
// As HandoffOptions, it is the one shape of these options: the CLI decodes
// its flags into it (mapstructure tags are the flag names, "-" is not a
// flag) and Validate returns field errors the CLI names by flag.
type XferOptions struct {
	Backend          string           `mapstructure:"backend"`
	Op               nixl.Op          `mapstructure:"op-type"`
	InitiatorSeg     nixl.MemType     `mapstructure:"mem"`           // the handoff benchmarks' name; --initiator-seg-type (nixlbench's) is an alias
	TargetSeg        nixl.MemType     `mapstructure:"target-mem"`    // --target-seg-type is an alias
	Device           int              `mapstructure:"device"`        // GPU of the initiator's VRAM
	TargetDevice     int              `mapstructure:"target-device"` // GPU of the target's VRAM; -1: Device
	StartBlock       runcore.ByteSize `mapstructure:"start-block-size"`
	MaxBlock         runcore.ByteSize `mapstructure:"max-block-size"`
	StartBatch       int              `mapstructure:"start-batch-size"`
	MaxBatch         int              `mapstructure:"max-batch-size"`
	NumIter          int              `mapstructure:"num-iter"`
	WarmupIter       int              `mapstructure:"warmup-iter"`
	LargeBlkIterFtr  int              `mapstructure:"large-blk-iter-ftr"` // iterations are divided by this above 1 MiB blocks
	PipelineDepth    int              `mapstructure:"pipeline-depth"`
	TotalBufferSize  runcore.ByteSize `mapstructure:"total-buffer-size"` // 0: max block x max batch, at least 64 KiB
	CheckConsistency bool             `mapstructure:"check-consistency"`
	DRAMAlloc        engine.DRAMAlloc `mapstructure:"dram-alloc"`
	HugePages        bool             `mapstructure:"use-hugepages"`
	RecreateXfer     bool             `mapstructure:"recreate-xfer"`
	DescOrder        DescOrder        `mapstructure:"desc-order"`
	Notif            bool             `mapstructure:"notif"` // attach a notification to every request
	Progress         XferProgress     `mapstructure:"progress"`
	Shape            string           `mapstructure:"-"` // e.g. "llama-3.1-70b, 4096 tokens, TP 8" when derived from a model
	// Paced polls the requests in flight as the handoff endpoints wait
	// for theirs (nixl.PollPacer, as their nixl.Poller: yield for 200 µs
	// without an end, then sleep 20 µs between passes) instead of
	// spinning as nixlbench does; not a flag: the handoffs'
	// --xfer-reference sets it (see xferReference).
	Paced bool `mapstructure:"-"`
	// NoCopyReference leaves out the same-run copy each point is judged
	// against (memcpy_gbps, up to a second of copying per point): the
	// handoffs' --xfer-reference keeps only the point's bandwidth, and
	// the handoff measures its own memcpy.
	NoCopyReference bool `mapstructure:"-"`
	// Spread walks the requests through the whole buffer, each post made
	// afresh over the next batch of block slots (as a handoff's request
	// takes blocks from across its pool), instead of reusing depth fixed
	// slots; not a flag: the handoffs' interleaved reference sets it
	// with a buffer of a pool's size, so that both move bytes over as
	// much memory (BenchmarkCopyOverSpan: over 4 GiB a side a copy ran about
	// 0.8x one over 1 GiB here).
	Spread bool `mapstructure:"-"`

	Target TargetSpec `mapstructure:",squash"`
	// ChildStderr receives the target child's stderr (nil: this process's
	// stderr).
	ChildStderr io.Writer    `mapstructure:"-"`
	Version     string       `mapstructure:"-"`
	Log         *slog.Logger `mapstructure:"-"`
	// Live receives a Start, then a Point per finished sweep point, and
	// warnings as they happen (nil: nobody listens).
	Live live.Sink `mapstructure:"-"`
	// Snapshot, when set (--save), is given the result as it stands when
	// the sweep starts and after each point, so that a killed run leaves
	// the points it finished.
	Snapshot func(report.Result) error `mapstructure:"-"`
}

// DefaultXferOptions are nixlbench's defaults where it has them (the
// CLI's flag defaults come from here).
func DefaultXferOptions() XferOptions {
	return XferOptions{Backend: "auto", Op: nixl.Write, InitiatorSeg: nixl.DRAM, TargetSeg: nixl.DRAM, TargetDevice: -1,
		StartBlock: 4 << 10, MaxBlock: 64 << 20, StartBatch: 1, MaxBatch: 1, NumIter: 1000, WarmupIter: 100,
		LargeBlkIterFtr: 16, PipelineDepth: 1, DRAMAlloc: engine.AllocMmap, DescOrder: DescSequential, Progress: XferPoll}
}

// XferProgress is how the sweep's two agents are progressed ("": poll).
// Backends that progress their own way (nixlctl's UCX layer) ignore it.
type XferProgress string

const (
	// XferPoll is nixlbench's way: no progress threads; the initiator polls
	// its requests without pause and the target spins on notifications (a
	// core each while the sweep runs). NIXL's progress thread would instead
	// be woken by every event and contend for the worker: single requests
	// of 4 to 64 KiB ran 2.5-3.5x slower with it (docs/backends.md).
	XferPoll XferProgress = "poll"
	// XferThread leaves progress to the backend's own thread on both sides,
	// as engines run NIXL.
	XferThread XferProgress = "thread"
)

// XferProgresses lists the valid progress modes.
var XferProgresses = []XferProgress{XferPoll, XferThread}

func (p XferProgress) String() string { return string(p) }

// UnmarshalText accepts poll or thread.
func (p *XferProgress) UnmarshalText(b []byte) error {
	return enum.Parse(p, "progress", b, XferProgresses)
}

// agents is the initiator's and the target's progress.
func (p XferProgress) agents() (initiator, target nixl.Progress) {
	if p == XferThread {
		return nixl.ProgressBackground, nixl.ProgressBackground
	}
	return nixl.ProgressCaller, nixl.ProgressSpin
}

// TargetSpec says where the target runs.
type TargetSpec struct {
	Inproc bool     `mapstructure:"inproc"` // a goroutine of this process
	Addr   string   `mapstructure:"target"` // a target started elsewhere (serve target --listen)
	Exe    string   `mapstructure:"-"`      // else: this program as a child; default os.Executable
	Args   []string `mapstructure:"-"`      // child arguments; default serve target --stdio
	Env    []string `mapstructure:"-"`
}

// DescOrder is where a batch's descriptors point in the buffer.
type DescOrder string

// Descriptor orders.
const (
	// DescSequential is nixlbench's j*block.
	DescSequential DescOrder = "sequential"
	// DescRandom scatters descriptors over the buffer (a fragmented block table).
	DescRandom DescOrder = "random"
)

// DescOrders lists the valid orders.
var DescOrders = []DescOrder{DescSequential, DescRandom}

func (d DescOrder) String() string { return string(d) }

// UnmarshalText accepts sequential or random.
func (d *DescOrder) UnmarshalText(b []byte) error {
	return enum.Parse(d, "descriptor order", b, DescOrders)
}

// Validate checks the options, nixlbench's rules included, as field
// errors (errkind.FieldError) joined and marked bad input.
func (o *XferOptions) Validate() error {
	var errs []error
	bad := func(field, format string, a ...any) { errs = append(errs, errkind.Field(field, format, a...)) }
	if o.StartBlock <= 0 {
		bad("StartBlock", "must be positive")
	} else if o.MaxBlock < o.StartBlock {
		bad("MaxBlock", "must be at least the start block size (%v)", o.StartBlock)
	}
	if o.StartBatch <= 0 {
		bad("StartBatch", "must be positive")
	} else if o.MaxBatch < o.StartBatch {
		bad("MaxBatch", "must be at least the start batch size (%d)", o.StartBatch)
	}
	if o.NumIter <= 0 {
		bad("NumIter", "must be positive")
	}
	if o.WarmupIter < 0 {
		bad("WarmupIter", "must not be negative")
	}
	if o.PipelineDepth <= 0 {
		bad("PipelineDepth", "must be positive")
	}
	if o.LargeBlkIterFtr <= 0 {
		bad("LargeBlkIterFtr", "must be positive")
	}
	if o.Spread && o.CheckConsistency {
		bad("Spread", "checks one slot's bytes; a spread run moves others")
	}
	if o.TotalBufferSize < 0 {
		bad("TotalBufferSize", "must not be negative")
	} else if o.TotalBufferSize > 0 && o.MaxBlock > o.TotalBufferSize {
		bad("MaxBlock", "%v is larger than the total buffer size %v", o.MaxBlock, o.TotalBufferSize)
	}
	if o.Device < 0 {
		bad("Device", "must not be negative")
	}
	if o.TargetDevice < -1 {
		bad("TargetDevice", "must not be negative (-1: the initiator's device)")
	}
	if !o.DRAMAlloc.Valid() {
		bad("DRAMAlloc", "unknown DRAM allocation %q (want %s)", o.DRAMAlloc, engine.DRAMAllocChoices())
	}
	if !slices.Contains(DescOrders, o.DescOrder) {
		bad("DescOrder", "unknown descriptor order %q (want sequential or random)", o.DescOrder)
	}
	if o.Progress != "" && !slices.Contains(XferProgresses, o.Progress) {
		bad("Progress", "unknown progress %q (want poll or thread)", o.Progress)
	}
	if o.Op != nixl.Read && o.Op != nixl.Write {
		bad("Op", "unknown op %v", o.Op)
	}
	for field, m := range map[string]nixl.MemType{"InitiatorSeg": o.InitiatorSeg, "TargetSeg": o.TargetSeg} {
		if m != nixl.DRAM && m != nixl.VRAM {
			bad(field, "unknown memory type %v", m)
		}
	}
	if o.Target.Inproc && o.Target.Addr != "" {
		bad("Target.Inproc", "excludes a target address")
	}
	if o.Target.Addr != "" {
		if err := runcore.CheckAddr(o.Target.Addr); err != nil {
			bad("Target.Addr", "%v", err)
		}
	}
	if o.CheckConsistency && o.TotalBufferSize > 0 && o.TotalBufferSize < o.StartBlock {
		bad("CheckConsistency", "needs room for at least one block")
	}
	if len(errs) == 0 {
		o.validateBounds(bad, runcore.HostMemRoom())
	}
	return errkind.BadInput(errors.Join(errs...))
}

// Bounds of a sweep (see limits.go): iterations near maxint panicked in
// makeslice or ran until killed, a batch of 2^40 descriptors never got
// past preparing them.
const (
	MaxXferIters      = 10_000_000 // --num-iter, --warmup-iter: a point keeps a sample of each timed one
	MaxXferBatch      = 1 << 20    // --max-batch-size: descriptors in one request
	MaxPipelineDepth  = 1024       // --pipeline-depth: requests prepared and in flight at once
	maxXferPrepared   = 1 << 22    // descriptors prepared at once (depth x batch)
	maxXferBufferSize = 1 << 50    // past any host, and a doubling block size cannot wrap
)

// validateBounds refuses sweeps past the bounds, and buffers this host
// cannot hold (each side that runs here allocates bufferSize of DRAM;
// 16G on a 24 GB host failed in mmap after the target started).
func (o *XferOptions) validateBounds(bad func(field, format string, a ...any), room runcore.MemRoom) {
	if o.NumIter > MaxXferIters {
		bad("NumIter", "%d: at most %d", o.NumIter, MaxXferIters)
	}
	if o.WarmupIter > MaxXferIters {
		bad("WarmupIter", "%d: at most %d", o.WarmupIter, MaxXferIters)
	}
	if o.PipelineDepth > MaxPipelineDepth {
		bad("PipelineDepth", "%d: at most %d requests in flight", o.PipelineDepth, MaxPipelineDepth)
	}
	if o.MaxBatch > MaxXferBatch {
		bad("MaxBatch", "%d: at most %d descriptors a request", o.MaxBatch, MaxXferBatch)
	} else if o.PipelineDepth <= MaxPipelineDepth && o.PipelineDepth*o.MaxBatch > maxXferPrepared {
		bad("PipelineDepth", "%d x --max-batch-size %d: at most %d descriptors prepared at once", o.PipelineDepth, o.MaxBatch, maxXferPrepared)
	}
	if o.MaxBlock > maxXferBufferSize {
		bad("MaxBlock", "%v: at most %v", o.MaxBlock, runcore.ByteSize(maxXferBufferSize))
		return
	}
	if o.TotalBufferSize > maxXferBufferSize {
		bad("TotalBufferSize", "%v: at most %v", o.TotalBufferSize, runcore.ByteSize(maxXferBufferSize))
		return
	}
	if o.MaxBatch > MaxXferBatch || o.MaxBatch <= 0 {
		return
	}
	if o.TotalBufferSize == 0 && int64(o.MaxBlock) > maxXferBufferSize/int64(o.MaxBatch) {
		bad("MaxBatch", "%d x --max-block-size %v: more than %v a side; --total-buffer-size caps it", o.MaxBatch, o.MaxBlock, runcore.ByteSize(maxXferBufferSize))
		return
	}
	sides := int64(0) // the sides whose buffer is this host's DRAM
	if o.InitiatorSeg == nixl.DRAM {
		sides++
	}
	if o.TargetSeg == nixl.DRAM && o.Target.Addr == "" {
		sides++
	}
	size := int64(o.bufferSize())
	if sides == 0 || room.Fits(sides, size) {
		return
	}
	field, what := "TotalBufferSize", fmt.Sprintf("--total-buffer-size on %d sides here", sides)
	if o.TotalBufferSize == 0 {
		field, what = "MaxBatch", fmt.Sprintf("--max-block-size %v x --max-batch-size %d on %d sides here; --total-buffer-size caps it", o.MaxBlock, o.MaxBatch, sides)
	}
	bad(field, "does not fit on this host: %s", room.Need(sides, size, what))
}

// targetDevice is the target's GPU (-1 meaning the initiator's).
func (o *XferOptions) targetDevice() int {
	if o.TargetDevice < 0 {
		return o.Device
	}
	return o.TargetDevice
}

// bufferSize is what each side allocates.
func (o *XferOptions) bufferSize() int {
	if o.TotalBufferSize > 0 {
		return int(o.TotalBufferSize)
	}
	n := int(o.MaxBlock) * o.MaxBatch
	if n < 64<<10 {
		n = 64 << 10
	}
	return n
}

// iterations is how many requests a point of this block size times, and
// how many it runs first untimed.
func (o *XferOptions) iterations(block int) (iters, warm int) {
	iters, warm = o.NumIter, o.WarmupIter
	if block > 1<<20 {
		iters = max(1, iters/o.LargeBlkIterFtr)
		warm = max(0, warm/o.LargeBlkIterFtr)
	}
	return iters, warm
}

// Ignored lists the options of o that its memory types leave unread: the
// GPUs mean nothing to DRAM (the target's device defaults to the
// initiator's, so --device counts while either side is VRAM), and the
// DRAM allocation nothing to VRAM.
func (o *XferOptions) Ignored() []runcore.IgnoredField {
	var out []runcore.IgnoredField
	if o.InitiatorSeg != nixl.VRAM && o.TargetSeg != nixl.VRAM {
		out = append(out, runcore.IgnoredField{Field: "Device", Why: "only with VRAM (--mem or --target-mem)"})
	}
	if o.TargetSeg != nixl.VRAM {
		out = append(out, runcore.IgnoredField{Field: "TargetDevice", Why: "only with --target-mem VRAM"})
	}
	if o.InitiatorSeg == nixl.VRAM && o.TargetSeg == nixl.VRAM {
		// cuda.AllocSeg: VRAM comes from the CUDA driver on both sides.
		out = append(out, runcore.IgnoredField{Field: "DRAMAlloc", Why: "no DRAM with --mem VRAM --target-mem VRAM"},
			runcore.IgnoredField{Field: "HugePages", Why: "no DRAM with --mem VRAM --target-mem VRAM"})
	} else if o.DRAMAlloc == engine.AllocUCX {
		// Huge pages are asked of mmap (nixl.AllocDRAM); UCX allocates
		// its own way.
		out = append(out, runcore.IgnoredField{Field: "HugePages", Why: "only with --dram-alloc mmap (--dram-alloc ucx allocates through UCX)"})
	}
	if o.Backend == "ucx" {
		// nixlctl's UCX layer progresses its own way (XferProgress).
		out = append(out, runcore.IgnoredField{Field: "Progress", Why: "--backend ucx progresses on its own (--progress is for NIXL backends)"})
	} else if o.Backend == "" || o.Backend == "auto" {
		// auto becomes ucx where NIXL is not installed: --progress is then
		// as ignored as with --backend ucx, and was silently so.
		if b, err := nixl.Resolve(o.Backend); err == nil && b.Name == "ucx" {
			out = append(out, runcore.IgnoredField{Field: "Progress", Why: "--backend auto resolves to ucx here (NIXL is not installed), which progresses on its own (--progress is for NIXL backends)"})
		}
	}
	return out
}
