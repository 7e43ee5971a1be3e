package sglrooms

import (
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestSGLRooms(t *testing.T) {
	const ttl = 100
	// info stands for the engine's TransferInfo: the rooms keep it and
	// hand it back, and never read it.
	type info struct {
		agent string
		page  int32
	}
	type step struct {
		at    int64
		op    string // info, abort, claim, start, finish
		room  uint64
		agent string
		want  int
		ev    Event // info, abort
		state State // claim; the room's state after any step
		gone  bool  // the room is forgotten after the step
	}
	for _, tc := range []struct {
		name  string
		steps []step
		stats Stats
	}{
		{name: "infos before prefill", steps: []step{
			{at: 0, op: "info", room: 1, agent: "d0", want: 2, ev: Accepted, state: Bootstrapping},
			{at: 1, op: "info", room: 1, agent: "d1", want: 2, ev: Woke, state: Ready},
			{at: 2, op: "claim", room: 1, state: Ready},
			{at: 3, op: "start", room: 1, state: Sending},
			{at: 4, op: "finish", room: 1, state: Done},
		}},
		{name: "prefill before infos", steps: []step{
			{at: 0, op: "claim", room: 1, state: Bootstrapping},
			{at: 1, op: "info", room: 1, agent: "d0", want: 1, ev: Woke, state: Ready},
		}},
		{name: "duplicate before sending: first wins", steps: []step{
			{at: 0, op: "info", room: 1, agent: "d0", want: 2, ev: Accepted, state: Bootstrapping},
			{at: 1, op: "info", room: 1, agent: "d0", want: 2, ev: Duplicate, state: Bootstrapping},
			{at: 2, op: "info", room: 1, agent: "d1", want: 2, ev: Woke, state: Ready},
			{at: 3, op: "info", room: 1, agent: "d1", want: 2, ev: Duplicate, state: Ready},
		}, stats: Stats{Duplicates: 2}},
		{name: "late while sending and after done", steps: []step{
			{at: 0, op: "info", room: 1, agent: "d0", want: 1, ev: Woke, state: Ready},
			{at: 1, op: "start", room: 1, state: Sending},
			{at: 2, op: "info", room: 1, agent: "d0", want: 1, ev: Late, state: Sending},
			{at: 3, op: "info", room: 1, agent: "d9", want: 1, ev: Late, state: Sending},
			{at: 4, op: "abort", room: 1, ev: Late, state: Sending},
			{at: 5, op: "finish", room: 1, state: Done},
			{at: 6, op: "info", room: 1, agent: "d0", want: 1, ev: Late, state: Done},
			// A done room is remembered for ttl, then forgotten.
			{at: 5 + ttl, op: "info", room: 2, agent: "d0", want: 2, ev: Accepted, state: Bootstrapping},
			{at: 5 + ttl, op: "claim", room: 1, state: Bootstrapping},
		}, stats: Stats{Late: 4}},
		{name: "abort before and after ready", steps: []step{
			{at: 0, op: "abort", room: 1, ev: Woke, state: Aborted},
			{at: 1, op: "info", room: 1, agent: "d0", want: 1, ev: Late, state: Aborted},
			{at: 2, op: "info", room: 2, agent: "d0", want: 1, ev: Woke, state: Ready},
			{at: 3, op: "abort", room: 2, ev: Woke, state: Aborted},
			{at: 4, op: "start", room: 2, state: Aborted},
		}, stats: Stats{Late: 1, Aborted: 2}},
		{name: "a room nobody claims expires", steps: []step{
			{at: 0, op: "info", room: 1, agent: "d0", want: 2, ev: Accepted, state: Bootstrapping},
			{at: ttl - 1, op: "info", room: 2, agent: "d0", want: 2, ev: Accepted, state: Bootstrapping},
			{at: ttl, op: "info", room: 3, agent: "d0", want: 2, ev: Accepted, state: Bootstrapping},
			{at: ttl, op: "finish", room: 9, gone: true}, // checks room 9; room 1 was dropped above
		}, stats: Stats{Expired: 1}},
		{name: "a claim keeps the room past its first deadline", steps: []step{
			{at: 0, op: "info", room: 1, agent: "d0", want: 2, ev: Accepted, state: Bootstrapping},
			{at: ttl - 1, op: "claim", room: 1, state: Bootstrapping},
			{at: ttl + 1, op: "info", room: 1, agent: "d1", want: 2, ev: Woke, state: Ready},
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rs := New[info](ttl)
			for i, st := range tc.steps {
				var ev Event
				switch st.op {
				case "info":
					ev = rs.Info(st.room, st.agent, st.want, info{st.agent, int32(len(st.agent))}, st.at)
				case "abort":
					ev = rs.Abort(st.room, st.at)
				case "claim":
					if got := rs.Claim(st.room, st.at); got != st.state {
						t.Fatalf("step %d: claim found %s, want %s", i, got, st.state)
					}
				case "start":
					infos, _, ok := rs.Start(st.room)
					if ok != (st.state == Sending) {
						t.Fatalf("step %d: start %v", i, ok)
					}
					for j, in := range infos {
						if in.page != int32(len(in.agent)) {
							t.Fatalf("step %d: start handed out %+v", i, in)
						}
						if j > 0 && infos[j-1].agent >= in.agent {
							t.Fatalf("step %d: start handed out %+v, not sorted by agent", i, infos)
						}
					}
				case "finish":
					rs.Finish(st.room, st.at)
				}
				if (st.op == "info" || st.op == "abort") && ev != st.ev {
					t.Fatalf("step %d (%s room %d %s): event %d, want %d", i, st.op, st.room, st.agent, ev, st.ev)
				}
				got, ok := rs.State(st.room)
				if ok == st.gone || (ok && got != st.state) {
					t.Fatalf("step %d: room %d is %s (present %v), want %s (gone %v)", i, st.room, got, ok, st.state, st.gone)
				}
			}
			if diff := cmp.Diff(tc.stats, rs.stats); diff != "" {
				t.Errorf("stats (-want +got):\n%s", diff)
			}
		})
	}
}

func TestSGLTracker(t *testing.T) {
	kvN := func(chunk int, last bool, sender int) Notif {
		return Notif{Kind: "kv", Chunk: chunk, Last: last, Sender: sender}
	}
	aux, nokv := Notif{Kind: "aux"}, func(sender int) Notif { return Notif{Kind: "nokv", Sender: sender} }
	for _, tc := range []struct {
		name    string
		senders int
		notifs  []Notif
		want    []NotifEvent
	}{
		{"in order", 1, []Notif{kvN(0, false, 0), kvN(1, true, 0), aux},
			[]NotifEvent{NotifProgress, NotifProgress, NotifComplete}},
		{"last chunk and aux first", 1, []Notif{aux, kvN(2, true, 0), kvN(0, false, 0), kvN(1, false, 0)},
			[]NotifEvent{NotifProgress, NotifProgress, NotifProgress, NotifComplete}},
		{"duplicates", 1, []Notif{kvN(0, false, 0), kvN(0, false, 0), aux, aux, kvN(1, true, 0)},
			[]NotifEvent{NotifProgress, NotifDuplicate, NotifProgress, NotifDuplicate, NotifComplete}},
		{"late after complete", 1, []Notif{kvN(0, true, 0), aux, kvN(0, true, 0), aux},
			[]NotifEvent{NotifProgress, NotifComplete, NotifLate, NotifLate}},
		{"two senders and a dummy rank", 3, []Notif{kvN(0, true, 1), nokv(2), nokv(2), aux, kvN(0, true, 0)},
			[]NotifEvent{NotifProgress, NotifProgress, NotifDuplicate, NotifProgress, NotifComplete}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tr := NewTracker(tc.senders)
			var got []NotifEvent
			for i, n := range tc.notifs {
				got = append(got, tr.Notif(n, int64(i+1)))
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("events (-want +got):\n%s", diff)
			}
		})
	}
}
