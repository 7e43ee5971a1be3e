package handoff

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"sync"
	"time"

	"github.com/nixlctl/nixlctl/internal/ctl"
	"github.com/nixlctl/nixlctl/internal/engine"
	"github.com/nixlctl/nixlctl/internal/mono"
)

// An external SGLang prefill (bench sglang --bootstrap URL): a real
// SGLang prefill server, reached at its bootstrap server and its HTTP API,
// stands where nixlctl's prefill endpoint would. The driver talks to it
// through an in-process endpoint that answers "setup" from the bootstrap
// server's PrefillServerInfo and sends each prefill leg to the HTTP API
// as SGLang's router does: POST /generate with the prompt's token ids and
// bootstrap_host, bootstrap_port and bootstrap_room. nixlctl's decode
// pre-allocates, sends its TransferInfos and receives what the prefill
// WRITEs; the bytes are the model's, not nixlctl's tags, so they are not
// verified (LoadRequest.Foreign).

// ParseBootstrapURL checks --bootstrap: http://HOST:PORT of an SGLang
// bootstrap server (disaggregation_bootstrap_port), nothing else.
func ParseBootstrapURL(s string) (hostPort string, err error) {
	u, err := url.Parse(s)
	switch {
	case err != nil:
		return "", fmt.Errorf("%q: want http://HOST:PORT (%v)", s, err)
	case u.Scheme != "http":
		return "", fmt.Errorf("%q: want http://HOST:PORT (SGLang's bootstrap server speaks plain HTTP)", s)
	case u.User != nil || u.RawQuery != "" || u.Fragment != "" || (u.Path != "" && u.Path != "/"):
		return "", fmt.Errorf("%q: want http://HOST:PORT, without a path, query or user", s)
	case u.Hostname() == "" || u.Port() == "":
		return "", fmt.Errorf("%q: want http://HOST:PORT (SGLang's default bootstrap port is 8998)", s)
	}
	if p, err := strconv.Atoi(u.Port()); err != nil || p < 1 || p > 65535 {
		return "", fmt.Errorf("%q: port %s out of range", s, u.Port())
	}
	return u.Host, nil
}

// sglExternalInfo is the part of PrefillServerInfo the driver needs.
type sglExternalInfo struct {
	AttnTPSize      int     `json:"attn_tp_size"`
	DPSize          int     `json:"dp_size"`
	PPSize          int     `json:"pp_size"`
	PageSize        *int    `json:"page_size"`
	KVCacheDType    *string `json:"kv_cache_dtype"`
	PrefillHTTPPort *int    `json:"prefill_http_port"`
}

// sglExternalTimeout bounds a bootstrap query; a prefill leg gets the
// bootstrap timeout, SGLang's own bound on a room's wait.
const sglExternalTimeout = 5 * time.Second

// sglExternalPrefillRole is the in-process endpoint in front of an
// external SGLang prefill at bootstrap (HOST:PORT).
func sglExternalPrefillRole(bootstrap string, legTimeout time.Duration, log *slog.Logger) ctl.Role {
	return func(srv *ctl.Server) func() {
		client := &http.Client{}
		var mu sync.Mutex
		var api string // the prefill's HTTP API, from setup
		srv.Handle("setup", func(ctx context.Context, _ json.RawMessage) (any, error) {
			info, err := fetchSGLExternalInfo(ctx, client, bootstrap)
			if err != nil {
				return nil, err
			}
			host, _, _ := net.SplitHostPort(bootstrap)
			a := "http://" + net.JoinHostPort(host, strconv.Itoa(*info.PrefillHTTPPort))
			mu.Lock()
			api = a
			mu.Unlock()
			log.Info("external SGLang prefill", "bootstrap", bootstrap, "api", a, "attn_tp_size", info.AttnTPSize)
			return engine.SetupReply{EngineID: "sglang-external", Bootstrap: bootstrap, TP: info.AttnTPSize, PP: info.PPSize,
				Backend: "sglang", Info: map[string]string{"api": a}}, nil
		})
		srv.Handle("prefill", func(ctx context.Context, params json.RawMessage) (any, error) {
			var r engine.PrefillRequest
			if err := json.Unmarshal(params, &r); err != nil {
				return nil, fmt.Errorf("prefill: %w", err)
			}
			mu.Lock()
			a := api
			mu.Unlock()
			if a == "" {
				return nil, errors.New("setup first")
			}
			rep := engine.PrefillReply{RequestID: r.ID, TStart: mono.Now()}
			if err := sendSGLPrefillLeg(ctx, client, a, bootstrap, r, legTimeout); err != nil {
				return nil, err
			}
			rep.TFinish = mono.Now()
			return rep, nil
		})
		srv.Handle("stats", func(context.Context, json.RawMessage) (any, error) { return engine.Stats{}, nil })
		srv.Handle("info", func(context.Context, json.RawMessage) (any, error) {
			return map[string]string{"prefill": "external SGLang at " + bootstrap}, nil
		})
		srv.Handle("abort", func(context.Context, json.RawMessage) (any, error) { return engine.AbortReply{}, nil })
		return nil
	}
}

// fetchSGLExternalInfo asks the bootstrap server for PrefillServerInfo
// (GET /route with every parameter -1, as SGLang's decode does) and checks
// what the driver needs of it.
func fetchSGLExternalInfo(ctx context.Context, client *http.Client, bootstrap string) (sglExternalInfo, error) {
	var info sglExternalInfo
	ctx, cancel := context.WithTimeout(ctx, sglExternalTimeout)
	defer cancel()
	u := "http://" + bootstrap + "/route?prefill_dp_rank=-1&prefill_cp_rank=-1&target_tp_rank=-1&target_pp_rank=-1"
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	resp, err := client.Do(req)
	if err != nil {
		return info, fmt.Errorf("--bootstrap %s: %w", bootstrap, err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<16))
	if resp.StatusCode != http.StatusOK {
		return info, fmt.Errorf("--bootstrap %s: GET /route answered %s: %s", bootstrap, resp.Status, bytes.TrimSpace(body))
	}
	if err := json.Unmarshal(body, &info); err != nil {
		return info, fmt.Errorf("--bootstrap %s: PrefillServerInfo: %v", bootstrap, err)
	}
	switch {
	case info.AttnTPSize < 1 || info.PPSize < 1:
		return info, fmt.Errorf("--bootstrap %s: PrefillServerInfo has attn_tp_size %d, pp_size %d", bootstrap, info.AttnTPSize, info.PPSize)
	case info.DPSize > 1:
		return info, fmt.Errorf("--bootstrap %s: the prefill runs %d DP ranks; bench sglang sends every room to DP rank 0's ranks, so it needs dp_size 1", bootstrap, info.DPSize)
	case info.PrefillHTTPPort == nil || *info.PrefillHTTPPort < 1 || *info.PrefillHTTPPort > 65535:
		return info, fmt.Errorf("--bootstrap %s: the prefill registered no prefill_http_port, so its HTTP API is unknown (SGLang versions that do not register it are not supported)", bootstrap)
	}
	return info, nil
}

// sendSGLPrefillLeg is the router's prefill leg: SGLang's /generate with
// the room, max_new_tokens 1. Token ids are arbitrary: the KV is the
// prefill model's, and only its transfer is measured.
func sendSGLPrefillLeg(ctx context.Context, client *http.Client, api, bootstrap string, r engine.PrefillRequest, timeout time.Duration) error {
	host, port, _ := net.SplitHostPort(bootstrap)
	bport, _ := strconv.Atoi(port)
	ids := make([]int, r.Tokens)
	for i := range ids {
		ids[i] = 1 + int((r.Key+uint64(i))%1000)
	}
	body, _ := json.Marshal(map[string]any{"input_ids": ids, "sampling_params": map[string]any{"max_new_tokens": 1, "temperature": 0},
		"bootstrap_host": host, "bootstrap_port": bport, "bootstrap_room": r.Room, "rid": r.ID})
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, api+"/generate", bytes.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	resp, err := client.Do(req)
	if err != nil {
		return fmt.Errorf("SGLang prefill %s: %w", api, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		msg, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		return fmt.Errorf("SGLang prefill %s/generate: %s: %s", api, resp.Status, bytes.TrimSpace(msg))
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<20))
	return nil
}
