package ecbench

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"math"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nixlctl/nixlctl/internal/errkind"
	"github.com/nixlctl/nixlctl/internal/kv"
	"github.com/nixlctl/nixlctl/internal/live"
	"github.com/nixlctl/nixlctl/internal/nixl"
	"github.com/nixlctl/nixlctl/internal/report"
	"github.com/nixlctl/nixlctl/internal/runcore"
	"github.com/nixlctl/nixlctl/internal/testkit"
)

// smallEC is a run of small images (Qwen3.5-4B geometry, grid 1x8x8 = 16
// blocks of 5,120 B) with regions that force eviction on both sides.
func smallEC(dir nixl.Op) ECOptions {
	v, _ := kv.VisionPreset("qwen3.5-4b")
	exe, _ := os.Executable()
	img := 16 * 5120
	return ECOptions{Backend: "ucx", Direction: dir, Vision: v, Grids: []kv.Grid{{T: 1, H: 8, W: 8}}, Requests: 40,
		ImagesPerRequest: 2, UniqueImages: 12, ZipfS: 1, Consumers: 3, ProducerRegion: runcore.ByteSize(10 * img), ConsumerRegion: runcore.ByteSize(4 * img),
		AckTimeout: 2 * time.Second, Verify: true, Warmup: 1, Seed: 7,
		Producer: ProducerSpec{Exe: exe, Args: []string{"-test.run=^$"}, Env: []string{"NIXLCTL_BENCH_TEST_ENCODER=1"}}}
}

func TestRunECAcrossProcesses(t *testing.T) {
	for _, dir := range []nixl.Op{nixl.Read, nixl.Write} {
		t.Run(dir.String(), func(t *testing.T) {
			o := smallEC(dir)
			var recs bytes.Buffer
			o.Records = &recs
			res, err := RunEC(context.Background(), o)
			if err != nil {
				t.Fatal(err)
			}
			s := res.Summary
			if s.Requests != 40 || s.Images != 80 || s.Hits+s.Transfers+s.Failed != 80 {
				t.Fatalf("counts: %+v", s)
			}
			// Producer-side eviction can turn an encoded image into
			// MISSING before a consumer asks (three consumers share ten
			// images' room); nothing else may fail.
			for st := range s.FailuresByStatus {
				if st != "MISSING" {
					t.Errorf("failures: %v", s.FailuresByStatus)
				}
			}
			if s.Hits == 0 || s.Evictions == 0 || s.HitRate <= 0 || s.Bytes != int64(s.Transfers)*16*5120 {
				t.Errorf("hits %d, evictions %d, hit rate %g, bytes %d", s.Hits, s.Evictions, s.HitRate, s.Bytes)
			}
			if s.LatencyMS.P50 <= 0 || s.LatencyMS.P99 < s.LatencyMS.P50 || s.HitLatencyMS.Count != int64(s.Hits) || s.TransferGBps <= 0 {
				t.Errorf("latencies %+v, hits %+v, %g GB/s", s.LatencyMS, s.HitLatencyMS, s.TransferGBps)
			}
			if res.Reference.MemcpyGBps <= 0 || res.Reference.Efficiency <= 0 || res.Reference.Bytes != 16*5120 {
				t.Errorf("reference %+v", res.Reference)
			}
			if res.Env.Backend != "ucx" || res.Env.Transport == "" || res.Config.Producer != "process" || res.Producer == nil {
				t.Errorf("result does not describe itself: %+v %s", res.Env, res.Config.Producer)
			}
			if res.Producer.Cache.Evictions == 0 || s.ProducerEvictions != res.Producer.Cache.Evictions {
				t.Errorf("producer evictions: %+v", res.Producer.Cache)
			}
			// One record per image request, with the fields scripts read.
			lines := strings.Split(strings.TrimSpace(recs.String()), "\n")
			if len(lines) != 80 {
				t.Fatalf("%d records", len(lines))
			}
			kinds := map[string]int{}
			for _, l := range lines {
				var r map[string]any
				if err := json.Unmarshal([]byte(l), &r); err != nil {
					t.Fatal(err)
				}
				for _, k := range []string{"mm_hash", "outcome", "status", "bytes", "blocks", "ack_ms", "transfer_ms", "total_ms"} {
					if _, ok := r[k]; !ok {
						t.Fatalf("record without %s: %s", k, l)
					}
				}
				kinds[r["outcome"].(string)]++
			}
			if kinds["hit"] != s.Hits || kinds["transfer"] != s.Transfers {
				t.Errorf("records %v vs summary %+v", kinds, s)
			}
			// The JSON result has the documented top level.
			var buf bytes.Buffer
			if err := res.Render(&buf, report.FormatJSON); err != nil {
				t.Fatal(err)
			}
			var j map[string]any
			json.Unmarshal(buf.Bytes(), &j)
			sum, _ := j["summary"].(map[string]any)
			for _, k := range []string{"requests", "failed", "hit_rate", "evictions", "bytes", "latency_ms", "failures_by_status"} {
				if _, ok := sum[k]; !ok {
					t.Errorf("summary has no %s", k)
				}
			}
			lat, _ := sum["latency_ms"].(map[string]any)
			for _, k := range []string{"p50", "p90", "p99", "p999", "max"} {
				if _, ok := lat[k]; !ok {
					t.Errorf("latency_ms has no %s", k)
				}
			}
			if j["command"] != "bench ec" || j["schema"] == nil || j["reference"] == nil || j["warnings"] == nil {
				t.Errorf("meta: %v %v", j["command"], j["schema"])
			}
			var tbl bytes.Buffer
			res.Render(&tbl, report.FormatTable)
			if !strings.Contains(tbl.String(), "cold transfer") || !strings.Contains(tbl.String(), "Warm speed-up") {
				t.Errorf("table:\n%s", tbl.String())
			}
		})
	}
}

func TestRunECNotReadyRetries(t *testing.T) {
	o := smallEC(nixl.Read)
	o.Producer = ProducerSpec{Inproc: true}
	o.EncodeTime, o.Overlap = 30*time.Millisecond, true
	o.Requests, o.Consumers, o.ImagesPerRequest, o.UniqueImages = 6, 1, 1, 6
	o.ZipfS, o.ProducerRegion = 0, 20*16*5120
	res, err := RunEC(context.Background(), o)
	if err != nil {
		t.Fatal(err)
	}
	if res.Summary.NotReadyRetries == 0 || res.Summary.Failed != 0 || res.Config.Producer != "inproc" {
		t.Errorf("overlapped encodes should be retried until ready: %+v", res.Summary)
	}
}

// runInterrupted runs o with its encoder in this process, after arm has
// set o's hooks to call cancel, and fails unless the run ends interrupted
// with a result; it returns the result's summary.
func runInterrupted(t *testing.T, o ECOptions, arm func(o *ECOptions, cancel context.CancelFunc)) ECSummary {
	t.Helper()
	o.Producer = ProducerSpec{Inproc: true}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	arm(&o, cancel)
	res, err := RunEC(ctx, o)
	if err == nil || res == nil || !res.Interrupted {
		t.Fatalf("want an interrupted run: err %v, result %+v", err, res)
	}
	return res.Summary
}

func TestRunECInterrupted(t *testing.T) {
	o := smallEC(nixl.Read)
	o.Requests = 200
	n := 0
	s := runInterrupted(t, o, func(o *ECOptions, cancel context.CancelFunc) {
		o.Live = live.Func(func(e live.Event) { // cancel after a few images
			if _, ok := e.(live.Request); ok {
				if n++; n == 5 {
					cancel()
				}
			}
		})
	})
	if s.Requests == 0 || s.Requests >= 200 {
		t.Fatalf("interrupted run: %d requests, want some of the 200: %+v", s.Requests, s)
	}
}

// A fetch in flight when Ctrl-C comes finishes instead of failing as
// INTERRUPTED (which a busy CI machine once hit in stdout_clean.txtar):
// the cancel comes from the consumer's own "Request sent" log line, so
// the consumer is always between its Request and the Ack.
func TestRunECInterruptedFetchFinishes(t *testing.T) {
	for _, dir := range []nixl.Op{nixl.Read, nixl.Write} {
		t.Run(dir.String(), func(t *testing.T) {
			o := smallEC(dir)
			o.Requests, o.Consumers, o.ImagesPerRequest = 50, 1, 1
			s := runInterrupted(t, o, func(o *ECOptions, cancel context.CancelFunc) {
				var measuring atomic.Bool
				o.Live = live.Func(func(e live.Event) {
					if p, ok := e.(live.Phase); ok && p.Text == "measuring" {
						measuring.Store(true)
					}
				})
				o.Log = slog.New(cancelOnMessage{msg: "encoder cache: Request sent", armed: &measuring, cancel: cancel})
			})
			if s.Requests != 1 || s.Failed != 0 || s.Hits+s.Transfers != 1 || len(s.FailuresByStatus) != 0 {
				t.Errorf("the request in flight should finish: %+v", s)
			}
		})
	}
}

// cancelOnMessage is a fake slog handler for tests: it calls cancel at the
// first record whose message is msg once armed is set.
type cancelOnMessage struct {
	msg    string
	armed  *atomic.Bool
	cancel context.CancelFunc
}

func (h cancelOnMessage) Enabled(context.Context, slog.Level) bool { return true }
func (h cancelOnMessage) Handle(_ context.Context, r slog.Record) error {
	if r.Message == h.msg && h.armed.Load() {
		h.cancel()
	}
	return nil
}
func (h cancelOnMessage) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h cancelOnMessage) WithGroup(string) slog.Handler      { return h }

// Interrupted during the warm-up (a slow host reaches it seconds in): the
// result still comes, marked interrupted with nothing measured, instead of
// a "warm-up transfer failed" error and no result on stdout.
func TestRunECInterruptedInWarmup(t *testing.T) {
	o := smallEC(nixl.Read)
	o.Warmup = 2
	s := runInterrupted(t, o, func(o *ECOptions, cancel context.CancelFunc) {
		o.Live = live.Func(func(e live.Event) {
			if p, ok := e.(live.Phase); ok && p.Text == "warm-up" {
				cancel()
			}
		})
	})
	if s.Requests != 0 {
		t.Fatalf("interrupted in warm-up: %d requests measured, want none: %+v", s.Requests, s)
	}
}

func TestECValidate(t *testing.T) {
	tests := []struct {
		name string
		mut  func(*ECOptions)
		want []string // the fields at fault
		msg  string   // in the message
	}{
		{"requests", func(o *ECOptions) { o.Requests = 0 }, []string{"Requests"}, ""},
		{"unique images", func(o *ECOptions) { o.ImagesPerRequest = 13 }, []string{"UniqueImages"}, "12 must be at least the images per request (13)"},
		{"zipf", func(o *ECOptions) { o.ZipfS = -1 }, []string{"ZipfS"}, ""},
		{"zipf NaN", func(o *ECOptions) { o.ZipfS = math.NaN() }, []string{"ZipfS"}, ""},
		{"consumers", func(o *ECOptions) { o.Consumers = 0 }, []string{"Consumers"}, ""},
		{"consumer region", func(o *ECOptions) { o.ConsumerRegion = 1000 }, []string{"ConsumerRegion"}, "1000 B cannot hold one image"},
		{"producer region", func(o *ECOptions) { o.ProducerRegion = 1000 }, []string{"ProducerRegion"}, ""},
		{"grid", func(o *ECOptions) { o.Grids = []kv.Grid{{T: 1, H: 3, W: 4}} }, []string{"Grids"}, "multiples of the spatial merge"},
		{"ack timeout", func(o *ECOptions) { o.AckTimeout = 0 }, []string{"AckTimeout"}, ""},
		{"producer", func(o *ECOptions) { o.Producer = ProducerSpec{Inproc: true, Addr: "x:1"} }, []string{"Producer.Inproc"}, ""},
		{"model", func(o *ECOptions) { o.Vision.HiddenSize = 0 }, nil, "hidden size"},
		// Bounds (issue 29): maxint panicked in makeslice or ran until killed.
		{"requests at maxint", func(o *ECOptions) { o.Requests = math.MaxInt }, []string{"Requests"}, "at most 1000000"},
		{"warm-up at maxint", func(o *ECOptions) { o.Warmup = math.MaxInt }, []string{"Warmup"}, "at most 1000000"},
		{"unique images at maxint", func(o *ECOptions) { o.UniqueImages = math.MaxInt }, []string{"UniqueImages"}, "at most 1048576"},
		{"images per request", func(o *ECOptions) { o.ImagesPerRequest, o.UniqueImages = 1e8, 1e8 }, []string{"ImagesPerRequest", "UniqueImages"}, "at most 4096"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			o := smallEC(nixl.Read)
			tc.mut(&o)
			testkit.WantBadInput(t, o.Validate(), tc.want, tc.msg)
		})
	}
	o := smallEC(nixl.Read)
	if err := o.Validate(); err != nil {
		t.Errorf("valid options: %v", err)
	}
	o.Grids, o.Vision.DefaultGrid = nil, kv.Grid{T: 1, H: 8, W: 8} // the model's grid, small enough for the regions
	if err := o.Validate(); err != nil || len(o.grids()) != 1 || o.grids()[0] != o.Vision.DefaultGrid {
		t.Errorf("no grid: %v %v", o.grids(), err)
	}
}

func TestZipfDraws(t *testing.T) {
	o := smallEC(nixl.Read)
	o.UniqueImages, o.ImagesPerRequest = 50, 3
	for _, s := range []float64{0, 1, 3} {
		o.ZipfS = s
		r := &ecRun{o: &o, images: makeImages(&o, 5120), cdf: zipfCDF(o.UniqueImages, s)}
		counts := make([]int, o.UniqueImages)
		for q := 0; q < 2000; q++ {
			imgs := r.draw(q)
			seen := map[string]bool{}
			for _, img := range imgs {
				if seen[img.hash] {
					t.Fatalf("request %d repeats an image", q)
				}
				seen[img.hash] = true
			}
			for k, img := range r.images {
				if seen[img.hash] {
					counts[k]++
				}
			}
		}
		first, last := counts[0], counts[len(counts)-1]
		switch {
		case s == 0 && (first > 3*last || last > 3*first):
			t.Errorf("uniform draw is skewed: %d vs %d", first, last)
		case s >= 1 && first < 5*max(last, 1):
			t.Errorf("s=%g: most popular %d, least %d", s, first, last)
		}
		// Same seed, same request: same images.
		if a, b := r.draw(5), r.draw(5); a[0].hash != b[0].hash {
			t.Error("draws are not repeatable")
		}
	}
}

// TestECCompatHash: the EC hash's factors are vLLM's (ECCPUScheduler:
// str(torch dtype), so "torch.bfloat16"); a peer's factors or hash can be
// given, and factors that describe other blocks are refused. Hashes pinned
// from CPython: sha256(json.dumps([...], separators=(",", ":"))).
func TestECCompatHash(t *testing.T) {
	dir := t.TempDir()
	write := func(name, body string) string {
		p := dir + "/" + name
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	o := smallEC(nixl.Read)
	o.Version = "dev"
	if err := o.Validate(); err != nil {
		t.Fatal(err)
	}
	if h := o.compatHash(); h != "24c1632772f992be0e4f11d922d7cd9e09714c16b566900645a49a2a693d6c39" {
		t.Errorf("default hash %s: want [\"nixlctl-dev\",\"Qwen/Qwen3.5-4B\",\"torch.bfloat16\",5120]'s", h)
	}
	o.CompatFactorsFile = write("peer.json", `{"vllm_version": "0.11.1", "model": "Qwen/Qwen3.5-4B", "dtype": "torch.bfloat16", "block_size_bytes": 5120}`)
	if err := o.Validate(); err != nil {
		t.Fatal(err)
	}
	if h := o.compatHash(); h != "1ef878cfcc469861e6227afdf6a66527879e657579b13dfd06c6a06d1a2da158" {
		t.Errorf("--compat-factors hash %s", h)
	}
	for _, tc := range []struct{ name, body, hash, want string }{
		{"bare dtype", `{"vllm_version": "0.11.1", "model": "m", "dtype": "bfloat16", "block_size_bytes": 5120}`, "", `dtype "bfloat16", but this run's embeddings are bf16 ("torch.bfloat16")`},
		{"other block", `{"vllm_version": "0.11.1", "model": "m", "dtype": "torch.bfloat16", "block_size_bytes": 7168}`, "", "block_size_bytes 7168, but this run's blocks are 5120 bytes"},
		{"both", `{"vllm_version": "0.11.1", "model": "m", "dtype": "torch.bfloat16", "block_size_bytes": 5120}`, strings.Repeat("a", 64), "not both"},
		{"bad hash", "", "abc", "not a sha256"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := smallEC(nixl.Read)
			if tc.body != "" {
				o.CompatFactorsFile = write(tc.name+".json", tc.body)
			}
			o.CompatHash = tc.hash
			if err := o.Validate(); !errkind.IsBadInput(err) || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("Validate() = %v, want %q", err, tc.want)
			}
		})
	}
	o = smallEC(nixl.Read)
	o.CompatHash = strings.Repeat("AB", 32)
	if err := o.Validate(); err != nil || o.compatHash() != strings.Repeat("ab", 32) {
		t.Errorf("--compat-hash: %v, %s", err, o.compatHash())
	}
}
