// Package leasechaos is the lease-chaos run kind: the lease protocol of a
// prefill and a decode under the plans of internal/leasesim (a decode
// that crashes, stalls, loses heartbeats or aborts before reading;
// overload), played on real child processes or, with --sim, on the
// virtual-time simulator, each scenario under each freeing policy and
// judged against the same expectations.
//
// Its endpoints are started through internal/fleet; what every run kind
// shares is internal/runcore.
package leasechaos
