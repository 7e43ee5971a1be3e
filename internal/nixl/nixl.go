package nixl

import (
	"errors"
	"fmt"
	"sort"
	"strings"
	"sync"
	"time"
)

// MemType is the kind of memory a descriptor points to.
type MemType uint8

// Memory types.
const (
	DRAM MemType = iota
	VRAM
)

func (m MemType) String() string {
	switch m {
	case DRAM:
		return "DRAM"
	case VRAM:
		return "VRAM"
	}
	return fmt.Sprintf("MemType(%d)", uint8(m))
}

// ParseMemType accepts DRAM and VRAM (any case).
func ParseMemType(s string) (MemType, error) {
	switch strings.ToUpper(strings.TrimSpace(s)) {
	case "DRAM", "CPU", "HOST":
		return DRAM, nil
	case "VRAM", "GPU", "CUDA":
		return VRAM, nil
	}
	return 0, fmt.Errorf("unknown memory type %q (want DRAM or VRAM)", s)
}

// Op is a transfer direction, seen from the initiator.
type Op uint8

// Operations: READ pulls remote memory into local memory, WRITE pushes
// local memory into remote memory.
const (
	Read Op = iota
	Write
)

func (o Op) String() string {
	if o == Write {
		return "WRITE"
	}
	return "READ"
}

// ParseOp accepts READ and WRITE (any case).
func ParseOp(s string) (Op, error) {
	switch strings.ToUpper(strings.TrimSpace(s)) {
	case "READ":
		return Read, nil
	case "WRITE":
		return Write, nil
	}
	return 0, fmt.Errorf("unknown op %q (want READ or WRITE)", s)
}

// Status is the state of a transfer request.
type Status uint8

// Request states.
const (
	InProgress Status = iota
	Done
	Failed
)

func (s Status) String() string {
	switch s {
	case InProgress:
		return "IN_PROGRESS"
	case Done:
		return "DONE"
	}
	return "ERROR"
}

// Desc is one contiguous piece of memory: (address, length, device).
type Desc struct {
	Addr uint64
	Len  uint64
	Dev  uint32
}

// Telemetry is what an agent measured for one posting of a request, as
// NIXL's per-request telemetry does.
type Telemetry struct {
	// Start is when the post began, as CLOCK_MONOTONIC nanoseconds (the
	// clock every process on a host shares; see internal/mono), 0 if the
	// backend cannot say.
	Start        int64
	PostDuration time.Duration // inside PostXferReq
	XferDuration time.Duration // end of post to completion
	Bytes        int64
	Descs        int
}

// Done is when the request completed on the agent's clock (0 if unknown).
func (t Telemetry) Done() int64 {
	if t.Start == 0 {
		return 0
	}
	return t.Start + int64(t.PostDuration+t.XferDuration)
}

// Total is post plus transfer time.
func (t Telemetry) Total() time.Duration { return t.PostDuration + t.XferDuration }

// XferReq is a prepared transfer request; it may be posted again once it
// completed.
type XferReq interface {
	// Op, Bytes and Descs describe the request.
	Op() Op
	Bytes() int64
	Descs() int
	Remote() string
}

// XferInfo is what a request says about itself, XferReq's methods, the
// same in every backend: a backend's request embeds it.
type XferInfo struct {
	op     Op
	bytes  int64
	descs  int
	remote string
}

// NewXferInfo describes a request: op, moving bytes in descs descriptors
// (or operations) to or from the agent called remote.
func NewXferInfo(op Op, bytes int64, descs int, remote string) XferInfo {
	return XferInfo{op: op, bytes: bytes, descs: descs, remote: remote}
}

// Op is the request's direction.
func (x XferInfo) Op() Op { return x.op }

// Bytes is how many bytes one posting moves.
func (x XferInfo) Bytes() int64 { return x.bytes }

// Descs is how many descriptors (or operations) it moves them in.
func (x XferInfo) Descs() int { return x.descs }

// Remote is the peer's name.
func (x XferInfo) Remote() string { return x.remote }

// Dlist is a prepared descriptor list, local or for one remote agent.
type Dlist interface {
	Len() int
	Remote() string // "" for a local list
}

// Notifs are received notifications grouped by sender agent name, in
// arrival order per sender.
type Notifs map[string][][]byte

// Info describes an agent for results: what really moves the bytes.
type Info struct {
	Backend string            `json:"backend"`
	Version string            `json:"version,omitempty"`
	Details map[string]string `json:"details,omitempty"`
}

// Agent is one transfer endpoint (one per TP rank in an engine).
type Agent interface {
	Name() string
	Info() Info

	// RegisterMem registers a buffer for transfers; DeregisterMem undoes
	// it. Descriptors must lie inside registered buffers.
	RegisterMem(b *Buffer) error
	DeregisterMem(b *Buffer) error

	// LocalMD is this agent's metadata for peers; LoadRemoteMD loads a
	// peer's and returns its name; InvalidateRemoteMD forgets it.
	LocalMD() ([]byte, error)
	LoadRemoteMD(md []byte) (string, error)
	InvalidateRemoteMD(name string) error

	// PrepXferDlist prepares descriptors of local memory (remote == "")
	// or of a loaded remote agent's memory.
	PrepXferDlist(remote string, mem MemType, descs []Desc) (Dlist, error)
	ReleaseDlist(d Dlist) error
	// MakeXferReq builds a request from prepared lists by index, the path
	// vLLM uses for paged KV; localIdx[i] moves to/from remoteIdx[i].
	MakeXferReq(op Op, local Dlist, localIdx []int, remote Dlist, remoteIdx []int, notif []byte) (XferReq, error)
	// CreateXferReq builds a request from plain descriptor lists.
	CreateXferReq(op Op, mem MemType, local []Desc, remoteMem MemType, remote []Desc, remoteName string, notif []byte) (XferReq, error)
	PostXferReq(r XferReq) (Status, error)
	XferStatus(r XferReq) (Status, error)
	ReleaseXferReq(r XferReq) error
	Telemetry(r XferReq) Telemetry

	SendNotif(remote string, msg []byte) error
	GetNotifs() (Notifs, error)
	// NotifReady is signalled (level, coalesced) when notifications may be
	// waiting, so consumers need not poll.
	NotifReady() <-chan struct{}

	Close() error
}

// Allocator is implemented by backends that can allocate memory that
// their own transports move best (UCX's ucp_mem_map with ALLOCATE).
type Allocator interface {
	AllocMem(size int, mem MemType) (*Buffer, error)
}

// Errors callers can test for.
var (
	ErrUnknownAgent   = errors.New("unknown remote agent")
	ErrNotRegistered  = errors.New("descriptor outside any registered region")
	ErrInFlight       = errors.New("request still in progress")
	ErrClosed         = errors.New("agent closed")
	ErrBadMetadata    = errors.New("corrupt or truncated agent metadata")
	ErrUnavailable    = errors.New("backend unavailable")
	ErrLengthMismatch = errors.New("local and remote descriptor lengths differ")
	ErrPeerFailed     = errors.New("remote agent failed")
	// ErrMemType: the backend cannot move this kind of memory (DRAM on a
	// GPU-only backend, VRAM on a UCX without CUDA transports).
	ErrMemType = errors.New("memory type not supported by this backend")
)

// Config are the options of a new agent.
type Config struct {
	Name string
	// Progress says who moves the agent's transfers along. Backends that
	// cannot change it ignore it; Info's "progress" says what runs.
	Progress Progress
}

// Progress is how an agent's transfers are moved along: by the backend in
// the background, or by whoever polls the agent.
type Progress int

const (
	// ProgressBackground: the backend progresses by itself (NIXL's progress
	// thread), so transfers move whether anyone polls or not. The default:
	// engines and anything with several agents in one process need it.
	ProgressBackground Progress = iota
	// ProgressCaller: the caller polls XferStatus without pause while its
	// requests run (a benchmark's initiator, as nixlbench's). No background
	// thread wakes on each event and contends for the worker; between polls
	// the agent is progressed only as often as it looks for notifications
	// (every 50 µs to 5 ms), so a peer that needs it to answer waits.
	ProgressCaller
	// ProgressSpin: the agent progresses itself without pause, looking for
	// notifications all the time (a passive target, as nixlbench's target
	// spins on getNotifs). Lowest latency, at the price of a core.
	ProgressSpin
)

// ParseProgress reads what String writes ("" is ProgressBackground).
func ParseProgress(s string) (Progress, error) {
	for _, p := range []Progress{ProgressBackground, ProgressCaller, ProgressSpin} {
		if s == p.String() {
			return p, nil
		}
	}
	if s == "" {
		return ProgressBackground, nil
	}
	return 0, fmt.Errorf("unknown progress %q (want background, caller or spin)", s)
}

// String names a Progress.
func (p Progress) String() string {
	switch p {
	case ProgressBackground:
		return "background"
	case ProgressCaller:
		return "caller"
	case ProgressSpin:
		return "spin"
	}
	return fmt.Sprintf("Progress(%d)", int(p))
}

// Backend describes a registered backend.
type Backend struct {
	Name string
	// New creates an agent.
	New func(cfg Config) (Agent, error)
	// Available reports whether the backend can run here, and why not.
	Available func() (bool, string)
	// Version of the library behind it, when available.
	Version func() string
}

var (
	backendsMu sync.Mutex
	backends   = map[string]Backend{}
)

// Register makes a backend openable by name; backends call it from init.
func Register(b Backend) {
	backendsMu.Lock()
	defer backendsMu.Unlock()
	backends[b.Name] = b
}

// Backends lists the registered backend names, sorted.
func Backends() []string {
	backendsMu.Lock()
	defer backendsMu.Unlock()
	var names []string
	for n := range backends {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

// Lookup returns a registered backend.
func Lookup(name string) (Backend, bool) {
	backendsMu.Lock()
	defer backendsMu.Unlock()
	b, ok := backends[name]
	return b, ok
}

// Resolve turns "auto" into nixl when NIXL is usable and ucx otherwise,
// and checks that the named backend can run here.
func Resolve(name string) (Backend, error) {
	if name == "" || name == "auto" {
		if b, ok := Lookup("nixl"); ok {
			if ok, _ := b.Available(); ok {
				return b, nil
			}
		}
		name = "ucx"
	}
	b, ok := Lookup(name)
	if !ok {
		return Backend{}, fmt.Errorf("unknown backend %q (available: %s)", name, strings.Join(Backends(), ", "))
	}
	if ok, why := b.Available(); !ok {
		return Backend{}, fmt.Errorf("%w: %s: %s", ErrUnavailable, name, why)
	}
	return b, nil
}

// Open resolves a backend and creates an agent.
func Open(backend string, cfg Config) (Agent, error) {
	b, err := Resolve(backend)
	if err != nil {
		return nil, err
	}
	return b.New(cfg)
}

// DetailNetDevices is the Info.Details key under which a backend whose
// devices were pinned when it started (UCX_NET_DEVICES) says what to.
const DetailNetDevices = "net_devices"
