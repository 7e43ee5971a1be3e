package ecbench

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"math/rand/v2"
	"net"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/nixlctl/nixlctl/internal/ec"
	"github.com/nixlctl/nixlctl/internal/errkind"
	"github.com/nixlctl/nixlctl/internal/fleet"
	"github.com/nixlctl/nixlctl/internal/kv"
	"github.com/nixlctl/nixlctl/internal/live"
	"github.com/nixlctl/nixlctl/internal/mono"
	"github.com/nixlctl/nixlctl/internal/netpath"
	"github.com/nixlctl/nixlctl/internal/nixl"
	"github.com/nixlctl/nixlctl/internal/report"
	"github.com/nixlctl/nixlctl/internal/runcore"
	"github.com/nixlctl/nixlctl/internal/sidechannel"
	"github.com/nixlctl/nixlctl/internal/userfile"
)

// ECOptions configure `bench ec`: encoder-cache transfers between an
// encoder (producer) process and several consumers, with vLLM's
// ECCPUConnector protocol. Sizes are bytes.
type ECOptions struct {
	Backend   string  `mapstructure:"backend"`
	Direction nixl.Op `mapstructure:"direction"` // Read: the consumer READs (merged upstream); Write: the producer WRITEs
	// Vision is the encoder's geometry, which the CLI resolves from the
	// model flags.
	Vision           kv.Vision        `mapstructure:"-"`
	Grids            []kv.Grid        `mapstructure:"grid"` // unique image k has grid Grids[k % len]; none: the model's
	Requests         int              `mapstructure:"requests"`
	ImagesPerRequest int              `mapstructure:"images-per-request"`
	UniqueImages     int              `mapstructure:"unique-images"`
	ZipfS            float64          `mapstructure:"zipf-s"` // mm_hash popularity: P(k) ∝ 1/(k+1)^s; 0 is uniform
	Consumers        int              `mapstructure:"consumers"`
	ProducerRegion   runcore.ByteSize `mapstructure:"producer-region"`
	ConsumerRegion   runcore.ByteSize `mapstructure:"consumer-region"`
	AckTimeout       time.Duration    `mapstructure:"ack-timeout"`
	EncodeTime       time.Duration    `mapstructure:"encode-time"` // the encoder's time per image (the entry is not ready meanwhile)
	Overlap          bool             `mapstructure:"overlap"`     // ask consumers without waiting for the encode (NOT_READY happens)
	Verify           bool             `mapstructure:"verify"`      // check every block's tags on delivery, hits included
	Warmup           int              `mapstructure:"warmup"`      // untimed transfers per consumer before the run
	Seed             uint64           `mapstructure:"seed"`

	// The EC connector's compatibility hash: CompatFactorsFile is a JSON
	// object of a vLLM peer's four factors (vllm_version, model, dtype,
	// block_size_bytes), CompatHash a known hash to adopt; neither: the
	// factors as vLLM computes them for this geometry, with nixlctl's
	// version as vllm_version (a vLLM peer refuses that hash).
	CompatFactorsFile string                       `mapstructure:"compat-factors"`
	CompatHash        string                       `mapstructure:"compat-hash"`
	compatFactors     *sidechannel.ECCompatFactors `mapstructure:"-"`

	Producer ProducerSpec `mapstructure:",squash"`
	Records  io.Writer    `mapstructure:"-"` // JSON lines, one per image request (nil: none)
	// ChildStderr receives the encoder child's stderr (nil: this
	// process's stderr).
	ChildStderr io.Writer    `mapstructure:"-"`
	Version     string       `mapstructure:"-"`
	Log         *slog.Logger `mapstructure:"-"`
	// Live receives a Start, then a Request per image request's transfer
	// or hit (nil: nobody listens).
	Live live.Sink `mapstructure:"-"`
	// Snapshot, when set (--save), is given the result as it stands when
	// the timed phase starts, so that a killed run leaves a result that
	// says what ran (its --records lines say what finished).
	Snapshot func(report.Result) error `mapstructure:"-"`
}

// DefaultECOptions are the defaults of every knob that has one (the CLI's
// flag defaults come from here).
func DefaultECOptions() ECOptions {
	return ECOptions{Backend: "auto", Direction: nixl.Read, Requests: 200, ImagesPerRequest: 1, UniqueImages: 64, ZipfS: 1,
		Consumers: 2, ProducerRegion: 256 << 20, ConsumerRegion: 64 << 20, AckTimeout: ec.ECAckTimeout, Verify: true, Warmup: 1, Seed: 1}
}

// Bounds of bench ec's workload (see limits.go): a request's images are
// drawn distinct from the unique ones, each of which the driver tracks.
const (
	MaxImagesPerRequest = 4096
	MaxUniqueImages     = 1 << 20
)

// ProducerSpec says where the encoder runs.
type ProducerSpec struct {
	Inproc bool     `mapstructure:"inproc"`   // a goroutine of this process
	Addr   string   `mapstructure:"producer"` // an encoder started elsewhere (serve encoder --listen)
	Exe    string   `mapstructure:"-"`        // else: this program as a child; default ctl.SelfExe
	Args   []string `mapstructure:"-"`        // default serve encoder --stdio
	Env    []string `mapstructure:"-"`
}

// grids are the images' grids: the ones asked for, else the model's.
func (o *ECOptions) grids() []kv.Grid {
	if len(o.Grids) == 0 {
		return []kv.Grid{o.Vision.DefaultGrid}
	}
	return o.Grids
}

// Validate checks the options, as field errors (errkind.FieldError)
// joined and marked bad input.
func (o *ECOptions) Validate() error {
	var errs []error
	bad := func(field, format string, a ...any) { errs = append(errs, errkind.Field(field, format, a...)) }
	if err := o.Vision.Validate(); err != nil {
		errs = append(errs, fmt.Errorf("model: %w", err))
	}
	largest := int64(0)
	for _, g := range o.grids() {
		b, err := o.Vision.EmbeddingBytes(g)
		if err != nil {
			errs = append(errs, errkind.FieldError{Field: "Grids", Err: err})
		}
		largest = max(largest, b)
	}
	// Upper bounds (limits.go): at maxint --unique-images panicked in
	// makeslice, and --requests or --warmup ran until killed.
	if o.Requests <= 0 {
		bad("Requests", "must be positive (got %d)", o.Requests)
	} else if o.Requests > runcore.MaxRequests {
		bad("Requests", "%d: at most %d", o.Requests, runcore.MaxRequests)
	}
	if o.ImagesPerRequest <= 0 {
		bad("ImagesPerRequest", "must be positive (got %d)", o.ImagesPerRequest)
	} else if o.ImagesPerRequest > MaxImagesPerRequest {
		bad("ImagesPerRequest", "%d: at most %d", o.ImagesPerRequest, MaxImagesPerRequest)
	}
	if o.UniqueImages > MaxUniqueImages {
		bad("UniqueImages", "%d: at most %d", o.UniqueImages, MaxUniqueImages)
	} else if o.UniqueImages < o.ImagesPerRequest {
		bad("UniqueImages", "%d must be at least the images per request (%d): a request's images are distinct", o.UniqueImages, o.ImagesPerRequest)
	}
	if o.ZipfS < 0 || math.IsNaN(o.ZipfS) || o.ZipfS > 10 {
		bad("ZipfS", "must be between 0 (uniform) and 10 (got %g)", o.ZipfS)
	}
	if o.Consumers <= 0 || o.Consumers > 64 {
		bad("Consumers", "must be between 1 and 64 (got %d)", o.Consumers)
	}
	if o.Direction != nixl.Read && o.Direction != nixl.Write {
		bad("Direction", "want read or write")
	}
	if o.AckTimeout <= 0 {
		bad("AckTimeout", "must be positive")
	}
	if o.EncodeTime < 0 {
		bad("EncodeTime", "must not be negative")
	}
	if o.Warmup < 0 {
		bad("Warmup", "must not be negative")
	} else if o.Warmup > runcore.MaxRequests {
		bad("Warmup", "%d: at most %d", o.Warmup, runcore.MaxRequests)
	}
	if largest > 0 {
		if int64(o.ProducerRegion) < largest {
			bad("ProducerRegion", "%s cannot hold one image of %s", report.Bytes(int64(o.ProducerRegion)), report.Bytes(largest))
		}
		if int64(o.ConsumerRegion) < largest {
			bad("ConsumerRegion", "%s cannot hold one image of %s", report.Bytes(int64(o.ConsumerRegion)), report.Bytes(largest))
		}
	}
	if o.Producer.Inproc && o.Producer.Addr != "" {
		bad("Producer.Inproc", "excludes a producer address")
	}
	o.validateCompat(bad)
	if o.ProducerRegion > 0 && o.ConsumerRegion > 0 && o.Consumers > 0 {
		if err := o.checkRegionsFit(readHostRoom()); err != nil {
			errs = append(errs, err)
		}
	}
	return errkind.BadInput(errors.Join(errs...))
}

// ECResult is a whole run.
type ECResult struct {
	report.Meta
	Config    ECConfig           `json:"config"`
	Summary   ECSummary          `json:"summary"`
	Reference ECReference        `json:"reference"`
	Consumers []ec.ConsumerStats `json:"consumers"`
	Producer  *ec.ProducerStats  `json:"producer,omitempty"`
	NetPath   runcore.NetPath    `json:"net_path,omitempty"` // producer and consumers
	// Endpoints and Placement say where the consumers (this process) and
	// the encoder ran.
	Endpoints   []runcore.EndpointInfo `json:"endpoints,omitempty"`
	Placement   string                 `json:"placement,omitempty"`
	Interrupted bool                   `json:"interrupted,omitempty"`
}

// ECConfig echoes what ran.
type ECConfig struct {
	Model            string   `json:"model"`
	HFName           string   `json:"hf_name"`
	HiddenSize       int      `json:"hidden_size"`
	DType            string   `json:"dtype"`
	SpatialMerge     int      `json:"spatial_merge_size"`
	BlockBytes       int      `json:"block_bytes"`
	Grids            []string `json:"grids"`
	ImageBytes       []int64  `json:"image_bytes"`
	ImageBlocks      []int    `json:"image_blocks"`
	Direction        string   `json:"direction"`
	Requests         int      `json:"requests"`
	ImagesPerRequest int      `json:"images_per_request"`
	UniqueImages     int      `json:"unique_images"`
	ZipfS            float64  `json:"zipf_s"`
	Consumers        int      `json:"consumers"`
	ConsumersRunAs   string   `json:"consumers_run_as"`
	ProducerRegion   int      `json:"producer_region_bytes"`
	ProducerBlocks   int      `json:"producer_region_blocks"`
	ConsumerRegion   int      `json:"consumer_region_bytes"`
	ConsumerBlocks   int      `json:"consumer_region_blocks"`
	AckTimeoutMS     float64  `json:"ack_timeout_ms"`
	EncodeTimeMS     float64  `json:"encode_time_ms"`
	Overlap          bool     `json:"overlap"`
	Verify           bool     `json:"verify"`
	Warmup           int      `json:"warmup"`
	Seed             uint64   `json:"seed"`
	Producer         string   `json:"producer"` // process, inproc or the address
	CompatHash       string   `json:"compatibility_hash"`
}

// ECSummary aggregates the image requests. Latencies are per image:
// latency_ms is a cold transfer from sending the XferReq to the blocks
// being in the consumer's region; hit_latency_ms a local hit (lookup and
// pin); ack_ms and transfer_ms split the cold path.
type ECSummary struct {
	Requests            int                `json:"requests"`
	Images              int                `json:"images"`
	Hits                int                `json:"hits"`
	Transfers           int                `json:"transfers"`
	Failed              int                `json:"failed"`
	HitRate             float64            `json:"hit_rate"`
	Evictions           int64              `json:"evictions"`
	PinnedSkips         int64              `json:"pinned_skips"`
	Exhausted           int64              `json:"exhausted"`
	ProducerEvictions   int64              `json:"producer_evictions"`
	ProducerPinnedSkips int64              `json:"producer_pinned_skips"`
	NotReadyRetries     int64              `json:"not_ready_retries"`
	StaleAcks           int64              `json:"stale_acks"`
	Quarantined         int64              `json:"quarantined"`
	ProducerReloads     int64              `json:"producer_reloads"`
	AckBytes            int                `json:"ack_bytes"` // the largest OK ack: it carries the producer's mem descriptor
	Bytes               int64              `json:"bytes"`     // moved by transfers
	HitBytes            int64              `json:"hit_bytes"` // re-served from local caches
	LatencyMS           report.Percentiles `json:"latency_ms"`
	AckMS               report.Percentiles `json:"ack_ms"`
	TransferMS          report.Percentiles `json:"transfer_ms"`
	HitLatencyMS        report.Percentiles `json:"hit_latency_ms"`
	TransferGBps        float64            `json:"transfer_gbps"` // bytes / summed transfer time
	ColdGBps            float64            `json:"cold_gbps"`     // bytes / summed cold latency (ack included)
	WarmSpeedup         float64            `json:"warm_speedup"`  // cold p50 / hit p50
	FailuresByStatus    map[string]int64   `json:"failures_by_status"`
	Transport           string             `json:"transport,omitempty"`
	Histogram           string             `json:"latency_histogram,omitempty"`
}

// ECReference is memcpy of one image's bytes in this process, in the same
// run: the ceiling a same-host transfer can reach.
type ECReference struct {
	Bytes      int64   `json:"bytes"`
	MemcpyGBps float64 `json:"memcpy_gbps"`
	Efficiency float64 `json:"efficiency"` // transfer_gbps / memcpy_gbps
}

// ECRecord is one image request (the --records file has one per line).
type ECRecord struct {
	Request    int     `json:"request"`
	Consumer   int     `json:"consumer"`
	MMHash     string  `json:"mm_hash"`
	Outcome    string  `json:"outcome"`
	Status     string  `json:"status"`
	Bytes      int64   `json:"bytes"`
	Blocks     int     `json:"blocks"`
	AckMS      float64 `json:"ack_ms"`
	TransferMS float64 `json:"transfer_ms"`
	TotalMS    float64 `json:"total_ms"`
	Retries    int     `json:"not_ready_retries,omitempty"`
	Error      string  `json:"error,omitempty"`
	ackBytes   int
}

// Failure statuses of the orchestrator's side.
const (
	FailEncode            = "ENCODE_FAILED"      // the encoder could not be asked (gone)
	FailProducerExhausted = "PRODUCER_EXHAUSTED" // the encoder's region had no room
)

type ecImage struct {
	hash   string
	grid   kv.Grid
	bytes  int
	blocks int
}

// ecRun is the shared state of a run's consumers.
type ecRun struct {
	o        *ECOptions
	images   []ecImage
	cdf      []float64
	producer *ec.EncoderClient
	// producerConn is how the encoder was started: closing it flushes a
	// child's stderr.
	producerConn *fleet.Conn
	endpoint     string

	mu        sync.Mutex
	recs      *json.Encoder
	recErr    error
	lat, ack  *report.Histogram
	xfer, hit *report.Histogram
	sum       ECSummary
	xferNS    int64
	coldNS    int64
	done      int
}

// TorchDType is the dtype factor vLLM puts in its EC compatibility hash:
// str() of the model's torch dtype, "torch.bfloat16" and not "bfloat16"
// (ec_connector/cpu/scheduler.py ECCPUScheduler.__init__ @1730d65e:
// dtype=str(layout.dtype), layout.dtype = model_config.dtype).
func TorchDType(d kv.DType) string {
	switch d {
	case kv.BF16:
		return "torch.bfloat16"
	case kv.FP16:
		return "torch.float16"
	case kv.FP32:
		return "torch.float32"
	case kv.FP8:
		return "torch.float8_e4m3fn"
	}
	return string(d)
}

// validateCompat reads --compat-factors and checks that the factors
// describe this run's blocks: the hash stands for the layout, so a peer
// whose dtype or block size differs would be admitted with blocks of
// another shape.
func (o *ECOptions) validateCompat(bad func(field, format string, a ...any)) {
	if o.CompatFactorsFile != "" && o.CompatHash != "" {
		bad("CompatHash", "give --compat-factors or --compat-hash, not both")
	}
	if h := o.CompatHash; h != "" {
		if _, err := hex.DecodeString(h); err != nil || len(h) != 64 {
			bad("CompatHash", "%q is not a sha256 in hex (64 characters)", h)
		}
	}
	if o.CompatFactorsFile == "" {
		return
	}
	b, err := userfile.ReadFile(o.CompatFactorsFile, userfile.MaxSmall)
	if err != nil {
		bad("CompatFactorsFile", "%v", err)
		return
	}
	f, err := sidechannel.ParseECCompatFactors(b)
	if err != nil {
		bad("CompatFactorsFile", "%s: %v", o.CompatFactorsFile, err)
		return
	}
	if o.Vision.Validate() == nil {
		if want := TorchDType(o.Vision.DType); f.DType != want {
			bad("CompatFactorsFile", "%s: dtype %q, but this run's embeddings are %s (%q)", o.CompatFactorsFile, f.DType, o.Vision.DType, want)
		}
		if want := o.Vision.BlockBytes(); f.BlockSizeBytes != want {
			bad("CompatFactorsFile", "%s: block_size_bytes %d, but this run's blocks are %d bytes (hidden size × element size)", o.CompatFactorsFile, f.BlockSizeBytes, want)
		}
	}
	o.compatFactors = &f
}

// compatHash is the EC compatibility hash the run's peers advertise and
// check: a peer's factors or hash when given, else vLLM's factors for
// this geometry with nixlctl's version in place of vLLM's.
func (o *ECOptions) compatHash() string {
	switch {
	case o.compatFactors != nil:
		return o.compatFactors.Hash()
	case o.CompatHash != "":
		return strings.ToLower(o.CompatHash)
	}
	return sidechannel.ECCompatHash("nixlctl-"+o.Version, o.Vision.HFName, TorchDType(o.Vision.DType), o.Vision.BlockBytes())
}

// RunEC runs the benchmark. Interrupted, it returns what finished (with
// Interrupted set) and ctx's error.
func RunEC(ctx context.Context, o ECOptions) (*ECResult, error) {
	if o.Log == nil {
		o.Log = slog.New(slog.DiscardHandler)
	}
	if err := o.Validate(); err != nil {
		return nil, err
	}
	backend, err := nixl.Resolve(o.Backend)
	if err != nil {
		return nil, err
	}
	res := &ECResult{Meta: report.NewMeta("bench ec", o.Version)}
	runcore.RecordBackend(&res.Meta, backend.Name, backend.Version())
	o.Grids = o.grids()
	v := o.Vision
	block := v.BlockBytes()
	compat := o.compatHash()
	r := &ecRun{o: &o, lat: report.NewHistogram(), ack: report.NewHistogram(), xfer: report.NewHistogram(), hit: report.NewHistogram(),
		sum: ECSummary{FailuresByStatus: map[string]int64{}}}
	if o.Records != nil {
		r.recs = json.NewEncoder(o.Records)
	}
	c := ECConfig{Model: v.Name, HFName: v.HFName, HiddenSize: v.HiddenSize, DType: string(v.DType), SpatialMerge: v.Merge,
		BlockBytes: block, Direction: strings.ToLower(o.Direction.String()), Requests: o.Requests, ImagesPerRequest: o.ImagesPerRequest,
		UniqueImages: o.UniqueImages, ZipfS: o.ZipfS, Consumers: o.Consumers, ConsumersRunAs: "goroutines of this process, one agent and region each",
		ProducerRegion: int(o.ProducerRegion), ProducerBlocks: int(o.ProducerRegion) / block, ConsumerRegion: int(o.ConsumerRegion),
		ConsumerBlocks: int(o.ConsumerRegion) / block, AckTimeoutMS: ms(o.AckTimeout.Nanoseconds()), EncodeTimeMS: ms(o.EncodeTime.Nanoseconds()),
		Overlap: o.Overlap, Verify: o.Verify, Warmup: o.Warmup, Seed: o.Seed, CompatHash: compat}
	for _, g := range o.Grids {
		b, _ := v.EmbeddingBytes(g)
		n, _ := v.Tokens(g)
		c.Grids, c.ImageBytes, c.ImageBlocks = append(c.Grids, g.String()), append(c.ImageBytes, b), append(c.ImageBlocks, n)
	}
	res.Config = c
	r.images = makeImages(&o, block)
	r.cdf = zipfCDF(o.UniqueImages, o.ZipfS)

	if r.producerConn, res.Config.Producer, err = startProducer(ctx, &o); err != nil {
		return nil, err
	}
	r.producer = &ec.EncoderClient{Client: r.producerConn.Client}
	if o.Producer.Addr != "" {
		res.Endpoints, res.Placement = runcore.DescribePeer(ctx, "encoder", o.Producer.Addr, r.producer.Client)
	}
	defer func() {
		_ = r.producerConn.Close(10*time.Second, nil)
		// A producer that was killed (or a child of an earlier run that
		// was) leaves its region in /dev/shm: sweep the dead owners' files.
		if removed, err := ec.CleanStaleRegions(ec.DefaultShmDir); err == nil && len(removed) > 0 {
			o.Log.Info("removed shared-memory regions of dead processes", "files", removed)
		}
	}()
	listen := ""
	if o.Producer.Addr != "" {
		listen = "tcp://0.0.0.0:0" // reachable from this host
	}
	rep, err := r.producer.Call(ec.EncoderRequest{Op: "setup", Backend: backend.Name, Name: "ec-producer",
		RegionBytes: int(o.ProducerRegion), BlockBytes: block, CompatHash: compat, Listen: listen})
	if err != nil {
		return nil, err
	}
	r.endpoint = rep.Endpoint
	if o.Producer.Addr != "" {
		r.endpoint = reachable(rep.Endpoint, o.Producer.Addr)
	}

	consumers := make([]*ec.Consumer, o.Consumers)
	defer func() {
		for _, cons := range consumers {
			if cons != nil {
				cons.Close()
			}
		}
	}()
	for i := range consumers {
		if consumers[i], err = ec.NewConsumer(ec.ConsumerConfig{Name: fmt.Sprintf("ec-consumer-%d", i), Backend: backend.Name,
			RegionBytes: int(o.ConsumerRegion), BlockBytes: block, CompatHash: compat, Direction: o.Direction,
			AckTimeout: o.AckTimeout, Verify: o.Verify, Log: o.Log}); err != nil {
			return nil, err
		}
	}
	live.Emit(o.Live, live.Phase{Text: "warm-up"})
	if err := r.warmup(ctx, consumers); err != nil && ctx.Err() == nil {
		return nil, err
	}
	// Interrupted during the warm-up: nothing is measured below, and the
	// result still comes out, saying so (interrupted, no requests), as it
	// does for an interrupt a second later.
	live.Emit(o.Live, live.Start{Title: "bench ec " + c.Direction, Total: o.Requests * o.ImagesPerRequest, Unit: "images"})
	live.Emit(o.Live, live.Phase{Text: "measuring"})
	runcore.Snapshotter(o.Snapshot, res, o.Live)()

	path := runcore.WatchPath(ctx, o.Producer.Addr != "", runcore.PathEnd{Role: "producer", RPC: r.producer.Client, Dir: netpath.Send}, runcore.PathEnd{Role: "consumer", RPC: nil, Dir: netpath.Receive})
	var wg sync.WaitGroup
	for i, cons := range consumers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for q := i; q < o.Requests && ctx.Err() == nil; q += o.Consumers {
				r.request(ctx, q, i, cons)
			}
		}()
	}
	wg.Wait()
	path.Stop(ctx)
	r.finish(res, consumers)
	res.NetPath = path.Verdicts(runcore.TwoEnds(res.Summary.Bytes), res.Warn)
	if rep, err := r.producer.Call(ec.EncoderRequest{Op: "stats"}); err == nil {
		res.Producer = rep.Stats
		res.Summary.ProducerEvictions = rep.Stats.Cache.Evictions
		res.Summary.ProducerPinnedSkips = rep.Stats.Cache.PinnedSkips
		if o.Direction == nixl.Write {
			res.Summary.Transport = rep.Info.Details["transport:"+consumers[0].Agent().Name()]
		}
	} else {
		res.Warn(fmt.Sprintf("encoder stats unavailable: %v", err))
	}
	if res.Summary.Transport == "" {
		res.Summary.Transport = consumers[0].Transport()
	}
	res.Env.Transport = res.Summary.Transport
	r.warnings(res)
	for _, w := range res.Warnings {
		live.Emit(o.Live, live.Warning{Text: w})
	}
	res.Finish()
	if r.recErr != nil {
		return res, fmt.Errorf("--records: %w", r.recErr)
	}
	if err := ctx.Err(); err != nil {
		res.Interrupted = true
		res.Warn("interrupted: the run stopped early")
		return res, err
	}
	return res, nil
}

func startProducer(ctx context.Context, o *ECOptions) (*fleet.Conn, string, error) {
	// The encoder outlives an interrupt until RunEC closes it: consumers
	// finish their reads first, then it unlinks its region.
	p := fleet.Proc{Name: "encoder", Addr: o.Producer.Addr, Exe: o.Producer.Exe, Args: o.Producer.Args, DefaultArgs: []string{"serve", "encoder", "--stdio"},
		Env: o.Producer.Env, Stderr: o.ChildStderr, Outlive: true}
	if o.Producer.Inproc {
		p.InProcess = ec.EncoderRole(o.Log)
	}
	c, err := fleet.Start(ctx, p)
	if err != nil {
		return nil, "", err
	}
	return c, c.Where, nil
}

// reachable replaces a wildcard host in the side channel's endpoint with
// the host the control channel reached.
func reachable(endpoint, control string) string {
	host, _, err := net.SplitHostPort(strings.TrimPrefix(control, "tcp://"))
	if err != nil {
		return endpoint
	}
	rest := strings.TrimPrefix(endpoint, "tcp://")
	h, port, err := net.SplitHostPort(rest)
	if err != nil || (h != "0.0.0.0" && h != "::" && h != "") {
		return endpoint
	}
	return "tcp://" + net.JoinHostPort(host, port)
}

// makeImages names the unique images: mm_hash is a hex SHA-256 like
// vLLM's, derived from the seed so runs are repeatable.
func makeImages(o *ECOptions, block int) []ecImage {
	imgs := make([]ecImage, o.UniqueImages)
	for k := range imgs {
		sum := sha256.Sum256([]byte(fmt.Sprintf("nixlctl-bench-ec/%d/%d", o.Seed, k)))
		g := o.Grids[k%len(o.Grids)]
		n, _ := o.Vision.Tokens(g)
		imgs[k] = ecImage{hash: hex.EncodeToString(sum[:]), grid: g, bytes: n * block, blocks: n}
	}
	return imgs
}

// zipfCDF is the cumulative distribution of P(k) ∝ 1/(k+1)^s.
func zipfCDF(n int, s float64) []float64 {
	cdf := make([]float64, n)
	total := 0.0
	for k := range cdf {
		total += 1 / math.Pow(float64(k+1), s)
		cdf[k] = total
	}
	for k := range cdf {
		cdf[k] /= total
	}
	return cdf
}

// draw picks a request's distinct images.
func (r *ecRun) draw(q int) []ecImage {
	rng := rand.New(rand.NewPCG(r.o.Seed, uint64(q)))
	seen := map[int]bool{}
	out := make([]ecImage, 0, r.o.ImagesPerRequest)
	for len(out) < r.o.ImagesPerRequest {
		k := sort.SearchFloat64s(r.cdf, rng.Float64())
		k = min(k, len(r.cdf)-1)
		if seen[k] {
			continue
		}
		seen[k] = true
		out = append(out, r.images[k])
	}
	return out
}

// warmup moves throwaway images so that connections, remote agents and
// UCX endpoints exist before timing; they are dropped afterwards.
func (r *ecRun) warmup(ctx context.Context, consumers []*ec.Consumer) error {
	big := r.images[0]
	for _, img := range r.images {
		if img.bytes > big.bytes {
			big = img
		}
	}
	for i, cons := range consumers {
		for w := 0; w < r.o.Warmup; w++ {
			h := fmt.Sprintf("warmup-%d-%d", i, w)
			if _, err := r.producer.Call(ec.EncoderRequest{Op: "encode", MMHash: h, Bytes: big.bytes, Wait: true}); err != nil {
				return fmt.Errorf("warm-up: %w", err)
			}
			out := cons.Step(ctx, []ec.Want{{MMHash: h, Peer: r.endpoint, Bytes: big.bytes}})
			cons.EndStep()
			if out[0].Outcome != ec.OutcomeTransfer {
				return fmt.Errorf("warm-up transfer failed: %s %s", out[0].Status, out[0].Err)
			}
			_ = cons.Drop(h)
		}
	}
	return nil
}

// request is one request on consumer i: the orchestrator sends its
// images to the encoder, then the consumer fetches them.
func (r *ecRun) request(ctx context.Context, q, i int, cons *ec.Consumer) {
	imgs := r.draw(q)
	var wants []ec.Want
	var recs []ECRecord
	for _, img := range imgs {
		_, err := r.producer.Call(ec.EncoderRequest{Op: "encode", MMHash: img.hash, Bytes: img.bytes,
			DelayUS: r.o.EncodeTime.Microseconds(), Wait: !r.o.Overlap})
		if err != nil {
			st := FailEncode
			if strings.Contains(err.Error(), ec.ErrExhausted.Error()) {
				st = FailProducerExhausted
			}
			recs = append(recs, ECRecord{Request: q, Consumer: i, MMHash: img.hash, Outcome: ec.OutcomeFailed, Status: st, Error: err.Error()})
			continue
		}
		wants = append(wants, ec.Want{MMHash: img.hash, Peer: r.endpoint, Bytes: img.bytes})
	}
	if len(wants) > 0 {
		// A request in flight finishes after Ctrl-C (only new ones stop):
		// its waits are bounded by the ack and READ timeouts, and cutting
		// them short would count an interrupt as a failed fetch.
		for _, out := range cons.Step(context.WithoutCancel(ctx), wants) {
			recs = append(recs, ECRecord{Request: q, Consumer: i, MMHash: out.MMHash, Outcome: out.Outcome, Status: out.Status,
				Bytes: out.Bytes, Blocks: out.Blocks, AckMS: ms(out.AckNS), TransferMS: ms(out.XferNS), TotalMS: ms(out.TotalNS),
				Retries: out.Retries, Error: out.Err, ackBytes: out.AckBytes})
		}
		cons.EndStep()
	}
	r.record(q, recs)
}

func ms(ns int64) float64 { return float64(ns) / 1e6 }

func (r *ecRun) record(q int, recs []ECRecord) {
	r.mu.Lock()
	defer r.mu.Unlock()
	s := &r.sum
	s.Requests++
	for _, rec := range recs {
		s.Images++
		if r.recs != nil && r.recErr == nil {
			r.recErr = r.recs.Encode(rec)
		}
		ns := func(x float64) time.Duration { return time.Duration(x * 1e6) }
		switch rec.Outcome {
		case ec.OutcomeHit:
			s.Hits++
			s.HitBytes += rec.Bytes
			r.hit.Record(ns(rec.TotalMS))
		case ec.OutcomeTransfer:
			s.Transfers++
			s.Bytes += rec.Bytes
			r.lat.Record(ns(rec.TotalMS))
			r.ack.Record(ns(rec.AckMS))
			r.xfer.Record(ns(rec.TransferMS))
			r.xferNS += int64(rec.TransferMS * 1e6)
			s.AckBytes = max(s.AckBytes, rec.ackBytes)
			r.coldNS += int64(rec.TotalMS * 1e6)
		default:
			s.Failed++
			s.FailuresByStatus[rec.Status]++
		}
	}
	r.done++
	for _, rec := range recs {
		// Hits move no bytes but finish an image: progress, not bandwidth.
		live.Emit(r.o.Live, live.Request{Bytes: rec.Bytes * int64(b2i(rec.Outcome == ec.OutcomeTransfer)),
			Latency: time.Duration(rec.TotalMS * 1e6), OK: rec.Outcome == ec.OutcomeTransfer || rec.Outcome == ec.OutcomeHit})
	}
}

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}

func (r *ecRun) finish(res *ECResult, consumers []*ec.Consumer) {
	r.mu.Lock()
	defer r.mu.Unlock()
	s := r.sum
	if s.Images > 0 {
		s.HitRate = float64(s.Hits) / float64(s.Images)
	}
	for _, cons := range consumers {
		cs := cons.Stats()
		res.Consumers = append(res.Consumers, cs)
		s.Evictions += cs.Cache.Evictions
		s.PinnedSkips += cs.Cache.PinnedSkips
		s.Exhausted += cs.Cache.Exhausted
		s.NotReadyRetries += cs.NotReadyRetries
		s.StaleAcks += cs.StaleAcks
		s.Quarantined += cs.Quarantined
		s.ProducerReloads += cs.Reloads
	}
	s.LatencyMS, s.AckMS = r.lat.In(time.Millisecond), r.ack.In(time.Millisecond)
	s.TransferMS, s.HitLatencyMS = r.xfer.In(time.Millisecond), r.hit.In(time.Millisecond)
	if r.xferNS > 0 {
		s.TransferGBps = float64(s.Bytes) / float64(r.xferNS)
	}
	if r.coldNS > 0 {
		s.ColdGBps = float64(s.Bytes) / float64(r.coldNS)
	}
	if s.HitLatencyMS.P50 > 0 && s.LatencyMS.P50 > 0 {
		s.WarmSpeedup = s.LatencyMS.P50 / s.HitLatencyMS.P50
	}
	s.Histogram, _ = r.lat.Encode()
	res.Summary = s
	big := int64(0)
	for _, img := range r.images {
		big = max(big, int64(img.bytes))
	}
	res.Reference = ECReference{Bytes: big, MemcpyGBps: memcpyGBps(int(big))}
	if res.Reference.MemcpyGBps > 0 {
		res.Reference.Efficiency = s.TransferGBps / res.Reference.MemcpyGBps
	}
}

// memcpyGBps copies n bytes between two pre-faulted buffers for about
// 100 ms (at least 5 copies) and returns the rate.
func memcpyGBps(n int) float64 {
	if n <= 0 {
		return 0
	}
	src, dst := make([]byte, n), make([]byte, n)
	for i := 0; i < n; i += 4096 {
		src[i], dst[i] = 1, 1
	}
	var copied int64
	start := mono.Now()
	for k := 0; k < 5 || mono.Since(start) < 100*time.Millisecond; k++ {
		copied += int64(copy(dst, src))
	}
	return float64(copied) / float64(mono.Since(start).Nanoseconds())
}

func (r *ecRun) warnings(res *ECResult) {
	s := res.Summary
	if strings.Contains(s.Transport, "tcp") && strings.Contains(s.Transport, "rma: emulated") {
		res.Warn("TCP fallback: RMA runs as software emulation over TCP active messages; expect a fraction of shared-memory or RDMA bandwidth")
	}
	if s.Images > 0 && s.Failed*10 > s.Images {
		res.Warn(fmt.Sprintf("%d of %d image requests failed (see failures_by_status)", s.Failed, s.Images))
	}
	if n := s.FailuresByStatus[ec.FailTagMismatch]; n > 0 {
		res.Warn(fmt.Sprintf("%d deliveries had wrong bytes (tag mismatch)", n))
	}
	if s.Transfers == 0 {
		res.Warn("no transfer completed: no latency or bandwidth to report")
	}
	if s.Exhausted > 0 {
		res.Warn(fmt.Sprintf("consumer regions were exhausted %d times: one request's images did not fit beside pinned ones (raise --consumer-region)", s.Exhausted))
	}
}

// Ignored lists the options of o that bench ec does not read: without
// an encode time the entry is ready at once, so there is nothing for
// --overlap to overlap.
func (o *ECOptions) Ignored() []runcore.IgnoredField {
	if o.EncodeTime == 0 {
		return []runcore.IgnoredField{{Field: "Overlap", Why: "only with --encode-time (without an encode time there is nothing to overlap)"}}
	}
	return nil
}
