package testkit

import (
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"
)

// fakeTB records WaitFor's failure instead of ending the test (a fake,
// for these tests only).
type fakeTB struct {
	testing.TB
	failed string
}

func (f *fakeTB) Helper()           {}
func (f *fakeTB) Fatal(args ...any) { f.failed = fmt.Sprint(args...) }

func TestWaitForReturnsOnceTheConditionHolds(t *testing.T) {
	calls := 0
	f := &fakeTB{TB: t}
	WaitFor(f, time.Second, "the third call", func() bool { calls++; return calls == 3 }, nil)
	if calls != 3 || f.failed != "" {
		t.Errorf("calls %d, failure %q; want 3 calls and none", calls, f.failed)
	}
}

func TestWaitForFailsNamingWhatNeverHappened(t *testing.T) {
	f := &fakeTB{TB: t}
	done := false
	WaitFor(f, 20*time.Millisecond, "the door to open", func() bool {
		if f.failed != "" { // the fake's Fatalf returns: stop the loop as Fatalf would
			done = true
		}
		return done
	}, func() string { return "closed" })
	if !strings.Contains(f.failed, "the door to open") || !strings.Contains(f.failed, "state: closed") {
		t.Errorf("failure %q; want it to name the wait and the state", f.failed)
	}
}

func TestSyncBufferTakesConcurrentWrites(t *testing.T) {
	var b SyncBuffer
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for range 100 {
				b.Write([]byte("x"))
			}
		})
	}
	wg.Wait()
	if n := len(b.String()); n != 800 {
		t.Errorf("%d bytes; want 800", n)
	}
}
