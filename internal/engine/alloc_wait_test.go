package engine

import (
	"context"
	"strings"
	"testing"
	"time"
)

func TestAllocWaitTakesBlocksAFreeReturns(t *testing.T) {
	a := NewBlockAllocator(8, false, 1)
	held, err := a.Alloc(6)
	if err != nil {
		t.Fatal(err)
	}
	type got struct {
		blocks []int
		waited bool
		err    error
	}
	done := make(chan got, 1)
	go func() {
		b, w, err := a.AllocWait(context.Background(), 4, time.Minute)
		done <- got{b, w, err}
	}()
	// The waiter must not have blocks before the free: wait for it to be
	// parked on the free signal (a pending receive), then free.
	select {
	case g := <-done:
		t.Fatalf("allocated %v before any free (err %v)", g.blocks, g.err)
	case <-time.After(50 * time.Millisecond):
	}
	if err := a.Free(held[:3]); err != nil {
		t.Fatal(err)
	}
	g := <-done
	if g.err != nil || len(g.blocks) != 4 || !g.waited {
		t.Fatalf("AllocWait after the free: %v, waited %v, err %v", g.blocks, g.waited, g.err)
	}
}

func TestAllocWaitGivesUp(t *testing.T) {
	a := NewBlockAllocator(4, false, 1)
	if _, err := a.Alloc(4); err != nil {
		t.Fatal(err)
	}
	_, waited, err := a.AllocWait(context.Background(), 2, 10*time.Millisecond)
	if err == nil || !waited || !strings.Contains(err.Error(), "out of KV blocks") || !strings.Contains(err.Error(), "after waiting") {
		t.Errorf("no frees: err %v, waited %v", err, waited)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, _, err := a.AllocWait(ctx, 2, time.Minute); err != context.Canceled {
		t.Errorf("cancelled: %v", err)
	}
	// Larger than the pool: no wait can help.
	if _, waited, err := a.AllocWait(context.Background(), 5, time.Minute); err == nil || waited {
		t.Errorf("5 of 4 blocks: err %v, waited %v", err, waited)
	}
	// Free now: no wait.
	b := NewBlockAllocator(4, false, 1)
	if _, waited, err := b.AllocWait(context.Background(), 4, time.Minute); err != nil || waited {
		t.Errorf("free pool: err %v, waited %v", err, waited)
	}
}
