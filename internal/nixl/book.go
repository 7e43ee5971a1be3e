package nixl

import (
	"bytes"
	"errors"
	"fmt"
	"iter"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// Book is the bookkeeping an agent keeps beside its transport, the same
// in every backend: one mutex over the agent's state, a closed flag that
// can be read without it, the local memory registered, each buffer with
// its key and the backend's handle, the peers loaded by name with the
// metadata they came from, and the requests made and not yet released,
// each with its peer. A backend's agent embeds it and calls Init before
// use; the methods named ...Locked expect the caller to hold the lock.
//
// What differs by backend comes in through Init and the calls: its name
// (metadata and messages), what releasing a peer means (drop, which also
// marks the backend's peer invalid for requests that still point at it),
// whether a request is in flight, and how memory is registered. A
// backend's request embeds ReqHead, so that the book can tell its own
// requests, released or not, from anyone else's.
type Book[P comparable, R Request, H any] struct {
	backend  string
	mu       sync.Mutex
	closed   atomic.Bool
	regs     []*Reg[H]
	peers    map[string]bookPeer[P]
	reqs     map[R]P
	drop     func(P)
	inFlight func(R) bool
}

// Reg is a registered buffer: the key its metadata region carries (what
// a peer needs to reach it) and what the backend holds for it (H; an
// empty struct where it holds nothing).
type Reg[H any] struct {
	Buf    *Buffer
	Key    []byte
	Handle H
}

type bookPeer[P any] struct {
	p  P
	md []byte
}

// Init readies the book of an agent of the backend named: drop releases
// what a peer holds (called with the lock held, when a peer is
// invalidated or replaced), inFlight says whether a request's transfer is
// running (an invalidation waits for none).
func (b *Book[P, R, H]) Init(backend string, drop func(P), inFlight func(R) bool) {
	b.backend = backend
	b.peers = map[string]bookPeer[P]{}
	b.reqs = map[R]P{}
	b.drop, b.inFlight = drop, inFlight
}

// Lock takes the agent's lock.
func (b *Book[P, R, H]) Lock() { b.mu.Lock() }

// Unlock releases it.
func (b *Book[P, R, H]) Unlock() { b.mu.Unlock() }

// LockOpen takes the lock unless the agent is closed: then it returns
// ErrClosed without holding it.
func (b *Book[P, R, H]) LockOpen() error {
	b.mu.Lock()
	if b.closed.Load() {
		b.mu.Unlock()
		return ErrClosed
	}
	return nil
}

// Closed reports whether the agent was closed (no lock needed).
func (b *Book[P, R, H]) Closed() bool { return b.closed.Load() }

// CloseLocked marks the agent closed; false if it already was.
func (b *Book[P, R, H]) CloseLocked() bool { return !b.closed.Swap(true) }

// Register registers buf, of memory type mem, once: reg, called with the
// lock held and only for a buffer not registered yet, registers it with
// the transport and fills in r's key and handle (r.Buf is buf). A buffer
// registered already (an allocator's own, say) is left as it is. An empty
// buffer is refused, and so, wrapping ErrMemType, is one of another memory
// type: why says why this backend cannot register it.
func (b *Book[P, R, H]) Register(buf *Buffer, mem MemType, why string, reg func(r *Reg[H]) error) error {
	if buf == nil || buf.Len <= 0 {
		return fmt.Errorf("register: empty buffer")
	}
	if buf.Mem != mem {
		return fmt.Errorf("%w: %s backend cannot register %s: %s", ErrMemType, b.backend, buf.Mem, why)
	}
	if err := b.LockOpen(); err != nil {
		return err
	}
	defer b.mu.Unlock()
	if b.regIndexLocked(buf) >= 0 {
		return nil
	}
	r := &Reg[H]{Buf: buf}
	if err := reg(r); err != nil {
		return err
	}
	b.AddRegLocked(r)
	return nil
}

// AddRegLocked records a buffer the backend registered itself (memory it
// allocated).
func (b *Book[P, R, H]) AddRegLocked(r *Reg[H]) { b.regs = append(b.regs, r) }

// Deregister forgets buf's registration once release, where not nil, let
// go of what the backend holds for it; release may keep the registration
// instead (false), as for memory the backend allocated, registered until
// it is freed. A buffer not registered is an error.
func (b *Book[P, R, H]) Deregister(buf *Buffer, release func(*Reg[H]) bool) error {
	if err := b.LockOpen(); err != nil {
		return err
	}
	defer b.mu.Unlock()
	i := b.regIndexLocked(buf)
	if i < 0 {
		return fmt.Errorf("deregister: buffer at %#x is not registered", buf.Addr)
	}
	if release == nil || release(b.regs[i]) {
		b.regs = slices.Delete(b.regs, i, i+1)
	}
	return nil
}

// DropRegLocked forgets buf's registration and returns it (nil if buf is
// not registered), for the backend to release.
func (b *Book[P, R, H]) DropRegLocked(buf *Buffer) *Reg[H] {
	i := b.regIndexLocked(buf)
	if i < 0 {
		return nil
	}
	r := b.regs[i]
	b.regs = slices.Delete(b.regs, i, i+1)
	return r
}

func (b *Book[P, R, H]) regIndexLocked(buf *Buffer) int {
	return slices.IndexFunc(b.regs, func(r *Reg[H]) bool { return r.Buf == buf })
}

// RegsLocked is the registered buffers, in the order they were registered
// (not to be modified).
func (b *Book[P, R, H]) RegsLocked() []*Reg[H] { return b.regs }

// CheckLocalLocked reports the first of descs (local descriptors) that no
// registered buffer holds, as Locate does.
func (b *Book[P, R, H]) CheckLocalLocked(descs []Desc) error {
	return Locate("", descs, len(b.regs), func(j int, d Desc) bool { return b.regs[j].Buf.Contains(d) }, nil)
}

// EncodeLocalMD encodes the metadata of the agent called name: how peers
// reach it (conn, called with the lock held) and each registered buffer
// with its key.
func (b *Book[P, R, H]) EncodeLocalMD(name string, conn func() ([]byte, error)) ([]byte, error) {
	if err := b.LockOpen(); err != nil {
		return nil, err
	}
	defer b.mu.Unlock()
	c, err := conn()
	if err != nil {
		return nil, err
	}
	md := Metadata{Backend: b.backend, Name: name, Conn: c, Proc: Self()}
	for _, r := range b.regs {
		md.Regions = append(md.Regions, RegionMD{Addr: r.Buf.Addr, Len: uint64(r.Buf.Len), Mem: r.Buf.Mem, Dev: r.Buf.Dev, Key: r.Key})
	}
	return md.Encode()
}

// DecodeRemoteMD decodes a peer's metadata (DecodeMetadata), refusing
// that of another backend's agent.
func (b *Book[P, R, H]) DecodeRemoteMD(data []byte) (Metadata, error) {
	md, err := DecodeMetadata(data)
	if err != nil {
		return Metadata{}, err
	}
	if md.Backend != b.backend {
		return Metadata{}, fmt.Errorf("%w: metadata of a %q agent cannot be loaded by a %s agent", ErrBadMetadata, md.Backend, b.backend)
	}
	return md, nil
}

// PeerLocked is the loaded peer of that name, or ErrUnknownAgent. A peer
// in the book is never one that was dropped: invalidation removes it, so
// a backend's own invalid mark matters only to requests and lists that
// still point at it.
func (b *Book[P, R, H]) PeerLocked(name string) (P, error) {
	e, ok := b.peers[name]
	if !ok {
		var none P
		return none, fmt.Errorf("%w: %s", ErrUnknownAgent, name)
	}
	return e.p, nil
}

// ReloadLocked prepares loading metadata md for the peer called name:
// loaded reports that the same metadata is loaded already (nothing to
// do); a peer of that name loaded from other metadata, a restarted one,
// is invalidated first, unless transfers to it are in flight.
func (b *Book[P, R, H]) ReloadLocked(name string, md []byte) (loaded bool, err error) {
	old, ok := b.peers[name]
	if !ok {
		return false, nil
	}
	if bytes.Equal(old.md, md) {
		return true, nil
	}
	return false, b.invalidateLocked(name, old.p)
}

// AddPeerLocked records a peer loaded from metadata md.
func (b *Book[P, R, H]) AddPeerLocked(name string, md []byte, p P) {
	b.peers[name] = bookPeer[P]{p: p, md: append([]byte(nil), md...)}
}

// PeersLocked yields the loaded peers with their names.
func (b *Book[P, R, H]) PeersLocked() iter.Seq2[string, P] {
	return func(yield func(string, P) bool) {
		for name, e := range b.peers {
			if !yield(name, e.p) {
				return
			}
		}
	}
}

// PeerWatchPeriod is how often WatchPeers looks at the peers: how long a
// dead same-host peer's transfers may hang before they fail.
const PeerWatchPeriod = 100 * time.Millisecond

// WatchPeers calls check for each loaded peer, with the lock held, every
// PeerWatchPeriod until stop is closed: check looks for a same-host peer
// whose process exited, which a backend's transport may never notice, and
// fails what it has in flight.
func (b *Book[P, R, H]) WatchPeers(stop <-chan struct{}, check func(P)) {
	t := time.NewTicker(PeerWatchPeriod)
	defer t.Stop()
	for {
		select {
		case <-stop:
			return
		case <-t.C:
		}
		b.mu.Lock()
		for _, e := range b.peers {
			check(e.p)
		}
		b.mu.Unlock()
	}
}

// InvalidateRemoteMD forgets the peer called name and releases what it
// holds, unless transfers to it are in flight (ErrInFlight).
func (b *Book[P, R, H]) InvalidateRemoteMD(name string) error {
	if err := b.LockOpen(); err != nil {
		return err
	}
	defer b.mu.Unlock()
	e, ok := b.peers[name]
	if !ok {
		return fmt.Errorf("%w: %s", ErrUnknownAgent, name)
	}
	return b.invalidateLocked(name, e.p)
}

func (b *Book[P, R, H]) invalidateLocked(name string, p P) error {
	for _, rp := range b.InFlightLocked() {
		if rp == p {
			return fmt.Errorf("invalidate %s: %w", name, ErrInFlight)
		}
	}
	b.drop(p)
	delete(b.peers, name)
	return nil
}

// AddReqLocked records a request made for peer p, as this agent's.
func (b *Book[P, R, H]) AddReqLocked(r R, p P) {
	r.reqHead().owner = b
	b.reqs[r] = p
}

// errReleased is a request used after its release.
var errReleased = errors.New("request already released")

// Req is x as this agent's request: one it made and has not released.
func (b *Book[P, R, H]) Req(x XferReq) (R, error) {
	r, ok := x.(R)
	if !ok || r.reqHead().owner != b {
		var none R
		return none, fmt.Errorf("request was not made by this agent")
	}
	if r.Released() {
		var none R
		return none, errReleased
	}
	return r, nil
}

// OpenReq is Req for an agent that is not closed (ErrClosed if it is),
// as polling a request wants; the lock is not taken.
func (b *Book[P, R, H]) OpenReq(x XferReq) (R, error) {
	r, err := b.Req(x)
	if err == nil && b.Closed() {
		err = ErrClosed
	}
	return r, err
}

// LockReq is Req followed by LockOpen, as posting a request wants: on
// success the caller holds the lock. Req is asked again under the lock:
// a release that ran between the first look and the lock would otherwise
// hand the caller a freed request.
func (b *Book[P, R, H]) LockReq(x XferReq) (R, error) {
	r, err := b.Req(x)
	if err != nil {
		return r, err
	}
	if err := b.LockOpen(); err != nil {
		return r, err
	}
	if r.Released() {
		b.mu.Unlock()
		var none R
		return none, errReleased
	}
	return r, nil
}

// ReleaseReq releases request x (Req) once release, called with the lock
// held, let go of what the backend holds for it; release refuses with an
// error when it cannot (a transfer in flight). After Close there is
// nothing left to release: Close freed every request.
func (b *Book[P, R, H]) ReleaseReq(x XferReq, release func(R) error) error {
	r, err := b.Req(x)
	if err != nil {
		return err
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed.Load() {
		return nil
	}
	if err := release(r); err != nil {
		return err
	}
	b.ReleaseReqLocked(r)
	return nil
}

// ReleaseReqLocked marks a request released and forgets it.
func (b *Book[P, R, H]) ReleaseReqLocked(r R) {
	r.reqHead().released.Store(true)
	delete(b.reqs, r)
}

// ReqsLocked yields the requests not released, each with its peer.
func (b *Book[P, R, H]) ReqsLocked() iter.Seq2[R, P] {
	return func(yield func(R, P) bool) {
		for r, p := range b.reqs {
			if !yield(r, p) {
				return
			}
		}
	}
}

// InFlightLocked yields the requests in flight, each with its peer.
func (b *Book[P, R, H]) InFlightLocked() iter.Seq2[R, P] {
	return func(yield func(R, P) bool) {
		for r, p := range b.reqs {
			if b.inFlight(r) && !yield(r, p) {
				return
			}
		}
	}
}

// ForgetAllLocked empties the book, at Close, once the backend has
// released what its registrations, peers and requests held (it does not
// call drop).
func (b *Book[P, R, H]) ForgetAllLocked() {
	b.regs = nil
	b.peers = map[string]bookPeer[P]{}
	b.reqs = map[R]P{}
}
