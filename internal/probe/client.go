package probe

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"
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
	mu   sync.Mutex
	cmd  *exec.Cmd
	w    io.WriteCloser
	r    *bufio.Reader
	dec  *json.Decoder
	done chan error
	err  *tailBuffer // the peer's stderr (its last 256 KiB)
	stop func() bool

	closeOnce  sync.Once
	closeStats PeerStats
	closeErr   error
}

// callTimeout bounds one control call: a peer that does not answer is
// killed rather than waited for forever.
const callTimeout = 2 * time.Minute

// startPeer runs the peer with env (full KEY=VALUE list) as its whole
// environment; its stderr is kept (and copied to tee when not nil).
func startPeer(ctx context.Context, name string, spec PeerSpec, env []string, tee io.Writer) (*peerClient, error) {
	exe := spec.Exe
	if exe == "" {
		var err error
		if exe, err = selfExe(); err != nil {
			return nil, err
		}
	}
	args := spec.Args
	if args == nil {
		args = []string{"serve", "leak-peer", "--stdio"}
	}
	cmd := exec.Command(exe, args...)
	cmd.Env = append(env, spec.Env...)
	tail := &tailBuffer{max: 256 << 10}
	if tee != nil {
		cmd.Stderr = io.MultiWriter(tail, tee)
	} else {
		cmd.Stderr = tail
	}
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	// Die with the parent even if it is killed.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	br := bufio.NewReader(stdout)
	c := &peerClient{name: name, cmd: cmd, w: stdin, r: br, dec: json.NewDecoder(br), done: make(chan error, 1), err: tail}
	go func() { c.done <- cmd.Wait() }()
	c.stop = context.AfterFunc(ctx, func() { _ = cmd.Process.Kill() })
	return c, nil
}

// PID is the peer's process id.
func (c *peerClient) PID() int { return c.cmd.Process.Pid }

// Call sends one request and waits for its reply; a reply carrying an
// error becomes the returned error, with the peer's last stderr line when
// the peer died.
func (c *peerClient) Call(req PeerRequest) (PeerReply, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	b, err := json.Marshal(req)
	if err != nil {
		return PeerReply{}, err
	}
	if c.w == nil {
		return PeerReply{}, fmt.Errorf("%s %s: closed", c.name, req.Op)
	}
	kill := time.AfterFunc(callTimeout, func() { _ = c.cmd.Process.Kill() })
	defer kill.Stop()
	if _, err := c.w.Write(append(b, '\n')); err != nil {
		return PeerReply{}, c.failed(req.Op, err)
	}
	var rep PeerReply
	if err := c.dec.Decode(&rep); err != nil {
		return PeerReply{}, c.failed(req.Op, err)
	}
	if rep.Error != "" {
		return rep, fmt.Errorf("%s %s: %s", c.name, req.Op, rep.Error)
	}
	return rep, nil
}

func (c *peerClient) failed(op string, err error) error {
	msg := fmt.Sprintf("%s %s: no reply (%v)", c.name, op, err)
	if last := c.err.lastLine(); last != "" {
		msg += "; its last words: " + last
	}
	return errors.New(msg)
}

// Stderr is what the peer wrote to stderr (the last 256 KiB).
func (c *peerClient) Stderr() string { return c.err.String() }

// Close asks the peer to exit and waits for it, killing it after a grace
// period; it returns the peer's final counters when it answered. Calling
// it again returns the same.
func (c *peerClient) Close() (PeerStats, error) {
	c.closeOnce.Do(func() { c.closeStats, c.closeErr = c.close() })
	return c.closeStats, c.closeErr
}

func (c *peerClient) close() (PeerStats, error) {
	c.mu.Lock()
	var st PeerStats
	var werr error
	if c.w != nil {
		b, _ := json.Marshal(PeerRequest{Op: "close"})
		if _, err := c.w.Write(append(b, '\n')); err == nil {
			var rep PeerReply
			done := make(chan error, 1)
			go func() { done <- c.dec.Decode(&rep) }()
			select {
			case err := <-done:
				if err == nil {
					st = rep.Stats
				}
				// Never leave the peer blocked writing to a full pipe.
				go func() { _, _ = io.Copy(io.Discard, c.r) }()
			case <-time.After(10 * time.Second):
				_ = c.cmd.Process.Kill()
			}
		}
		c.w.Close()
		c.w = nil
	}
	c.mu.Unlock()
	select {
	case werr = <-c.done:
	case <-time.After(10 * time.Second):
		_ = c.cmd.Process.Kill()
		werr = <-c.done
	}
	c.stop()
	return st, werr
}

// selfExe is this program, to run again as a peer: the name it was
// started as when that resolves (a test harness may run it under another
// name, as testscript does), else the running executable.
func selfExe() (string, error) {
	if p, err := exec.LookPath(os.Args[0]); err == nil {
		if abs, err := filepath.Abs(p); err == nil {
			return abs, nil
		}
	}
	return os.Executable()
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
