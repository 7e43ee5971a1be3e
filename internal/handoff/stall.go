package handoff

import (
	"cmp"
	"fmt"
	"math"
	"slices"
	"time"

	"github.com/nixlctl/nixlctl/internal/stats"
)

// A stall is a stretch of a run's timed phase in which no request
// finished, far longer than a request takes: a frozen endpoint (SIGSTOP,
// a debugger, a swapped-out host) or a lost wake-up. The run's rates then
// measure the stall, not the transport, while its typical request looks
// healthy, so a latency test sees nothing (issue 29: a decode frozen for
// 20 s of a 25 s run read -82% efficiency and passed the gate as noise).
const (
	// stallMin is the shortest gap called a stall: on a busy 2-core host
	// scheduling alone leaves no request finishing for a few hundred ms.
	stallMin = time.Second
	// stallRequests is how many typical requests' time a gap must last.
	stallRequests = 20
)

// stallOf returns the longest stretch in which a measured request was in
// flight and none finished, and the median request time (start to
// decode ready) it is judged against. A gap with nothing in flight (an
// open loop's pause between arrivals, the reference between rounds) is
// idle, not stalled.
func stallOf(records []HandoffRecord) (stall, typical time.Duration) {
	type span struct{ start, end int64 }
	var spans []span
	var took []float64
	for _, r := range records {
		if r.Warmup || r.Error != "" || r.TReady <= r.TStart {
			continue
		}
		spans = append(spans, span{r.TStart, r.TReady})
		took = append(took, float64(r.TReady-r.TStart))
	}
	slices.SortFunc(spans, func(a, b span) int { return cmp.Compare(a.end, b.end) })
	prev := int64(math.MinInt64)
	for _, s := range spans {
		// Since the later of the previous finish and this request's
		// start, this request was in flight and nothing finished.
		stall = max(stall, time.Duration(s.end-max(prev, s.start)))
		prev = s.end
	}
	return stall, time.Duration(stats.Median(took))
}

// stallWarning is the result's warning for a run that stalled, "" for
// one that did not.
func stallWarning(records []HandoffRecord) (string, time.Duration) {
	gap, typical := stallOf(records)
	if gap < stallMin || gap < stallRequests*typical {
		return "", 0
	}
	return fmt.Sprintf("the run stalled: no request finished for %.1f s (%.0fx the median request's %.1f ms): a frozen endpoint or host? Its rates measure the stall, not the transfers",
		gap.Seconds(), float64(gap)/float64(max(typical, 1)), float64(typical)/1e6), gap
}
