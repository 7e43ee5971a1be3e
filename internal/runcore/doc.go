// Package runcore is what every measuring run kind (bench xfer, the
// handoffs, bench ec, lease-chaos) shares and none owns: the option types
// results echo (Duration, ByteSize), the bounds a run may ask for, the
// host's memory room, address and --net-devices checks, where a run's
// processes ran and how their clocks relate (EndpointInfo), which network
// devices carried the payload (PathWatch, NetPath), and the provisional
// result a run saves while it goes (Snapshotter).
//
// It imports no run kind; each run kind imports it.
package runcore
