package ctl

import "encoding/json"

// Message is one line of the channel: a request (ID, Method, Params), a
// reply (ID, Result or Error) or an event (Event, Data).
type Message struct {
	ID     uint64          `json:"id,omitempty"`
	Method string          `json:"method,omitempty"`
	Params json.RawMessage `json:"params,omitempty"`
	Result json.RawMessage `json:"result,omitempty"`
	Error  string          `json:"error,omitempty"`
	Event  string          `json:"event,omitempty"`
	Data   json.RawMessage `json:"data,omitempty"`
}

// Event is something a server reported on its own.
type Event struct {
	Name string
	Data json.RawMessage
}

// closeMethod ends a session once the requests running are answered; the
// server answers it itself, so no role can shadow it.
const closeMethod = "close"

// cancelMethod (params {"id": N}, itself sent without an id and never
// answered) cancels the context of request N if it still runs: a caller
// that gave up on a request (its context ended) stops the work at the
// other end too, so an endpoint does not go on holding blocks for a run
// that has stopped.
const cancelMethod = "cancel"

type cancelParams struct {
	ID uint64 `json:"id"`
}
