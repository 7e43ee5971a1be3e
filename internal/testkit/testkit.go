// Package testkit holds what several packages' tests share: a buffer a
// process or logger writes while the test reads it, a wait for a state
// that fails naming what never happened, the checks of a table row that
// expects a value, an error or a refused validation, and the fixtures
// more than one package reads (ProcStatus). Tests import it; nothing else
// does.
package testkit

import (
	"bytes"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/nixlctl/nixlctl/internal/errkind"
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

// WantErr fails the test at once unless err is an error whose text
// contains want: a refusal must say why, and a nil error refuses nothing.
func WantErr(t testing.TB, err error, want string) {
	t.Helper()
	if err == nil || !strings.Contains(err.Error(), want) {
		t.Fatalf("error %v, want one containing %q", err, want)
	}
}

// WantResult checks what a parse or a decode returned against a table
// row that expects either a value or an error: with wantErr set, err
// must contain it (got is not looked at); otherwise err must be nil and
// got must equal want.
func WantResult[T any](t testing.TB, got T, err error, want T, wantErr string) {
	t.Helper()
	if wantErr != "" {
		WantErr(t, err, wantErr)
		return
	}
	if err != nil {
		t.Fatal(err)
	}
	if d := cmp.Diff(want, got); d != "" {
		t.Errorf("(-want +got):\n%s", d)
	}
}

// WantBadInput checks a refused validation: err must be bad input (the
// CLI exits 2 on it), blame exactly fields, in Validate's order, and
// say msg ("" for any message).
func WantBadInput(t testing.TB, err error, fields []string, msg string) {
	t.Helper()
	if !errkind.IsBadInput(err) {
		t.Fatalf("Validate() = %v, want bad input", err)
		return
	}
	if diff := cmp.Diff(fields, errkind.Fields(err)); diff != "" {
		t.Errorf("fields at fault (-want +got):\n%s\n%v", diff, err)
	}
	if !strings.Contains(err.Error(), msg) {
		t.Errorf("%v lacks %q", err, msg)
	}
}
