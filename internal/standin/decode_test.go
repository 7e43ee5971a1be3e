package standin

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/nixlctl/nixlctl/internal/engine"
)

// standInDecode starts a real decode engine (UCX) behind the decode API.
// Its checks are Full, as standIn's prefill fills: tags written for one
// depth fail the other's check (the CLI's stand-ins are both Sparse).
func standInDecode(t *testing.T) (*DecodeServer, string) {
	t.Helper()
	cfg := engine.Config{Role: engine.RoleDecode, Backend: "ucx", Protocol: engine.ProtoPull, Model: testModel(),
		BlockSize: 16, NumBlocks: 64, EngineID: "standin-decode", Knobs: engine.Knobs{DRAMAlloc: "mmap", Verify: engine.Full}}
	s, _, base := serveOnLoopback(t, cfg, CheckDecodeConfig, func(eng *engine.Engine) *DecodeServer {
		return NewDecode(eng, Options{ServedModel: "llama-3.1-8b"}, nil)
	})
	return s, base
}

// TestStandInPair: a prefill leg on the prefill stand-in, its
// kv_transfer_params forwarded to the decode stand-in, which reads and
// checks the blocks and frees them; the same params with another request
// id read the same blocks under another tag key: wrong bytes, a 500,
// counted as corrupt.
func TestStandInPair(t *testing.T) {
	_, pre, pbase := standIn(t, "ucx", Options{})
	d, dbase := standInDecode(t)
	leg := func(id string) json.RawMessage {
		code, m := post(t, pbase+"/v1/completions", id, `{"prompt":[`+strings.Repeat("7,", 39)+`7],"kv_transfer_params":{"do_remote_decode":true}}`)
		if code != http.StatusOK {
			t.Fatalf("prefill leg: %d %s", code, m["message"])
		}
		return m["kv_transfer_params"]
	}
	kvp := leg("pair-1")
	code, m := post(t, dbase+"/v1/completions", "other-id", `{"prompt":[1],"kv_transfer_params":`+string(kvp)+`}`)
	if code != http.StatusOK {
		t.Fatalf("decode leg: %d %s", code, m["message"])
	}
	var st LegStamps
	if err := json.Unmarshal(m["nixlctl"], &st); err != nil || st.Blocks != 3 || st.TReady < st.TArrive || st.TSent < st.TReady {
		t.Errorf("stamps %+v, %v", st, err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for pre.Stats().BlocksInUse != 0 {
		if time.Now().After(deadline) {
			t.Fatalf("prefill holds %d blocks after the decode's notification", pre.Stats().BlocksInUse)
		}
		time.Sleep(10 * time.Millisecond)
	}

	kvp = leg("pair-2")
	var p map[string]any
	_ = json.Unmarshal(kvp, &p)
	p["remote_request_id"] = "someone-else-" + strings.Repeat("0", 8)
	bad, _ := json.Marshal(p)
	code, m = post(t, dbase+"/v1/completions", "", `{"prompt":[1],"kv_transfer_params":`+string(bad)+`}`)
	var msg string
	_ = json.Unmarshal(m["message"], &msg)
	if code != http.StatusInternalServerError || !strings.Contains(msg, "wrong bytes") {
		t.Errorf("mis-keyed read: %d %q, want 500 and wrong bytes", code, msg)
	}
	c := d.Counts()
	if c.Requests != 2 || c.Served != 1 || c.Failed != 1 || c.CorruptRequests != 1 || c.CorruptBlocks == 0 || c.BlocksRead != 6 {
		t.Errorf("counts %+v", c)
	}
	if legs := d.Legs(); len(legs) != 2 || legs[0].RemoteRequestID == "" {
		t.Errorf("legs %+v", legs)
	}
}

func TestTagID(t *testing.T) {
	for in, want := range map[string]string{
		"req-1-2e631bf4": "req-1",
		"a6099c72-f598-470a-bf24-cf00d7c150b4-f817c3d1": "a6099c72-f598-470a-bf24-cf00d7c150b4",
		"plain":       "plain",
		"x-notahex12": "x-notahex12",
	} {
		if got := tagID(in); got != want {
			t.Errorf("tagID(%q) = %q, want %q", in, got, want)
		}
	}
}
