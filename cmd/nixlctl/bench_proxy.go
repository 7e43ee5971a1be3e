package main

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/nixlctl/nixlctl/internal/errkind"
	"github.com/nixlctl/nixlctl/internal/kv"
	"github.com/nixlctl/nixlctl/internal/proxybench"
	"github.com/nixlctl/nixlctl/internal/report"
)

// benchProxyOptions is proxybench.Options, which the flags decode into,
// plus the table's per-request rows and the headers as typed.
type benchProxyOptions struct {
	proxybench.Options `mapstructure:",squash"`
	PerRequest         bool     `mapstructure:"per-request"`
	Header             []string `mapstructure:"header"`
}

const benchProxyLong = `Test a disaggregated-serving proxy or router without GPUs: send --requests
completion requests through its OpenAI API (--proxy URL, POST /v1/completions,
--concurrency at a time, prompts of --isl token ids) while nixlctl's stand-ins
play the engines behind it:

  nixlctl serve prefill --side-channel 127.0.0.1:5600 --http 127.0.0.1:8100 ...
  nixlctl serve decode --http 127.0.0.1:8200 ...
  (your proxy, told that the prefill is :8100 and the decode :8200)
  nixlctl bench proxy --proxy http://127.0.0.1:8000 \
    --prefill http://127.0.0.1:8100 --decode http://127.0.0.1:8200

The stand-ins move real KV blocks: the prefill fills and holds them, the decode
handshakes with the prefill named in the kv_transfer_params the proxy forwarded,
READs them over NIXL/UCX, checks every block's tags and sends the notification
that frees them. Reported: each request's latency as this client sees it and,
from the stand-ins' stamps (GET /nixlctl/legs, moved onto this host's clock by
the offset of the quickest of five /nixlctl/stats round trips), its split into
the prefill leg (sent here to the prefill's answer), the KV handoff (the
prefill's answer to the decode's blocks read and checked: the proxy's relay,
the decode's handshake and READ) and the decode leg (to the answer here).

The run fails (exit 1) unless every request came back 200, the decode
stand-ins served as many legs, read and checked as many blocks as the prefill
legs held, found none corrupt, refused and failed none, and the prefills hold
no more blocks after the run (--settle) than before. Without --prefill and
--decode only the end-to-end latency is reported and nothing is checked.`

func newBenchProxyCmd(a *app) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "proxy",
		Short: "Drive a disaggregated proxy/router with requests while nixlctl's stand-ins play prefill and decode",
		Long:  benchProxyLong,
		Example: `  nixlctl bench proxy --proxy http://127.0.0.1:8000 --prefill http://127.0.0.1:8100 --decode http://127.0.0.1:8200
  nixlctl bench proxy --proxy http://router:8000 --requests 1000 --concurrency 32 --isl 4096 -o json`,
		Args: cobra.NoArgs,
		RunE: bound(a.runBenchProxy),
	}
	f := cmd.Flags()
	f.String("proxy", "", "the proxy's base URL (required), e.g. http://127.0.0.1:8000")
	f.String("path", "/v1/completions", "the proxy's completions path")
	f.Int("requests", 100, "requests to send")
	f.Int("concurrency", 8, "requests in flight at a time")
	f.Int("isl", 1024, "prompt length in tokens (token ids)")
	f.Int("max-tokens", 16, "max_tokens of each request")
	f.String("model", kv.DefaultModel, "the model name the requests carry")
	f.Duration("timeout", 60*time.Second, "a request's time limit")
	f.StringSlice("prefill", nil, "stand-in prefills' API URLs (their --http), to check and split with")
	f.StringSlice("decode", nil, "stand-in decodes' API URLs (their --http), to check and split with")
	f.Duration("settle", 5*time.Second, "after the run, how long to wait for the prefills to free the blocks read")
	f.Uint64("seed", 1, "prompt token seed")
	f.Bool("per-request", false, "list every request in the table")
	f.StringArray("header", nil, "NAME:VALUE header on every request, repeatable (llm-d's routing sidecar: x-prefiller-host-port:HOST:PORT)")
	return cmd
}

func (a *app) runBenchProxy(ctx context.Context, o benchProxyOptions) error {
	if o.Proxy == "" {
		return errkind.BadInputf("--proxy URL is required (the proxy's base URL, e.g. http://127.0.0.1:8000)")
	}
	po := o.Options
	po.Version = version
	for _, h := range o.Header {
		k, v, ok := strings.Cut(h, ":")
		if !ok || strings.TrimSpace(k) == "" {
			return errkind.BadInputf("--header %q: want NAME:VALUE", h)
		}
		if po.Headers == nil {
			po.Headers = map[string]string{}
		}
		po.Headers[strings.TrimSpace(k)] = strings.TrimSpace(v)
	}
	if err := po.Validate(); err != nil {
		return errkind.BadInput(err)
	}
	// Refused before the run, not after it (render would refuse it then).
	if a.format != report.FormatJSON && a.format != report.FormatTable {
		return errkind.BadInputf("-o %s: bench proxy writes json or table", a.format)
	}
	res, err := proxybench.Run(ctx, po)
	if err != nil {
		return fmt.Errorf("bench proxy: %w", err)
	}
	res.PerRequest = o.PerRequest
	if err := a.render(res); err != nil {
		return err
	}
	if n := len(res.Summary.Problems); n > 0 {
		return errkind.CheckFailedf("bench proxy: %d checks failed: %s", n, res.Summary.Problems[0])
	}
	return nil
}
