package engine

import (
	"encoding/json"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// kv_transfer_params as vLLM's pull scheduler returns them (Python's json
// with the keys request_finished sets, in its order after sorting here):
// remote_block_ids is one list per KV-cache group, dcp_size and
// remote_blocks_expiry_time are present, the latter null.
func TestTransferParamsWireForm(t *testing.T) {
	p := TransferParams{DoRemotePrefill: true, RemoteBlockIDs: []int{4, 5, 6}, RemoteEngineID: "prefill-0",
		RemoteRequestID: "cmpl-1-0-1a2b3c4d", RemoteHost: "10.0.0.1", RemotePort: 5600, TPSize: 2, PPSize: 1,
		RemoteNumTokens: 40, TransferMode: "pull"}
	b, err := json.Marshal(p)
	if err != nil {
		t.Fatal(err)
	}
	var got map[string]any
	if err := json.Unmarshal(b, &got); err != nil {
		t.Fatal(err)
	}
	want := map[string]any{"do_remote_prefill": true, "do_remote_decode": false, "remote_block_ids": []any{[]any{4.0, 5.0, 6.0}},
		"remote_engine_id": "prefill-0", "remote_request_id": "cmpl-1-0-1a2b3c4d", "remote_host": "10.0.0.1", "remote_port": 5600.0,
		"tp_size": 2.0, "dcp_size": 1.0, "pp_size": 1.0, "remote_num_tokens": 40.0, "remote_blocks_expiry_time": nil, "transfer_mode": "pull"}
	if d := cmp.Diff(want, got); d != "" {
		t.Fatalf("wire form (-vLLM +nixlctl):\n%s", d)
	}
	var back TransferParams
	if err := json.Unmarshal(b, &back); err != nil {
		t.Fatal(err)
	}
	p.DCPSize = 1
	if d := cmp.Diff(p, back); d != "" {
		t.Errorf("round trip (-want +got):\n%s", d)
	}
}

func TestTransferParamsReadsEveryForm(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want []int
		bad  bool
	}{
		{`{"remote_block_ids": [[1, 2]]}`, []int{1, 2}, false},
		{`{"remote_block_ids": [1, 2]}`, []int{1, 2}, false}, // before KV-cache groups
		{`{"remote_block_ids": null}`, nil, false},
		{`{"remote_block_ids": []}`, nil, false}, // push: decode learns none
		{`{"remote_block_ids": [[1], [2]]}`, nil, true},
		{`{"remote_block_ids": "x"}`, nil, true},
	} {
		var p TransferParams
		err := json.Unmarshal([]byte(tc.in), &p)
		if (err != nil) != tc.bad || (!tc.bad && !cmp.Equal(tc.want, p.RemoteBlockIDs)) {
			t.Errorf("%s: got %v, %v", tc.in, p.RemoteBlockIDs, err)
		}
	}
}

// Every stamp moves onto the other clock and a stamp not taken stays 0:
// a stage the protocol lacks must not turn into a huge one.
func TestOnClockMovesEveryStamp(t *testing.T) {
	t.Parallel()
	shift := func(v int64) int64 { return v - 1000 }
	pr := PrefillReply{TStart: 5000, TFinish: 6000, TSent: 7000}
	pr.OnClock(shift)
	if pr.TStart != 4000 || pr.TFinish != 5000 || pr.TSent != 6000 || pr.TBootstrapped != 0 || pr.TPostStart != 0 {
		t.Errorf("prefill reply %+v", pr)
	}
	lr := LoadReply{TArrive: 2000, TReady: 9000, TXferDone: 8000}
	lr.OnClock(shift)
	if lr.TArrive != 1000 || lr.TReady != 8000 || lr.TXferDone != 7000 || lr.TRegSent != 0 {
		t.Errorf("load reply %+v", lr)
	}
	f := FreedEvent{TFinish: 3000, TFreed: 4000, TWriteDone: 3500}
	f.OnClock(shift)
	if f.TFinish != 2000 || f.TFreed != 3000 || f.TWriteDone != 2500 || f.TPostEnd != 0 {
		t.Errorf("freed event %+v", f)
	}
}
