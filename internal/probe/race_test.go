//go:build race

package probe

// raceEnabled: this test binary runs under the race detector, whose own
// bookkeeping grows a process's RSS for tens of seconds.
const raceEnabled = true
