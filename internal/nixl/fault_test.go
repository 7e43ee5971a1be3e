package nixl

import (
	"errors"
	"testing"
	"time"

	"go.uber.org/goleak"
)

// fakeAgent is a test double: it delivers queued notifications and runs
// requests that finish after a set number of status polls.
type fakeAgent struct {
	Agent // nil: methods the tests do not use panic
	in    Notifs
	sent  []string
	polls map[XferReq]int
	ready chan struct{}
}

type fakeReq struct{ id int }

func (fakeReq) Op() Op         { return Write }
func (fakeReq) Bytes() int64   { return 0 }
func (fakeReq) Descs() int     { return 0 }
func (fakeReq) Remote() string { return "peer" }

func newFake() *fakeAgent {
	return &fakeAgent{in: Notifs{}, polls: map[XferReq]int{}, ready: make(chan struct{}, 1)}
}

func (f *fakeAgent) GetNotifs() (Notifs, error) {
	out := f.in
	f.in = Notifs{}
	return out, nil
}
func (f *fakeAgent) NotifReady() <-chan struct{} { return f.ready }
func (f *fakeAgent) SendNotif(remote string, msg []byte) error {
	f.sent = append(f.sent, string(msg))
	return nil
}
func (f *fakeAgent) PostXferReq(r XferReq) (Status, error) { f.polls[r] = 3; return InProgress, nil }
func (f *fakeAgent) XferStatus(r XferReq) (Status, error) {
	if f.polls[r] > 0 {
		f.polls[r]--
		return InProgress, nil
	}
	return Done, nil
}
func (f *fakeAgent) ReleaseXferReq(r XferReq) error {
	if f.polls[r] > 0 {
		return ErrInFlight
	}
	return nil
}
func (f *fakeAgent) Close() error { return nil }

func TestFaultsNotifications(t *testing.T) {
	defer goleak.VerifyNone(t)
	fake := newFake()
	a := WithFaults(fake, Faults{DropNotif: 1, NotifPrefix: "HB:"})
	defer a.Close()
	fake.in["d"] = [][]byte{[]byte("HB:r1"), []byte("r1:1"), []byte("HB:r2")}
	got, _ := a.GetNotifs()
	if len(got["d"]) != 1 || string(got["d"][0]) != "r1:1" {
		t.Errorf("heartbeats should be dropped, others kept: %q", got["d"])
	}
	if a.Stats().DroppedNotifs != 2 {
		t.Errorf("stats %+v", a.Stats())
	}

	a.SetFaults(Faults{DupNotif: 1})
	fake.in["d"] = [][]byte{[]byte("x")}
	got, _ = a.GetNotifs()
	if len(got["d"]) != 2 {
		t.Errorf("duplicate: %q", got["d"])
	}

	a.SetFaults(Faults{DelayNotif: 1, DelayNotifs: 30 * time.Millisecond, NotifPrefix: "late"})
	fake.in["d"] = [][]byte{[]byte("late-1")}
	if got, _ = a.GetNotifs(); len(got) != 0 {
		t.Errorf("delayed notification came out at once: %q", got)
	}
	select {
	case <-a.NotifReady():
	case <-time.After(2 * time.Second):
		t.Fatal("no wake-up when the delayed notification was due")
	}
	fake.in["d"] = [][]byte{[]byte("early")}
	got, _ = a.GetNotifs()
	if len(got["d"]) != 2 || string(got["d"][0]) != "early" || string(got["d"][1]) != "late-1" {
		t.Errorf("delayed notification should come after newer ones: %q", got["d"])
	}

	a.SetFaults(Faults{DropSend: 1, NotifPrefix: "HB:"})
	a.SendNotif("p", []byte("HB:x"))
	a.SendNotif("p", []byte("done"))
	if len(fake.sent) != 1 || fake.sent[0] != "done" {
		t.Errorf("sent %q", fake.sent)
	}
}

func TestFaultsDropSendEvenly(t *testing.T) {
	defer goleak.VerifyNone(t)
	for _, tc := range []struct {
		frac float64
		want string // per matching send: s sent, d dropped
	}{
		{0.5, "sdsdsdsd"},
		{0.25, "sssdsssd"},
		{0.75, "sdddsddd"},
		{0, "ssssssss"},
		{1, "dddddddd"},
	} {
		fake := newFake()
		a := WithFaults(fake, Faults{DropSend: tc.frac, DropSendEvenly: true, NotifPrefix: "HB:"})
		got := ""
		for range 8 {
			n := len(fake.sent)
			a.SendNotif("p", []byte("HB:x"))
			a.SendNotif("p", []byte("other")) // not matching: never dropped, not counted
			if len(fake.sent) == n+2 {
				got += "s"
			} else {
				got += "d"
			}
		}
		a.Close()
		if got != tc.want {
			t.Errorf("drop %.2f evenly: %s, want %s", tc.frac, got, tc.want)
		}
	}
}

func TestFaultsRequests(t *testing.T) {
	defer goleak.VerifyNone(t)
	fake := newFake()
	a := WithFaults(fake, Faults{FailPost: 1})
	defer a.Close()
	r := fakeReq{1}
	if st, err := a.PostXferReq(r); st != Failed || !errors.Is(err, ErrInjected) {
		t.Errorf("post: %v %v", st, err)
	}
	a.SetFaults(Faults{FailStatus: 1})
	if _, err := a.PostXferReq(r); err != nil {
		t.Fatal(err)
	}
	if st, err := a.XferStatus(r); st != Failed || !errors.Is(err, ErrInjected) {
		t.Errorf("status: %v %v", st, err)
	}
	a.SetFaults(Faults{})
	if st, _ := a.XferStatus(r); st != Failed {
		t.Error("an injected failure must stick until reposted")
	}
	// Release waits for the real request, which is still running.
	if err := a.ReleaseXferReq(r); err != nil {
		t.Errorf("release: %v", err)
	}
	s := a.Stats()
	if s.FailedPosts != 1 || s.FailedStatuses != 1 {
		t.Errorf("stats %+v", s)
	}
	if a.Unwrap() != fake {
		t.Error("Unwrap")
	}
}
