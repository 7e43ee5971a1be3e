package nixl

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"
)

// scriptedAgent is a test double for the poller: request i ends after
// polls[i] status calls (never when negative), failing when fail[i].
type scriptedAgent struct {
	Agent // nil: methods the poller does not use panic
	mu    sync.Mutex
	polls map[int]int
	fail  map[int]bool
	asked map[int]int
}

func newScripted() *scriptedAgent {
	return &scriptedAgent{polls: map[int]int{}, fail: map[int]bool{}, asked: map[int]int{}}
}

func (s *scriptedAgent) add(id, polls int, fail bool) XferReq {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.polls[id], s.fail[id] = polls, fail
	return fakeReq{id}
}

func (s *scriptedAgent) XferStatus(r XferReq) (Status, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	id := r.(fakeReq).id
	s.asked[id]++
	switch left := s.polls[id]; {
	case left != 0:
		if left > 0 {
			s.polls[id]--
		}
		return InProgress, nil
	case s.fail[id]:
		return Failed, errors.New("remote access error")
	}
	return Done, nil
}

func (s *scriptedAgent) timesAsked(id int) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.asked[id]
}

func TestPollerAnswersEveryWait(t *testing.T) {
	defer goleak.VerifyNone(t)
	a := newScripted()
	p := NewPoller(a)
	defer p.Close()
	const n = 64
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		x := a.add(i, i%7, i%5 == 0)
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = p.Wait(context.Background(), x, 0)
		}()
	}
	wg.Wait()
	for i, err := range errs {
		if wantFail := i%5 == 0; (err != nil) != wantFail {
			t.Errorf("request %d: err %v, want failure %v", i, err, wantFail)
		}
		if want := i%7 + 1; a.timesAsked(i) != want {
			t.Errorf("request %d asked %d times, want %d (once per pass until it ends)", i, a.timesAsked(i), want)
		}
	}
	// The poller sleeps once nothing waits, and wakes for a new wait.
	time.Sleep(5 * time.Millisecond)
	if err := p.Wait(context.Background(), a.add(n, 2, false), 0); err != nil {
		t.Fatalf("wait after idle: %v", err)
	}
}

func TestPollerAbandonedWaitIsNotPolledAgain(t *testing.T) {
	defer goleak.VerifyNone(t)
	a := newScripted()
	p := NewPoller(a)
	defer p.Close()

	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	if err := p.Wait(ctx, a.add(1, -1, false), 0); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("cancelled wait: %v", err)
	}
	err := p.Wait(context.Background(), a.add(2, -1, false), 20*time.Millisecond)
	if !errors.Is(err, ErrStillRunning) {
		t.Fatalf("timed-out wait: %v", err)
	}
	asked1, asked2 := a.timesAsked(1), a.timesAsked(2)
	if asked1 == 0 || asked2 == 0 {
		t.Fatalf("never polled: %d, %d", asked1, asked2)
	}
	// The caller owns an abandoned request again (it may release it):
	// the poller must not ask about it any more.
	if err := p.Wait(context.Background(), a.add(3, 50, false), 0); err != nil {
		t.Fatal(err)
	}
	if a.timesAsked(1) != asked1 || a.timesAsked(2) != asked2 {
		t.Errorf("abandoned requests polled again: %d -> %d, %d -> %d", asked1, a.timesAsked(1), asked2, a.timesAsked(2))
	}
}

func TestPollerCloseEndsWaits(t *testing.T) {
	defer goleak.VerifyNone(t)
	a := newScripted()
	p := NewPoller(a)
	got := make(chan error, 1)
	go func() { got <- p.Wait(context.Background(), a.add(1, -1, false), 0) }()
	for a.timesAsked(1) == 0 {
		time.Sleep(time.Millisecond)
	}
	p.Close()
	select {
	case err := <-got:
		if !errors.Is(err, ErrClosed) {
			t.Errorf("wait pending at Close: %v, want ErrClosed", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Close left a wait hanging")
	}
	if err := p.Wait(context.Background(), a.add(2, 0, false), 0); !errors.Is(err, ErrClosed) {
		t.Errorf("wait after Close: %v, want ErrClosed", err)
	}
	p.Close() // twice: no panic
}

// WaitXfer, the one-request wait, ends as Poller.Wait does.
func TestWaitXfer(t *testing.T) {
	a := newScripted()
	cancelled, cancel := context.WithCancel(context.Background())
	cancel()
	for i, tc := range []struct {
		name    string
		polls   int
		fail    bool
		ctx     context.Context
		timeout time.Duration
		want    error // nil: success; else errors.Is
	}{
		{"done after polls", 5, false, context.Background(), 0, nil},
		{"failed", 2, true, context.Background(), 0, errors.New("remote access error")},
		{"timeout", -1, false, context.Background(), 10 * time.Millisecond, ErrStillRunning},
		{"cancelled", -1, false, cancelled, 0, context.Canceled},
	} {
		id := 1000 + i
		err := WaitXfer(tc.ctx, a, a.add(id, tc.polls, tc.fail), tc.timeout)
		switch {
		case tc.want == nil && err != nil:
			t.Errorf("%s: %v", tc.name, err)
		case tc.want != nil && (err == nil || !errors.Is(err, tc.want) && err.Error() != tc.want.Error()):
			t.Errorf("%s: got %v, want %v", tc.name, err, tc.want)
		}
		if tc.polls >= 0 && a.timesAsked(id) != tc.polls+1 {
			t.Errorf("%s: asked %d times, want %d", tc.name, a.timesAsked(id), tc.polls+1)
		}
	}
}
