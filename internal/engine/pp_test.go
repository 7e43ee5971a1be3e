package engine

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nixlctl/nixlctl/internal/kv"
	"github.com/nixlctl/nixlctl/internal/lease"
	"github.com/nixlctl/nixlctl/internal/pushmatch"
	"github.com/nixlctl/nixlctl/internal/runcore"
	"github.com/nixlctl/nixlctl/internal/sidechannel"
)

// ppModel has four layers, so two stages hold two layers each.
func ppModel() kv.Model {
	m := testModel()
	m.NumLayers = 4
	return m
}

// TestPipelineHandoff moves requests between PP 2 engines: every decode
// stage must read (pull) or receive (push) its layers' tagged bytes, and
// prefill must free each request's blocks exactly once, only after every
// decode rank of every stage reported.
func TestPipelineHandoff(t *testing.T) {
	for _, proto := range []Protocol{ProtoPull, ProtoPush} {
		for _, tps := range [][2]int{{1, 1}, {2, 2}, {2, 1}, {1, 2}} {
			t.Run(fmt.Sprintf("%s/tp%d-%d", proto, tps[0], tps[1]), func(t *testing.T) {
				p, d, rec := engines(t, proto, tps[0], tps[1], func(c *Config) { c.PP, c.Model = 2, ppModel() })
				if got := len(p.ranks); got != 2*tps[0] {
					t.Fatalf("prefill has %d ranks, want %d", got, 2*tps[0])
				}
				ctx := context.Background()
				host, port, _ := splitEndpoint(p.side.Endpoint())
				for i, tokens := range []int{100, 16, 33} {
					id, key := fmt.Sprintf("req-%d", i), uint64(500+i)
					var lr LoadReply
					if proto == ProtoPull {
						pr, err := p.pre.Prefill(ctx, PrefillRequest{ID: id, Tokens: tokens, Key: key})
						if err != nil {
							t.Fatal(err)
						}
						if pr.Params.PPSize != 2 {
							t.Fatalf("kv_transfer_params pp_size %d, want 2", pr.Params.PPSize)
						}
						lr, _ = d.dec.Load(ctx, LoadRequest{ID: id, Tokens: tokens, Key: key, Params: pr.Params})
					} else {
						coords := TransferParams{DoRemotePrefill: true, RemoteEngineID: p.cfg.EngineID, RemoteHost: host, RemotePort: port, TPSize: tps[0], PPSize: 2}
						var wg sync.WaitGroup
						wg.Add(1)
						go func() {
							defer wg.Done()
							lr, _ = d.dec.Load(ctx, LoadRequest{ID: id, Tokens: tokens, Key: key, Params: coords})
						}()
						if _, err := p.pre.Prefill(ctx, PrefillRequest{ID: id, Tokens: tokens, Key: key}); err != nil {
							t.Fatal(err)
						}
						wg.Wait()
					}
					if lr.Error != "" || lr.CorruptBlocks != 0 {
						t.Fatalf("tokens %d: %s (corrupt %d: %s)", tokens, lr.Error, lr.CorruptBlocks, lr.Corrupt)
					}
					if want := d.spec.RequestBytes(tokens); proto == ProtoPull && lr.Bytes < want {
						t.Errorf("tokens %d: read %d bytes, the request's cache is %d", tokens, lr.Bytes, want)
					}
					reason := FreedReason("consumed")
					if proto == ProtoPush {
						reason = "pushed"
					}
					ev := waitFreed(t, rec, reason)
					if pushmatch.BaseRequestID(ev.ID) != id {
						t.Errorf("freed %s, want %s", ev.ID, id)
					}
					if proto == ProtoPull && ev.Consumers != len(p.ranks)*max(1, tps[1]/tps[0]) {
						t.Errorf("freed after %d notifications, want one per prefill rank and consumer (%d ranks)", ev.Consumers, len(p.ranks))
					}
				}
				select {
				case ev := <-rec.ch:
					t.Errorf("freed again: %+v", ev)
				case <-time.After(100 * time.Millisecond):
				}
				if st := p.Stats(); st.BlocksInUse != 0 || st.UnknownNotifs != 0 || st.MalformedNotifs != 0 || st.DuplicateNotifs != 0 {
					t.Errorf("prefill after: %+v", st)
				}
				if st := d.Stats(); st.BlocksInUse != 0 || st.Handshakes != 1 {
					t.Errorf("decode after: %+v", st)
				}
			})
		}
	}
}

// TestPipelineSideChannel asks every (pp, tp) rank of a PP 2 x TP 2
// engine on one socket: four distinct agents, each with its stage's
// layers; a rank the engine lacks is refused, counted, and the listener
// keeps answering.
func TestPipelineSideChannel(t *testing.T) {
	m := ppModel()
	m.NumLayers = 5 // stages of 3 and 2 layers
	p, _, _ := engines(t, ProtoPull, 2, 1, func(c *Config) { c.PP, c.Model = 2, m })
	ep := p.side.Endpoint()
	ranks := [][2]int{{0, 0}, {0, 1}, {1, 0}, {1, 1}}
	hs, err := sidechannel.FetchRanks(context.Background(), ep, ranks, p.hash, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	agents := map[string]bool{}
	for i, h := range hs {
		pp, tp := ranks[i][0], ranks[i][1]
		agents[string(h.Meta.AgentMetadata)] = true
		x := h.Meta.Nixlctl
		if x == nil || x.PPRank != pp || x.TPRank != tp || x.PPSize != 2 || x.TPSize != 2 {
			t.Errorf("rank %v says %+v", ranks[i], x)
		}
		layers := len(p.spec.StageLayers(pp))
		if n := len(h.Meta.KVCachesBaseAddr); n != layers*2 { // K and V regions per layer
			t.Errorf("rank %v: %d regions, want %d (%d layers)", ranks[i], n, layers*2, layers)
		}
		if !strings.HasPrefix(h.Meta.RegionNames[0], fmt.Sprintf("layer%d.", p.spec.StageLayers(pp)[0])) {
			t.Errorf("rank %v: first region %s", ranks[i], h.Meta.RegionNames[0])
		}
	}
	if len(agents) != 4 {
		t.Errorf("%d distinct agents, want 4", len(agents))
	}
	before, _ := p.side.Errors()
	_, err = sidechannel.FetchRanks(context.Background(), ep, [][2]int{{0, 0}, {2, 0}}, p.hash, 300*time.Millisecond)
	if err == nil || !strings.Contains(err.Error(), "(pp 2, tp 0)") || !strings.Contains(err.Error(), "no reply within") {
		t.Errorf("unknown rank: %v (want no reply, as from vLLM's listener)", err)
	}
	if after, _ := p.side.Errors(); after != before+1 {
		t.Errorf("side channel counted %d bad requests, want %d", after, before+1)
	}
	if st := p.Stats(); st.MalformedControl != 1 || st.UnknownRankHandshakes != 1 {
		t.Errorf("engine counted %d malformed side-channel messages and %d unknown ranks, want 1 and 1", st.MalformedControl, st.UnknownRankHandshakes)
	}
	if _, err := sidechannel.FetchRanks(context.Background(), ep, [][2]int{{1, 1}}, p.hash, 5*time.Second); err != nil {
		t.Errorf("listener after an unknown rank: %v", err)
	}
}

func TestPipelineRefused(t *testing.T) {
	p, d, _ := engines(t, ProtoPull, 1, 1, func(c *Config) { c.PP, c.Model = 2, ppModel() })
	pr, err := p.pre.Prefill(context.Background(), PrefillRequest{ID: "a", Tokens: 10, Key: 1})
	if err != nil {
		t.Fatal(err)
	}
	pr.Params.PPSize = 1
	lr, _ := d.dec.Load(context.Background(), LoadRequest{ID: "a", Tokens: 10, Key: 1, Params: pr.Params})
	if !strings.Contains(lr.Error, "same pipeline stages") {
		t.Errorf("unequal pp: %q", lr.Error)
	}
	for _, c := range []Config{
		{Role: RolePrefill, Protocol: ProtoSGLang, PP: 2, Model: ppModel(), TP: 1, BlockSize: 16, NumBlocks: 4, Backend: "ucx", Knobs: Knobs{RegTimeout: runcore.Duration(time.Second)}},
		{Role: RolePrefill, Protocol: ProtoPull, PP: 5, Model: ppModel(), TP: 1, BlockSize: 16, NumBlocks: 4, Backend: "ucx"},
	} {
		if e, err := NewEngine(context.Background(), c, nil, nil); err == nil {
			e.Close()
			t.Errorf("%s pp %d accepted", c.Protocol, c.PP)
		}
	}
}

// TestPipelineHeartbeats: a heartbeat reaches every (pp, tp) agent of the
// prefill engine from every decode rank, as upstream sends one to every
// handshaken agent of an engine.
func TestPipelineHeartbeats(t *testing.T) {
	p, d, _ := engines(t, ProtoPull, 2, 1, func(c *Config) { c.PP, c.Model = 2, ppModel() })
	host, port, _ := splitEndpoint(p.side.Endpoint())
	params := TransferParams{RemoteEngineID: p.cfg.EngineID, RemoteHost: host, RemotePort: port, TPSize: 2, PPSize: 2}
	target := lease.HeartbeatTarget{EngineID: p.cfg.EngineID, Endpoint: params.SideEndpoint(), TPSize: 2, PPSize: 2}
	peer := &hbPeer{busy: true}
	d.dec.heartbeatHandshake(target, peer)
	if !peer.ready {
		t.Fatal("heartbeat handshake failed")
	}
	d.dec.sendHeartbeat(lease.HeartbeatBatch{Target: target, IDs: []string{"cmpl-x-0"}})
	want := int64(len(d.ranks) * len(p.ranks)) // 2 decode ranks x 4 prefill agents
	if got := d.Stats().HeartbeatsSent; got != want {
		t.Errorf("decode sent %d heartbeats, want %d", got, want)
	}
	waitFor(t, "every prefill agent's heartbeats", func() bool { return p.Stats().Heartbeats == want })
	if st := d.Stats(); st.Handshakes != 1 {
		t.Errorf("%d handshakes for one engine", st.Handshakes)
	}
}
