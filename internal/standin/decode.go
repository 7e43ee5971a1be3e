package standin

import (
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"sync/atomic"
	"time"

	"github.com/nixlctl/nixlctl/internal/engine"
	"github.com/nixlctl/nixlctl/internal/mono"
)

// DecodeServer is a decode engine (pull) behind the slice of vLLM's OpenAI
// API that a disaggregated proxy calls on the decode: /v1/completions and
// /v1/chat/completions carrying the prefill's kv_transfer_params
// ({"do_remote_prefill": true, ...}). Each request handshakes with the
// prefill the params name (once per engine), READs its blocks over the
// transfer backend, checks their tags and sends the completion
// notification that frees them; then it answers as vLLM does. No model
// runs: the text is empty and one token is reported.
type DecodeServer struct {
	api
	requests, served, failed, corruptReqs atomic.Int64
	blocks, corruptBlocks, bytes          atomic.Int64
}

// DecodeCounts are the decode API's counters.
type DecodeCounts struct {
	// Requests: every completion request; Served: answered 200 with every
	// block read and checked; Rejected: 400 (bad body or
	// kv_transfer_params, an unknown or unreachable prefill engine);
	// Failed: the READ or the check failed (500). Corrupt: requests with
	// a block whose tags did not match.
	Requests        int64 `json:"requests"`
	Served          int64 `json:"served"`
	Rejected        int64 `json:"rejected"`
	Failed          int64 `json:"failed"`
	CorruptRequests int64 `json:"corrupt_requests"`
	// BlocksRead: blocks READ and checked (per decode rank's view, as
	// engine blocks); CorruptBlocks: those whose tags did not match.
	BlocksRead    int64 `json:"blocks_read"`
	CorruptBlocks int64 `json:"corrupt_blocks"`
	BytesRead     int64 `json:"bytes_read"`
}

// NewDecode wraps a decode engine (protocol pull) in the API.
func NewDecode(eng *engine.Engine, o Options, log *slog.Logger) *DecodeServer {
	s := &DecodeServer{}
	s.init(eng, o, log, s.complete, func() any { return s.Counts() })
	return s
}

// Counts reads the counters.
func (s *DecodeServer) Counts() DecodeCounts {
	return DecodeCounts{Requests: s.requests.Load(), Served: s.served.Load(), Rejected: s.rejected.Load(), Failed: s.failed.Load(),
		CorruptRequests: s.corruptReqs.Load(), BlocksRead: s.blocks.Load(), CorruptBlocks: s.corruptBlocks.Load(), BytesRead: s.bytes.Load()}
}

// Legs are the stamps of the last legs served.
func (s *DecodeServer) Legs() []LegStamps { return s.legs.All() }

// decodeParams is what a decode reads of kv_transfer_params: the
// pointers tell a missing field from a zero one.
type decodeParams struct {
	DoRemotePrefill bool            `json:"do_remote_prefill"`
	RemoteEngineID  *string         `json:"remote_engine_id"`
	RemoteRequestID *string         `json:"remote_request_id"`
	RemoteBlockIDs  json.RawMessage `json:"remote_block_ids"`
	RemoteHost      *string         `json:"remote_host"`
	RemotePort      *int            `json:"remote_port"`
	TPSize          *int            `json:"tp_size"`
}

// checkParams refuses kv_transfer_params a vLLM decode could not act on,
// naming what is wrong, and decodes them.
func checkParams(raw json.RawMessage) (engine.TransferParams, error) {
	var p engine.TransferParams
	if len(raw) == 0 || string(raw) == "null" {
		return p, errors.New(`this is a stand-in decode: it serves only decode legs, requests with the prefill's "kv_transfer_params" ({"do_remote_prefill": true, "remote_engine_id", "remote_block_ids", "remote_host", "remote_port", ...}) as the proxy forwards them`)
	}
	var d decodeParams
	if err := json.Unmarshal(raw, &d); err != nil {
		return p, fmt.Errorf("kv_transfer_params: %v", err)
	}
	if !d.DoRemotePrefill {
		return p, errors.New(`kv_transfer_params: "do_remote_prefill" is not true: this is a stand-in decode, it serves only requests whose KV a prefill computed`)
	}
	var missing []string
	if d.RemoteEngineID == nil || *d.RemoteEngineID == "" {
		missing = append(missing, "remote_engine_id")
	}
	if d.RemoteRequestID == nil || *d.RemoteRequestID == "" {
		missing = append(missing, "remote_request_id")
	}
	if b := strings.TrimSpace(string(d.RemoteBlockIDs)); b == "" || b == "null" {
		missing = append(missing, "remote_block_ids")
	}
	if d.RemoteHost == nil || *d.RemoteHost == "" {
		missing = append(missing, "remote_host")
	}
	if d.RemotePort == nil {
		missing = append(missing, "remote_port")
	}
	if d.TPSize == nil {
		missing = append(missing, "tp_size")
	}
	if len(missing) > 0 {
		return p, fmt.Errorf("kv_transfer_params lack %s (pass on the prefill's kv_transfer_params unchanged)", strings.Join(missing, ", "))
	}
	if err := json.Unmarshal(raw, &p); err != nil {
		return p, fmt.Errorf("kv_transfer_params: %v", err)
	}
	if p.RemotePort <= 0 || p.RemotePort > 65535 {
		return p, fmt.Errorf("kv_transfer_params: remote_port %d: want 1 to 65535", p.RemotePort)
	}
	if p.TPSize <= 0 {
		return p, fmt.Errorf("kv_transfer_params: tp_size %d: want 1 or more", p.TPSize)
	}
	if len(p.RemoteBlockIDs) == 0 {
		return p, errors.New("kv_transfer_params: remote_block_ids is empty")
	}
	return p, nil
}

// tagID is the router id the prefill stand-in tagged the blocks with:
// its remote_request_id less the random suffix ("<id>-<8 hex>"). Taken
// from the params rather than this leg's X-Request-Id, so the check holds
// behind a proxy that names the two legs differently.
func tagID(remoteRequestID string) string {
	i := strings.LastIndexByte(remoteRequestID, '-')
	if i <= 0 || len(remoteRequestID)-i-1 != 8 {
		return remoteRequestID
	}
	return remoteRequestID[:i]
}

func (s *DecodeServer) complete(chat bool) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		arrived := mono.Now()
		s.requests.Add(1)
		req, ok := s.readRequest(w, r)
		if !ok {
			return
		}
		p, err := checkParams(req.KVTransferParams)
		if err != nil {
			s.reject(w, r, err.Error())
			return
		}
		// The prompt's tokens: remote_num_tokens where the prefill sent it
		// (vLLM's does), else the prompt as the prefill stand-in counts it.
		tokens := p.RemoteNumTokens
		if tokens <= 0 {
			if chat {
				tokens, err = s.chatTokens(req.Messages)
			} else {
				tokens, err = s.promptTokens(req.Prompt)
			}
			if err != nil {
				s.reject(w, r, err.Error())
				return
			}
		}
		if tokens > s.o.MaxModelLen {
			s.reject(w, r, fmt.Sprintf("This model's maximum context length is %d tokens. However, your request has %d input tokens. Please reduce the length of the input messages.", s.o.MaxModelLen, tokens))
			return
		}
		id := cmp.Or(r.Header.Get("X-Request-Id"), req.RequestID, p.RemoteRequestID)
		tag := tagID(p.RemoteRequestID)
		rep, err := s.eng.Load(r.Context(), engine.LoadRequest{ID: id, Tokens: tokens, Key: TagKey(tag), Params: p})
		if err == nil && rep.Error != "" {
			err = errors.New(rep.Error)
		}
		if err != nil {
			if strings.Contains(err.Error(), engine.ErrHandshake.Error()) || strings.Contains(err.Error(), "block ids for a") ||
				strings.Contains(err.Error(), "pipeline stages") {
				// The params name an engine that is not there (or not
				// the one named), or blocks that do not fit the prompt:
				// the client's to fix.
				s.reject(w, r, fmt.Sprintf("kv_transfer_params name prefill engine %q at %s, which this decode cannot read from: %v",
					p.RemoteEngineID, p.SideEndpoint(), err))
				return
			}
			s.failed.Add(1)
			s.log.Warn("decode leg failed", "request_id", id, "remote_request_id", p.RemoteRequestID, "err", err)
			writeError(w, http.StatusInternalServerError, "InternalServerError", fmt.Sprintf("reading the KV of %s from %s: %v", p.RemoteRequestID, p.RemoteEngineID, err))
			return
		}
		s.blocks.Add(int64(rep.Blocks))
		s.bytes.Add(rep.Bytes)
		stamps := LegStamps{RemoteRequestID: p.RemoteRequestID, RequestID: id, Blocks: rep.Blocks, TArrive: arrived,
			TReady: rep.TReady, TPostStart: rep.TPostStart, TXferDone: rep.TXferDone, HandshakeMS: rep.HandshakeMS,
			CorruptBlocks: rep.CorruptBlocks}
		if rep.CorruptBlocks > 0 {
			s.corruptReqs.Add(1)
			s.corruptBlocks.Add(int64(rep.CorruptBlocks))
			s.failed.Add(1)
			stamps.TSent = mono.Now()
			s.legs.add(stamps)
			s.log.Warn("corrupt KV", "request_id", id, "remote_request_id", p.RemoteRequestID, "blocks", rep.CorruptBlocks, "first", rep.Corrupt)
			writeError(w, http.StatusInternalServerError, "InternalServerError", fmt.Sprintf("wrong bytes in %d places of the %d blocks of %s read from %s (tag key of %q): %s",
				rep.CorruptBlocks, rep.Blocks, p.RemoteRequestID, p.RemoteEngineID, tag, rep.Corrupt))
			return
		}
		s.served.Add(1)
		s.log.Info("decode leg", "request_id", id, "remote_request_id", p.RemoteRequestID, "tokens", tokens, "blocks", rep.Blocks,
			"handshake_ms", rep.HandshakeMS)
		model := cmp.Or(req.Model, s.o.ServedModel)
		if req.Stream {
			stamps.TSent = mono.Now()
			s.legs.add(stamps)
			s.stream(w, chat, id, model, tokens, stamps)
			return
		}
		stamps.TSent = mono.Now()
		s.legs.add(stamps)
		resp := s.response(chat, id, model, tokens, engine.TransferParams{}).(map[string]any)
		resp["kv_transfer_params"] = nil // vLLM's decode answers with none
		resp["nixlctl"] = stamps
		writeJSON(w, http.StatusOK, resp)
	}
}

// stream answers "stream": true as vLLM does: server-sent events, one
// chunk per token (one here) and "data: [DONE]"; the chunk carries the
// stand-in's stamps under "nixlctl", as the JSON answer does.
func (s *DecodeServer) stream(w http.ResponseWriter, chat bool, id, model string, tokens int, st LegStamps) {
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-cache")
	w.WriteHeader(http.StatusOK)
	created := time.Now().Unix()
	var chunk map[string]any
	if chat {
		chunk = map[string]any{"id": "chatcmpl-" + id, "object": "chat.completion.chunk", "created": created, "model": model,
			"choices": []any{map[string]any{"index": 0, "delta": map[string]any{"role": "assistant", "content": ""}, "logprobs": nil, "finish_reason": "length"}}}
	} else {
		chunk = map[string]any{"id": "cmpl-" + id, "object": "text_completion", "created": created, "model": model,
			"choices": []any{map[string]any{"index": 0, "text": "", "logprobs": nil, "finish_reason": "length"}}}
	}
	chunk["usage"] = map[string]int{"prompt_tokens": tokens, "completion_tokens": 1, "total_tokens": tokens + 1}
	chunk["nixlctl"] = st
	b, _ := json.Marshal(chunk)
	fmt.Fprintf(w, "data: %s\n\ndata: [DONE]\n\n", b)
	if f, ok := w.(http.Flusher); ok {
		f.Flush()
	}
}

// CheckDecodeConfig says whether cfg can run behind the decode API.
func CheckDecodeConfig(cfg engine.Config) error {
	if cfg.Role != engine.RoleDecode {
		return errors.New("a stand-in decode is a decode")
	}
	if cfg.Protocol != engine.ProtoPull {
		return errors.New("the stand-in decode speaks vLLM's pull protocol only (kv_transfer_params from the prefill's answer)")
	}
	return nil
}
