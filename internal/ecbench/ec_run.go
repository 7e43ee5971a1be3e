package ecbench

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"log/slog"
	"math"
	"math/rand/v2"
	"net"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/nixlctl/nixlctl/internal/ec"
	"github.com/nixlctl/nixlctl/internal/fleet"
	"github.com/nixlctl/nixlctl/internal/kv"
	"github.com/nixlctl/nixlctl/internal/live"
	"github.com/nixlctl/nixlctl/internal/mono"
	"github.com/nixlctl/nixlctl/internal/netpath"
	"github.com/nixlctl/nixlctl/internal/nixl"
	"github.com/nixlctl/nixlctl/internal/report"
	"github.com/nixlctl/nixlctl/internal/runcore"
)

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
