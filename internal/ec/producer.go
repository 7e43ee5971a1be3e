package ec

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"log/slog"
	"os"
	"sync"
	"time"

	"github.com/nixlctl/nixlctl/internal/blocktag"
	"github.com/nixlctl/nixlctl/internal/mono"
	"github.com/nixlctl/nixlctl/internal/nixl"
	"github.com/nixlctl/nixlctl/internal/sidechannel"
)

// The encoder-cache producer (vLLM's ec_producer, the E of EPD): it
// "encodes" images into its region — writing the tagged embedding blocks
// an encoder of the configured geometry would produce — and serves them
// to consumers over a ZMQ ROUTER speaking XferReq/XferAck:
//
//   - READ direction (the merged upstream design): the producer checks
//     the request, pins the entry under the grant key
//     "{session_id}:{mm_hash}" and answers OK with its block indices,
//     agent metadata and mem descriptor; the consumer READs and its
//     transfer's notification (the grant key) unpins. A grant the
//     notification never ends expires after the pin lease (30 s).
//   - WRITE direction (the seed's design, closed PR #42998): the request
//     carries the consumer's destination blocks; the producer WRITEs
//     them, notifying the grant key, and answers OK once the WRITE is
//     done, then unpins.
//
// Requests are checked in vLLM's order: connector version, compatibility
// hash, non-empty session id, then the entry (MISSING if absent,
// NOT_READY while it is being encoded).

// ECPinLease is PRODUCER_PIN_LEASE_S: how long a READ grant keeps its
// blocks pinned without a completion notification.
const ECPinLease = 30 * time.Second

// ECWriteTimeout bounds a producer's WRITE (vLLM's 20 s read timeout,
// mirrored).
const ECWriteTimeout = 20 * time.Second

// ProducerConfig configures a producer.
type ProducerConfig struct {
	Name        string // agent name (default ec-producer-<pid>)
	Backend     string
	RegionBytes int
	BlockBytes  int
	CompatHash  string
	Listen      string        // side channel (default tcp://127.0.0.1:0)
	PinLease    time.Duration // default ECPinLease
	ShmDir      string
	Log         *slog.Logger
}

// ProducerStats count what a producer did.
type ProducerStats struct {
	Encodes         int64            `json:"encodes"`
	EncodeHits      int64            `json:"encode_hits"` // already resident: nothing encoded
	EncodeRefused   int64            `json:"encode_refused"`
	XferReqs        int64            `json:"xfer_reqs"`
	Acks            map[string]int64 `json:"acks"` // by status
	Malformed       int64            `json:"malformed"`
	Completions     int64            `json:"completions"`    // grants ended by a notification or a finished WRITE
	LeaseExpired    int64            `json:"lease_expired"`  // grants ended by the pin lease
	UnknownNotifs   int64            `json:"unknown_notifs"` // notifications matching no grant
	DuplicateGrants int64            `json:"duplicate_grants"`
	WriteFailures   int64            `json:"write_failures"`
	ActiveGrants    int              `json:"active_grants"`
	Cache           CacheStats       `json:"cache"`
	FreeBlocks      int              `json:"free_blocks"`
	Entries         int              `json:"entries"`
}

// Producer is a running encoder-cache producer.
type Producer struct {
	cfg ProducerConfig
	log *slog.Logger
	store
	memDesc []byte
	router  *sidechannel.AsyncRouter

	cancel  context.CancelFunc
	loop    chan struct{}
	encWG   sync.WaitGroup
	writeWG sync.WaitGroup
	writes  chan writeDone

	mu     sync.Mutex
	stats  ProducerStats
	readyC map[string]chan struct{} // closed when an entry becomes ready (or is discarded)
	grants map[string]*grant        // loop goroutine only
	stuck  []*stuckWrite            // loop goroutine only
	remote map[string]string        // consumer agent md -> loaded name; loop only
}

type grant struct {
	mmHash   string
	deadline time.Time
	write    bool // a WRITE in progress: the lease does not apply
}

type writeDone struct {
	m     sidechannel.Msg
	req   Request
	key   string
	x     nixl.XferReq
	ns    int64
	err   error
	stuck bool
}

type stuckWrite struct {
	key string
	x   nixl.XferReq
}

// StartProducer creates the region, registers it and starts serving.
func StartProducer(ctx context.Context, cfg ProducerConfig) (_ *Producer, err error) {
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	if cfg.Name == "" {
		cfg.Name = fmt.Sprintf("ec-producer-%d", os.Getpid())
	}
	if cfg.Listen == "" {
		cfg.Listen = "tcp://127.0.0.1:0"
	}
	if cfg.PinLease <= 0 {
		cfg.PinLease = ECPinLease
	}
	p := &Producer{cfg: cfg, log: cfg.Log, readyC: map[string]chan struct{}{}, grants: map[string]*grant{},
		remote: map[string]string{}, writes: make(chan writeDone, 16), loop: make(chan struct{}),
		stats: ProducerStats{Acks: map[string]int64{}}}
	defer func() {
		if err != nil {
			p.release()
		}
	}()
	if err = p.open(cfg.ShmDir, "producer", cfg.RegionBytes, cfg.BlockBytes, cfg.Backend, cfg.Name); err != nil {
		return nil, err
	}
	if p.memDesc, err = EncodeMemDescriptor(p.descs); err != nil {
		return nil, err
	}
	lctx, cancel := context.WithCancel(ctx)
	if p.router, err = sidechannel.ListenAsyncRouter(lctx, cfg.Listen, p.log); err != nil {
		cancel()
		return nil, err
	}
	p.cancel = cancel
	go p.run(lctx)
	return p, nil
}

// Endpoint is the side channel consumers connect to.
func (p *Producer) Endpoint() string { return p.router.Endpoint() }

// Agent is the producer's transfer agent.
func (p *Producer) Agent() nixl.Agent { return p.agent }

// RegionPath is the region's file.
func (p *Producer) RegionPath() string { return p.region.Path }

// NumBlocks is the region's size in blocks.
func (p *Producer) NumBlocks() int { return p.region.NumBlocks }

// ECTagKey is the tag of block i of the encoding of mmHash: producer and
// consumer derive it independently, so a block from the wrong image, the
// wrong position or a stale fill fails the check.
func TagKey(mmHash string, i int) uint64 {
	h := fnv.New64a()
	h.Write([]byte(mmHash))
	return blocktag.Key(h.Sum64(), uint64(i))
}

// EncodeResult says what an encode did.
type EncodeResult struct {
	Blocks int  `json:"blocks"`
	Cached bool `json:"cached"` // already resident (or being encoded): nothing new was encoded
	Ready  bool `json:"ready"`
}

// Encode makes mmHash resident: it allocates bytes worth of blocks,
// writes the tagged embedding and, after delay (the encoder's time), marks
// it ready. With wait it returns once the entry is ready; without, at
// once (a router that dispatches encoder and consumer together), and a
// consumer asking meanwhile gets NOT_READY.
func (p *Producer) Encode(ctx context.Context, mmHash string, bytes int, delay time.Duration, wait bool) (EncodeResult, error) {
	if mmHash == "" || bytes <= 0 {
		return EncodeResult{}, fmt.Errorf("encode: need an mm_hash and a size (got %q, %d)", mmHash, bytes)
	}
	n := (bytes + p.cfg.BlockBytes - 1) / p.cfg.BlockBytes
	p.mu.Lock()
	st, blocks := p.cache.State(mmHash)
	if st != Absent {
		ch := p.readyC[mmHash]
		p.stats.EncodeHits++
		p.mu.Unlock()
		if len(blocks) != n {
			return EncodeResult{}, fmt.Errorf("encode %s: resident with %d blocks, asked for %d", mmHash, len(blocks), n)
		}
		if st == NotReady && wait && ch != nil {
			select {
			case <-ch:
			case <-ctx.Done():
				return EncodeResult{}, ctx.Err()
			}
		}
		st, _ = p.cache.State(mmHash)
		return EncodeResult{Blocks: n, Cached: true, Ready: st == Ready || st == Pinned}, nil
	}
	blocks, err := p.cache.Alloc(mmHash, n)
	if err != nil {
		p.stats.EncodeRefused++
		p.mu.Unlock()
		return EncodeResult{}, fmt.Errorf("encode %s: %w", mmHash, err)
	}
	ch := make(chan struct{})
	p.readyC[mmHash] = ch
	p.stats.Encodes++
	p.encWG.Add(1)
	p.mu.Unlock()
	fill := func() {
		defer p.encWG.Done()
		for i, b := range blocks {
			blocktag.Fill(p.region.Block(b), TagKey(mmHash, i))
		}
		if delay > 0 {
			time.Sleep(delay)
		}
		p.mu.Lock()
		if err := p.cache.MarkReady(mmHash); err != nil {
			p.log.Error("encoder cache: mark ready", "mm_hash", mmHash, "err", err)
		}
		delete(p.readyC, mmHash)
		close(ch)
		p.mu.Unlock()
	}
	if !wait {
		go fill()
		return EncodeResult{Blocks: n}, nil
	}
	fill()
	return EncodeResult{Blocks: n, Ready: true}, nil
}

// Stats returns the counters so far.
func (p *Producer) Stats() ProducerStats {
	p.mu.Lock()
	defer p.mu.Unlock()
	s := p.stats
	s.Acks = make(map[string]int64, len(p.stats.Acks))
	for k, v := range p.stats.Acks {
		s.Acks[k] = v
	}
	s.Cache = p.cache.Stats()
	s.FreeBlocks = p.cache.Free()
	s.Entries = p.cache.Len()
	return s
}

func (p *Producer) count(f func(s *ProducerStats)) {
	p.mu.Lock()
	f(&p.stats)
	p.mu.Unlock()
}

// run is the producer's loop: it alone touches grants, so requests,
// notifications, finished WRITEs and lease expiry never race.
func (p *Producer) run(ctx context.Context) {
	defer close(p.loop)
	sweep := time.NewTicker(250 * time.Millisecond)
	defer sweep.Stop()
	in := p.router.In()
	for {
		select {
		case <-ctx.Done():
			return
		case m, ok := <-in:
			if !ok {
				return
			}
			p.handle(m)
		case <-p.agent.NotifReady():
			p.drainNotifs()
		case w := <-p.writes:
			p.finishWrite(w)
		case <-sweep.C:
			p.drainNotifs() // the ready signal coalesces; never rely on it alone
			p.sweepGrants()
		}
	}
}

func (p *Producer) reply(m sidechannel.Msg, ack Ack) {
	b, err := ack.Encode()
	if err == nil {
		err = p.router.Reply(m, [][]byte{b})
	}
	if err != nil {
		p.log.Warn("encoder cache: ack not sent", "mm_hash", ack.MMHash, "err", err)
	}
	p.count(func(s *ProducerStats) { s.Acks[ack.Status.String()]++ })
	if ack.Status != StatusOK {
		// NOT_READY and MISSING are expected in normal operation (INFO in
		// vLLM); the others mean a misconfigured or misbehaving peer.
		lvl := slog.LevelInfo
		if ack.Status != StatusNotReady && ack.Status != StatusMissing {
			lvl = slog.LevelWarn
		}
		p.log.Log(context.Background(), lvl, "encoder cache: NACK", "mm_hash", ack.MMHash, "status", ack.Status.String(), "session", ack.SessionID)
	}
}

func (p *Producer) handle(m sidechannel.Msg) {
	p.count(func(s *ProducerStats) { s.XferReqs++ })
	if len(m.Frames) != 1 {
		p.count(func(s *ProducerStats) { s.Malformed++ })
		p.log.Warn("encoder cache: request of wrong shape dropped", "frames", len(m.Frames))
		return
	}
	req, err := DecodeRequest(m.Frames[0])
	if err != nil {
		p.count(func(s *ProducerStats) { s.Malformed++ })
		p.log.Warn("encoder cache: malformed request dropped", "err", err)
		return
	}
	nack := func(st Status) {
		p.reply(m, Ack{MMHash: req.MMHash, Status: st, SessionID: req.SessionID, ReqID: req.ReqID})
	}
	switch {
	case req.ConnectorVersion != ECConnectorVersion:
		nack(StatusVersion)
		return
	case req.CompatibilityHash != p.cfg.CompatHash:
		nack(StatusIncompat)
		return
	case req.SessionID == "":
		nack(StatusInternal) // grant keys would alias
		return
	}
	blocks, st := p.cache.PinIfReady(req.MMHash)
	switch st {
	case Absent:
		nack(StatusMissing)
		return
	case NotReady:
		nack(StatusNotReady)
		return
	}
	key := req.SessionID + ":" + req.MMHash
	if old, ok := p.grants[key]; ok {
		if old.write {
			// The same consumer asked again while our WRITE for it runs:
			// that WRITE's completion answers for both.
			p.unpin(req.MMHash)
			nack(StatusInternal)
			return
		}
		p.unpin(old.mmHash)
		p.count(func(s *ProducerStats) { s.DuplicateGrants++ })
	}
	if len(req.DstBlockIndices) == 0 {
		p.grants[key] = &grant{mmHash: req.MMHash, deadline: time.Now().Add(p.cfg.PinLease)}
		p.reply(m, Ack{MMHash: req.MMHash, Status: StatusOK, SessionID: req.SessionID, ReqID: req.ReqID,
			SrcBlockIndices: blocks, AgentMetadata: p.md, MemDescriptor: p.memDesc})
		return
	}
	if err := p.startWrite(m, req, key, blocks); err != nil {
		p.unpin(req.MMHash)
		p.count(func(s *ProducerStats) { s.WriteFailures++ })
		p.log.Warn("encoder cache: WRITE not started", "mm_hash", req.MMHash, "err", err)
		nack(StatusInternal)
	}
}

func (p *Producer) unpin(mmHash string) {
	if err := p.cache.Unpin(mmHash); err != nil {
		p.log.Error("encoder cache: unpin", "mm_hash", mmHash, "err", err)
	}
}

// startWrite posts the WRITE of a request that named its destination and
// waits for it on a goroutine that reports to the loop.
func (p *Producer) startWrite(m sidechannel.Msg, req Request, key string, src []int) error {
	if len(req.DstBlockIndices) != len(src) {
		return fmt.Errorf("%d destination blocks for %d source blocks", len(req.DstBlockIndices), len(src))
	}
	dst, err := DecodeMemDescriptor(req.MemDescriptor)
	if err != nil {
		return err
	}
	if len(dst) != len(src) {
		return fmt.Errorf("%d destination descriptors for %d source blocks", len(dst), len(src))
	}
	name, ok := p.remote[string(req.AgentMetadata)]
	if !ok {
		if name, err = p.agent.LoadRemoteMD(req.AgentMetadata); err != nil {
			return err
		}
		for k, v := range p.remote {
			if v == name {
				delete(p.remote, k) // a restarted consumer replaced its agent
			}
		}
		p.remote[string(req.AgentMetadata)] = name
	}
	local := make([]nixl.Desc, len(src))
	for i, b := range src {
		local[i] = p.descs[b]
		if dst[i].Len != local[i].Len {
			return fmt.Errorf("destination %d is %d bytes, blocks are %d", i, dst[i].Len, local[i].Len)
		}
	}
	x, err := p.agent.CreateXferReq(nixl.Write, nixl.DRAM, local, nixl.DRAM, dst, name, []byte(key))
	if err != nil {
		return err
	}
	t0 := mono.Now()
	if st, err := p.agent.PostXferReq(x); st == nixl.Failed {
		_ = p.agent.ReleaseXferReq(x)
		return fmt.Errorf("post: %w", err)
	}
	p.grants[key] = &grant{mmHash: req.MMHash, write: true}
	p.writeWG.Add(1)
	a := p.agent
	go func() {
		defer p.writeWG.Done()
		err := nixl.WaitXfer(context.Background(), a, x, ECWriteTimeout)
		stuck := errors.Is(err, nixl.ErrStillRunning)
		select {
		case p.writes <- writeDone{m: m, req: req, key: key, x: x, ns: mono.Now() - t0, err: err, stuck: stuck}:
		case <-p.loop: // shutting down: Close releases everything
		}
	}()
	return nil
}

func (p *Producer) finishWrite(w writeDone) {
	g := p.grants[w.key]
	ack := Ack{MMHash: w.req.MMHash, SessionID: w.req.SessionID, ReqID: w.req.ReqID}
	switch {
	case w.stuck:
		// The DMA cannot be aborted: keep the blocks pinned until it ends.
		p.stuck = append(p.stuck, &stuckWrite{key: w.key, x: w.x})
		p.count(func(s *ProducerStats) { s.WriteFailures++ })
		ack.Status = StatusInternal
		p.reply(w.m, ack)
		return
	case w.err != nil:
		p.count(func(s *ProducerStats) { s.WriteFailures++ })
		p.log.Warn("encoder cache: WRITE failed", "mm_hash", w.req.MMHash, "err", w.err)
		ack.Status = StatusInternal
	default:
		p.count(func(s *ProducerStats) { s.Completions++ })
		ack.Status, ack.WriteNS = StatusOK, w.ns
		ack.SrcBlockIndices = nil // the data is there; nothing to read
	}
	_ = p.agent.ReleaseXferReq(w.x)
	if g != nil {
		delete(p.grants, w.key)
		p.unpin(g.mmHash)
	}
	p.reply(w.m, ack)
}

func (p *Producer) drainNotifs() {
	n, err := p.agent.GetNotifs()
	if err != nil {
		return
	}
	for _, msgs := range n {
		for _, msg := range msgs {
			key := string(msg)
			g, ok := p.grants[key]
			if !ok || g.write {
				p.count(func(s *ProducerStats) { s.UnknownNotifs++ })
				continue
			}
			delete(p.grants, key)
			p.unpin(g.mmHash)
			p.count(func(s *ProducerStats) { s.Completions++ })
		}
	}
}

func (p *Producer) sweepGrants() {
	now := time.Now()
	for key, g := range p.grants {
		if g.write || now.Before(g.deadline) {
			continue
		}
		delete(p.grants, key)
		p.unpin(g.mmHash)
		p.count(func(s *ProducerStats) { s.LeaseExpired++ })
		p.log.Warn("encoder cache: pin lease expired without a completion", "grant", key, "lease", p.cfg.PinLease)
	}
	kept := p.stuck[:0]
	for _, s := range p.stuck {
		if st, _ := p.agent.XferStatus(s.x); st == nixl.InProgress {
			kept = append(kept, s)
			continue
		}
		_ = p.agent.ReleaseXferReq(s.x)
		if g, ok := p.grants[s.key]; ok {
			delete(p.grants, s.key)
			p.unpin(g.mmHash)
		}
	}
	p.stuck = kept
	p.mu.Lock()
	p.stats.ActiveGrants = len(p.grants)
	p.mu.Unlock()
}

// Close stops serving and releases the agent and the region (unlinking
// its file).
func (p *Producer) Close() error {
	if p.cancel != nil {
		p.cancel()
		p.router.Wait()
		<-p.loop
	}
	p.encWG.Wait()
	err := p.release()
	p.writeWG.Wait() // their polls fail once the agent is closed
	return err
}

func (p *Producer) release() error { return p.close() }
