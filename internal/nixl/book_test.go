package nixl

import (
	"errors"
	"maps"
	"slices"
	"testing"
)

// bookPeerFake and bookReqFake stand in for a backend's peer and request.
type bookPeerFake struct {
	name    string
	dropped bool
}

type bookReqFake struct {
	running bool
}

func newBookFake() *Book[*bookPeerFake, *bookReqFake] {
	b := &Book[*bookPeerFake, *bookReqFake]{}
	b.Init(func(p *bookPeerFake) { p.dropped = true }, func(r *bookReqFake) bool { return r.running })
	return b
}

func TestBookReloadInvalidatesARestartedPeer(t *testing.T) {
	b := newBookFake()
	old := &bookPeerFake{name: "p"}
	b.Lock()
	defer b.Unlock()
	if loaded, err := b.ReloadLocked("p", []byte("v1")); loaded || err != nil {
		t.Fatalf("first load: loaded=%v err=%v", loaded, err)
	}
	b.AddPeerLocked("p", []byte("v1"), old)

	if loaded, err := b.ReloadLocked("p", []byte("v1")); !loaded || err != nil {
		t.Fatalf("same metadata: loaded=%v err=%v, want loaded", loaded, err)
	}
	if old.dropped {
		t.Fatal("reloading the same metadata dropped the peer")
	}

	r := &bookReqFake{running: true}
	b.AddReqLocked(r, old)
	if _, err := b.ReloadLocked("p", []byte("v2")); !errors.Is(err, ErrInFlight) {
		t.Fatalf("restart with a transfer in flight: %v, want ErrInFlight", err)
	}
	if got, err := b.PeerLocked("p"); err != nil || got != old || old.dropped {
		t.Fatalf("a refused restart lost the peer: %v %v dropped=%v", got, err, old.dropped)
	}

	r.running = false
	if loaded, err := b.ReloadLocked("p", []byte("v2")); loaded || err != nil {
		t.Fatalf("restart: loaded=%v err=%v", loaded, err)
	}
	if !old.dropped {
		t.Fatal("the restarted peer's old incarnation was not dropped")
	}
	if _, err := b.PeerLocked("p"); !errors.Is(err, ErrUnknownAgent) {
		t.Fatalf("after the restart the old peer is still loaded: %v", err)
	}
}

func TestBookInvalidateAndClose(t *testing.T) {
	b := newBookFake()
	a, c := &bookPeerFake{name: "a"}, &bookPeerFake{name: "c"}
	ra, rc := &bookReqFake{running: true}, &bookReqFake{}
	b.Lock()
	b.AddPeerLocked("a", []byte("a"), a)
	b.AddPeerLocked("c", []byte("c"), c)
	b.AddReqLocked(ra, a)
	b.AddReqLocked(rc, c)
	inFlight := slices.Collect(maps.Keys(maps.Collect(b.InFlightLocked())))
	b.Unlock()
	if len(inFlight) != 1 || inFlight[0] != ra {
		t.Fatalf("in flight: %v, want only a's request", inFlight)
	}

	if err := b.InvalidateRemoteMD("a"); !errors.Is(err, ErrInFlight) {
		t.Fatalf("invalidating a peer with a transfer in flight: %v", err)
	}
	if err := b.InvalidateRemoteMD("c"); err != nil || !c.dropped {
		t.Fatalf("invalidate c: %v (dropped %v)", err, c.dropped)
	}
	if err := b.InvalidateRemoteMD("c"); !errors.Is(err, ErrUnknownAgent) {
		t.Fatalf("invalidating c twice: %v", err)
	}

	b.Lock()
	b.ReleaseReqLocked(rc)
	names := slices.Sorted(maps.Keys(maps.Collect(b.PeersLocked())))
	reqs := len(maps.Collect(b.ReqsLocked()))
	if !b.CloseLocked() || b.CloseLocked() {
		t.Error("CloseLocked should report true once, then false")
	}
	b.ForgetAllLocked()
	b.Unlock()
	if !slices.Equal(names, []string{"a"}) || reqs != 1 {
		t.Fatalf("before close: peers %v, %d requests; want [a] and 1", names, reqs)
	}
	if !b.Closed() {
		t.Fatal("not closed")
	}
	if err := b.LockOpen(); !errors.Is(err, ErrClosed) {
		t.Fatalf("LockOpen after close: %v", err)
	}
	if err := b.InvalidateRemoteMD("a"); !errors.Is(err, ErrClosed) {
		t.Fatalf("invalidate after close: %v", err)
	}
	// LockOpen did not leave the lock held.
	b.Lock()
	if n := len(maps.Collect(b.PeersLocked())); n != 0 {
		t.Errorf("%d peers after ForgetAllLocked", n)
	}
	b.Unlock()
}
