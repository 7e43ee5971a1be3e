package handoff

import (
	"slices"
	"sync"

	"github.com/nixlctl/nixlctl/internal/cpuspeed"
	"github.com/nixlctl/nixlctl/internal/engine"
	"github.com/nixlctl/nixlctl/internal/hostload"
	"github.com/nixlctl/nixlctl/internal/xferbench"
)

// handoff runs one benchmark's requests over a started fleet as the
// router would, and keeps their records.
type handoff struct {
	o        *HandoffOptions
	pes, des []*Endpoint
	psetups  []engine.SetupReply
	dtp      []int // each decode's TP
	router   *router
	// arrivalsDelayed counts open-loop arrivals that waited for a slot
	// (--max-inflight); only the dispatching goroutine touches it.
	arrivalsDelayed int
	mu              sync.Mutex
	records         []HandoffRecord
	freed           map[string]engine.FreedEvent // by router id
	waiting         map[string]chan engine.FreedEvent
	start           int64
	end             int64
	// rounds, when set, interleaves the bench xfer reference with the
	// closed loop's requests, a round at a time.
	rounds *interleave
	cpuMu  sync.Mutex
	cpu    []cpuspeed.Reading
	// load samples what other processes take of the host's CPUs at each
	// CPU reading (nil: not sampled).
	load *hostload.Recorder
	// unstreamed holds the finished requests whose records wait for
	// prefill's release before they are streamed (o.Records): their
	// position in records, by router id.
	unstreamed map[string]int
	// lost is told, by the request that found it, that an engine's
	// control channel is gone: its watcher would say so too, but a
	// closed loop can fail hundreds of requests on the dead engine
	// before the watcher runs (pull sent 300 in one run).
	lost func(role string, idx int)
}

// readCPU takes a reading of the host's CPU speed (cpuspeed), while no
// request is in flight, and a sample of the host's load (hostload).
func (h *handoff) readCPU() {
	if h.load != nil {
		if err := h.load.Take(); err != nil {
			h.o.Log.Debug("host load sample", "err", err)
		}
	}
	r, err := cpuspeed.Measure()
	if err != nil {
		h.o.Log.Debug("cpu speed reading", "err", err)
		return
	}
	h.cpuMu.Lock()
	h.cpu = append(h.cpu, r)
	h.cpuMu.Unlock()
}

func (h *handoff) cpuReadings() []cpuspeed.Reading {
	h.cpuMu.Lock()
	defer h.cpuMu.Unlock()
	return slices.Clone(h.cpu)
}

// interleave runs the reference rounds between a closed loop's handoff
// rounds.
type interleave struct {
	h       *handoff
	backend string
	// size is the requests of a full round.
	size int
	// xfer and limit measure on runs set up after the first round, when
	// the handoff's descriptors are known; limit is nil where there is no
	// faster path to measure (another backend, VRAM, a remote endpoint).
	xfer, limit  *xferbench.Session
	block, batch int
	// span is the memory each side of the references walks (a rank's
	// pool, xferbench's Spread); 0: the pipeline's slots only.
	span      int64
	mu        sync.Mutex
	refs      []roundRefs
	touchOnce sync.Once
	// off says why rounds stopped (setup or a round failed); the run then
	// reports the rounds it has and warns with it.
	off string
}
