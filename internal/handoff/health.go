package handoff

import (
	"fmt"
	"regexp"
	"strconv"
	"strings"

	"github.com/nixlctl/nixlctl/internal/runcore"
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
		line := fmt.Sprintf("%d of %d requests failed%s", s.Failed, s.Requests, runcore.ByReason(s.FailuresByReason))
		if ex := firstExamples(s.FailuresByReason, s.FailureExamples); ex != "" {
			line += "; first of each: " + ex
		}
		if res.Config.NetDevices == "" && unreachableFailures(s) > 0 {
			// The first thing a user reads: name the fix there too.
			line += "; UCX used a network device that does not reach the peer: pin one that does with --net-devices (see the warnings)"
		}
		p = append(p, line)
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

// firstExamples renders the example of each reason, in byReason's order,
// as `"full error"; "full error"`; "" without examples (results written
// before they were recorded).
func firstExamples(m map[string]int, ex map[string]string) string {
	if len(ex) == 0 {
		return ""
	}
	var parts []string
	for _, k := range runcore.ReasonOrder(m) {
		if e, ok := ex[k]; ok && e != k {
			parts = append(parts, strconv.Quote(e))
		}
	}
	return strings.Join(parts, "; ")
}

// maxFailureExample bounds one example: whole enough to name the address
// and the error, short enough that a million failures cannot bloat a
// result (there is one per reason, and reasons are folded).
const maxFailureExample = 400

func failureExample(err string) string {
	if len(err) > maxFailureExample {
		return err[:maxFailureExample-3] + "..."
	}
	return err
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
