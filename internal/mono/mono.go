// Package mono reads the system's monotonic clock (CLOCK_MONOTONIC) as
// nanoseconds. Unlike time.Time's hidden monotonic reading, the value is
// the same clock in every process on a host, so endpoints in different
// processes can time one request's stages against each other; reading it
// costs what time.Now does (the runtime's vDSO path), not a syscall.
package mono

import (
	"time"
	_ "unsafe" // for go:linkname
)

//go:linkname nanotime runtime.nanotime
func nanotime() int64

// Now is CLOCK_MONOTONIC in nanoseconds.
func Now() int64 { return nanotime() }

// Since is the time elapsed since a Now reading.
func Since(t int64) time.Duration { return time.Duration(nanotime() - t) }
