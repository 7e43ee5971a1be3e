package ucx

import (
	"testing"
	"time"

	"github.com/nixlctl/nixlctl/internal/nixl"
)

// A paced agent's worker runs only once per interval, so notifications
// sent to it every 50 ms arrive in bursts about an interval apart. (One
// progress call can still come out as two batches when the reader pops
// while UCX is enqueuing, so bursts are told apart by the gaps between
// them, with room for a slow, loaded machine.)
func TestProgressPaceBatchesDelivery(t *testing.T) {
	const pace = time.Second
	t.Setenv(ProgressIntervalEnv, pace.String())
	recv, err := New(nixl.Config{Name: "paced"})
	if err != nil {
		t.Fatal(err)
	}
	defer recv.Close()
	t.Setenv(ProgressIntervalEnv, "")
	send, err := New(nixl.Config{Name: "sender"})
	if err != nil {
		t.Fatal(err)
	}
	defer send.Close()
	md, err := recv.LocalMD()
	if err != nil {
		t.Fatal(err)
	}
	remote, err := send.LoadRemoteMD(md)
	if err != nil {
		t.Fatal(err)
	}

	const n = 40
	start := time.Now()
	go func() {
		for i := 0; i < n; i++ {
			if err := send.SendNotif(remote, []byte{byte(i)}); err != nil {
				t.Error(err)
				return
			}
			time.Sleep(50 * time.Millisecond)
		}
	}()
	var arrivals []time.Time
	got := 0
	deadline := time.After(20 * time.Second)
	for got < n {
		select {
		case <-recv.NotifReady():
		case <-deadline:
			t.Fatalf("only %d of %d notifications arrived", got, n)
		}
		ns, err := recv.GetNotifs()
		if err != nil {
			t.Fatal(err)
		}
		if k := len(ns["sender"]); k > 0 {
			got += k
			arrivals = append(arrivals, time.Now())
		}
	}
	elapsed := time.Since(start)
	bursts, maxGap := 1, time.Duration(0)
	for i := 1; i < len(arrivals); i++ {
		gap := arrivals[i].Sub(arrivals[i-1])
		maxGap = max(maxGap, gap)
		if gap > pace*3/10 {
			bursts++
		}
	}
	if maxGap < pace*6/10 {
		t.Errorf("notifications sent every 50 ms arrived at most %v apart: the worker was progressed more often than every %v", maxGap, pace)
	}
	if limit := int(elapsed/pace) + 2; bursts > limit {
		t.Errorf("%d bursts over %v; a worker progressed every %v allows at most %d", bursts, elapsed.Round(time.Millisecond), pace, limit)
	}
	t.Logf("%d notifications in %d batches, %d bursts, largest gap %v, over %v", n, len(arrivals), bursts, maxGap.Round(time.Millisecond), elapsed.Round(time.Millisecond))
}

func TestProgressPaceEnv(t *testing.T) {
	for _, tc := range []struct {
		v    string
		want time.Duration
		bad  bool
	}{
		{"", 0, false}, {"0", 0, false}, {"200ms", 200 * time.Millisecond, false}, {"100us", time.Millisecond, false},
		{"fast", 0, true}, {"-1s", 0, true}, {"2m", 0, true},
	} {
		t.Setenv(ProgressIntervalEnv, tc.v)
		got, err := progressPace()
		if (err != nil) != tc.bad || got != tc.want {
			t.Errorf("%q: got %v, %v", tc.v, got, err)
		}
	}
}
