package main

import (
	"context"
	"fmt"
	"time"

	"github.com/spf13/cobra"

	"github.com/nixlctl/nixlctl/internal/engine"
	"github.com/nixlctl/nixlctl/internal/errkind"
	"github.com/nixlctl/nixlctl/internal/kv"
	"github.com/nixlctl/nixlctl/internal/standin"
)

// standinDecodeFlags are the flags only the stand-in decode reads (the
// first, --http, starts it).
var standinDecodeFlags = []string{"http", "engine-id", "served-model-name", "prompt-tokens", "tp", "num-blocks",
	"backend", "mem", "device", "model", "model-config", "kv-dtype", "block-size", "layout", "kv-cache-layout"}

const standinDecodeHelp = `
Without a driver (--http HOST:PORT), "serve decode" stands in for a vLLM decode
engine behind a disaggregated proxy: it serves the slice of vLLM's OpenAI API a
proxy calls on the decode, POST /v1/completions and /v1/chat/completions carrying
the prefill's "kv_transfer_params" ({"do_remote_prefill": true,
"remote_engine_id", "remote_block_ids", "remote_host", "remote_port", "tp_size",
...}) as the proxy forwards them. Each request handshakes with the prefill's side
channel (once per engine), READs the blocks over NIXL/UCX into a KV cache laid
out like the model's (--model, --tp, --block-size, --kv-dtype,
--kv-cache-layout), checks their tags and sends the completion
notification that frees them, then answers as vLLM does (JSON, or server-sent
events for "stream": true). GET /health, GET /v1/models and GET /nixlctl/stats
(requests, blocks read, corrupt, the engine's handshakes) as the stand-in
prefill has; GET /nixlctl/legs lists the last legs' stamps for bench proxy.

Bad kv_transfer_params (a missing field, an engine whose side channel does not
answer as that engine) get a 400 naming what is wrong; a failed READ or a block
with wrong bytes a 500. The tags are checked with the key the stand-in prefill
writes (its remote_request_id less the suffix): the KV of a real vLLM prefill
fails the check. No model runs: the text is empty and one token is reported.`

func addStandinDecodeFlags(cmd *cobra.Command) {
	cmd.Flags().String("http", "", "run without a driver: stand in for a decode engine, serving the OpenAI-style API on [HOST]:PORT (see above)")
	addStandinEngineFlags(cmd, "--http", "decode",
		"the engine id (default: decode-<random>)",
		"count every text prompt as this many tokens when kv_transfer_params carry no remote_num_tokens",
		"transfer backend (nixl or ucx, as the prefill's)")
}

// standinDecodeConfig checks the stand-in decode's flags and builds its
// engine's configuration, before anything is allocated.
func standinDecodeConfig(so serveEngineOptions) (engine.Config, kv.Spec, error) {
	if err := so.checkHTTPSide(); err != nil {
		return engine.Config{}, kv.Spec{}, err
	}
	// The stand-in prefill tags what sparse checks read (Verify Sparse
	// there too): a full check would find untagged bytes.
	cfg, spec, err := so.standinEngineConfig(engine.RoleDecode, engine.Knobs{Verify: engine.Sparse, DRAMAlloc: engine.AllocMmap}, nil)
	if err != nil {
		return cfg, spec, err
	}
	if err := standin.CheckDecodeConfig(cfg); err != nil {
		return cfg, spec, errkind.BadInput(err)
	}
	return cfg, spec, nil
}

// runStandinDecode serves until interrupted.
func runStandinDecode(ctx context.Context, a *app, so serveEngineOptions) error {
	o := so.standinOptions
	cfg, spec, err := standinDecodeConfig(so)
	if err != nil {
		return err
	}
	ln, eng, _, err := startStandin(ctx, a, cfg, spec, o.HTTP, nil)
	if err != nil {
		return err
	}
	defer ln.Close()
	defer eng.Close()
	fmt.Fprintf(a.io.ErrOut, "API http://%s/v1/completions\n", ln.Addr())
	api := standin.NewDecode(eng, o.apiOptions(spec), a.log)
	start := time.Now()
	err = api.Serve(ctx, ln)
	c, st := api.Counts(), eng.Stats()
	fmt.Fprintf(a.io.ErrOut, "stand-in decode stopped after %v: %d requests, %d served, %d refused, %d failed; %d blocks read, %d corrupt; %d handshakes, %d failed\n",
		time.Since(start).Round(time.Second), c.Requests, c.Served, c.Rejected, c.Failed, c.BlocksRead, c.CorruptBlocks, st.Handshakes, st.HandshakeFails)
	return standinExit(ctx, err)
}
