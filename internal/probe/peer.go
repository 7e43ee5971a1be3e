package probe

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"runtime/debug"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nixlctl/nixlctl/internal/blocktag"
	"github.com/nixlctl/nixlctl/internal/ctl"
	"github.com/nixlctl/nixlctl/internal/nixl"
	"github.com/nixlctl/nixlctl/internal/nixl/ucx"
)

// A leak peer is one end of the transfers `probe ucx-leak` and `probe env`
// drive, as its own process (`nixlctl serve leak-peer --stdio`) so that
// each configuration gets fresh processes with its UCX environment:
//
//   - the receiver is decode-like: a registered KV pool that the sender
//     WRITEs into, a notification drain, and, in the same process, the
//     allocation churn that UCX's memory hooks intercept (and, for the
//     probe's self-test, a deliberate leak);
//   - the sender is prefill-like: the same pool shape, KV-shaped requests
//     (one descriptor per block per region, a fresh block table each time)
//     posted at a steady rate with a notification each, as vLLM does.
//
// The control channel is internal/ctl's, one request at a time; the bytes
// move over the transfer backend. Stats are cumulative counters.

// RegionShape is one KV region of the pool: where it starts, its block
// size, and how many of its blocks one request moves (sliding-window
// layers move fewer).
type RegionShape struct {
	Offset     int64 `json:"offset"`
	BlockBytes int64 `json:"block_bytes"`
	ReqBlocks  int   `json:"req_blocks"`
}

// Shape is a pool laid out like one rank's KV cache: every region holds
// PoolBlocks blocks.
type Shape struct {
	Regions    []RegionShape `json:"regions"`
	PoolBlocks int           `json:"pool_blocks"`
	PoolBytes  int64         `json:"pool_bytes"`
}

// validate checks a shape that came over the wire.
func (s *Shape) validate() error {
	if s == nil || len(s.Regions) == 0 || s.PoolBlocks <= 0 || s.PoolBytes <= 0 || s.PoolBytes > 1<<40 {
		return errors.New("shape: need regions, pool blocks and pool bytes")
	}
	for i, r := range s.Regions {
		if r.BlockBytes <= 0 || r.ReqBlocks < 0 || r.ReqBlocks > s.PoolBlocks || r.Offset < 0 ||
			r.Offset+r.BlockBytes*int64(s.PoolBlocks) > s.PoolBytes {
			return fmt.Errorf("shape: region %d (%+v) does not fit a %d-byte pool of %d blocks", i, r, s.PoolBytes, s.PoolBlocks)
		}
	}
	return nil
}

// Descriptors per request and bytes per request.
func (s *Shape) perRequest() (descs int, bytes int64) {
	for _, r := range s.Regions {
		descs += r.ReqBlocks
		bytes += int64(r.ReqBlocks) * r.BlockBytes
	}
	return descs, bytes
}

// PeerRequest is one control request.
type PeerRequest struct {
	Op string `json:"op"` // the method: setup, load_md, start, stats, stop, verify, info

	// setup
	Role       string      `json:"role,omitempty"` // receiver or sender
	Backend    string      `json:"backend,omitempty"`
	Name       string      `json:"name,omitempty"`
	Shape      *Shape      `json:"shape,omitempty"`
	Churn      ChurnConfig `json:"churn,omitempty"`         // receiver
	LeakMBPerS float64     `json:"leak_mb_per_s,omitempty"` // receiver, self-test only
	Seed       uint64      `json:"seed,omitempty"`

	// load_md
	MD []byte `json:"md,omitempty"`

	// start (sender): WRITE requests into RemoteAddr's pool at Rate per
	// second (0: back to back); Count > 0 stops after that many.
	RemoteAddr uint64  `json:"remote_addr,omitempty"`
	Rate       float64 `json:"rate,omitempty"`
	Count      int64   `json:"count,omitempty"`

	// info: the transport towards Remote ("" = the loaded peer).
	Remote string `json:"remote,omitempty"`

	// start (sender): first fill every block of the pool with its tag
	// pattern; verify (receiver): check every block written so far.
	// Block b of region r is tagged TagKey(TagSeed, r, b).
	Tag     bool   `json:"tag,omitempty"`
	TagSeed uint64 `json:"tag_seed,omitempty"`
}

// PeerStats are a peer's cumulative counters.
type PeerStats struct {
	Requests    int64  `json:"requests"`
	Bytes       int64  `json:"bytes"`
	Descs       int64  `json:"descriptors"`
	Errors      int64  `json:"errors"`
	LastError   string `json:"last_error,omitempty"`
	Running     bool   `json:"running"`
	Notifs      int64  `json:"notifs"`
	ChurnOps    int64  `json:"churn_ops"`
	ChurnFailed int64  `json:"churn_failed"`
	ChurnLive   int64  `json:"churn_live_bytes"`
	Leaked      int64  `json:"leaked_bytes"`
}

// PeerReply answers one request.
type PeerReply struct {
	MD        []byte    `json:"md,omitempty"`
	Addr      uint64    `json:"addr,omitempty"`
	PID       int       `json:"pid,omitempty"`
	Remote    string    `json:"remote,omitempty"`
	Info      nixl.Info `json:"info,omitempty"`
	Transport string    `json:"transport,omitempty"`
	Stats     PeerStats `json:"stats,omitempty"`

	// verify: blocks that held data, how many of them were wrong, and
	// the first wrong one.
	Written int    `json:"written,omitempty"`
	Corrupt int    `json:"corrupt,omitempty"`
	First   string `json:"first,omitempty"`
}

// LeakPeerRole is a leak peer on a control channel: requests are its
// methods (the Op of each PeerRequest), answered one at a time; "close"
// stops the sender and answers with the final counters. Everything is
// released when the session ends.
func LeakPeerRole(log *slog.Logger) ctl.Role {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return func(s *ctl.Server) func() {
		p := &peerState{log: log}
		ops := []string{"setup", "load_md", "start", "stats", "stop", "verify", "info"}
		ctl.HandleSerial(s, ops, func(_ context.Context, op string, req PeerRequest) (any, error) {
			req.Op = op
			return p.do(req)
		})
		s.OnClose(func(context.Context, json.RawMessage) (any, error) {
			p.stopDrive()
			st := p.stats()
			p.close()
			return PeerReply{Stats: st}, nil
		})
		return p.close
	}
}

type peerState struct {
	log    *slog.Logger
	role   string
	agent  nixl.Agent
	pool   *nixl.Buffer
	shape  *Shape
	remote string

	churn *churner
	leak  *leaker

	notifs    atomic.Int64
	drainStop chan struct{}
	drainDone chan struct{}

	driveStop chan struct{}
	driveDone chan struct{}
	mu        sync.Mutex // guards the counters below
	st        PeerStats
}

func (p *peerState) do(req PeerRequest) (PeerReply, error) {
	if req.Op != "setup" && p.agent == nil {
		return PeerReply{}, errors.New("setup first")
	}
	switch req.Op {
	case "setup":
		return p.setup(req)
	case "load_md":
		name, err := p.agent.LoadRemoteMD(req.MD)
		if err == nil {
			p.remote = name
		}
		return PeerReply{Remote: name}, err
	case "start":
		return PeerReply{}, p.start(req)
	case "stats":
		return PeerReply{Stats: p.stats()}, nil
	case "stop":
		p.stopDrive()
		return PeerReply{Stats: p.stats()}, nil
	case "verify":
		return p.verify(req.TagSeed)
	case "info":
		remote := req.Remote
		if remote == "" {
			remote = p.remote
		}
		return PeerReply{Info: p.agent.Info(), Transport: transportOf(p.agent, remote)}, nil
	}
	return PeerReply{}, fmt.Errorf("unknown op %q", req.Op)
}

// transportOf describes what moves bytes to remote: our ucx backend's
// lane report, else whatever the backend's Info says about that peer.
func transportOf(a nixl.Agent, remote string) string {
	if remote == "" {
		return ""
	}
	if t, err := ucx.Transports(a, remote); err == nil {
		return t
	}
	info := a.Info()
	if t := info.Details["transport:"+remote]; t != "" {
		return t
	}
	var parts []string
	for k, v := range info.Details {
		parts = append(parts, k+"="+v)
	}
	sort.Strings(parts)
	return strings.Join(parts, "; ")
}

func (p *peerState) setup(req PeerRequest) (PeerReply, error) {
	if p.agent != nil {
		return PeerReply{}, errors.New("already set up")
	}
	if req.Role != "receiver" && req.Role != "sender" {
		return PeerReply{}, fmt.Errorf("role %q: want receiver or sender", req.Role)
	}
	if err := req.Shape.validate(); err != nil {
		return PeerReply{}, err
	}
	if err := req.Churn.Validate(); err != nil {
		return PeerReply{}, err
	}
	a, err := nixl.Open(req.Backend, nixl.Config{Name: req.Name})
	if err != nil {
		return PeerReply{}, err
	}
	pool, md, err := nixl.LendBuffer(a, func() (*nixl.Buffer, error) { return nixl.AllocDRAM(int(req.Shape.PoolBytes), false) })
	if err != nil {
		return PeerReply{}, err
	}
	p.agent, p.pool, p.shape, p.role = a, pool, req.Shape, req.Role
	if req.Role == "receiver" {
		p.drainStop, p.drainDone = make(chan struct{}), make(chan struct{})
		go p.drain()
		if p.churn, err = startChurn(req.Churn, req.Seed); err != nil {
			return PeerReply{}, err
		}
		p.leak = startLeak(req.LeakMBPerS)
		go trimGoHeap(p.drainStop)
	}
	return PeerReply{MD: md, Addr: pool.Addr, PID: os.Getpid(), Info: a.Info()}, nil
}

// trimGoHeap returns the Go runtime's free heap to the system every
// second. This process is Go, a decode engine is not: left alone, the Go
// heap grows towards its collection target for a minute or two after
// start-up, and that growth would pass for a leak. Live Go memory that
// grows still shows.
func trimGoHeap(stop <-chan struct{}) {
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for {
		select {
		case <-stop:
			return
		case <-t.C:
			debug.FreeOSMemory()
		}
	}
}

// drain consumes notifications as a decode engine does, so that the
// receiver's own queue is not what grows.
func (p *peerState) drain() {
	defer close(p.drainDone)
	for {
		select {
		case <-p.drainStop:
			return
		case <-p.agent.NotifReady():
		}
		n, err := p.agent.GetNotifs()
		if err != nil {
			return
		}
		for _, msgs := range n {
			p.notifs.Add(int64(len(msgs)))
		}
	}
}

func (p *peerState) start(req PeerRequest) error {
	if p.role != "sender" {
		return errors.New("start: only a sender drives transfers")
	}
	if p.remote == "" {
		return errors.New("start: load the receiver's metadata first")
	}
	if p.driveStop != nil {
		return errors.New("start: already running")
	}
	if req.Rate < 0 || req.Count < 0 {
		return errors.New("start: rate and count must be >= 0")
	}
	s := p.shape
	if req.Tag {
		data := p.pool.Bytes()
		for i, r := range s.Regions {
			for b := 0; b < s.PoolBlocks; b++ {
				off := r.Offset + int64(b)*r.BlockBytes
				blocktag.Fill(data[off:off+r.BlockBytes], blocktag.Key(req.TagSeed, uint64(i), uint64(b)))
			}
		}
	}
	var local, remote []nixl.Desc
	for _, r := range s.Regions {
		for b := 0; b < s.PoolBlocks; b++ {
			off := r.Offset + int64(b)*r.BlockBytes
			local = append(local, p.pool.Desc(int(off), int(r.BlockBytes)))
			remote = append(remote, nixl.Desc{Addr: req.RemoteAddr + uint64(off), Len: uint64(r.BlockBytes)})
		}
	}
	// Prepared once for the whole pool, then indexed per request: the
	// path vLLM's NIXL connector takes (prep_xfer_dlist + make_prepped_xfer).
	ld, err := p.agent.PrepXferDlist("", nixl.DRAM, local)
	if err != nil {
		return err
	}
	rd, err := p.agent.PrepXferDlist(p.remote, nixl.DRAM, remote)
	if err != nil {
		return err
	}
	p.driveStop, p.driveDone = make(chan struct{}), make(chan struct{})
	p.mu.Lock()
	p.st.Running = true
	p.mu.Unlock()
	go p.drive(ld, rd, req)
	return nil
}

// drive posts KV-shaped WRITEs: each request takes a fresh random block
// table (distinct block ids) and moves, for every region, the blocks of
// that table the region keeps (the last ones for a sliding window).
func (p *peerState) drive(ld, rd nixl.Dlist, req PeerRequest) {
	defer close(p.driveDone)
	defer func() {
		p.mu.Lock()
		p.st.Running = false
		p.mu.Unlock()
	}()
	s := p.shape
	rng := rand.New(rand.NewPCG(req.Seed, 0x6b76))
	maxBlocks := 0
	for _, r := range s.Regions {
		maxBlocks = max(maxBlocks, r.ReqBlocks)
	}
	var interval time.Duration
	if req.Rate > 0 {
		interval = time.Duration(float64(time.Second) / req.Rate)
	}
	next := time.Now()
	idx := make([]int, 0, len(s.Regions)*maxBlocks)
	for n := int64(0); req.Count == 0 || n < req.Count; n++ {
		select {
		case <-p.driveStop:
			return
		default:
		}
		table := rng.Perm(s.PoolBlocks)[:maxBlocks]
		idx = idx[:0]
		for i, r := range s.Regions {
			for _, b := range table[maxBlocks-r.ReqBlocks:] {
				idx = append(idx, i*s.PoolBlocks+b)
			}
		}
		bytes, err := p.one(ld, rd, idx, fmt.Sprintf("kv-%d", n))
		if errors.Is(err, errStopped) {
			return
		}
		p.mu.Lock()
		if err != nil {
			p.st.Errors++
			p.st.LastError = err.Error()
		} else {
			p.st.Requests++
			p.st.Bytes += bytes
			p.st.Descs += int64(len(idx))
		}
		p.mu.Unlock()
		if err != nil {
			next = time.Now().Add(100 * time.Millisecond) // a dead peer: do not spin
		} else {
			next = next.Add(interval)
			if late := time.Since(next); late > time.Second {
				next = time.Now() // do not make up more than a second of backlog
			}
		}
		if d := time.Until(next); d > 0 {
			select {
			case <-p.driveStop:
				return
			case <-time.After(d):
			}
		}
	}
}

var errStopped = errors.New("stopped")

// one makes, posts, waits for and releases one request.
func (p *peerState) one(ld, rd nixl.Dlist, idx []int, notif string) (int64, error) {
	x, err := p.agent.MakeXferReq(nixl.Write, ld, idx, rd, idx, []byte(notif))
	if err != nil {
		return 0, err
	}
	defer p.agent.ReleaseXferReq(x)
	st, err := p.agent.PostXferReq(x)
	for i := 0; st == nixl.InProgress; i++ {
		if i > 64 {
			time.Sleep(50 * time.Microsecond) // leave the cores to the receiver
		}
		select {
		case <-p.driveStop:
			// Let it finish: releasing a request in flight is an error.
			for st == nixl.InProgress {
				time.Sleep(time.Millisecond)
				st, _ = p.agent.XferStatus(x)
			}
			return 0, errStopped
		default:
		}
		st, err = p.agent.XferStatus(x)
	}
	if st == nixl.Failed {
		return 0, err
	}
	return x.Bytes(), nil
}

// verify checks every block of the pool that holds data against the tag
// it must carry; blocks still all zero were not written (a fresh mapping
// is zero), a written block with the wrong tag landed in the wrong place
// or only in part.
func (p *peerState) verify(seed uint64) (PeerReply, error) {
	var rep PeerReply
	data := p.pool.Bytes()
	s := p.shape
	for i, r := range s.Regions {
		for b := 0; b < s.PoolBlocks; b++ {
			off := r.Offset + int64(b)*r.BlockBytes
			blk := data[off : off+r.BlockBytes]
			if allZero(blk) {
				continue
			}
			rep.Written++
			if m := blocktag.Check(blk, blocktag.Key(seed, uint64(i), uint64(b))); m != nil {
				if rep.Corrupt == 0 {
					rep.First = fmt.Sprintf("region %d block %d: %v", i, b, m)
				}
				rep.Corrupt++
			}
		}
	}
	return rep, nil
}

func allZero(b []byte) bool {
	for _, x := range b {
		if x != 0 {
			return false
		}
	}
	return true
}

func (p *peerState) stopDrive() {
	if p.driveStop == nil {
		return
	}
	select {
	case <-p.driveStop:
	default:
		close(p.driveStop)
	}
	<-p.driveDone
}

func (p *peerState) stats() PeerStats {
	p.mu.Lock()
	st := p.st
	p.mu.Unlock()
	st.Notifs = p.notifs.Load()
	st.ChurnOps, st.ChurnFailed, st.ChurnLive = p.churn.stats()
	st.Leaked = p.leak.bytes()
	return st
}

func (p *peerState) close() {
	p.stopDrive()
	if p.drainStop != nil {
		close(p.drainStop)
		<-p.drainDone
		p.drainStop = nil
	}
	p.churn.close()
	p.churn = nil
	p.leak.close()
	p.leak = nil
	if p.agent != nil {
		p.agent.Close()
		p.pool.Free()
		p.agent = nil
	}
}
