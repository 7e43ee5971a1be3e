// Package ecbench is the bench ec run kind: encoder-cache transfers
// between an encoder (producer) process, a child of this driver or a
// remote serve, and several consumers in this process, with vLLM's
// ECCPUConnector protocol over real transfers (the consumers READ, or the
// producer WRITEs); per-request latency, bandwidth and the cache's hit
// rate, against a memcpy reference measured in the same run.
//
// The protocol is internal/ec; what every run kind shares (option types,
// host room, network path, peers) is internal/runcore.
package ecbench
