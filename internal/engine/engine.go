package engine

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nixlctl/nixlctl/internal/enum"
	"github.com/nixlctl/nixlctl/internal/kv"
	"github.com/nixlctl/nixlctl/internal/lease"
	"github.com/nixlctl/nixlctl/internal/mono"
	"github.com/nixlctl/nixlctl/internal/nixl"
	"github.com/nixlctl/nixlctl/internal/nixl/cuda"
	"github.com/nixlctl/nixlctl/internal/runcore"
	"github.com/nixlctl/nixlctl/internal/sidechannel"
)

// Roles (untyped, so they compare with plain strings too; see Role).
const (
	RolePrefill = "prefill"
	RoleDecode  = "decode"
)

// Protocols.
const (
	ProtoPull   Protocol = "pull"
	ProtoPush   Protocol = "push"
	ProtoSGLang Protocol = "sglang"
)

// Config sets up one engine endpoint (all its TP ranks).
type Config struct {
	Role      Role          `json:"role"`
	EngineID  string        `json:"engine_id"`
	Backend   string        `json:"backend"`
	Protocol  Protocol      `json:"protocol"`
	Model     kv.Model      `json:"model"`
	KVDType   kv.DType      `json:"kv_dtype"`
	BlockSize int           `json:"block_size"`
	Layout    kv.AttnLayout `json:"layout"`
	Order     kv.CacheOrder `json:"kv_cache_layout"`
	TP        int           `json:"tp"`
	// PP is the number of pipeline stages; each (pp, tp) rank is its own
	// agent holding its stage's layers (0 means 1).
	PP        int `json:"pp,omitempty"`
	NumBlocks int `json:"num_blocks"`
	// Mem is where the KV pools live: DRAM, or VRAM on GPU Device.
	Mem       nixl.MemType `json:"mem"`
	Device    int          `json:"device"`
	Scattered bool         `json:"scattered"`
	Merge     bool         `json:"merge_descriptors"`
	// Knobs are what a run sets alike for all its endpoints (knobs.go).
	Knobs
	// SideChannel is where the engine's handshake ROUTER (and, for
	// SGLang, its bootstrap server and inboxes) binds; default
	// tcp://127.0.0.1:0.
	SideChannel string `json:"side_channel"`
	// Advertise is the host every message names for those side channels
	// (setup reply, kv_transfer_params, push registrations, SGLang's
	// bootstrap table): an address the peer can reach. Empty: the host
	// SideChannel binds, which must then not be 0.0.0.0 or ::.
	Advertise string `json:"advertise,omitempty"`
	// LeasePolicy, FixedTimeout and Reaper complete the lease
	// configuration with Knobs.Lease (LeaseConfig).
	LeasePolicy  lease.Policy     `json:"lease_policy,omitempty"`
	FixedTimeout time.Duration    `json:"fixed_timeout,omitempty"`
	Reaper       lease.ReaperMode `json:"reaper,omitempty"`
	// SGLPrefillHTTPPort is the port of an HTTP API in front of an SGLang
	// prefill, registered as prefill_http_port (0: none, null).
	SGLPrefillHTTPPort int `json:"sglang_prefill_http_port,omitempty"`
	// Step is the engine's step: prefill applies the heartbeats it got
	// and reaps expired leases once per step, decode sends the heartbeats
	// that are due once per step, as vLLM does in its forward loop.
	Step time.Duration `json:"step"`
	// DecodeSlots bounds how many requests decode runs at once (0: no
	// bound); the others wait in its queue, first come first served, and
	// are heartbeated meanwhile. DecodeHold keeps a request's slot that
	// long after its KV arrived (its decoding).
	DecodeSlots int           `json:"decode_slots,omitempty"`
	DecodeHold  time.Duration `json:"decode_hold,omitempty"`
	// LeaseEvents makes prefill report its lease table over time
	// ("leases" samples, "heartbeat" events) and decode its queue
	// ("queued" and, with CrashAt, "crashing" events), for lease-chaos.
	LeaseEvents bool `json:"lease_events,omitempty"`
	// CrashAt (lease-chaos) makes decode SIGKILL itself right after it
	// posted the transfer of this request (the router's id).
	CrashAt string       `json:"crash_at,omitempty"`
	Faults  *nixl.Faults `json:"faults,omitempty"`
	// The compatibility hash advertised and checked in handshakes: by
	// default one derived from this config (engines of nixlctl agree with
	// each other); CompatFactors, a JSON object of vLLM's factor names,
	// makes it exactly the hash a vLLM engine with those factors computes;
	// CompatHashHex adopts a known hash as is. NoCompatCheck accepts any
	// peer hash, as vLLM's enforce_handshake_compat=false does.
	CompatFactors json.RawMessage `json:"compat_factors,omitempty"`
	CompatHashHex string          `json:"compat_hash,omitempty"`
	NoCompatCheck bool            `json:"no_compat_check,omitempty"`
	Seed          uint64          `json:"seed"`
	// Clock drives the protocol state machines' deadlines (nil: the real
	// CLOCK_MONOTONIC); only in-process tests set another.
	Clock Clock `json:"-"`
}

// LeaseConfig is the engine's lease configuration.
func (c Config) LeaseConfig() lease.Config {
	return lease.Config{Policy: c.LeasePolicy, Duration: time.Duration(c.Lease), Timeout: c.FixedTimeout, Reaper: c.Reaper}
}

// Spec is the engine's KV layout.
func (c Config) Spec() kv.Spec {
	return kv.Spec{Model: c.Model, DType: c.KVDType, BlockSize: c.BlockSize, Layout: c.Layout, Order: c.Order, TP: c.TP, PP: c.PP}
}

// CompatHash is vLLM's compatibility hash for this engine's layout: what
// both sides must agree on (model, dtype, heads, layers, attention backend,
// cache dtype, transfer mode), not TP or block size.
func (c Config) CompatHash() (string, error) {
	switch {
	case c.CompatHashHex != "":
		return c.CompatHashHex, nil
	case len(c.CompatFactors) > 0:
		_, h, err := sidechannel.ParseCompatFactors(c.CompatFactors)
		return h, err
	}
	spec, err := c.Spec().Normalize()
	if err != nil {
		return "", err
	}
	backend := attnBackendFor(spec)
	mode := c.Protocol
	if mode == ProtoSGLang {
		mode = "push"
	}
	return sidechannel.CompatHash(map[string]any{
		"vllm_version": "nixlctl", "nixl_connector_version": sidechannel.ConnectorVersion,
		"model": spec.Model.Name, "dtype": string(spec.Model.DType), "num_kv_heads": spec.Model.NumKVHeads,
		"head_size": spec.Model.HeadDim, "num_hidden_layers": spec.Model.NumLayers, "attn_backend_name": backend,
		"cache_dtype": string(spec.DType), "is_hma_enabled": spec.Model.NumSlidingLayers() > 0 && !spec.KeepFullWindow,
		"speculative_config": nil, "transfer_mode": string(mode),
	})
}

// attnBackendFor is the attention backend vLLM would run this layout with.
func attnBackendFor(spec kv.Spec) string {
	switch {
	case spec.Model.IsMLA():
		return "FLASHMLA"
	case spec.Layout == kv.FlashInfer:
		return "FLASHINFER"
	}
	return "FLASH_ATTN"
}

// AttnBackendName is what the handshake metadata names as the attention
// backend: the compatibility factors' attn_backend_name when they give
// one (a real decode compares it with its own), else the backend vLLM
// would run this layout with.
func (c Config) AttnBackendName(spec kv.Spec) string {
	if len(c.CompatFactors) > 0 {
		var f struct {
			Name string `json:"attn_backend_name"`
		}
		if json.Unmarshal(c.CompatFactors, &f) == nil && f.Name != "" {
			return f.Name
		}
	}
	return attnBackendFor(spec)
}

// Stats are an engine's counters; a misbehaving peer shows up here.
type Stats struct {
	Requests int64 `json:"requests"`
	InFlight int64 `json:"in_flight,omitempty"` // prefill/load calls still running
	// AllocWaits counts prefill requests that waited for blocks that
	// pending releases freed (AllocWait) instead of failing at once.
	AllocWaits int64 `json:"alloc_waits,omitempty"`
	// Handshakes and HandshakeFails count the handshakes this engine
	// made with peers' side channels; HandshakesServed those its own side
	// channel answered (a pull prefill's, the stand-in's), and
	// UnknownRankHandshakes the requests there for a rank it lacks, left
	// unanswered as vLLM's listener leaves them (also in MalformedControl).
	Handshakes            int64 `json:"handshakes"`
	HandshakeFails        int64 `json:"handshake_failures"`
	HandshakesServed      int64 `json:"handshakes_served"`
	UnknownRankHandshakes int64 `json:"unknown_rank_handshakes,omitempty"`
	MalformedNotifs       int64 `json:"malformed_notifs"`
	UnknownNotifs         int64 `json:"unknown_request_notifs"`
	DuplicateNotifs       int64 `json:"duplicate_notifs"`
	ExpiredLeases         int64 `json:"expired_leases"`
	FailedTransfers       int64 `json:"failed_transfers"`
	FailedNotifs          int64 `json:"failed_notifs"`
	RegTimeouts           int64 `json:"registration_timeouts"`
	MalformedControl      int64 `json:"malformed_side_channel_msgs"`
	BlocksInUse           int64 `json:"blocks_in_use"`
	BlocksTotal           int64 `json:"blocks_total"`
	// Heartbeats counts heartbeat messages received (prefill);
	// HeartbeatsSent those sent and HeartbeatsLost those a fault plan
	// dropped (decode).
	Heartbeats     int64 `json:"heartbeats"`
	HeartbeatsSent int64 `json:"heartbeats_sent,omitempty"`
	HeartbeatsLost int64 `json:"heartbeats_lost,omitempty"`
	// Prefill's lease table: what it did, what it holds, and the most
	// leases seen past their deadline but not released after a step.
	Leases               *lease.Stats `json:"leases,omitempty"`
	LeasesHeld           int          `json:"leases_held"`
	ExpiredUnreleased    int          `json:"expired_unreleased"`
	ExpiredUnreleasedMax int          `json:"expired_unreleased_max"`
	// Decode's queue: requests waiting for a slot, and aborted there;
	// on prefill, requests the router aborted before any decode read them.
	Queued  int   `json:"queued,omitempty"`
	Aborted int64 `json:"aborted,omitempty"`
	// StaleControl counts SGLang TransferInfos and ABORTs that came twice
	// or after their room was taken: ignored, as a retrying peer's are.
	StaleControl int64 `json:"stale_side_channel_msgs,omitempty"`
	// SGLang decode's liveness checks (GET /health on each prefill's
	// bootstrap server): checks made, checks that failed, prefills given up
	// on (SGLHeartbeatMaxFailures failures in a row), and the rooms that
	// failed because their prefill was given up on.
	SGLHeartbeats        int64 `json:"sglang_heartbeats,omitempty"`
	SGLHeartbeatFailures int64 `json:"sglang_heartbeat_failures,omitempty"`
	SGLPrefillsLost      int64 `json:"sglang_prefills_lost,omitempty"`
	SGLRoomsFailed       int64 `json:"sglang_rooms_failed_prefill_lost,omitempty"`
	// TagWork is where the tag fill and check ran: "idle priority"
	// (SCHED_IDLE threads), "normal priority (why)" where the kernel
	// refused, and they took CPU from the transfers, or the caller's
	// thread for VRAM pools.
	TagWork string `json:"tag_work,omitempty"`
}

type counters struct {
	requests, handshakes, handshakeFails, malformed, unknown, duplicate, expired atomic.Int64
	failedXfers, failedNotifs, regTimeouts, malformedControl, heartbeats         atomic.Int64
	heartbeatsSent, aborted, staleControl                                        atomic.Int64
	sglHeartbeats, sglHeartbeatFails, sglPrefillsLost, sglRoomsFailed            atomic.Int64
	allocWaits                                                                   atomic.Int64
	// inFlight counts prefill and load calls still running: a driver that
	// stopped a run waits for them before it counts blocks still held.
	inFlight atomic.Int64
}

// rank is one (pp, tp) rank: its own agent and pool. idx is its place in
// Engine.ranks (stage-major), which per-rank state is indexed by; tp and pp
// are what it is to a peer.
type rank struct {
	idx   int
	tp    int
	pp    int
	name  string
	agent nixl.Agent
	// waits waits for the rank's posted transfers from one goroutine
	// (decode's READs, SGLang prefill's WRITEs; push's owner goroutine
	// polls its own).
	waits *nixl.Poller
	pool  *Pool
	buf   *nixl.Buffer
}

// Engine is a prefill or decode endpoint: TP ranks, a shared block
// allocator, a side channel, and the protocol state.
type Engine struct {
	cfg   Config
	spec  kv.Spec
	hash  string
	log   *slog.Logger
	emit  func(event string, data any)
	ranks []*rank
	alloc *BlockAllocator
	side  *sidechannel.HandshakeServer
	c     counters
	clock Clock

	remotesMu sync.Mutex
	remotes   map[string]*remoteEngine
	prep      *preppedCache
	harness   *harnessCPU // tag fill and check at idle priority; nil with VRAM pools

	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup

	// role is what the engine is; pre, dec and sgl are the states it
	// drives (pre or dec by Config.Role, sgl with SGLang).
	role role
	pre  *prefillState
	dec  *decodeState
	sgl  *sglState
	info map[string]string
}

// NewEngine allocates and registers the pools, starts the side channel
// and the per-rank notification loops.
func NewEngine(ctx context.Context, cfg Config, log *slog.Logger, emit func(string, any)) (*Engine, error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if emit == nil {
		emit = func(string, any) {}
	}
	spec, err := cfg.normalize()
	if err != nil {
		return nil, err
	}
	hash, err := cfg.CompatHash()
	if err != nil {
		return nil, err
	}
	e := &Engine{cfg: cfg, spec: spec, hash: hash, log: log.With("engine", cfg.EngineID), emit: emit,
		alloc: NewBlockAllocator(cfg.NumBlocks, cfg.Scattered, cfg.Seed), remotes: map[string]*remoteEngine{}, prep: newPreppedCache(), info: map[string]string{}}
	if cfg.Mem != nixl.VRAM {
		e.harness = newHarnessCPU(spec.TP*spec.PP, e.log)
	}
	e.clock = cfg.Clock
	if e.clock == nil {
		e.clock = monoClock{}
	}
	e.ctx, e.cancel = context.WithCancel(ctx)
	ok := false
	defer func() {
		if !ok {
			e.Close()
		}
	}()
	if err := CheckPP(cfg.Protocol, spec.PP); err != nil {
		return nil, fmt.Errorf("pp %d: %w", spec.PP, err)
	}
	for i := 0; i < spec.TP*spec.PP; i++ {
		if err := e.openRank(i); err != nil {
			return nil, err
		}
	}
	if e.side, err = sidechannel.ServeHandshake(e.ctx, cfg.SideChannel, hash, log); err != nil {
		return nil, err
	}
	if err := e.publishMetadata(); err != nil {
		return nil, err
	}
	switch cfg.Role {
	case RolePrefill:
		e.pre = newPrefillState(e)
	case RoleDecode:
		e.dec = newDecodeState(e)
	}
	if cfg.Protocol == ProtoSGLang {
		if e.sgl, err = newSGLState(e); err != nil {
			return nil, err
		}
	}
	e.role = newRole(e)
	for _, rk := range e.ranks {
		e.wg.Add(1)
		go e.notifLoop(rk)
	}
	e.role.start()
	ok = true
	return e, nil
}

// normalize checks what protects an engine from a malformed setup call
// and fills the defaults, and returns the normalized KV layout.
func (c *Config) normalize() (kv.Spec, error) {
	if c.Protocol == ProtoSGLang {
		c.Order = kv.NHD // SGLang's per-layer buffers are token-major
	}
	spec, err := c.Spec().Normalize()
	if err != nil {
		return kv.Spec{}, err
	}
	// Only what protects the engine from a malformed setup call: the
	// driver's options (handoff.HandoffOptions.Validate) check everything a
	// user can get wrong, and their defaults are the only ones.
	if !c.Role.Valid() {
		return kv.Spec{}, fmt.Errorf("role %q: want prefill or decode", c.Role)
	}
	if !Protocol(c.Protocol).Valid() {
		return kv.Spec{}, fmt.Errorf("protocol %q: want pull, push or sglang", c.Protocol)
	}
	if c.NumBlocks <= 0 {
		return kv.Spec{}, fmt.Errorf("num_blocks must be > 0")
	}
	if c.Protocol == ProtoPush && c.RegTimeout == 0 {
		c.RegTimeout = runcore.Duration(DefaultRegTimeout)
	}
	if c.Protocol == ProtoPush && c.RegTimeout <= 0 {
		return kv.Spec{}, fmt.Errorf("reg_timeout must be > 0 for %s", c.Protocol)
	}
	if c.Protocol == ProtoSGLang {
		if err := c.sglDefaults(); err != nil {
			return kv.Spec{}, err
		}
	}
	if c.RegWatchdog == "" {
		c.RegWatchdog = WatchdogDrop
	}
	if !c.RegWatchdog.Valid() {
		return kv.Spec{}, fmt.Errorf("reg_watchdog %q: want %s", c.RegWatchdog, enum.Names(WatchdogActions))
	}
	if c.PushHeartbeatKeys == "" {
		c.PushHeartbeatKeys = HBKeysUpstream
	}
	if !c.PushHeartbeatKeys.Valid() {
		return kv.Spec{}, fmt.Errorf("push_heartbeat_keys %q: want %s", c.PushHeartbeatKeys, enum.Names(HeartbeatKeyings))
	}
	if c.EngineID == "" {
		c.EngineID = string(c.Role) + "-" + randHex(4)
	}
	if c.SideChannel == "" {
		c.SideChannel = "tcp://127.0.0.1:0"
	}
	if c.Advertise, err = advertisedHost(c.SideChannel, c.Advertise); err != nil {
		return kv.Spec{}, err
	}
	if c.NetDevices != "" {
		// UCX reads it when the process's one context is created, below,
		// and never again. It stays set afterwards: that context keeps the
		// pin for every later session, and the endpoint's net-path reading
		// reports UCX_NET_DEVICES from the environment.
		if err := os.Setenv("UCX_NET_DEVICES", c.NetDevices); err != nil {
			return kv.Spec{}, fmt.Errorf("net_devices: %w", err)
		}
	}
	if c.Step <= 0 {
		c.Step = 10 * time.Millisecond
	}
	if c.DecodeSlots < 0 || c.DecodeHold < 0 {
		return kv.Spec{}, fmt.Errorf("decode_slots and decode_hold must be >= 0")
	}
	lc, err := c.LeaseConfig().Normalize()
	if err != nil {
		return kv.Spec{}, err
	}
	c.LeasePolicy, c.Lease, c.FixedTimeout, c.Reaper = lc.Policy, runcore.Duration(lc.Duration), lc.Timeout, lc.Reaper
	return spec, nil
}

// openRank opens rank i's agent and poller, allocates, registers and lays
// out its pool.
func (e *Engine) openRank(i int) error {
	rk := &rank{idx: i, tp: i % e.spec.TP, pp: i / e.spec.TP}
	rk.name = fmt.Sprintf("tp%d", rk.tp)
	if e.spec.PP > 1 {
		rk.name = fmt.Sprintf("pp%d.tp%d", rk.pp, rk.tp)
	}
	e.ranks = append(e.ranks, rk)
	a, err := nixl.Open(e.cfg.Backend, nixl.Config{Name: rankName(e.cfg.EngineID, e.spec.PP, rk.pp, rk.tp)})
	if err != nil {
		return err
	}
	if e.cfg.Faults != nil {
		a = nixl.WithFaults(a, *e.cfg.Faults)
	}
	rk.agent = a
	rk.waits = nixl.NewPoller(a)
	if pinned := a.Info().Details[nixl.DetailNetDevices]; e.cfg.NetDevices != "" && pinned != e.cfg.NetDevices {
		// One UCP context per process, made by its first agent: a
		// served endpoint's later session cannot change its devices.
		return fmt.Errorf("net_devices %q: this endpoint's transport started with UCX_NET_DEVICES=%q and cannot change it; restart the endpoint (or set UCX_NET_DEVICES in its environment)", e.cfg.NetDevices, pinned)
	}
	size := PoolBytes(e.spec, rk.tp, rk.pp, e.cfg.NumBlocks)
	if rk.buf, err = cuda.AllocSeg(a, e.cfg.Mem, e.cfg.Device, int(size), string(e.cfg.DRAMAlloc), false); err != nil {
		return fmt.Errorf("rank %s pool of %d bytes: %w", rk, size, err)
	}
	if err := a.RegisterMem(rk.buf); err != nil {
		return err
	}
	if rk.pool, err = NewPool(e.spec, rk.tp, rk.pp, e.cfg.NumBlocks, rk.buf); err != nil {
		return err
	}
	return nil
}

// publishMetadata puts every rank's agent metadata (vLLM's
// NixlAgentMetadata) on the side channel.
func (e *Engine) publishMetadata() error {
	for _, rk := range e.ranks {
		md, err := rk.agent.LocalMD()
		if err != nil {
			return err
		}
		am := sidechannel.AgentMetadata{EngineID: e.cfg.EngineID, AgentMetadata: md, NumBlocks: e.cfg.NumBlocks,
			KVCacheLayout: string(e.spec.Order), BlockSize: e.spec.BlockSize, AttnBackendName: e.cfg.AttnBackendName(e.spec),
			PhysicalBlocksPerLogical: 1, DCPSize: 1, PCPSize: 1,
			Nixlctl: &sidechannel.Extra{Backend: rk.agent.Info().Backend, TPRank: rk.tp, TPSize: e.spec.TP, PPRank: rk.pp, PPSize: e.spec.PP}}
		for i, reg := range rk.pool.Rank.Regions {
			am.KVCachesBaseAddr = append(am.KVCachesBaseAddr, rk.pool.RegionBase(i))
			am.BlockLens = append(am.BlockLens, reg.BlockBytes)
			am.BlockStrides = append(am.BlockStrides, reg.BlockBytes)
			am.RegionNames = append(am.RegionNames, fmt.Sprintf("layer%d.%s", reg.Layer, reg.Part))
			am.RegionMemTypes = append(am.RegionMemTypes, rk.buf.Mem.String())
			am.DeviceID = int(rk.buf.Dev)
		}
		if err := e.side.Set(rk.pp, rk.tp, am); err != nil {
			return err
		}
	}
	return nil
}

// SetupReply tells the driver where the engine is and what it runs on.
type SetupReply struct {
	EngineID    string            `json:"engine_id"`
	SideChannel string            `json:"side_channel"`
	Bootstrap   string            `json:"bootstrap,omitempty"`
	TP          int               `json:"tp"`
	PP          int               `json:"pp,omitempty"`
	PoolBytes   int64             `json:"pool_bytes"`
	NumBlocks   int               `json:"num_blocks"`
	Backend     string            `json:"backend"`
	Version     string            `json:"backend_version"`
	Alloc       string            `json:"alloc"`
	CompatHash  string            `json:"compat_hash"`
	PID         int               `json:"pid"`
	MemcpyGBps  float64           `json:"memcpy_gbps"`
	Info        map[string]string `json:"info,omitempty"`
}

// Setup describes the running engine.
func (e *Engine) Setup() SetupReply {
	rep := SetupReply{EngineID: e.cfg.EngineID, SideChannel: e.advertisedEndpoint(e.side.Endpoint()), TP: e.spec.TP, PP: e.spec.PP, NumBlocks: e.cfg.NumBlocks,
		CompatHash: e.hash, PID: int(nixl.Self().PID)}
	e.role.setup(&rep)
	for _, rk := range e.ranks {
		rep.PoolBytes += int64(rk.buf.Len)
		rep.Alloc = rk.buf.Alloc
		info := rk.agent.Info()
		rep.Backend, rep.Version = info.Backend, info.Version
	}
	rep.MemcpyGBps = referenceGBps(e.ranks[0].buf)
	return rep
}

// Info returns what each rank's agent says about its peers (transports).
func (e *Engine) Info() map[string]string {
	out := map[string]string{}
	for _, rk := range e.ranks {
		for k, v := range rk.agent.Info().Details {
			out[fmt.Sprintf("%s %s", rk, k)] = v
		}
	}
	return out
}

// Stats snapshots the counters.
func (e *Engine) Stats() Stats {
	st := Stats{Requests: e.c.requests.Load(), InFlight: e.c.inFlight.Load(), Handshakes: e.c.handshakes.Load(), HandshakeFails: e.c.handshakeFails.Load(),
		MalformedNotifs: e.c.malformed.Load(), UnknownNotifs: e.c.unknown.Load(), DuplicateNotifs: e.c.duplicate.Load(),
		ExpiredLeases: e.c.expired.Load(), FailedTransfers: e.c.failedXfers.Load(), FailedNotifs: e.c.failedNotifs.Load(),
		RegTimeouts: e.c.regTimeouts.Load(), MalformedControl: e.c.malformedControl.Load(), Heartbeats: e.c.heartbeats.Load(),
		BlocksInUse: int64(e.alloc.InUse()), BlocksTotal: int64(e.alloc.Total()),
		HeartbeatsSent: e.c.heartbeatsSent.Load(), Aborted: e.c.aborted.Load(), StaleControl: e.c.staleControl.Load(),
		SGLHeartbeats: e.c.sglHeartbeats.Load(), SGLHeartbeatFailures: e.c.sglHeartbeatFails.Load(),
		SGLPrefillsLost: e.c.sglPrefillsLost.Load(), SGLRoomsFailed: e.c.sglRoomsFailed.Load(), TagWork: e.tagWork(),
		AllocWaits: e.c.allocWaits.Load()}
	if e.side != nil {
		// A handshake request the side channel could not answer (malformed,
		// or for a rank this engine lacks, where vLLM's listener would
		// raise) is a misbehaving peer's message too.
		n, _ := e.side.Errors()
		st.MalformedControl += int64(n)
		st.HandshakesServed, st.UnknownRankHandshakes = e.side.Served(), e.side.UnknownRanks()
	}
	for _, rk := range e.ranks {
		if fa, ok := rk.agent.(*nixl.FaultyAgent); ok {
			st.HeartbeatsLost += int64(fa.Stats().DroppedSends)
		}
	}
	e.role.stats(&st)
	return st
}

// Close stops everything and releases the pools.
func (e *Engine) Close() {
	e.cancel()
	e.wg.Wait()
	e.harness.close()
	if e.side != nil {
		e.side.Wait()
	}
	if e.role != nil {
		e.role.close()
	}
	e.prep.close()
	for _, rk := range e.ranks {
		if rk.waits != nil {
			rk.waits.Close()
		}
		if rk.agent != nil {
			rk.agent.Close()
		}
		if rk.buf != nil {
			rk.buf.Free()
		}
	}
	if e.role != nil {
		e.role.closeAfterAgents()
	}
}

// notifLoop owns one rank's incoming notifications and hands them to
// the role (PUSH_REG registrations, HB heartbeats, SGLang room tags,
// "<request id>:<count>" completions); it is also the rank's owner for
// the role's per-rank work (push: the one goroutine that posts WRITEs).
func (e *Engine) notifLoop(rk *rank) {
	defer e.wg.Done()
	poll := time.NewTimer(time.Hour)
	defer poll.Stop()
	for {
		var tick <-chan time.Time
		if e.role.pending(rk.idx) {
			// WRITEs in flight: look again in a millisecond even if no
			// notification wakes us (vLLM's writer does the same).
			poll.Reset(time.Millisecond)
			tick = poll.C
		}
		select {
		case <-e.ctx.Done():
			return
		case <-rk.agent.NotifReady():
		case <-tick:
		case <-e.role.wake(rk.idx):
		}
		notifs, err := rk.agent.GetNotifs()
		if err != nil {
			if e.ctx.Err() == nil {
				e.log.Warn("reading notifications", "rank", rk.idx, "err", err)
			}
			continue
		}
		for from, msgs := range notifs {
			for _, m := range msgs {
				e.role.onNotif(rk, from, m)
			}
		}
		e.role.afterNotifs(rk)
	}
}

// completion parses a "<request id>:<count>" notification, counting and
// logging one that is not.
func (e *Engine) completion(from, s string) (string, int, bool) {
	id, n, ok := parseCompletion(s)
	if !ok {
		e.badNotif("malformed notification", from, s)
	}
	return id, n, ok
}

func (e *Engine) badNotif(what, from, msg string) {
	e.c.malformed.Add(1)
	if len(msg) > 80 {
		msg = msg[:80] + "..."
	}
	e.log.Warn(what, "from", from, "msg", msg)
}

// completionNotif is the completion notification vLLM attaches to a READ
// (pull: prefill's request id and the consumers it expects) or a WRITE
// (push: decode's request id and prefill's TP size): f"{id}:{n}".encode().
func completionNotif(id string, n int) []byte { return []byte(id + ":" + strconv.Itoa(n)) }

// parseCompletion splits "<request id>:<count>" at the last colon (request
// ids may contain colons), as vLLM does.
func parseCompletion(s string) (string, int, bool) {
	i := strings.LastIndexByte(s, ':')
	if i <= 0 {
		return "", 0, false
	}
	var n int
	if _, err := fmt.Sscanf(s[i+1:], "%d", &n); err != nil || fmt.Sprint(n) != s[i+1:] || n <= 0 || n > 1<<16 {
		return "", 0, false
	}
	return s[:i], n, true
}

// remoteEngine is what an engine learned about a peer engine by handshake:
// its agents keyed by (pp, tp), as vLLM's _remote_agents[engine_id] is.
type remoteEngine struct {
	id       string
	endpoint string
	once     sync.Once
	err      error
	ranks    map[rkey]sidechannel.AgentMetadata
	loaded   map[lpair]string // (local rank idx, remote rank) -> agent name
	doneAt   int64            // mono time the first handshake ended
	mu       sync.Mutex
}

// rkey is a remote rank: its pipeline stage and TP rank.
type rkey struct{ pp, tp int }

// lpair is a local rank (by idx) talking to a remote rank.
type lpair struct {
	local  int
	remote rkey
}

// ErrHandshake wraps handshake failures.
var ErrHandshake = errors.New("handshake failed")

// handshake is handshakeRanks for stage 0 of a peer: what the protocols
// whose peers have no pipeline stages (push prefill, SGLang) ask for.
func (e *Engine) handshake(ctx context.Context, engineID, endpoint string, remoteRanks []int, pairs [][2]int) (time.Duration, *remoteEngine, error) {
	ranks := make([]rkey, len(remoteRanks))
	for i, r := range remoteRanks {
		ranks[i] = rkey{0, r}
	}
	lp := make([]lpair, len(pairs))
	for i, pr := range pairs {
		lp[i] = lpair{pr[0], rkey{0, pr[1]}}
	}
	return e.handshakeRanks(ctx, engineID, endpoint, ranks, lp)
}

// handshakeRanks fetches the metadata of the given remote (pp, tp) ranks
// from an engine's side channel once, in the given order on one REQ
// socket, and loads it into the local ranks that talk to them. It reports
// how long the caller waited for the first fetch (0 when it had ended
// before the caller came).
func (e *Engine) handshakeRanks(ctx context.Context, engineID, endpoint string, remoteRanks []rkey, pairs []lpair) (time.Duration, *remoteEngine, error) {
	e.remotesMu.Lock()
	re := e.remotes[engineID]
	if re == nil || re.endpoint != endpoint {
		if re != nil {
			e.dropPrepped(re) // the peer moved: its agents' lists go with it
		}
		re = &remoteEngine{id: engineID, endpoint: endpoint, ranks: map[rkey]sidechannel.AgentMetadata{}, loaded: map[lpair]string{}}
		e.remotes[engineID] = re
	}
	e.remotesMu.Unlock()
	var took time.Duration
	arrived := mono.Now()
	re.once.Do(func() {
		re.err = re.fetch(ctx, e, remoteRanks)
		re.doneAt = mono.Now()
		if re.err != nil {
			e.c.handshakeFails.Add(1)
		} else {
			e.c.handshakes.Add(1)
		}
	})
	if re.err != nil {
		// Forget the failure so a later request can try again (a restarted peer).
		e.remotesMu.Lock()
		if e.remotes[engineID] == re {
			delete(e.remotes, engineID)
		}
		e.remotesMu.Unlock()
		return 0, nil, re.err
	}
	// A request that arrived before the first handshake with this engine
	// ended waited for it, whoever ran it: itself, a concurrent request,
	// or decode's proactive heartbeat handshake, which on a busy host can
	// start between a request's arrival and its own handshake (the run
	// then reported no first handshake at all).
	if arrived < re.doneAt {
		took = time.Duration(re.doneAt - arrived)
	}
	// Load metadata into the local ranks that need it (also for ranks
	// fetched by an earlier handshake with other pairs).
	re.mu.Lock()
	defer re.mu.Unlock()
	var missing []rkey
	for _, pr := range pairs {
		if _, ok := re.ranks[pr.remote]; !ok && !slices.Contains(missing, pr.remote) {
			missing = append(missing, pr.remote)
		}
	}
	if len(missing) > 0 {
		if err := re.fetchLocked(ctx, e, missing); err != nil {
			return 0, nil, err
		}
	}
	for _, pr := range pairs {
		if _, ok := re.loaded[pr]; ok {
			continue
		}
		name, err := e.ranks[pr.local].agent.LoadRemoteMD(re.ranks[pr.remote].AgentMetadata)
		if err != nil {
			return 0, nil, fmt.Errorf("%w: loading %s rank pp %d tp %d: %v", ErrHandshake, engineID, pr.remote.pp, pr.remote.tp, err)
		}
		re.loaded[pr] = name
	}
	return took, re, nil
}

func (re *remoteEngine) fetch(ctx context.Context, e *Engine, ranks []rkey) error {
	re.mu.Lock()
	defer re.mu.Unlock()
	return re.fetchLocked(ctx, e, ranks)
}

// fetchLocked handshakes ranks on one socket and checks each answered as
// the engine the request named (vLLM: engine_id must match).
func (re *remoteEngine) fetchLocked(ctx context.Context, e *Engine, ranks []rkey) error {
	want := make([][2]int, len(ranks))
	for i, r := range ranks {
		want[i] = [2]int{r.pp, r.tp}
	}
	hs, err := sidechannel.FetchRanks(ctx, re.endpoint, want, e.wantHash(), sidechannel.HandshakeTimeout)
	if err != nil {
		return fmt.Errorf("%w with %s: %v", ErrHandshake, re.id, err)
	}
	for i, h := range hs {
		if h.Meta.EngineID != re.id {
			return fmt.Errorf("%w: %s answered as engine %q", ErrHandshake, re.endpoint, h.Meta.EngineID)
		}
		re.ranks[ranks[i]] = h.Meta
	}
	return nil
}

// stageRanks is the given TP ranks of one stage.
func stageRanks(pp int, tps []int) []rkey {
	out := make([]rkey, len(tps))
	for i, t := range tps {
		out[i] = rkey{pp, t}
	}
	return out
}

// shakenRanks returns the remote engine when an earlier handshake already
// loaded every pair (nil: a handshake is needed), without any I/O.
func (e *Engine) shakenRanks(engineID, endpoint string, pairs []lpair) *remoteEngine {
	e.remotesMu.Lock()
	re := e.remotes[engineID]
	e.remotesMu.Unlock()
	if re == nil || re.endpoint != endpoint {
		return nil
	}
	re.mu.Lock()
	defer re.mu.Unlock()
	for _, pr := range pairs {
		if _, ok := re.loaded[pr]; !ok {
			return nil
		}
	}
	return re
}

// agentName is the loaded name of a stage-0 remote rank for a local rank.
func (re *remoteEngine) agentName(local, remote int) string {
	return re.stageAgent(local, rkey{0, remote})
}

// stageAgent is the loaded name of a remote (pp, tp) rank for a local rank.
func (re *remoteEngine) stageAgent(local int, remote rkey) string {
	re.mu.Lock()
	defer re.mu.Unlock()
	return re.loaded[lpair{local, remote}]
}

func (re *remoteEngine) stageMeta(remote rkey) sidechannel.AgentMetadata {
	re.mu.Lock()
	defer re.mu.Unlock()
	return re.ranks[remote]
}

func randHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// DefaultRegTimeout is upstream's push_registration_timeout: vLLM
// defaults it to decoder_kv_blocks_ttl, 480 s.
const DefaultRegTimeout = 480 * time.Second

// referenceGBps is the copy bandwidth of the pool's own memory: memcpy in
// this process for DRAM, a device-to-device copy on the same GPU for VRAM.
func referenceGBps(b *nixl.Buffer) float64 {
	if b.Mem != nixl.VRAM {
		return memcpyGBps(b.Bytes())
	}
	n := min(b.Len/2, 64<<20)
	if n <= 0 {
		return 0
	}
	src := nixl.NewBuffer(b.Addr, n, nixl.VRAM, b.Dev, b.Alloc, nil, nil)
	dst := nixl.NewBuffer(b.Addr+uint64(n), n, nixl.VRAM, b.Dev, b.Alloc, nil, nil)
	gbps, err := cuda.D2DBandwidth(src, dst, []nixl.Span{{Len: n}}, 100*time.Millisecond)
	if err != nil {
		return 0
	}
	return gbps
}

// memcpyGBps measures this process's memcpy bandwidth on (part of) a pool
// buffer: the same-run reference efficiency is judged against.
func memcpyGBps(b []byte) float64 {
	if len(b) < 2<<20 {
		return 0
	}
	n := min(len(b)/2, 64<<20)
	src, dst := b[:n], b[n:2*n]
	copy(dst, src)
	var copied int64
	t0 := time.Now()
	for time.Since(t0) < 100*time.Millisecond {
		copied += int64(copy(dst, src))
	}
	return float64(copied) / 1e9 / time.Since(t0).Seconds()
}

// wantHash is the hash a peer's handshake must carry: this engine's, or
// none (sidechannel.AnyHash) with NoCompatCheck.
func (e *Engine) wantHash() string {
	if e.cfg.NoCompatCheck {
		return sidechannel.AnyHash
	}
	return e.hash
}

// advertisedHost is the host an engine bound at sideChannel names in its
// messages: advertise when given, else the bound host, which must then be
// one a peer can dial.
func advertisedHost(sideChannel, advertise string) (string, error) {
	host, _, err := splitEndpoint(sideChannel)
	if err != nil {
		return "", fmt.Errorf("side_channel %q: %w", sideChannel, err)
	}
	if advertise != "" {
		return advertise, nil
	}
	if Unroutable(host) {
		return "", NoAdvertise("side channel " + sideChannel)
	}
	return host, nil
}

// Unroutable says whether host, where a side channel binds, is one no
// peer can dial: every address (0.0.0.0, ::, or none given).
func Unroutable(host string) bool {
	ip := net.ParseIP(host)
	return host == "" || ip != nil && ip.IsUnspecified()
}

// NoAdvertise is the one refusal of a side channel bound at an Unroutable
// host with nothing to advertise instead (the engine's, serve --listen's
// and the stand-in's); bound names the side channel as the caller knows
// it (a flag and its value).
func NoAdvertise(bound string) error {
	return fmt.Errorf("%s binds every address: give --advertise HOST, the address the peers reach this host by", bound)
}

// advertisedEndpoint is a bound endpoint (tcp://HOST:PORT or HOST:PORT)
// with its host replaced by the advertised one.
func (e *Engine) advertisedEndpoint(bound string) string {
	_, port, err := splitEndpoint(bound)
	if err != nil {
		return bound
	}
	return "tcp://" + net.JoinHostPort(e.cfg.Advertise, strconv.Itoa(port))
}

// advertised is advertisedEndpoint as host and port.
func (e *Engine) advertised(bound string) (string, int) {
	_, port, _ := splitEndpoint(bound)
	return e.cfg.Advertise, port
}

// String names a rank in logs and info keys: tpN, or ppM.tpN when the
// engine has pipeline stages.
func (rk *rank) String() string { return rk.name }

func rankName(engineID string, stages, pp, tp int) string {
	if stages > 1 {
		return fmt.Sprintf("%s-pp%d-tp%d", engineID, pp, tp)
	}
	return fmt.Sprintf("%s-tp%d", engineID, tp)
}

// CheckPP refuses pipeline stages where nixlctl has none: its SGLang
// engines. (vLLM's push connector rejects a pipeline-parallel decode;
// nixlctl runs push with equal pp on both sides, each prefill stage
// writing its layers into the same decode stage.) It is the one
// refusal: the engine, the bench's options and the CLI all call it, and
// each puts its own name for pp (a field, a flag) and the value before it.
func CheckPP(p Protocol, pp int) error {
	if pp > 1 && p == ProtoSGLang {
		return errors.New("nixlctl's SGLang engines have no pipeline stages (pp > 1 is for pull and push)")
	}
	return nil
}
