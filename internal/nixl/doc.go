// Package nixl is the transfer agent, shaped like NIXL's own API (register
// memory, exchange metadata, prepare descriptor lists, post transfers,
// poll status, notifications), and its backends.
package nixl
