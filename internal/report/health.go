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

// Problems returns r's problems, or nil when r reports none or cannot. A
// partial result (a killed run's) always has one, whatever its kind: its
// numbers cover part of a run, so the gate must not take it for a whole.
func Problems(r Result) []string {
	var p []string
	if h, ok := r.(HealthReporter); ok {
		p = h.Problems()
	}
	if r.Header().Partial {
		p = append(p, "the run did not finish (partial: killed before it wrote its result)")
	}
	return p
}

// HostSharer results say whether other processes took enough of their
// host's CPUs while they measured to move their rates (a neighbour on a
// small host); the gate lists such runs beside its verdict.
type HostSharer interface {
	// SharedHost is one short line when they did ("other processes used
	// 0.79 of the host's 2 CPUs (0.86 at the most)"), "" otherwise.
	SharedHost() string
	// HostMoved reports whether they took that much on average over the
	// run, not in one burst: then the run's rates (and on a small host
	// its ratios too) moved with the neighbour, and the gate judges
	// without it where enough runs that did not remain.
	HostMoved() bool
}

// NeighbourMoved is r's own HostMoved (a --repeat result's: its
// representative run's); false when it cannot say.
func NeighbourMoved(r Result) bool {
	h, ok := r.(HostSharer)
	return ok && h.HostMoved()
}

// ownSharedHost is the line of r's own run.
func ownSharedHost(r Result) string {
	if h, ok := r.(HostSharer); ok {
		return h.SharedHost()
	}
	return ""
}
