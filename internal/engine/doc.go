// Package engine holds the transfer endpoints and their protocols: the
// prefill, decode and encoder roles with their KV pools and request
// tables, the side channel, and the pull, push, SGLang, lease and
// encoder-cache state machines.
package engine
