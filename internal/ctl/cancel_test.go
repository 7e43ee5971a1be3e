package ctl

import (
	"context"
	"encoding/json"
	"errors"
	"testing"
	"time"

	"go.uber.org/goleak"
)

// A caller that gives up on a request cancels it at the server too: the
// handler's context ends, so the work stops instead of running on for a
// run that has stopped.
func TestCallCancelReachesTheHandler(t *testing.T) {
	defer goleak.VerifyNone(t)
	stopped := make(chan error, 1)
	role := func(s *Server) func() {
		s.Handle("wait", func(ctx context.Context, _ json.RawMessage) (any, error) {
			select {
			case <-ctx.Done():
				stopped <- ctx.Err()
			case <-time.After(10 * time.Second):
				stopped <- errors.New("never cancelled")
			}
			return nil, ctx.Err()
		})
		return func() {}
	}
	c := StartInProcess(context.Background(), role)
	defer c.Close(time.Second, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if err := c.Call(ctx, "wait", nil, nil); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("call: %v", err)
	}
	select {
	case err := <-stopped:
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("handler: %v, want its context cancelled", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the handler was never told")
	}
}
