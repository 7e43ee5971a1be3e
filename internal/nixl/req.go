package nixl

import "sync/atomic"

// Request is what a Book asks of a backend's request type: a pointer to
// a struct that embeds ReqHead.
type Request interface {
	comparable
	XferReq
	Released() bool
	reqHead() *ReqHead
}

// ReqHead is the part of a backend's request that every backend keeps
// alike: what the request says about itself (XferInfo, set by the
// backend), the agent that made it, so that a request handed to another
// agent is refused, and whether it was released. The released flag is
// atomic because polls and completion goroutines read it without the
// agent's lock.
type ReqHead struct {
	XferInfo
	owner    any // the making agent's Book, set by AddReqLocked
	released atomic.Bool
}

func (h *ReqHead) reqHead() *ReqHead { return h }

// Released reports whether the request was released (or freed at Close,
// for a backend that marks it so).
func (h *ReqHead) Released() bool { return h.released.Load() }

// MarkReleased marks the request released without going through the
// book, for a backend whose Close frees every request's transport state:
// later calls must not reach it.
func (h *ReqHead) MarkReleased() { h.released.Store(true) }
