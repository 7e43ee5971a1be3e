package nixl

import (
	"bytes"
	"fmt"
	"iter"
	"sync"
	"sync/atomic"
)

// Book is the bookkeeping an agent keeps beside its transport, the same
// in every backend: one mutex over the agent's state, a closed flag that
// can be read without it, the peers loaded by name with the metadata they
// came from, and the requests made and not yet released, each with its
// peer. A backend's agent embeds it and calls Init before use; the
// methods named ...Locked expect the caller to hold the lock.
//
// What differs by backend comes in through Init: what releasing a peer
// means (drop, which also marks the backend's peer invalid for requests
// that still point at it) and whether a request is in flight.
type Book[P comparable, R comparable] struct {
	mu       sync.Mutex
	closed   atomic.Bool
	peers    map[string]bookPeer[P]
	reqs     map[R]P
	drop     func(P)
	inFlight func(R) bool
}

type bookPeer[P any] struct {
	p  P
	md []byte
}

// Init readies the book: drop releases what a peer holds (called with
// the lock held, when a peer is invalidated or replaced), inFlight says
// whether a request's transfer is running (an invalidation waits for none).
func (b *Book[P, R]) Init(drop func(P), inFlight func(R) bool) {
	b.peers = map[string]bookPeer[P]{}
	b.reqs = map[R]P{}
	b.drop, b.inFlight = drop, inFlight
}

// Lock takes the agent's lock.
func (b *Book[P, R]) Lock() { b.mu.Lock() }

// Unlock releases it.
func (b *Book[P, R]) Unlock() { b.mu.Unlock() }

// LockOpen takes the lock unless the agent is closed: then it returns
// ErrClosed without holding it.
func (b *Book[P, R]) LockOpen() error {
	b.mu.Lock()
	if b.closed.Load() {
		b.mu.Unlock()
		return ErrClosed
	}
	return nil
}

// Closed reports whether the agent was closed (no lock needed).
func (b *Book[P, R]) Closed() bool { return b.closed.Load() }

// CloseLocked marks the agent closed; false if it already was.
func (b *Book[P, R]) CloseLocked() bool { return !b.closed.Swap(true) }

// PeerLocked is the loaded peer of that name, or ErrUnknownAgent. A peer
// in the book is never one that was dropped: invalidation removes it, so
// a backend's own invalid mark matters only to requests and lists that
// still point at it.
func (b *Book[P, R]) PeerLocked(name string) (P, error) {
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
func (b *Book[P, R]) ReloadLocked(name string, md []byte) (loaded bool, err error) {
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
func (b *Book[P, R]) AddPeerLocked(name string, md []byte, p P) {
	b.peers[name] = bookPeer[P]{p: p, md: append([]byte(nil), md...)}
}

// PeersLocked yields the loaded peers with their names.
func (b *Book[P, R]) PeersLocked() iter.Seq2[string, P] {
	return func(yield func(string, P) bool) {
		for name, e := range b.peers {
			if !yield(name, e.p) {
				return
			}
		}
	}
}

// InvalidateRemoteMD forgets the peer called name and releases what it
// holds, unless transfers to it are in flight (ErrInFlight).
func (b *Book[P, R]) InvalidateRemoteMD(name string) error {
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

func (b *Book[P, R]) invalidateLocked(name string, p P) error {
	for _, rp := range b.InFlightLocked() {
		if rp == p {
			return fmt.Errorf("invalidate %s: %w", name, ErrInFlight)
		}
	}
	b.drop(p)
	delete(b.peers, name)
	return nil
}

// AddReqLocked records a request made for peer p.
func (b *Book[P, R]) AddReqLocked(r R, p P) { b.reqs[r] = p }

// ReleaseReqLocked forgets a released request.
func (b *Book[P, R]) ReleaseReqLocked(r R) { delete(b.reqs, r) }

// ReqsLocked yields the requests not released, each with its peer.
func (b *Book[P, R]) ReqsLocked() iter.Seq2[R, P] {
	return func(yield func(R, P) bool) {
		for r, p := range b.reqs {
			if !yield(r, p) {
				return
			}
		}
	}
}

// InFlightLocked yields the requests in flight, each with its peer.
func (b *Book[P, R]) InFlightLocked() iter.Seq2[R, P] {
	return func(yield func(R, P) bool) {
		for r, p := range b.reqs {
			if b.inFlight(r) && !yield(r, p) {
				return
			}
		}
	}
}

// ForgetAllLocked empties the book, at Close, once the backend has
// released what its peers and requests held (it does not call drop).
func (b *Book[P, R]) ForgetAllLocked() {
	b.peers = map[string]bookPeer[P]{}
	b.reqs = map[R]P{}
}
