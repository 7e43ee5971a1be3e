package ec

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

	"github.com/nixlctl/nixlctl/internal/nixl"
)

// `nixlctl serve encoder` is a producer driven over a control channel of
// JSON lines, like the xfer target: the bench (standing in for the
// orchestrator that sends images to the encode node) sets it up, asks it
// to encode images and reads its counters. Consumers never use this
// channel: they speak XferReq/XferAck to the producer's ROUTER and move
// bytes over the transfer backend.

// EncoderRequest is one control request.
type EncoderRequest struct {
	Op string `json:"op"` // setup, encode, stats, close

	// setup
	Backend     string `json:"backend,omitempty"`
	Name        string `json:"name,omitempty"`
	RegionBytes int    `json:"region_bytes,omitempty"`
	BlockBytes  int    `json:"block_bytes,omitempty"`
	CompatHash  string `json:"compat_hash,omitempty"`
	Listen      string `json:"listen,omitempty"`
	PinLeaseMS  int    `json:"pin_lease_ms,omitempty"`
	ShmDir      string `json:"shm_dir,omitempty"` // where the region file goes (default /dev/shm)

	// encode
	MMHash  string `json:"mm_hash,omitempty"`
	Bytes   int    `json:"bytes,omitempty"`
	DelayUS int64  `json:"delay_us,omitempty"`
	Wait    bool   `json:"wait,omitempty"`
}

// EncoderReply answers one request.
type EncoderReply struct {
	Error string `json:"error,omitempty"`

	Endpoint   string    `json:"endpoint,omitempty"`
	Name       string    `json:"name,omitempty"`
	Info       nixl.Info `json:"info,omitempty"`
	NumBlocks  int       `json:"num_blocks,omitempty"`
	RegionPath string    `json:"region_path,omitempty"`
	PID        int       `json:"pid,omitempty"`

	Encode *EncodeResult  `json:"encode,omitempty"`
	Stats  *ProducerStats `json:"stats,omitempty"`
}

// ServeEncoder answers control requests from r on w until "close", EOF or
// ctx ends, then closes the producer (unlinking its region).
func ServeEncoder(ctx context.Context, r io.Reader, w io.Writer, log *slog.Logger) error {
	var p *Producer
	defer func() {
		if p != nil {
			p.Close()
		}
	}()
	return serveLines(ctx, r, w, func(line []byte) (any, bool) {
		var req EncoderRequest
		if err := json.Unmarshal(line, &req); err != nil {
			return EncoderReply{Error: fmt.Sprintf("malformed request: %v", err)}, false
		}
		if req.Op == "close" {
			return EncoderReply{}, true
		}
		rep, err := encoderDo(ctx, &p, req, log)
		if err != nil {
			rep.Error = err.Error()
		}
		return rep, false
	})
}

func encoderDo(ctx context.Context, pp **Producer, req EncoderRequest, log *slog.Logger) (EncoderReply, error) {
	p := *pp
	if req.Op != "setup" && p == nil {
		return EncoderReply{}, errors.New("setup first")
	}
	switch req.Op {
	case "setup":
		if p != nil {
			return EncoderReply{}, errors.New("already set up")
		}
		np, err := StartProducer(ctx, ProducerConfig{Name: req.Name, Backend: req.Backend, RegionBytes: req.RegionBytes,
			BlockBytes: req.BlockBytes, CompatHash: req.CompatHash, Listen: req.Listen,
			PinLease: time.Duration(req.PinLeaseMS) * time.Millisecond, ShmDir: req.ShmDir, Log: log})
		if err != nil {
			return EncoderReply{}, err
		}
		*pp = np
		return EncoderReply{Endpoint: np.Endpoint(), Name: np.Agent().Name(), Info: np.Agent().Info(),
			NumBlocks: np.NumBlocks(), RegionPath: np.RegionPath(), PID: os.Getpid()}, nil
	case "encode":
		res, err := p.Encode(ctx, req.MMHash, req.Bytes, time.Duration(req.DelayUS)*time.Microsecond, req.Wait)
		return EncoderReply{Encode: &res}, err
	case "stats":
		s := p.Stats()
		return EncoderReply{Stats: &s, Info: p.Agent().Info()}, nil
	}
	return EncoderReply{}, fmt.Errorf("unknown op %q", req.Op)
}

// serveLines runs a JSON-lines request/reply loop: handle gets each line
// and returns the reply and whether to stop after sending it.
func serveLines(ctx context.Context, r io.Reader, w io.Writer, handle func(line []byte) (any, bool)) error {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<20), 64<<20)
	enc := json.NewEncoder(w)
	lines := make(chan []byte)
	scanErr := make(chan error, 1)
	go func() {
		defer close(lines)
		for sc.Scan() {
			select {
			case lines <- append([]byte(nil), sc.Bytes()...):
			case <-ctx.Done():
				return
			}
		}
		scanErr <- sc.Err()
	}()
	for {
		var line []byte
		var ok bool
		select {
		case <-ctx.Done():
			return ctx.Err()
		case line, ok = <-lines:
		}
		if !ok {
			select {
			case err := <-scanErr:
				return err
			default:
				return nil
			}
		}
		rep, stop := handle(line)
		if err := enc.Encode(rep); err != nil {
			return err
		}
		if stop {
			return nil
		}
	}
}

// EncoderClient drives a `serve encoder` over its control channel. Calls
// are serialised, so consumers on several goroutines can share it.
type EncoderClient struct {
	mu    sync.Mutex
	w     io.WriteCloser
	r     io.Reader
	dec   *json.Decoder
	cmd   *exec.Cmd
	done  chan error
	close func()
	dead  error
}

// Call sends one request and waits for its reply; a reply carrying an
// error becomes the returned error. After the channel broke (the encoder
// died), every call fails at once with the same error.
func (c *EncoderClient) Call(req EncoderRequest) (EncoderReply, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.dead != nil {
		return EncoderReply{}, c.dead
	}
	b, err := json.Marshal(req)
	if err != nil {
		return EncoderReply{}, err
	}
	if _, err := c.w.Write(append(b, '\n')); err != nil {
		c.dead = fmt.Errorf("encoder %s: %w", req.Op, err)
		return EncoderReply{}, c.dead
	}
	var rep EncoderReply
	if err := c.dec.Decode(&rep); err != nil {
		c.dead = fmt.Errorf("encoder %s: no reply (encoder gone?): %w", req.Op, err)
		return EncoderReply{}, c.dead
	}
	if rep.Error != "" {
		return rep, fmt.Errorf("encoder %s: %s", req.Op, rep.Error)
	}
	return rep, nil
}

// PID is the encoder process's pid (0 in process).
func (c *EncoderClient) PID() int {
	if c.cmd == nil || c.cmd.Process == nil {
		return 0
	}
	return c.cmd.Process.Pid
}

// Kill signals the encoder process (tests and chaos use it).
func (c *EncoderClient) Kill(sig syscall.Signal) error {
	if c.cmd == nil || c.cmd.Process == nil {
		return errors.New("encoder runs in this process")
	}
	return c.cmd.Process.Signal(sig)
}

// Close asks the encoder to exit and waits for it (killing it after a
// grace period).
func (c *EncoderClient) Close() error {
	c.mu.Lock()
	if c.w != nil {
		if c.r != nil {
			go func() { _, _ = io.Copy(io.Discard, c.r) }()
		}
		b, _ := json.Marshal(EncoderRequest{Op: "close"})
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
			err = errors.New("in-process encoder did not stop within 10 s")
		}
	}
	if c.close != nil {
		c.close()
	}
	return err
}

// StartEncoderProcess runs `exe args...` (normally `nixlctl serve encoder
// --stdio`) as a child whose stdin/stdout are the control channel; it
// dies with its parent. The child's stderr goes to errOut.
func StartEncoderProcess(ctx context.Context, exe string, args, env []string, errOut io.Writer) (*EncoderClient, error) {
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
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start encoder: %w", err)
	}
	br := bufio.NewReader(stdout)
	c := &EncoderClient{w: stdin, r: br, dec: json.NewDecoder(br), cmd: cmd, done: make(chan error, 1)}
	go func() { c.done <- cmd.Wait() }()
	stop := context.AfterFunc(ctx, func() { _ = cmd.Process.Kill() })
	c.close = func() { stop() }
	return c, nil
}

// StartEncoderInProcess serves an encoder on a goroutine of this process.
func StartEncoderInProcess(ctx context.Context, log *slog.Logger) *EncoderClient {
	reqR, reqW := io.Pipe()
	repR, repW := io.Pipe()
	c := &EncoderClient{w: reqW, r: repR, dec: json.NewDecoder(repR), done: make(chan error, 1)}
	go func() {
		err := ServeEncoder(ctx, reqR, repW, log)
		repW.CloseWithError(io.EOF)
		reqR.Close()
		c.done <- err
	}()
	return c
}

// DialEncoder connects to an encoder served with `nixlctl serve encoder
// --listen ADDR`.
func DialEncoder(ctx context.Context, addr string) (*EncoderClient, error) {
	addr = strings.TrimPrefix(addr, "tcp://")
	var d net.Dialer
	conn, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("connect to encoder %s: %w", addr, err)
	}
	c := &EncoderClient{w: conn, dec: json.NewDecoder(bufio.NewReader(conn)), done: make(chan error, 1)}
	c.close = func() { conn.Close() }
	c.done <- nil
	return c, nil
}
