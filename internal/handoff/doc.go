// Package bench defines what a measured run is: workload generation,
// warm-up, the timed phase and the per-request records that runners emit
// for `nixlctl bench ...`, `lease-chaos` and the simulators.
package handoff
