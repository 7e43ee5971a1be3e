package main

import (
	"context"
	"fmt"
	"strings"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/nixlctl/nixlctl/internal/errkind"
	"github.com/nixlctl/nixlctl/internal/kv"
	"github.com/nixlctl/nixlctl/internal/live"
	"github.com/nixlctl/nixlctl/internal/nixl"
	"github.com/nixlctl/nixlctl/internal/report"
	"github.com/nixlctl/nixlctl/internal/runcore"
	"github.com/nixlctl/nixlctl/internal/xferbench"
)

func newBenchCmd(a *app) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "bench",
		Short: "Measure transfers between real endpoints",
		Long: `Benchmarks that move real bytes between real endpoints (separate processes by
default) and report bandwidth, per-request latency percentiles, and efficiency
against a reference measured in the same run.`,
	}
	cmd.AddCommand(newBenchXferCmd(a), newHandoffCmd(a, "pull"), newHandoffCmd(a, "push"), newHandoffCmd(a, "sglang"), newBenchECCmd(a), newBenchProxyCmd(a))
	return cmd
}

// benchXferOptions is xferbench.XferOptions, which the flags decode into,
// plus the model flags that shape one point like a KV transfer and the
// measuring flags.
type benchXferOptions struct {
	xferbench.XferOptions `mapstructure:",squash"`
	Model                 string `mapstructure:"model"`
	ModelConfig           string `mapstructure:"model-config"`
	ISL                   int    `mapstructure:"isl"` // --tokens before one vocabulary
	TP                    int    `mapstructure:"tp"`
	BlockSize             int    `mapstructure:"block-size"` // --kv-block-size before one vocabulary
	measureOptions        `mapstructure:",squash"`
}

const benchXferLong = `A nixlbench-compatible transfer sweep: for each block size from
--start-block-size to --max-block-size (doubling) and each batch size (descriptors
per request) from --start-batch-size to --max-batch-size (doubling), post
--num-iter requests (after --warmup-iter) keeping --pipeline-depth in flight, and
report what nixlbench reports plus what it does not:

  Block Size (B), Batch Size   the sweep point
  B/W (GB/Sec)                 bytes moved / wall time of the timed loop (decimal GB)
  Avg Lat. (us)                nixlbench's wall time per descriptor (not a latency)
  Avg/P99 Prep (us)            creating a request (once per pipeline slot, or per
                               iteration with --recreate-xfer)
  Avg/P99 Post (us)            inside PostXferReq
  Avg/P99 Tx (us)              end of post to completion, from the agent's clock
  p50/p99/p99.9 (us)           per-request latency, post start to completion
  Descs/s, Post ns/desc        descriptor rate, and post cost per descriptor
  memcpy GB/s, Efficiency      memcpy of the same descriptor pattern in this
                               process, in the same run, and B/W / memcpy
                               (D2D GB/s for VRAM: see below)

Like NIXL, a WRITE completes once a flush says the data is at the target.
Above 1 MiB, iterations are divided by --large-blk-iter-ftr (16), as nixlbench does.

The target runs as a child process (nixlctl serve target) on loopback by
default, --inproc runs it in this process, --target HOST:PORT uses one started
with "nixlctl serve target --listen". DRAM comes from plain mmap (--dram-alloc
mmap, like an engine's own KV pool; on one host UCX moves it with cma) or from
UCX itself (--dram-alloc ucx, which lets shared-memory transports map it, as
ucx_perftest allocates). The result names the allocation and the transport UCX
really used, and warns on a TCP fallback.

GPU memory: --mem VRAM and --target-mem VRAM allocate with
the CUDA driver (loaded at run time; --device and --target-device pick the GPUs,
or NIXLCTL_DEVICE and NIXLCTL_TARGET_DEVICE). --backend cuda-ipc moves VRAM
between the two processes with CUDA IPC, on one GPU or between GPUs of this
node; the reference is then the device-to-device copy bandwidth (cuMemcpyDtoDAsync,
timed by CUDA events) of the same descriptor pattern on the initiator's GPU.
A backend that cannot move the chosen memory says so before anything runs
(Debian's UCX has no CUDA transports). See docs/gpu.md.

--check-consistency moves one batch of distinct descriptors tagged per
descriptor after each point and verifies every byte at the receiver, so a
misaddressed block fails (a whole-buffer fill pattern would not).

--model (with --isl, --tp, --block-size) shapes one sweep point like one
TP rank's KV transfer of that model: block = bytes per descriptor, batch =
descriptors per request, as "nixlctl kv layout" computes them; combine with
--desc-order random for a fragmented block table.`

const benchXferExample = `  nixlctl bench xfer
  nixlctl bench xfer --op-type READ --start-block-size 4K --max-block-size 64M --check-consistency
  nixlctl bench xfer --dram-alloc ucx --start-block-size 1M --max-block-size 1M --total-buffer-size 1M
  nixlctl bench xfer --model llama-3.1-70b --isl 4096 --tp 8 --desc-order random --num-iter 20
  nixlctl bench xfer --backend cuda-ipc --mem VRAM --target-mem VRAM --start-block-size 64K --max-block-size 64M`

func newBenchXferCmd(a *app) *cobra.Command {
	cmd := &cobra.Command{
		Use:     "xfer",
		Short:   "nixlbench-style block x batch transfer sweep between two processes",
		Long:    benchXferLong,
		Example: benchXferExample,
		Args:    cobra.NoArgs,
		RunE:    bound(a.runBenchXfer),
	}
	d := xferbench.DefaultXferOptions()
	f := cmd.Flags()
	transferBackendFlag(f, d.Backend, autoPicksNixl)
	f.String("op-type", d.Op.String(), "READ or WRITE")
	f.String("mem", d.InitiatorSeg.String(), "initiator memory: DRAM or VRAM")
	f.String("target-mem", d.TargetSeg.String(), "target memory: DRAM or VRAM")
	f.Int("device", d.Device, "GPU of the initiator's VRAM (CUDA device index, as this process sees it)")
	f.Int("target-device", d.TargetDevice, "GPU of the target's VRAM (default: --device)")
	f.String("start-block-size", d.StartBlock.String(), "first block size")
	f.String("max-block-size", d.MaxBlock.String(), "last block size (doubling)")
	f.Int("start-batch-size", d.StartBatch, "first batch size (descriptors per request)")
	f.Int("max-batch-size", d.MaxBatch, "last batch size (doubling)")
	f.Int("num-iter", d.NumIter, "timed requests per point")
	f.Int("warmup-iter", d.WarmupIter, "untimed requests per point")
	f.Int("large-blk-iter-ftr", d.LargeBlkIterFtr, "divide iterations by this for blocks above 1 MiB")
	f.Int("pipeline-depth", d.PipelineDepth, "requests in flight")
	f.String("total-buffer-size", d.TotalBufferSize.String(), "bytes per side (default: max block x max batch, at least 64K); smaller buffers are reused")
	f.Bool("check-consistency", d.CheckConsistency, "verify per-descriptor tags after each point")
	f.String("dram-alloc", d.DRAMAlloc.String(), "DRAM allocation: mmap (4 KiB pages), thp (mmap advised for transparent huge pages) or ucx (UCX-allocated)")
	f.Bool("use-hugepages", d.HugePages, "2 MiB pages for mmap buffers (needs vm.nr_hugepages)")
	f.Bool("recreate-xfer", d.RecreateXfer, "create and release the request every iteration")
	f.String("desc-order", d.DescOrder.String(), "descriptor placement: sequential (nixlbench) or random")
	f.Bool("notif", d.Notif, "attach a notification to every request")
	f.String("progress", d.Progress.String(), "poll: no progress threads, the initiator polls and the target spins (nixlbench's way); thread: the backend's progress thread (nixl only)")
	f.Bool("inproc", d.Target.Inproc, "run the target in this process")
	f.String("target", d.Target.Addr, "use a target started with serve target --listen (host:port)")
	f.String("model", "", "shape one point like a TP rank's KV transfer of this model preset")
	f.String("model-config", "", "like --model, from a HuggingFace config.json")
	f.Int("isl", 4096, "tokens per request for --model")
	f.Int("tp", 1, "tensor-parallel size for --model")
	f.Int("block-size", 16, "KV block size in tokens for --model")
	// nixlbench's and this command's first spellings (docs/reports.md, "Flag names").
	aliasFlag(f, "initiator-seg-type", "mem")
	aliasFlag(f, "target-seg-type", "target-mem")
	aliasFlag(f, "tokens", "isl")
	aliasFlag(f, "kv-block-size", "block-size")
	addMeasureFlags(cmd, false)
	return cmd
}

func (o benchXferOptions) checkExplicit(set explicitOptions) error {
	return ignoredErrors(set, o, o.ignored())
}

// ignored lists what this run does not read: the model's shape flags
// without a model, and with one the sweep bounds it replaces.
func (o benchXferOptions) ignored() []runcore.IgnoredField {
	out := o.XferOptions.Ignored()
	if o.Model == "" && o.ModelConfig == "" {
		for _, f := range []string{"ISL", "TP", "BlockSize"} {
			out = append(out, runcore.IgnoredField{Field: f, Why: "only with --model or --model-config"})
		}
		return out
	}
	for _, f := range []string{"StartBlock", "MaxBlock", "StartBatch", "MaxBatch"} {
		out = append(out, runcore.IgnoredField{Field: f, Why: "--model sets the block and batch sizes"})
	}
	return out
}

func (a *app) runBenchXfer(ctx context.Context, o benchXferOptions) error {
	x := o.XferOptions
	x.Version, x.Log = version, a.log
	if o.Model != "" || o.ModelConfig != "" {
		m, err := loadModel(o.Model, o.ModelConfig)
		if err != nil {
			return err
		}
		spec, err := kvSpec(m, "", o.BlockSize, "flash-attn", "HND", o.TP, 1, false)
		if err != nil {
			return err
		}
		an, err := kv.Analyze(spec, o.ISL, 0)
		if err != nil {
			return errkind.BadInputf("--isl: %v", err)
		}
		// The model's shape sets the batch: a refusal of it would name
		// --max-batch-size, which the user did not give.
		if an.DescriptorsPerRequest > xferbench.MaxXferBatch {
			return errkind.BadInputf("--isl %d: %s at TP %d is %s descriptors a request per rank; at most %s",
				o.ISL, m.Name, o.TP, report.Int(int64(an.DescriptorsPerRequest)), report.Int(xferbench.MaxXferBatch))
		}
		x.StartBlock, x.MaxBlock = runcore.ByteSize(an.BytesPerDescriptor), runcore.ByteSize(an.BytesPerDescriptor)
		x.StartBatch, x.MaxBatch = an.DescriptorsPerRequest, an.DescriptorsPerRequest
		x.Shape = fmt.Sprintf("%s, %d tokens, TP %d, %d-token blocks: %s descriptors of %s per request per rank",
			m.Name, o.ISL, o.TP, spec.BlockSize, report.Int(int64(an.DescriptorsPerRequest)), report.Bytes(an.BytesPerDescriptor))
	}
	if err := x.Validate(); err != nil {
		return flagErrors(err, x)
	}
	if err := checkBackendName(o.Backend); err != nil {
		return err
	}
	if err := o.measureOptions.validate(); err != nil {
		return err
	}
	x.ChildStderr = a.childStderr(o.measureOptions)
	x.Snapshot = a.snapshot(o.measureOptions)
	got, runErr := a.measure(ctx, o.measureOptions, func(ctx context.Context, sink live.Sink) (report.Result, error) {
		x.Live = sink
		res, err := xferbench.RunXfer(ctx, x)
		if res == nil {
			return nil, err
		}
		return res, err
	})
	if res, _ := got.(*xferbench.XferResult); res != nil {
		if err := a.render(res); err != nil {
			return err
		}
		for _, p := range res.Points {
			if strings.HasPrefix(p.Consistency, "FAILED") {
				return errkind.CheckFailedf("consistency check failed at block %d batch %d", p.BlockSize, p.BatchSize)
			}
		}
	}
	return runErr
}

// transferBackendFlag declares --backend of a command that moves data,
// naming every registered backend so that the help follows the registry;
// note (autoPicksNixl or nothing) follows the list.
func transferBackendFlag(f *pflag.FlagSet, dflt, note string) {
	f.String("backend", dflt, "transfer backend: "+strings.Join(append([]string{"auto"}, nixl.Backends()...), ", ")+note)
}

// autoPicksNixl is what --backend auto chooses, as the help of bench xfer
// and bench ec says it.
const autoPicksNixl = " (auto: nixl when installed, else ucx)"

// checkBackendName refuses a backend nobody registered (bad input, exit 2);
// a known one that cannot run here fails later with its reason (exit 1).
func checkBackendName(name string) error {
	if name == "" || name == "auto" {
		return nil
	}
	if _, ok := nixl.Lookup(name); !ok {
		return errkind.BadInputf("--backend %q: unknown (available: auto, %s)", name, strings.Join(nixl.Backends(), ", "))
	}
	return nil
}
