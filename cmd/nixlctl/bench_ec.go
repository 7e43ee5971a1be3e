package main

import (
	"context"
	"fmt"
	"strings"

	"github.com/spf13/cobra"

	"github.com/nixlctl/nixlctl/internal/ec"
	"github.com/nixlctl/nixlctl/internal/ecbench"
	"github.com/nixlctl/nixlctl/internal/errkind"
	"github.com/nixlctl/nixlctl/internal/kv"
	"github.com/nixlctl/nixlctl/internal/live"
	"github.com/nixlctl/nixlctl/internal/report"
	"github.com/nixlctl/nixlctl/internal/userfile"
)

// benchECOptions is ecbench.ECOptions, which the flags decode into, plus
// the flags that resolve to its kv.Vision, the records file and the
// measuring flags.
type benchECOptions struct {
	ecbench.ECOptions `mapstructure:",squash"`
	Model             string `mapstructure:"model"`
	HiddenSize        int    `mapstructure:"hidden-size"`
	DType             string `mapstructure:"dtype"`
	SpatialMerge      int    `mapstructure:"spatial-merge"`
	measureOptions    `mapstructure:",squash"`
}

const benchECLong = `Encoder-cache (EPD) transfers as vLLM's ECCPUConnector moves them: an encoder
(producer) holds image embeddings in a /dev/shm region of fixed-size blocks (one
embedding vector each: hidden size x dtype bytes), consumers fetch them by mm_hash
over a ZMQ side channel (XferReq/XferAck, msgpack) and NIXL/UCX, keep them in
their own region and re-serve repeats locally (a warm hit) until FIFO eviction
makes room for others.

The orchestrator's part is played by this command: for each request it draws
--images-per-request distinct images from --unique-images with Zipf popularity
(--zipf-s; 0 is uniform), asks the encoder to encode each one (a no-op for one
it still holds), then has a consumer fetch them. The encoder runs as a child
process ("nixlctl serve encoder"; --inproc in this process, --producer
HOST:PORT one started elsewhere); the --consumers consumers are goroutines of
this process, each with its own agent, region and DEALER, serving requests
round-robin.

An image of grid [t, h, w] is t*h*w/merge² embeddings: --model picks the
hidden size, dtype and spatial merge of a preset (override with --hidden-size,
--dtype, --spatial-merge), --grid the images' grids (default: the preset's).
Qwen3.5-4B with [1,44,80] is 880 blocks of 5,120 B = 4,505,600 B.

--direction read (default, the merged upstream design): the consumer READs the
producer's blocks, and the READ's notification "{session_id}:{mm_hash}" unpins
them. --direction write (the original design): the producer WRITEs into the
consumer's blocks named in the request and acks when done.

Reported per image: cold transfer latency (XferReq sent -> blocks in place,
split into ack and transfer, from CLOCK_MONOTONIC and the agent's own
transfer clock), warm-hit latency (lookup and pin), hit rate, bytes, transfer
GB/s against memcpy of the same bytes measured in this run, evictions and
pinned skips on both sides, NOT_READY retries, and failures by status (the
wire's MISSING, INCOMPAT, VERSION, INTERNAL, NOT_READY, and ACK_TIMEOUT,
READ_FAILED, EXHAUSTED, TAG_MISMATCH, ENCODE_FAILED, PRODUCER_EXHAUSTED).
Small --producer-region / --consumer-region force eviction. --records FILE
writes one JSON line per image request.`

const benchECExample = `  nixlctl bench ec
  nixlctl bench ec --requests 1000 --consumers 4 --unique-images 200 --zipf-s 1.1 --consumer-region 64M
  nixlctl bench ec --direction write --model qwen2.5-vl-7b --grid 1x44x80,1x28x28 --records ec.jsonl
  nixlctl bench ec --encode-time 5ms --overlap      # consumers ask before the encoder is done: NOT_READY`

func newBenchECCmd(a *app) *cobra.Command {
	cmd := &cobra.Command{
		Use:     "ec",
		Short:   "Encoder-cache (EPD) transfers: an encoder process and consumers over vLLM's EC protocol",
		Long:    benchECLong,
		Example: benchECExample,
		Args:    cobra.NoArgs,
		RunE:    bound(a.runBenchEC),
	}
	d := ecbench.DefaultECOptions()
	f := cmd.Flags()
	transferBackendFlag(f, d.Backend, autoPicksNixl)
	f.String("direction", strings.ToLower(d.Direction.String()), "read: the consumer READs (upstream); write: the producer WRITEs")
	f.String("model", kv.DefaultVisionModel, "vision geometry preset: "+strings.Join(kv.VisionPresets(), ", "))
	f.Int("hidden-size", 0, "override the preset's hidden size (elements per embedding)")
	f.String("dtype", "", "override the preset's embedding dtype (bf16, fp16, fp32, fp8)")
	f.Int("spatial-merge", 0, "override the preset's spatial merge size")
	f.StringSlice("grid", nil, "image patch grids TxHxW, comma-separated (default: the preset's)")
	f.Int("requests", d.Requests, "requests")
	f.Int("images-per-request", d.ImagesPerRequest, "distinct images per request")
	f.Int("unique-images", d.UniqueImages, "distinct images (mm_hashes) in the workload")
	f.Float64("zipf-s", d.ZipfS, "Zipf exponent of image popularity (0: uniform)")
	f.Int("consumers", d.Consumers, "consumers sharing the producer")
	f.String("producer-region", d.ProducerRegion.String(), "producer region size")
	f.String("consumer-region", d.ConsumerRegion.String(), "region size of each consumer")
	f.Duration("ack-timeout", d.AckTimeout, "consumer ack timeout (vLLM's consumer_ack_timeout_s)")
	f.Duration("encode-time", d.EncodeTime, "simulated encoder time per image (the entry is not ready meanwhile)")
	f.Bool("overlap", d.Overlap, "ask the consumer without waiting for the encode to finish")
	f.Bool("verify", d.Verify, "check every delivered block's tags (outside the timed path)")
	f.Int("warmup", d.Warmup, "untimed transfers per consumer first")
	f.Uint64("seed", d.Seed, "workload seed")
	f.String("compat-factors", "", "JSON file of a vLLM EC peer's compatibility factors (vllm_version, model, dtype as str(torch dtype) e.g. \"torch.bfloat16\", block_size_bytes): advertise and check the hash that peer computes (default: vLLM's factors for this geometry with nixlctl's version, which a vLLM peer refuses)")
	f.String("compat-hash", "", "adopt this EC compatibility hash (sha256 hex) as a vLLM peer advertises it")
	f.String("records", "", "write one JSON line per image request to this file")
	f.Bool("inproc", d.Producer.Inproc, "run the encoder in this process")
	f.String("producer", d.Producer.Addr, "use an encoder started with serve encoder --listen (host:port)")
	addMeasureFlags(cmd, false)
	return cmd
}

func (o benchECOptions) checkExplicit(set explicitOptions) error {
	// 0 was read as "the preset's", as if not given.
	if err := refuseExplicitZero(set,
		zeroFlag{"hidden-size", o.HiddenSize == 0, "a positive number of elements per embedding", "the preset's"},
		zeroFlag{"spatial-merge", o.SpatialMerge == 0, "a positive merge size", "the preset's"},
	); err != nil {
		return err
	}
	return ignoredErrors(set, o, o.ECOptions.Ignored())
}

func (a *app) runBenchEC(ctx context.Context, o benchECOptions) error {
	x := o.ECOptions
	x.Version, x.Log = version, a.log
	if err := checkBackendName(x.Backend); err != nil {
		return err
	}
	v, err := kv.VisionPreset(o.Model)
	if err != nil {
		return errkind.BadInputf("--model: %v", err)
	}
	if o.HiddenSize != 0 {
		v.HiddenSize = o.HiddenSize
	}
	if o.DType != "" {
		if v.DType, err = kv.ParseDType(o.DType); err != nil {
			return errkind.BadInputf("--dtype: %v", err)
		}
	}
	if o.SpatialMerge != 0 {
		v.Merge = o.SpatialMerge
	}
	x.Vision = v
	if err := x.Validate(); err != nil {
		return flagErrors(err, x)
	}
	// Before --records is created: a refused --save must leave no file.
	mo := o.measureOptions
	if err := mo.validate(); err != nil {
		return err
	}
	if mo.Records != "" && mo.Repeat > 1 {
		return errkind.BadInputf("--records with --repeat: bench ec streams every image's line as it goes, which would mix the runs; use --save DIR (the representative run's records)")
	}
	if o.measureOptions.Records != "" {
		f, err := userfile.Create(o.measureOptions.Records)
		if err != nil {
			return errkind.BadInputf("--records: %v", err)
		}
		defer f.Close()
		// Unbuffered: RunEC encodes each image request's line into f as
		// the request finishes, one write a line, so a killed run leaves
		// the lines of what finished (it streams; nothing to complete).
		x.Records = f
	}
	mo.Records = "" // bench ec writes its own records (x.Records)
	x.ChildStderr = a.childStderr(mo)
	x.Snapshot = a.snapshot(mo)
	got, runErr := a.measure(ctx, mo, func(ctx context.Context, sink live.Sink) (report.Result, error) {
		x.Live = sink
		res, err := ecbench.RunEC(ctx, x)
		if res == nil {
			return nil, err
		}
		return res, err
	})
	res, _ := got.(*ecbench.ECResult)
	if res != nil {
		if err := a.render(res); err != nil {
			return err
		}
		if n := res.Summary.FailuresByStatus[ec.FailTagMismatch]; n > 0 {
			return errkind.CheckFailedf("%d encoder-cache deliveries had wrong bytes", n)
		}
	}
	if runErr != nil && res == nil {
		return fmt.Errorf("bench ec: %w", runErr)
	}
	return runErr
}
