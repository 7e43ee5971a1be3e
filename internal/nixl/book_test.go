package nixl

import (
	"errors"
	"maps"
	"runtime"
	"slices"
	"strings"
	"testing"
)

// bookPeerFake and bookReqFake stand in for a backend's peer and request.
type bookPeerFake struct {
	name    string
	dropped bool
}

type bookReqFake struct {
	ReqHead
	running bool
}

// The fake backend's handle for a registered buffer: a number.
func newBookFake() *Book[*bookPeerFake, *bookReqFake, int] {
	b := &Book[*bookPeerFake, *bookReqFake, int]{}
	b.Init("fake", func(p *bookPeerFake) { p.dropped = true }, func(r *bookReqFake) bool { return r.running })
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

func TestBookRegistrations(t *testing.T) {
	b := newBookFake()
	calls := 0
	reg := func(key string) func(*Reg[int]) error {
		return func(r *Reg[int]) error {
			calls++
			if key == "" {
				return errors.New("transport refused")
			}
			r.Key, r.Handle = []byte(key), calls
			return nil
		}
	}
	x := &Buffer{Addr: 0x1000, Len: 4096, Mem: DRAM}
	y := &Buffer{Addr: 0x9000, Len: 4096, Mem: DRAM}
	if err := b.Register(nil, DRAM, "", reg("k")); err == nil || calls != 0 {
		t.Fatalf("nil buffer: %v (%d calls)", err, calls)
	}
	err := b.Register(&Buffer{Addr: 1, Len: 1, Mem: VRAM}, DRAM, "no GPUs here", reg("k"))
	if !errors.Is(err, ErrMemType) || !strings.Contains(err.Error(), "fake backend cannot register VRAM: no GPUs here") || calls != 0 {
		t.Fatalf("VRAM buffer: %v (%d calls)", err, calls)
	}
	if err := b.Register(x, DRAM, "", reg("")); err == nil {
		t.Fatal("a registration the transport refused was recorded")
	}
	for range 2 {
		if err := b.Register(x, DRAM, "", reg("x")); err != nil {
			t.Fatal(err)
		}
	}
	if calls != 2 {
		t.Fatalf("registering a buffer twice called the backend %d times, want once (after the refusal)", calls)
	}
	b.Lock()
	b.AddRegLocked(&Reg[int]{Buf: y, Key: []byte("y"), Handle: -1})
	err = b.CheckLocalLocked([]Desc{x.Desc(0, 16), y.Desc(100, 16), {Addr: 0x5000, Len: 1}})
	b.Unlock()
	if !errors.Is(err, ErrNotRegistered) || !strings.Contains(err.Error(), "local descriptor 2") {
		t.Fatalf("descriptor outside the registrations: %v", err)
	}

	data, err := b.EncodeLocalMD("me", func() ([]byte, error) { return []byte("conn"), nil })
	if err != nil {
		t.Fatal(err)
	}
	md, err := b.DecodeRemoteMD(data)
	if err != nil || md.Backend != "fake" || md.Name != "me" || string(md.Conn) != "conn" || len(md.Regions) != 2 ||
		md.Regions[0].Addr != x.Addr || string(md.Regions[0].Key) != "x" || md.Regions[1].Len != uint64(y.Len) {
		t.Fatalf("metadata: %+v, %v", md, err)
	}
	other, _ := Metadata{Backend: "other", Name: "p"}.Encode()
	if _, err := b.DecodeRemoteMD(other); !errors.Is(err, ErrBadMetadata) {
		t.Fatalf("another backend's metadata: %v", err)
	}

	// y is the backend's own: release keeps it registered.
	keep := func(r *Reg[int]) bool { return r.Handle >= 0 }
	if err := b.Deregister(y, keep); err != nil {
		t.Fatal(err)
	}
	if err := b.Deregister(x, keep); err != nil {
		t.Fatal(err)
	}
	if err := b.Deregister(x, keep); err == nil || !strings.Contains(err.Error(), "not registered") {
		t.Fatalf("deregistering twice: %v", err)
	}
	b.Lock()
	if got := b.RegsLocked(); len(got) != 1 || got[0].Buf != y {
		t.Fatalf("registrations after deregistering: %v", got)
	}
	if r := b.DropRegLocked(y); r == nil || r.Handle != -1 || len(b.RegsLocked()) != 0 {
		t.Fatalf("DropRegLocked: %v, %d left", r, len(b.RegsLocked()))
	}
	b.AddRegLocked(&Reg[int]{Buf: y})
	b.CloseLocked()
	b.ForgetAllLocked()
	n := len(b.RegsLocked())
	b.Unlock()
	if n != 0 {
		t.Fatalf("%d registrations after ForgetAllLocked", n)
	}
	if err := b.Register(x, DRAM, "", reg("x")); !errors.Is(err, ErrClosed) {
		t.Fatalf("register after close: %v", err)
	}
	if _, err := b.EncodeLocalMD("me", nil); !errors.Is(err, ErrClosed) {
		t.Fatalf("metadata after close: %v", err)
	}
}

func TestBookReqRefusesForeignAndReleasedRequests(t *testing.T) {
	b, other := newBookFake(), newBookFake()
	p := &bookPeerFake{name: "p"}
	r := &bookReqFake{running: true}
	b.Lock()
	b.AddReqLocked(r, p)
	b.Unlock()

	if _, err := other.Req(r); err == nil || !strings.Contains(err.Error(), "not made by this agent") {
		t.Fatalf("another agent's request: %v", err)
	}
	if got, err := b.LockReq(r); err != nil || got != r {
		t.Fatalf("LockReq: %v %v", got, err)
	}
	b.Unlock()

	if err := b.ReleaseReq(r, func(*bookReqFake) error { return ErrInFlight }); !errors.Is(err, ErrInFlight) {
		t.Fatalf("refused release: %v", err)
	}
	if r.Released() || len(maps.Collect(b.ReqsLocked())) != 1 {
		t.Fatal("a refused release released the request")
	}
	r.running = false
	if err := b.ReleaseReq(r, func(*bookReqFake) error { return nil }); err != nil {
		t.Fatalf("release: %v", err)
	}
	if _, err := b.Req(r); err == nil || !strings.Contains(err.Error(), "already released") {
		t.Fatalf("released request: %v", err)
	}

	r2 := &bookReqFake{}
	b.Lock()
	b.AddReqLocked(r2, p)
	b.CloseLocked()
	b.Unlock()
	if _, err := b.OpenReq(r2); !errors.Is(err, ErrClosed) {
		t.Fatalf("OpenReq after Close: %v, want ErrClosed", err)
	}
	if _, err := b.LockReq(r2); !errors.Is(err, ErrClosed) {
		t.Fatalf("LockReq after Close: %v, want ErrClosed", err)
	}
	if err := b.ReleaseReq(r2, func(*bookReqFake) error { t.Error("release called after Close"); return nil }); err != nil {
		t.Fatalf("release after Close: %v, want nil (freed at Close)", err)
	}
}

// A release that takes the lock while a post waits for it wins: the post
// must not go on with the request it looked up before (a freed handle).
func TestBookLockReqSeesAReleaseThatWonTheLock(t *testing.T) {
	b := newBookFake()
	r := &bookReqFake{}
	b.Lock()
	b.AddReqLocked(r, &bookPeerFake{name: "p"})
	done := make(chan error, 1)
	go func() {
		_, err := b.LockReq(r)
		if err == nil {
			b.Unlock()
		}
		done <- err
	}()
	// Wait for the state, not a time: the post has looked the request up
	// and is blocked on the lock this test holds.
	for !goroutineWaitsIn("LockOpen") {
		runtime.Gosched()
	}
	b.ReleaseReqLocked(r)
	b.Unlock()
	if err := <-done; err == nil || !strings.Contains(err.Error(), "already released") {
		t.Fatalf("LockReq after a release that won the lock: %v, want already released", err)
	}
}

// goroutineWaitsIn reports whether some goroutine is blocked in a mutex
// inside a function whose name ends in fn.
func goroutineWaitsIn(fn string) bool {
	buf := make([]byte, 1<<20)
	for _, g := range strings.Split(string(buf[:runtime.Stack(buf, true)]), "\n\n") {
		if strings.Contains(g, "sync.(*Mutex).Lock") && strings.Contains(g, "."+fn+"(") {
			return true
		}
	}
	return false
}
