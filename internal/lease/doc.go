// Package lease holds the KV lease protocol (vLLM PR #41383) as plain
// state machines: prefill's Table of leases with its reaper, and decode's
// HeartbeatTracker. Neither reads a clock; every method takes "now", so
// the endpoints (CLOCK_MONOTONIC), the lease-chaos simulator (a virtual
// clock) and the unit tests (a fake one) drive the same code. It imports
// nothing but the standard library: no cgo, no sockets.
package lease
