package rendezvous

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/nixlctl/nixlctl/internal/testkit"
)

// TestRegisterWaitsForTheDriver: an endpoint that starts before its
// driver keeps trying until the driver listens.
func TestRegisterWaitsForTheDriver(t *testing.T) {
	defer goleak.VerifyNone(t)
	opt, logs := testOptions()
	addr := testkit.FreeAddr(t)
	type result struct {
		r   *Registration
		err error
	}
	joined := make(chan result, 1)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	go func() {
		r, err := Register(ctx, "tcp://"+addr, hello("r", "prefill", 0, 1, "127.0.0.1:7400"), opt)
		joined <- result{r, err}
	}()
	waitFor(t, func() bool { return strings.Contains(logs.String(), "driver not reachable yet") }, logs.String)
	d, err := Open(ctx, addr, PrefillDecode("r", 1, 0), opt)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	res := <-joined
	if res.err != nil {
		t.Fatal(res.err)
	}
	defer res.r.Close()
	if _, err := d.Wait(ctx, 5*time.Second); err != nil {
		t.Fatal(err)
	}
}

func TestRegisterGivesUp(t *testing.T) {
	defer goleak.VerifyNone(t)
	opt, _ := testOptions()
	addr := testkit.FreeAddr(t)
	if _, err := Register(context.Background(), addr, Hello{Role: "Bad"}, opt); err == nil || strings.Contains(err.Error(), "deadline") {
		t.Fatalf("a bad hello: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	_, err := Register(ctx, addr, hello("r", "prefill", 0, 1, "127.0.0.1:7400"), opt)
	if !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "refused") {
		t.Fatalf("no driver: %v", err)
	}
}
