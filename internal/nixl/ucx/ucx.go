// Package ucx is nixlctl's own transfer backend: a thin cgo layer over
// UCX's UCP API (Debian's libucx-dev). One UCP context per process with RMA
// and active messages, one worker per agent with a progress thread that
// sleeps on the worker's event fd when idle, memory registered once with
// ucp_mem_map, packed rkeys and the worker address in the agent metadata,
// descriptor lists turned into ucp_put_nbx / ucp_get_nbx, notifications as
// active messages queued by sender name.
package ucx

/*
#cgo pkg-config: ucx
#cgo CFLAGS: -O2 -Wall
#cgo LDFLAGS: -ldl
#include <stdlib.h>
#include <ucs/config/types.h>
#include "shim.h"
*/
import "C"

import (
	"fmt"
	"os"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"

	"github.com/nixlctl/nixlctl/internal/nixl"
)

const backendName = "ucx"

func init() {
	nixl.Register(nixl.Backend{Name: backendName, New: New, Available: Available, Version: Version})
}

// initNetDevices is UCX_NET_DEVICES when the process's one UCP context
// was created: UCX reads it then and never again.
var initNetDevices string

var initErr = sync.OnceValue(func() error {
	initNetDevices = os.Getenv("UCX_NET_DEVICES")
	C.nx_logfold_install(C.uint(LogRepeats))
	var buf [256]C.char
	if C.nx_global_init(&buf[0], C.size_t(len(buf))) != 0 {
		return fmt.Errorf("%w: ucx: %s", nixl.ErrUnavailable, C.GoString(&buf[0]))
	}
	return nil
})

// LogRepeats is how many lines of one repeated UCX warning or error (one
// call site in UCX) are printed before the rest are only counted.
const LogRepeats = 3

// FoldedLog is a UCX warning or error that repeated: where UCX logs it, its
// first message, and how often it was logged.
type FoldedLog struct {
	Level   string // "WARN" or "ERROR"
	Where   string // UCX's source file and line
	Example string
	Count   int
}

// Hidden is how many of its lines were not printed.
func (f FoldedLog) Hidden() int { return max(0, f.Count-LogRepeats) }

// FoldedLogs is every UCX warning or error this process logged more than
// LogRepeats times, the lines UCX printed itself left out: a caller says
// what was hidden (once its agents are closed: UCX's worst repeats come
// from closing them).
func FoldedLogs() []FoldedLog {
	var out []FoldedLog
	var file [256]C.char
	var example [512]C.char
	for i := 0; ; i++ {
		var line C.uint
		var level C.int
		var count C.ulong
		if C.nx_logfold_get(C.int(i), &file[0], C.size_t(len(file)), &line, &level, &count, &example[0], C.size_t(len(example))) == 0 {
			return out
		}
		f := FoldedLog{Level: "WARN", Where: fmt.Sprintf("%s:%d", C.GoString(&file[0]), line), Example: C.GoString(&example[0]), Count: int(count)}
		if level == C.UCS_LOG_LEVEL_ERROR {
			f.Level = "ERROR"
		}
		if f.Hidden() > 0 {
			out = append(out, f)
		}
	}
}

// Available reports whether UCX initialises here.
func Available() (bool, string) {
	if err := initErr(); err != nil {
		return false, err.Error()
	}
	return true, ""
}

// Version is the UCX library version in use.
func Version() string { return C.GoString(C.nx_ucx_version()) }

// LibraryPath is the libucp file this process loaded ("" if unknown).
func LibraryPath() string { return C.GoString(C.nx_ucp_path()) }

func cerr(buf []C.char) string { return C.GoString(&buf[0]) }

type agent struct {
	name string
	c    *C.nx_ctx_t

	nixl.Book[*peer, *request, memReg]

	notifyCh   chan struct{}
	notifyFile *os.File
	notifyDone chan struct{}

	stopWatch chan struct{}
	watchDone chan struct{}
}

// memReg is what the agent holds for a registered buffer (its key is the
// packed rkey).
type memReg struct {
	mem *C.nx_mem_t
	own bool // allocated by UCX: unmapping frees it
}

type peer struct {
	name    string
	p       *C.nx_peer_t
	regions []remoteRegion
	invalid bool
	proc    nixl.Process
	mode    string // UCX error handling: "peer", or "none" with our own liveness check
	dead    bool
}

type remoteRegion struct {
	nixl.RegionMD
	rkey unsafe.Pointer
}

// New creates a UCX agent.
func New(cfg nixl.Config) (nixl.Agent, error) {
	if err := initErr(); err != nil {
		return nil, err
	}
	if cfg.Name == "" || len(cfg.Name) > 255 {
		return nil, fmt.Errorf("agent name must be 1..255 bytes")
	}
	name := C.CString(cfg.Name)
	defer C.free(unsafe.Pointer(name))
	var buf [256]C.char
	c := C.nx_ctx_create(name, &buf[0], C.size_t(len(buf)))
	if c == nil {
		return nil, fmt.Errorf("ucx agent %s: %s", cfg.Name, cerr(buf[:]))
	}
	if pace, err := progressPace(); err != nil {
		C.nx_ctx_destroy(c)
		return nil, err
	} else if pace > 0 {
		C.nx_ctx_set_progress_pace(c, C.int(pace/time.Millisecond))
	}
	fd, err := syscall.Dup(int(C.nx_ctx_notify_fd(c)))
	if err != nil {
		C.nx_ctx_destroy(c)
		return nil, fmt.Errorf("dup notify fd: %w", err)
	}
	a := &agent{name: cfg.Name, c: c,
		notifyCh: make(chan struct{}, 1), notifyFile: os.NewFile(uintptr(fd), "ucx-notify"), notifyDone: make(chan struct{}),
		stopWatch: make(chan struct{}), watchDone: make(chan struct{})}
	a.Init(backendName, a.destroyPeerLocked, (*request).inFlight)
	go a.watchNotifs()
	go a.watchPeers()
	return a, nil
}

// ProgressIntervalEnv paces an agent's progress thread: with a duration
// (e.g. "200ms") the worker is progressed once per interval and never
// woken early by its events, which starves UCX of progress on purpose
// (`nixlctl probe ucx-leak --progress-interval`). Unset or "0": the
// thread sleeps on the worker's event fd as usual.
const ProgressIntervalEnv = "NIXLCTL_UCX_PROGRESS_INTERVAL"

func progressPace() (time.Duration, error) {
	s := os.Getenv(ProgressIntervalEnv)
	if s == "" || s == "0" {
		return 0, nil
	}
	d, err := time.ParseDuration(s)
	if err != nil || d < 0 || d > time.Minute {
		return 0, fmt.Errorf("%s=%q: want a duration between 1ms and 1m, like 200ms", ProgressIntervalEnv, s)
	}
	if d > 0 && d < time.Millisecond {
		d = time.Millisecond
	}
	return d, nil
}

// errMode picks UCX's error handling towards a peer. Debian's UCX 1.13
// cannot use its shared-memory transports (sysv, posix, cma) with peer
// error handling, so a peer on this host gets none, and this agent checks
// the peer's process itself; a peer elsewhere gets UCX's peer mode.
// NIXLCTL_UCX_ERR_MODE=peer|none overrides.
func errMode(p nixl.Process) string {
	switch m := os.Getenv("NIXLCTL_UCX_ERR_MODE"); m {
	case "peer", "none":
		return m
	}
	if nixl.SameHost(p) {
		return "none"
	}
	return "peer"
}

// watchPeers fails the transfers of same-host peers whose process died,
// within about nixl.PeerWatchPeriod, where the transport itself would
// never notice.
func (a *agent) watchPeers() {
	defer close(a.watchDone)
	a.WatchPeers(a.stopWatch, func(p *peer) {
		if p.mode == "none" && !p.dead && nixl.SameHost(p.proc) && !nixl.Alive(p.proc) {
			p.dead = true
			C.nx_peer_fail(a.c, p.p, C.nx_status_peer_died())
		}
	})
}

// watchNotifs turns the C side's eventfd into a coalescing channel signal.
func (a *agent) watchNotifs() {
	defer close(a.notifyDone)
	var b [8]byte
	for {
		if _, err := a.notifyFile.Read(b[:]); err != nil {
			return
		}
		select {
		case a.notifyCh <- struct{}{}:
		default:
		}
	}
}

func (a *agent) Name() string { return a.name }

func (a *agent) Info() nixl.Info {
	info := nixl.Info{Backend: backendName, Version: Version(), Details: map[string]string{}}
	if initNetDevices != "" {
		info.Details[nixl.DetailNetDevices] = initNetDevices
	}
	a.Lock()
	defer a.Unlock()
	for name, p := range a.PeersLocked() {
		if !a.Closed() {
			info.Details["transport:"+name] = a.transportsLocked(p)
		}
	}
	return info
}

// Transports describes the UCX lanes used towards a loaded peer, parsed
// from ucp_ep_print_info, e.g. "rma_bw=posix/memory am=posix/memory".
func Transports(a nixl.Agent, remote string) (string, error) {
	ua, ok := unwrap(a).(*agent)
	if !ok {
		return "", fmt.Errorf("not a ucx agent")
	}
	ua.Lock()
	defer ua.Unlock()
	p, err := ua.PeerLocked(remote)
	if err != nil {
		return "", err
	}
	return ua.transportsLocked(p), nil
}

func unwrap(a nixl.Agent) nixl.Agent {
	for {
		u, ok := a.(interface{ Unwrap() nixl.Agent })
		if !ok {
			return a
		}
		a = u.Unwrap()
	}
}

func (a *agent) transportsLocked(p *peer) string {
	buf := make([]C.char, 1<<16)
	n := C.nx_peer_info(a.c, p.p, &buf[0], C.size_t(len(buf)))
	if n < 0 {
		return "unknown"
	}
	lanes := ParseLanes(C.GoString(&buf[0]))
	rma := "none"
	if len(p.regions) > 0 {
		r := p.regions[0]
		rma = RMAPath(lanes, C.nx_rkey_mapped(a.c, r.rkey, C.uint64_t(r.Addr)) != 0, protoV2())
	}
	return fmt.Sprintf("rma: %s; lanes: %s; error handling: %s", rma, lanes, p.mode)
}

// LibraryConfig is the UCP configuration as the library in this process
// reads it (environment applied): UCX_*=value lines, hidden ones too; ""
// when the library refuses its environment.
func LibraryConfig() string {
	s := C.nx_ucx_config()
	if s == nil {
		return ""
	}
	defer C.free(unsafe.Pointer(s))
	return C.GoString(s)
}

// protoV2: this UCX runs its protocols v2 (UCX_PROTO_ENABLE=y) on a release
// seen to put host memory zero-copy over cma with them: 1.22 (its protocol
// table says so, docs/probe.md). Releases between 1.13 and 1.22 were not
// seen here; they get v1's rules, which may call zero-copy emulated but
// never the other way round.
var protoV2 = sync.OnceValue(func() bool {
	for _, line := range strings.Split(LibraryConfig(), "\n") {
		if v, ok := strings.CutPrefix(line, "UCX_PROTO_ENABLE="); ok {
			return strings.ContainsAny(v[:min(1, len(v))], "yY1oO") && versionAtLeast(Version(), 1, 22)
		}
	}
	return false
})

// RMAPath says how ucp_put/ucp_get reach a peer's memory, from the
// endpoint's lanes and whether the peer's segment is mapped here.
//
// Protocols v1 (UCX 1.13's default) serve put/get only on "rma" lanes,
// and only for memory the lane's domain can reach: a shared-memory
// segment UCX allocated (sysv, posix: mapped, so a memcpy), or a network
// transport with one-sided operations (InfiniBand, RoCE). cma offers only
// zero-copy, so it is an rma_bw lane (rendezvous), never an rma one:
// plain mmap'd memory between two processes goes over software RMA on the
// active-message lane, every byte copied once by each side (strace shows
// no process_vm_readv/writev; perf shows uct_mm_ep_am_bcopy). Protocols v2
// (UCX 1.22's default; 1.13's v2 did the same as v1 here) put and get
// zero-copy on rma_bw lanes, cma included.
func RMAPath(lanes string, mapped, v2 bool) string {
	switch {
	case mapped:
		return "shared-memory mapping (sysv/posix: a memcpy into the peer's segment)"
	case v2 && laneOf(lanes, "rma_bw") != "?":
		return laneOf(lanes, "rma_bw") + " (zero-copy)"
	}
	for _, tl := range strings.Split(laneOf(lanes, "rma"), ",") {
		if tl != "?" && !isSharedMemoryTL(tl) {
			return tl + " (one-sided)"
		}
	}
	return "emulated over active messages on " + laneOf(lanes, "am") + " (software RMA: each side copies every byte)"
}

// isSharedMemoryTL: transports that reach only segments they allocated.
func isSharedMemoryTL(tl string) bool {
	for _, p := range []string{"sysv/", "posix/", "xpmem/", "self/"} {
		if strings.HasPrefix(tl, p) {
			return true
		}
	}
	return false
}

// versionAtLeast compares a "1.13.1"-style version with major.minor.
func versionAtLeast(v string, major, minor int) bool {
	var ma, mi int
	if _, err := fmt.Sscanf(v, "%d.%d", &ma, &mi); err != nil {
		return false
	}
	return ma > major || ma == major && mi >= minor
}

func laneOf(lanes, use string) string {
	for _, f := range strings.Fields(lanes) {
		if v, ok := strings.CutPrefix(f, use+"="); ok {
			return v
		}
	}
	return "?"
}

// ParseLanes summarises ucp_ep_print_info output as "usage=transport/device"
// pairs, e.g. "am=posix/memory rma_bw=posix/memory".
func ParseLanes(info string) string {
	uses := map[string][]string{}
	var order []string
	for _, line := range strings.Split(info, "\n") {
		// "#   lane[0]:  3:posix/memory.0 md[2]  -> md[2]/posix/sysdev[255] rma_bw#0 am am_bw#0"
		line = strings.TrimSpace(strings.TrimPrefix(strings.TrimSpace(line), "#"))
		if !strings.HasPrefix(line, "lane[") {
			continue
		}
		fields := strings.Fields(line)
		if len(fields) < 3 {
			continue
		}
		tl := fields[1]
		if i := strings.Index(tl, ":"); i >= 0 {
			tl = tl[i+1:]
		}
		if i := strings.LastIndex(tl, "."); i >= 0 {
			tl = tl[:i]
		}
		arrow := false
		for _, f := range fields[2:] {
			if f == "->" {
				arrow = true
				continue
			}
			if !arrow || strings.Contains(f, "/") || strings.HasPrefix(f, "md[") {
				continue
			}
			use := f
			if i := strings.Index(use, "#"); i >= 0 {
				use = use[:i]
			}
			if _, seen := uses[use]; !seen {
				order = append(order, use)
			}
			if !contains(uses[use], tl) {
				uses[use] = append(uses[use], tl)
			}
		}
	}
	var parts []string
	for _, u := range order {
		parts = append(parts, u+"="+strings.Join(uses[u], ","))
	}
	if len(parts) == 0 {
		return "unknown"
	}
	return strings.Join(parts, " ")
}

func contains(xs []string, s string) bool {
	for _, x := range xs {
		if x == s {
			return true
		}
	}
	return false
}

// AllocMem lets UCX allocate (and register) the memory itself, which lets
// its shared-memory transports map it into peers.
func (a *agent) AllocMem(size int, mem nixl.MemType) (*nixl.Buffer, error) {
	if mem != nixl.DRAM {
		return nil, fmt.Errorf("%w: ucx backend cannot allocate %s: Debian's UCX has no CUDA support (use --backend cuda-ipc or a CUDA-enabled UCX/NIXL)", nixl.ErrMemType, mem)
	}
	if size <= 0 {
		return nil, fmt.Errorf("buffer size must be > 0")
	}
	if err := a.LockOpen(); err != nil {
		return nil, err
	}
	defer a.Unlock()
	var m *C.nx_mem_t
	var ebuf [256]C.char
	if C.nx_mem_map(a.c, 0, C.size_t(size), 1, &m, &ebuf[0], C.size_t(len(ebuf))) != 0 {
		return nil, fmt.Errorf("ucx allocate %d bytes: %s", size, cerr(ebuf[:]))
	}
	addr := uint64(uintptr(C.nx_mem_addr(m)))
	reg := &nixl.Reg[memReg]{Handle: memReg{mem: m, own: true}}
	reg.Buf = nixl.NewBuffer(addr, size, nixl.DRAM, 0, "ucx", nixl.HostSlice(addr, size), func() error { return a.freeOwned(reg.Buf) })
	if err := a.packLocked(reg); err != nil {
		C.nx_mem_unmap(a.c, m)
		return nil, err
	}
	a.AddRegLocked(reg)
	return reg.Buf, nil
}

func (a *agent) freeOwned(b *nixl.Buffer) error {
	a.Lock()
	defer a.Unlock()
	if a.Closed() {
		return nil // unmapped at Close
	}
	if reg := a.DropRegLocked(b); reg != nil {
		C.nx_mem_unmap(a.c, reg.Handle.mem)
	}
	return nil
}

// packLocked sets a registration's key: its packed rkey.
func (a *agent) packLocked(reg *nixl.Reg[memReg]) error {
	var kb unsafe.Pointer
	var kl C.size_t
	if st := C.nx_mem_rkey(a.c, reg.Handle.mem, &kb, &kl); st != 0 {
		return fmt.Errorf("ucp_rkey_pack: %s", C.GoString(C.nx_status_string(st)))
	}
	reg.Key = C.GoBytes(kb, C.int(kl))
	C.nx_free(kb)
	return nil
}

// RegisterMem maps the buffer with UCX; one UCX allocated (AllocMem) is
// registered already.
func (a *agent) RegisterMem(b *nixl.Buffer) error {
	return a.Register(b, nixl.DRAM, "Debian's UCX has no CUDA transports (use --backend cuda-ipc or a CUDA-enabled UCX/NIXL)", func(reg *nixl.Reg[memReg]) error {
		var m *C.nx_mem_t
		var ebuf [256]C.char
		if C.nx_mem_map(a.c, C.uint64_t(b.Addr), C.size_t(b.Len), 0, &m, &ebuf[0], C.size_t(len(ebuf))) != 0 {
			return fmt.Errorf("register %d bytes: %s", b.Len, cerr(ebuf[:]))
		}
		reg.Handle.mem = m
		if err := a.packLocked(reg); err != nil {
			C.nx_mem_unmap(a.c, m)
			return err
		}
		return nil
	})
}

// DeregisterMem unmaps the buffer, unless UCX allocated it: that stays
// registered until it is freed.
func (a *agent) DeregisterMem(b *nixl.Buffer) error {
	return a.Deregister(b, func(reg *nixl.Reg[memReg]) bool {
		if reg.Handle.own {
			return false // freed with the buffer
		}
		C.nx_mem_unmap(a.c, reg.Handle.mem)
		return true
	})
}

func (a *agent) LocalMD() ([]byte, error) {
	return a.EncodeLocalMD(a.name, func() ([]byte, error) {
		var addr unsafe.Pointer
		var n C.size_t
		if st := C.nx_ctx_address(a.c, &addr, &n); st != 0 {
			return nil, fmt.Errorf("worker address: %s", C.GoString(C.nx_status_string(st)))
		}
		defer C.nx_free(addr)
		return C.GoBytes(addr, C.int(n)), nil
	})
}

func (a *agent) LoadRemoteMD(data []byte) (string, error) {
	md, err := a.DecodeRemoteMD(data)
	if err != nil {
		return "", err
	}
	if len(md.Conn) == 0 {
		return "", fmt.Errorf("%w: no worker address", nixl.ErrBadMetadata)
	}
	if err := a.LockOpen(); err != nil {
		return "", err
	}
	defer a.Unlock()
	if loaded, err := a.ReloadLocked(md.Name, data); loaded || err != nil {
		return md.Name, err
	}
	addr := C.CBytes(md.Conn)
	defer C.free(addr)
	var ebuf [256]C.char
	mode := errMode(md.Proc)
	peerMode := C.int(0)
	if mode == "peer" {
		peerMode = 1
	}
	p := C.nx_peer_create(a.c, addr, C.size_t(len(md.Conn)), peerMode, &ebuf[0], C.size_t(len(ebuf)))
	if p == nil {
		return "", fmt.Errorf("%w: %s: %s", nixl.ErrPeerFailed, md.Name, cerr(ebuf[:]))
	}
	pe := &peer{name: md.Name, p: p, proc: md.Proc, mode: mode}
	for i, r := range md.Regions {
		if len(r.Key) == 0 {
			a.destroyPeerLocked(pe)
			return "", fmt.Errorf("%w: region %d has no remote key", nixl.ErrBadMetadata, i)
		}
		kb := C.CBytes(r.Key)
		var rk unsafe.Pointer
		rc := C.nx_peer_rkey(a.c, p, kb, &rk, &ebuf[0], C.size_t(len(ebuf)))
		C.free(kb)
		if rc != 0 {
			a.destroyPeerLocked(pe)
			return "", fmt.Errorf("%w: region %d of %s: %s", nixl.ErrBadMetadata, i, md.Name, cerr(ebuf[:]))
		}
		pe.regions = append(pe.regions, remoteRegion{RegionMD: r, rkey: rk})
	}
	// Writes into a peer segment mapped here are plain memcpys: complete
	// in place means visible at the peer, so they need no flush. (Not so
	// for software RMA over active messages, UCX 1.13's path for memory it
	// did not allocate: puts complete locally before the peer applies them.)
	if t := a.transportsLocked(pe); strings.HasPrefix(t, "rma: shared-memory") {
		C.nx_peer_set_rma_local(p, 1)
	}
	a.AddPeerLocked(md.Name, data, pe)
	return md.Name, nil
}

func (a *agent) destroyPeerLocked(p *peer) {
	for _, r := range p.regions {
		C.nx_rkey_destroy(a.c, r.rkey)
	}
	p.regions = nil
	C.nx_peer_destroy(a.c, p.p)
	p.invalid = true
}

// dlist is a prepared descriptor list.
type dlist struct {
	a      *agent
	remote *peer
	mem    nixl.MemType
	descs  []nixl.Desc
	// region is each descriptor's region of the remote peer (remote lists
	// only): an index, not the key itself, so the garbage collector has
	// no pointer per descriptor to scan in lists kept for the run.
	region []int32
	rkeys  []unsafe.Pointer // per remote region, as prepared
	// meta is each descriptor's length, with contBit set where it starts
	// where the one before it ends (under the same remote key): what
	// making a request reads per index, a quarter of the descriptors'
	// bytes, since a request's thousands of indices miss the cache.
	meta []uint64
}

const contBit = 1 << 63

func (d *dlist) setMeta() error {
	d.meta = make([]uint64, len(d.descs))
	for i, ds := range d.descs {
		if ds.Len >= contBit {
			return fmt.Errorf("descriptor %d: length %d", i, ds.Len)
		}
		d.meta[i] = ds.Len
		if i > 0 && d.descs[i-1].Addr+d.descs[i-1].Len == ds.Addr && (d.region == nil || d.region[i-1] == d.region[i]) {
			d.meta[i] |= contBit
		}
	}
	return nil
}

func (d *dlist) Len() int { return len(d.descs) }
func (d *dlist) Remote() string {
	if d.remote == nil {
		return ""
	}
	return d.remote.name
}

func (a *agent) PrepXferDlist(remote string, mem nixl.MemType, descs []nixl.Desc) (nixl.Dlist, error) {
	if err := a.LockOpen(); err != nil {
		return nil, err
	}
	defer a.Unlock()
	d := &dlist{a: a, mem: mem, descs: append([]nixl.Desc(nil), descs...)}
	if remote == "" {
		if err := a.CheckLocalLocked(descs); err != nil {
			return nil, err
		}
		return d, d.setMeta()
	}
	p, err := a.PeerLocked(remote)
	if err != nil {
		return nil, err
	}
	d.remote = p
	d.region = make([]int32, len(descs))
	for _, r := range p.regions {
		d.rkeys = append(d.rkeys, r.rkey)
	}
	err = nixl.Locate(remote, descs, len(p.regions),
		func(j int, ds nixl.Desc) bool { return p.regions[j].Mem == mem && p.regions[j].Contains(ds) },
		func(i, j int) error { d.region[i] = int32(j); return nil })
	if err != nil {
		return nil, err
	}
	return d, d.setMeta()
}

func (a *agent) ReleaseDlist(d nixl.Dlist) error { return nixl.ReleaseDlist[*dlist](d, "ucx") }

// request is a transfer request.
type request struct {
	nixl.ReqHead
	a      *agent
	x      *C.nx_xfer_t
	peer   *peer
	posted bool
}

func (r *request) inFlight() bool {
	if r.Released() || !r.posted {
		return false
	}
	st := C.nx_xfer_state(r.a.c, r.x, 0)
	return st != C.NX_DONE && st != C.NX_ERROR && st != C.NX_IDLE
}

func (a *agent) MakeXferReq(op nixl.Op, local nixl.Dlist, localIdx []int, remote nixl.Dlist, remoteIdx []int, notif []byte) (nixl.XferReq, error) {
	return a.makeXferReq(op, local, localIdx, remote, remoteIdx, notif, true)
}

func (a *agent) makeXferReq(op nixl.Op, local nixl.Dlist, localIdx []int, remote nixl.Dlist, remoteIdx []int, notif []byte, merge bool) (nixl.XferReq, error) {
	l, rm, err := nixl.XferLists(local, remote, func(d *dlist) bool { return d.a == a })
	if err != nil {
		return nil, err
	}
	if len(localIdx) != len(remoteIdx) {
		return nil, fmt.Errorf("make request: %d local indices but %d remote", len(localIdx), len(remoteIdx))
	}
	// Like NIXL's makeXferReq, a run of indices that follow one another on
	// both sides over memory contiguous on both sides (and one remote key)
	// becomes one operation: paged KV posts whole block runs, not blocks.
	// Runs are the rule, so ops starts small. One pass checks and builds:
	// a request carries an index per block and region, thousands.
	ops := make([]C.nx_op_t, 0, min(len(localIdx), 64))
	var total int64
	pl, pr := -2, -2
	remoteIdx = remoteIdx[:len(localIdx)]
	for i, li := range localIdx {
		ri := remoteIdx[i]
		if uint(li) >= uint(len(l.descs)) || uint(ri) >= uint(len(rm.descs)) {
			return nil, fmt.Errorf("make request: index pair %d (%d, %d) out of range (%d local, %d remote)", i, li, ri, len(l.descs), len(rm.descs))
		}
		lm, rmm := l.meta[li], rm.meta[ri]
		n := lm &^ contBit
		if n != rmm&^contBit {
			return nil, fmt.Errorf("descriptor pair %d: %d vs %d bytes: %w", i, n, rmm&^contBit, nixl.ErrLengthMismatch)
		}
		total += int64(n)
		if k := len(ops); merge && k > 0 && li == pl+1 && ri == pr+1 && lm&rmm&contBit != 0 {
			ops[k-1].len += C.uint64_t(n)
		} else {
			ops = append(ops, C.nx_op_t{local: C.uint64_t(l.descs[li].Addr), remote: C.uint64_t(rm.descs[ri].Addr), len: C.uint64_t(n), rkey: rm.rkeys[rm.region[ri]]})
		}
		pl, pr = li, ri
	}
	return a.newRequest(op, rm.remote, ops, total, notif)
}

func (a *agent) newRequest(op nixl.Op, p *peer, ops []C.nx_op_t, total int64, notif []byte) (nixl.XferReq, error) {
	if err := a.LockOpen(); err != nil {
		return nil, err
	}
	defer a.Unlock()
	if p.invalid {
		return nil, fmt.Errorf("%w: %s", nixl.ErrUnknownAgent, p.name)
	}
	var opsPtr *C.nx_op_t
	if len(ops) > 0 {
		opsPtr = &ops[0]
	}
	var nptr unsafe.Pointer
	if len(notif) > 0 {
		nptr = unsafe.Pointer(&notif[0])
	}
	cop := C.int(C.NX_OP_READ)
	if op == nixl.Write {
		cop = C.NX_OP_WRITE
	}
	x := C.nx_xfer_create(a.c, p.p, cop, opsPtr, C.size_t(len(ops)), nptr, C.size_t(len(notif)))
	runtime.KeepAlive(ops)
	runtime.KeepAlive(notif)
	if x == nil {
		return nil, fmt.Errorf("make request: out of memory")
	}
	r := &request{ReqHead: nixl.ReqHead{XferInfo: nixl.NewXferInfo(op, total, len(ops), p.name)}, a: a, x: x, peer: p}
	a.AddReqLocked(r, p)
	return r, nil
}

func (a *agent) CreateXferReq(op nixl.Op, mem nixl.MemType, local []nixl.Desc, remoteMem nixl.MemType, remote []nixl.Desc, remoteName string, notif []byte) (nixl.XferReq, error) {
	// NIXL's createXferReq posts the descriptors as given (it does not
	// merge; --no-merge relies on that), so neither does this.
	return nixl.CreateXferReqWith(a, op, mem, local, remoteMem, remote, remoteName, notif,
		func(op nixl.Op, ld nixl.Dlist, li []int, rd nixl.Dlist, ri []int, notif []byte) (nixl.XferReq, error) {
			return a.makeXferReq(op, ld, li, rd, ri, notif, false)
		})
}

func (a *agent) PostXferReq(x nixl.XferReq) (nixl.Status, error) {
	r, err := a.LockReq(x)
	if err != nil {
		return nixl.Failed, err
	}
	if r.peer.invalid {
		a.Unlock()
		return nixl.Failed, fmt.Errorf("%w: %s was invalidated", nixl.ErrUnknownAgent, r.peer.name)
	}
	r.posted = true
	st := C.nx_xfer_post(a.c, r.x)
	a.Unlock()
	if st < 0 {
		return nixl.InProgress, fmt.Errorf("post: %w", nixl.ErrInFlight)
	}
	return a.status(r, st)
}

func (a *agent) status(r *request, st C.int) (nixl.Status, error) {
	switch st {
	case C.NX_DONE:
		return nixl.Done, nil
	case C.NX_ERROR:
		code := C.int(r.pub().err)
		msg := C.GoString(C.nx_status_string(code))
		// A newer UCX (1.22: CMA fails at once with an I/O error) can
		// report a dead same-host peer before watchPeers does, so ask.
		if pst := C.nx_peer_status(r.peer.p); pst != 0 || peerGone(r.peer) {
			return nixl.Failed, fmt.Errorf("%w: %s: %s", nixl.ErrPeerFailed, r.peer.name, msg)
		}
		return nixl.Failed, fmt.Errorf("transfer to %s failed: %s", r.peer.name, msg)
	case C.NX_IDLE:
		return nixl.Failed, fmt.Errorf("request was never posted")
	}
	return nixl.InProgress, nil
}

// pub is the part of a transfer C publishes for Go to read in place.
func (r *request) pub() *C.nx_xfer_pub_t { return (*C.nx_xfer_pub_t)(unsafe.Pointer(r.x)) }

// state reads the published state (an acquire load; C stores it last).
func (r *request) state() C.int {
	return C.int(atomic.LoadInt32((*int32)(unsafe.Pointer(&r.pub().state))))
}

// peerGone reports whether a same-host peer watched by watchPeers has
// exited (its identity fields never change after LoadRemoteMD).
func peerGone(p *peer) bool {
	return p.mode == "none" && nixl.SameHost(p.proc) && !nixl.Alive(p.proc)
}

func (a *agent) XferStatus(x nixl.XferReq) (nixl.Status, error) {
	r, err := a.OpenReq(x)
	if err != nil {
		return nixl.Failed, err
	}
	// Finished requests answer without calling into C; running ones
	// progress the worker.
	if st := r.state(); st == C.NX_DONE || st == C.NX_ERROR {
		return a.status(r, st)
	}
	return a.status(r, C.nx_xfer_state(a.c, r.x, 1))
}

func (a *agent) ReleaseXferReq(x nixl.XferReq) error {
	return a.ReleaseReq(x, func(r *request) error {
		if C.nx_xfer_release(a.c, r.x) != 0 {
			return fmt.Errorf("release: %w", nixl.ErrInFlight)
		}
		return nil
	})
}

func (a *agent) Telemetry(x nixl.XferReq) nixl.Telemetry {
	r, ok := x.(*request)
	if !ok || r.Released() {
		return nixl.Telemetry{}
	}
	if st := r.state(); st != C.NX_DONE && st != C.NX_ERROR {
		return nixl.Telemetry{Bytes: r.Bytes(), Descs: r.Descs()}
	}
	p := r.pub()
	// The shim stamps with CLOCK_MONOTONIC, the clock internal/mono reads.
	t := nixl.Telemetry{Start: int64(p.t_post0), Bytes: r.Bytes(), Descs: r.Descs(), PostDuration: durNS(p.t_post0, p.t_post1)}
	if p.t_done != 0 {
		t.XferDuration = durNS(p.t_post1, p.t_done)
	}
	return t
}

func (a *agent) SendNotif(remote string, msg []byte) error {
	if err := a.LockOpen(); err != nil {
		return err
	}
	defer a.Unlock()
	p, err := a.PeerLocked(remote)
	if err != nil {
		return err
	}
	var ptr unsafe.Pointer
	if len(msg) > 0 {
		ptr = unsafe.Pointer(&msg[0])
	}
	st := C.nx_send_notif(a.c, p.p, ptr, C.size_t(len(msg)))
	runtime.KeepAlive(msg)
	if st != 0 {
		return fmt.Errorf("%w: notify %s: %s", nixl.ErrPeerFailed, remote, C.GoString(C.nx_status_string(st)))
	}
	return nil
}

func (a *agent) GetNotifs() (nixl.Notifs, error) {
	if err := a.LockOpen(); err != nil {
		return nil, err
	}
	defer a.Unlock()
	out := nixl.Notifs{}
	for {
		var s, m *C.char
		var sl, ml C.size_t
		if C.nx_pop_notif(a.c, &s, &sl, &m, &ml) == 0 {
			break
		}
		sender := C.GoStringN(s, C.int(sl))
		out[sender] = append(out[sender], C.GoBytes(unsafe.Pointer(m), C.int(ml)))
		C.nx_free(unsafe.Pointer(s))
		C.nx_free(unsafe.Pointer(m))
	}
	return out, nil
}

// MalformedNotifs counts received messages that were not well-formed
// notifications (dropped).
func (a *agent) MalformedNotifs() uint64 { return uint64(C.nx_ctx_malformed_notifs(a.c)) }

func (a *agent) NotifReady() <-chan struct{} { return a.notifyCh }

// Close fails every request still in flight (their peers' endpoints are
// force-closed), frees all UCX resources and stops the progress thread.
// Handles stay safe to use: they report ErrClosed.
func (a *agent) Close() error {
	a.Lock()
	if !a.CloseLocked() {
		a.Unlock()
		return nil
	}
	for _, p := range a.PeersLocked() {
		a.destroyPeerLocked(p)
	}
	for r := range a.ReqsLocked() {
		C.nx_xfer_release(a.c, r.x)
		r.MarkReleased()
	}
	for _, r := range a.RegsLocked() {
		C.nx_mem_unmap(a.c, r.Handle.mem)
	}
	a.ForgetAllLocked()
	close(a.stopWatch)
	a.Unlock()
	<-a.watchDone
	a.Lock()
	C.nx_ctx_destroy(a.c)
	a.Unlock()
	err := a.notifyFile.Close()
	<-a.notifyDone
	return err
}

func durNS(from, to C.uint64_t) time.Duration {
	if to < from {
		return 0
	}
	return time.Duration(to - from)
}

var _ nixl.Allocator = (*agent)(nil)

// logFoldProbe logs n copies of one warning and one other warning through
// UCX's own logging macro (tests).
func logFoldProbe(n int) { C.nx_logfold_test(C.int(n)) }
