package xfertarget

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"time"

	"github.com/nixlctl/nixlctl/internal/blocktag"
	"github.com/nixlctl/nixlctl/internal/ctl"
	"github.com/nixlctl/nixlctl/internal/nixl"
	"github.com/nixlctl/nixlctl/internal/nixl/cuda"
)

// The xfer target is the passive side of `bench xfer`: it owns a
// registered buffer that the initiator READs from or WRITEs into, and it
// answers a small control protocol (ctl methods named by Request.Op,
// one at a time) so the initiator can set it up, have it fill or verify tags,
// and collect notifications. The bytes themselves never cross the control
// channel.

// TargetRequest is one control request.
type Request struct {
	Op string `json:"op"` // the method: setup, load_md, fill, verify, notifs, await, info

	// setup
	Backend   string `json:"backend,omitempty"`
	Name      string `json:"name,omitempty"`
	Size      int    `json:"size,omitempty"`
	Alloc     string `json:"alloc,omitempty"` // DRAM: mmap, thp or ucx
	HugePages bool   `json:"huge_pages,omitempty"`
	Seg       string `json:"seg,omitempty"`    // DRAM (default) or VRAM
	Device    int    `json:"device,omitempty"` // the GPU of a VRAM buffer
	// Progress is the agent's nixl.Progress by name ("": background);
	// "spin" keeps the target looking for notifications, as nixlbench's.
	Progress string `json:"progress,omitempty"`

	// load_md
	MD []byte `json:"md,omitempty"`

	// fill / verify: descriptors of DescLen bytes at Offsets, tagged
	// TagKey(Seed, i) for the i-th.
	Seed    uint64  `json:"seed,omitempty"`
	DescLen int     `json:"desc_len,omitempty"`
	Offsets []int64 `json:"offsets,omitempty"`

	// notifs: wait up to WaitMS for at least Count notifications.
	// await: the same, then verify the descriptors' tags at once, so the
	// reply says whether the data was there when the notification was.
	Count  int `json:"count,omitempty"`
	WaitMS int `json:"wait_ms,omitempty"`

	// info: transports towards this remote agent.
	Remote string `json:"remote,omitempty"`
}

// TargetReply answers one request.
type Reply struct {
	MD      []byte    `json:"md,omitempty"`
	Addr    uint64    `json:"addr,omitempty"`
	Len     int       `json:"len,omitempty"`
	Alloc   string    `json:"alloc,omitempty"`
	Info    nixl.Info `json:"info,omitempty"`
	Name    string    `json:"name,omitempty"`
	Remote  string    `json:"remote,omitempty"`
	Corrupt int       `json:"corrupt,omitempty"`
	First   string    `json:"first,omitempty"`
	// PID is the target's process id (setup): a driver that dialed it on
	// its own host counts its CPU time as the run's, not a neighbour's.
	PID int `json:"pid,omitempty"`

	Notifs map[string][]string `json:"notifs,omitempty"`
}

// XferTarget is the state of one target endpoint.
type Target struct {
	log    *slog.Logger
	agent  nixl.Agent
	buf    *nixl.Buffer
	notifs map[string][]string
}

// Role is the target on a control channel: requests are its methods
// (the Op of each Request), answered one at a time; the agent and buffer
// are released when the session ends.
func Role(log *slog.Logger) ctl.Role {
	return func(s *ctl.Server) func() {
		t := &Target{log: log, notifs: map[string][]string{}}
		ops := []string{"setup", "load_md", "fill", "verify", "notifs", "await", "info"}
		ctl.HandleSerial(s, ops, func(ctx context.Context, op string, req Request) (any, error) {
			req.Op = op
			return t.do(ctx, req)
		})
		return t.close
	}
}

func (t *Target) do(ctx context.Context, req Request) (Reply, error) {
	if req.Op != "setup" && t.agent == nil {
		return Reply{}, errors.New("setup first")
	}
	switch req.Op {
	case "setup":
		return t.setup(req)
	case "load_md":
		name, err := t.agent.LoadRemoteMD(req.MD)
		return Reply{Remote: name}, err
	case "fill", "verify":
		return t.tags(req)
	case "notifs":
		return t.collect(ctx, req)
	case "await":
		rep, err := t.collect(ctx, req)
		if err != nil {
			return rep, err
		}
		req.Op = "verify"
		v, err := t.tags(req)
		v.Notifs = rep.Notifs
		return v, err
	case "info":
		return Reply{Info: t.agent.Info()}, nil
	}
	return Reply{}, fmt.Errorf("unknown op %q", req.Op)
}

func (t *Target) setup(req Request) (Reply, error) {
	if t.agent != nil {
		return Reply{}, errors.New("already set up")
	}
	mem := nixl.DRAM
	if req.Seg != "" {
		var err error
		if mem, err = nixl.ParseMemType(req.Seg); err != nil {
			return Reply{}, err
		}
	}
	progress, err := nixl.ParseProgress(req.Progress)
	if err != nil {
		return Reply{}, err
	}
	a, err := nixl.Open(req.Backend, nixl.Config{Name: req.Name, Progress: progress})
	if err != nil {
		return Reply{}, err
	}
	buf, md, err := nixl.LendBuffer(a, func() (*nixl.Buffer, error) {
		return cuda.AllocSeg(a, mem, req.Device, req.Size, req.Alloc, req.HugePages)
	})
	if err != nil {
		return Reply{}, err
	}
	t.agent, t.buf = a, buf
	return Reply{MD: md, Addr: buf.Addr, Len: buf.Len, Alloc: buf.Alloc, Info: a.Info(), Name: a.Name(), PID: os.Getpid()}, nil
}

func (t *Target) tags(req Request) (Reply, error) {
	// A debug line per point's fill and check, so a test (or a user
	// watching a sweep) sees which point the target is in.
	t.log.Debug("tags", "op", req.Op, "descriptors", len(req.Offsets), "bytes", req.DescLen)
	spans := make([]nixl.Span, len(req.Offsets))
	for i, off := range req.Offsets {
		if off < 0 || req.DescLen < 0 || off > int64(t.buf.Len) || int64(req.DescLen) > int64(t.buf.Len)-off {
			return Reply{}, fmt.Errorf("descriptor %d (%d+%d) outside the %d-byte buffer", i, off, req.DescLen, t.buf.Len)
		}
		spans[i] = nixl.Span{Off: int(off), Len: req.DescLen}
	}
	key := func(i int) uint64 { return blocktag.Key(req.Seed, uint64(i)) }
	if req.Op == "fill" {
		return Reply{}, blocktag.FillSpans(t.buf, spans, key)
	}
	c, err := blocktag.CheckSpans(t.buf, spans, key)
	if err != nil {
		return Reply{}, err
	}
	return Reply{Corrupt: c.Bad, First: c.First}, nil
}

func (t *Target) collect(ctx context.Context, req Request) (Reply, error) {
	deadline := time.Now().Add(time.Duration(req.WaitMS) * time.Millisecond)
	for {
		n, err := t.agent.GetNotifs()
		if err != nil {
			return Reply{}, err
		}
		for s, msgs := range n {
			for _, m := range msgs {
				t.notifs[s] = append(t.notifs[s], string(m))
			}
		}
		total := 0
		for _, m := range t.notifs {
			total += len(m)
		}
		if total >= req.Count || !time.Now().Before(deadline) {
			out := t.notifs
			t.notifs = map[string][]string{}
			return Reply{Notifs: out}, nil
		}
		select {
		case <-ctx.Done():
			return Reply{}, ctx.Err()
		case <-t.agent.NotifReady():
		case <-time.After(time.Until(deadline)):
		}
	}
}

func (t *Target) close() {
	if t.agent == nil {
		return
	}
	t.agent.Close()
	t.buf.Free()
	t.agent = nil
}
