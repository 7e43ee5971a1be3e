package xfertarget

import (
	"time"

	"github.com/nixlctl/nixlctl/internal/ctl"
)

// Client drives an xfer target (ctl.Start, ctl.StartInProcess or
// ctl.Dial) with typed requests.
type Client struct{ *ctl.Client }

// Call sends one request, its Op the method, and waits for the reply. It
// takes no context: the initiator still collects notifications and tags
// after an interrupt, and a target that dies fails the call at once.
func (c Client) Call(req Request) (Reply, error) {
	return ctl.CallRole[Reply](c.Client, "target", req.Op, req)
}

// Close asks the target to exit, killing a child still running 10 s later.
func (c Client) Close() error { return c.Client.Close(10*time.Second, nil) }
