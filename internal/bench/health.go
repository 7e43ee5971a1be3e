package bench

import (
	"fmt"
	"regexp"
	"sort"
	"strings"

	"github.com/nixlctl/nixlctl/internal/ec"
)

// Every result says what went wrong in its run (report.HealthReporter):
// the CLI fails the run on it and the gate refuses to pass it.

// Problems implements report.HealthReporter.
func (res *HandoffResult) Problems() []string {
	var p []string
	s := res.Summary
	if s.Requests == 0 {
		// A result without a measured request (its summary emptied, or
		// a run whose warm-up took every request) reads as a zeroed run.
		p = append(p, "no request was measured")
	}
	if s.Failed > 0 {
		p = append(p, fmt.Sprintf("%d of %d requests failed%s", s.Failed, s.Requests, byReason(s.FailuresByReason)))
	}
	if s.CorruptBlocks > 0 {
		p = append(p, fmt.Sprintf("%d corrupt blocks", s.CorruptBlocks))
	}
	if s.LeakedBlocks > 0 {
		p = append(p, fmt.Sprintf("%d blocks leaked (still held at the end)", s.LeakedBlocks))
	}
	if res.EndpointDied != "" {
		p = append(p, "the "+res.EndpointDied+" endpoint died mid-run")
	}
	if res.Interrupted {
		p = append(p, "interrupted")
	}
	return p
}

// Problems implements report.HealthReporter.
func (res *XferResult) Problems() []string {
	var p []string
	if res.Failure != "" {
		p = append(p, "the sweep stopped at "+res.Failure)
	} else if len(res.Points) == 0 {
		p = append(p, "no point was measured")
	}
	for _, pt := range res.Points {
		if strings.HasPrefix(pt.Consistency, "FAILED") {
			p = append(p, fmt.Sprintf("block %d batch %d: consistency check %s", pt.BlockSize, pt.BatchSize, pt.Consistency))
		}
	}
	if res.Interrupted {
		p = append(p, "interrupted")
	}
	return p
}

// Problems implements report.HealthReporter.
func (res *ECResult) Problems() []string {
	var p []string
	s := res.Summary
	if s.Images == 0 {
		p = append(p, "no image was measured")
	}
	if s.Failed > 0 {
		p = append(p, fmt.Sprintf("%d of %d images failed%s", s.Failed, s.Images, byReason(s.FailuresByStatus)))
	} else if n := s.FailuresByStatus[ec.FailTagMismatch]; n > 0 {
		p = append(p, fmt.Sprintf("%d deliveries had wrong bytes", n))
	}
	if res.Interrupted {
		p = append(p, "interrupted")
	}
	return p
}

// Problems implements report.HealthReporter.
func (res *LeaseChaosResult) Problems() []string {
	var p []string
	for _, s := range res.Scenarios {
		if !s.Passed {
			p = append(p, fmt.Sprintf("scenario %s failed its expectation", s.Series()))
		}
	}
	if res.Interrupted {
		p = append(p, "interrupted")
	}
	return p
}

// byReason renders a count per reason as " (2 registration timeout, 1
// peer died)", largest first; "" when there are none.
func byReason[N int | int64](m map[string]N) string {
	if len(m) == 0 {
		return ""
	}
	keys := make([]string, 0, len(m))
	for k, n := range m {
		if n > 0 {
			keys = append(keys, k)
		}
	}
	sort.Slice(keys, func(i, j int) bool {
		if m[keys[i]] != m[keys[j]] {
			return m[keys[i]] > m[keys[j]]
		}
		return keys[i] < keys[j]
	})
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = fmt.Sprintf("%d %s", m[k], k)
	}
	return " (" + strings.Join(parts, ", ") + ")"
}

// volatile matches the parts of an error message that differ between
// requests failing for the same reason: ids, addresses, counts, times.
var volatile = regexp.MustCompile(`[0-9a-fA-F]*[0-9][0-9a-fA-Fx.:]*(ms|µs|us|ns|s)?`)

// FailureReason is the reason a failed request's error is counted under
// in summary.failures_by_reason, for readers that pair a reason with the
// records it came from (the HTML report's example per reason).
func FailureReason(err string) string { return failureReason(err) }

// failureReason turns one request's error into the reason it is counted
// under: the message with its request-specific numbers and ids folded,
// and at most 80 characters of it.
func failureReason(err string) string {
	r := volatile.ReplaceAllString(err, "N")
	if len(r) > 80 {
		r = r[:77] + "..."
	}
	return r
}
