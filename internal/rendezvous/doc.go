// Package rendezvous lets the prefill and decode endpoints of a multi-host
// run find the driver, instead of the driver being told every endpoint's
// address on its command line. Under a launcher (Slurm, a Kubernetes
// Indexed Job) nobody knows those addresses when the job is written; each
// endpoint knows its own rank and the driver's address, so it announces
// itself with one hello (run id, role, rank, world size, host, control
// address), and the driver waits until the roster it expects is complete
// or a join window ends, then reports exactly which role and ranks never
// came, left, or were turned away.
//
// Two transports carry the hello:
//   - TCP: the driver listens (Listen); each endpoint dials it (Join) and
//     sends one JSON line. The connection stays open as the member's
//     liveness, and a member with nowhere to listen can ask for the
//     connection itself to be its control channel ("reverse").
//   - etcd: each endpoint puts its hello under
//     nixlctl/<run>/members/<role>/<rank> on a lease it keeps alive
//     (JoinEtcd), so a dead endpoint's key goes away; the driver waits
//     with a watch, not by polling (WatchEtcd).
//
// Open and Register pick the transport from an address: etcd://HOST:PORT
// or a plain (tcp://)HOST:PORT.
//
// The TCP wire, one JSON line each way: the member sends
// {"v":1,"run":…,"role":…,"rank":…,"world":…,"host":…,"ctl":…}; the
// driver answers {"ok":true,"addr":"HOST:PORT it will dial"} or
// {"reason":"duplicate|wrong-run|not-in-roster|world-size|garbage|late",
// "error":"…"} and closes. In etcd the member key's value is the same
// hello line; a member refused a taken slot leaves
// nixlctl/<run>/rejected/<role>/<rank>/<lease> on its lease so that the
// driver counts it.
package rendezvous
