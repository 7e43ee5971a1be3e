package engine

// vLLM's push protocol as plain state machines, like lease.Table: no
// locks, no clock reads, no goroutines, no I/O. pushMatcher is prefill's
// (per request and rank, from "finished" or "registered" to "done" or
// "failed"), pushWaits is decode's (the completions a request waits for,
// and its registration watchdog). The engine holds them under its lock,
// feeds them what happened with the time it happened, and does the I/O
// (handshakes, WRITEs, notifications) their answers call for.

// pushPhase is where one prefill rank is with one finished request. A
// registration whose request has not finished prefill yet is the phase
// before these: waiting for prefill, parked by base id (pushMatcher.parked).
type pushPhase uint8

const (
	// pushWaitReg: prefill finished; decode's registration has not come.
	pushWaitReg pushPhase = iota
	// pushMatched: a registration matched; the rank's owner has not
	// started it yet.
	pushMatched
	// pushHandshaking: the owner is shaking hands with the decode engine.
	pushHandshaking
	// pushWriting: handshake done; the owner posts WRITEs and polls them.
	pushWriting
	// pushDone: every WRITE of the rank is done.
	pushDone
	// pushFailed: the plan, handshake, a post or a WRITE failed. As in
	// vLLM decode is not told (its watchdog finds out) and the lease
	// frees the blocks.
	pushFailed
)

var pushPhaseNames = [...]string{"waiting-for-registration", "matched", "handshaking", "writing", "done", "failed"}

func (p pushPhase) String() string { return pushPhaseNames[p] }

// pushRankState is one rank's push of one request, and what the freed
// event reports about it.
type pushRankState struct {
	phase  pushPhase
	reg    *PushReg
	blocks []int // decode's blocks, from the registration
	tReg   int64 // when the registration arrived
	failed bool  // a WRITE failed: the rank ends failed
	post   pushPost
	tDone  int64
}

// pushPost is what a rank's owner did when it posted a request's WRITEs.
type pushPost struct {
	writes         int  // WRITEs in flight
	failed         bool // a target's WRITE could not be built or posted
	tStart, tEnd   int64
	descs, logical int
	bytes          int64
}

type pushReq struct {
	id    string
	ranks []pushRankState
}

// parkedReg is a registration waiting for its request to finish prefill.
type parkedReg struct {
	reg    PushReg
	blocks []int
	t      int64
}

// pushJob is a matched registration for a rank's owner to start.
type pushJob struct {
	id     string // prefill's request id
	reg    PushReg
	blocks []int
}

// pushEnd is what a transition means for the request as a whole.
type pushEnd struct {
	free  bool // every rank's WRITEs are done: release the blocks
	unpin bool // no rank is writing any more: the lease may expire again
}

// pushMatchStats counts the events off the happy path.
type pushMatchStats struct {
	Duplicates  int64 // registrations for a rank that already had one (every decode rank sends one)
	ExpiredRegs int64 // registrations whose request never came within the lease
	Failed      int64 // ranks that ended failed
}

// pushMatcher is prefill's push bookkeeping for all its ranks.
type pushMatcher struct {
	ranks   int
	ttl     int64                   // a parked registration is dropped after this
	reqs    map[string]*pushReq     // by prefill id
	byBase  map[string]*pushReq     // by id without vLLM's random suffix
	parked  []map[string]*parkedReg // per rank, by base id
	ready   [][]string              // per rank: matched request ids, in match order
	waiting []int                   // per rank: requests waiting for a registration
	writing []int                   // per rank: requests with WRITEs in flight
	stats   pushMatchStats
}

func newPushMatcher(ranks int, ttl int64) *pushMatcher {
	m := &pushMatcher{ranks: ranks, ttl: ttl, reqs: map[string]*pushReq{}, byBase: map[string]*pushReq{},
		ready: make([][]string, ranks), waiting: make([]int, ranks), writing: make([]int, ranks)}
	for range ranks {
		m.parked = append(m.parked, map[string]*parkedReg{})
	}
	return m
}

// match finds the request a decode request id belongs to: the exact id
// first, then the id without its random suffix (prefill and decode each
// add their own to the router's).
func (m *pushMatcher) match(decodeID string) *pushReq {
	if q := m.reqs[decodeID]; q != nil {
		return q
	}
	return m.byBase[BaseRequestID(decodeID)]
}

// Finished is prefill done with a request: every rank waits for its
// registration, or matches the one that came first. It returns the
// ranks that have a match to start.
func (m *pushMatcher) Finished(id string) (matched []int) {
	q := &pushReq{id: id, ranks: make([]pushRankState, m.ranks)}
	m.reqs[id] = q
	base := BaseRequestID(id)
	m.byBase[base] = q
	for r := range q.ranks {
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

func (m *pushMatcher) matchLocked(q *pushReq, r int, reg PushReg, blocks []int, t int64) {
	st := &q.ranks[r]
	st.phase, st.reg, st.blocks, st.tReg = pushMatched, &reg, blocks, t
	m.ready[r] = append(m.ready[r], q.id)
}

// Register takes a decode registration that reached rank r, in either
// order with the request's end of prefill: it matches, waits parked for
// the request, or is a duplicate (decode sends one per decode rank).
// It reports whether it matched (the owner has a job to take).
func (m *pushMatcher) Register(r int, reg PushReg, blocks []int, now int64) bool {
	if q := m.match(reg.RequestID); q != nil {
		if q.ranks[r].phase != pushWaitReg {
			m.stats.Duplicates++
			return false
		}
		m.waiting[r]--
		m.matchLocked(q, r, reg, blocks, now)
		return true
	}
	base := BaseRequestID(reg.RequestID)
	if m.parked[r][base] != nil {
		m.stats.Duplicates++
		return false
	}
	m.parked[r][base] = &parkedReg{reg: reg, blocks: blocks, t: now}
	return false
}

// Take hands rank r's owner the matches to start (they are handshaking
// from now on), and drops the registrations parked longer than the lease
// (their request is long gone).
func (m *pushMatcher) Take(r int, now int64) []pushJob {
	for key, p := range m.parked[r] {
		if now-p.t > m.ttl {
			delete(m.parked[r], key)
			m.stats.ExpiredRegs++
		}
	}
	var jobs []pushJob
	for _, id := range m.ready[r] {
		q := m.reqs[id]
		if q == nil || q.ranks[r].phase != pushMatched {
			continue // freed meanwhile
		}
		st := &q.ranks[r]
		st.phase = pushHandshaking
		jobs = append(jobs, pushJob{id: id, reg: *st.reg, blocks: st.blocks})
	}
	m.ready[r] = m.ready[r][:0]
	return jobs
}

// Handshaken is the owner back from a successful handshake, about to post:
// the rank is writing. ok is false when the request was freed meanwhile
// (nothing to post); pin says this is the request's first writing rank,
// so its lease must not expire under the WRITEs.
func (m *pushMatcher) Handshaken(id string, r int) (ok, pin bool) {
	q := m.reqs[id]
	if q == nil || q.ranks[r].phase != pushHandshaking {
		return false, false
	}
	pin = !m.anyWriting(q)
	q.ranks[r].phase = pushWriting
	m.writing[r]++
	return true, pin
}

// Posted records what the owner posted. A rank with nothing in flight
// ends here: done, or failed if a post failed.
func (m *pushMatcher) Posted(id string, r int, p pushPost, now int64) pushEnd {
	q := m.reqs[id]
	if q == nil || q.ranks[r].phase != pushWriting {
		return pushEnd{}
	}
	st := &q.ranks[r]
	st.post = p
	st.failed = st.failed || p.failed
	if p.writes > 0 {
		return pushEnd{}
	}
	return m.endWriting(q, r, false, now)
}

// WritesDone is the owner seeing every WRITE of the rank finish (failed:
// at least one did not succeed).
func (m *pushMatcher) WritesDone(id string, r int, failed bool, now int64) pushEnd {
	q := m.reqs[id]
	if q == nil || q.ranks[r].phase != pushWriting {
		return pushEnd{}
	}
	return m.endWriting(q, r, failed, now)
}

func (m *pushMatcher) endWriting(q *pushReq, r int, failed bool, now int64) pushEnd {
	st := &q.ranks[r]
	m.writing[r]--
	st.tDone = now
	st.failed = st.failed || failed
	st.phase = pushDone
	if st.failed {
		st.phase = pushFailed
		m.stats.Failed++
	}
	return pushEnd{free: m.allDone(q), unpin: !m.anyWriting(q)}
}

// Fail ends a rank's push before or instead of its WRITEs (a plan that
// does not fit, a failed handshake, blocks that do not match).
func (m *pushMatcher) Fail(id string, r int) pushEnd {
	q := m.reqs[id]
	if q == nil {
		return pushEnd{}
	}
	st := &q.ranks[r]
	switch st.phase {
	case pushDone, pushFailed:
		return pushEnd{}
	case pushWaitReg:
		m.waiting[r]--
	case pushWriting:
		m.writing[r]--
	}
	st.phase, st.failed = pushFailed, true
	m.stats.Failed++
	return pushEnd{unpin: !m.anyWriting(q)}
}

// Forget drops a request whose blocks were freed (pushed, or its lease
// expired) and returns its ranks' states for the freed event.
func (m *pushMatcher) Forget(id string) *pushReq {
	q := m.reqs[id]
	if q == nil {
		return nil
	}
	delete(m.reqs, id)
	if base := BaseRequestID(id); m.byBase[base] == q {
		delete(m.byBase, base)
	}
	for r, st := range q.ranks {
		switch st.phase {
		case pushWaitReg:
			m.waiting[r]--
		case pushWriting:
			m.writing[r]--
		}
	}
	return q
}

// Writing says whether rank r has WRITEs in flight (its owner polls them).
func (m *pushMatcher) Writing(r int) bool { return m.writing[r] > 0 }

// Phase is a request's phase on a rank (false: no such request).
func (m *pushMatcher) Phase(id string, r int) (pushPhase, bool) {
	q := m.reqs[id]
	if q == nil {
		return 0, false
	}
	return q.ranks[r].phase, true
}

func (m *pushMatcher) anyWriting(q *pushReq) bool {
	for _, st := range q.ranks {
		if st.phase == pushWriting {
			return true
		}
	}
	return false
}

func (m *pushMatcher) allDone(q *pushReq) bool {
	for _, st := range q.ranks {
		if st.phase != pushDone {
			return false
		}
	}
	return true
}

// completionEvent is what a WRITE's completion notification did on decode.
type completionEvent uint8

const (
	completionUnknown   completionEvent = iota // no such request (late, or after the watchdog)
	completionProgress                         // counted; more to come
	completionComplete                         // the request has all it waits for
	completionDuplicate                        // more than the rank waits for
)

// pushWait is one decode request waiting for prefill's WRITEs.
type pushWait struct {
	want, got []int // per decode rank: completions expected and seen
	deadline  int64 // the registration watchdog
	tLast     int64
	complete  bool
	fired     bool // the watchdog fired (drop: the request still waits)
	expired   bool // the watchdog failed it (fail)
}

// pushWaits is decode's side: the completions each request waits for,
// and its registration watchdog (RegTimeout) as a deadline.
type pushWaits struct {
	reqs map[string]*pushWait
}

func newPushWaits() *pushWaits { return &pushWaits{reqs: map[string]*pushWait{}} }

// Add starts waiting for a request's completions (want per decode rank)
// until now+timeout.
func (w *pushWaits) Add(id string, want []int, now, timeout int64) {
	w.reqs[id] = &pushWait{want: want, got: make([]int, len(want)), deadline: now + timeout}
}

// Completion counts one "<id>:<n>" notification received by decode rank r.
func (w *pushWaits) Completion(id string, r int, now int64) completionEvent {
	q := w.reqs[id]
	if q == nil || q.expired {
		return completionUnknown
	}
	q.got[r]++
	q.tLast = now
	if q.got[r] > q.want[r] {
		return completionDuplicate
	}
	if q.complete {
		return completionProgress
	}
	for d := range q.want {
		if q.got[d] < q.want[d] {
			return completionProgress
		}
	}
	q.complete = true
	return completionComplete
}

// Expire fires the watchdog of every request past its deadline that is
// still incomplete: at the deadline, never before, once. fail marks them
// expired (later completions are unknown); otherwise they keep waiting.
func (w *pushWaits) Expire(now int64, fail bool) []string {
	var ids []string
	for id, q := range w.reqs {
		if !q.complete && !q.fired && now >= q.deadline {
			q.fired, q.expired = true, fail
			ids = append(ids, id)
		}
	}
	return ids
}

// Remove ends a request's wait and says when its last completion came.
func (w *pushWaits) Remove(id string) (tLast int64) {
	if q := w.reqs[id]; q != nil {
		tLast = q.tLast
		delete(w.reqs, id)
	}
	return tLast
}
