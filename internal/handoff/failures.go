package handoff

import (
	"regexp"
)

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
