package ec

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/nixlctl/nixlctl/internal/ctl"
	"github.com/nixlctl/nixlctl/internal/nixl"
	_ "github.com/nixlctl/nixlctl/internal/nixl/ucx"
	"github.com/nixlctl/nixlctl/internal/sidechannel"
	"github.com/nixlctl/nixlctl/internal/testkit"
)

func TestMain(m *testing.M) {
	// This test binary doubles as `nixlctl serve encoder --stdio`.
	if os.Getenv("NIXLCTL_ENGINE_TEST_ENCODER") == "1" {
		log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
		if err := ctl.ServeStdio(context.Background(), EncoderRole(log)); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// The 4.5 MB example: Qwen3.5-4B, grid [1, 44, 80], 880 blocks of 5,120 B.
const (
	ecBlock   = 5120
	ecExample = 880 * ecBlock // 4,505,600 B
	ecSmall   = 64 * ecBlock
	ecHash    = "compat-test"
)

type ecEncoder struct {
	*EncoderClient
	endpoint string
	path     string
}

// startEncoder runs a producer as a child process over UCX.
func startEncoder(t *testing.T, regionBytes int, listen string, pinLease time.Duration) *ecEncoder {
	t.Helper()
	return startEncoderIn(t, regionBytes, listen, pinLease, "")
}

// startEncoderIn puts the producer's region file in shmDir ("" for
// /dev/shm).
func startEncoderIn(t *testing.T, regionBytes int, listen string, pinLease time.Duration, shmDir string) *ecEncoder {
	t.Helper()
	c, err := encoderChild()
	if err != nil {
		t.Fatal(err)
	}
	rep, err := c.Call(EncoderRequest{Op: "setup", Backend: "ucx", Name: "ec-producer-test", RegionBytes: regionBytes,
		BlockBytes: ecBlock, CompatHash: ecHash, Listen: listen, PinLeaseMS: int(pinLease / time.Millisecond), ShmDir: shmDir})
	if err != nil {
		c.Close()
		t.Fatal(err)
	}
	return &ecEncoder{EncoderClient: c, endpoint: rep.Endpoint, path: rep.RegionPath}
}

func (e *ecEncoder) encode(t *testing.T, mm string, bytes int) {
	t.Helper()
	if _, err := e.Call(EncoderRequest{Op: "encode", MMHash: mm, Bytes: bytes, Wait: true}); err != nil {
		t.Fatal(err)
	}
}

func (e *ecEncoder) stats(t *testing.T) ProducerStats {
	t.Helper()
	rep, err := e.Call(EncoderRequest{Op: "stats"})
	if err != nil {
		t.Fatal(err)
	}
	return *rep.Stats
}

func newTestConsumer(t *testing.T, regionBytes int, dir nixl.Op, mut func(*ConsumerConfig)) *Consumer {
	t.Helper()
	cfg := ConsumerConfig{Backend: "ucx", RegionBytes: regionBytes, BlockBytes: ecBlock, CompatHash: ecHash, Direction: dir, Verify: true}
	if mut != nil {
		mut(&cfg)
	}
	c, err := NewConsumer(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func step(t *testing.T, c *Consumer, ws ...Want) []Outcome {
	t.Helper()
	out := c.Step(context.Background(), ws)
	c.EndStep()
	return out
}

func want(mm, peer string, bytes int) Want { return Want{MMHash: mm, Peer: peer, Bytes: bytes} }

// noLeak checks that every consumer block is free or in an entry.
func noLeak(t *testing.T, c *Consumer) {
	t.Helper()
	if n, err := c.Cache().Check(); err != nil || n != 0 {
		t.Errorf("consumer blocks: %d detached (%v)", n, err)
	}
}

func TestECColdMissThenWarmHit(t *testing.T) {
	defer goleak.VerifyNone(t)
	for _, dir := range []nixl.Op{nixl.Read, nixl.Write} {
		t.Run(dir.String(), func(t *testing.T) {
			enc := startEncoder(t, 2*ecExample, "", 0)
			defer enc.Close()
			enc.encode(t, "img-a", ecExample)
			c := newTestConsumer(t, 2*ecExample, dir, nil)
			defer c.Close()

			out := step(t, c, want("img-a", enc.endpoint, ecExample))[0]
			if out.Outcome != OutcomeTransfer || out.Status != "OK" || out.Bytes != 4505600 || out.Blocks != 880 {
				t.Fatalf("cold miss: %+v", out)
			}
			if out.AckNS <= 0 || out.XferNS <= 0 || out.TotalNS < out.XferNS {
				t.Errorf("cold miss timings: ack %d, xfer %d, total %d", out.AckNS, out.XferNS, out.TotalNS)
			}
			// The producer granted once and its grant ended: by the READ's
			// notification, or with its own WRITE.
			deadline := time.Now().Add(5 * time.Second)
			s := enc.stats(t)
			for s.Completions < 1 && time.Now().Before(deadline) {
				time.Sleep(20 * time.Millisecond)
				s = enc.stats(t)
			}
			if s.XferReqs != 1 || s.Acks["OK"] != 1 || s.Completions != 1 || s.LeaseExpired != 0 {
				t.Fatalf("producer after the cold miss: %+v", s)
			}

			hit := step(t, c, want("img-a", enc.endpoint, ecExample))[0]
			if hit.Outcome != OutcomeHit || hit.Bytes != 4505600 || hit.AckNS != 0 {
				t.Fatalf("warm hit: %+v", hit)
			}
			if s := enc.stats(t); s.XferReqs != 1 {
				t.Errorf("the warm hit reached the producer: %d requests", s.XferReqs)
			}
			cs := c.Stats()
			if cs.Images != 2 || cs.Hits != 1 || cs.Transfers != 1 || cs.Failed != 0 {
				t.Errorf("consumer stats %+v", cs)
			}
			noLeak(t, c)
		})
	}
}

func TestECEvictionUnderPressure(t *testing.T) {
	defer goleak.VerifyNone(t)
	enc := startEncoder(t, 8*ecSmall, "", 0)
	defer enc.Close()
	for _, mm := range []string{"a", "b", "c", "d"} {
		enc.encode(t, mm, ecSmall)
	}
	// Room for two and a half images.
	c := newTestConsumer(t, 5*ecSmall/2, nixl.Read, nil)
	defer c.Close()
	p := enc.endpoint
	for _, mm := range []string{"a", "b"} {
		if o := step(t, c, want(mm, p, ecSmall))[0]; o.Outcome != OutcomeTransfer {
			t.Fatalf("%s: %+v", mm, o)
		}
	}
	// a is a hit, pinned for the step; c needs room: b (younger than a,
	// but a is pinned) is evicted.
	out := step(t, c, want("a", p, ecSmall), want("c", p, ecSmall))
	if out[0].Outcome != OutcomeHit || out[1].Outcome != OutcomeTransfer {
		t.Fatalf("step a+c: %+v", out)
	}
	if st, _ := c.Cache().State("b"); st != Absent {
		t.Errorf("b should have been evicted, is %v", st)
	}
	if st, _ := c.Cache().State("a"); st != Ready {
		t.Errorf("pinned a was touched: %v", st)
	}
	cs := c.Stats()
	if cs.Cache.Evictions != 1 || cs.Cache.PinnedSkips != 1 {
		t.Errorf("cache stats %+v", cs.Cache)
	}
	// a and c pinned by this step, nothing evictable: d cannot fit.
	out = step(t, c, want("a", p, ecSmall), want("c", p, ecSmall), want("d", p, ecSmall))
	if out[2].Outcome != OutcomeFailed || out[2].Status != FailExhausted || out[0].Outcome != OutcomeHit {
		t.Fatalf("exhausted step: %+v", out)
	}
	// b comes back over the wire after its eviction.
	if o := step(t, c, want("b", p, ecSmall))[0]; o.Outcome != OutcomeTransfer {
		t.Fatalf("b again: %+v", o)
	}
	noLeak(t, c)
	if s := enc.stats(t); s.XferReqs != 4 {
		t.Errorf("producer saw %d requests, want 4 (a, b, c, b)", s.XferReqs)
	}
}

func TestECNacks(t *testing.T) {
	defer goleak.VerifyNone(t)
	// A producer that holds two images: a third evicts the oldest.
	enc := startEncoder(t, 2*ecSmall, "", 0)
	defer enc.Close()
	p := enc.endpoint
	enc.encode(t, "old", ecSmall)
	enc.encode(t, "mid", ecSmall)
	enc.encode(t, "new", ecSmall)

	c := newTestConsumer(t, 4*ecSmall, nixl.Read, nil)
	defer c.Close()
	out := step(t, c, want("never-encoded", p, ecSmall), want("old", p, ecSmall), want("mid", p, ecSmall))
	for i, st := range []string{"MISSING", "MISSING", "OK"} {
		if out[i].Status != st {
			t.Errorf("%s: %+v, want %s", out[i].MMHash, out[i], st)
		}
	}
	noLeak(t, c)

	bad := newTestConsumer(t, 2*ecSmall, nixl.Read, func(cfg *ConsumerConfig) { cfg.CompatHash = "other-model" })
	defer bad.Close()
	if o := step(t, bad, want("new", p, ecSmall))[0]; o.Status != "INCOMPAT" || o.Outcome != OutcomeFailed {
		t.Errorf("mismatched compatibility hash: %+v", o)
	}
	old := newTestConsumer(t, 2*ecSmall, nixl.Read, func(cfg *ConsumerConfig) { cfg.ConnectorVersion = 1 })
	defer old.Close()
	if o := step(t, old, want("new", p, ecSmall))[0]; o.Status != "VERSION" {
		t.Errorf("connector version 1: %+v", o)
	}
	noLeak(t, bad)
	noLeak(t, old)

	// NOT_READY: the encoder takes 300 ms and the consumer asks at once;
	// it retries until the entry is ready.
	if _, err := enc.Call(EncoderRequest{Op: "encode", MMHash: "slow", Bytes: ecSmall, DelayUS: 300_000}); err != nil {
		t.Fatal(err)
	}
	patient := newTestConsumer(t, 2*ecSmall, nixl.Read, func(cfg *ConsumerConfig) { cfg.RetryEvery = 20 * time.Millisecond })
	defer patient.Close()
	if o := step(t, patient, want("slow", p, ecSmall))[0]; o.Outcome != OutcomeTransfer || o.Retries == 0 {
		t.Errorf("not ready, then ready: %+v", o)
	}
	if s := patient.Stats(); s.NotReadyRetries == 0 {
		t.Errorf("retries not counted: %+v", s)
	}
	noLeak(t, patient)

	// An empty session id, and garbage: INTERNAL, and no answer at all.
	d, err := sidechannel.DialDealerWith(p, sidechannel.ECDealerOptions)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	b, _ := (&Request{MMHash: "new", CompatibilityHash: ecHash, ConnectorVersion: ECConnectorVersion}).Encode()
	d.Send([][]byte{b})
	frames, err := d.Recv(context.Background(), 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if a, err := DecodeAck(frames[0]); err != nil || a.Status != StatusInternal {
		t.Errorf("empty session: %+v %v", a, err)
	}
	d.Send([][]byte{[]byte("garbage")})
	if _, err := d.Recv(context.Background(), 300*time.Millisecond); err == nil {
		t.Error("garbage was answered")
	}
	s := enc.stats(t)
	if s.Malformed != 1 || s.Acks["MISSING"] != 2 || s.Acks["INCOMPAT"] != 1 || s.Acks["VERSION"] != 1 ||
		s.Acks["INTERNAL"] != 1 || s.Acks["NOT_READY"] == 0 || s.Cache.Evictions != 2 { // old by new, mid by slow
		t.Errorf("producer stats %+v", s)
	}
}

func TestECProducerKilledMidRun(t *testing.T) {
	defer goleak.VerifyNone(t)
	// A directory of its own: other test processes sweep /dev/shm for
	// dead owners' regions and would take the file this test looks for.
	shmDir := t.TempDir()
	enc := startEncoderIn(t, 8*ecSmall, "", 0, shmDir)
	p, path := enc.endpoint, enc.path
	for _, mm := range []string{"a", "b", "c"} {
		enc.encode(t, mm, ecSmall)
	}
	c := newTestConsumer(t, 4*ecSmall, nixl.Read, func(cfg *ConsumerConfig) { cfg.AckTimeout = 300 * time.Millisecond })
	defer c.Close()
	if o := step(t, c, want("a", p, ecSmall))[0]; o.Outcome != OutcomeTransfer {
		t.Fatalf("before the kill: %+v", o)
	}
	if err := enc.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	enc.Close() // reaps it

	for _, mm := range []string{"b", "a", "c"} {
		start := time.Now()
		o := step(t, c, want(mm, p, ecSmall))[0]
		took := time.Since(start)
		if took > 3*time.Second {
			t.Errorf("%s: took %v after the producer died", mm, took)
		}
		switch mm {
		case "a": // still in the local cache: served without the producer
			if o.Outcome != OutcomeHit {
				t.Errorf("a after the kill: %+v", o)
			}
		default:
			if o.Outcome != OutcomeFailed || o.Status != FailAckTimeout {
				t.Errorf("%s after the kill: %+v", mm, o)
			}
		}
	}
	s := c.Stats()
	if s.Failures[FailAckTimeout] != 2 || s.Hits != 1 || s.Transfers != 1 {
		t.Errorf("consumer stats %+v", s)
	}
	noLeak(t, c)
	// SIGKILL leaves no region file behind: it was unlinked when mapped
	// (it used to stay until the next region swept it).
	if _, err := os.Stat(path); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the killed producer's region %s is still there: %v", path, err)
	}
	if left, _ := filepath.Glob(filepath.Join(shmDir, "*")); len(left) > 0 {
		t.Errorf("left in the region directory: %v", left)
	}
}

func TestECProducerRestartReloadsAgent(t *testing.T) {
	defer goleak.VerifyNone(t)
	ep := "tcp://" + testkit.FreeAddr(t)
	enc := startEncoder(t, 4*ecSmall, ep, 0)
	enc.encode(t, "x", ecSmall)
	c := newTestConsumer(t, 4*ecSmall, nixl.Read, nil)
	defer c.Close()
	if o := step(t, c, want("x", ep, ecSmall))[0]; o.Outcome != OutcomeTransfer {
		t.Fatalf("first producer: %+v", o)
	}
	enc.Close()
	// A new producer process on the same side-channel address.
	var enc2 *ecEncoder
	for i := 0; ; i++ {
		var err error
		enc2, err = tryStartEncoder(t, 4*ecSmall, ep)
		if err == nil {
			break
		}
		if i == 20 {
			t.Fatal(err)
		}
		time.Sleep(100 * time.Millisecond) // the port may linger
	}
	defer enc2.Close()
	enc2.encode(t, "y", ecSmall)
	o := step(t, c, want("y", ep, ecSmall))[0]
	if o.Outcome != OutcomeTransfer {
		t.Fatalf("restarted producer: %+v", o)
	}
	if s := c.Stats(); s.Reloads != 1 {
		t.Errorf("restart not detected: %+v", s)
	}
	noLeak(t, c)
}

// encoderChild runs this test binary as the encoder.
func encoderChild() (*EncoderClient, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, err
	}
	c, err := ctl.Start(context.Background(), ctl.Cmd{Exe: exe, Args: []string{"-test.run=^$"},
		Env: append(os.Environ(), "NIXLCTL_ENGINE_TEST_ENCODER=1"), Stderr: os.Stderr})
	if err != nil {
		return nil, err
	}
	return &EncoderClient{Client: c}, nil
}

func tryStartEncoder(t *testing.T, regionBytes int, listen string) (*ecEncoder, error) {
	c, err := encoderChild()
	if err != nil {
		return nil, err
	}
	rep, err := c.Call(EncoderRequest{Op: "setup", Backend: "ucx", RegionBytes: regionBytes, BlockBytes: ecBlock, CompatHash: ecHash, Listen: listen})
	if err != nil {
		c.Close()
		return nil, err
	}
	return &ecEncoder{EncoderClient: c, endpoint: rep.Endpoint}, nil
}

// A READ grant nobody completes is unpinned when its lease runs out.
func TestECPinLeaseExpires(t *testing.T) {
	defer goleak.VerifyNone(t)
	p, err := StartProducer(context.Background(), ProducerConfig{Backend: "ucx", RegionBytes: 2 * ecSmall, BlockBytes: ecBlock,
		CompatHash: ecHash, PinLease: 200 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	if _, err := p.Encode(context.Background(), "z", ecSmall, 0, true); err != nil {
		t.Fatal(err)
	}
	d, err := sidechannel.DialDealerWith(p.Endpoint(), sidechannel.ECDealerOptions)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	b, _ := (&Request{MMHash: "z", CompatibilityHash: ecHash, SessionID: "s", ConnectorVersion: ECConnectorVersion}).Encode()
	d.Send([][]byte{b})
	frames, err := d.Recv(context.Background(), 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	a, err := DecodeAck(frames[0])
	if err != nil || a.Status != StatusOK || len(a.SrcBlockIndices) != 64 || len(a.AgentMetadata) == 0 {
		t.Fatalf("grant: %+v %v", a, err)
	}
	if st, _ := p.cache.State("z"); st != Pinned {
		t.Fatalf("granted entry is %v", st)
	}
	deadline := time.Now().Add(5 * time.Second)
	for p.Stats().LeaseExpired == 0 && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
	}
	if st, _ := p.cache.State("z"); st != Ready || p.Stats().LeaseExpired != 1 {
		t.Errorf("after the lease: %v, %+v", st, p.Stats())
	}
	if !strings.Contains(p.RegionPath(), "nixlctl_ec_") {
		t.Errorf("region path %s", p.RegionPath())
	}
}
