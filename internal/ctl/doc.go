// Package ctl is the one control channel between the bench driver and the
// processes it starts (engine endpoints, the xfer target, the encoder, the
// leak peer): JSON lines carrying requests with ids, answered out of order,
// and events nobody asked for. A role is a set of named handlers on a
// Server; a Client reaches it as a child process (stdin/stdout), in this
// process over pipes, or over TCP, and closes it with a grace period.
package ctl
