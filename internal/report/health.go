package report

// HealthReporter results say what went wrong in the run itself, apart
// from how fast it was: requests that failed, blocks leaked or corrupted,
// an interruption. A run with problems is a failed check (exit 1) unless
// the user allows failures, and the gate refuses to pass it, because its
// numbers describe a run that did not do the work it claims to measure.
type HealthReporter interface {
	// Problems lists them, one short line each ("3 of 200 requests
	// failed (2 registration timeout, 1 peer died)"); empty when none.
	Problems() []string
}

// Problems returns r's problems, or nil when r reports none or cannot.
func Problems(r Result) []string {
	if h, ok := r.(HealthReporter); ok {
		return h.Problems()
	}
	return nil
}
