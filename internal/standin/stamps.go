package standin

import (
	"net/http"
	"sync"
)

// LegStamps are one leg's CLOCK_MONOTONIC stamps (nanoseconds) on the
// stand-in's host, keyed by the prefill's request id (remote_request_id),
// which travels from the prefill to the decode in kv_transfer_params
// through any proxy: bench proxy joins a prefill's and a decode's by it.
type LegStamps struct {
	RemoteRequestID string `json:"remote_request_id"`
	// RequestID is the id the stand-in answered under (X-Request-Id).
	RequestID string `json:"request_id,omitempty"`
	Blocks    int    `json:"blocks"`
	// TArrive: the request came in; TReady: the KV was ready (prefill:
	// blocks filled; decode: READ done and checked); TSent: the answer
	// was written.
	TArrive int64 `json:"t_arrive"`
	TReady  int64 `json:"t_ready"`
	TSent   int64 `json:"t_sent"`
	// The decode's READ, its handshake's wait, and what its check found.
	TPostStart    int64   `json:"t_post_start,omitempty"`
	TXferDone     int64   `json:"t_xfer_done,omitempty"`
	HandshakeMS   float64 `json:"handshake_ms,omitempty"`
	CorruptBlocks int     `json:"corrupt_blocks,omitempty"`
}

// stampLogCap bounds the log: the oldest legs go first.
const stampLogCap = 1 << 16

// stampLog keeps the last stampLogCap legs' stamps.
type stampLog struct {
	mu   sync.Mutex
	ring []LegStamps
	next int
}

func newStampLog() *stampLog { return &stampLog{ring: make([]LegStamps, 0, 1024)} }

func (l *stampLog) add(s LegStamps) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.ring) < stampLogCap {
		l.ring = append(l.ring, s)
		return
	}
	l.ring[l.next] = s
	l.next = (l.next + 1) % stampLogCap
}

// All returns the legs kept, oldest first.
func (l *stampLog) All() []LegStamps {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := make([]LegStamps, 0, len(l.ring))
	out = append(out, l.ring[l.next:]...)
	return append(out, l.ring[:l.next]...)
}

// serve answers GET /nixlctl/legs: {"legs": [...]}, oldest first.
func (l *stampLog) serve(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, http.StatusOK, map[string]any{"legs": l.All()})
}
