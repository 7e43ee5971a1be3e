// Package cudaipc is the "cuda-ipc" transfer backend: GPU memory moved
// between processes on one node, on one GPU or between GPUs, through CUDA
// IPC and the CUDA driver loaded at run time (package cuda). It needs
// neither NIXL nor a CUDA-enabled UCX, so KV transfers in VRAM can be
// measured on any single NVIDIA node.
//
// How it works:
//   - RegisterMem exports each VRAM buffer with cuIpcGetMemHandle; the
//     agent metadata carries, per region, the handle of its allocation and
//     the region's offset in it (Regions[].Key), and in Conn the agent's
//     notification socket and GPU.
//   - LoadRemoteMD maps the peer's regions with cuIpcOpenMemHandle into
//     this agent's GPU (peer access enabled as needed), so a remote
//     address translates to a local device address.
//   - A READ or WRITE is one batch of cuMemcpyDtoDAsync on a stream per
//     peer, followed by a cuEventRecord: one call into C per post.
//     XferStatus asks the event (cuEventQuery); a completion goroutine
//     waits on the oldest outstanding event with blocking sync, so
//     transfers finish and notifications go out even when nobody polls,
//     and no thread spins while copies run or when idle.
//   - Notifications travel over a unix SOCK_SEQPACKET socket per agent
//     (abstract namespace, named in the metadata); one attached to a
//     transfer is sent only after the transfer's event completed, so the
//     data is in the target's memory when the notification arrives.
//     Received ones are queued by sender name.
//   - A same-host peer's process is watched (as the ucx backend does):
//     when it dies its transfers fail with nixl.ErrPeerFailed.
//
// It moves VRAM only: DRAM registration is refused with nixl.ErrMemType.
package cudaipc

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/nixlctl/nixlctl/internal/nixl"
	"github.com/nixlctl/nixlctl/internal/nixl/cuda"
)

const backendName = "cuda-ipc"

func init() {
	nixl.Register(nixl.Backend{Name: backendName, New: New, Available: cuda.Available, Version: cuda.Version})
}

// Request states. A request is finishing while one goroutine sends its
// notification; exactly one goroutine moves it out of running.
const (
	stIdle int32 = iota
	stRunning
	stFinishing
	stDone
	stFailed
)

// notifWriteTimeout bounds a notification send to a peer that stopped
// reading (a hung process): the transfer then fails instead of hanging.
const notifWriteTimeout = 10 * time.Second

type agent struct {
	name string
	nixl.Book[*peer, *request, struct{}]

	dev      int           // the agent's GPU: that of its first registered buffer; -1 before
	pending  []pendingItem // posted transfers for the completion goroutine
	accepted map[*net.UnixConn]struct{}

	// life guards CUDA objects against destruction while in use outside
	// mu: XferStatus queries events under RLock; whoever destroys takes it
	// exclusively.
	life sync.RWMutex

	ln   *net.UnixListener
	sock string

	qmu       sync.Mutex
	queue     []received
	notifyCh  chan struct{}
	malformed atomic.Uint64

	work chan struct{} // wakes the completion goroutine
	stop chan struct{}
	wg   sync.WaitGroup
}

type received struct {
	from string
	msg  []byte
}

type pendingItem struct {
	r   *request
	gen uint64
}

type peer struct {
	name     string
	proc     nixl.Process
	conn     connInfo
	sameProc bool // in this process: its device pointers are valid here as they are
	watch    bool // liveness checked by pid
	regions  []*remoteRegion
	opened   map[cuda.IPCHandle]uint64 // IPC mappings, by handle
	stream   *cuda.Stream              // on the agent's GPU, created at first use
	notify   *net.UnixConn
	nmu      sync.Mutex // serialises sends on notify
	invalid  bool
	dead     atomic.Bool
}

type remoteRegion struct {
	nixl.RegionMD
	key   ipcKey
	local uint64 // this process's address of the region's start; 0 until mapped
}

// New creates a cuda-ipc agent.
func New(cfg nixl.Config) (nixl.Agent, error) {
	if err := cuda.Err(); err != nil {
		return nil, err
	}
	if cfg.Name == "" || len(cfg.Name) > 255 {
		return nil, fmt.Errorf("agent name must be 1..255 bytes")
	}
	var rnd [8]byte
	if _, err := rand.Read(rnd[:]); err != nil {
		return nil, err
	}
	// An abstract socket: nothing in the file system to clean up after a
	// crash, and reachable by processes of this host's network namespace.
	sock := fmt.Sprintf("@nixlctl-cuda-ipc-%d-%s", os.Getpid(), hex.EncodeToString(rnd[:]))
	ln, err := net.ListenUnix("unixpacket", &net.UnixAddr{Name: sock, Net: "unixpacket"})
	if err != nil {
		return nil, fmt.Errorf("cuda-ipc notification socket: %w", err)
	}
	a := &agent{name: cfg.Name, dev: -1,
		accepted: map[*net.UnixConn]struct{}{}, ln: ln, sock: sock,
		notifyCh: make(chan struct{}, 1), work: make(chan struct{}, 1), stop: make(chan struct{})}
	a.Init(backendName, a.dropPeerLocked, (*request).inFlight)
	a.wg.Add(3)
	go a.accept()
	go a.complete()
	go a.watchPeers()
	return a, nil
}

func (a *agent) Name() string { return a.name }

func (a *agent) Info() nixl.Info {
	info := nixl.Info{Backend: backendName, Version: cuda.Version(), Details: map[string]string{}}
	a.Lock()
	defer a.Unlock()
	if a.Closed() {
		return info
	}
	if a.dev >= 0 {
		name, _ := cuda.DeviceName(a.dev)
		uuid, _ := cuda.DeviceUUID(a.dev)
		info.Details["device"] = fmt.Sprintf("GPU %d: %s (%s)", a.dev, name, uuid)
	}
	for name, p := range a.PeersLocked() {
		info.Details["transport:"+name] = a.describeLocked(p)
	}
	return info
}

// describeLocked says how bytes move to a peer, for results.
func (a *agent) describeLocked(p *peer) string {
	var path string
	switch uuid, _ := cuda.DeviceUUID(max(a.dev, 0)); {
	case p.sameProc:
		path = "same process: direct device pointers"
	case a.dev < 0 || p.conn.Dev < 0:
		path = "CUDA IPC (GPUs not known until memory is registered)"
	case p.conn.UUID == uuid:
		path = fmt.Sprintf("CUDA IPC on one GPU (%s)", uuid)
	default:
		path = fmt.Sprintf("CUDA IPC between GPUs %s -> %s (peer access over NVLink or PCIe)", uuid, p.conn.UUID)
	}
	live := "peer process watched"
	if !p.watch {
		live = "peer liveness not checked (other pid namespace)"
	}
	if p.sameProc {
		live = "same process"
	}
	return fmt.Sprintf("%s; copies: cuMemcpyDtoDAsync on a stream per peer, completion by CUDA events; notifications: unix seqpacket; %s", path, live)
}

func (a *agent) RegisterMem(b *nixl.Buffer) error {
	return a.Register(b, nixl.VRAM, "cuda-ipc moves GPU memory only (use --backend ucx for DRAM)", func(r *nixl.Reg[struct{}]) error {
		if a.dev >= 0 && int(b.Dev) != a.dev {
			return fmt.Errorf("register: a cuda-ipc agent uses one GPU (GPU %d); register GPU %d's memory with another agent, one per GPU as engines do", a.dev, b.Dev)
		}
		alloc, err := cuda.ExportIPC(int(b.Dev), b.Addr)
		if err != nil {
			return fmt.Errorf("register %d bytes at %#x: %w", b.Len, b.Addr, err)
		}
		off := b.Addr - alloc.Base
		if uint64(b.Len) > alloc.Size-off {
			return fmt.Errorf("register: buffer %#x+%d runs past its allocation %#x+%d", b.Addr, b.Len, alloc.Base, alloc.Size)
		}
		r.Key = encodeKey(ipcKey{Offset: off, Size: alloc.Size, Handle: alloc.Handle})
		a.dev = int(b.Dev)
		return nil
	})
}

func (a *agent) DeregisterMem(b *nixl.Buffer) error { return a.Deregister(b, nil) }

func (a *agent) LocalMD() ([]byte, error) {
	return a.EncodeLocalMD(a.name, func() ([]byte, error) {
		ci := connInfo{Sock: a.sock, Dev: int32(a.dev)}
		if a.dev >= 0 {
			ci.UUID, _ = cuda.DeviceUUID(a.dev)
		}
		return encodeConn(ci), nil
	})
}

func (a *agent) LoadRemoteMD(data []byte) (string, error) {
	md, err := a.DecodeRemoteMD(data)
	if err != nil {
		return "", err
	}
	ci, err := decodeConn(md.Conn)
	if err != nil {
		return "", err
	}
	self := nixl.Self()
	if md.Proc.Host == "" || md.Proc.Host != self.Host {
		return "", fmt.Errorf("%w: agent %s runs on another host; cuda-ipc moves data within one node", nixl.ErrUnavailable, md.Name)
	}
	p := &peer{name: md.Name, proc: md.Proc, conn: ci, opened: map[cuda.IPCHandle]uint64{},
		sameProc: md.Proc.PID == self.PID && md.Proc.PIDNS == self.PIDNS}
	p.watch = !p.sameProc && nixl.SameHost(md.Proc)
	for i, r := range md.Regions {
		if r.Mem != nixl.VRAM {
			return "", fmt.Errorf("%w: region %d of %s is %s; cuda-ipc regions are VRAM", nixl.ErrBadMetadata, i, md.Name, r.Mem)
		}
		k, err := decodeKey(r.Key, r.Len)
		if err != nil {
			return "", fmt.Errorf("region %d of %s: %w", i, md.Name, err)
		}
		p.regions = append(p.regions, &remoteRegion{RegionMD: r, key: k})
	}

	if err := a.LockOpen(); err != nil {
		return "", err
	}
	defer a.Unlock()
	if loaded, err := a.ReloadLocked(md.Name, data); loaded || err != nil {
		return md.Name, err
	}
	c, err := net.DialUnix("unixpacket", nil, &net.UnixAddr{Name: ci.Sock, Net: "unixpacket"})
	if err != nil {
		return "", fmt.Errorf("%w: %s: notification socket: %v", nixl.ErrPeerFailed, md.Name, err)
	}
	p.notify = c
	if a.dev >= 0 {
		// Map the peer's memory now, so a bad handle is reported here.
		for _, r := range p.regions {
			if err := a.mapLocked(p, r); err != nil {
				a.dropPeerLocked(p)
				return "", err
			}
		}
	}
	a.AddPeerLocked(md.Name, data, p)
	return md.Name, nil
}

// mapLocked makes a remote region addressable from this agent's GPU.
func (a *agent) mapLocked(p *peer, r *remoteRegion) error {
	if r.local != 0 {
		return nil
	}
	if a.dev < 0 {
		return fmt.Errorf("register local VRAM before preparing transfers: cuda-ipc maps peers' memory into this agent's GPU")
	}
	if p.sameProc {
		// One address space: the pointer is valid here; another GPU of
		// this process needs peer access for direct copies.
		if int(r.Dev) != a.dev {
			if err := cuda.EnablePeerAccess(a.dev, int(r.Dev)); err != nil {
				return err
			}
		}
		r.local = r.Addr
		return nil
	}
	base, ok := p.opened[r.key.Handle]
	if !ok {
		var err error
		if base, err = cuda.OpenIPC(a.dev, r.key.Handle); err != nil {
			if p.watch && !nixl.Alive(p.proc) {
				return fmt.Errorf("%w: %s exited: %v", nixl.ErrPeerFailed, p.name, err)
			}
			return fmt.Errorf("%w: %s: opening the IPC handle of region %#x: %v", nixl.ErrBadMetadata, p.name, r.Addr, err)
		}
		p.opened[r.key.Handle] = base
	}
	r.local = base + r.key.Offset
	return nil
}

// dropPeerLocked releases what a peer holds. Copies still queued on its
// stream (of requests failed by the watchdog) finish before its mappings
// go away: unmapping memory a copy is about to touch would fault the GPU.
func (a *agent) dropPeerLocked(p *peer) {
	p.invalid = true
	if p.stream != nil {
		_ = p.stream.Synchronize()
		_ = p.stream.Destroy()
		p.stream = nil
	}
	for _, base := range p.opened {
		_ = cuda.CloseIPC(a.dev, base)
	}
	p.opened = nil
	for _, r := range p.regions {
		r.local = 0
	}
	if p.notify != nil {
		p.notify.Close()
	}
}

// dlist is a prepared descriptor list: device addresses valid in this
// process (remote ones translated through the peer's mappings).
type dlist struct {
	a      *agent
	remote *peer
	addrs  []uint64
	lens   []uint64
}

func (d *dlist) Len() int { return len(d.addrs) }
func (d *dlist) Remote() string {
	if d.remote == nil {
		return ""
	}
	return d.remote.name
}

func (a *agent) PrepXferDlist(remote string, mem nixl.MemType, descs []nixl.Desc) (nixl.Dlist, error) {
	if mem != nixl.VRAM {
		return nil, fmt.Errorf("%w: cuda-ipc moves VRAM only (descriptors of %s)", nixl.ErrMemType, mem)
	}
	if err := a.LockOpen(); err != nil {
		return nil, err
	}
	defer a.Unlock()
	d := &dlist{a: a, addrs: make([]uint64, len(descs)), lens: make([]uint64, len(descs))}
	if remote == "" {
		if err := a.CheckLocalLocked(descs); err != nil {
			return nil, err
		}
		for i, ds := range descs {
			d.addrs[i], d.lens[i] = ds.Addr, ds.Len
		}
		return d, nil
	}
	p, err := a.PeerLocked(remote)
	if err != nil {
		return nil, err
	}
	d.remote = p
	err = nixl.Locate(remote, descs, len(p.regions), func(j int, ds nixl.Desc) bool { return p.regions[j].Contains(ds) },
		func(i, j int) error {
			r := p.regions[j]
			if err := a.mapLocked(p, r); err != nil { // at once if mapped already
				return err
			}
			d.addrs[i], d.lens[i] = r.local+(descs[i].Addr-r.Addr), descs[i].Len
			return nil
		})
	if err != nil {
		return nil, err
	}
	return d, nil
}

func (a *agent) ReleaseDlist(d nixl.Dlist) error { return nixl.ReleaseDlist[*dlist](d, "cuda-ipc") }

// request is a transfer request. state moves idle -> running -> (finishing
// ->) done|failed, and back to running on a repost; gen counts postings
// so that a completion seen for an old posting never finishes a new one.
type request struct {
	nixl.ReqHead
	peer  *peer
	ops   []cuda.Copy
	notif []byte

	state   atomic.Int32
	gen     atomic.Uint64
	err     error       // why it failed; written before state is stored
	ev      *cuda.Event // created at the first post
	pins    int         // completion goroutine waiting on ev (under a.mu)
	evFreed bool        // under a.mu
	t0, t1  time.Time   // post start and end (under a.mu)
	tDone   time.Time   // written before state is stored
}

// fail ends a posting in flight with err (under the agent's lock).
func (r *request) fail(err error) {
	r.err, r.tDone = err, time.Now()
	r.state.Store(stFailed)
}

func (r *request) inFlight() bool {
	st := r.state.Load()
	return st == stRunning || st == stFinishing
}

func (a *agent) MakeXferReq(op nixl.Op, local nixl.Dlist, localIdx []int, remote nixl.Dlist, remoteIdx []int, notif []byte) (nixl.XferReq, error) {
	l, rm, err := nixl.XferLists(local, remote, func(d *dlist) bool { return d.a == a })
	if err != nil {
		return nil, err
	}
	if len(notif) > maxNotif {
		return nil, fmt.Errorf("make request: notification of %d bytes (at most %d)", len(notif), maxNotif)
	}
	ops := make([]cuda.Copy, 0, len(localIdx))
	total, err := nixl.PairIndices(localIdx, remoteIdx, len(l.addrs), len(rm.addrs),
		func(i int) uint64 { return uint64(l.lens[i]) }, func(i int) uint64 { return uint64(rm.lens[i]) },
		func(_, li, ri int) {
			if l.lens[li] == 0 {
				return
			}
			c := cuda.Copy{Dst: rm.addrs[ri], Src: l.addrs[li], Len: l.lens[li]}
			if op == nixl.Read {
				c.Dst, c.Src = c.Src, c.Dst
			}
			ops = append(ops, c)
		})
	if err != nil {
		return nil, err
	}
	if err := a.LockOpen(); err != nil {
		return nil, err
	}
	defer a.Unlock()
	if rm.remote.invalid {
		return nil, fmt.Errorf("%w: %s", nixl.ErrUnknownAgent, rm.remote.name)
	}
	r := &request{ReqHead: nixl.ReqHead{XferInfo: nixl.NewXferInfo(op, total, len(localIdx), rm.remote.name)}, peer: rm.remote, ops: ops, notif: append([]byte(nil), notif...)}
	a.AddReqLocked(r, rm.remote)
	return r, nil
}

func (a *agent) CreateXferReq(op nixl.Op, mem nixl.MemType, local []nixl.Desc, remoteMem nixl.MemType, remote []nixl.Desc, remoteName string, notif []byte) (nixl.XferReq, error) {
	return nixl.CreateXferReqByPrep(a, op, mem, local, remoteMem, remote, remoteName, notif)
}

func (a *agent) PostXferReq(x nixl.XferReq) (nixl.Status, error) {
	r, err := a.LockReq(x)
	if err != nil {
		return nixl.Failed, err
	}
	p := r.peer
	switch {
	case p.invalid:
		a.Unlock()
		return nixl.Failed, fmt.Errorf("%w: %s was invalidated", nixl.ErrUnknownAgent, p.name)
	case r.inFlight():
		a.Unlock()
		return nixl.InProgress, fmt.Errorf("post: %w", nixl.ErrInFlight)
	case p.dead.Load():
		a.Unlock()
		return nixl.Failed, fmt.Errorf("%w: %s: its process exited", nixl.ErrPeerFailed, p.name)
	}
	if err := a.prepareLocked(r); err != nil {
		a.Unlock()
		return nixl.Failed, err
	}
	gen := r.gen.Add(1)
	r.err, r.tDone = nil, time.Time{}
	r.t0 = time.Now()
	n, cerr := p.stream.Copy(r.ops, r.ev)
	r.t1 = time.Now()
	if cerr != nil {
		// The copies before the refused one were queued: let them finish
		// so that a failed request is really over.
		_ = p.stream.Synchronize()
		r.fail(fmt.Errorf("post to %s: copy %d of %d: %w", p.name, n+1, len(r.ops), cerr))
		a.Unlock()
		return nixl.Failed, r.err
	}
	// Running only now that the event marks this posting's copies: a
	// poller that saw running earlier would query the event of the
	// previous posting and finish this one before its data moved.
	r.state.Store(stRunning)
	a.pending = append(a.pending, pendingItem{r, gen})
	a.Unlock()
	select {
	case a.work <- struct{}{}:
	default:
	}
	return a.XferStatus(r)
}

// prepareLocked creates the peer's stream and the request's event on first
// use.
func (a *agent) prepareLocked(r *request) error {
	var err error
	if r.peer.stream == nil {
		if r.peer.stream, err = cuda.NewStream(a.dev); err != nil {
			return fmt.Errorf("post: %w", err)
		}
	}
	if r.ev == nil {
		if r.ev, err = cuda.NewEvent(a.dev); err != nil {
			return fmt.Errorf("post: %w", err)
		}
	}
	return nil
}

func (a *agent) XferStatus(x nixl.XferReq) (nixl.Status, error) {
	r, err := a.OpenReq(x)
	if err != nil {
		return nixl.Failed, err
	}
	// The posting's number before its state: a repost numbers itself
	// before its copies re-record the event and marks itself running only
	// after, so running seen after this number belongs to it (or a later
	// one, which finish refuses). Read the other way round, a poller that
	// saw the previous posting running could take the new number and the
	// old event's "done" and notify before the new copies ran.
	gen := r.gen.Load()
	if r.state.Load() == stRunning {
		a.life.RLock()
		done, qerr := false, error(nil)
		if !r.Released() && !a.Closed() {
			done, qerr = r.ev.Query()
		}
		a.life.RUnlock()
		if done || qerr != nil {
			a.finish(r, gen, qerr)
		}
	}
	switch r.state.Load() {
	case stDone:
		return nixl.Done, nil
	case stFailed:
		return nixl.Failed, r.err
	case stIdle:
		return nixl.Failed, fmt.Errorf("request was never posted")
	}
	return nixl.InProgress, nil
}

// finish completes posting gen of r once its copies are done (cerr: the
// driver's error while waiting): it sends the attached notification, now
// that the data is at the target, and publishes the outcome. Whoever gets
// here first, a poller or the completion goroutine, does it; the rest
// return.
func (a *agent) finish(r *request, gen uint64, cerr error) {
	a.Lock()
	if r.gen.Load() != gen || r.state.Load() != stRunning {
		a.Unlock()
		return
	}
	r.state.Store(stFinishing)
	p := r.peer
	a.Unlock()
	err := cerr
	if err != nil {
		err = fmt.Errorf("transfer to %s: %w", p.name, err)
	} else if len(r.notif) > 0 {
		err = a.send(p, r.notif)
	}
	a.Lock()
	defer a.Unlock()
	if r.state.Load() != stFinishing {
		return // failed by the watchdog meanwhile
	}
	r.err, r.tDone = err, time.Now()
	if err != nil {
		r.state.Store(stFailed)
	} else {
		r.state.Store(stDone)
	}
}

// complete is the completion goroutine: it waits, with blocking sync, on
// each posted transfer's event in posting order and finishes it, so
// transfers complete and notifications go out with nobody polling. It
// sleeps on a channel when nothing is in flight. Posting order means a
// long transfer to one peer delays the unpolled completion of later ones
// to other peers; a caller that polls (XferStatus) is never delayed.
func (a *agent) complete() {
	defer a.wg.Done()
	for {
		select {
		case <-a.stop:
			return
		case <-a.work:
		}
		for {
			a.Lock()
			if len(a.pending) == 0 || a.Closed() {
				a.pending = nil
				a.Unlock()
				break
			}
			it := a.pending[0]
			a.pending = a.pending[1:]
			r := it.r
			if r.Released() || r.gen.Load() != it.gen || r.state.Load() != stRunning {
				a.Unlock()
				continue
			}
			r.pins++
			ev := r.ev
			a.Unlock()
			err := ev.Wait()
			a.finish(r, it.gen, err)
			a.Lock()
			r.pins--
			free := r.Released() && r.pins == 0 && !r.evFreed
			if free {
				r.evFreed = true
			}
			a.Unlock()
			if free {
				a.life.Lock()
				_ = ev.Destroy()
				a.life.Unlock()
			}
		}
	}
}

func (a *agent) ReleaseXferReq(x nixl.XferReq) error {
	var free *cuda.Event
	err := a.ReleaseReq(x, func(r *request) error {
		if r.inFlight() {
			return fmt.Errorf("release: %w", nixl.ErrInFlight)
		}
		if r.ev != nil && r.pins == 0 && !r.evFreed {
			r.evFreed = true
			free = r.ev
		}
		return nil
	})
	if free != nil {
		// The event may still have copies of a failed posting queued
		// before it; the driver frees it once they ran. Not under the
		// agent's lock: life is taken before it (Close).
		a.life.Lock()
		_ = free.Destroy()
		a.life.Unlock()
	}
	return err
}

func (a *agent) Telemetry(x nixl.XferReq) nixl.Telemetry {
	r, ok := x.(*request)
	if !ok || r.Released() {
		return nixl.Telemetry{}
	}
	t := nixl.Telemetry{Bytes: r.Bytes(), Descs: r.Descs()}
	if st := r.state.Load(); st != stDone && st != stFailed {
		return t
	}
	a.Lock()
	defer a.Unlock()
	t.PostDuration = r.t1.Sub(r.t0)
	if !r.tDone.IsZero() && r.tDone.After(r.t1) {
		t.XferDuration = r.tDone.Sub(r.t1)
	}
	return t
}

func (a *agent) SendNotif(remote string, msg []byte) error {
	if len(msg) > maxNotif {
		return fmt.Errorf("notification of %d bytes (at most %d)", len(msg), maxNotif)
	}
	if err := a.LockOpen(); err != nil {
		return err
	}
	p, err := a.PeerLocked(remote)
	a.Unlock()
	if err != nil {
		return err
	}
	return a.send(p, msg)
}

// send writes one notification to p's socket.
func (a *agent) send(p *peer, msg []byte) error {
	if p.dead.Load() {
		return fmt.Errorf("%w: notify %s: its process exited", nixl.ErrPeerFailed, p.name)
	}
	p.nmu.Lock()
	defer p.nmu.Unlock()
	_ = p.notify.SetWriteDeadline(time.Now().Add(notifWriteTimeout))
	if _, err := p.notify.Write(encodeNotif(a.name, msg)); err != nil {
		if errors.Is(err, syscall.EPIPE) || errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.ECONNREFUSED) {
			p.dead.Store(true)
		}
		return fmt.Errorf("%w: notify %s: %v", nixl.ErrPeerFailed, p.name, err)
	}
	return nil
}

func (a *agent) GetNotifs() (nixl.Notifs, error) {
	if a.Closed() {
		return nil, nixl.ErrClosed
	}
	a.qmu.Lock()
	q := a.queue
	a.queue = nil
	a.qmu.Unlock()
	out := nixl.Notifs{}
	for _, n := range q {
		out[n.from] = append(out[n.from], n.msg)
	}
	return out, nil
}

func (a *agent) NotifReady() <-chan struct{} { return a.notifyCh }

// MalformedNotifs counts received messages that were not well-formed
// notifications (dropped).
func (a *agent) MalformedNotifs() uint64 { return a.malformed.Load() }

// accept takes connections from peers that loaded this agent's metadata;
// each gets a reader.
func (a *agent) accept() {
	defer a.wg.Done()
	for {
		c, err := a.ln.AcceptUnix()
		if err != nil {
			return // closed
		}
		a.Lock()
		if a.Closed() {
			a.Unlock()
			c.Close()
			return
		}
		a.accepted[c] = struct{}{}
		a.wg.Add(1)
		a.Unlock()
		go a.read(c)
	}
}

// read queues the notifications arriving on one peer's connection.
func (a *agent) read(c *net.UnixConn) {
	defer a.wg.Done()
	defer func() {
		a.Lock()
		delete(a.accepted, c)
		a.Unlock()
		c.Close()
	}()
	buf := make([]byte, 2+255+maxNotif+1)
	for {
		n, _, flags, _, err := c.ReadMsgUnix(buf, nil)
		if err != nil || n == 0 {
			return // the peer closed, or we did
		}
		from, msg, derr := decodeNotif(buf[:n])
		if derr != nil || flags&syscall.MSG_TRUNC != 0 {
			a.malformed.Add(1)
			continue
		}
		a.qmu.Lock()
		a.queue = append(a.queue, received{from, msg})
		a.qmu.Unlock()
		select {
		case a.notifyCh <- struct{}{}:
		default:
		}
	}
}

// watchPeers fails the transfers of same-host peers whose process died,
// within about nixl.PeerWatchPeriod: an IPC mapping outlives its
// exporter, so nothing in CUDA would ever notice.
func (a *agent) watchPeers() {
	defer a.wg.Done()
	a.WatchPeers(a.stop, func(p *peer) {
		if !p.watch || p.dead.Load() || nixl.Alive(p.proc) {
			return
		}
		p.dead.Store(true)
		err := fmt.Errorf("%w: %s: its process exited", nixl.ErrPeerFailed, p.name)
		for r, rp := range a.InFlightLocked() {
			if rp == p {
				r.fail(err)
			}
		}
	})
}

// Close waits for copies in flight (bounded: the GPU finishes them),
// fails what was not finished, and frees every CUDA object and socket.
// Handles stay safe to use: they report ErrClosed.
func (a *agent) Close() error {
	a.Lock()
	if !a.CloseLocked() {
		a.Unlock()
		return nil
	}
	var peers []*peer
	for _, p := range a.PeersLocked() {
		peers = append(peers, p)
		if p.stream != nil {
			_ = p.stream.Synchronize() // the completion goroutine's wait ends
		}
	}
	for r := range a.InFlightLocked() {
		r.fail(nixl.ErrClosed)
	}
	a.Unlock()
	close(a.stop)
	err := a.ln.Close()
	a.Lock()
	for c := range a.accepted {
		c.Close()
	}
	a.Unlock()
	a.wg.Wait()

	a.life.Lock()
	defer a.life.Unlock()
	a.Lock()
	defer a.Unlock()
	for r := range a.ReqsLocked() {
		if r.ev != nil && !r.evFreed {
			r.evFreed = true
			_ = r.ev.Destroy()
		}
	}
	for _, p := range peers {
		a.dropPeerLocked(p)
	}
	a.ForgetAllLocked()
	return err
}
