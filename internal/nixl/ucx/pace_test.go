package ucx

import (
	"testing"
	"time"

	"github.com/nixlctl/nixlctl/internal/nixl"
)

// A paced agent's worker runs only once per interval, so notifications
// sent to it one by one arrive in a few bursts, one per progress call.
// (Counting bursts gives an upper bound that a slow machine can only
// lower, unlike timing single deliveries.)
func TestProgressPaceBatchesDelivery(t *testing.T) {
	const pace = 400 * time.Millisecond
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

	const n = 20
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
	got, batches := 0, 0
	deadline := time.After(10 * time.Second)
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
			batches++
		}
	}
	elapsed := time.Since(start)
	if limit := int(elapsed/pace) + 2; batches > limit {
		t.Errorf("%d notifications arrived in %d batches over %v; a worker progressed every %v allows at most %d",
			n, batches, elapsed.Round(time.Millisecond), pace, limit)
	}
	t.Logf("%d notifications in %d batches over %v", n, batches, elapsed.Round(time.Millisecond))
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
