// Package sglrooms holds SGLang's rooms as plain state machines, like
// lease.Table: no locks, no clock reads, no goroutines, no I/O, no cgo;
// every method that depends on time takes "now". Rooms is a prefill
// rank's (a room waits for decode's TransferInfos, is claimed, sent and
// remembered until its deadline; ABORTs, duplicates and late messages are
// counted), Tracker is decode's (SGLang's is_done: the chunks, the aux row
// and the dummy ranks' "nokv" of one room, in any order). The engine holds
// them under its lock, feeds them what its inboxes and notifications
// brought with the time they came, and does the I/O their answers call
// for; the wire codec is internal/sidechannel's (sglang.go).
package sglrooms

import "sort"

// State is where a prefill rank's room is.
type State uint8

const (
	// Bootstrapping: waiting for decode's TransferInfos.
	Bootstrapping State = iota
	// Ready: every decode rank's TransferInfo is in.
	Ready
	// Sending: prefill took the TransferInfos and is writing; what
	// arrives now is late and changes nothing.
	Sending
	// Aborted: decode aborted the room before prefill sent it.
	Aborted
	// Done: sent (or given up); kept until its deadline so late and
	// duplicate messages are recognised rather than opening a new room.
	Done
)

var stateNames = [...]string{"bootstrapping", "ready", "sending", "aborted", "done"}

func (s State) String() string { return stateNames[s] }

// Event is what a message did to a room.
type Event uint8

const (
	Accepted  Event = iota // taken, the room still waits for more
	Woke                   // the room became ready or aborted: wake its waiter
	Duplicate              // a second TransferInfo from the same decode agent: ignored
	Late                   // the room is sending or done: ignored
)

// room is one room on one prefill rank.
type room[I any] struct {
	state    State
	infos    map[string]I // by decode agent name; first one wins
	want     int          // TransferInfos to wait for (0: none seen yet)
	tReady   int64        // when the last TransferInfo arrived
	deadline int64        // dropped after this (0: never, while sending)
	gen      uint64       // which expiry entry is the room's current one
}

// Stats counts the room events that are not the happy path.
type Stats struct {
	Duplicates int64 // TransferInfos from an agent already in the room
	Late       int64 // TransferInfos or ABORTs after the room was taken
	Aborted    int64 // rooms aborted before sending
	Expired    int64 // rooms dropped at their deadline without being sent
}

type expiry struct {
	room     uint64
	deadline int64
	gen      uint64
}

// Rooms is one prefill rank's rooms. A room that nobody claims, or
// that is done, is forgotten ttl after its last change; deadlines are
// set as now+ttl, so they expire in the order they were set and a FIFO
// is enough to find them.
//
// I is the caller's TransferInfo (the engine's is
// sidechannel.SGLTransferInfo): the rooms keep it and hand it back, and
// never read it; its room, agent and required count come beside it.
type Rooms[I any] struct {
	ttl    int64
	rooms  map[uint64]*room[I]
	expiry []expiry
	gen    uint64
	stats  Stats
}

// New is a prefill rank's rooms, each forgotten ttl after its last change.
func New[I any](ttl int64) *Rooms[I] {
	return &Rooms[I]{ttl: ttl, rooms: map[uint64]*room[I]{}}
}

func (rs *Rooms[I]) room(id uint64, now int64) *room[I] {
	r := rs.rooms[id]
	if r == nil {
		r = &room[I]{infos: map[string]I{}}
		rs.rooms[id] = r
		rs.setDeadline(id, r, now)
	}
	return r
}

func (rs *Rooms[I]) setDeadline(id uint64, r *room[I], now int64) {
	rs.gen++
	r.deadline, r.gen = now+rs.ttl, rs.gen
	rs.expiry = append(rs.expiry, expiry{id, r.deadline, r.gen})
}

// sweep forgets the rooms whose deadline passed.
func (rs *Rooms[I]) sweep(now int64) {
	n := 0
	for _, x := range rs.expiry {
		if x.deadline > now {
			break
		}
		n++
		if r := rs.rooms[x.room]; r != nil && r.gen == x.gen {
			if r.state != Done {
				rs.stats.Expired++
			}
			delete(rs.rooms, x.room)
		}
	}
	rs.expiry = rs.expiry[n:]
}

// Info takes a decode rank's TransferInfo for room id, from decode agent
// agent, saying that required TransferInfos make the room. The first one
// per agent wins: a duplicate never changes what prefill sends, and
// nothing changes once the room is sending (the infos were handed out
// then).
func (rs *Rooms[I]) Info(id uint64, agent string, required int, info I, now int64) Event {
	rs.sweep(now)
	r := rs.room(id, now)
	switch r.state {
	case Sending, Done, Aborted:
		rs.stats.Late++
		return Late
	}
	if _, dup := r.infos[agent]; dup {
		rs.stats.Duplicates++
		return Duplicate
	}
	r.infos[agent] = info
	r.want = required
	if r.state == Bootstrapping && len(r.infos) >= r.want {
		r.state, r.tReady = Ready, now
		return Woke
	}
	return Accepted
}

// Abort is decode's ABORT: a room not taken yet will not be sent.
func (rs *Rooms[I]) Abort(id uint64, now int64) Event {
	rs.sweep(now)
	r := rs.room(id, now)
	switch r.state {
	case Bootstrapping, Ready:
		r.state = Aborted
		rs.stats.Aborted++
		return Woke
	}
	rs.stats.Late++
	return Late
}

// Claim is prefill asking for a room it is about to send: its state now
// (a room not seen yet, or one done before, is opened bootstrapping). The
// room lives at least ttl from now.
func (rs *Rooms[I]) Claim(id uint64, now int64) State {
	rs.sweep(now)
	if r := rs.rooms[id]; r != nil && r.state == Done {
		delete(rs.rooms, id) // a room id used again: a new room
	}
	r := rs.room(id, now)
	if r.state == Bootstrapping || r.state == Ready {
		rs.setDeadline(id, r, now)
	}
	return r.state
}

// Start hands a ready room's TransferInfos to prefill (sorted by agent,
// a copy: the room keeps its own) and marks it sending.
func (rs *Rooms[I]) Start(id uint64) (infos []I, tReady int64, ok bool) {
	r := rs.rooms[id]
	if r == nil || r.state != Ready {
		return nil, 0, false
	}
	r.state, r.deadline, r.gen = Sending, 0, 0
	agents := make([]string, 0, len(r.infos))
	for a := range r.infos {
		agents = append(agents, a)
	}
	sort.Strings(agents)
	for _, a := range agents {
		infos = append(infos, r.infos[a])
	}
	return infos, r.tReady, true
}

// Finish ends a room (sent, failed or given up): it is done, and
// remembered for ttl so late messages are counted, not parked.
func (rs *Rooms[I]) Finish(id uint64, now int64) {
	r := rs.rooms[id]
	if r == nil {
		return
	}
	r.state = Done
	r.infos = nil
	rs.setDeadline(id, r, now)
	rs.sweep(now)
}

// State is a room's state (false: no such room).
func (rs *Rooms[I]) State(id uint64) (State, bool) {
	r := rs.rooms[id]
	if r == nil {
		return 0, false
	}
	return r.state, true
}

// NotifEvent is what a notification did to a decode room.
type NotifEvent uint8

const (
	NotifProgress  NotifEvent = iota // counted, the room is not complete yet
	NotifComplete                    // the room just became complete
	NotifDuplicate                   // already counted (a chunk, the aux or a sender's end twice)
	NotifLate                        // the room was already complete
)

// Tracker is decode's view of one room: SGLang's is_done. Chunks,
// the aux row and the dummy ranks' "nokv" may arrive in any order; the
// room is complete once the aux is in and every sender's chunks up to
// its last one are.
type Tracker struct {
	aux      bool
	chunks   map[int]map[int]bool // sender -> chunk ids received
	expected map[int]int          // sender -> chunks (from its last chunk)
	senders  int                  // prefill ranks that must report
	complete bool
	tLast    int64
}

// Notif is one notification of a decode room, as the caller parsed it
// (sidechannel.ParseSGLNotif): its kind (kv, aux or nokv), and for kv
// the chunk, whether it is the sender's last and the sender; for nokv
// the sender.
type Notif struct {
	Kind   string // kv, aux, nokv
	Chunk  int
	Last   bool
	Sender int
}

// NewTracker is a room that senders prefill ranks must report.
func NewTracker(senders int) *Tracker {
	return &Tracker{chunks: map[int]map[int]bool{}, expected: map[int]int{}, senders: senders}
}

// Notif counts one notification of the room.
func (t *Tracker) Notif(n Notif, now int64) NotifEvent {
	if t.complete {
		return NotifLate
	}
	t.tLast = now
	ev := NotifProgress
	switch n.Kind {
	case "aux":
		if t.aux {
			ev = NotifDuplicate
		}
		t.aux = true
	case "nokv":
		if _, seen := t.expected[n.Sender]; seen {
			ev = NotifDuplicate
		}
		t.expected[n.Sender] = 0
		if t.chunks[n.Sender] == nil {
			t.chunks[n.Sender] = map[int]bool{}
		}
	case "kv":
		if t.chunks[n.Sender] == nil {
			t.chunks[n.Sender] = map[int]bool{}
		}
		if t.chunks[n.Sender][n.Chunk] {
			ev = NotifDuplicate
		}
		t.chunks[n.Sender][n.Chunk] = true
		if n.Last {
			t.expected[n.Sender] = n.Chunk + 1
		}
	}
	if t.done() {
		t.complete = true
		return NotifComplete
	}
	return ev
}

// TLast is when the last notification counted arrived (0: none yet).
func (t *Tracker) TLast() int64 { return t.tLast }

func (t *Tracker) done() bool {
	if !t.aux || len(t.expected) < t.senders {
		return false
	}
	for s, n := range t.expected {
		if len(t.chunks[s]) != n {
			return false
		}
	}
	return true
}
