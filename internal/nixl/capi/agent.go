package capi

/*
#include <stdlib.h>
#include "shim.h"
*/
import "C"

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"time"
	"unsafe"

	"github.com/nixlctl/nixlctl/internal/nixl"
)

// NIXL has no file descriptor to wait on for notifications, so each agent
// has a goroutine that asks NIXL for them (moving them into a queue that
// GetNotifs drains) and signals NotifReady when the queue is not empty. It
// polls every notifPollMin after something arrived and backs off to
// notifPollMax when idle: at most a few hundred calls a second, not a
// spinning core, at the price of up to notifPollMax of extra latency for a
// consumer that waits on NotifReady instead of calling GetNotifs itself.
const (
	notifPollMin = 50 * time.Microsecond
	notifPollMax = 5 * time.Millisecond
	// maxBusySkips is how many ticks in a row the poller leaves a busy
	// agent alone before it waits for the agent's mutex after all.
	maxBusySkips = 8
)

// progressDelayUS bounds how long NIXL's UCX progress thread sleeps in its
// poll on the workers' event fds. Events wake it at once (a passive target
// served transfers over TCP as fast with 1 s as with 1 ms); the timeout is
// NIXL's safety net for wake-ups UCX misses. NIXL's default, 0, makes the
// thread spin: a whole core per agent. Each timeout costs about 30 µs of
// CPU, so 1 ms would cost 3% of a core per idle agent, and 5 ms under 1%.
// NIXLCTL_NIXL_PTHR_DELAY_US overrides it.
const progressDelayUS = 5000

// progressText is Info's "progress" for each kind of agent.
var progressText = map[nixl.Progress]string{
	nixl.ProgressBackground: "NIXL progress thread",
	nixl.ProgressCaller:     "polled by the caller (no progress thread)",
	nixl.ProgressSpin:       "spinning on notifications (no progress thread)",
}

// closeGrace bounds how long Close waits for requests in flight to finish
// before it has NIXL cancel them.
const closeGrace = 2 * time.Second

type agent struct {
	name     string
	progress nixl.Progress // ProgressBackground: NIXL's progress thread runs

	// mu serialises every NIXL call on this agent (NIXL's own locking is
	// off: thread_sync NONE) and guards the fields below.
	mu     sync.Mutex
	closed bool
	h      C.nxc_agent_t
	be     C.nxc_backend_t
	opt    C.nxc_opt_args_t // names the UCX backend for registration and prep
	nmap   C.nxc_notif_map_t
	// fetch holds fetchLocked's out-parameters (under mu): a local whose
	// address goes to C is moved to the heap, and a spinning target
	// fetches hundreds of thousands of times a second. Its garbage ran
	// a GC cycle every 60 ms, whose mark worker took a core from the
	// initiator (1 MiB WRITEs: p99.9 0.4-0.9 ms).
	fetch struct {
		senders, n, len C.size_t
		name            *C.char
		data            unsafe.Pointer
	}
	regs    map[*nixl.Buffer]*registration
	remotes map[string]*remote
	dlists  map[*dlist]struct{}
	reqs    map[*request]struct{}
	pending nixl.Notifs
	params  map[string]string

	notifyCh chan struct{}
	stop     chan struct{}
	pollDone chan struct{}
}

type registration struct {
	buf *nixl.Buffer
	dl  C.nxc_reg_dlist_t
}

// remote is a peer whose metadata is loaded. A new remote replaces it when
// the peer's metadata is loaded again or invalidated, so handles that point
// to the old one can tell they are stale.
type remote struct {
	name    string
	md      []byte
	invalid bool
}

// New creates a NIXL agent with a UCX backend and, unless cfg.Progress
// says its owner polls, NIXL's progress thread.
func New(cfg nixl.Config) (nixl.Agent, error) {
	if _, err := loadedLib(); err != nil {
		return nil, err
	}
	if cfg.Name == "" || len(cfg.Name) > 255 || bytes.IndexByte([]byte(cfg.Name), 0) >= 0 {
		return nil, fmt.Errorf("agent name must be 1..255 bytes without NUL")
	}
	delay := uint64(progressDelayUS)
	if s := os.Getenv("NIXLCTL_NIXL_PTHR_DELAY_US"); s != "" {
		v, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			return nil, fmt.Errorf("NIXLCTL_NIXL_PTHR_DELAY_US=%q: want microseconds", s)
		}
		delay = v
	}
	switch cfg.Progress {
	case nixl.ProgressBackground, nixl.ProgressCaller, nixl.ProgressSpin:
	default:
		return nil, fmt.Errorf("nixl agent %s: unknown progress %v", cfg.Name, cfg.Progress)
	}
	ccfg := C.nxc_agent_config_t{
		// Without the progress thread a transfer only moves while someone
		// polls it, and a target that is not polled stalls its initiator:
		// only an agent whose owner polls (or that spins) goes without.
		enable_prog_thread: C.bool(cfg.Progress == nixl.ProgressBackground),
		thread_sync:        C.NXC_SYNC_NONE,
		num_workers:        1,
		pthr_delay_us:      C.uint64_t(delay),
		lthr_delay_us:      100000,
		capture_telemetry:  true,
	}
	name := C.CString(cfg.Name)
	defer C.free(unsafe.Pointer(name))
	a := &agent{name: cfg.Name, progress: cfg.Progress, regs: map[*nixl.Buffer]*registration{}, remotes: map[string]*remote{},
		dlists: map[*dlist]struct{}{}, reqs: map[*request]struct{}{}, pending: nixl.Notifs{},
		notifyCh: make(chan struct{}, 1), stop: make(chan struct{}), pollDone: make(chan struct{})}
	if st := C.nxc_create_configured_agent(name, &ccfg, &a.h); st != C.NXC_SUCCESS {
		return nil, fmt.Errorf("nixl agent %s: %s", cfg.Name, statusText(st))
	}
	var err error
	if a.be, err = createBackend(a.h, nil); err != nil {
		C.nxc_destroy_agent(a.h)
		return nil, fmt.Errorf("nixl agent %s: %w", cfg.Name, err)
	}
	if st := C.nxc_create_opt_args(&a.opt); st != C.NXC_SUCCESS {
		a.destroy()
		return nil, fmt.Errorf("nixl agent %s: options: %s", cfg.Name, statusText(st))
	}
	if st := C.nxc_opt_args_add_backend(a.opt, a.be); st != C.NXC_SUCCESS {
		a.destroy()
		return nil, fmt.Errorf("nixl agent %s: options: %s", cfg.Name, statusText(st))
	}
	if st := C.nxc_create_notif_map(&a.nmap); st != C.NXC_SUCCESS {
		a.destroy()
		return nil, fmt.Errorf("nixl agent %s: notification map: %s", cfg.Name, statusText(st))
	}
	a.params = backendParams(a.h, a.be)
	go a.pollNotifs()
	return a, nil
}

// destroy frees what New made; the caller holds no handles any more.
func (a *agent) destroy() {
	if a.nmap != nil {
		C.nxc_destroy_notif_map(a.nmap)
		a.nmap = nil
	}
	if a.opt != nil {
		C.nxc_destroy_opt_args(a.opt)
		a.opt = nil
	}
	if a.be != nil {
		C.nxc_destroy_backend(a.be) // the handle only; the agent owns the backend
		a.be = nil
	}
	if a.h != nil {
		C.nxc_destroy_agent(a.h)
		a.h = nil
	}
}

// backendParams reads the parameters NIXL's UCX backend runs with, for Info.
func backendParams(a C.nxc_agent_t, b C.nxc_backend_t) map[string]string {
	var mems C.nxc_mem_list_t
	var p C.nxc_params_t
	if C.nxc_get_backend_params(a, b, &mems, &p) != C.NXC_SUCCESS {
		return nil
	}
	defer C.nxc_destroy_mem_list(mems)
	defer C.nxc_destroy_params(p)
	var empty C.bool
	if C.nxc_params_is_empty(p, &empty) != C.NXC_SUCCESS || bool(empty) {
		return nil
	}
	var it C.nxc_param_iter_t
	if C.nxc_params_create_iterator(p, &it) != C.NXC_SUCCESS {
		return nil
	}
	defer C.nxc_params_destroy_iterator(it)
	out := map[string]string{}
	for more := C.bool(true); more; {
		var k, v *C.char
		if C.nxc_params_iterator_next(it, &k, &v, &more) != C.NXC_SUCCESS {
			break
		}
		if k != nil {
			out[C.GoString(k)] = C.GoString(v)
		}
	}
	return out
}

func (a *agent) Name() string { return a.name }

// lockOpen takes a.mu unless the agent is closed: then it returns
// ErrClosed without holding it.
func (a *agent) lockOpen() error {
	a.mu.Lock()
	if a.closed {
		a.mu.Unlock()
		return nixl.ErrClosed
	}
	return nil
}

func (a *agent) Info() nixl.Info {
	info := nixl.Info{Backend: backendName, Version: Version(), Details: map[string]string{
		"plugin":   pluginName,
		"progress": progressText[a.progress],
	}}
	for k, v := range a.params {
		info.Details["ucx:"+k] = v
	}
	if lib := ucpLibrary(); lib != "" {
		info.Details["ucx_library"] = lib
	}
	return info
}

// ucpLibrary is the libucp this process runs, which NIXL's UCX plugin
// shares with nixlctl's own UCX backend: if another UCX was loaded first
// (Debian's, which nixlctl links), NIXL uses that one, not its own.
func ucpLibrary() string {
	maps, err := os.ReadFile("/proc/self/maps")
	if err != nil {
		return ""
	}
	for _, line := range strings.Split(string(maps), "\n") {
		if i := strings.IndexByte(line, '/'); i >= 0 && strings.Contains(line[i:], "/libucp.so") {
			return line[i:]
		}
	}
	return ""
}

func memType(m nixl.MemType) (C.int, error) {
	switch m {
	case nixl.DRAM:
		return C.NXC_MEM_DRAM, nil
	case nixl.VRAM:
		return C.NXC_MEM_VRAM, nil
	}
	return 0, fmt.Errorf("nixl backend: unknown memory type %v", m)
}

// RegisterMem registers the buffer with NIXL. VRAM goes through as it is:
// a NIXL built with CUDA registers it, one without says so.
func (a *agent) RegisterMem(b *nixl.Buffer) error {
	if b == nil || b.Len <= 0 {
		return fmt.Errorf("register: empty buffer")
	}
	mt, err := memType(b.Mem)
	if err != nil {
		return err
	}
	if err := a.lockOpen(); err != nil {
		return err
	}
	defer a.mu.Unlock()
	if _, ok := a.regs[b]; ok {
		return nil
	}
	var dl C.nxc_reg_dlist_t
	if st := C.nxc_create_reg_dlist(mt, &dl); st != C.NXC_SUCCESS {
		return fmt.Errorf("register: %s", statusText(st))
	}
	if st := C.nxc_reg_dlist_add_desc(dl, C.uintptr_t(b.Addr), C.size_t(b.Len), C.uint64_t(b.Dev), nil, 0); st != C.NXC_SUCCESS {
		C.nxc_destroy_reg_dlist(dl)
		return fmt.Errorf("register: %s", statusText(st))
	}
	if st := C.nxc_register_mem(a.h, dl, a.opt); st != C.NXC_SUCCESS {
		C.nxc_destroy_reg_dlist(dl)
		return fmt.Errorf("NIXL could not register %d bytes of %s at %#x: %s", b.Len, b.Mem, b.Addr, statusText(st))
	}
	a.regs[b] = &registration{buf: b, dl: dl}
	return nil
}

func (a *agent) DeregisterMem(b *nixl.Buffer) error {
	if err := a.lockOpen(); err != nil {
		return err
	}
	defer a.mu.Unlock()
	r, ok := a.regs[b]
	if !ok {
		return fmt.Errorf("deregister: buffer at %#x is not registered", b.Addr)
	}
	if st := C.nxc_deregister_mem(a.h, r.dl, a.opt); st != C.NXC_SUCCESS {
		return fmt.Errorf("NIXL could not deregister the buffer at %#x: %s", b.Addr, statusText(st))
	}
	C.nxc_destroy_reg_dlist(r.dl)
	delete(a.regs, b)
	return nil
}

// LocalMD is NIXL's own metadata blob, which any NIXL agent can load,
// sealed with nixlctl's checksum trailer (see seal).
func (a *agent) LocalMD() ([]byte, error) {
	if err := a.lockOpen(); err != nil {
		return nil, err
	}
	defer a.mu.Unlock()
	var data unsafe.Pointer
	var n C.size_t
	if st := C.nxc_get_local_md(a.h, &data, &n); st != C.NXC_SUCCESS {
		return nil, fmt.Errorf("NIXL local metadata: %s", statusText(st))
	}
	defer C.nxc_free(data)
	return seal(C.GoBytes(data, C.int(n))), nil
}

// LoadRemoteMD checks the metadata (see parseNIXLMD) before NIXL sees it:
// NIXL trusts what it is given, and UCX aborts the process on some
// corrupted addresses and keys.
func (a *agent) LoadRemoteMD(sealed []byte) (string, error) {
	data, err := unseal(sealed)
	if err != nil {
		return "", err
	}
	md, err := parseNIXLMD(data)
	if err != nil {
		return "", err
	}
	if err := a.lockOpen(); err != nil {
		return "", err
	}
	defer a.mu.Unlock()
	if md.Agent == a.name {
		return "", fmt.Errorf("load metadata: it is this agent's own (%s)", a.name)
	}
	if old, ok := a.remotes[md.Agent]; ok {
		// NIXL forgets a peer that disconnected; then even the same
		// metadata has to be loaded again.
		if bytes.Equal(old.md, data) && a.knownLocked(md.Agent) {
			return md.Agent, nil
		}
		// A restarted peer, or one that registered more memory: NIXL keeps
		// the first metadata it loads for a name, so forget that first.
		if err := a.invalidateLocked(old); err != nil {
			return "", err
		}
	}
	name, err := a.nixlLoadLocked(data)
	if err != nil {
		// NIXL may have taken part of it (the connection) before failing.
		n := C.CString(md.Agent)
		C.nxc_invalidate_remote_md(a.h, n)
		C.free(unsafe.Pointer(n))
		return "", fmt.Errorf("%w: NIXL refused the metadata of %s: %v", nixl.ErrBadMetadata, md.Agent, err)
	}
	a.remotes[name] = &remote{name: name, md: append([]byte(nil), data...)}
	return name, nil
}

// nixlLoadLocked hands a blob to NIXL as it is.
func (a *agent) nixlLoadLocked(data []byte) (string, error) {
	if len(data) == 0 {
		return "", fmt.Errorf("empty metadata")
	}
	var cname *C.char
	st := C.nxc_load_remote_md(a.h, unsafe.Pointer(&data[0]), C.size_t(len(data)), &cname)
	runtime.KeepAlive(data)
	if st != C.NXC_SUCCESS {
		return "", errors.New(statusText(st))
	}
	name := C.GoString(cname)
	C.nxc_free(unsafe.Pointer(cname))
	return name, nil
}

func (a *agent) InvalidateRemoteMD(name string) error {
	if err := a.lockOpen(); err != nil {
		return err
	}
	defer a.mu.Unlock()
	rm, err := a.remoteLocked(name)
	if err != nil {
		return err
	}
	return a.invalidateLocked(rm)
}

// invalidateLocked forgets a remote agent. NIXL frees what it knew about
// the peer, so the requests and prepared lists that point there are
// released first; they report ErrUnknownAgent afterwards.
func (a *agent) invalidateLocked(rm *remote) error {
	for r := range a.reqs {
		if r.remote == rm && a.inFlightLocked(r) {
			return fmt.Errorf("invalidate %s: %w", rm.name, nixl.ErrInFlight)
		}
	}
	for r := range a.reqs {
		if r.remote == rm {
			a.freeReqLocked(r)
		}
	}
	for d := range a.dlists {
		if d.remote == rm {
			a.freeDlistLocked(d)
		}
	}
	n := C.CString(rm.name)
	defer C.free(unsafe.Pointer(n))
	st := C.nxc_invalidate_remote_md(a.h, n)
	rm.invalid = true
	delete(a.remotes, rm.name)
	if st != C.NXC_SUCCESS && st != C.NXC_ERR_NOT_FOUND {
		return fmt.Errorf("NIXL could not invalidate %s: %s", rm.name, statusText(st))
	}
	return nil
}

// knownLocked asks NIXL whether it holds a remote agent's metadata.
func (a *agent) knownLocked(name string) bool {
	n := C.CString(name)
	defer C.free(unsafe.Pointer(n))
	return C.nxc_check_remote_md(a.h, n, nil) == C.NXC_SUCCESS
}

// remoteLocked finds a loaded remote agent.
func (a *agent) remoteLocked(name string) (*remote, error) {
	rm, ok := a.remotes[name]
	if !ok {
		return nil, fmt.Errorf("%w: %s", nixl.ErrUnknownAgent, name)
	}
	return rm, nil
}

// checkLocalLocked finds local descriptors outside registered memory
// before NIXL does, so that the error can name the descriptor.
func (a *agent) checkLocalLocked(mem nixl.MemType, descs []nixl.Desc) error {
	for i, d := range descs {
		found := false
		for b := range a.regs {
			if b.Mem == mem && b.Contains(d) && (mem == nixl.DRAM || b.Dev == d.Dev) {
				found = true
				break
			}
		}
		if !found {
			return fmt.Errorf("local descriptor %d (%s %#x+%d): %w", i, mem, d.Addr, d.Len, nixl.ErrNotRegistered)
		}
	}
	return nil
}

// xferDlist builds a NIXL descriptor list; the caller destroys it.
func xferDlist(mem nixl.MemType, descs []nixl.Desc) (C.nxc_xfer_dlist_t, error) {
	mt, err := memType(mem)
	if err != nil {
		return nil, err
	}
	var dl C.nxc_xfer_dlist_t
	if st := C.nxc_create_xfer_dlist(mt, &dl); st != C.NXC_SUCCESS {
		return nil, fmt.Errorf("descriptor list: %s", statusText(st))
	}
	for _, d := range descs {
		dev := uint64(d.Dev)
		if mem == nixl.DRAM {
			dev = 0 // NIXL keys host memory by device 0
		}
		if st := C.nxc_xfer_dlist_add_desc(dl, C.uintptr_t(d.Addr), C.size_t(d.Len), C.uint64_t(dev)); st != C.NXC_SUCCESS {
			C.nxc_destroy_xfer_dlist(dl)
			return nil, fmt.Errorf("descriptor list: %s", statusText(st))
		}
	}
	return dl, nil
}

// whyRemoteFailedLocked turns a NIXL failure that involved remote descriptors
// into the error callers test for: NIXL's status alone cannot tell an
// unknown agent from descriptors outside its memory.
func (a *agent) whyRemoteFailedLocked(name string, dl C.nxc_xfer_dlist_t, what string, st C.nxc_status_t) error {
	if !a.knownLocked(name) {
		return fmt.Errorf("%s: %w: %s (NIXL dropped it, as it does when a peer disconnects)", what, nixl.ErrUnknownAgent, name)
	}
	n := C.CString(name)
	defer C.free(unsafe.Pointer(n))
	if dl != nil && C.nxc_check_remote_md(a.h, n, dl) != C.NXC_SUCCESS {
		return fmt.Errorf("%s: remote descriptors of %s: %w", what, name, nixl.ErrNotRegistered)
	}
	return fmt.Errorf("%s: NIXL: %s", what, statusText(st))
}

// dlist is a prepared descriptor list (a NIXL dlist handle).
type dlist struct {
	a      *agent
	h      C.nxc_xfer_dlist_handle_t
	remote *remote // nil for a local list
	mem    nixl.MemType
	descs  []nixl.Desc
	freed  bool
}

func (d *dlist) Len() int { return len(d.descs) }
func (d *dlist) Remote() string {
	if d.remote == nil {
		return ""
	}
	return d.remote.name
}

func (a *agent) PrepXferDlist(remoteName string, mem nixl.MemType, descs []nixl.Desc) (nixl.Dlist, error) {
	if err := a.lockOpen(); err != nil {
		return nil, err
	}
	defer a.mu.Unlock()
	d := &dlist{a: a, mem: mem, descs: append([]nixl.Desc(nil), descs...)}
	if remoteName == "" {
		if err := a.checkLocalLocked(mem, descs); err != nil {
			return nil, err
		}
	} else {
		rm, err := a.remoteLocked(remoteName)
		if err != nil {
			return nil, err
		}
		d.remote = rm
	}
	dl, err := xferDlist(mem, descs)
	if err != nil {
		return nil, err
	}
	defer C.nxc_destroy_xfer_dlist(dl) // NIXL keeps a copy
	// NIXL's convention: the empty name is the local side.
	n := C.CString(remoteName)
	defer C.free(unsafe.Pointer(n))
	if st := C.nxc_prep_xfer_dlist(a.h, n, dl, &d.h, a.opt); st != C.NXC_SUCCESS {
		if remoteName == "" {
			return nil, fmt.Errorf("prepare local descriptors: NIXL: %s", statusText(st))
		}
		return nil, a.whyRemoteFailedLocked(remoteName, dl, "prepare descriptors", st)
	}
	a.dlists[d] = struct{}{}
	return d, nil
}

func (a *agent) ReleaseDlist(x nixl.Dlist) error {
	d, ok := x.(*dlist)
	if !ok || d.a != a {
		return fmt.Errorf("descriptor list was not prepared by this agent")
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.closed || d.freed {
		return nil // released at Close or when its remote was invalidated
	}
	a.freeDlistLocked(d)
	return nil
}

func (a *agent) freeDlistLocked(d *dlist) {
	if d.freed {
		return
	}
	C.nxc_release_xfer_dlist_handle(a.h, d.h)
	d.h, d.freed = nil, true
	delete(a.dlists, d)
}

// request is a NIXL transfer request with the options it is posted with
// (the notification travels in them).
type request struct {
	a      *agent
	h      C.nxc_xfer_req_t
	opt    C.nxc_opt_args_t
	remote *remote
	nixl.XferInfo
	posted bool
	freed  bool
	// settled: a status call saw the request end since its last post,
	// and NIXL's status stays so until the next post, so a post need not
	// ask again. tele holds the telemetry read with that status.
	settled bool
	tele    C.nxc_telemetry_t
	teleOK  bool
	// teleRead is the status call's out-parameter: a local whose address
	// goes to C is moved to the heap, an allocation per poll.
	teleRead C.bool
}

// reqOpts makes the options a request is made and posted with.
func (a *agent) reqOpts(notif []byte) (C.nxc_opt_args_t, error) {
	var o C.nxc_opt_args_t
	if st := C.nxc_create_opt_args(&o); st != C.NXC_SUCCESS {
		return nil, fmt.Errorf("request options: %s", statusText(st))
	}
	st := C.nxc_opt_args_add_backend(o, a.be)
	if st == C.NXC_SUCCESS && len(notif) > 0 {
		// Both calls are needed: the message, and the flag that sends it.
		st = C.nxc_opt_args_set_notif_msg(o, unsafe.Pointer(&notif[0]), C.size_t(len(notif)))
		runtime.KeepAlive(notif)
		if st == C.NXC_SUCCESS {
			st = C.nxc_opt_args_set_has_notif(o, true)
		}
	}
	if st != C.NXC_SUCCESS {
		C.nxc_destroy_opt_args(o)
		return nil, fmt.Errorf("request options: %s", statusText(st))
	}
	return o, nil
}

func xferOp(op nixl.Op) C.int {
	if op == nixl.Write {
		return C.NXC_OP_WRITE
	}
	return C.NXC_OP_READ
}

var indexScratch = sync.Pool{New: func() any { return new([2][]C.int) }}

func (a *agent) MakeXferReq(op nixl.Op, local nixl.Dlist, localIdx []int, remoteList nixl.Dlist, remoteIdx []int, notif []byte) (nixl.XferReq, error) {
	l, rm, err := nixl.XferLists(local, remoteList, func(d *dlist) bool { return d.a == a })
	if err != nil {
		return nil, err
	}
	total, err := nixl.CheckPairs(localIdx, remoteIdx, l.descs, rm.descs)
	if err != nil {
		return nil, err
	}
	// NIXL copies the indices into the request: the C arrays are scratch,
	// kept between requests (thousands of indices each).
	sc := indexScratch.Get().(*[2][]C.int)
	defer indexScratch.Put(sc)
	li, ri := sc[0][:0], sc[1][:0]
	for i, x := range localIdx {
		li, ri = append(li, C.int(x)), append(ri, C.int(remoteIdx[i]))
	}
	sc[0], sc[1] = li, ri
	if err := a.lockOpen(); err != nil {
		return nil, err
	}
	defer a.mu.Unlock()
	if rm.freed || rm.remote.invalid {
		return nil, fmt.Errorf("make request: %w: %s was invalidated or the list released", nixl.ErrUnknownAgent, rm.remote.name)
	}
	if l.freed {
		return nil, fmt.Errorf("make request: the local list was released")
	}
	o, err := a.reqOpts(notif)
	if err != nil {
		return nil, err
	}
	var lp, rp *C.int
	if len(li) > 0 {
		lp, rp = &li[0], &ri[0]
	}
	r := &request{a: a, opt: o, remote: rm.remote, XferInfo: nixl.NewXferInfo(op, total, len(li), rm.remote.name)}
	st := C.nxc_make_xfer_req(a.h, xferOp(op), l.h, lp, C.size_t(len(li)), rm.h, rp, C.size_t(len(ri)), &r.h, o)
	runtime.KeepAlive(li)
	runtime.KeepAlive(ri)
	if st != C.NXC_SUCCESS {
		C.nxc_destroy_opt_args(o)
		return nil, fmt.Errorf("make request: NIXL: %s", statusText(st))
	}
	a.reqs[r] = struct{}{}
	return r, nil
}

func (a *agent) CreateXferReq(op nixl.Op, mem nixl.MemType, local []nixl.Desc, remoteMem nixl.MemType, remoteDescs []nixl.Desc, remoteName string, notif []byte) (nixl.XferReq, error) {
	if len(local) != len(remoteDescs) {
		return nil, fmt.Errorf("create request: %d local descriptors but %d remote", len(local), len(remoteDescs))
	}
	var total int64
	for i := range local {
		if local[i].Len != remoteDescs[i].Len {
			return nil, fmt.Errorf("descriptor pair %d: %d vs %d bytes: %w", i, local[i].Len, remoteDescs[i].Len, nixl.ErrLengthMismatch)
		}
		total += int64(local[i].Len)
	}
	if err := a.lockOpen(); err != nil {
		return nil, err
	}
	defer a.mu.Unlock()
	rm, err := a.remoteLocked(remoteName)
	if err != nil {
		return nil, err
	}
	if err := a.checkLocalLocked(mem, local); err != nil {
		return nil, err
	}
	ldl, err := xferDlist(mem, local)
	if err != nil {
		return nil, err
	}
	defer C.nxc_destroy_xfer_dlist(ldl)
	rdl, err := xferDlist(remoteMem, remoteDescs)
	if err != nil {
		return nil, err
	}
	defer C.nxc_destroy_xfer_dlist(rdl)
	o, err := a.reqOpts(notif)
	if err != nil {
		return nil, err
	}
	n := C.CString(remoteName)
	defer C.free(unsafe.Pointer(n))
	r := &request{a: a, opt: o, remote: rm, XferInfo: nixl.NewXferInfo(op, total, len(local), rm.name)}
	if st := C.nxc_create_xfer_req(a.h, xferOp(op), ldl, rdl, n, &r.h, o); st != C.NXC_SUCCESS {
		C.nxc_destroy_opt_args(o)
		return nil, a.whyRemoteFailedLocked(remoteName, rdl, "create request", st)
	}
	a.reqs[r] = struct{}{}
	return r, nil
}

// reqLocked checks that a request can be used.
func (a *agent) reqLocked(x nixl.XferReq) (*request, error) {
	r, ok := x.(*request)
	if !ok || r.a != a {
		return nil, fmt.Errorf("request was not made by this agent")
	}
	if a.closed {
		return nil, nixl.ErrClosed
	}
	if r.freed {
		if r.remote.invalid {
			return nil, fmt.Errorf("%w: %s was invalidated", nixl.ErrUnknownAgent, r.remote.name)
		}
		return nil, fmt.Errorf("request already released")
	}
	return r, nil
}

// inFlightLocked says whether a posted request is still running: no once
// a status call saw it end (settled), else NIXL is asked.
func (a *agent) inFlightLocked(r *request) bool {
	return r.posted && !r.freed && !r.settled && C.nxc_get_xfer_status(a.h, r.h) == C.NXC_IN_PROG
}

func (a *agent) PostXferReq(x nixl.XferReq) (nixl.Status, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	r, err := a.reqLocked(x)
	if err != nil {
		return nixl.Failed, err
	}
	if a.inFlightLocked(r) {
		return nixl.InProgress, fmt.Errorf("post: %w", nixl.ErrInFlight)
	}
	r.posted, r.teleOK = true, false
	st := C.nxc_post_xfer_req(a.h, r.h, r.opt)
	r.settled = st != C.NXC_IN_PROG
	return r.status(st, "post")
}

// status maps what NIXL says about a posted request. NIXL folds a
// disconnected peer, a failed transport and most else into one "backend
// error"; once a request was accepted, that means the transfer itself
// failed, so it is reported as the peer failing.
func (r *request) status(st C.nxc_status_t, what string) (nixl.Status, error) {
	switch {
	case st == C.NXC_SUCCESS:
		return nixl.Done, nil
	case st == C.NXC_IN_PROG:
		return nixl.InProgress, nil
	case st == C.NXC_ERR_BACKEND:
		return nixl.Failed, fmt.Errorf("%s: transfer to %s failed: %w (NIXL: %s)", what, r.remote.name, nixl.ErrPeerFailed, statusText(st))
	case st == C.NXC_ERR_NOT_FOUND && !r.remote.invalid:
		// NIXL drops a peer's metadata by itself when one of its transfers
		// sees the peer disconnect; the others then find it gone.
		return nixl.Failed, fmt.Errorf("%s: transfer to %s failed: %w (NIXL dropped it after it disconnected)", what, r.remote.name, nixl.ErrPeerFailed)
	}
	return nixl.Failed, fmt.Errorf("%s: transfer to %s failed: NIXL: %s", what, r.remote.name, statusText(st))
}

func (a *agent) XferStatus(x nixl.XferReq) (nixl.Status, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	r, err := a.reqLocked(x)
	if err != nil {
		return nixl.Failed, err
	}
	if !r.posted {
		return nixl.Failed, fmt.Errorf("request was never posted")
	}
	st := C.nxc_status_telemetry(a.h, r.h, &r.tele, &r.teleRead)
	if st != C.NXC_IN_PROG {
		r.settled, r.teleOK = true, bool(r.teleRead)
	}
	return r.status(st, "status")
}

// ReleaseXferReq frees a request that is not running. NIXL itself would
// cancel a running one; nixlctl's agents refuse instead, so that a
// benchmark never measures a transfer it has half torn down.
func (a *agent) ReleaseXferReq(x nixl.XferReq) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	r, ok := x.(*request)
	if !ok || r.a != a {
		return fmt.Errorf("request was not made by this agent")
	}
	if a.closed || (r.freed && r.remote.invalid) {
		return nil // freed at Close or when its remote was invalidated
	}
	if r.freed {
		return fmt.Errorf("request already released")
	}
	if a.inFlightLocked(r) {
		return fmt.Errorf("release: %w", nixl.ErrInFlight)
	}
	return a.freeReqLocked(r)
}

// freeReqLocked releases a request in NIXL, which cancels it if it still
// runs, then frees the C wrapper and the options.
func (a *agent) freeReqLocked(r *request) error {
	if r.freed {
		return nil
	}
	var err error
	if st := C.nxc_release_xfer_req(a.h, r.h); st != C.NXC_SUCCESS {
		// NIXL keeps the request; it goes with the agent.
		err = fmt.Errorf("release: NIXL: %s", statusText(st))
	} else {
		C.nxc_destroy_xfer_req(r.h)
	}
	C.nxc_destroy_opt_args(r.opt)
	r.h, r.opt, r.freed = nil, nil, true
	delete(a.reqs, r)
	return err
}

// Telemetry is NIXL's own record of the request's last posting; until
// it finished, only the size is known. NIXL times both durations from the
// start of the post (a transfer done within the post gets the same value
// twice), and it sees the end when a status poll does; nixl.Telemetry's
// transfer time starts where the post ends, hence the subtraction.
func (a *agent) Telemetry(x nixl.XferReq) nixl.Telemetry {
	r, ok := x.(*request)
	if !ok || r.a != a {
		return nixl.Telemetry{}
	}
	t := nixl.Telemetry{Bytes: r.Bytes(), Descs: r.Descs()}
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.closed || r.freed || !r.posted {
		return t
	}
	// Read with the status that saw the request end, else now (into
	// r.tele: a local whose address goes to C is moved to the heap).
	if !r.teleOK && C.nxc_get_xfer_telemetry(a.h, r.h, &r.tele) != C.NXC_SUCCESS {
		return t
	}
	ct := r.tele
	// NIXL's start_time_us is on the monotonic clock (despite its header's
	// comment), the clock internal/mono reads.
	t.Start = int64(ct.start_time_us) * 1000
	t.PostDuration = time.Duration(ct.post_duration_us) * time.Microsecond
	if ct.xfer_duration_us > ct.post_duration_us {
		t.XferDuration = time.Duration(ct.xfer_duration_us-ct.post_duration_us) * time.Microsecond
	}
	t.Bytes = int64(ct.total_bytes)
	t.Descs = int(ct.desc_count)
	return t
}

func (a *agent) SendNotif(remoteName string, msg []byte) error {
	if err := a.lockOpen(); err != nil {
		return err
	}
	defer a.mu.Unlock()
	if _, err := a.remoteLocked(remoteName); err != nil {
		return err
	}
	n := C.CString(remoteName)
	defer C.free(unsafe.Pointer(n))
	var p unsafe.Pointer
	if len(msg) > 0 {
		p = unsafe.Pointer(&msg[0])
	}
	st := C.nxc_gen_notif(a.h, n, p, C.size_t(len(msg)), a.opt)
	runtime.KeepAlive(msg)
	switch st {
	case C.NXC_SUCCESS:
		return nil
	case C.NXC_ERR_NOT_FOUND:
		return fmt.Errorf("notify: %w: %s", nixl.ErrUnknownAgent, remoteName)
	case C.NXC_ERR_BACKEND:
		return fmt.Errorf("notify %s: %w (NIXL: %s)", remoteName, nixl.ErrPeerFailed, statusText(st))
	}
	return fmt.Errorf("notify %s: NIXL: %s", remoteName, statusText(st))
}

func (a *agent) GetNotifs() (nixl.Notifs, error) {
	if err := a.lockOpen(); err != nil {
		return nil, err
	}
	defer a.mu.Unlock()
	if _, err := a.fetchLocked(); err != nil && len(a.pending) == 0 {
		return nil, err
	}
	out := a.pending
	a.pending = nixl.Notifs{}
	return out, nil
}

// fetchLocked moves NIXL's new notifications into the pending queue and
// says how many there were. NIXL's map lends its bytes only until the next
// call, so they are copied at once.
func (a *agent) fetchLocked() (int, error) {
	f := &a.fetch
	if st := C.nxc_poll_notifs(a.h, a.nmap, &f.senders); st != C.NXC_SUCCESS {
		return 0, fmt.Errorf("get notifications: NIXL: %s", statusText(st))
	}
	senders := f.senders
	if senders == 0 {
		return 0, nil // nxc_poll_notifs cleared the map
	}
	defer C.nxc_notif_map_clear(a.nmap)
	got := 0
	// Indices stay below the size NIXL reported: past it NIXL would walk
	// off the end of its map.
	for i := C.size_t(0); i < senders; i++ {
		f.name = nil
		if C.nxc_notif_map_get_agent_at(a.nmap, i, &f.name) != C.NXC_SUCCESS || f.name == nil {
			continue
		}
		cname := f.name
		sender := C.GoString(cname)
		if C.nxc_notif_map_get_notifs_size(a.nmap, cname, &f.n) != C.NXC_SUCCESS {
			continue
		}
		n := f.n
		for j := C.size_t(0); j < n; j++ {
			if C.nxc_notif_map_get_notif(a.nmap, cname, j, &f.data, &f.len) != C.NXC_SUCCESS {
				continue
			}
			d, l := f.data, f.len
			msg := []byte{}
			if l > 0 {
				msg = C.GoBytes(d, C.int(l))
			}
			a.pending[sender] = append(a.pending[sender], msg)
			got++
		}
	}
	return got, nil
}

func (a *agent) NotifReady() <-chan struct{} { return a.notifyCh }

// pollNotifs is the goroutine described at notifPollMin.
func (a *agent) pollNotifs() {
	defer close(a.pollDone)
	wait := notifPollMin
	t := time.NewTimer(wait)
	defer t.Stop()
	// A spinning agent looks for notifications without pause, which also
	// progresses its worker (NIXL's get_notifs does without a progress
	// thread), as nixlbench's target does.
	spin := a.progress == nixl.ProgressSpin
	spinN, busy := 0, 0
	for {
		if spin {
			select {
			case <-a.stop:
				return
			default:
			}
			// Yield to the scheduler every 1,024 polls (about a
			// millisecond): a Gosched per poll spent as much of the
			// target's CPU in Go's scheduler as in NIXL, on a host where
			// the initiator spins too and two cores are all there is;
			// never yielding, sysmon takes the spinner for stuck and
			// preempts it and hands its P around, waking threads
			// hundreds to thousands of times a second (see bench's xfer
			// loop). Not on a locked thread: there every yield is two
			// thread switches.
			if spinN++; spinN&1023 == 0 {
				runtime.Gosched()
			}
		} else {
			select {
			case <-a.stop:
				return
			case <-t.C:
			}
		}
		switch {
		case spin:
			a.mu.Lock()
		case a.mu.TryLock():
			busy = 0
		case busy < maxBusySkips:
			// The agent is in use: its caller's calls progress NIXL
			// anyway, and waiting here for the mutex turned every unlock
			// of a caller polling a transfer into a wake-up of this
			// goroutine's thread (thousands a second, each preempting the
			// caller on a small host). Look again at the next tick, but
			// not forever: a consumer waiting on NotifReady behind a
			// caller that never lets go would wait for good.
			busy++
			t.Reset(wait)
			continue
		default:
			a.mu.Lock()
			busy = 0
		}
		if a.closed {
			a.mu.Unlock()
			return
		}
		n, _ := a.fetchLocked()
		ready := len(a.pending) > 0
		a.mu.Unlock()
		if ready {
			select {
			case a.notifyCh <- struct{}{}:
			default:
			}
		}
		if spin {
			continue // no timer: resetting one per poll cost the spin its pace
		}
		if n > 0 {
			wait = notifPollMin
		} else {
			wait = min(2*wait, notifPollMax)
		}
		t.Reset(wait)
	}
}

// Close frees everything. Requests still running get closeGrace to finish
// and are then cancelled by NIXL, so Close does not hang on a dead peer.
// Handles stay safe to use and report ErrClosed.
func (a *agent) Close() error {
	a.mu.Lock()
	if a.closed {
		a.mu.Unlock()
		return nil
	}
	a.closed = true
	close(a.stop)
	a.mu.Unlock()
	<-a.pollDone

	a.mu.Lock()
	defer a.mu.Unlock()
	deadline := time.Now().Add(closeGrace)
	for r := range a.reqs {
		for a.inFlightLocked(r) && time.Now().Before(deadline) {
			a.mu.Unlock()
			time.Sleep(time.Millisecond)
			a.mu.Lock()
		}
	}
	var errs []error
	for r := range a.reqs {
		if err := a.freeReqLocked(r); err != nil {
			errs = append(errs, err)
		}
	}
	for d := range a.dlists {
		a.freeDlistLocked(d)
	}
	for b, r := range a.regs {
		if st := C.nxc_deregister_mem(a.h, r.dl, a.opt); st != C.NXC_SUCCESS {
			errs = append(errs, fmt.Errorf("deregister %#x: NIXL: %s", b.Addr, statusText(st)))
		}
		C.nxc_destroy_reg_dlist(r.dl)
	}
	a.regs = nil
	for _, rm := range a.remotes {
		rm.invalid = true
	}
	a.destroy()
	return errors.Join(errs...)
}
