// Package nixl is the transfer agent, in the shape of NIXL's own API so
// that NIXL itself and nixlctl's own backends are interchangeable and the
// concepts are the ones users know: an Agent registers memory, publishes
// its metadata, loads its peers' metadata, prepares descriptor lists,
// makes, posts, polls and releases transfer requests, and sends and
// receives notifications.
//
// Backends register themselves (Register) and are opened by name (Open):
// "ucx" is nixlctl's own thin layer over UCX, "nixl" loads the real NIXL at
// run time. Wrap any agent with WithFaults to inject failures.
//
// Semantics every backend keeps:
//   - A request is Done when the initiator's side is finished (its buffers
//     may be reused); a WRITE's data is visible at the target before the
//     notification attached to it is delivered there.
//   - Descriptors must lie inside registered memory, locally and remotely;
//     anything else is an error, never a stray access.
//   - Errors are returned, never panics: unknown agents, corrupt metadata,
//     releasing a request in flight, a dead peer.
package nixl
