package engine

import "context"

// Prefill runs one prefill leg on the engine directly, for an endpoint
// that has no bench driver (the stand-in prefill behind an OpenAI-style
// API): the same path the control channel's "prefill" call takes.
func (e *Engine) Prefill(ctx context.Context, r PrefillRequest) (PrefillReply, error) {
	e.c.inFlight.Add(1)
	defer e.c.inFlight.Add(-1)
	return e.role.Prefill(ctx, r)
}

// Load runs one decode leg on the engine directly: the control channel's
// "load" call, for tests and tools that hold the decode in-process.
func (e *Engine) Load(ctx context.Context, r LoadRequest) (LoadReply, error) {
	e.c.inFlight.Add(1)
	defer e.c.inFlight.Add(-1)
	return e.role.Load(ctx, r)
}
