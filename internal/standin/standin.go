// Package standin is a prefill engine without a bench driver: nixlctl's
// vLLM prefill (pull protocol) behind the slice of vLLM's OpenAI API that a
// disaggregated proxy uses, so that it can stand in for a prefill engine
// next to a real vLLM decode. The proxy sends the prefill leg to
// /v1/completions (or /v1/chat/completions) with kv_transfer_params
// {"do_remote_decode": true}; the stand-in allocates the prompt's blocks,
// fills them with tags, arms a lease and answers with vLLM's
// kv_transfer_params, which the proxy forwards to the decode. The decode
// handshakes with the engine's side channel, READs the blocks and sends its
// completion notification, on which the blocks are freed (or the lease
// expires). No model runs: the completion's text is empty.
package standin

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"time"

	"github.com/nixlctl/nixlctl/internal/engine"
	"github.com/nixlctl/nixlctl/internal/kv"
	"github.com/nixlctl/nixlctl/internal/mono"
)

// maxBody bounds a request body: prompts of token ids at MaxTokens fit.
const maxBody = 64 << 20

// Options are what the API needs besides the engine.
type Options struct {
	// ServedModel is the model name /v1/models lists and responses carry.
	ServedModel string
	// PromptTokens, when > 0, is the token count of every text prompt
	// (nixlctl has no tokenizer); 0 counts a text prompt's bytes, an upper
	// bound for byte-level BPE tokenizers (see TextTokens).
	PromptTokens int
	// MaxModelLen is what /v1/models reports and the longest prompt
	// served (0: kv.MaxTokens): the model's max_position_embeddings, from
	// which vLLM derives its default max_model_len.
	MaxModelLen int
}

// Server serves the API over one engine.
type Server struct {
	api
	served, failed atomic.Int64
}

// api is what both stand-ins' servers are built on: the engine, the
// options, the routes a proxy and bench proxy read besides the
// completions, and the count of requests refused as bad input.
type api struct {
	eng      *engine.Engine
	o        Options
	log      *slog.Logger
	http     *http.Server
	legs     *stampLog
	rejected atomic.Int64
}

// init sets the API up: complete answers both completion routes (chat:
// /v1/chat/completions), counts is what /nixlctl/stats reports as "api".
func (s *api) init(eng *engine.Engine, o Options, log *slog.Logger, complete func(chat bool) http.HandlerFunc, counts func() any) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	o.MaxModelLen = min(cmp.Or(o.MaxModelLen, kv.MaxTokens), kv.MaxTokens)
	s.eng, s.o, s.log, s.legs = eng, o, log, newStampLog()
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/completions", complete(false))
	mux.HandleFunc("POST /v1/chat/completions", complete(true))
	mux.HandleFunc("GET /health", func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusOK) })
	mux.HandleFunc("GET /v1/models", func(w http.ResponseWriter, _ *http.Request) {
		writeJSON(w, http.StatusOK, map[string]any{"object": "list", "data": []any{map[string]any{
			"id": s.o.ServedModel, "object": "model", "owned_by": "nixlctl-standin", "max_model_len": s.o.MaxModelLen}}})
	})
	mux.HandleFunc("GET /nixlctl/stats", func(w http.ResponseWriter, _ *http.Request) {
		writeJSON(w, http.StatusOK, map[string]any{"api": counts(), "engine": s.eng.Stats(), "mono_ns": mono.Now()})
	})
	mux.HandleFunc("GET /nixlctl/legs", s.legs.serve)
	s.http = &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
}

// Serve answers on ln until ctx ends, then shuts the server down (5 s
// for requests in flight); a shutdown is a clean end.
func (s *api) Serve(ctx context.Context, ln net.Listener) error {
	stop := context.AfterFunc(ctx, func() {
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = s.http.Shutdown(sctx)
	})
	defer stop()
	if err := s.http.Serve(ln); !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}

// readRequest reads a completion request's body; a bad one is refused
// (false).
func (s *api) readRequest(w http.ResponseWriter, r *http.Request) (completionRequest, bool) {
	var req completionRequest
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxBody))
	if err == nil {
		err = json.Unmarshal(body, &req)
	}
	if err != nil {
		s.reject(w, r, fmt.Sprintf("request body: %v", err))
		return req, false
	}
	return req, true
}

func (s *api) reject(w http.ResponseWriter, r *http.Request, msg string) {
	s.rejected.Add(1)
	s.log.Warn("request refused", "path", r.URL.Path, "from", r.RemoteAddr, "why", msg)
	writeError(w, http.StatusBadRequest, "BadRequestError", msg)
}

// New wraps a prefill engine (protocol pull) in the API.
func New(eng *engine.Engine, o Options, log *slog.Logger) *Server {
	s := &Server{}
	s.init(eng, o, log, s.complete, func() any { return s.Counts() })
	return s
}

// Counts are the API's counters: legs answered, refused as bad input,
// and failed in the engine.
type Counts struct {
	Served   int64 `json:"served"`
	Rejected int64 `json:"rejected"`
	Failed   int64 `json:"failed"`
}

// Counts reads the counters.
func (s *Server) Counts() Counts {
	return Counts{Served: s.served.Load(), Rejected: s.rejected.Load(), Failed: s.failed.Load()}
}

// TagKey is the key a request's blocks are tagged with: derived from the
// router's request id, so a nixlctl decode given the same id verifies
// every byte it read.
func TagKey(requestID string) uint64 {
	h := fnv.New64a()
	_, _ = h.Write([]byte(requestID))
	return h.Sum64()
}

// completionRequest is what the stand-in reads of an OpenAI request.
type completionRequest struct {
	Model            string          `json:"model"`
	Prompt           json.RawMessage `json:"prompt"`
	Messages         json.RawMessage `json:"messages"`
	KVTransferParams json.RawMessage `json:"kv_transfer_params"`
	RequestID        string          `json:"request_id"`
	Stream           bool            `json:"stream"`
}

func (s *Server) complete(chat bool) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		arrived := mono.Now()
		req, ok := s.readRequest(w, r)
		if !ok {
			return
		}
		var kvp struct {
			DoRemoteDecode bool `json:"do_remote_decode"`
		}
		if len(req.KVTransferParams) == 0 || string(req.KVTransferParams) == "null" || json.Unmarshal(req.KVTransferParams, &kvp) != nil || !kvp.DoRemoteDecode {
			s.reject(w, r, `this is a stand-in prefill: it serves only prefill legs, requests with "kv_transfer_params": {"do_remote_decode": true}`)
			return
		}
		if req.Stream {
			// vLLM would answer with server-sent events, whose chunks do not
			// carry the kv_transfer_params the proxy needs from the prefill
			// leg (vLLM's toy_proxy_server.py sends that leg with "stream":
			// false). Answering as if false misled a streaming client; the
			// stand-in refuses it instead.
			s.reject(w, r, `"stream": true is not served: the stand-in answers a prefill leg with one JSON response carrying kv_transfer_params; send "stream": false, as vLLM's proxy does for the prefill leg`)
			return
		}
		var tokens int
		var err error
		if chat {
			tokens, err = s.chatTokens(req.Messages)
		} else {
			tokens, err = s.promptTokens(req.Prompt)
		}
		if err == nil && tokens > s.o.MaxModelLen {
			// vLLM's wording for a prompt over max_model_len, capitals
			// and full stops included: clients match on it.
			msg := fmt.Sprintf("This model's maximum context length is %d tokens. However, your request has %d input tokens. Please reduce the length of the input messages.", s.o.MaxModelLen, tokens)
			err = errors.New(msg)
		}
		if err != nil {
			s.reject(w, r, err.Error())
			return
		}
		// The response's id prefixes this with cmpl- (chatcmpl-), as vLLM
		// prefixes the X-Request-Id; a generated one is bare hex (it read
		// cmpl-cmpl-<hex>).
		id := cmp.Or(r.Header.Get("X-Request-Id"), req.RequestID)
		if id == "" {
			id = fmt.Sprintf("%016x", TagKey(fmt.Sprint(time.Now().UnixNano(), r.RemoteAddr)))
		}
		rep, err := s.eng.Prefill(r.Context(), engine.PrefillRequest{ID: id, Tokens: tokens, Key: TagKey(id)})
		if err != nil {
			s.failed.Add(1)
			s.log.Warn("prefill leg failed", "request_id", id, "tokens", tokens, "err", err)
			writeError(w, http.StatusServiceUnavailable, "ServiceUnavailableError", err.Error())
			return
		}
		s.served.Add(1)
		// Stamped for bench proxy's split of a request's latency, under
		// the id that travels to the decode in kv_transfer_params.
		s.legs.add(LegStamps{RemoteRequestID: rep.RequestID, Blocks: rep.Blocks, TArrive: arrived, TReady: rep.TFinish, TSent: mono.Now()})
		s.log.Info("prefill leg", "request_id", id, "remote_request_id", rep.RequestID, "tokens", tokens, "blocks", rep.Blocks)
		writeJSON(w, http.StatusOK, s.response(chat, id, req.Model, tokens, rep.Params))
	}
}

// promptTokens counts a completions prompt: token ids exactly (a list of
// ints, or a batch of one such list), text by TextTokens.
func (s *api) promptTokens(p json.RawMessage) (int, error) {
	if len(p) == 0 {
		return 0, errors.New(`no "prompt"`)
	}
	var ids []int
	if json.Unmarshal(p, &ids) == nil {
		return checkTokens(len(ids))
	}
	var batch [][]int
	if json.Unmarshal(p, &batch) == nil {
		if len(batch) != 1 {
			return 0, fmt.Errorf("a batch of %d prompts: a prefill leg carries one", len(batch))
		}
		return checkTokens(len(batch[0]))
	}
	var text string
	if json.Unmarshal(p, &text) == nil {
		return s.textTokens(len(text))
	}
	var texts []string
	if json.Unmarshal(p, &texts) == nil {
		if len(texts) != 1 {
			return 0, fmt.Errorf("a batch of %d prompts: a prefill leg carries one", len(texts))
		}
		return s.textTokens(len(texts[0]))
	}
	return 0, errors.New(`"prompt" is neither text nor token ids`)
}

// chatMessageOverhead is what a chat template adds per message, in bytes
// (role markers and separators) on top of the contents.
const chatMessageOverhead = 32

func (s *api) chatTokens(m json.RawMessage) (int, error) {
	var msgs []struct {
		Role    string          `json:"role"`
		Content json.RawMessage `json:"content"`
	}
	if err := json.Unmarshal(m, &msgs); err != nil || len(msgs) == 0 {
		return 0, errors.New(`"messages" must be a non-empty list of {role, content}`)
	}
	n := 0
	for _, msg := range msgs {
		n += len(msg.Role) + len(msg.Content) + chatMessageOverhead
	}
	return s.textTokens(n)
}

// textSpecialTokens covers the special tokens a tokenizer adds to a text
// prompt (BOS and the like).
const textSpecialTokens = 8

// textTokens is the token count a text of n bytes is given. Without the
// model's tokenizer the stand-in cannot know it; a byte-level BPE token is
// at least one byte, so n plus the special tokens is an upper bound. More
// blocks than the decode needs are harmless: vLLM's decode reads the last
// of remote_block_ids as many as it has local blocks, and fails when it
// gets fewer.
func (s *api) textTokens(n int) (int, error) {
	if s.o.PromptTokens > 0 {
		return s.o.PromptTokens, nil
	}
	return checkTokens(n + textSpecialTokens)
}

func checkTokens(n int) (int, error) {
	if n <= 0 || n > kv.MaxTokens {
		return 0, fmt.Errorf("prompt of %d tokens: want 1 to %d", n, kv.MaxTokens)
	}
	return n, nil
}

// response is vLLM's completion answer to a prefill leg: one generated
// token (empty text here), its usage, and the kv_transfer_params the
// proxy forwards to the decode.
func (s *api) response(chat bool, id, model string, tokens int, p engine.TransferParams) any {
	model = cmp.Or(model, s.o.ServedModel)
	usage := map[string]int{"prompt_tokens": tokens, "completion_tokens": 1, "total_tokens": tokens + 1}
	created := time.Now().Unix()
	if chat {
		return map[string]any{"id": "chatcmpl-" + id, "object": "chat.completion", "created": created, "model": model,
			"choices": []any{map[string]any{"index": 0, "message": map[string]any{"role": "assistant", "content": ""},
				"finish_reason": "length"}},
			"usage": usage, "kv_transfer_params": p}
	}
	return map[string]any{"id": "cmpl-" + id, "object": "text_completion", "created": created, "model": model,
		"choices": []any{map[string]any{"index": 0, "text": "", "logprobs": nil, "finish_reason": "length"}},
		"usage":   usage, "kv_transfer_params": p}
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	e := json.NewEncoder(w)
	e.SetEscapeHTML(false)
	_ = e.Encode(v)
}

// writeError answers in vLLM's error form.
func writeError(w http.ResponseWriter, code int, typ, msg string) {
	writeJSON(w, code, map[string]any{"object": "error", "message": msg, "type": typ, "param": nil, "code": code})
}

// ErrNotPull is returned for an engine the stand-in cannot front.
var ErrNotPull = errors.New("the stand-in prefill speaks vLLM's pull protocol only: push needs the router to tell the decode about the prefill first, and SGLang has its own bootstrap server")

// CheckConfig says whether cfg can run behind the API.
func CheckConfig(cfg engine.Config) error {
	if cfg.Role != engine.RolePrefill {
		return errors.New("a stand-in is a prefill")
	}
	if cfg.Protocol != engine.ProtoPull {
		return ErrNotPull
	}
	if strings.TrimSpace(cfg.SideChannel) == "" {
		return errors.New("a stand-in needs a side channel address")
	}
	return nil
}
