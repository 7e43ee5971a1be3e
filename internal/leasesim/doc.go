// Package leasesim holds the lease-chaos scenarios as plans (ChaosPlan,
// PlanFor), the expectations that judge a run (Judge), and a virtual-time
// simulator that plays the same plans, and long Poisson traffic, over the
// lease package's state machines. It imports no cgo, no sockets and no
// transfer code: the real-process runner in internal/leasechaos shares only
// the plans and the judge with it.
package leasesim
