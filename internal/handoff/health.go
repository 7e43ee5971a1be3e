package handoff

import (
	"fmt"
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
