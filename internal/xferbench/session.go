package xferbench

import (
	"context"

	"github.com/nixlctl/nixlctl/internal/report"
)

// Session is a bench xfer run held open so that another run can measure
// single points between its own phases (the handoffs' interleaved
// references): its target and buffers stay up from one point to the next.
type Session struct{ r *xferRun }

// StartSession checks xo and sets up its target and buffers.
func StartSession(ctx context.Context, xo XferOptions) (*Session, error) {
	if err := xo.Validate(); err != nil {
		return nil, err
	}
	xo.TargetDevice = xo.targetDevice()
	res := &XferResult{Meta: report.NewMeta("bench xfer", xo.Version)}
	r, err := setupXfer(ctx, &xo, res, xo.bufferSize())
	if err != nil {
		return nil, err
	}
	return &Session{r}, nil
}

// Options are the session's options, as checked.
func (s *Session) Options() XferOptions { return *s.r.o }

// Point measures one point (idx names it in errors): iters timed
// transfers of batch blocks of block bytes, after warmup untimed ones.
func (s *Session) Point(ctx context.Context, idx, block, batch, iters, warmup int) (XferPoint, error) {
	s.r.o.NumIter, s.r.o.WarmupIter = iters, warmup
	return s.r.point(ctx, idx, block, batch)
}

// Close stops the target and frees the buffers.
func (s *Session) Close() { s.r.close() }
