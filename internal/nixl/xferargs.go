package nixl

import "fmt"

// Every backend checks a request's arguments the same way; these helpers
// are that one way, so the backends differ only in what they build.

// CreateXferReqByPrep is CreateXferReq for a backend whose requests are
// made from prepared lists: it prepares both sides and makes the request
// pairing descriptor i with descriptor i.
func CreateXferReqByPrep(a Agent, op Op, mem MemType, local []Desc, remoteMem MemType, remote []Desc, remoteName string, notif []byte) (XferReq, error) {
	return CreateXferReqWith(a, op, mem, local, remoteMem, remote, remoteName, notif, a.MakeXferReq)
}

// MakeFunc makes a request from prepared lists by index, as
// Agent.MakeXferReq does.
type MakeFunc func(op Op, local Dlist, localIdx []int, remote Dlist, remoteIdx []int, notif []byte) (XferReq, error)

// CreateXferReqWith is CreateXferReqByPrep with the request made by makeReq:
// a backend whose MakeXferReq merges runs of consecutive indices passes a
// maker that does not, since NIXL's createXferReq posts descriptors as
// given.
func CreateXferReqWith(a Agent, op Op, mem MemType, local []Desc, remoteMem MemType, remote []Desc, remoteName string, notif []byte, makeReq MakeFunc) (XferReq, error) {
	if len(local) != len(remote) {
		return nil, fmt.Errorf("create request: %d local descriptors but %d remote", len(local), len(remote))
	}
	ld, err := a.PrepXferDlist("", mem, local)
	if err != nil {
		return nil, err
	}
	rd, err := a.PrepXferDlist(remoteName, remoteMem, remote)
	if err != nil {
		return nil, err
	}
	idx := make([]int, len(local))
	for i := range idx {
		idx[i] = i
	}
	return makeReq(op, ld, idx, rd, idx, notif)
}

// PairIndices checks MakeXferReq's index lists against prepared lists of
// nLocal and nRemote descriptors whose lengths localLen and remoteLen give,
// and calls each for every pair in order; it returns the bytes the pairs
// move. Pairs must be in range and of equal length (ErrLengthMismatch).
func PairIndices(localIdx, remoteIdx []int, nLocal, nRemote int, localLen, remoteLen func(int) uint64, each func(i, li, ri int)) (int64, error) {
	if len(localIdx) != len(remoteIdx) {
		return 0, fmt.Errorf("make request: %d local indices but %d remote", len(localIdx), len(remoteIdx))
	}
	var total int64
	for i := range localIdx {
		li, ri := localIdx[i], remoteIdx[i]
		if li < 0 || li >= nLocal || ri < 0 || ri >= nRemote {
			return 0, fmt.Errorf("make request: index pair %d (%d, %d) out of range (%d local, %d remote)", i, li, ri, nLocal, nRemote)
		}
		ll, rl := localLen(li), remoteLen(ri)
		if ll != rl {
			return 0, fmt.Errorf("descriptor pair %d: %d vs %d bytes: %w", i, ll, rl, ErrLengthMismatch)
		}
		each(i, li, ri)
		total += int64(ll)
	}
	return total, nil
}

// CheckPairs is PairIndices for prepared lists held as descriptors, in a
// loop without a call per pair: requests made by index carry an index per
// block and region (thousands per request), on the post path.
func CheckPairs(localIdx, remoteIdx []int, local, remote []Desc) (int64, error) {
	if len(localIdx) != len(remoteIdx) {
		return 0, fmt.Errorf("make request: %d local indices but %d remote", len(localIdx), len(remoteIdx))
	}
	var total int64
	remoteIdx = remoteIdx[:len(localIdx)]
	for i, li := range localIdx {
		ri := remoteIdx[i]
		if uint(li) >= uint(len(local)) || uint(ri) >= uint(len(remote)) {
			return 0, fmt.Errorf("make request: index pair %d (%d, %d) out of range (%d local, %d remote)", i, li, ri, len(local), len(remote))
		}
		if ll, rl := local[li].Len, remote[ri].Len; ll != rl {
			return 0, fmt.Errorf("descriptor pair %d: %d vs %d bytes: %w", i, ll, rl, ErrLengthMismatch)
		}
		total += int64(local[li].Len)
	}
	return total, nil
}

// XferLists is MakeXferReq's descriptor lists as the backend's list type
// D, checked: both prepared by this agent (mine says so of a list), the
// first a local list and the second a remote one.
func XferLists[D Dlist](local, remote Dlist, mine func(D) bool) (l, r D, err error) {
	l, ok1 := local.(D)
	r, ok2 := remote.(D)
	if !ok1 || !ok2 || !mine(l) || !mine(r) {
		return l, r, fmt.Errorf("make request: descriptor lists were not prepared by this agent")
	}
	if l.Remote() != "" || r.Remote() == "" {
		return l, r, fmt.Errorf("make request: need a local list and a remote list")
	}
	return l, r, nil
}

// ReleaseDlist is Agent.ReleaseDlist for a backend whose prepared lists
// (of type D) hold nothing to free: it only refuses a list of another
// backend, naming this one.
func ReleaseDlist[D Dlist](d Dlist, backend string) error {
	if _, ok := d.(D); !ok {
		return fmt.Errorf("not a %s descriptor list", backend)
	}
	return nil
}
