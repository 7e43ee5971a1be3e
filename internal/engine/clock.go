package engine

import "github.com/nixlctl/nixlctl/internal/mono"

// Clock is where the engine's state machines get "now" from: nanoseconds
// on CLOCK_MONOTONIC by default. Tests give the engine a fake one so
// deadlines (the push watchdog, parked registrations, SGLang rooms) pass
// when the test says so, not after a sleep. Transfer stage times stay on
// the real clock: they are joined with the other process's.
type Clock interface {
	Now() int64
}

// monoClock is the real clock, shared by every process on the host.
type monoClock struct{}

func (monoClock) Now() int64 { return mono.Now() }

// now is the engine's clock (Config.Clock, or CLOCK_MONOTONIC).
func (e *Engine) now() int64 { return e.clock.Now() }
