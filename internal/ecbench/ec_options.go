package ecbench

import (
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"strings"
	"time"

	"github.com/nixlctl/nixlctl/internal/ec"
	"github.com/nixlctl/nixlctl/internal/errkind"
	"github.com/nixlctl/nixlctl/internal/kv"
	"github.com/nixlctl/nixlctl/internal/live"
	"github.com/nixlctl/nixlctl/internal/nixl"
	"github.com/nixlctl/nixlctl/internal/report"
	"github.com/nixlctl/nixlctl/internal/runcore"
	"github.com/nixlctl/nixlctl/internal/sidechannel"
	"github.com/nixlctl/nixlctl/internal/userfile"
	"golang.org/x/sys/unix"
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

// Ignored lists the options of o that bench ec does not read: without
// an encode time the entry is ready at once, so there is nothing for
// --overlap to overlap.
func (o *ECOptions) Ignored() []runcore.IgnoredField {
	if o.EncodeTime == 0 {
		return []runcore.IgnoredField{{Field: "Overlap", Why: "only with --encode-time (without an encode time there is nothing to overlap)"}}
	}
	return nil
}

// hostRoom is what this host can give the regions: free bytes of the
// RAM-backed file system they live in, and MemAvailable (unknown: -1).
type hostRoom struct{ shmFree, memAvail int64 }

// readHostRoom statfs's the region directory and reads /proc/meminfo.
func readHostRoom() hostRoom {
	r := hostRoom{-1, -1}
	var st unix.Statfs_t
	if unix.Statfs(ec.DefaultShmDir, &st) == nil {
		r.shmFree = int64(st.Bavail) * st.Bsize
	}
	if avail := runcore.MemAvailable(); avail > 0 {
		r.memAvail = avail
	}
	return r
}

// checkRegionsFit refuses regions this host cannot hold. The regions are
// pre-faulted files in /dev/shm, which is RAM: a 1T region would fill it
// (and then memory) page by page before failing, with other processes'
// shared memory starved meanwhile, so the sizes are checked up front.
// Only the regions created here count: a remote producer's is not ours.
func (o *ECOptions) checkRegionsFit(room hostRoom) error {
	producer := int64(0)
	if o.Producer.Addr == "" {
		producer = int64(o.ProducerRegion)
	}
	consumers := int64(o.Consumers) * int64(o.ConsumerRegion)
	limit := room.shmFree
	if room.memAvail >= 0 && (limit < 0 || room.memAvail < limit) {
		limit = room.memAvail
	}
	if limit < 0 {
		return nil // nothing known: let the allocation say
	}
	var have []string
	if room.shmFree >= 0 {
		have = append(have, report.Bytes(room.shmFree)+" free in "+ec.DefaultShmDir)
	}
	if room.memAvail >= 0 {
		have = append(have, report.Bytes(room.memAvail)+" of memory available")
	}
	free := strings.Join(have, ", ")
	switch {
	case producer > limit:
		return errkind.Field("ProducerRegion", "%s does not fit: %s", report.Bytes(producer), free)
	case producer+consumers > limit:
		return errkind.Field("ConsumerRegion", "%d consumers x %s (plus the producer's %s) do not fit: %s",
			o.Consumers, report.Bytes(int64(o.ConsumerRegion)), report.Bytes(producer), free)
	}
	return nil
}

// Bounds of bench ec's workload (see limits.go): a request's images are
// drawn distinct from the unique ones, each of which the driver tracks.
const (
	MaxImagesPerRequest = 4096
	MaxUniqueImages     = 1 << 20
)
