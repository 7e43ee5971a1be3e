package mono

import (
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// The runtime's clock must be CLOCK_MONOTONIC, or cross-process stage
// timings would be meaningless.
func TestNowIsClockMonotonic(t *testing.T) {
	t.Parallel()
	var ts unix.Timespec
	a := Now()
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts); err != nil {
		t.Fatal(err)
	}
	b := Now()
	if ts.Nano() < a || ts.Nano() > b {
		t.Fatalf("CLOCK_MONOTONIC %d outside [%d, %d]", ts.Nano(), a, b)
	}
	if d := Since(a); d < 0 || d > time.Minute {
		t.Fatalf("Since: %v", d)
	}
}
