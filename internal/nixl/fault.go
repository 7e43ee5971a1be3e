package nixl

import (
	"errors"
	"math"
	"math/rand/v2"
	"strings"
	"sync"
	"time"
)

// Faults says which failures WithFaults injects. Probabilities are per
// event in [0, 1]; the zero value injects nothing.
type Faults struct {
	// Incoming notifications (seen by GetNotifs) that match NotifPrefix
	// (all when empty) are dropped, duplicated or held back by
	// DelayNotifs; delayed ones come out of a later GetNotifs, after
	// notifications that arrived behind them (a reorder).
	DropNotif   float64
	DupNotif    float64
	DelayNotif  float64
	DelayNotifs time.Duration
	NotifPrefix string
	// Outgoing SendNotif calls that match NotifPrefix are dropped, at
	// random, or with DropSendEvenly spread evenly: matching send k
	// (from 0) is dropped when floor((k+1)*DropSend) > floor(k*DropSend),
	// so 0.5 drops every other one and never two in a row.
	DropSend       float64
	DropSendEvenly bool
	// PostXferReq fails without posting; XferStatus reports a request
	// failed although it ran (the request is waited for on release).
	FailPost   float64
	FailStatus float64
	Seed       uint64
}

// FaultStats counts what was injected.
type FaultStats struct {
	DroppedNotifs    int `json:"dropped_notifs"`
	DuplicatedNotifs int `json:"duplicated_notifs"`
	DelayedNotifs    int `json:"delayed_notifs"`
	DroppedSends     int `json:"dropped_sends"`
	FailedPosts      int `json:"failed_posts"`
	FailedStatuses   int `json:"failed_statuses"`
}

// ErrInjected marks a failure that WithFaults made up.
var ErrInjected = errors.New("injected fault")

// FaultyAgent wraps an agent and injects Faults.
type FaultyAgent struct {
	Agent
	f Faults

	mu      sync.Mutex
	rng     *rand.Rand
	sends   int // matching SendNotif calls so far (DropSendEvenly)
	stats   FaultStats
	held    []heldNotif
	failed  map[XferReq]bool
	readyCh chan struct{} // held notifications due
	merged  chan struct{} // what NotifReady returns
	stop    chan struct{}
	stopped chan struct{}
}

type heldNotif struct {
	from  string
	msg   []byte
	until time.Time
}

// WithFaults wraps a with fault injection.
func WithFaults(a Agent, f Faults) *FaultyAgent {
	fa := &FaultyAgent{Agent: a, f: f, rng: rand.New(rand.NewPCG(f.Seed, f.Seed^0x5eed)), failed: map[XferReq]bool{},
		readyCh: make(chan struct{}, 1), merged: make(chan struct{}, 1), stop: make(chan struct{}), stopped: make(chan struct{})}
	go fa.mergeReady()
	return fa
}

// mergeReady forwards the wrapped agent's signal and due delayed
// notifications to the one channel NotifReady hands out.
func (a *FaultyAgent) mergeReady() {
	defer close(a.stopped)
	inner := a.Agent.NotifReady()
	for {
		select {
		case <-a.stop:
			return
		case <-inner:
		case <-a.readyCh:
		}
		select {
		case a.merged <- struct{}{}:
		default:
		}
	}
}

// Close stops the wrapper and closes the wrapped agent.
func (a *FaultyAgent) Close() error {
	select {
	case <-a.stop:
	default:
		close(a.stop)
	}
	<-a.stopped
	return a.Agent.Close()
}

// Unwrap returns the wrapped agent.
func (a *FaultyAgent) Unwrap() Agent { return a.Agent }

// Stats returns what was injected so far.
func (a *FaultyAgent) Stats() FaultStats {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.stats
}

// SetFaults changes the faults from now on, so one wrapped agent can go
// through several fault regimes. Only the tests switch faults today: the
// chaos scenarios fix theirs in WithFaults.
func (a *FaultyAgent) SetFaults(f Faults) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.f = f
}

func (a *FaultyAgent) roll(p float64) bool { return p > 0 && a.rng.Float64() < p }

func (a *FaultyAgent) matches(msg []byte) bool {
	return a.f.NotifPrefix == "" || strings.HasPrefix(string(msg), a.f.NotifPrefix)
}

// GetNotifs applies drop, duplicate and delay to what arrived.
func (a *FaultyAgent) GetNotifs() (Notifs, error) {
	in, err := a.Agent.GetNotifs()
	if err != nil {
		return nil, err
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	out := Notifs{}
	now := time.Now()
	for from, msgs := range in {
		for _, m := range msgs {
			if !a.matches(m) {
				out[from] = append(out[from], m)
				continue
			}
			switch {
			case a.roll(a.f.DropNotif):
				a.stats.DroppedNotifs++
			case a.roll(a.f.DelayNotif):
				a.stats.DelayedNotifs++
				a.held = append(a.held, heldNotif{from, m, now.Add(a.f.DelayNotifs)})
			default:
				out[from] = append(out[from], m)
				if a.roll(a.f.DupNotif) {
					a.stats.DuplicatedNotifs++
					out[from] = append(out[from], m)
				}
			}
		}
	}
	kept := a.held[:0]
	for _, h := range a.held {
		if now.Before(h.until) {
			kept = append(kept, h)
			continue
		}
		out[h.from] = append(out[h.from], h.msg)
	}
	a.held = kept
	if len(a.held) > 0 {
		// Wake consumers when the next held notification is due.
		due := time.Until(a.held[0].until)
		time.AfterFunc(due, func() {
			select {
			case a.readyCh <- struct{}{}:
			default:
			}
		})
	}
	return out, nil
}

// NotifReady is signalled when the wrapped agent has notifications or a
// delayed one is due.
func (a *FaultyAgent) NotifReady() <-chan struct{} { return a.merged }

// SendNotif drops matching notifications with probability DropSend.
func (a *FaultyAgent) SendNotif(remote string, msg []byte) error {
	a.mu.Lock()
	var drop bool
	if a.matches(msg) {
		if a.f.DropSendEvenly {
			k := float64(a.sends)
			drop = math.Floor((k+1)*a.f.DropSend) > math.Floor(k*a.f.DropSend)
			a.sends++
		} else {
			drop = a.roll(a.f.DropSend)
		}
	}
	if drop {
		a.stats.DroppedSends++
	}
	a.mu.Unlock()
	if drop {
		return nil
	}
	return a.Agent.SendNotif(remote, msg)
}

// PostXferReq fails with probability FailPost.
func (a *FaultyAgent) PostXferReq(r XferReq) (Status, error) {
	a.mu.Lock()
	fail := a.roll(a.f.FailPost)
	if fail {
		a.stats.FailedPosts++
	}
	delete(a.failed, r)
	a.mu.Unlock()
	if fail {
		return Failed, ErrInjected
	}
	return a.Agent.PostXferReq(r)
}

// XferStatus reports a running or finished request failed with
// probability FailStatus (once failed, it stays failed until reposted).
func (a *FaultyAgent) XferStatus(r XferReq) (Status, error) {
	a.mu.Lock()
	if a.failed[r] {
		a.mu.Unlock()
		return Failed, ErrInjected
	}
	fail := a.roll(a.f.FailStatus)
	if fail {
		a.stats.FailedStatuses++
		a.failed[r] = true
	}
	a.mu.Unlock()
	if fail {
		return Failed, ErrInjected
	}
	return a.Agent.XferStatus(r)
}

// ReleaseXferReq lets a request reported failed by injection finish for
// real first, since its transfer is still running underneath.
func (a *FaultyAgent) ReleaseXferReq(r XferReq) error {
	a.mu.Lock()
	injected := a.failed[r]
	delete(a.failed, r)
	a.mu.Unlock()
	if injected {
		deadline := time.Now().Add(30 * time.Second)
		for time.Now().Before(deadline) {
			if st, _ := a.Agent.XferStatus(r); st != InProgress {
				break
			}
			time.Sleep(50 * time.Microsecond)
		}
	}
	return a.Agent.ReleaseXferReq(r)
}
