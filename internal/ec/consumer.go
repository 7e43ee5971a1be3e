package ec

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"time"

	"github.com/nixlctl/nixlctl/internal/blocktag"
	"github.com/nixlctl/nixlctl/internal/mono"
	"github.com/nixlctl/nixlctl/internal/nixl"
	"github.com/nixlctl/nixlctl/internal/sidechannel"
)

// The encoder-cache consumer (vLLM's ec_consumer, the P or PD of EPD). One
// step serves one request's images: each one already in the local cache
// is pinned and re-served without asking anyone (a hit); each other one
// gets fresh local blocks (a not-ready entry, so no eviction during the
// step can take them) and an XferReq to its producer over that producer's
// DEALER, created on first use. On OK the consumer READs the blocks (or,
// in the WRITE direction, the producer has written them already), checks
// their tags and keeps them as a ready entry: later steps asking for the
// same mm_hash hit. Entries used by the step stay pinned until EndStep,
// which is what vLLM's _pending_reload protects.
//
// Failure handling follows vLLM's ConsumerXfer: no ack within the ack
// timeout (2 s), a NACK, or a failed READ fail that image (vLLM falls back
// to encoding locally); NOT_READY is retried after a short pause, with the
// blocks given back meanwhile; a READ still running after the read
// timeout (20 s) is quarantined — its blocks are kept until the transfer
// ends, since a DMA cannot be aborted. A producer whose agent metadata
// changed has restarted: the old remote agent is dropped and the new one
// loaded.

// Consumer timeouts (vLLM's defaults).
const (
	ECAckTimeout  = 2 * time.Second
	ECReadTimeout = 20 * time.Second
	ECQuarantine  = 60 * time.Second
)

// Failure statuses a consumer reports beside the wire's NACKs.
const (
	FailAckTimeout  = "ACK_TIMEOUT"
	FailReadFailed  = "READ_FAILED"
	FailReadTimeout = "READ_TIMEOUT" // quarantined
	FailExhausted   = "EXHAUSTED"
	FailTagMismatch = "TAG_MISMATCH"
	FailSend        = "SEND_FAILED"
	FailBadAck      = "BAD_ACK"
	FailInterrupted = "INTERRUPTED"
)

// ConsumerConfig configures a consumer.
type ConsumerConfig struct {
	Name             string // agent name (default ec-consumer-<pid>-<n>)
	Backend          string
	RegionBytes      int
	BlockBytes       int
	CompatHash       string
	Direction        nixl.Op       // Read (default) or Write
	AckTimeout       time.Duration // default ECAckTimeout
	ReadTimeout      time.Duration // default ECReadTimeout
	Quarantine       time.Duration // default ECQuarantine
	RetryEvery       time.Duration // NOT_READY: ask again after (default 2 ms, about an engine step)
	RetryFor         time.Duration // NOT_READY: give up after (default 10 s)
	ConnectorVersion int           // default ECConnectorVersion
	Verify           bool          // check every block's tags on delivery
	ShmDir           string
	Log              *slog.Logger
}

// Want is one image of a request: its mm_hash, the producer holding it
// (a ZMQ endpoint, from ec_transfer_params' peer_host and peer_port) and
// its size.
type Want struct {
	MMHash string
	Peer   string
	Bytes  int
}

// Outcome is what happened to one image of a step. Times are from the
// monotonic clock: AckNS from sending the XferReq to its ack, XferNS the
// transfer itself (the READ by the agent's own clock, or the producer's
// WRITE as it reports it), TotalNS from the start of the step to the
// blocks being in place.
type Outcome struct {
	MMHash  string `json:"mm_hash"`
	Outcome string `json:"outcome"` // hit, transfer or failed
	Status  string `json:"status"`  // OK, a NACK name or a local failure
	Bytes   int64  `json:"bytes"`
	Blocks  int    `json:"blocks"`
	AckNS   int64  `json:"-"`
	XferNS  int64  `json:"-"`
	TotalNS int64  `json:"-"`
	Retries int    `json:"not_ready_retries,omitempty"`
	Err     string `json:"error,omitempty"`
	// AckBytes is the size of the OK ack: it carries the producer's whole
	// mem descriptor (one entry per region block) every time.
	AckBytes int `json:"-"`
}

// Outcome kinds.
const (
	OutcomeHit      = "hit"
	OutcomeTransfer = "transfer"
	OutcomeFailed   = "failed"
)

// ConsumerStats count what a consumer did.
type ConsumerStats struct {
	Images          int64            `json:"images"`
	Hits            int64            `json:"hits"`
	Transfers       int64            `json:"transfers"`
	Failed          int64            `json:"failed"`
	Failures        map[string]int64 `json:"failures_by_status"`
	NotReadyRetries int64            `json:"not_ready_retries"`
	StaleAcks       int64            `json:"stale_acks"`
	Reloads         int64            `json:"producer_reloads"` // restarts detected by changed agent metadata
	Quarantined     int64            `json:"quarantined"`
	Settled         int64            `json:"settled"`
	Cache           CacheStats       `json:"cache"`
}

// Consumer is one encoder-cache consumer: its own agent, region and
// producer pool. Step and EndStep are called by one goroutine at a time;
// Stats from anywhere.
type Consumer struct {
	cfg ConsumerConfig
	log *slog.Logger
	store

	peers     map[string]*ecPeer
	committed []string
	corrupt   []string // delivered with wrong tags: dropped at EndStep
	quarant   []*quarantined
	nextID    uint64

	mu    sync.Mutex
	stats ConsumerStats
}

type ecPeer struct {
	endpoint string
	dealer   *sidechannel.Dealer
	session  string
	md       []byte // the producer agent's metadata as last loaded
	memDesc  []byte
	remote   string
	remoteDl nixl.Dlist
	nRemote  int
}

type quarantined struct {
	reqID    uint64
	blocks   []int
	x        nixl.XferReq // nil for a WRITE the producer may still run
	deadline time.Time
}

var consumerSeq struct {
	sync.Mutex
	n int
}

// NewConsumer creates the consumer's region and agent.
func NewConsumer(cfg ConsumerConfig) (_ *Consumer, err error) {
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	if cfg.Name == "" {
		consumerSeq.Lock()
		consumerSeq.n++
		cfg.Name = fmt.Sprintf("ec-consumer-%d-%d", os.Getpid(), consumerSeq.n)
		consumerSeq.Unlock()
	}
	def := func(d *time.Duration, v time.Duration) {
		if *d <= 0 {
			*d = v
		}
	}
	def(&cfg.AckTimeout, ECAckTimeout)
	def(&cfg.ReadTimeout, ECReadTimeout)
	def(&cfg.Quarantine, ECQuarantine)
	def(&cfg.RetryEvery, 2*time.Millisecond)
	def(&cfg.RetryFor, 10*time.Second)
	if cfg.ConnectorVersion == 0 {
		cfg.ConnectorVersion = ECConnectorVersion
	}
	c := &Consumer{cfg: cfg, log: cfg.Log, peers: map[string]*ecPeer{}, stats: ConsumerStats{Failures: map[string]int64{}}}
	defer func() {
		if err != nil {
			c.Close()
		}
	}()
	if err = c.open(cfg.ShmDir, "consumer", cfg.RegionBytes, cfg.BlockBytes, cfg.Backend, cfg.Name); err != nil {
		return nil, err
	}
	return c, nil
}

// Agent is the consumer's transfer agent.
func (c *Consumer) Agent() nixl.Agent { return c.agent }

// NumBlocks is the region's size in blocks.
func (c *Consumer) NumBlocks() int { return c.region.NumBlocks }

// Cache is the consumer's block cache (for tests and leak checks).
func (c *Consumer) Cache() *Cache { return c.cache }

// Transport describes how bytes move to the first producer this consumer
// READ from (empty before any READ, and in the WRITE direction, where the
// producer's agent knows it).
func (c *Consumer) Transport() string {
	for _, p := range c.peers {
		if p.remote != "" {
			return c.agent.Info().Details["transport:"+p.remote]
		}
	}
	return ""
}

// Stats returns the counters so far.
func (c *Consumer) Stats() ConsumerStats {
	c.mu.Lock()
	defer c.mu.Unlock()
	s := c.stats
	s.Failures = make(map[string]int64, len(c.stats.Failures))
	for k, v := range c.stats.Failures {
		s.Failures[k] = v
	}
	s.Cache = c.cache.Stats()
	return s
}

func (c *Consumer) count(f func(s *ConsumerStats)) {
	c.mu.Lock()
	f(&c.stats)
	c.mu.Unlock()
}

// newSession is a UUID4, as vLLM's consumer makes one per producer peer.
func newSession() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	return fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:16])
}

func (c *Consumer) peer(endpoint string) (*ecPeer, error) {
	if p, ok := c.peers[endpoint]; ok {
		return p, nil
	}
	d, err := sidechannel.DialDealerWith(endpoint, sidechannel.ECDealerOptions)
	if err != nil {
		return nil, err
	}
	p := &ecPeer{endpoint: endpoint, dealer: d, session: newSession()}
	c.peers[endpoint] = p
	return p, nil
}

// item is one image in flight during a step.
type item struct {
	i        int
	w        Want
	peer     *ecPeer
	blocks   []int
	nblocks  int
	reqID    uint64
	t0       int64
	sent     int64
	retryAt  int64
	retries  int
	x        nixl.XferReq
	posted   int64
	ackNS    int64
	lastAck  Ack
	ackBytes int
}

// Step fetches a request's images and returns one outcome per want, in
// order. Delivered entries stay pinned until EndStep.
func (c *Consumer) Step(ctx context.Context, wants []Want) []Outcome {
	c.sweepQuarantine()
	outs := make([]Outcome, len(wants))
	first := map[string]int{}
	var waiting, reading []*item
	for i, w := range wants {
		t0 := mono.Now()
		outs[i] = Outcome{MMHash: w.MMHash}
		if j, dup := first[w.MMHash]; dup {
			outs[i].Outcome = OutcomeFailed
			outs[i].Status = FailBadAck
			outs[i].Err = fmt.Sprintf("mm_hash repeated in one step (first at %d)", j)
			continue
		}
		first[w.MMHash] = i
		if blocks, st := c.cache.PinIfReady(w.MMHash); st == Pinned {
			outs[i] = Outcome{MMHash: w.MMHash, Outcome: OutcomeHit, Status: "OK", Blocks: len(blocks),
				Bytes: int64(len(blocks) * c.cfg.BlockBytes), TotalNS: mono.Now() - t0}
			c.committed = append(c.committed, w.MMHash)
			if c.cfg.Verify {
				c.verify(&outs[i], blocks)
			}
			continue
		}
		it := &item{i: i, w: w, t0: t0, nblocks: (w.Bytes + c.cfg.BlockBytes - 1) / c.cfg.BlockBytes}
		if w.Bytes <= 0 {
			c.fail(&outs[i], FailBadAck, errors.New("want of no bytes"))
			continue
		}
		if err := c.send(it); err != nil {
			c.fail(&outs[i], sendStatus(err), err)
			continue
		}
		waiting = append(waiting, it)
	}
	reading = c.awaitAcks(ctx, waiting, outs)
	c.awaitReads(reading, outs)
	for i := range outs {
		c.tally(&outs[i])
	}
	return outs
}

func sendStatus(err error) string {
	if errors.Is(err, ErrExhausted) {
		return FailExhausted
	}
	return FailSend
}

// send allocates the item's blocks and sends its XferReq.
func (c *Consumer) send(it *item) error {
	blocks, err := c.cache.Alloc(it.w.MMHash, it.nblocks)
	if err != nil {
		return err
	}
	it.blocks = blocks
	if it.peer == nil {
		if it.peer, err = c.peer(it.w.Peer); err != nil {
			c.dropItem(it)
			return err
		}
	}
	c.nextID++
	it.reqID = c.nextID
	req := Request{MMHash: it.w.MMHash, CompatibilityHash: c.cfg.CompatHash, SessionID: it.peer.session,
		ConnectorVersion: c.cfg.ConnectorVersion, ReqID: it.reqID}
	if c.cfg.Direction == nixl.Write {
		dst := make([]nixl.Desc, len(blocks))
		for k, b := range blocks {
			dst[k] = c.descs[b]
		}
		req.DstBlockIndices, req.AgentMetadata = blocks, c.md
		if req.MemDescriptor, err = EncodeMemDescriptor(dst); err != nil {
			c.dropItem(it)
			return err
		}
	}
	b, err := req.Encode()
	if err == nil {
		it.sent = mono.Now()
		err = it.peer.dealer.Send([][]byte{b})
	}
	if err != nil {
		c.dropItem(it)
		return fmt.Errorf("send Request to %s: %w", it.w.Peer, err)
	}
	c.log.Debug("encoder cache: Request sent", "mm_hash", it.w.MMHash, "peer", it.w.Peer, "blocks", len(blocks))
	return nil
}

// dropItem gives back blocks no transfer can touch.
func (c *Consumer) dropItem(it *item) {
	if it.blocks != nil {
		_ = c.cache.Discard(it.w.MMHash)
		it.blocks = nil
	}
}

// quarantine keeps blocks a transfer may still write out of the pool.
func (c *Consumer) quarantine(it *item, x nixl.XferReq) {
	blocks, err := c.cache.Detach(it.w.MMHash)
	if err != nil {
		c.log.Error("encoder cache: quarantine", "mm_hash", it.w.MMHash, "err", err)
		return
	}
	c.quarant = append(c.quarant, &quarantined{reqID: it.reqID, blocks: blocks, x: x, deadline: time.Now().Add(c.cfg.Quarantine)})
	c.count(func(s *ConsumerStats) { s.Quarantined++ })
	it.blocks = nil
}

func (c *Consumer) sweepQuarantine() {
	kept := c.quarant[:0]
	now := time.Now()
	for _, q := range c.quarant {
		switch {
		case q.x != nil:
			if st, _ := c.agent.XferStatus(q.x); st == nixl.InProgress {
				if now.After(q.deadline) {
					// vLLM gives up on it as READ_FAILED after 60 s; its
					// memory stays out of the pool while the DMA may run.
					c.log.Warn("encoder cache: quarantined READ still running", "blocks", len(q.blocks))
				}
				kept = append(kept, q)
				continue
			}
			_ = c.agent.ReleaseXferReq(q.x)
		case now.Before(q.deadline):
			kept = append(kept, q)
			continue
		}
		c.cache.Release(q.blocks)
		c.count(func(s *ConsumerStats) { s.Settled++ })
	}
	c.quarant = kept
}

func (c *Consumer) fail(o *Outcome, status string, err error) {
	o.Outcome, o.Status = OutcomeFailed, status
	if err != nil {
		o.Err = err.Error()
	}
	lvl := slog.LevelWarn
	if status == StatusNotReady.String() || status == StatusMissing.String() || status == FailExhausted {
		lvl = slog.LevelInfo // expected under load and eviction, as vLLM logs them
	}
	c.log.Log(context.Background(), lvl, "encoder cache: fetch failed", "mm_hash", o.MMHash, "status", status, "err", o.Err)
}

func (c *Consumer) tally(o *Outcome) {
	c.count(func(s *ConsumerStats) {
		s.Images++
		s.NotReadyRetries += int64(o.Retries)
		switch o.Outcome {
		case OutcomeHit:
			s.Hits++
		case OutcomeTransfer:
			s.Transfers++
		default:
			s.Failed++
			s.Failures[o.Status]++
		}
	})
}

// awaitAcks receives acks until every item is answered, failed or retried
// out; OK items of the READ direction have their READ posted at once and
// are returned.
func (c *Consumer) awaitAcks(ctx context.Context, waiting []*item, outs []Outcome) (reading []*item) {
	var retrying []*item
	for len(waiting)+len(retrying) > 0 {
		now := mono.Now()
		// Ask again for NOT_READY items whose pause is over.
		kept := retrying[:0]
		for _, it := range retrying {
			if now < it.retryAt {
				kept = append(kept, it)
				continue
			}
			if err := c.send(it); err != nil {
				c.fail(&outs[it.i], sendStatus(err), err)
				outs[it.i].Retries = it.retries
				continue
			}
			waiting = append(waiting, it)
		}
		retrying = kept
		// Time out items past their ack deadline.
		keptW := waiting[:0]
		for _, it := range waiting {
			if now-it.sent < int64(c.cfg.AckTimeout) {
				keptW = append(keptW, it)
				continue
			}
			c.ackTimeout(it, &outs[it.i])
		}
		waiting = keptW
		if len(waiting) == 0 {
			if len(retrying) > 0 {
				sleepUntil(ctx, minRetry(retrying))
			}
			if ctx.Err() != nil {
				break
			}
			continue
		}
		// Wait on the peer of the oldest item until the next deadline.
		next := waiting[0].sent + int64(c.cfg.AckTimeout)
		for _, it := range waiting {
			next = min(next, it.sent+int64(c.cfg.AckTimeout))
		}
		if len(retrying) > 0 {
			next = min(next, minRetry(retrying))
		}
		wait := time.Duration(next - mono.Now())
		if wait < time.Millisecond {
			wait = time.Millisecond
		}
		p := waiting[0].peer
		frames, err := p.dealer.Recv(ctx, wait)
		if ctx.Err() != nil {
			break
		}
		if err != nil {
			continue // nothing arrived in time, or a malformed reply: deadlines decide
		}
		recv := mono.Now()
		var it *item
		waiting, it = c.match(p, frames, waiting)
		if it == nil {
			continue
		}
		ack := it.lastAck
		it.ackNS = recv - it.sent
		o := &outs[it.i]
		o.AckNS, o.AckBytes = it.ackNS, it.ackBytes
		switch {
		case ack.Status == StatusNotReady:
			it.retries++
			o.Retries = it.retries
			c.dropItem(it)
			if time.Duration(recv-it.t0) >= c.cfg.RetryFor {
				c.fail(o, ack.Status.String(), fmt.Errorf("still not ready after %d retries", it.retries))
				continue
			}
			it.retryAt = recv + int64(c.cfg.RetryEvery)
			retrying = append(retrying, it)
		case ack.Status != StatusOK:
			if c.cfg.Direction == nixl.Write && ack.Status == StatusInternal {
				// A WRITE that failed or got stuck may still be writing.
				c.quarantine(it, nil)
			} else {
				c.dropItem(it)
			}
			c.fail(o, ack.Status.String(), nil)
		case c.cfg.Direction == nixl.Write:
			o.XferNS = ack.WriteNS
			o.TotalNS = recv - it.t0
			c.deliver(it, o)
		default:
			if err := c.postRead(it, ack); err != nil {
				c.dropItem(it)
				status := FailReadFailed
				if errors.Is(err, errBadAck) {
					status = FailBadAck
				}
				c.fail(o, status, err)
				continue
			}
			reading = append(reading, it)
		}
	}
	for _, it := range append(waiting, retrying...) {
		if it.blocks != nil {
			c.ackTimeout(it, nil)
		}
		c.fail(&outs[it.i], FailInterrupted, ctx.Err())
	}
	return reading
}

func minRetry(items []*item) int64 {
	m := items[0].retryAt
	for _, it := range items {
		m = min(m, it.retryAt)
	}
	return m
}

func sleepUntil(ctx context.Context, t int64) {
	d := time.Duration(t - mono.Now())
	if d <= 0 {
		return
	}
	tm := time.NewTimer(d)
	defer tm.Stop()
	select {
	case <-tm.C:
	case <-ctx.Done():
	}
}

func (c *Consumer) ackTimeout(it *item, o *Outcome) {
	if c.cfg.Direction == nixl.Write {
		c.quarantine(it, nil) // the producer may still WRITE them
	} else {
		c.dropItem(it) // nothing was posted
	}
	if o != nil {
		c.fail(o, FailAckTimeout, fmt.Errorf("no Ack from %s within %v", it.w.Peer, c.cfg.AckTimeout))
	}
}

// match decodes an ack and finds its item: by nixlctl's request id when
// the producer echoes it, else the oldest item for that mm_hash. An ack
// matching nothing is stale (its request timed out): counted, and any
// WRITE blocks quarantined for it are released.
func (c *Consumer) match(p *ecPeer, frames [][]byte, waiting []*item) ([]*item, *item) {
	if len(frames) != 1 {
		c.count(func(s *ConsumerStats) { s.StaleAcks++ })
		c.log.Warn("encoder cache: ack of wrong shape dropped", "peer", p.endpoint, "frames", len(frames))
		return waiting, nil
	}
	ack, err := DecodeAck(frames[0])
	if err != nil {
		c.count(func(s *ConsumerStats) { s.StaleAcks++ })
		c.log.Warn("encoder cache: malformed ack dropped", "peer", p.endpoint, "err", err)
		return waiting, nil
	}
	for k, it := range waiting {
		if it.peer != p || it.w.MMHash != ack.MMHash || (ack.ReqID != 0 && ack.ReqID != it.reqID) {
			continue
		}
		if ack.SessionID != "" && ack.SessionID != p.session {
			continue
		}
		it.lastAck = ack
		it.ackBytes = len(frames[0])
		return append(waiting[:k], waiting[k+1:]...), it
	}
	c.count(func(s *ConsumerStats) { s.StaleAcks++ })
	if ack.ReqID != 0 && ack.Status != StatusInternal {
		for k, q := range c.quarant {
			if q.x == nil && q.reqID == ack.ReqID {
				c.cache.Release(q.blocks)
				c.quarant = append(c.quarant[:k], c.quarant[k+1:]...)
				c.count(func(s *ConsumerStats) { s.Settled++ })
				break
			}
		}
	}
	c.log.Info("encoder cache: stale ack", "mm_hash", ack.MMHash, "status", ack.Status.String())
	return waiting, nil
}

var errBadAck = errors.New("inconsistent ack")

// postRead loads the producer's agent if its metadata is new (a restarted
// producer announces itself this way) and posts the READ.
func (c *Consumer) postRead(it *item, ack Ack) error {
	p := it.peer
	if !bytes.Equal(ack.AgentMetadata, p.md) || !bytes.Equal(ack.MemDescriptor, p.memDesc) {
		reload := p.md != nil
		if p.remoteDl != nil {
			_ = c.agent.ReleaseDlist(p.remoteDl)
			p.remoteDl = nil
		}
		if p.remote != "" && !bytes.Equal(ack.AgentMetadata, p.md) {
			_ = c.agent.InvalidateRemoteMD(p.remote)
			p.remote = ""
		}
		p.md, p.memDesc = nil, nil
		name, err := c.agent.LoadRemoteMD(ack.AgentMetadata)
		if err != nil {
			return fmt.Errorf("%w: producer agent metadata: %v", errBadAck, err)
		}
		descs, err := DecodeMemDescriptor(ack.MemDescriptor)
		if err != nil {
			return fmt.Errorf("%w: %v", errBadAck, err)
		}
		dl, err := c.agent.PrepXferDlist(name, nixl.DRAM, descs)
		if err != nil {
			return fmt.Errorf("%w: producer descriptors: %v", errBadAck, err)
		}
		p.remote, p.remoteDl, p.nRemote = name, dl, len(descs)
		p.md = append([]byte(nil), ack.AgentMetadata...)
		p.memDesc = append([]byte(nil), ack.MemDescriptor...)
		if reload {
			c.count(func(s *ConsumerStats) { s.Reloads++ })
			c.log.Info("encoder cache: producer restarted (agent metadata changed), remote agent reloaded", "peer", p.endpoint, "agent", name)
		}
	}
	if len(ack.SrcBlockIndices) != len(it.blocks) {
		return fmt.Errorf("%w: %d source blocks for %d local", errBadAck, len(ack.SrcBlockIndices), len(it.blocks))
	}
	for _, b := range ack.SrcBlockIndices {
		if b >= p.nRemote {
			return fmt.Errorf("%w: source block %d beyond the producer's %d", errBadAck, b, p.nRemote)
		}
	}
	x, err := c.agent.MakeXferReq(nixl.Read, c.localDl, it.blocks, p.remoteDl, ack.SrcBlockIndices, []byte(p.session+":"+it.w.MMHash))
	if err != nil {
		return err
	}
	it.posted = mono.Now()
	if st, err := c.agent.PostXferReq(x); st == nixl.Failed {
		_ = c.agent.ReleaseXferReq(x)
		return fmt.Errorf("post READ: %w", err)
	}
	it.x = x
	c.log.Debug("encoder cache: NIXL READ posted", "mm_hash", it.w.MMHash, "blocks", len(it.blocks))
	return nil
}

// awaitReads polls the posted READs until each is done, failed or past
// the read timeout.
func (c *Consumer) awaitReads(reading []*item, outs []Outcome) {
	start := time.Now()
	for n := 0; len(reading) > 0; n++ {
		kept := reading[:0]
		for _, it := range reading {
			o := &outs[it.i]
			st, err := c.agent.XferStatus(it.x)
			switch st {
			case nixl.InProgress:
				if time.Since(start) > c.cfg.ReadTimeout {
					c.quarantine(it, it.x)
					c.fail(o, FailReadTimeout, fmt.Errorf("READ still running after %v: quarantined", c.cfg.ReadTimeout))
					continue
				}
				kept = append(kept, it)
				continue
			case nixl.Failed:
				_ = c.agent.ReleaseXferReq(it.x)
				c.dropItem(it)
				c.fail(o, FailReadFailed, err)
				continue
			}
			t := c.agent.Telemetry(it.x)
			xfer := int64(t.Total())
			if t.XferDuration == 0 {
				xfer = mono.Now() - it.posted // a backend without telemetry: polled time
			}
			_ = c.agent.ReleaseXferReq(it.x)
			o.XferNS = xfer
			o.TotalNS = it.posted - it.t0 + xfer
			c.deliver(it, o)
		}
		reading = kept
		if len(reading) > 0 {
			if time.Since(start) < 200*time.Microsecond {
				continue
			}
			time.Sleep(20 * time.Microsecond)
		}
	}
}

// deliver makes a transferred entry ready, pins it for the step and
// checks its tags.
func (c *Consumer) deliver(it *item, o *Outcome) {
	if err := c.cache.MarkReady(it.w.MMHash); err != nil {
		c.fail(o, FailBadAck, err)
		return
	}
	blocks, _ := c.cache.PinIfReady(it.w.MMHash)
	c.committed = append(c.committed, it.w.MMHash)
	o.Outcome, o.Status, o.Blocks, o.Bytes = OutcomeTransfer, "OK", len(blocks), int64(len(blocks)*c.cfg.BlockBytes)
	c.log.Debug("encoder cache: transfer completed", "mm_hash", it.w.MMHash, "bytes", o.Bytes)
	if c.cfg.Verify {
		c.verify(o, blocks)
	}
}

// verify checks every block's tags; a cached entry that fails is dropped
// at EndStep so it is fetched again.
func (c *Consumer) verify(o *Outcome, blocks []int) {
	for i, b := range blocks {
		if m := blocktag.Check(c.region.Block(b), TagKey(o.MMHash, i)); m != nil {
			err := fmt.Errorf("block %d (region block %d): %v", i, b, m)
			c.fail(o, FailTagMismatch, err)
			c.corrupt = append(c.corrupt, o.MMHash)
			return
		}
	}
}

// EndStep unpins the entries the step used, so later allocations may
// evict them.
func (c *Consumer) EndStep() {
	for _, k := range c.committed {
		if err := c.cache.Unpin(k); err != nil {
			c.log.Error("encoder cache: unpin", "mm_hash", k, "err", err)
		}
	}
	c.committed = c.committed[:0]
	for _, k := range c.corrupt {
		_ = c.cache.Drop(k)
	}
	c.corrupt = c.corrupt[:0]
}

// Drop frees a ready, unpinned entry (the bench's warm-up image).
func (c *Consumer) Drop(mmHash string) error { return c.cache.Drop(mmHash) }

// Close releases the consumer. Quarantined READs are failed by the agent
// closing before the region is unmapped.
func (c *Consumer) Close() error {
	var errs []error
	for _, p := range c.peers {
		errs = append(errs, p.dealer.Close())
	}
	c.peers = map[string]*ecPeer{}
	errs = append(errs, c.close())
	return errors.Join(errs...)
}
