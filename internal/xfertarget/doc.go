// Package xfertarget is the passive side of bench xfer: a process that
// allocates and registers a segment, tags or checks it on request, and
// answers the initiator's metadata exchange over its control channel.
package xfertarget
