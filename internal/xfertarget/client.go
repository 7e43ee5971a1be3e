package xfertarget

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"time"
)

// TargetClient drives an xfer target over its control channel.
type Client struct {
	mu    sync.Mutex
	w     io.WriteCloser
	r     io.Reader // replies; drained on Close so the target is never blocked writing one
	dec   *json.Decoder
	cmd   *exec.Cmd // nil for an in-process target
	done  chan error
	close func()
}

// Call sends one request and waits for its reply; a reply carrying an
// error becomes the returned error.
func (c *Client) Call(req Request) (Reply, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	b, err := json.Marshal(req)
	if err != nil {
		return Reply{}, err
	}
	if _, err := c.w.Write(append(b, '\n')); err != nil {
		return Reply{}, fmt.Errorf("target %s: %w", req.Op, err)
	}
	var rep Reply
	if err := c.dec.Decode(&rep); err != nil {
		return Reply{}, fmt.Errorf("target %s: no reply: %w", req.Op, err)
	}
	if rep.Error != "" {
		return rep, fmt.Errorf("target %s: %s", req.Op, rep.Error)
	}
	return rep, nil
}

// PID is the target process's pid (0 in process).
func (c *Client) PID() int {
	if c.cmd == nil || c.cmd.Process == nil {
		return 0
	}
	return c.cmd.Process.Pid
}

// Kill sends the target process a signal (tests and chaos use it).
func (c *Client) Kill(sig syscall.Signal) error {
	if c.cmd == nil || c.cmd.Process == nil {
		return errors.New("target runs in this process")
	}
	return c.cmd.Process.Signal(sig)
}

// Close asks the target to exit and waits for it (killing it after a
// grace period).
func (c *Client) Close() error {
	c.mu.Lock()
	if c.w != nil {
		if c.r != nil {
			go func() { _, _ = io.Copy(io.Discard, c.r) }()
		}
		b, _ := json.Marshal(Request{Op: "close"})
		_, _ = c.w.Write(append(b, '\n'))
		c.w.Close()
		c.w = nil
	}
	c.mu.Unlock()
	var err error
	select {
	case err = <-c.done:
	case <-time.After(10 * time.Second):
		if c.cmd != nil && c.cmd.Process != nil {
			_ = c.cmd.Process.Kill()
			err = <-c.done
		} else {
			err = errors.New("in-process target did not stop within 10 s")
		}
	}
	if c.close != nil {
		c.close()
	}
	return err
}

// StartTargetProcess runs `exe args...` as a child whose stdin/stdout are
// the control channel (`nixlctl serve target --stdio`, or a test binary).
// The child's stderr goes to errOut.
func StartProcess(ctx context.Context, exe string, args []string, env []string, errOut io.Writer) (*Client, error) {
	cmd := exec.Command(exe, args...)
	cmd.Env = append(os.Environ(), env...)
	cmd.Stderr = errOut
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	// Die with the parent even if it is killed (Linux).
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start target: %w", err)
	}
	br := bufio.NewReader(stdout)
	c := &Client{w: stdin, r: br, dec: json.NewDecoder(br), cmd: cmd, done: make(chan error, 1)}
	go func() { c.done <- cmd.Wait() }()
	stop := context.AfterFunc(ctx, func() { _ = cmd.Process.Kill() })
	c.close = func() { stop() }
	return c, nil
}

// StartTargetInProcess serves a target on a goroutine of this process.
func StartInProcess(ctx context.Context, log *slog.Logger) *Client {
	reqR, reqW := io.Pipe()
	repR, repW := io.Pipe()
	c := &Client{w: reqW, r: repR, dec: json.NewDecoder(repR), done: make(chan error, 1)}
	go func() {
		err := Serve(ctx, reqR, repW, log)
		repW.CloseWithError(io.EOF)
		reqR.Close()
		c.done <- err
	}()
	return c
}

// DialTarget connects to a target served with `nixlctl serve target
// --listen ADDR` (addr is host:port, optionally prefixed with tcp://).
func Dial(ctx context.Context, addr string) (*Client, error) {
	addr = strings.TrimPrefix(addr, "tcp://")
	var d net.Dialer
	conn, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("connect to target %s: %w", addr, err)
	}
	c := &Client{w: conn, dec: json.NewDecoder(bufio.NewReader(conn)), done: make(chan error, 1)}
	c.close = func() { conn.Close() }
	c.done <- nil
	return c, nil
}
