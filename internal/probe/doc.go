// Package probe holds diagnostics that are not benchmarks: the UCX RSS
// leak probe and the transport doctor.
package probe
