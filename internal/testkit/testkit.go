// Package testkit holds the small helpers several packages' tests share:
// a buffer a process or logger writes while the test reads it, and a wait
// for a state that fails naming what never happened. Tests import it;
// nothing else does.
package testkit

import (
	"bytes"
	"fmt"
	"sync"
	"testing"
	"time"
)

// SyncBuffer is a bytes.Buffer that goroutines (a child's stderr copier,
// a logger) write while the test reads it.
type SyncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *SyncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

// String is what was written so far.
func (s *SyncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// WaitFor polls cond until it holds, so that a test waits only as long as
// the program needs; after within (0: 10 s) it fails, naming what never
// happened (what, and state's words when state is not nil). Polls start
// every millisecond and back off to every 20 ms.
func WaitFor(t testing.TB, within time.Duration, what string, cond func() bool, state func() string) {
	t.Helper()
	if within <= 0 {
		within = 10 * time.Second
	}
	deadline := time.Now().Add(within)
	pause := time.Millisecond
	for !cond() {
		if time.Now().After(deadline) {
			msg := fmt.Sprintf("timed out after %v waiting for %s", within, what)
			if state != nil {
				msg += "; state: " + state()
			}
			t.Fatal(msg)
		}
		time.Sleep(pause)
		pause = min(2*pause, 20*time.Millisecond)
	}
}
