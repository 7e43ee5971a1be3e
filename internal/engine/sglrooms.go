package engine

import (
	"sort"

	"github.com/nixlctl/nixlctl/internal/sidechannel"
)

// SGLang's rooms as plain state machines, like lease.Table: no locks, no
// clock reads, no I/O; every method that depends on time takes "now".
// sglState holds them under its lock and does the I/O they call for.

// roomState is where a prefill rank's room is.
type roomState uint8

const (
	// roomBootstrapping: waiting for decode's TransferInfos.
	roomBootstrapping roomState = iota
	// roomReady: every decode rank's TransferInfo is in.
	roomReady
	// roomSending: prefill took the TransferInfos and is writing; what
	// arrives now is late and changes nothing.
	roomSending
	// roomAborted: decode aborted the room before prefill sent it.
	roomAborted
	// roomDone: sent (or given up); kept until its deadline so late and
	// duplicate messages are recognised rather than opening a new room.
	roomDone
)

var roomStateNames = [...]string{"bootstrapping", "ready", "sending", "aborted", "done"}

func (s roomState) String() string { return roomStateNames[s] }

// roomEvent is what a message did to a room.
type roomEvent uint8

const (
	roomAccepted  roomEvent = iota // taken, the room still waits for more
	roomWoke                       // the room became ready or aborted: wake its waiter
	roomDuplicate                  // a second TransferInfo from the same decode agent: ignored
	roomLate                       // the room is sending or done: ignored
)

// sglRoom is one room on one prefill rank.
type sglRoom struct {
	state    roomState
	infos    map[string]sidechannel.SGLTransferInfo // by decode agent name; first one wins
	want     int                                    // TransferInfos to wait for (0: none seen yet)
	tReady   int64                                  // when the last TransferInfo arrived
	deadline int64                                  // dropped after this (0: never, while sending)
	gen      uint64                                 // which expiry entry is the room's current one
}

// sglRoomStats counts the room events that are not the happy path.
type sglRoomStats struct {
	Duplicates int64 // TransferInfos from an agent already in the room
	Late       int64 // TransferInfos or ABORTs after the room was taken
	Aborted    int64 // rooms aborted before sending
	Expired    int64 // rooms dropped at their deadline without being sent
}

type roomExpiry struct {
	room     uint64
	deadline int64
	gen      uint64
}

// sglRooms is one prefill rank's rooms. A room that nobody claims, or
// that is done, is forgotten ttl after its last change; deadlines are
// set as now+ttl, so they expire in the order they were set and a FIFO
// is enough to find them.
type sglRooms struct {
	ttl    int64
	rooms  map[uint64]*sglRoom
	expiry []roomExpiry
	gen    uint64
	stats  sglRoomStats
}

func newSGLRooms(ttl int64) *sglRooms {
	return &sglRooms{ttl: ttl, rooms: map[uint64]*sglRoom{}}
}

func (rs *sglRooms) room(id uint64, now int64) *sglRoom {
	r := rs.rooms[id]
	if r == nil {
		r = &sglRoom{infos: map[string]sidechannel.SGLTransferInfo{}}
		rs.rooms[id] = r
		rs.setDeadline(id, r, now)
	}
	return r
}

func (rs *sglRooms) setDeadline(id uint64, r *sglRoom, now int64) {
	rs.gen++
	r.deadline, r.gen = now+rs.ttl, rs.gen
	rs.expiry = append(rs.expiry, roomExpiry{id, r.deadline, r.gen})
}

// sweep forgets the rooms whose deadline passed.
func (rs *sglRooms) sweep(now int64) {
	n := 0
	for _, x := range rs.expiry {
		if x.deadline > now {
			break
		}
		n++
		if r := rs.rooms[x.room]; r != nil && r.gen == x.gen {
			if r.state != roomDone {
				rs.stats.Expired++
			}
			delete(rs.rooms, x.room)
		}
	}
	rs.expiry = rs.expiry[n:]
}

// Info takes a decode rank's TransferInfo. The first one per agent wins:
// a duplicate never changes what prefill sends, and nothing changes once
// the room is sending (the infos were handed out then).
func (rs *sglRooms) Info(info sidechannel.SGLTransferInfo, now int64) roomEvent {
	rs.sweep(now)
	r := rs.room(info.Room, now)
	switch r.state {
	case roomSending, roomDone, roomAborted:
		rs.stats.Late++
		return roomLate
	}
	if _, dup := r.infos[info.AgentName]; dup {
		rs.stats.Duplicates++
		return roomDuplicate
	}
	r.infos[info.AgentName] = info
	r.want = info.RequiredDst
	if r.state == roomBootstrapping && len(r.infos) >= r.want {
		r.state, r.tReady = roomReady, now
		return roomWoke
	}
	return roomAccepted
}

// Abort is decode's ABORT: a room not taken yet will not be sent.
func (rs *sglRooms) Abort(id uint64, now int64) roomEvent {
	rs.sweep(now)
	r := rs.room(id, now)
	switch r.state {
	case roomBootstrapping, roomReady:
		r.state = roomAborted
		rs.stats.Aborted++
		return roomWoke
	}
	rs.stats.Late++
	return roomLate
}

// Claim is prefill asking for a room it is about to send: its state now
// (a room not seen yet, or one done before, is opened bootstrapping). The
// room lives at least ttl from now.
func (rs *sglRooms) Claim(id uint64, now int64) roomState {
	rs.sweep(now)
	if r := rs.rooms[id]; r != nil && r.state == roomDone {
		delete(rs.rooms, id) // a room id used again: a new room
	}
	r := rs.room(id, now)
	if r.state == roomBootstrapping || r.state == roomReady {
		rs.setDeadline(id, r, now)
	}
	return r.state
}

// Start hands a ready room's TransferInfos to prefill (sorted by agent,
// a copy: the room keeps its own) and marks it sending.
func (rs *sglRooms) Start(id uint64) (infos []sidechannel.SGLTransferInfo, tReady int64, ok bool) {
	r := rs.rooms[id]
	if r == nil || r.state != roomReady {
		return nil, 0, false
	}
	r.state, r.deadline, r.gen = roomSending, 0, 0
	for _, in := range r.infos {
		infos = append(infos, in)
	}
	sort.Slice(infos, func(i, j int) bool { return infos[i].AgentName < infos[j].AgentName })
	return infos, r.tReady, true
}

// Finish ends a room (sent, failed or given up): it is done, and
// remembered for ttl so late messages are counted, not parked.
func (rs *sglRooms) Finish(id uint64, now int64) {
	r := rs.rooms[id]
	if r == nil {
		return
	}
	r.state = roomDone
	r.infos = nil
	rs.setDeadline(id, r, now)
	rs.sweep(now)
}

// State is a room's state (false: no such room).
func (rs *sglRooms) State(id uint64) (roomState, bool) {
	r := rs.rooms[id]
	if r == nil {
		return 0, false
	}
	return r.state, true
}

// sglNotifEvent is what a notification did to a decode room.
type sglNotifEvent uint8

const (
	notifProgress  sglNotifEvent = iota // counted, the room is not complete yet
	notifComplete                       // the room just became complete
	notifDuplicate                      // already counted (a chunk, the aux or a sender's end twice)
	notifLate                           // the room was already complete
)

// sglTracker is decode's view of one room: SGLang's is_done. Chunks,
// the aux row and the dummy ranks' "nokv" may arrive in any order; the
// room is complete once the aux is in and every sender's chunks up to
// its last one are.
type sglTracker struct {
	aux      bool
	chunks   map[int]map[int]bool // sender -> chunk ids received
	expected map[int]int          // sender -> chunks (from its last chunk)
	senders  int                  // prefill ranks that must report
	complete bool
	tLast    int64
}

func newSGLTracker(senders int) *sglTracker {
	return &sglTracker{chunks: map[int]map[int]bool{}, expected: map[int]int{}, senders: senders}
}

// Notif counts one notification of the room.
func (t *sglTracker) Notif(n sidechannel.SGLNotif, now int64) sglNotifEvent {
	if t.complete {
		return notifLate
	}
	t.tLast = now
	ev := notifProgress
	switch n.Kind {
	case "aux":
		if t.aux {
			ev = notifDuplicate
		}
		t.aux = true
	case "nokv":
		if _, seen := t.expected[n.Sender]; seen {
			ev = notifDuplicate
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
			ev = notifDuplicate
		}
		t.chunks[n.Sender][n.Chunk] = true
		if n.Last {
			t.expected[n.Sender] = n.Chunk + 1
		}
	}
	if t.done() {
		t.complete = true
		return notifComplete
	}
	return ev
}

func (t *sglTracker) done() bool {
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
