package ec

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"time"

	"github.com/nixlctl/nixlctl/internal/ctl"
	"github.com/nixlctl/nixlctl/internal/nixl"
)

// `nixlctl serve encoder` is a producer driven over a control channel
// (internal/ctl), like the xfer target: the bench (standing in for the
// orchestrator that sends images to the encode node) sets it up, asks it
// to encode images and reads its counters. Consumers never use this
// channel: they speak XferReq/XferAck to the producer's ROUTER and move
// bytes over the transfer backend.

// EncoderRequest is one control request.
type EncoderRequest struct {
	Op string `json:"op"` // the method: setup, encode, stats

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
	Endpoint   string    `json:"endpoint,omitempty"`
	Name       string    `json:"name,omitempty"`
	Info       nixl.Info `json:"info,omitempty"`
	NumBlocks  int       `json:"num_blocks,omitempty"`
	RegionPath string    `json:"region_path,omitempty"`
	PID        int       `json:"pid,omitempty"`

	Encode *EncodeResult  `json:"encode,omitempty"`
	Stats  *ProducerStats `json:"stats,omitempty"`
}

// EncoderRole is the encoder on a control channel: requests are its
// methods (the Op of each EncoderRequest), answered one at a time, as one
// encode node works through its images; the producer closes (unlinking
// its region) when the session ends.
func EncoderRole(log *slog.Logger) ctl.Role {
	return func(s *ctl.Server) func() {
		var p *Producer
		ctl.HandleSerial(s, []string{"setup", "encode", "stats"}, func(ctx context.Context, op string, req EncoderRequest) (any, error) {
			req.Op = op
			return encoderDo(ctx, &p, req, log)
		})
		return func() {
			if p != nil {
				p.Close()
			}
		}
	}
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

// EncoderClient drives a `serve encoder` (ctl.Start, ctl.StartInProcess
// or ctl.Dial) with typed requests; consumers on several goroutines can
// share it.
type EncoderClient struct{ *ctl.Client }

// Call sends one request, its Op the method, and waits for the reply.
// After the encoder died every call fails at once. It takes no context:
// the run collects the encoder's counters even after an interrupt.
func (c EncoderClient) Call(req EncoderRequest) (EncoderReply, error) {
	return ctl.CallRole[EncoderReply](c.Client, "encoder", req.Op, req)
}

// Close asks the encoder to exit, killing a child still running 10 s
// later.
func (c EncoderClient) Close() error { return c.Client.Close(10*time.Second, nil) }
