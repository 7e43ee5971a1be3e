// Package pushmatch holds vLLM's push protocol as plain state machines,
// like lease.Table: no locks, no clock reads, no goroutines, no I/O, no
// cgo. Matcher is prefill's (per request and rank, from "finished" or
// "registered" to "done" or "failed"), Waits is decode's (the completions
// a request waits for, and its registration watchdog). The engine holds
// them under its lock, feeds them what happened with the time it
// happened, and does the I/O (handshakes, WRITEs, notifications) their
// answers call for. R is the engine's registration message, which the
// machines keep and hand back but never read.
package pushmatch

import "strings"

// Phase is where one prefill rank is with one finished request. A
// registration whose request has not finished prefill yet is the phase
// before these: waiting for prefill, parked by base id (Matcher.parked).
type Phase uint8

const (
	// WaitReg: prefill finished; decode's registration has not come.
	WaitReg Phase = iota
	// Matched: a registration matched; the rank's owner has not
	// started it yet.
	Matched
	// Handshaking: the owner is shaking hands with the decode engine.
	Handshaking
	// Writing: handshake done; the owner posts WRITEs and polls them.
	Writing
	// Done: every WRITE of the rank is done.
	Done
	// Failed: the plan, handshake, a post or a WRITE failed. As in
	// vLLM decode is not told (its watchdog finds out) and the lease
	// frees the blocks.
	Failed
)

var phaseNames = [...]string{"waiting-for-registration", "matched", "handshaking", "writing", "done", "failed"}

func (p Phase) String() string { return phaseNames[p] }

// RankState is one rank's push of one request, and what the freed
// event reports about it.
type RankState[R any] struct {
	Phase  Phase
	Reg    *R
	Blocks []int // decode's blocks, from the registration
	TReg   int64 // when the registration arrived
	Failed bool  // a WRITE failed: the rank ends failed
	Post   Post
	TDone  int64
}

// Post is what a rank's owner did when it posted a request's WRITEs.
type Post struct {
	Writes         int  // WRITEs in flight
	Failed         bool // a target's WRITE could not be built or posted
	TStart, TEnd   int64
	Descs, Logical int
	Bytes          int64
}

// Req is one finished request's push on every rank.
type Req[R any] struct {
	ID    string
	Ranks []RankState[R]
}

// parkedReg is a registration waiting for its request to finish prefill.
type parkedReg[R any] struct {
	reg    R
	blocks []int
	t      int64
}

// Job is a matched registration for a rank's owner to start.
type Job[R any] struct {
	ID     string // prefill's request id
	Reg    R
	Blocks []int
}

// End is what a transition means for the request as a whole.
type End struct {
	Free  bool // every rank's WRITEs are done: release the blocks
	Unpin bool // no rank is writing any more: the lease may expire again
}

// Stats counts the events off the happy path.
type Stats struct {
	Duplicates  int64 // registrations for a rank that already had one (every decode rank sends one)
	ExpiredRegs int64 // registrations whose request never came within the lease
	Failed      int64 // ranks that ended failed
}

// BaseRequestID strips vLLM's per-engine "-<8 hex>" suffix.
func BaseRequestID(id string) string {
	if i := strings.LastIndexByte(id, '-'); i >= 0 && len(id)-i-1 == 8 {
		for _, c := range id[i+1:] {
			if !strings.ContainsRune("0123456789abcdef", c) {
				return id
			}
		}
		return id[:i]
	}
	return id
}

// Matcher is prefill's push bookkeeping for all its ranks.
type Matcher[R any] struct {
	ranks   int
	ttl     int64                      // a parked registration is dropped after this
	reqs    map[string]*Req[R]         // by prefill id
	byBase  map[string]*Req[R]         // by id without vLLM's random suffix
	parked  []map[string]*parkedReg[R] // per rank, by base id
	ready   [][]string                 // per rank: matched request ids, in match order
	waiting []int                      // per rank: requests waiting for a registration
	writing []int                      // per rank: requests with WRITEs in flight
	stats   Stats
}

// NewMatcher is the bookkeeping of ranks ranks; a parked registration
// is dropped ttl after it came.
func NewMatcher[R any](ranks int, ttl int64) *Matcher[R] {
	m := &Matcher[R]{ranks: ranks, ttl: ttl, reqs: map[string]*Req[R]{}, byBase: map[string]*Req[R]{},
		ready: make([][]string, ranks), waiting: make([]int, ranks), writing: make([]int, ranks)}
	for range ranks {
		m.parked = append(m.parked, map[string]*parkedReg[R]{})
	}
	return m
}

// match finds the request a decode request id belongs to: the exact id
// first, then the id without its random suffix (prefill and decode each
// add their own to the router's).
func (m *Matcher[R]) match(decodeID string) *Req[R] {
	if q := m.reqs[decodeID]; q != nil {
		return q
	}
	return m.byBase[BaseRequestID(decodeID)]
}

// Finished is prefill done with a request: every rank waits for its
// registration, or matches the one that came first. It returns the
// ranks that have a match to start.
func (m *Matcher[R]) Finished(id string) (matched []int) {
	q := &Req[R]{ID: id, Ranks: make([]RankState[R], m.ranks)}
	m.reqs[id] = q
	base := BaseRequestID(id)
	m.byBase[base] = q
	for r := range q.Ranks {
		if p := m.parked[r][base]; p != nil {
			delete(m.parked[r], base)
			m.matchLocked(q, r, p.reg, p.blocks, p.t)
			matched = append(matched, r)
			continue
		}
		m.waiting[r]++
	}
	return matched
}

func (m *Matcher[R]) matchLocked(q *Req[R], r int, reg R, blocks []int, t int64) {
	st := &q.Ranks[r]
	st.Phase, st.Reg, st.Blocks, st.TReg = Matched, &reg, blocks, t
	m.ready[r] = append(m.ready[r], q.ID)
}

// Register takes a decode registration reg, for decode's request id, that
// reached rank r, in either order with the request's end of prefill: it
// matches, waits parked for the request, or is a duplicate (decode sends
// one per decode rank).
// It reports whether it matched (the owner has a job to take).
func (m *Matcher[R]) Register(r int, id string, reg R, blocks []int, now int64) bool {
	if q := m.match(id); q != nil {
		if q.Ranks[r].Phase != WaitReg {
			m.stats.Duplicates++
			return false
		}
		m.waiting[r]--
		m.matchLocked(q, r, reg, blocks, now)
		return true
	}
	base := BaseRequestID(id)
	if m.parked[r][base] != nil {
		m.stats.Duplicates++
		return false
	}
	m.parked[r][base] = &parkedReg[R]{reg: reg, blocks: blocks, t: now}
	return false
}

// Take hands rank r's owner the matches to start (they are handshaking
// from now on), and drops the registrations parked longer than the lease
// (their request is long gone).
func (m *Matcher[R]) Take(r int, now int64) []Job[R] {
	for key, p := range m.parked[r] {
		if now-p.t > m.ttl {
			delete(m.parked[r], key)
			m.stats.ExpiredRegs++
		}
	}
	var jobs []Job[R]
	for _, id := range m.ready[r] {
		q := m.reqs[id]
		if q == nil || q.Ranks[r].Phase != Matched {
			continue // freed meanwhile
		}
		st := &q.Ranks[r]
		st.Phase = Handshaking
		jobs = append(jobs, Job[R]{ID: id, Reg: *st.Reg, Blocks: st.Blocks})
	}
	m.ready[r] = m.ready[r][:0]
	return jobs
}

// Handshaken is the owner back from a successful handshake, about to post:
// the rank is writing. ok is false when the request was freed meanwhile
// (nothing to post); pin says this is the request's first writing rank,
// so its lease must not expire under the WRITEs.
func (m *Matcher[R]) Handshaken(id string, r int) (ok, pin bool) {
	q := m.reqs[id]
	if q == nil || q.Ranks[r].Phase != Handshaking {
		return false, false
	}
	pin = !m.anyWriting(q)
	q.Ranks[r].Phase = Writing
	m.writing[r]++
	return true, pin
}

// Posted records what the owner posted. A rank with nothing in flight
// ends here: done, or failed if a post failed.
func (m *Matcher[R]) Posted(id string, r int, p Post, now int64) End {
	q := m.reqs[id]
	if q == nil || q.Ranks[r].Phase != Writing {
		return End{}
	}
	st := &q.Ranks[r]
	st.Post = p
	st.Failed = st.Failed || p.Failed
	if p.Writes > 0 {
		return End{}
	}
	return m.endWriting(q, r, false, now)
}

// WritesDone is the owner seeing every WRITE of the rank finish (failed:
// at least one did not succeed).
func (m *Matcher[R]) WritesDone(id string, r int, failed bool, now int64) End {
	q := m.reqs[id]
	if q == nil || q.Ranks[r].Phase != Writing {
		return End{}
	}
	return m.endWriting(q, r, failed, now)
}

func (m *Matcher[R]) endWriting(q *Req[R], r int, failed bool, now int64) End {
	st := &q.Ranks[r]
	m.writing[r]--
	st.TDone = now
	st.Failed = st.Failed || failed
	st.Phase = Done
	if st.Failed {
		st.Phase = Failed
		m.stats.Failed++
	}
	return End{Free: m.allDone(q), Unpin: !m.anyWriting(q)}
}

// Fail ends a rank's push before or instead of its WRITEs (a plan that
// does not fit, a failed handshake, blocks that do not match).
func (m *Matcher[R]) Fail(id string, r int) End {
	q := m.reqs[id]
	if q == nil {
		return End{}
	}
	st := &q.Ranks[r]
	switch st.Phase {
	case Done, Failed:
		return End{}
	case WaitReg:
		m.waiting[r]--
	case Writing:
		m.writing[r]--
	}
	st.Phase, st.Failed = Failed, true
	m.stats.Failed++
	return End{Unpin: !m.anyWriting(q)}
}

// Forget drops a request whose blocks were freed (pushed, or its lease
// expired) and returns its ranks' states for the freed event.
func (m *Matcher[R]) Forget(id string) *Req[R] {
	q := m.reqs[id]
	if q == nil {
		return nil
	}
	delete(m.reqs, id)
	if base := BaseRequestID(id); m.byBase[base] == q {
		delete(m.byBase, base)
	}
	for r, st := range q.Ranks {
		switch st.Phase {
		case WaitReg:
			m.waiting[r]--
		case Writing:
			m.writing[r]--
		}
	}
	return q
}

// Parked says whether rank r holds a registration waiting for the
// request with base id base (its id without vLLM's suffix).
func (m *Matcher[R]) Parked(r int, base string) bool { return m.parked[r][base] != nil }

// Writing says whether rank r has WRITEs in flight (its owner polls them).
func (m *Matcher[R]) Writing(r int) bool { return m.writing[r] > 0 }

// Phase is a request's phase on a rank (false: no such request).
func (m *Matcher[R]) Phase(id string, r int) (Phase, bool) {
	q := m.reqs[id]
	if q == nil {
		return 0, false
	}
	return q.Ranks[r].Phase, true
}

func (m *Matcher[R]) anyWriting(q *Req[R]) bool {
	for _, st := range q.Ranks {
		if st.Phase == Writing {
			return true
		}
	}
	return false
}

func (m *Matcher[R]) allDone(q *Req[R]) bool {
	for _, st := range q.Ranks {
		if st.Phase != Done {
			return false
		}
	}
	return true
}

// Completion is what a WRITE's completion notification did on decode.
type Completion uint8

const (
	CompletionUnknown   Completion = iota // no such request (late, or after the watchdog)
	CompletionProgress                    // counted; more to come
	CompletionComplete                    // the request has all it waits for
	CompletionDuplicate                   // more than the rank waits for
)

// wait is one decode request waiting for prefill's WRITEs.
type wait struct {
	want, got []int // per decode rank: completions expected and seen
	deadline  int64 // the registration watchdog
	tLast     int64
	complete  bool
	fired     bool // the watchdog fired (drop: the request still waits)
	expired   bool // the watchdog failed it (fail)
}

// Waits is decode's side: the completions each request waits for,
// and its registration watchdog (RegTimeout) as a deadline.
type Waits struct {
	reqs map[string]*wait
}

func NewWaits() *Waits { return &Waits{reqs: map[string]*wait{}} }

// Add starts waiting for a request's completions (want per decode rank)
// until now+timeout.
func (w *Waits) Add(id string, want []int, now, timeout int64) {
	w.reqs[id] = &wait{want: want, got: make([]int, len(want)), deadline: now + timeout}
}

// Completion counts one "<id>:<n>" notification received by decode rank r.
func (w *Waits) Completion(id string, r int, now int64) Completion {
	q := w.reqs[id]
	if q == nil || q.expired {
		return CompletionUnknown
	}
	q.got[r]++
	q.tLast = now
	if q.got[r] > q.want[r] {
		return CompletionDuplicate
	}
	if q.complete {
		return CompletionProgress
	}
	for d := range q.want {
		if q.got[d] < q.want[d] {
			return CompletionProgress
		}
	}
	q.complete = true
	return CompletionComplete
}

// Expire fires the watchdog of every request past its deadline that is
// still incomplete: at the deadline, never before, once. fail marks them
// expired (later completions are unknown); otherwise they keep waiting.
func (w *Waits) Expire(now int64, fail bool) []string {
	var ids []string
	for id, q := range w.reqs {
		if !q.complete && !q.fired && now >= q.deadline {
			q.fired, q.expired = true, fail
			ids = append(ids, id)
		}
	}
	return ids
}

// Expired says whether the watchdog failed id's wait (false for no such
// request).
func (w *Waits) Expired(id string) bool {
	q := w.reqs[id]
	return q != nil && q.expired
}

// Deadline is id's registration watchdog (0 for no such request).
func (w *Waits) Deadline(id string) int64 {
	if q := w.reqs[id]; q != nil {
		return q.deadline
	}
	return 0
}

// Waiting lists the requests still waiting: the ones the watchdog has
// not failed.
func (w *Waits) Waiting() []string {
	var ids []string
	for id, q := range w.reqs {
		if !q.expired {
			ids = append(ids, id)
		}
	}
	return ids
}

// Remove ends a request's wait and says when its last completion came.
func (w *Waits) Remove(id string) (tLast int64) {
	if q := w.reqs[id]; q != nil {
		tLast = q.tLast
		delete(w.reqs, id)
	}
	return tLast
}
