// Package engine holds the KV handoff endpoints and their protocols: the
// prefill and decode roles with their KV pools, block allocator and
// request tables, the vLLM side channel, and vLLM's pull and push and
// SGLang's protocols. The lease state machines live in internal/lease,
// block tags in internal/blocktag, the encoder cache in internal/ec.
package engine
