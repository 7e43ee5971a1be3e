package engine

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"sync"
	"time"

	"github.com/nixlctl/nixlctl/internal/kv"
	"github.com/nixlctl/nixlctl/internal/mono"
	"github.com/nixlctl/nixlctl/internal/nixl"
	"github.com/nixlctl/nixlctl/internal/nixl/cuda"
	"github.com/nixlctl/nixlctl/internal/sglrooms"
	"github.com/nixlctl/nixlctl/internal/sidechannel"
)

// SGLang's NIXL disaggregation: the router gives both sides a bootstrap
// room; prefill runs an HTTP bootstrap server where its ranks register;
// every rank has a ZMQ PULL inbox; decode registers its KV buffers with
// each prefill rank once (room "None"), pre-allocates pages and an aux
// (metadata) row per request and sends a TransferInfo; prefill WRITEs the
// pages chunk by chunk (page boundaries) with "{room}_kv_{chunk}_{last}_{rank}"
// notifications and the aux row with "{room}_aux"; decode polls until all
// chunks and the aux arrived, then checks that the aux row carries its room.

// Aux buffers: one row per request in flight, each row 64 bytes (SGLang
// pads rows to the 64-byte RDMA minimum); written with one descriptor per
// buffer.
const (
	auxRows    = sidechannel.SGLAuxRows
	auxRowSize = 64
	auxBuffers = 3 // output ids, cached tokens, bootstrap room
)

// sglRank is one rank's SGLang plumbing.
type sglRank struct {
	inbox *sidechannel.Pull
	aux   *nixl.Buffer    // host memory, as SGLang; GPU memory where the backend moves nothing else
	pool  *BlockAllocator // aux rows
	push  map[string]*sidechannel.Push
}

// auxSpans are aux row row's pieces, one per aux buffer.
func auxSpans(row int) []nixl.Span {
	spans := make([]nixl.Span, auxBuffers)
	for b := range spans {
		spans[b] = nixl.Span{Off: (b*auxRows + row) * auxRowSize, Len: auxRowSize}
	}
	return spans
}

// writeAux stores an aux row (its pieces back to back in row bytes).
func (sr *sglRank) writeAux(row int, pieces []byte) error {
	if sr.aux.Mem == nixl.VRAM {
		return cuda.CopyIn(sr.aux, auxSpans(row), pieces)
	}
	a := sr.aux.Bytes()
	for b, sp := range auxSpans(row) {
		copy(a[sp.Off:sp.Off+sp.Len], pieces[b*auxRowSize:])
	}
	return nil
}

// readAux returns an aux row's pieces back to back.
func (sr *sglRank) readAux(row int) ([]byte, error) {
	pieces := make([]byte, auxBuffers*auxRowSize)
	if sr.aux.Mem == nixl.VRAM {
		return pieces, cuda.CopyOut(sr.aux, auxSpans(row), pieces)
	}
	a := sr.aux.Bytes()
	for b, sp := range auxSpans(row) {
		copy(pieces[b*auxRowSize:], a[sp.Off:sp.Off+sp.Len])
	}
	return pieces, nil
}

// auxRowFor is the aux row prefill writes for room: a word per buffer.
func auxRowFor(room uint64) []byte {
	pieces := make([]byte, auxBuffers*auxRowSize)
	for b := 0; b < auxBuffers; b++ {
		binary.LittleEndian.PutUint64(pieces[b*auxRowSize:], room^uint64(b)*0x9e3779b97f4a7c15)
	}
	return pieces
}

type sglPeer struct {
	reg    sidechannel.SGLRegistration
	remote string // loaded agent name
	ready  bool
}

// sglRecv is a room decode is receiving: its tracker, the channel closed
// when the tracker says it is complete, the prefill it waits on (bootstrap
// address), and the channel closed when that prefill is given up on (err
// says why). complete and err are under sglState.mu.
type sglRecv struct {
	tr       *sglrooms.Tracker
	done     chan struct{}
	addr     string
	failed   chan struct{}
	complete bool
	err      error
}

type sglState struct {
	e             *Engine
	ranks         []*sglRank
	bootstrapAddr string
	http          *http.Server
	mu            sync.Mutex
	boot          *sglBootstrap         // prefill: the bootstrap server
	peers         []map[string]*sglPeer // prefill, per rank: decode agent -> registration
	// Prefill, per rank: the rooms, and the prefill calls waiting for a
	// room to be bootstrapped (closed when it is, or aborted).
	rooms []*sglrooms.Rooms[sidechannel.SGLTransferInfo]
	waits []map[uint64]chan struct{}
	// Decode, per rank: the rooms being received.
	recv       []map[uint64]*sglRecv
	info       map[string]sglPrefillInfo // decode: bootstrap addr -> prefill info
	registered map[[2]string]bool        // decode: (local agent, prefill rank addr) registered
	// Decode: held while a registration is sent, so rooms set up at once
	// register with a prefill rank once (keys as registered's).
	registering map[[2]string]*sync.Mutex
	client      *http.Client
}

// sglPrefillInfo is SGLang's PrefillServerInfo, every field of it: a
// decode reads them all.
type sglPrefillInfo struct {
	AttnTPSize               int     `json:"attn_tp_size"`
	AttnCPSize               int     `json:"attn_cp_size"`
	DPSize                   int     `json:"dp_size"`
	PPSize                   int     `json:"pp_size"`
	PageSize                 int     `json:"page_size"`
	KVCacheDType             *string `json:"kv_cache_dtype"` // Optional upstream: null when no rank gave one
	FollowBootstrapRoom      bool    `json:"follow_bootstrap_room"`
	EnableDSACacheLayerSplit bool    `json:"enable_dsa_cache_layer_split"`
	PrefillHTTPPort          *int    `json:"prefill_http_port"` // null: no HTTP API to recompute on
}

// pyDict is the body of SGLang's GET /route with every parameter -1:
// dataclasses.asdict(PrefillServerInfo) in field order, so the decode-side
// fields (target ranks, required counts) follow as null.
func (i sglPrefillInfo) pyDict() sidechannel.PyDict {
	var port, dtype any
	if i.PrefillHTTPPort != nil {
		port = *i.PrefillHTTPPort
	}
	if i.KVCacheDType != nil {
		dtype = *i.KVCacheDType
	}
	return sidechannel.PyDict{{Key: "attn_tp_size", Value: i.AttnTPSize}, {Key: "attn_cp_size", Value: i.AttnCPSize},
		{Key: "dp_size", Value: i.DPSize}, {Key: "pp_size", Value: i.PPSize}, {Key: "page_size", Value: i.PageSize},
		{Key: "kv_cache_dtype", Value: dtype}, {Key: "follow_bootstrap_room", Value: i.FollowBootstrapRoom},
		{Key: "enable_dsa_cache_layer_split", Value: i.EnableDSACacheLayerSplit}, {Key: "prefill_http_port", Value: port},
		{Key: "target_tp_rank"}, {Key: "target_tp_ranks"}, {Key: "target_cp_ranks"}, {Key: "target_pp_ranks"},
		{Key: "required_dst_info_num"}, {Key: "required_prefill_response_num"}}
}

// sglRankEntry is the bootstrap table's answer for one prefill rank;
// rank_port is an integer, as SGLang's decode expects.
type sglRankEntry struct {
	RankIP   string `json:"rank_ip"`
	RankPort int    `json:"rank_port"`
}

// pyDict is dataclasses.asdict(PrefillRankInfo).
func (e sglRankEntry) pyDict() sidechannel.PyDict {
	return sidechannel.PyDict{{Key: "rank_ip", Value: e.RankIP}, {Key: "rank_port", Value: e.RankPort}}
}

// sglRouteParams are the query parameters a decode's GET /route carries;
// SGLang answers 400 when one is missing.
var sglRouteParams = []string{"prefill_dp_rank", "prefill_cp_rank", "target_tp_rank", "target_pp_rank"}

func newSGLState(e *Engine) (*sglState, error) {
	s := &sglState{e: e, info: map[string]sglPrefillInfo{},
		registered: map[[2]string]bool{}, registering: map[[2]string]*sync.Mutex{}, client: &http.Client{Timeout: 5 * time.Second}}
	// Inboxes and the bootstrap server bind where the handshake socket
	// did; messages name the advertised host.
	host, _, err := splitEndpoint(e.side.Endpoint())
	if err != nil {
		return nil, err
	}
	for _, rk := range e.ranks {
		sr := &sglRank{pool: NewBlockAllocator(auxRows, false, 1), push: map[string]*sidechannel.Push{}}
		if sr.aux, err = allocAux(rk); err != nil {
			return nil, err
		}
		idx := rk.idx
		if sr.inbox, err = sidechannel.ListenPull(e.ctx, "tcp://"+net.JoinHostPort(host, "0"), func(f [][]byte) { s.onInbox(idx, f) }); err != nil {
			return nil, err
		}
		s.ranks = append(s.ranks, sr)
		s.peers = append(s.peers, map[string]*sglPeer{})
		s.rooms = append(s.rooms, sglrooms.New[sidechannel.SGLTransferInfo](int64(e.cfg.SGLBootstrapTimeout)))
		s.waits = append(s.waits, map[uint64]chan struct{}{})
		s.recv = append(s.recv, map[uint64]*sglRecv{})
	}
	if e.cfg.Role == RolePrefill {
		if err := s.serveBootstrap(host); err != nil {
			return nil, err
		}
	} else {
		e.wg.Add(1)
		go func() {
			defer e.wg.Done()
			s.heartbeat(e.ctx)
		}()
	}
	return s, nil
}

// allocAux allocates and registers a rank's aux rows in host memory, as
// SGLang does. A backend that moves GPU memory only (cuda-ipc) cannot
// register them: with the KV pool in GPU memory they go there too, so the
// run still carries SGLang's metadata gate (the result warns of it).
func allocAux(rk *rank) (*nixl.Buffer, error) {
	size := auxRows * auxRowSize * auxBuffers
	aux, err := nixl.AllocDRAM(size, false)
	if err != nil {
		return nil, err
	}
	err = rk.agent.RegisterMem(aux)
	if err == nil {
		return aux, nil
	}
	_ = aux.Free()
	if !errors.Is(err, nixl.ErrMemType) || rk.buf.Mem != nixl.VRAM {
		return nil, fmt.Errorf("aux rows: %w", err)
	}
	if aux, err = cuda.Alloc(int(rk.buf.Dev), size); err != nil {
		return nil, fmt.Errorf("aux rows in GPU memory: %w", err)
	}
	if err := cuda.CopyIn(aux, []nixl.Span{{Off: 0, Len: size}}, make([]byte, size)); err != nil {
		_ = aux.Free()
		return nil, err
	}
	if err := rk.agent.RegisterMem(aux); err != nil {
		_ = aux.Free()
		return nil, fmt.Errorf("aux rows in GPU memory: %w", err)
	}
	return aux, nil
}

func (s *sglState) close() {
	if s.http != nil {
		_ = s.http.Close()
	}
	for _, sr := range s.ranks {
		sr.inbox.Wait()
		for _, p := range sr.push {
			_ = p.Close()
		}
	}
}

func (s *sglState) freeAux() {
	for _, sr := range s.ranks {
		_ = sr.aux.Free()
	}
}

// serveBootstrap runs prefill's bootstrap server and registers every rank
// with it (PUT /route), as SGLang's prefill ranks do at start-up.
func (s *sglState) serveBootstrap(host string) error {
	ln, err := net.Listen("tcp", net.JoinHostPort(host, "0"))
	if err != nil {
		return err
	}
	s.boot = newSGLBootstrap(s.e.now, func() { s.e.c.malformedControl.Add(1) })
	s.http = &http.Server{Handler: s.boot.mux(), ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = s.http.Serve(ln) }()
	_, bport, _ := splitEndpoint(ln.Addr().String())
	s.bootstrapAddr = net.JoinHostPort(s.e.cfg.Advertise, strconv.Itoa(bport))
	var httpPort any // null: no HTTP API in front of this prefill
	if p := s.e.cfg.SGLPrefillHTTPPort; p > 0 {
		httpPort = p
	}
	for i, sr := range s.ranks {
		_, port, _ := splitEndpoint(sr.inbox.Endpoint())
		// One DP rank, so a room's DP rank follows from the room alone
		// (follow_bootstrap_room); prefill_http_port only with SGLPrefillHTTPPort.
		body, _ := json.Marshal(map[string]any{"attn_tp_size": len(s.ranks), "attn_tp_rank": i, "attn_cp_size": 1, "attn_cp_rank": 0,
			"attn_dp_size": 1, "attn_dp_rank": 0, "pp_size": 1, "pp_rank": 0, "system_dp_size": 1, "system_dp_rank": 0,
			"rank_ip": s.e.cfg.Advertise, "rank_port": port, "page_size": s.e.spec.BlockSize, "kv_cache_dtype": s.e.cfg.SGLKVCacheDType,
			"load_balance_method": "follow_bootstrap_room", "enable_dsa_cache_layer_split": false,
			"prefill_http_port": httpPort})
		// Registered over the listener's own address: the advertised one
		// may be reachable only from other hosts (NAT, a service name).
		req, _ := http.NewRequest(http.MethodPut, "http://"+loopbackFor(ln.Addr())+"/route", bytes.NewReader(body))
		resp, err := s.client.Do(req)
		if err != nil {
			return fmt.Errorf("bootstrap registration: %w", err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("bootstrap registration: %s", resp.Status)
		}
	}
	return nil
}

// onInbox handles a message on a prefill rank's PULL socket.
func (s *sglState) onInbox(r int, frames [][]byte) {
	reg, info, abort, err := sidechannel.DecodeSGLMessage(frames)
	if err != nil {
		s.e.c.malformedControl.Add(1)
		s.e.log.Warn("SGLang inbox: bad message", "rank", r, "err", err)
		return
	}
	if s.e.cfg.Role != RolePrefill {
		s.e.c.malformedControl.Add(1)
		return
	}
	rk := s.e.ranks[r]
	s.mu.Lock()
	defer s.mu.Unlock()
	switch {
	case reg != nil:
		name, err := rk.agent.LoadRemoteMD(reg.AgentMD)
		if err != nil {
			s.e.c.handshakeFails.Add(1)
			s.e.log.Warn("SGLang registration: cannot load decode agent", "agent", reg.AgentName, "err", err)
			return
		}
		s.e.c.handshakes.Add(1)
		s.peers[r][reg.AgentName] = &sglPeer{reg: *reg, remote: name, ready: true}
	case info != nil:
		if _, ok := s.peers[r][info.AgentName]; !ok {
			s.e.c.malformedControl.Add(1)
			s.e.log.Warn("SGLang transfer info from an unregistered decode agent", "agent", info.AgentName)
			return
		}
		s.roomEventLocked(r, info.Room, s.rooms[r].Info(info.Room, info.AgentName, info.RequiredDst, *info, s.e.now()), "transfer info")
	default:
		s.roomEventLocked(r, abort, s.rooms[r].Abort(abort, s.e.now()), "abort")
	}
}

// roomEventLocked acts on what a message did to a room: wake the prefill
// call waiting for it, or count a duplicate or late message.
func (s *sglState) roomEventLocked(r int, room uint64, ev sglrooms.Event, what string) {
	switch ev {
	case sglrooms.Woke:
		if ch := s.waits[r][room]; ch != nil {
			close(ch)
			delete(s.waits[r], room)
		}
	case sglrooms.Duplicate, sglrooms.Late:
		s.e.c.staleControl.Add(1)
		s.e.log.Debug("SGLang "+what+": duplicate or late, ignored", "rank", r, "room", room)
	}
}

// prefill computes a room's KV and sends it chunk by chunk to the decode
// ranks that bootstrapped the room.
func (s *sglState) prefill(ctx context.Context, r PrefillRequest) (PrefillReply, error) {
	e := s.e
	if r.Tokens <= 0 || r.Tokens > kv.MaxTokens {
		return PrefillReply{}, fmt.Errorf("tokens must be between 1 and %d", kv.MaxTokens)
	}
	e.c.requests.Add(1)
	rep := PrefillReply{RequestID: strconv.FormatUint(r.Room, 10), TStart: mono.Now()}
	n := e.spec.BlocksFor(kv.FullAttention, r.Tokens)
	blocks, err := e.alloc.Alloc(n)
	if err != nil {
		return rep, err
	}
	sent := false
	defer func() {
		if !sent {
			// A WRITE abandoned part way may still read them: poison.
			// Sent, every WRITE from them finished and nobody reads them
			// again (see prefillState.free).
			for _, rk := range e.ranks {
				rk.pool.Poison(blocks)
			}
		}
		_ = e.alloc.Free(blocks)
	}()
	for _, rk := range e.ranks {
		var err error
		e.onHarness(func() { err = rk.pool.FillFor(ctx, r.Key, blocks, 0, r.Tokens, e.cfg.Verify, r.CheckTP == e.spec.TP) })
		if err != nil {
			return rep, err // the router gave up: stop filling, free the blocks now
		}
	}
	if e.cfg.PrefillPerToken > 0 {
		if left := time.Duration(r.Tokens)*time.Duration(e.cfg.PrefillPerToken) - mono.Since(rep.TStart); left > 0 {
			select {
			case <-time.After(left):
			case <-ctx.Done():
				return rep, ctx.Err()
			}
		}
	}
	rep.TFinish = mono.Now()
	rep.Blocks = n
	// Wait for every rank's room to be bootstrapped (all decode ranks' TransferInfo in).
	defer func() {
		s.mu.Lock()
		for i := range e.ranks {
			s.rooms[i].Finish(r.Room, e.now())
			delete(s.waits[i], r.Room)
		}
		s.mu.Unlock()
	}()
	timeout := time.NewTimer(time.Duration(e.cfg.SGLBootstrapTimeout))
	defer timeout.Stop()
	for i := range e.ranks {
		s.mu.Lock()
		var ready chan struct{}
		if s.rooms[i].Claim(r.Room, e.now()) == sglrooms.Bootstrapping {
			if ready = s.waits[i][r.Room]; ready == nil {
				ready = make(chan struct{})
				s.waits[i][r.Room] = ready
			}
		}
		s.mu.Unlock()
		if ready == nil {
			continue
		}
		select {
		case <-ready:
		case <-timeout.C:
			return rep, fmt.Errorf("room %d: bootstrap timeout after %v", r.Room, e.cfg.SGLBootstrapTimeout)
		case <-ctx.Done():
			return rep, ctx.Err()
		}
	}
	// Take every rank's room at once: from here on, a TransferInfo or an
	// ABORT is late and changes nothing this call reads.
	infos := make([][]sidechannel.SGLTransferInfo, len(e.ranks))
	s.mu.Lock()
	for i := range e.ranks {
		var ok bool
		var tReady int64
		if infos[i], tReady, ok = s.rooms[i].Start(r.Room); !ok {
			st, _ := s.rooms[i].State(r.Room)
			s.mu.Unlock()
			if st == sglrooms.Aborted {
				return rep, fmt.Errorf("room %d aborted by decode", r.Room)
			}
			return rep, fmt.Errorf("room %d is %s on rank %d", r.Room, st, i)
		}
		rep.TBootstrapped = max(rep.TBootstrapped, tReady)
	}
	s.mu.Unlock()
	chunk := r.ChunkTokens
	if chunk <= 0 {
		chunk = r.Tokens
	}
	bs := e.spec.BlockSize
	var wg sync.WaitGroup
	errs := make([]error, len(e.ranks))
	starts, ends, descs, logical := make([]int64, len(e.ranks)), make([]int64, len(e.ranks)), make([]int, len(e.ranks)), make([]int, len(e.ranks))
	for i, rk := range e.ranks {
		wg.Add(1)
		go func() {
			defer wg.Done()
			starts[i] = mono.Now()
			descs[i], logical[i], errs[i] = s.sendRoom(ctx, rk, infos[i], r, blocks, chunk, bs)
			ends[i] = mono.Now()
		}()
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			e.c.failedXfers.Add(1)
			return rep, fmt.Errorf("rank %d: %w", i, err)
		}
		if rep.TPostStart == 0 || starts[i] < rep.TPostStart {
			rep.TPostStart = starts[i]
		}
		rep.TSent = max(rep.TSent, ends[i])
		rep.Descriptors += descs[i]
		rep.LogicalDescs += logical[i]
	}
	sent = true
	return rep, nil
}

// sendRoom sends one prefill rank's chunks of a room to each decode agent
// in it, then the aux row, and waits for the WRITEs. infos is the room's
// own copy, taken when it started sending: messages arriving meanwhile
// cannot change it.
func (s *sglState) sendRoom(ctx context.Context, rk *rank, infos []sidechannel.SGLTransferInfo, r PrefillRequest, blocks []int, chunk, bs int) (descs, logical int, err error) {
	e := s.e
	sr := s.ranks[rk.idx]
	var xfers []nixl.XferReq
	defer func() {
		for _, x := range xfers {
			_ = rk.agent.ReleaseXferReq(x)
		}
	}()
	for _, info := range infos {
		agentName := info.AgentName
		s.mu.Lock()
		peer := s.peers[rk.idx][agentName]
		s.mu.Unlock()
		if peer == nil {
			return descs, logical, fmt.Errorf("decode agent %s is not registered", agentName)
		}
		// The slice of heads this prefill rank owes that decode rank.
		dspec := e.spec
		dspec.TP = peer.reg.DecodeTP
		plan, err := kv.Plan(e.spec, dspec)
		if err != nil {
			return descs, logical, err
		}
		var chunks []kv.Chunk
		reads := plan.Decode[peer.reg.DecodeRank].Reads
		for _, rd := range reads {
			if rd.PrefillRank == rk.idx {
				chunks = rd.Chunks
			}
		}
		// One prefill rank per decode rank writes the aux row (the first of
		// its sources), so the aux notification comes exactly once.
		sendsAux := len(reads) > 0 && reads[0].PrefillRank == rk.idx
		prefixPages := min(info.PrefixLen/bs, len(blocks))
		src := blocks[prefixPages:]
		if len(info.DstPages) != len(src) {
			return descs, logical, fmt.Errorf("decode pre-allocated %d pages for %d", len(info.DstPages), len(src))
		}
		dst := make([]int, len(info.DstPages))
		for i, p := range info.DstPages {
			dst[i] = int(p)
		}
		slots := peer.reg.DstNumSlots
		if slots == 0 {
			slots = 1 << 30 // a real SGLang decode does not say
		}
		rm := sidechannel.AgentMetadata{KVCachesBaseAddr: peer.reg.KVPtrs, NumBlocks: slots}
		for range peer.reg.KVPtrs {
			rm.BlockLens = append(rm.BlockLens, peer.reg.KVItemLen)
		}
		if chunks == nil {
			// A dummy rank (MLA fan-in): nothing to send but the room's end.
			if err := rk.agent.SendNotif(peer.remote, sidechannel.SGLNoKVNotif(r.Room, rk.idx)); err != nil {
				return descs, logical, err
			}
			continue
		}
		var pp *preppedPair
		if peer.reg.DstNumSlots > 0 && len(src) > 0 {
			// Only a decode that says how many slots it has can be
			// prepared for (SGLang's own NIXL path builds descriptors per
			// transfer). Slots it counts but did not register fail the
			// whole list, not the pages this room uses: build per request.
			pp, _ = e.prepped(rk, peer.remote, rm, rk.buf.Mem, chunks, true)
		}
		// Chunked prefill: every chunk but the last ends on a page boundary.
		pagesPerChunk := max(1, chunk/bs)
		for c, from := 0, 0; from < len(src) || (c == 0 && len(src) == 0); c++ {
			to := min(from+pagesPerChunk, len(src))
			last := to == len(src)
			notif := sidechannel.SGLKVNotif(r.Room, c, last, rk.idx)
			// SGLang registers KV as the pool's memory (VRAM on GPUs) and the aux rows as DRAM.
			x, ml, err := e.makeMove(rk, nixl.Write, pp, peer.remote, rm, rk.buf.Mem, moveOpts{Chunks: chunks, LocalBlocks: src[from:to],
				RemoteBlocks: dst[from:to], LogicalStart: prefixPages + from, Tokens: r.Tokens, LocalIsPrefill: true, Merge: e.cfg.Merge}, notif)
			if err != nil {
				return descs, logical, err
			}
			xfers = append(xfers, x)
			if st, err := rk.agent.PostXferReq(x); st == nixl.Failed {
				return descs, logical, fmt.Errorf("post chunk %d: %w", c, err)
			}
			descs += ml.descs
			logical += ml.logical
			from = to
			if last {
				break
			}
		}
		if !sendsAux {
			continue
		}
		// The aux row: one descriptor per aux buffer, the room in the last.
		row, err := sr.pool.Alloc(1)
		if err != nil {
			return descs, logical, err
		}
		if err := sr.writeAux(row[0], auxRowFor(r.Room)); err != nil {
			return descs, logical, fmt.Errorf("aux: %w", err)
		}
		var ld, rd []nixl.Desc
		for b := 0; b < auxBuffers && b < len(peer.reg.AuxPtrs); b++ {
			ld = append(ld, sr.aux.Desc((b*auxRows+row[0])*auxRowSize, auxRowSize))
			rd = append(rd, nixl.Desc{Addr: peer.reg.AuxPtrs[b] + uint64(info.DstAux*auxRowSize), Len: auxRowSize})
		}
		x, err := rk.agent.CreateXferReq(nixl.Write, sr.aux.Mem, ld, sr.aux.Mem, rd, peer.remote, sidechannel.SGLAuxNotif(r.Room))
		if err == nil {
			xfers = append(xfers, x)
			if st, perr := rk.agent.PostXferReq(x); st == nixl.Failed {
				err = perr
			}
		}
		defer func() { _ = sr.pool.Free(row) }()
		if err != nil {
			return descs, logical, fmt.Errorf("aux: %w", err)
		}
	}
	for _, x := range xfers {
		if err := rk.waits.Wait(ctx, x, 0); err != nil {
			return descs, logical, err
		}
	}
	return descs, logical, nil
}

// load is decode's side of a room: register with the prefill ranks it
// needs (once), pre-allocate pages and an aux row, send TransferInfo, and
// wait for SGLang's is_done.
func (s *sglState) load(ctx context.Context, r LoadRequest, rep *LoadReply) (loadErr error) {
	e := s.e
	info, err := s.prefillInfo(ctx, r.Bootstrap)
	if err != nil {
		return err
	}
	if err := e.sglCompatible(info); err != nil {
		return err
	}
	pspec := e.spec
	pspec.TP = info.AttnTPSize
	plan, err := kv.Plan(pspec, e.spec)
	if err != nil {
		return err
	}
	local, start, _, err := e.dec.localShare(r)
	if err != nil {
		return err
	}
	defer e.dec.release(local)
	rep.Blocks = len(local)
	pages := make([]int32, len(local))
	for i, b := range local {
		pages[i] = int32(b)
	}
	// SGLang's rank mapping: the prefill ranks each decode rank talks to,
	// and how many decode ranks each prefill rank waits for.
	requiredDst := max(1, len(e.ranks)/info.AttnTPSize)
	t0 := mono.Now()
	first := false
	recvs := make([]*sglRecv, len(e.ranks))
	// Where each TransferInfo went, so that a room given up can be
	// aborted there.
	type sent struct {
		push *sidechannel.Push
		ip   string
		port int
	}
	var sentTo []sent
	defer func() {
		s.mu.Lock()
		for d := range e.ranks {
			if s.recv[d][r.Room] == recvs[d] {
				delete(s.recv[d], r.Room)
			}
		}
		s.mu.Unlock()
	}()
	for d, rk := range e.ranks {
		var targets []int
		for _, rd := range plan.Decode[d].Reads {
			targets = append(targets, rd.PrefillRank)
		}
		targets = append(targets, plan.Decode[d].NotifyOnly...)
		rc := &sglRecv{tr: sglrooms.NewTracker(len(targets)), done: make(chan struct{}), addr: r.Bootstrap, failed: make(chan struct{})}
		recvs[d] = rc
		s.mu.Lock()
		s.recv[d][r.Room] = rc
		s.mu.Unlock()
		row, err := s.ranks[d].pool.Alloc(1)
		if err != nil {
			return err
		}
		defer func() { _ = s.ranks[d].pool.Free(row) }()
		if err := s.ranks[d].writeAux(row[0], make([]byte, auxBuffers*auxRowSize)); err != nil {
			return fmt.Errorf("aux row: %w", err)
		}
		for _, p := range targets {
			push, isNew, err := s.ensureRegistered(ctx, r.Bootstrap, rk, p)
			if err != nil {
				return err
			}
			first = first || isNew
			ip, port := e.advertised(s.ranks[d].inbox.Endpoint())
			ti := sidechannel.SGLTransferInfo{Room: r.Room, DecodeIP: ip, DecodePort: port, AgentName: rk.agent.Name(), DstPages: pages,
				DstAux: row[0], RequiredDst: requiredDst, PrefixLen: start * e.spec.BlockSize}
			if rep.TRegSent == 0 {
				// Before the send: prefill may bootstrap the room (and
				// stamp it) before Send returns here.
				rep.TRegSent = mono.Now()
			}
			if err := push.Send(ti.Encode()); err != nil {
				return fmt.Errorf("transfer info to prefill rank %d: %w", p, err)
			}
			sentTo = append(sentTo, sent{push, ip, port})
		}
		defer func(d int, row int) {
			// A room that failed never had its aux row written: that is
			// the failure, not corruption.
			if loadErr == nil && !r.Foreign {
				rep.CorruptBlocks += s.checkAux(d, row, r.Room)
			}
		}(d, row[0])
	}
	if first {
		rep.HandshakeMS, rep.FirstHandshake = float64(mono.Since(t0))/1e6, true
	}
	// A prefill given up on while this room was set up took its rooms with
	// it before this one was among them: this one would wait out the
	// waiting timeout for a prefill no longer checked.
	s.mu.Lock()
	_, known := s.info[r.Bootstrap]
	s.mu.Unlock()
	if !known {
		e.c.sglRoomsFailed.Add(1)
		return fmt.Errorf("room %d: prefill %s lost while the room was set up", r.Room, r.Bootstrap)
	}
	timeout := time.NewTimer(time.Duration(e.cfg.SGLWaitingTimeout))
	defer timeout.Stop()
	for _, rc := range recvs {
		select {
		case <-rc.done:
		case <-rc.failed:
			s.mu.Lock()
			err := rc.err
			s.mu.Unlock()
			e.c.sglRoomsFailed.Add(1)
			return fmt.Errorf("room %d: %w", r.Room, err)
		case <-timeout.C:
			e.c.regTimeouts.Add(1)
			// As upstream's decode: the room fails here and prefill is
			// told, best effort, so that it does not write it later.
			for _, to := range sentTo {
				if err := to.push.Send(sidechannel.SGLAbort(r.Room, to.ip, to.port)); err != nil {
					e.log.Debug("SGLang ABORT not sent", "room", r.Room, "err", err)
				}
			}
			return fmt.Errorf("room %d: waiting timeout after %v", r.Room, e.cfg.SGLWaitingTimeout)
		case <-ctx.Done():
			return ctx.Err()
		}
		s.mu.Lock()
		rep.TXferDone = max(rep.TXferDone, rc.tr.TLast())
		s.mu.Unlock()
	}
	rep.TReady = mono.Now()
	if !r.Foreign {
		e.dec.verify(r, local, start, rep)
	}
	return nil
}

// checkAux is SGLang's metadata gate: the aux row must carry the room.
func (s *sglState) checkAux(d, row int, room uint64) int {
	got, err := s.ranks[d].readAux(row)
	if err != nil {
		s.e.log.Warn("SGLang aux row unreadable", "room", room, "err", err)
		return auxBuffers
	}
	want := auxRowFor(room)
	bad := 0
	for b := 0; b < auxBuffers; b++ {
		if binary.LittleEndian.Uint64(got[b*auxRowSize:]) != binary.LittleEndian.Uint64(want[b*auxRowSize:]) {
			bad++
		}
	}
	return bad
}

func (s *sglState) prefillInfo(ctx context.Context, addr string) (sglPrefillInfo, error) {
	s.mu.Lock()
	info, ok := s.info[addr]
	s.mu.Unlock()
	if ok {
		return info, nil
	}
	q := url.Values{"prefill_dp_rank": {"-1"}, "prefill_cp_rank": {"-1"}, "target_tp_rank": {"-1"}, "target_pp_rank": {"-1"}}
	if err := s.getJSON(ctx, addr, q, &info); err != nil {
		return info, err
	}
	if info.AttnTPSize <= 0 || info.AttnTPSize > 1024 || info.PageSize <= 0 {
		return info, fmt.Errorf("bootstrap %s: bad prefill info %+v", addr, info)
	}
	s.mu.Lock()
	s.info[addr] = info
	s.mu.Unlock()
	return info, nil
}

func (s *sglState) getJSON(ctx context.Context, addr string, q url.Values, v any) error {
	for attempt := 0; ; attempt++ {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+"/route?"+q.Encode(), nil)
		resp, err := s.client.Do(req)
		if err != nil {
			return fmt.Errorf("bootstrap %s: %w", addr, err)
		}
		if resp.StatusCode == http.StatusServiceUnavailable && attempt < 50 {
			resp.Body.Close()
			time.Sleep(100 * time.Millisecond)
			continue
		}
		defer resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("bootstrap %s: %s", addr, resp.Status)
		}
		return json.NewDecoder(resp.Body).Decode(v)
	}
}

// ensureRegistered sends decode rank rk's KV args to prefill rank p once
// and returns the PUSH socket to that rank's inbox. Rooms that reach a
// rank at once wait for the first one's registration (SGLang registers
// once per connection); each sending its own had the prefill register the
// agent again and left all but the last socket open.
func (s *sglState) ensureRegistered(ctx context.Context, bootstrap string, rk *rank, p int) (*sidechannel.Push, bool, error) {
	var entry sglRankEntry
	q := url.Values{"prefill_dp_rank": {"0"}, "prefill_cp_rank": {"0"}, "target_tp_rank": {strconv.Itoa(p)}, "target_pp_rank": {"0"}}
	key := [2]string{rk.agent.Name(), bootstrap + "/" + strconv.Itoa(p)}
	s.mu.Lock()
	one := s.registering[key]
	if one == nil {
		one = &sync.Mutex{}
		s.registering[key] = one
	}
	s.mu.Unlock()
	one.Lock()
	defer one.Unlock()
	s.mu.Lock()
	done := s.registered[key]
	push := s.ranks[rk.idx].push[key[1]]
	s.mu.Unlock()
	if done && push != nil {
		return push, false, nil
	}
	if err := s.getJSON(ctx, bootstrap, q, &entry); err != nil {
		return nil, false, err
	}
	if entry.RankPort <= 0 || entry.RankPort > 65535 {
		return nil, false, fmt.Errorf("bootstrap %s: rank %d has no port (%+v)", bootstrap, p, entry)
	}
	ep := "tcp://" + net.JoinHostPort(entry.RankIP, strconv.Itoa(entry.RankPort))
	push, err := sidechannel.DialPush(ep, 30*time.Second)
	if err != nil {
		return nil, false, err
	}
	md, err := rk.agent.LocalMD()
	if err != nil {
		return nil, false, err
	}
	ip, port := s.e.advertised(s.ranks[rk.idx].inbox.Endpoint())
	reg := sidechannel.SGLRegistration{DecodeIP: ip, DecodePort: port, AgentName: rk.agent.Name(), AgentMD: md, GPUID: 0,
		DecodeTP: len(s.e.ranks), DecodeRank: rk.idx, DstNumSlots: s.e.cfg.NumBlocks}
	for i := range rk.pool.Rank.Regions {
		reg.KVPtrs = append(reg.KVPtrs, rk.pool.RegionBase(i))
		reg.KVItemLen = rk.pool.BlockLen(i)
	}
	for b := 0; b < auxBuffers; b++ {
		reg.AuxPtrs = append(reg.AuxPtrs, s.ranks[rk.idx].aux.Addr+uint64(b*auxRows*auxRowSize))
	}
	if err := push.Send(reg.Encode()); err != nil {
		push.Close()
		return nil, false, err
	}
	s.mu.Lock()
	s.registered[key] = true
	s.ranks[rk.idx].push[key[1]] = push
	s.mu.Unlock()
	return push, true, nil
}

// onNotif counts a decode-side SGLang notification.
func (s *sglState) onNotif(rk *rank, from, m string) {
	n, err := sidechannel.ParseSGLNotif(m)
	if err != nil {
		s.e.badNotif(err.Error(), from, m)
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	rc := s.recv[rk.idx][n.Room]
	if rc == nil {
		s.e.c.unknown.Add(1)
		s.e.log.Warn("notification for an unknown room", "room", n.Room, "from", from)
		return
	}
	// The tracker's time is a stage time (the last WRITE seen), joined
	// with prefill's: the real clock, not the engine's.
	switch rc.tr.Notif(sglrooms.Notif{Kind: n.Kind, Chunk: n.Chunk, Last: n.Last, Sender: n.Sender}, mono.Now()) {
	case sglrooms.NotifComplete:
		rc.complete = true
		close(rc.done)
	case sglrooms.NotifDuplicate, sglrooms.NotifLate:
		s.e.c.duplicate.Add(1)
	}
}

// loopbackFor is a listener's address as this process can dial it: the
// loopback address for a listener on 0.0.0.0 or ::.
func loopbackFor(a net.Addr) string {
	host, port, err := net.SplitHostPort(a.String())
	if err != nil {
		return a.String()
	}
	if ip := net.ParseIP(host); ip != nil && ip.IsUnspecified() {
		if ip.To4() != nil {
			host = "127.0.0.1"
		} else {
			host = "::1"
		}
	}
	return net.JoinHostPort(host, port)
}

// sglCompatible is SGLang decode's sanity check of a prefill's server info
// (common/conn.py CommonKVManager.try_ensure_parallel_info @0094505d): the
// page sizes must be equal, and the kv_cache_dtype strings too unless the
// prefill registered none. The strings are the --kv-cache-dtype settings
// ("auto" by default), compared as given: "auto" and "bf16" differ even
// where both mean bf16.
func (e *Engine) sglCompatible(info sglPrefillInfo) error {
	if info.PageSize != e.spec.BlockSize {
		return fmt.Errorf("page size mismatch: prefill server has page_size=%d, but decode has %d", info.PageSize, e.spec.BlockSize)
	}
	if info.KVCacheDType != nil && *info.KVCacheDType != e.cfg.SGLKVCacheDType {
		return fmt.Errorf("KV cache dtype mismatch: prefill server has kv_cache_dtype=%s, but decode has %s (SGLang compares the --kv-cache-dtype strings; set --sglang-kv-dtype to the prefill's)",
			*info.KVCacheDType, e.cfg.SGLKVCacheDType)
	}
	return nil
}
