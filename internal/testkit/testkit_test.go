package testkit

import (
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nixlctl/nixlctl/internal/errkind"
)

// fakeTB records a helper's failure instead of ending the test (a fake,
// for these tests only).
type fakeTB struct {
	testing.TB
	failed string
}

func (f *fakeTB) Helper()                           {}
func (f *fakeTB) Fatal(args ...any)                 { f.failed += fmt.Sprint(args...) }
func (f *fakeTB) Fatalf(format string, args ...any) { f.failed += fmt.Sprintf(format, args...) }
func (f *fakeTB) Errorf(format string, args ...any) { f.failed += fmt.Sprintf(format, args...) }

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

func TestWantErr(t *testing.T) {
	for _, tc := range []struct {
		name string
		err  error
		fail string // what the failure says; "" for none
	}{
		{"the error says it", errors.New("--tp 0: want at least 1"), ""},
		{"no error", nil, `error <nil>, want one containing "want at least 1"`},
		{"another error", errors.New("--tp 0: bad"), `error --tp 0: bad, want one containing "want at least 1"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := &fakeTB{TB: t}
			WantErr(f, tc.err, "want at least 1")
			if f.failed != tc.fail {
				t.Errorf("failure %q, want %q", f.failed, tc.fail)
			}
		})
	}
}

func TestWantResult(t *testing.T) {
	boom := errors.New("boom")
	for _, tc := range []struct {
		name    string
		got     []int
		err     error
		want    []int
		wantErr string
		fail    string // a part of the failure; "" for none
	}{
		{"the value", []int{1, 2}, nil, []int{1, 2}, "", ""},
		{"another value", []int{1, 3}, nil, []int{1, 2}, "", "(-want +got)"},
		{"an error where a value was due", nil, boom, []int{1, 2}, "", "boom"},
		{"the error", nil, boom, nil, "boom", ""},
		{"the error; got is not looked at", []int{7}, boom, nil, "boom", ""},
		{"a value where an error was due", []int{1, 2}, nil, nil, "boom", `want one containing "boom"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := &fakeTB{TB: t}
			WantResult(f, tc.got, tc.err, tc.want, tc.wantErr)
			if tc.fail == "" && f.failed != "" || !strings.Contains(f.failed, tc.fail) {
				t.Errorf("failure %q, want one containing %q", f.failed, tc.fail)
			}
		})
	}
}

func TestWantBadInput(t *testing.T) {
	// As Validate joins them: one FieldError a bad field, bad input whole.
	twoFields := errkind.BadInput(errors.Join(errkind.Field("NumIter", "0: want at least 1"),
		errkind.Field("WarmupIter", "-1: cannot be negative")))
	for _, tc := range []struct {
		name   string
		err    error
		fields []string
		msg    string
		fail   string // a part of the failure; "" for none
	}{
		{"the fields", twoFields, []string{"NumIter", "WarmupIter"}, "", ""},
		{"the fields and the message", twoFields, []string{"NumIter", "WarmupIter"}, "cannot be negative", ""},
		{"another message", twoFields, []string{"NumIter", "WarmupIter"}, "at most 1024", `lacks "at most 1024"`},
		{"one field short", twoFields, []string{"NumIter"}, "", "fields at fault"},
		{"not bad input", errors.New("NumIter 0"), nil, "", "want bad input"},
		{"no error", nil, nil, "", "want bad input"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := &fakeTB{TB: t}
			WantBadInput(f, tc.err, tc.fields, tc.msg)
			if tc.fail == "" && f.failed != "" || !strings.Contains(f.failed, tc.fail) {
				t.Errorf("failure %q, want one containing %q", f.failed, tc.fail)
			}
		})
	}
}

func TestFreeAddrCanBeListenedOn(t *testing.T) {
	addr := FreeAddr(t)
	if !strings.HasPrefix(addr, "127.0.0.1:") {
		t.Fatalf("%q is not a loopback address", addr)
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatalf("listen on the free address: %v", err)
	}
	ln.Close()
}
