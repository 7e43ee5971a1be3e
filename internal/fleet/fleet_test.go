package fleet

import (
	"context"
	"encoding/json"
	"errors"
	"net"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/nixlctl/nixlctl/internal/ctl"
)

func echoRole(s *ctl.Server) func() {
	s.Handle("echo", func(_ context.Context, p json.RawMessage) (any, error) { return p, nil })
	return nil
}

// Each place a Proc can run starts what it says, reports where, and
// leaves nothing running once closed.
func TestStart(t *testing.T) {
	defer goleak.VerifyNone(t)
	// A port that refuses: bound, then closed.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	refused := l.Addr().String()
	l.Close()
	for _, tc := range []struct {
		name      string
		p         Proc
		where     string
		dialError bool
		errHas    string
	}{
		{name: "in process", p: Proc{Name: "t", InProcess: echoRole, Addr: "ignored:1"}, where: InProcess},
		{name: "in process, outliving", p: Proc{Name: "t", InProcess: echoRole, Outlive: true}, where: InProcess},
		{name: "address refused", p: Proc{Name: "t", Addr: refused}, dialError: true, errHas: "connect to t " + refused + ": "},
		{name: "child that cannot start", p: Proc{Name: "t", Exe: "/nonexistent/nixlctl", DefaultArgs: []string{"serve"}}, errHas: "start t: "},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			c, err := Start(ctx, tc.p)
			if tc.errHas != "" {
				var dial *DialError
				if err == nil || !strings.Contains(err.Error(), tc.errHas) || errors.As(err, &dial) != tc.dialError {
					t.Fatalf("Start = %v, want an error with %q (a DialError: %v)", err, tc.errHas, tc.dialError)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if c.Where != tc.where {
				t.Errorf("Where = %q, want %q", c.Where, tc.where)
			}
			var got string
			if err := c.Call(ctx, "echo", "hi", &got); err != nil || got != "hi" {
				t.Errorf("echo = %q, %v", got, err)
			}
			if err := c.Close(time.Second, nil); err != nil {
				t.Errorf("Close: %v", err)
			}
			if err := c.Close(time.Second, nil); err != nil {
				t.Errorf("second Close: %v", err)
			}
		})
	}
}
