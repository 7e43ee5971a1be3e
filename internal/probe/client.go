package probe

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/nixlctl/nixlctl/internal/ctl"
)

// PeerSpec says how to start a leak peer: this program again (`nixlctl
// serve leak-peer --stdio`) unless a test names its own binary.
type PeerSpec struct {
	Exe  string   // default: the running executable
	Args []string // default: serve leak-peer --stdio
	Env  []string // added to every peer's environment
}

// peerClient drives one leak peer process over its control channel.
type peerClient struct {
	name string
	c    *ctl.Client
	err  *tailBuffer // the peer's stderr (its last 256 KiB)
}

// callTimeout bounds one control call: a peer that does not answer is
// killed rather than waited for forever.
const callTimeout = 2 * time.Minute

// closeGrace is how long a peer may take to answer "close" and exit.
const closeGrace = 20 * time.Second

// startPeer runs the peer with env (full KEY=VALUE list) as its whole
// environment; its stderr is kept (and copied to tee when not nil).
func startPeer(ctx context.Context, name string, spec PeerSpec, env []string, tee io.Writer) (*peerClient, error) {
	args := spec.Args
	if args == nil {
		args = []string{"serve", "leak-peer", "--stdio"}
	}
	tail := &tailBuffer{max: 256 << 10}
	var stderr io.Writer = tail
	if tee != nil {
		stderr = io.MultiWriter(tail, tee)
	}
	c, err := ctl.Start(ctx, ctl.Cmd{Exe: spec.Exe, Args: args, Env: append(env, spec.Env...), Stderr: stderr})
	if err != nil {
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	return &peerClient{name: name, c: c, err: tail}, nil
}

// PID is the peer's process id.
func (c *peerClient) PID() int { return c.c.PID() }

// Call sends one request and waits for its reply; a reply carrying an
// error becomes the returned error, with the peer's last stderr line when
// the peer died.
func (c *peerClient) Call(req PeerRequest) (PeerReply, error) {
	ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
	defer cancel()
	var rep PeerReply
	err := c.c.Call(ctx, req.Op, req, &rep)
	switch {
	case err == nil:
		return rep, nil
	case errors.Is(err, context.DeadlineExceeded):
		_ = c.c.Signal(syscall.SIGKILL)
	case !errors.Is(err, ctl.ErrLost):
		return PeerReply{}, fmt.Errorf("%s %s: %w", c.name, req.Op, err)
	}
	msg := fmt.Sprintf("%s %s: no reply (%v)", c.name, req.Op, err)
	if last := c.err.lastLine(); last != "" {
		msg += "; its last words: " + last
	}
	return PeerReply{}, errors.New(msg)
}

// connectPeers sets up recv as the receiver and send as the sender, each
// by its setup request (Op and Role filled in here), and loads each one's
// metadata into the other, so that the sender can start writing. It
// returns the receiver's setup reply (its address and PID), even when a
// later step failed.
func connectPeers(recv, send *peerClient, recvSetup, sendSetup PeerRequest) (PeerReply, error) {
	recvSetup.Op, recvSetup.Role = "setup", "receiver"
	sendSetup.Op, sendSetup.Role = "setup", "sender"
	rrep, err := recv.Call(recvSetup)
	if err != nil {
		return rrep, err
	}
	srep, err := send.Call(sendSetup)
	if err != nil {
		return rrep, err
	}
	if _, err := send.Call(PeerRequest{Op: "load_md", MD: rrep.MD}); err != nil {
		return rrep, err
	}
	_, err = recv.Call(PeerRequest{Op: "load_md", MD: srep.MD})
	return rrep, err
}

// Stderr is what the peer wrote to stderr (the last 256 KiB).
func (c *peerClient) Stderr() string { return c.err.String() }

// Close asks the peer to exit and waits for it, killing it after a grace
// period; it returns the peer's final counters when it answered. Calling
// it again returns the same.
func (c *peerClient) Close() (PeerStats, error) {
	var rep PeerReply
	err := c.c.Close(closeGrace, &rep)
	return rep.Stats, err
}

// tailBuffer keeps the last max bytes written to it.
type tailBuffer struct {
	mu  sync.Mutex
	max int
	b   []byte
}

func (t *tailBuffer) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.b = append(t.b, p...)
	if over := len(t.b) - t.max; over > 0 {
		t.b = append(t.b[:0], t.b[over:]...)
	}
	return len(p), nil
}

func (t *tailBuffer) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return string(t.b)
}

func (t *tailBuffer) lastLine() string {
	lines := strings.Split(strings.TrimSpace(t.String()), "\n")
	return strings.TrimSpace(lines[len(lines)-1])
}
