package engine

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net"
	"strconv"
	"strings"
)

// TransferParams are vLLM's kv_transfer_params: what prefill returns to
// the router and the router forwards to decode (pull), or what the router
// tells decode about prefill up front (push: no block ids).
type TransferParams struct {
	DoRemotePrefill bool   `json:"do_remote_prefill"`
	DoRemoteDecode  bool   `json:"do_remote_decode"`
	RemoteBlockIDs  []int  `json:"-"` // one KV-cache group's; on the wire, one list per group
	RemoteEngineID  string `json:"remote_engine_id"`
	RemoteRequestID string `json:"remote_request_id"`
	RemoteHost      string `json:"remote_host"`
	RemotePort      int    `json:"remote_port"`
	TPSize          int    `json:"tp_size"`
	DCPSize         int    `json:"dcp_size"`
	PPSize          int    `json:"pp_size"`
	RemoteNumTokens int    `json:"remote_num_tokens"`
	// RemoteBlocksExpiry is vLLM's remote_blocks_expiry_time: set only for
	// blocks a decode caches in bidirectional mode, else null.
	RemoteBlocksExpiry *float64 `json:"remote_blocks_expiry_time"`
	TransferMode       string   `json:"transfer_mode"`
}

// MarshalJSON writes vLLM's form: the keys in the order the scheduler's
// request_finished builds its dict, every key it sets present,
// remote_block_ids as one list per KV-cache group (nixlctl's engines have
// one group), dcp_size 1 unless set; compact, as vLLM's API server
// (Starlette's JSONResponse) writes it. Pull (pull_scheduler.py @0050936b)
// sets 13 keys; push (push_scheduler.py @0316d25a) has no dcp_size and no
// remote_blocks_expiry_time.
func (p TransferParams) MarshalJSON() ([]byte, error) {
	if p.DCPSize == 0 {
		p.DCPSize = 1
	}
	ids := p.RemoteBlockIDs
	if ids == nil {
		ids = []int{}
	}
	type head struct {
		DoRemotePrefill bool    `json:"do_remote_prefill"`
		DoRemoteDecode  bool    `json:"do_remote_decode"`
		RemoteBlockIDs  [][]int `json:"remote_block_ids"`
		RemoteEngineID  string  `json:"remote_engine_id"`
		RemoteRequestID string  `json:"remote_request_id"`
		RemoteHost      string  `json:"remote_host"`
		RemotePort      int     `json:"remote_port"`
		TPSize          int     `json:"tp_size"`
	}
	h := head{p.DoRemotePrefill, p.DoRemoteDecode, [][]int{ids}, p.RemoteEngineID, p.RemoteRequestID, p.RemoteHost,
		p.RemotePort, p.TPSize}
	var v any
	if p.TransferMode == "push" {
		v = struct {
			head
			PPSize          int    `json:"pp_size"`
			RemoteNumTokens int    `json:"remote_num_tokens"`
			TransferMode    string `json:"transfer_mode"`
		}{h, p.PPSize, p.RemoteNumTokens, p.TransferMode}
	} else {
		v = struct {
			head
			DCPSize            int      `json:"dcp_size"`
			PPSize             int      `json:"pp_size"`
			RemoteNumTokens    int      `json:"remote_num_tokens"`
			RemoteBlocksExpiry *float64 `json:"remote_blocks_expiry_time"`
			TransferMode       string   `json:"transfer_mode"`
		}{h, p.DCPSize, p.PPSize, p.RemoteNumTokens, p.RemoteBlocksExpiry, p.TransferMode}
	}
	var b bytes.Buffer
	e := json.NewEncoder(&b)
	e.SetEscapeHTML(false) // Python's json leaves <, > and & alone
	err := e.Encode(v)
	return bytes.TrimSuffix(b.Bytes(), []byte("\n")), err
}

// UnmarshalJSON reads vLLM's per-group lists (one group: more than one is
// a hybrid model nixlctl does not lay out, and an error), the flat list
// of connector versions before groups, or null.
func (p *TransferParams) UnmarshalJSON(b []byte) error {
	type plain TransferParams
	var w struct {
		plain
		RemoteBlockIDs json.RawMessage `json:"remote_block_ids"`
	}
	if err := json.Unmarshal(b, &w); err != nil {
		return err
	}
	*p = TransferParams(w.plain)
	if p.DCPSize == 0 {
		p.DCPSize = 1 // vLLM reads kv_transfer_params.get("dcp_size", 1)
	}
	raw := bytes.TrimSpace(w.RemoteBlockIDs)
	if len(raw) == 0 || bytes.Equal(raw, []byte("null")) {
		return nil
	}
	var groups [][]int
	if err := json.Unmarshal(raw, &groups); err == nil {
		switch len(groups) {
		case 0:
		case 1:
			p.RemoteBlockIDs = groups[0]
		default:
			return fmt.Errorf("remote_block_ids: %d KV-cache groups; nixlctl lays out one", len(groups))
		}
		return nil
	}
	if err := json.Unmarshal(raw, &p.RemoteBlockIDs); err != nil {
		return fmt.Errorf("remote_block_ids: want a list of block id lists: %w", err)
	}
	return nil
}

// SideEndpoint is the ZMQ endpoint of the params' side channel.
func (p TransferParams) SideEndpoint() string {
	return "tcp://" + net.JoinHostPort(p.RemoteHost, strconv.Itoa(p.RemotePort))
}

// splitEndpoint turns tcp://host:port into host and port.
func splitEndpoint(ep string) (string, int, error) {
	host, port, err := net.SplitHostPort(strings.TrimPrefix(ep, "tcp://"))
	if err != nil {
		return "", 0, err
	}
	p, err := strconv.Atoi(port)
	return host, p, err
}

// PrefillRequest asks prefill to compute a request's KV.
type PrefillRequest struct {
	ID     string `json:"id"` // the router's request id
	Tokens int    `json:"tokens"`
	Key    uint64 `json:"key"` // tag key of the request's content
	// CheckTP is the TP size of the decode that will check the tags
	// (nixlctl's router knows it); equal to prefill's, sparse tags write
	// only what its checks read (Pool.FillFor). 0: unknown.
	CheckTP int `json:"check_tp,omitempty"`
	// SGLang: the rendezvous room and the chunked-prefill chunk size.
	Room        uint64 `json:"room,omitempty"`
	ChunkTokens int    `json:"chunk_tokens,omitempty"`
}

// PrefillReply is prefill's answer once the KV is computed (pull, push)
// or sent (SGLang).
type PrefillReply struct {
	RequestID string         `json:"request_id"` // prefill's own id (router id + suffix)
	Params    TransferParams `json:"params"`
	Blocks    int            `json:"blocks"`
	TStart    int64          `json:"t_start"`
	TFinish   int64          `json:"t_finish"` // KV ready
	// SGLang: when the room was bootstrapped and the last chunk's WRITE done.
	TBootstrapped int64 `json:"t_bootstrapped,omitempty"`
	TPostStart    int64 `json:"t_post_start,omitempty"`
	TPostEnd      int64 `json:"t_post_end,omitempty"`
	TSent         int64 `json:"t_sent,omitempty"`
	Descriptors   int   `json:"descriptors,omitempty"`
	LogicalDescs  int   `json:"logical_descriptors,omitempty"`
	PostNS        int64 `json:"post_ns,omitempty"`
}

// LoadRequest asks decode to receive a request's KV.
type LoadRequest struct {
	ID           string         `json:"id"` // the router's request id
	Tokens       int            `json:"tokens"`
	PrefixTokens int            `json:"prefix_tokens"` // already cached on decode
	Key          uint64         `json:"key"`
	Params       TransferParams `json:"params"`
	Room         uint64         `json:"room,omitempty"`
	Bootstrap    string         `json:"bootstrap,omitempty"` // SGLang bootstrap server host:port
	// Foreign: the KV comes from an engine that is not nixlctl's (an
	// external SGLang prefill), so its bytes carry no tags and its aux
	// row is SGLang's own: neither is checked.
	Foreign bool `json:"foreign,omitempty"`
}

// AbortRequest asks decode to abort a request the router gave it; only a
// request still waiting for a slot can be aborted.
type AbortRequest struct {
	ID string `json:"id"` // the router's request id
}

// AbortReply says whether the request was found in decode's queue.
type AbortReply struct {
	Aborted bool `json:"aborted"`
}

// LoadReply is decode's account of one request. Times are CLOCK_MONOTONIC
// nanoseconds (comparable across processes on one host).
type LoadReply struct {
	RequestID          string  `json:"request_id"`
	Blocks             int     `json:"blocks"`
	Descriptors        int     `json:"descriptors"`
	LogicalDescriptors int     `json:"logical_descriptors"`
	Bytes              int64   `json:"bytes"`
	HandshakeMS        float64 `json:"handshake_ms"`
	FirstHandshake     bool    `json:"first_handshake"`
	TArrive            int64   `json:"t_arrive"`
	TScheduled         int64   `json:"t_scheduled,omitempty"` // got a decode slot (0: no slots configured)
	TRegSent           int64   `json:"t_reg_sent,omitempty"`
	TPostStart         int64   `json:"t_post_start,omitempty"`
	TPostEnd           int64   `json:"t_post_end,omitempty"`
	TXferDone          int64   `json:"t_xfer_done"`
	TReady             int64   `json:"t_ready"`
	CorruptBlocks      int     `json:"corrupt_blocks"`
	Corrupt            string  `json:"corrupt,omitempty"`
	Error              string  `json:"error,omitempty"`
}

// FreedEvent reports prefill releasing a request's blocks.
type FreedEvent struct {
	ID        string      `json:"id"`        // prefill's request id
	RouterID  string      `json:"router_id"` // the router's id
	Reason    FreedReason `json:"reason"`    // consumed, expired, pushed, failed
	Blocks    int         `json:"blocks"`
	TFinish   int64       `json:"t_finish"`
	TFreed    int64       `json:"t_freed"`
	Consumers int         `json:"consumers"` // completion notifications counted
	// Push: when the registration matched and the WRITE was posted/done.
	TRegReceived int64 `json:"t_reg_received,omitempty"`
	TPostStart   int64 `json:"t_post_start,omitempty"`
	TPostEnd     int64 `json:"t_post_end,omitempty"`
	TWriteDone   int64 `json:"t_write_done,omitempty"`
	Descriptors  int   `json:"descriptors,omitempty"`
	LogicalDescs int   `json:"logical_descriptors,omitempty"`
	Bytes        int64 `json:"bytes,omitempty"`
	Failed       bool  `json:"failed,omitempty"`
	// The lease: what the blocks weigh, the last heartbeat that renewed
	// it (0: none), how many did, and its deadline when it ended.
	HeldBytes  int64 `json:"held_bytes"`
	TLastRenew int64 `json:"t_last_renew,omitempty"`
	Renewals   int   `json:"renewals,omitempty"`
	TDeadline  int64 `json:"t_deadline,omitempty"`
}

// DecodeEvent is decode reporting a step of a request (lease-chaos):
// "queued" (it took its place in the queue, or a slot) and "crashing"
// (CrashAt: decode is about to kill itself).
type DecodeEvent struct {
	RouterID string `json:"router_id"`
	T        int64  `json:"t"`
}

// mapStamps applies toDriver to each stamp that was taken (0 means the
// stage does not apply and stays 0).
func mapStamps(toDriver func(int64) int64, stamps ...*int64) {
	for _, t := range stamps {
		if *t != 0 {
			*t = toDriver(*t)
		}
	}
}

// OnClock moves the reply's stamps onto another clock (the driver's), so
// that they subtract from stamps other processes took.
func (r *PrefillReply) OnClock(toDriver func(int64) int64) {
	mapStamps(toDriver, &r.TStart, &r.TFinish, &r.TBootstrapped, &r.TPostStart, &r.TPostEnd, &r.TSent)
}

// OnClock moves the reply's stamps onto another clock (the driver's).
func (r *LoadReply) OnClock(toDriver func(int64) int64) {
	mapStamps(toDriver, &r.TArrive, &r.TScheduled, &r.TRegSent, &r.TPostStart, &r.TPostEnd, &r.TXferDone, &r.TReady)
}

// OnClock moves the event's stamps onto another clock (the driver's).
func (f *FreedEvent) OnClock(toDriver func(int64) int64) {
	mapStamps(toDriver, &f.TFinish, &f.TFreed, &f.TRegReceived, &f.TPostStart, &f.TPostEnd, &f.TWriteDone, &f.TLastRenew, &f.TDeadline)
}
