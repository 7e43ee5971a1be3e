package engine

import (
	"context"
	"encoding/json"
	"io"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestRPC(t *testing.T) {
	defer goleak.VerifyNone(t)
	reqR, reqW := io.Pipe()
	repR, repW := io.Pipe()
	srv := NewRPCServer(repW)
	srv.Handle("echo", func(_ context.Context, p json.RawMessage) (any, error) {
		var s string
		_ = json.Unmarshal(p, &s)
		if s == "slow" {
			time.Sleep(50 * time.Millisecond)
		}
		srv.Emit("saw", s)
		return strings.ToUpper(s), nil
	})
	served := make(chan error, 1)
	go func() { served <- srv.Serve(context.Background(), reqR); repW.Close() }()
	c := NewRPCClient(repR, reqW)
	var wg sync.WaitGroup
	for _, s := range []string{"slow", "a", "b", "c"} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var out string
			if err := c.Call(context.Background(), "echo", s, &out); err != nil || out != strings.ToUpper(s) {
				t.Errorf("echo %s: %q %v", s, out, err)
			}
		}()
	}
	wg.Wait()
	if err := c.Call(context.Background(), "nope", nil, nil); err == nil || !strings.Contains(err.Error(), "unknown method") {
		t.Errorf("unknown method: %v", err)
	}
	// Garbage on the wire gets an error reply, not a dead server.
	_, _ = reqW.Write([]byte("{not json\n"))
	var out string
	if err := c.Call(context.Background(), "echo", "d", &out); err != nil || out != "D" {
		t.Errorf("after garbage: %q %v", out, err)
	}
	seen := 0
	for len(c.Events()) > 0 {
		<-c.Events()
		seen++
	}
	if seen != 5 {
		t.Errorf("%d events, want 5", seen)
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	if err := <-served; err != nil {
		t.Fatal(err)
	}
	<-c.Done()
	if err := c.Call(context.Background(), "echo", "x", nil); err == nil {
		t.Error("call after close succeeded")
	}
}
