package handoff

import (
	"cmp"
	"fmt"
	"math"
	"net"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/nixlctl/nixlctl/internal/report"
	"github.com/nixlctl/nixlctl/internal/runcore"
	"github.com/nixlctl/nixlctl/internal/stats"
)

// SummarizeHandoff computes a run's summary from its records (warm-up
// ones left out), with memcpy the reference bandwidth in GB/s. The
// references and leak counts that do not come from records stay zero.
func SummarizeHandoff(records []HandoffRecord, memcpy float64) HandoffSummary {
	s := HandoffSummary{MemcpyGBps: memcpy}
	hand, xfer, post, f2p, comp, reg := report.NewHistogram(), report.NewHistogram(), report.NewHistogram(), report.NewHistogram(), report.NewHistogram(), report.NewHistogram()
	var firstHS, steadyHS []float64
	var gbps []float64
	// The timed span is each round's (first start to last end) added up:
	// between rounds the interleaved reference ran, not the handoff.
	type span struct{ first, last int64 }
	spans := map[int]*span{}
	ms := func(x float64) time.Duration { return time.Duration(x * 1e6) }
	for _, r := range records {
		if r.FirstHandshake {
			firstHS = append(firstHS, r.HandshakeMS)
		}
		if r.Warmup {
			continue
		}
		s.Requests++
		if r.Error != "" || r.CorruptBlocks > 0 {
			s.Failed++
			reason := "corrupt blocks"
			if r.Error != "" {
				reason = failureReason(r.Error)
			}
			if s.FailuresByReason == nil {
				s.FailuresByReason, s.FailureExamples = map[string]int{}, map[string]string{}
			}
			s.FailuresByReason[reason]++
			if _, seen := s.FailureExamples[reason]; !seen {
				if r.Error != "" {
					s.FailureExamples[reason] = failureExample(r.Error)
				}
			}
		}
		s.CorruptBlocks += r.CorruptBlocks
		if r.Error != "" {
			continue
		}
		if !r.FirstHandshake {
			steadyHS = append(steadyHS, r.HandshakeMS)
		}
		s.Bytes += r.Bytes
		s.DescriptorsPerReq += float64(r.Descriptors)
		s.LogicalDescsReq += float64(r.LogicalDescs)
		// Every measured request has a handoff and a transfer stage, even
		// one that read 0 (a copy done inside the post): the histograms
		// count every request that moved bytes. Other stages a protocol
		// lacks are 0 and stay out. A negative stage is counted, not
		// recorded, and the run warns.
		for _, st := range []struct {
			name   string
			h      *report.Histogram
			v      float64
			always bool
		}{{"handoff_ms", hand, r.HandoffMS, true}, {"transfer_ms", xfer, r.TransferMS, r.Bytes > 0}, {"post_ms", post, r.PostMS, false},
			{"finish_to_post_ms", f2p, r.FinishToPostMS, false}, {"completion_to_ready_ms", comp, r.CompletionMS, false},
			{"registration_rtt_ms", reg, r.RegRTTMS, false}} {
			switch {
			case st.v < 0:
				if s.NegativeStages == nil {
					s.NegativeStages = map[string]int{}
				}
				s.NegativeStages[st.name]++
			case st.v > 0 || st.always:
				st.h.Record(ms(st.v))
			}
		}
		// Post and transfer together: where a transport copies inside the
		// post (UCX-allocated shared memory), the transfer stage is ~0.
		if t := r.PostMS + r.TransferMS; t > 0 && r.Bytes > 0 {
			gbps = append(gbps, float64(r.Bytes)/1e6/t)
		}
		sp := spans[r.Round]
		if sp == nil {
			sp = &span{first: r.TStart}
			spans[r.Round] = sp
		}
		sp.first = min(sp.first, r.TStart)
		sp.last = max(sp.last, r.TReady)
	}
	var timed int64
	for _, sp := range spans {
		if sp.last > sp.first {
			timed += sp.last - sp.first
		}
	}
	ok := s.Requests - s.Failed
	if ok > 0 {
		s.DescriptorsPerReq /= float64(ok)
		s.LogicalDescsReq /= float64(ok)
		s.BytesPerRequest = float64(s.Bytes) / float64(ok)
	}
	if timed > 0 {
		s.Seconds = float64(timed) / 1e9
		s.BandwidthGBps = float64(s.Bytes) / 1e9 / s.Seconds
		s.RequestsPerS = float64(ok) / s.Seconds
	}
	u := time.Millisecond
	s.HandoffLatencyMS, s.TransferMS, s.PostMS, s.FinishToPostMS, s.CompletionMS, s.RegRTTMS =
		hand.In(u), xfer.In(u), post.In(u), f2p.In(u), comp.In(u), reg.In(u)
	s.Histogram, _ = hand.Encode()
	s.StageHistograms = map[string]string{}
	for k, h := range map[string]*report.Histogram{"transfer_ms": xfer, "post_ms": post, "finish_to_post_ms": f2p,
		"completion_to_ready_ms": comp, "registration_rtt_ms": reg} {
		if h.Count() > 0 {
			s.StageHistograms[k], _ = h.Encode()
		}
	}
	s.FirstHandshakeMS = mean(firstHS)
	s.SteadyHandshakeMS = mean(steadyHS)
	s.TransferGBps = stats.Median(gbps)
	if _, gap := stallWarning(records); gap > 0 {
		s.StallMS = float64(gap) / 1e6
	}
	if memcpy > 0 {
		s.EfficiencyMemcpy = s.BandwidthGBps / memcpy
	}
	return s
}

// roundRefs are a round's reference measurements, kept apart from the
// handoff's side, which records give again (report show recomputes it).
type roundRefs struct {
	xfer, limit, cpuNS float64
	touchMS            float64 // the pools' touch after the references
}

// summarizeRounds joins the handoff's side of each round (from records)
// with its references, and sets the summary's ratios from the rounds:
// the medians, and the spread of the per-round ratio. Rounds without a
// reference are left out.
func summarizeRounds(s *HandoffSummary, records []HandoffRecord, refs []roundRefs) {
	type span struct {
		first, last int64
		bytes       int64
		n           int
		outstanding [][2]int64 // each request's handoff stage: prefill done to ready
	}
	spans := make([]span, len(refs))
	for _, r := range records {
		if r.Warmup || r.Error != "" || r.Round < 0 || r.Round >= len(refs) {
			continue
		}
		sp := &spans[r.Round]
		if sp.first == 0 || r.TStart < sp.first {
			sp.first = r.TStart
		}
		sp.last = max(sp.last, r.TReady)
		sp.bytes += r.Bytes
		sp.n++
		from := r.TFinish
		if from <= 0 || from < r.TStart {
			from = r.TStart // a record from before the stamp: its whole span
		}
		sp.outstanding = append(sp.outstanding, [2]int64{from, r.TReady})
	}
	s.Rounds = nil
	var ratios, spanRatios, limitRatios, xfers, limits, idle []float64
	for k, ref := range refs {
		sp := spans[k]
		if ref.xfer <= 0 || sp.last <= sp.first {
			continue
		}
		busy := unionLength(sp.outstanding)
		if busy <= 0 {
			continue
		}
		rd := XferRound{Round: k + 1, Requests: sp.n, HandoffGBps: float64(sp.bytes) / float64(busy),
			SpanGBps: float64(sp.bytes) / float64(sp.last-sp.first), IdleFraction: 1 - float64(busy)/float64(sp.last-sp.first),
			XferGBps: ref.xfer, LimitGBps: ref.limit, CPUNSPerStep: ref.cpuNS, TouchMS: ref.touchMS}
		s.Rounds = append(s.Rounds, rd)
		ratios = append(ratios, rd.Ratio())
		spanRatios = append(spanRatios, rd.SpanGBps/rd.XferGBps)
		xfers = append(xfers, rd.XferGBps)
		idle = append(idle, rd.IdleFraction)
		if rd.LimitGBps > 0 {
			limits = append(limits, rd.LimitGBps)
			limitRatios = append(limitRatios, rd.limitRatio())
		}
	}
	if len(ratios) == 0 {
		return
	}
	sp := report.SpreadOf(ratios)
	s.XferGBps, s.EfficiencyXfer, s.EfficiencyXferSpread = stats.Median(xfers), sp.Median, &sp
	s.RoundIdleFraction, s.SpanEfficiencyXfer = stats.Median(idle), stats.Median(spanRatios)
	if len(limits) > 0 {
		s.LimitGBps, s.EfficiencyLimit = stats.Median(limits), stats.Median(limitRatios)
	}
}

// unionLength is the time covered by at least one of the intervals
// (each [from, to]; an empty or reversed one covers nothing).
func unionLength(iv [][2]int64) int64 {
	iv = slices.Clone(iv)
	slices.SortFunc(iv, func(a, b [2]int64) int { return cmp.Compare(a[0], b[0]) })
	var total, end int64
	for i, x := range iv {
		if x[1] <= x[0] {
			continue
		}
		switch {
		case i == 0 || x[0] >= end:
			total += x[1] - x[0]
			end = x[1]
		case x[1] > end:
			total += x[1] - end
			end = x[1]
		}
	}
	return total
}

// SummarizePairs summarizes every pair of an n x m run from its records
// (warm-up ones left out), prefill-major: pair (p, d) is at p*m + d.
func SummarizePairs(records []HandoffRecord, n, m int) []PairSummary {
	out := make([]PairSummary, n*m)
	hists := make([]*report.Histogram, n*m)
	first, last := make([]int64, n*m), make([]int64, n*m)
	for i := range out {
		out[i].Prefill, out[i].Decode = i/m, i%m
		hists[i] = report.NewHistogram()
	}
	for _, r := range records {
		if r.Warmup || r.Prefill >= n || r.Decode >= m {
			continue
		}
		k := r.Prefill*m + r.Decode
		ps := &out[k]
		ps.Requests++
		ps.CorruptBlocks += r.CorruptBlocks
		if r.Error != "" || r.CorruptBlocks > 0 {
			ps.Failed++
		}
		if r.Error != "" {
			continue
		}
		ps.Bytes += r.Bytes
		if r.HandoffMS >= 0 {
			hists[k].Record(time.Duration(r.HandoffMS * 1e6))
		}
		if first[k] == 0 || r.TStart < first[k] {
			first[k] = r.TStart
		}
		last[k] = max(last[k], r.TReady)
	}
	for k := range out {
		if last[k] > first[k] {
			out[k].ActiveSeconds = float64(last[k]-first[k]) / 1e9
			out[k].ActiveGBps = float64(out[k].Bytes) / 1e9 / out[k].ActiveSeconds
		}
		out[k].HandoffLatencyMS = hists[k].In(time.Millisecond)
	}
	return out
}

// pairDims is an xPyD result's prefill and decode counts (0, 0 with one
// of each).
func pairDims(res *HandoffResult) (n, m int) {
	n, m = len(res.Config.PrefillEngines), len(res.Config.DecodeEngines)
	if len(res.Summary.Pairs) != n*m {
		return 0, 0
	}
	return n, m
}

// pairMatrix is one number per pair, [prefill][decode]; NaN where the
// pair moved nothing.
func pairMatrix(res *HandoffResult, v func(PairSummary) (float64, bool)) [][]float64 {
	n, m := pairDims(res)
	out := make([][]float64, n)
	for p := range out {
		out[p] = make([]float64, m)
		for d := range out[p] {
			x, ok := v(res.Summary.Pairs[p*m+d])
			if !ok {
				x = math.NaN()
			}
			out[p][d] = x
		}
	}
	return out
}

// The per-pair matrices: bandwidth over the pair's active time, and
// handoff latency p99.
func pairGBps(p PairSummary) (float64, bool) { return p.ActiveGBps, p.ActiveSeconds > 0 }

func pairP99(p PairSummary) (float64, bool) {
	return p.HandoffLatencyMS.P99, p.HandoffLatencyMS.Count > 0
}

// unreachable matches the errors of a path that does not reach the peer:
// UCX's UCS_ERR_UNREACHABLE and the kernel's.
var unreachable = regexp.MustCompile(`(?i)destination is unreachable|no route to host|network is unreachable`)

// unreachableFailures counts the failed requests whose reason's example
// says the path did not reach the peer.
func unreachableFailures(s HandoffSummary) int {
	n := 0
	for reason, k := range s.FailuresByReason {
		if unreachable.MatchString(s.FailureExamples[reason]) {
			n += k
		}
	}
	return n
}

// unreachableWarning explains failures whose path did not reach the peer:
// on a host with a second network device UCX may pick it, and every request
// fails with nothing but "Destination is unreachable" in its records. It
// names the device this host routes each remote peer through (route) and
// the flag that pins it.
func unreachableWarning(s HandoffSummary, netDevices string, eps []runcore.EndpointInfo, route func(ip string) (string, error)) string {
	n, first := unreachableFailures(s), ""
	for _, reason := range runcore.ReasonOrder(s.FailuresByReason) {
		if ex := s.FailureExamples[reason]; unreachable.MatchString(ex) && first == "" {
			first = ex
		}
	}
	if n == 0 {
		return ""
	}
	if netDevices != "" {
		return fmt.Sprintf("%d requests failed as unreachable (first: %q) with --net-devices %s: the pinned device does not reach the peers", n, first, netDevices)
	}
	var via []string
	seen := map[string]bool{}
	for _, ep := range eps {
		h := advertHost(ep.SideChannel)
		if ip := net.ParseIP(h); ip == nil || ip.IsLoopback() || seen[h] {
			continue
		}
		seen[h] = true
		if dev, err := route(h); err == nil {
			via = append(via, fmt.Sprintf("%s through %s", h, dev))
		}
	}
	hint := "pin the device that reaches the peers with --net-devices (nixlctl probe env lists what UCX sees)"
	if len(via) > 0 {
		hint += "; this host reaches " + strings.Join(via, ", ")
	}
	return fmt.Sprintf("%d requests failed as unreachable (first: %q): UCX used a network device that does not reach the peer, as happens on hosts with a second interface (a docker or libvirt bridge); %s", n, first, hint)
}
