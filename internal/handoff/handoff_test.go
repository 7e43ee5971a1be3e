package handoff

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/nixlctl/nixlctl/internal/ctl"
	"github.com/nixlctl/nixlctl/internal/engine"
	"github.com/nixlctl/nixlctl/internal/kv"
	"github.com/nixlctl/nixlctl/internal/live"
	"github.com/nixlctl/nixlctl/internal/nixl"
	"github.com/nixlctl/nixlctl/internal/report"
	"github.com/nixlctl/nixlctl/internal/runcore"
	"github.com/nixlctl/nixlctl/internal/runcore/runcoretest"
	"github.com/nixlctl/nixlctl/internal/testkit"
)

// handoffOpts runs both endpoints as child processes (this test binary).
func handoffOpts(t *testing.T, proto engine.Protocol, ptp, dtp int) HandoffOptions {
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	return HandoffOptions{Protocol: engine.Protocol(proto), Backend: "ucx", Spec: kv.Spec{Model: runcoretest.SmallModel(t), BlockSize: 16, TP: ptp}, DecodeTP: dtp,
		Requests: 6, Warmup: 1, ISL: ISL{Dist: "uniform", Min: 1, Max: 400}, Concurrency: 3, Fragmentation: engine.FragContiguous, ChunkTokens: 64,
		Exe: exe, ExeArgs: []string{"-test.run=^$"}, ChildEnv: []string{runcoretest.ChildEnv + "=1"}, Seed: 3, Knobs: engine.Knobs{DRAMAlloc: engine.AllocMmap, Verify: engine.Full, Lease: runcore.Duration(20 * time.Second), RegTimeout: runcore.Duration(20 * time.Second)}}
}

// runHandoffClean runs o and fails at once unless all requests of it
// completed with no corrupt or leaked block. The records' errors are
// logged first: the summary counts the failures but does not say why.
func runHandoffClean(t *testing.T, o HandoffOptions, requests int) *HandoffResult {
	t.Helper()
	res, err := RunHandoff(context.Background(), o)
	if err != nil {
		t.Fatal(err)
	}
	if s := res.Summary; s.Requests != requests || s.Failed != 0 || s.CorruptBlocks != 0 || s.LeakedBlocks != 0 {
		for _, r := range res.Records {
			if r.Error != "" {
				t.Log(r.Error)
			}
		}
		t.Fatalf("summary %+v", s)
	}
	return res
}

// Every protocol, every TP pair, across real processes: every byte
// verified, nothing left allocated.
func TestHandoffAcrossProcesses(t *testing.T) {
	for _, proto := range []engine.Protocol{engine.ProtoPull, engine.ProtoPush, engine.ProtoSGLang} {
		for _, tps := range [][2]int{{1, 1}, {2, 1}, {1, 2}, {4, 2}} {
			t.Run(fmt.Sprintf("%s/%d-%d", proto, tps[0], tps[1]), func(t *testing.T) {
				res := runHandoffClean(t, handoffOpts(t, proto, tps[0], tps[1]), 6)
				s := res.Summary
				if s.HandoffLatencyMS.P50 <= 0 || s.Bytes <= 0 || s.BandwidthGBps <= 0 || s.FirstHandshakeMS <= 0 {
					t.Errorf("empty measurements: %+v", s)
				}
				if res.Prefill.MalformedNotifs+res.Decode.MalformedNotifs+res.Prefill.UnknownNotifs+res.Decode.UnknownNotifs != 0 {
					t.Errorf("protocol noise: prefill %+v decode %+v", res.Prefill, res.Decode)
				}
				if proto == engine.ProtoPush {
					for _, r := range res.Records {
						if r.Freed != engine.FreedPushed {
							t.Errorf("%s freed %q, want pushed", r.ID, r.Freed)
						}
					}
				}
			})
		}
	}
}

func TestHandoffOpenLoopPrefixHitScatteredRecords(t *testing.T) {
	o := handoffOpts(t, engine.ProtoPull, 1, 1)
	o.Inproc, o.Rate, o.PrefixHit, o.Fragmentation, o.Requests = true, 200, 0.25, engine.FragScattered, 12
	res, err := RunHandoff(context.Background(), o)
	if err != nil {
		t.Fatal(err)
	}
	var recs strings.Builder
	if n, err := res.WriteRecords(&recs); err != nil || n != 13 {
		t.Fatalf("WriteRecords: %d, %v", n, err)
	}
	if res.Summary.Failed != 0 || res.Summary.CorruptBlocks != 0 {
		t.Fatalf("%+v", res.Summary)
	}
	lines := strings.Split(strings.TrimSpace(recs.String()), "\n")
	if len(lines) != 1+13 || !strings.Contains(lines[0], `"schema":"nixlctl.records/v1"`) || !strings.Contains(lines[1], `"handoff_ms"`) {
		t.Fatalf("records file: %d lines, first %q", len(lines), lines[0])
	}
	for _, r := range res.Records {
		if r.PrefixTokens != int(float64(r.ISL)*0.25) {
			t.Errorf("prefix %d of %d", r.PrefixTokens, r.ISL)
		}
	}
}

func TestHandoffTrace(t *testing.T) {
	tr, err := ReadTrace(strings.NewReader("# arrival isl\n{\"arrival\": 0, \"isl\": 100}\n\n{\"arrival\": 0.01, \"isl\": 300}\n"))
	if err != nil || len(tr) != 2 {
		t.Fatalf("%v %v", tr, err)
	}
	for _, bad := range []string{"", "{\"arrival\": 1, \"isl\": 0}", "{\"arrival\": 2, \"isl\": 5}\n{\"arrival\": 1, \"isl\": 5}", "not json",
		// Past the token limit, and an arrival past MaxRunTime (1e15 s
		// wrapped as a Duration and fired at once).
		"{\"arrival\": 0, \"isl\": 67108865}", "{\"arrival\": 1e15, \"isl\": 5}", "{\"arrival\": 604801, \"isl\": 5}"} {
		if _, err := ReadTrace(strings.NewReader(bad)); err == nil {
			t.Errorf("trace %q accepted", bad)
		}
	}
	o := handoffOpts(t, engine.ProtoPush, 1, 1)
	o.Inproc, o.Trace, o.ISL, o.Rate, o.Warmup = true, tr, ISL{Dist: "trace"}, 1, 0
	res, err := RunHandoff(context.Background(), o)
	if err != nil || res.Summary.Requests != 2 || res.Summary.Failed != 0 {
		t.Fatalf("%v %+v", err, res.Summary)
	}
}

// Validate names the field at fault (the CLI turns it into the flag) and
// marks the error bad input.
func TestHandoffValidate(t *testing.T) {
	base := handoffOpts(t, engine.ProtoPull, 1, 1)
	tests := []struct {
		name string
		mut  func(*HandoffOptions)
		want []string // the fields at fault; nil: an error that names none, containing msg
		msg  string
	}{
		{"protocol", func(o *HandoffOptions) { o.Protocol = "carrier-pigeon" }, []string{"Protocol"}, ""},
		{"no requests", func(o *HandoffOptions) { o.Requests = 0 }, []string{"Requests"}, ""},
		{"closed loop without concurrency", func(o *HandoffOptions) { o.Concurrency = 0 }, []string{"Rate"}, ""},
		{"prefix hit", func(o *HandoffOptions) { o.PrefixHit = 1 }, []string{"PrefixHit"}, ""},
		{"fixed isl", func(o *HandoffOptions) { o.ISL = ISL{Dist: ISLFixed} }, []string{"ISL.Fixed"}, ""},
		{"uniform isl", func(o *HandoffOptions) { o.ISL = ISL{Dist: ISLUniform, Min: 5, Max: 1} }, []string{"ISL.Max"}, ""},
		{"normal isl", func(o *HandoffOptions) { o.ISL = ISL{Dist: ISLNormal, Min: 0, Max: 10, Std: -1} }, []string{"ISL.Min", "ISL.Mean", "ISL.Std"}, ""},
		{"trace without entries", func(o *HandoffOptions) { o.ISL.Dist = ISLTrace }, []string{"ISL.Dist"}, ""},
		{"fragmentation", func(o *HandoffOptions) { o.Fragmentation = "swiss-cheese" }, []string{"Fragmentation"}, ""},
		{"verify", func(o *HandoffOptions) { o.Verify = 7 }, []string{"Verify"}, ""},
		{"dram alloc", func(o *HandoffOptions) { o.DRAMAlloc = "malloc" }, []string{"DRAMAlloc"}, ""},
		{"registration timeout", func(o *HandoffOptions) { o.RegTimeout = 0 }, []string{"RegTimeout"}, ""},
		{"sglang timeouts", func(o *HandoffOptions) {
			o.Protocol, o.SGLBootstrapTimeout, o.SGLWaitingTimeout = engine.ProtoSGLang, runcore.Duration(-time.Second), runcore.Duration(-time.Second)
		}, []string{"SGLBootstrapTimeout", "SGLWaitingTimeout"}, ""},
		{"sglang heartbeat below upstream's floor", func(o *HandoffOptions) {
			o.Protocol, o.SGLHeartbeatInterval, o.SGLHeartbeatMaxFailures = engine.ProtoSGLang, runcore.Duration(time.Second), -1
		}, []string{"SGLHeartbeatInterval", "SGLHeartbeatMaxFailures"}, ""},
		{"two at once", func(o *HandoffOptions) { o.Requests, o.Warmup = 0, -2 }, []string{"Requests", "Warmup"}, ""},
		{"prefill address without a port", func(o *HandoffOptions) { o.Prefill = "tcp://x" }, []string{"Prefill"}, ""},
		{"inproc and one remote", func(o *HandoffOptions) { o.Decode, o.Inproc = "y:1", true }, []string{"Inproc"}, ""},
		{"xfer target port", func(o *HandoffOptions) { o.XferTarget = "x:0" }, []string{"XferTarget"}, ""},
		{"inproc and remote", func(o *HandoffOptions) { o.Prefill, o.Decode, o.Inproc = "x:1", "y:1", true }, []string{"Inproc"}, ""},
		{"decode tp the layout refuses", func(o *HandoffOptions) { o.DecodeTP = 3 }, nil, "decode: "},
		{"decode tp", func(o *HandoffOptions) { o.DecodeTP = 0 }, []string{"DecodeTP"}, ""},
		{"decode tp at maxint", func(o *HandoffOptions) { o.DecodeTP = math.MaxInt }, []string{"DecodeTP"}, "must be between 1 and 1024"},
		{"watchdog action", func(o *HandoffOptions) { o.RegWatchdog = "retry" }, []string{"RegWatchdog"}, ""},
		{"heartbeat keys", func(o *HandoffOptions) { o.PushHeartbeatKeys = "router" }, []string{"PushHeartbeatKeys"}, ""},
		{"tp vLLM refuses", func(o *HandoffOptions) { o.Spec.Model.NumKVHeads, o.Spec.TP, o.DecodeTP = 2, 4, 2 },
			[]string{"DecodeTP"}, "--prefill-tp 4 > --decode-tp 2 with the 2 KV heads"},
		{"pp with sglang", func(o *HandoffOptions) { o.Protocol, o.Spec.PP = engine.ProtoSGLang, 2 }, []string{"PP"}, "no pipeline stages"},
		{"pp above the layers", func(o *HandoffOptions) { o.Spec.PP = o.Spec.Model.NumLayers + 1 }, nil, "prefill: "},
		// Bounds (issue 29): counts and times past limits.go's.
		{"requests at maxint", func(o *HandoffOptions) { o.Requests = math.MaxInt }, []string{"Requests"}, "at most 1000000"},
		{"warm-up at maxint", func(o *HandoffOptions) { o.Warmup = math.MaxInt }, []string{"Warmup"}, "at most 1000000"},
		{"warm-up eats the trace", func(o *HandoffOptions) {
			o.Trace, o.Warmup = []TraceEntry{{0, 64}, {1, 64}}, 2
		}, []string{"Warmup"}, "the trace has 2 requests, so none would be measured"},
		{"concurrency", func(o *HandoffOptions) { o.Concurrency = 1e9 }, []string{"Concurrency"}, "at most 4096"},
		{"isl above the token limit", func(o *HandoffOptions) { o.ISL = ISL{Dist: ISLFixed, Fixed: kv.MaxTokens + 1} }, []string{"ISL.Fixed"}, "between 1 and 67108864"},
		{"isl-max above the token limit", func(o *HandoffOptions) { o.ISL = ISL{Dist: ISLUniform, Min: 1, Max: kv.MaxTokens + 1} }, []string{"ISL.Max"}, ""},
		{"rate so slow the arrivals wrap", func(o *HandoffOptions) { o.Rate, o.Concurrency = 1e-30, 0 }, []string{"Rate"}, "at most 168h"},
		{"prefill an hour a token", func(o *HandoffOptions) { o.PrefillPerToken = runcore.Duration(time.Hour) }, []string{"PrefillPerToken"}, "at most 10m0s a request"},
		{"prefills past any host", func(o *HandoffOptions) { o.Prefills = 100000 }, []string{"Prefills"}, "at most 1024"},
		{"local engines past the host", func(o *HandoffOptions) { o.Decodes = 40 }, []string{"Decodes"}, "40 with --prefills 1: 41 engines would run on this host; at most 32"},
		{"tp vLLM refuses in a topology", func(o *HandoffOptions) {
			o.Spec.Model.NumKVHeads, o.Topology = 2, writeTopology(t, `{"prefill": [{"addr": "local", "tp": 4}], "decode": [{"addr": "local", "tp": 1}]}`)
		}, []string{"Topology"}, kv.VLLMTPRefusal},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			o := base
			tc.mut(&o)
			testkit.WantBadInput(t, o.Validate(), tc.want, tc.msg)
		})
	}
	if err := base.Validate(); err != nil {
		t.Errorf("the base options: %v", err)
	}
	d := DefaultHandoffOptions()
	d.Protocol, d.Spec = engine.ProtoPush, base.Spec
	if err := d.Validate(); err != nil {
		t.Errorf("the defaults: %v", err)
	}
}

func writeTopology(t *testing.T, body string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "topology.json")
	if err := os.WriteFile(path, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

// Where a run does not behave as upstream vLLM would, its result says so
// (config and a warning); where it does, it says nothing.
// Pools the host cannot hold are refused before anything starts, with
// the numbers; the room is given, so the test does not depend on the host.
func TestHandoffPoolMemory(t *testing.T) {
	base := handoffOpts(t, engine.ProtoPull, 1, 1)
	block := base.Spec.BlockBytesAllRanks(1) * 2 // a block on both local engines
	tests := []struct {
		name string
		mut  func(*HandoffOptions)
		room runcore.MemRoom
		want string // "": fits
	}{
		{"fits", func(o *HandoffOptions) { o.NumBlocks = 100 }, runcore.MemRoom(block * 100), ""},
		{"num-blocks past the room", func(o *HandoffOptions) { o.NumBlocks = 101 }, runcore.MemRoom(block * 100), "NumBlocks: 101 blocks per engine do not fit"},
		{"num-blocks past int64 bytes", func(o *HandoffOptions) { o.NumBlocks = 1 << 60 }, runcore.MemRoom(block * 100), "NumBlocks: 1152921504606846976 blocks"},
		{"vram pools are not the host's", func(o *HandoffOptions) { o.NumBlocks, o.Mem = 1<<40, nixl.VRAM }, runcore.MemRoom(block), ""},
		{"remote engines are not the host's", func(o *HandoffOptions) {
			o.NumBlocks, o.Prefill, o.Decode = 1<<40, "10.0.0.1:7400", "10.0.0.2:7400"
		}, runcore.MemRoom(block), ""},
		{"one request fits in half", func(o *HandoffOptions) { o.ISL = ISL{Dist: ISLFixed, Fixed: 400} }, runcore.MemRoom(block * 50), ""},
		// The run cuts automatic pools to half of the room: a request
		// that fits only in the whole would fail every time.
		{"one request does not fit in half", func(o *HandoffOptions) { o.ISL = ISL{Dist: ISLFixed, Fixed: 400} }, runcore.MemRoom(block * 49),
			"ISL.Fixed: one request of 400 tokens does not fit on this host: 25 x"},
		{"the longest of a distribution", func(o *HandoffOptions) {}, runcore.MemRoom(block * 24), "ISL.Max: one request of 400 tokens"},
		{"a trace's longest", func(o *HandoffOptions) { o.Trace = []TraceEntry{{0, 16}, {1, 400}} }, runcore.MemRoom(block * 24), "--trace: its longest prompt"},
		{"unknown room", func(o *HandoffOptions) { o.NumBlocks = 1 << 60 }, 0, ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			o := base
			tc.mut(&o)
			_ = o.Validate() // settles the engines; its own check uses this host's room
			err := o.checkPoolMemory(tc.room)
			switch {
			case tc.want == "" && err != nil:
				t.Errorf("checkPoolMemory = %v, want nil", err)
			case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
				t.Errorf("checkPoolMemory = %v, want %q", err, tc.want)
			}
		})
	}
}

func TestHandoffNotUpstream(t *testing.T) {
	for _, tc := range []struct {
		name     string
		proto    engine.Protocol
		mut      func(*HandoffOptions)
		warnings []string // substrings, one per warning
		keys     engine.HeartbeatKeys
		watchdog engine.WatchdogAction
		tp       bool
	}{
		{"pull", engine.ProtoPull, nil, nil, "", "", false},
		{"push as upstream", engine.ProtoPush, func(o *HandoffOptions) {
			o.RegTimeout, o.RegWatchdog = runcore.Duration(480*time.Second), engine.WatchdogDrop
		},
			nil, engine.HBKeysUpstream, engine.WatchdogDrop, false},
		{"push bench defaults", engine.ProtoPush, nil, []string{"registration watchdog: fail after 20s, not upstream behaviour"},
			engine.HBKeysUpstream, engine.WatchdogFail, false},
		{"push fixed keys", engine.ProtoPush, func(o *HandoffOptions) {
			o.RegTimeout, o.RegWatchdog, o.PushHeartbeatKeys = runcore.Duration(480*time.Second), engine.WatchdogDrop, engine.HBKeysFixed
		}, []string{"--push-heartbeat-keys fixed: not upstream behaviour"}, engine.HBKeysFixed, engine.WatchdogDrop, false},
		{"allowed tp", engine.ProtoPull, func(o *HandoffOptions) {
			o.Spec.Model.NumKVHeads, o.Spec.TP, o.DecodeTP, o.AllowUnsupportedTP = 1, 2, 1, true
		}, []string{"--allow-unsupported-tp: --prefill-tp 2 > --decode-tp 1 with the 1 KV heads"}, "", "", true},
		{"sglang tp", engine.ProtoSGLang, func(o *HandoffOptions) { o.Spec.Model.NumKVHeads, o.Spec.TP, o.DecodeTP = 1, 2, 1 }, nil, "", "", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := handoffOpts(t, tc.proto, 1, 1)
			if tc.mut != nil {
				tc.mut(&o)
			}
			if err := o.Validate(); err != nil {
				t.Fatal(err)
			}
			got := o.notUpstream()
			if len(got) != len(tc.warnings) {
				t.Fatalf("warnings %q, want %d", got, len(tc.warnings))
			}
			for i, w := range tc.warnings {
				if !strings.Contains(got[i], w) {
					t.Errorf("warning %q lacks %q", got[i], w)
				}
			}
			c := o.config(64)
			if c.PushHeartbeatKeys != tc.keys || c.RegWatchdog != tc.watchdog || (len(c.UnsupportedTP) > 0) != tc.tp {
				t.Errorf("config: keys %q watchdog %q unsupported tp %q", c.PushHeartbeatKeys, c.RegWatchdog, c.UnsupportedTP)
			}
			if tc.tp && !strings.Contains(c.UnsupportedTP[0], kv.VLLMTPRefusal) {
				t.Errorf("unsupported tp %q lacks vLLM's reason", c.UnsupportedTP)
			}
			ec := o.EngineConfig(engine.RoleDecode, "ucx", 64)
			if ec.PushHeartbeatKeys != o.PushHeartbeatKeys || ec.RegWatchdog != o.RegWatchdog {
				t.Errorf("engine config: keys %q watchdog %q", ec.PushHeartbeatKeys, ec.RegWatchdog)
			}
		})
	}
}

// Both endpoints get their configuration from one translation.
func TestHandoffEngineConfig(t *testing.T) {
	o := handoffOpts(t, engine.ProtoPush, 2, 1)
	o.Fragmentation, o.NoMerge, o.Device, o.DecodeDevice, o.NetDevices = engine.FragScattered, true, 1, 2, "eth1"
	p, d := o.EngineConfig(engine.RolePrefill, "ucx", 99), o.EngineConfig(engine.RoleDecode, "ucx", 99)
	if p.Role != engine.RolePrefill || p.TP != 2 || p.Device != 1 || p.Seed != o.Seed || p.EngineID != "prefill-0" {
		t.Errorf("prefill: %+v", p)
	}
	if d.Role != engine.RoleDecode || d.TP != 1 || d.Device != 2 || d.Seed != o.Seed+1 || d.EngineID != "decode-0" {
		t.Errorf("decode: %+v", d)
	}
	// Everything else is the same on both sides.
	p.Role, p.TP, p.Device, p.Seed, p.EngineID = d.Role, d.TP, d.Device, d.Seed, d.EngineID
	if diff := cmp.Diff(p, d); diff != "" {
		t.Errorf("prefill and decode differ beyond their role (-prefill +decode):\n%s", diff)
	}
	if !d.Scattered || d.Merge || d.RegTimeout != o.RegTimeout || d.NumBlocks != 99 || d.Protocol != engine.ProtoPush || d.NetDevices != "eth1" {
		t.Errorf("translation: %+v", d)
	}
}

// runWithin runs a handoff whose endpoints a test kills, failing with hung
// if it has not ended within limit; its error is the kill's and not checked.
func runWithin(t *testing.T, o HandoffOptions, limit time.Duration, hung string) *HandoffResult {
	t.Helper()
	done := make(chan struct{})
	var res *HandoffResult
	go func() {
		defer close(done)
		res, _ = RunHandoff(context.Background(), o)
	}()
	select {
	case <-done:
	case <-time.After(limit):
		t.Fatal(hung)
	}
	return res
}

// A decode killed while requests are in flight: those requests fail, the
// run ends, and prefill gets every block back, through the lease or the
// cancellation of the requests it was still filling, within a bound: the
// lease and a reaper step after the kill, plus the run's own bounded
// waits (the last frees, closing the endpoints).
func TestHandoffDecodeKilledMidTransfer(t *testing.T) {
	o := handoffOpts(t, engine.ProtoPull, 1, 1)
	o.Requests, o.Warmup, o.ISL, o.Concurrency, o.Lease = 16, 0, ISL{Dist: "fixed", Fixed: 2048}, 4, runcore.Duration(300*time.Millisecond)
	o.Spec.Model.NumLayers = 32
	killed := make(chan time.Time, 1)
	o.OnStart = func(_, d *Endpoint) {
		time.AfterFunc(150*time.Millisecond, func() {
			killed <- time.Now()
			_ = d.Signal(syscall.SIGKILL)
		})
	}
	res := runWithin(t, o, 60*time.Second, "the run hung after decode died")
	if res == nil || res.Summary.Failed == 0 {
		t.Fatalf("killing decode failed no request: %+v", res)
	}
	// After the kill: the driver's wait for the last frees (at most 2 s),
	// the lease and a reaper step, closing the endpoints: 1.5 to 2.5 s
	// under -race on two busy cores. Prefill calls that kept running after
	// their cancel (a fill that ignored it), or a driver that missed
	// in_flight going to 0 and waited out its 10 s bound, took 4 to 20 s.
	select {
	case at := <-killed:
		took := time.Since(at)
		t.Logf("the run ended %v after decode was killed", took)
		if took > 8*time.Second {
			t.Errorf("the run ended %v after decode was killed", took)
		}
	default:
		t.Fatal("decode was never killed")
	}
	if res.Summary.CorruptBlocks != 0 {
		t.Errorf("corrupt blocks: %d", res.Summary.CorruptBlocks)
	}
	p := res.Prefill
	if p.InFlight != 0 || p.BlocksInUse != 0 || p.LeasesHeld != 0 || res.Summary.LeakedBlocks != 0 {
		t.Errorf("prefill after the run: %d calls in flight, %d blocks, %d leases held (leaked %d): %+v",
			p.InFlight, p.BlocksInUse, p.LeasesHeld, res.Summary.LeakedBlocks, p)
	}
	if res.EndpointDied == "" || !strings.HasPrefix(res.EndpointDied, "decode") {
		t.Errorf("the result should name the dead decode: %q", res.EndpointDied)
	}
}

// The settle wait reads prefill's in_flight afresh on every poll: stats
// leave a zero in_flight out, and a wait that decoded each answer into the
// last one kept the last non-zero count and waited out its whole bound
// after every call had returned.
func TestSettlePrefillSeesInFlightDrop(t *testing.T) {
	answers := []engine.Stats{{InFlight: 3, BlocksInUse: 8, LeasesHeld: 2}, {BlocksInUse: 8, LeasesHeld: 2}, {}}
	var calls atomic.Int32
	role := func(s *ctl.Server) func() {
		s.Handle("stats", func(context.Context, json.RawMessage) (any, error) {
			n := int(calls.Add(1)) - 1
			return answers[min(n, len(answers)-1)], nil
		})
		return nil
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	pe := &Endpoint{rpc: ctl.StartInProcess(ctx, role)}
	defer pe.close()
	t0 := time.Now()
	st, err := settlePrefill(ctx, pe, 300*time.Millisecond, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if took := time.Since(t0); took > 3*time.Second {
		t.Errorf("settling took %v: the wait missed in_flight going to 0", took)
	}
	if st.InFlight != 0 || st.BlocksInUse != 0 || st.LeasesHeld != 0 || calls.Load() != 3 {
		t.Errorf("settled on %+v after %d polls, want all zero after 3", st, calls.Load())
	}
}

// A prefill killed before it WRITEs: decode's registration watchdog fails
// the requests and decode frees its pre-allocated blocks.
func TestHandoffPrefillKilledBeforeWrite(t *testing.T) {
	o := handoffOpts(t, engine.ProtoPush, 1, 1)
	o.Requests, o.Warmup, o.Concurrency, o.RegTimeout = 4, 0, 4, runcore.Duration(500*time.Millisecond)
	// Prefill computes for seconds, so it is killed with all four requests
	// registered at decode and none written. (Killed at once, the driver
	// notices before it sends anything, and there is nothing to test.)
	o.ISL, o.PrefillPerToken = ISL{Dist: ISLFixed, Fixed: 400}, runcore.Duration(10*time.Millisecond)
	o.OnStart = func(p, _ *Endpoint) {
		time.AfterFunc(300*time.Millisecond, func() { _ = p.Signal(syscall.SIGKILL) })
	}
	res, _ := RunHandoff(context.Background(), o)
	if res == nil || res.Summary.Requests != 4 || res.Summary.Failed != 4 {
		t.Fatalf("all four requests should be sent and fail: %+v", res)
	}
	if !strings.HasPrefix(res.EndpointDied, "prefill") {
		t.Errorf("endpoint_died %q", res.EndpointDied)
	}
	// Decode gave up its blocks: cancelled by the driver or by its watchdog.
	if res.Decode.BlocksInUse != 0 {
		t.Errorf("decode after: %+v", res.Decode)
	}
	for _, r := range res.Records {
		if r.Error == "" {
			t.Errorf("%s did not fail", r.ID)
		}
	}
}

// fileSink streams a run's records into one file, as the CLI does.
type fileSink struct{ w *report.RecordsWriter }

func (s fileSink) Begin(_ report.Result, header any) error { return s.w.Header(header) }
func (s fileSink) Record(rec any) error                    { return s.w.Append(rec) }

// The records file has its header and finished requests while the run is
// still going, and at the end holds exactly the run's final records (a
// release that completes a record after its request streams the completed
// one), one line each.
func TestHandoffStreamsRecords(t *testing.T) {
	for _, proto := range []engine.Protocol{engine.ProtoPull, engine.ProtoPush, engine.ProtoSGLang} {
		t.Run(string(proto), func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "recs.jsonl")
			w, err := report.CreateRecords(path)
			if err != nil {
				t.Fatal(err)
			}
			o := handoffOpts(t, proto, 1, 1)
			// Slow on purpose: 64 tokens at 2 ms each is 128 ms a request.
			o.Inproc, o.Requests, o.Warmup, o.Concurrency = true, 1000, 1, 2
			o.ISL, o.PrefillPerToken, o.Records = ISL{Dist: ISLFixed, Fixed: 64}, runcore.Duration(2*time.Millisecond), fileSink{w}
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			type outcome struct {
				res *HandoffResult
				err error
			}
			done := make(chan outcome, 1)
			go func() {
				res, err := RunHandoff(ctx, o)
				done <- outcome{res, err}
			}()
			var lines []string
			for deadline := time.Now().Add(30 * time.Second); len(lines) < 1+3; time.Sleep(20 * time.Millisecond) {
				if time.Now().After(deadline) {
					t.Fatalf("after 30 s the records file has %d lines", len(lines))
				}
				select {
				case o := <-done:
					t.Fatalf("the run ended before its records showed (%v)", o.err)
				default:
				}
				b, _ := os.ReadFile(path)
				lines = strings.Split(strings.TrimSuffix(string(b), "\n"), "\n")
				if len(b) == 0 {
					lines = nil
				}
			}
			if !strings.Contains(lines[0], `"schema":"nixlctl.records/v1"`) || !strings.Contains(lines[1], `"handoff_ms"`) {
				t.Fatalf("records while running: %q", lines)
			}
			cancel()
			out := <-done
			if out.res == nil {
				t.Fatal(out.err)
			}
			if err := w.Close(); err != nil {
				t.Fatal(err)
			}
			b, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			lines = strings.Split(strings.TrimSuffix(string(b), "\n"), "\n")
			streamed := map[int]string{}
			for _, l := range lines[1:] {
				var r HandoffRecord
				if err := json.Unmarshal([]byte(l), &r); err != nil {
					t.Fatal(err)
				}
				if _, dup := streamed[r.Index]; dup {
					t.Errorf("request %d streamed twice", r.Index)
				}
				streamed[r.Index] = l
			}
			if len(streamed) != len(out.res.Records) {
				t.Fatalf("streamed %d records, the run kept %d", len(streamed), len(out.res.Records))
			}
			for _, r := range out.res.Records {
				want, _ := json.Marshal(r)
				if streamed[r.Index] != string(want) {
					t.Errorf("request %d streamed\n%s\nkept\n%s", r.Index, streamed[r.Index], want)
				}
				if r.Freed == "" && r.Error == "" && proto != engine.ProtoSGLang {
					t.Errorf("request %d has no release reason", r.Index)
				}
			}
		})
	}
}

// xPyD: two prefills and two decodes, every protocol, real processes. The
// round robin gives every pair requests; every byte is verified on every
// pair and nothing is left allocated on any engine.
func TestHandoffXPyD(t *testing.T) {
	for _, proto := range []engine.Protocol{engine.ProtoPull, engine.ProtoPush, engine.ProtoSGLang} {
		t.Run(proto.String(), func(t *testing.T) {
			o := handoffOpts(t, proto, 1, 1)
			o.Prefills, o.Decodes, o.Requests, o.Warmup = 2, 2, 8, 0
			res := runHandoffClean(t, o, 8)
			s := res.Summary
			if len(s.Pairs) != 4 {
				t.Fatalf("%d pairs, want 4: %+v", len(s.Pairs), s.Pairs)
			}
			for k, p := range s.Pairs {
				if p.Prefill != k/2 || p.Decode != k%2 || p.Requests != 2 || p.Failed != 0 || p.CorruptBlocks != 0 ||
					p.Bytes <= 0 || p.ActiveGBps <= 0 || p.HandoffLatencyMS.P99 <= 0 {
					t.Errorf("pair %d: %+v", k, p)
				}
			}
			if len(res.Endpoints) != 4 || res.Endpoints[1].Role != "prefill-1" || res.Endpoints[3].Role != "decode-1" {
				t.Errorf("endpoints %+v", res.Endpoints)
			}
			if len(res.PrefillEngines) != 2 || len(res.DecodeEngines) != 2 || res.Prefill.Requests != res.PrefillEngines[0].Requests+res.PrefillEngines[1].Requests {
				t.Errorf("engine stats: prefill %+v of %+v", res.Prefill, res.PrefillEngines)
			}
			c := res.Config
			if len(c.PrefillEngines) != 2 || len(c.DecodeEngines) != 2 || c.Router != RouterRoundRobin {
				t.Errorf("config %+v", c)
			}
		})
	}
}

// The hosts line appears only when some endpoint's clock was estimated,
// and names each endpoint's host and offset.
func TestHostsLine(t *testing.T) {
	t.Parallel()
	res := &HandoffResult{Placement: runcore.PlacementNamespaces, Endpoints: []runcore.EndpointInfo{
		{Role: "prefill", Hostname: "a", Clock: runcore.ClockOffset{SameClock: true}},
		{Role: "decode", Hostname: "b", Addr: "10.0.0.2:7401", Clock: runcore.ClockOffset{Text: "+1h0m0s ±16µs (rtt 32µs, 16 samples)"}},
	}}
	want := "prefill on a (the driver's clock), decode on b 10.0.0.2:7401 (clock +1h0m0s ±16µs (rtt 32µs, 16 samples)); one kernel, separate namespaces"
	if got := hostsLine(res); got != want {
		t.Errorf("hostsLine:\n got %q\nwant %q", got, want)
	}
	res.Endpoints[1].Clock = runcore.ClockOffset{SameClock: true}
	if got := hostsLine(res); got != "" {
		t.Errorf("every endpoint on the driver's clock: %q, want no line", got)
	}
}

// With --on-endpoint-death drain, a dead decode leaves the rotation and the
// run goes on with the one left: every request after the death is served,
// and the result still names the death (the run fails on it).
func TestHandoffDrainDeadDecode(t *testing.T) {
	o := handoffOpts(t, engine.ProtoPull, 1, 1)
	o.Decodes, o.Requests, o.Warmup, o.Concurrency, o.OnEndpointDeath = 2, 24, 0, 2, DeathDrain
	o.ISL = ISL{Dist: "fixed", Fixed: 1024}
	o.Spec.Model.NumLayers = 32
	o.OnStart = func(_, d *Endpoint) {
		time.AfterFunc(200*time.Millisecond, func() { _ = d.Signal(syscall.SIGKILL) })
	}
	res, err := RunHandoff(context.Background(), o)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(res.EndpointDied, "decode-0") {
		t.Errorf("endpoint_died %q, want decode-0", res.EndpointDied)
	}
	s := res.Summary
	// Requests whose decode died fail; the rest, on decode-1, pass: all 24
	// were sent, and decode-1 served more than its round-robin half.
	if s.Requests != 24 || s.Failed >= 12 || s.CorruptBlocks != 0 {
		t.Errorf("summary: %d requests, %d failed, %d corrupt", s.Requests, s.Failed, s.CorruptBlocks)
	}
	served := 0
	for _, r := range res.Records {
		if r.Decode == 1 && r.Error == "" {
			served++
		}
	}
	if served <= 12 {
		t.Errorf("decode-1 served %d requests; a drained run should route the rest of them there", served)
	}
	if res.Config.OnEndpointDeath != DeathDrain {
		t.Errorf("config.on_endpoint_death %q", res.Config.OnEndpointDeath)
	}
}

// --xfer-reference measures the same op, descriptors and depth as the
// run, waiting as the endpoints wait (paced) and with a notification on
// every request as the handoff's transfers carry, in rounds between the
// handoff's: every round has its reference, the summary their median
// ratio and its spread, and the requests their round; after each round's
// references the endpoints touched their pools.
func TestHandoffXferReferenceLikeForLike(t *testing.T) {
	for _, proto := range []engine.Protocol{engine.ProtoPull, engine.ProtoPush} {
		t.Run(string(proto), func(t *testing.T) {
			o := handoffOpts(t, proto, 1, 1)
			o.Inproc, o.XferRef, o.Verify, o.XferRounds = true, true, engine.Sparse, 3
			o.Requests, o.Concurrency, o.ISL = 36, 3, ISL{Dist: ISLFixed, Fixed: 256}
			var log bytes.Buffer
			o.Log = slog.New(slog.NewTextHandler(&log, nil))
			res, err := RunHandoff(context.Background(), o)
			if err != nil {
				t.Fatal(err)
			}
			// The endpoints closed for the reference did not die.
			if strings.Contains(log.String(), "endpoint died") || res.EndpointDied != "" {
				t.Errorf("a clean run reported a dead endpoint (%q):\n%s", res.EndpointDied, log.String())
			}
			ref, s := res.Config.XferReference, res.Summary
			want := map[engine.Protocol]string{engine.ProtoPull: "READ", engine.ProtoPush: "WRITE"}[proto]
			if ref == nil || ref.Op != want || ref.Polling != "paced" || ref.PipelineDepth != o.Concurrency ||
				ref.BatchSize != int(s.DescriptorsPerReq+0.5) || s.XferGBps <= 0 || s.EfficiencyXfer <= 0 {
				t.Fatalf("reference %+v, summary xfer %.3g GB/s, efficiency %.3g", ref, s.XferGBps, s.EfficiencyXfer)
			}
			// The references walked a pool's worth of memory, as the
			// handoff's requests did (one rank per engine here).
			if ref.SpanBytes != res.Config.PoolBytesPerEngine {
				t.Errorf("reference span %d bytes, want the pool's %d", ref.SpanBytes, res.Config.PoolBytesPerEngine)
			}
			// 36 requests at concurrency 3: three rounds of 12.
			if ref.Rounds != 3 || ref.RoundRequests != 12 || len(s.Rounds) != 3 || s.EfficiencyXferSpread == nil || s.EfficiencyXferSpread.N != 3 {
				t.Fatalf("reference %+v, rounds %+v, spread %+v: want three rounds of 12", ref, s.Rounds, s.EfficiencyXferSpread)
			}
			perRound := map[int]int{}
			for _, r := range res.Records {
				if !r.Warmup {
					perRound[r.Round]++
				}
			}
			for k, rd := range s.Rounds {
				if rd.Round != k+1 || rd.Requests != 12 || perRound[k] != 12 || rd.HandoffGBps <= 0 || rd.XferGBps <= 0 || rd.CPUNSPerStep <= 0 || (rd.TouchMS <= 0) != (k == len(s.Rounds)-1) {
					t.Errorf("round %d: %+v (records in it: %d)", k+1, rd, perRound[k])
					for _, r := range res.Records {
						if r.Round == k {
							t.Logf("%d %s err=%q bytes=%d", r.Index, r.ID, r.Error, r.Bytes)
						}
					}
				}
			}
			// Inproc, one host, ucx: the host-limit reference ran beside it.
			if s.LimitGBps <= 0 || s.EfficiencyLimit <= 0 || ref.Limit == "" {
				t.Errorf("no host-limit reference: %.3g GB/s, efficiency %.3g, %q", s.LimitGBps, s.EfficiencyLimit, ref.Limit)
			}
			if res.HostCPU == nil || res.HostCPU.Readings != 5 {
				t.Errorf("host cpu %+v: want a reading before, after, and before each of the 3 rounds' references", res.HostCPU)
			}
			if res.HostOthers == nil || res.HostOthers.Samples != 5 || res.HostOthers.CPUs < 1 {
				t.Errorf("host others %+v: want a sample with each CPU reading", res.HostOthers)
			}
		})
	}
}

// An open loop's reference runs once, after the run, over a pool's
// worth of memory too.
func TestHandoffXferReferenceAfterOpenLoop(t *testing.T) {
	o := handoffOpts(t, engine.ProtoPull, 1, 1)
	o.Inproc, o.XferRef, o.Verify = true, true, engine.Sparse
	o.Requests, o.Rate, o.XferRounds, o.ISL = 24, 400, 1, ISL{Dist: ISLFixed, Fixed: 256}
	res, err := RunHandoff(context.Background(), o)
	if err != nil {
		t.Fatal(err)
	}
	ref, s := res.Config.XferReference, res.Summary
	if ref == nil || ref.Rounds != 0 || ref.Iterations == 0 || s.XferGBps <= 0 {
		t.Fatalf("reference %+v, xfer %.3g GB/s: want one after the run", ref, s.XferGBps)
	}
	if ref.SpanBytes != res.Config.PoolBytesPerEngine {
		t.Errorf("reference span %d bytes, want the pool's %d", ref.SpanBytes, res.Config.PoolBytesPerEngine)
	}
}

// SGLang with a prefill killed mid-run and --on-endpoint-death drain: the
// decode rooms that waited on it fail through decode's /health heartbeat
// within seconds, not at the 300 s waiting timeout, and the run goes on
// with the other prefill and ends.
func TestHandoffSGLangDrainDeadPrefill(t *testing.T) {
	o := handoffOpts(t, engine.ProtoSGLang, 1, 1)
	o.Prefills, o.Requests, o.Warmup, o.Concurrency, o.OnEndpointDeath = 2, 48, 0, 4, DeathDrain
	o.ISL, o.PrefillPerToken = ISL{Dist: ISLFixed, Fixed: 256}, runcore.Duration(2*time.Millisecond)
	o.SGLHeartbeatInterval, o.SGLHeartbeatMaxFailures = runcore.Duration(engine.SGLMinHeartbeatInterval), 2
	// prefill-0 dies once 2 requests finished (the run's own progress
	// events, not a timer: a timer fired after a fast run had ended), with
	// most of the run, its 46 requests on prefill-1 alone, still to go,
	// and while it holds a request's blocks: killed between two of its
	// requests (under two CPU hogs, 1 run in 10), no request failed and
	// the test asserted a fault that had not landed.
	var killed atomic.Int64
	var prefill0 atomic.Pointer[Endpoint]
	var finished atomic.Int32
	o.OnStart = func(p, _ *Endpoint) { prefill0.Store(p) }
	o.Live = live.Func(func(e live.Event) {
		if _, ok := e.(live.Request); !ok || finished.Add(1) != 2 {
			return
		}
		p := prefill0.Load()
		if p == nil {
			return
		}
		go func() {
			for end := time.Now().Add(30 * time.Second); time.Now().Before(end); time.Sleep(time.Millisecond) {
				var st engine.Stats
				if err := p.rpc.Call(context.Background(), "stats", nil, &st); err != nil {
					return
				}
				if st.BlocksInUse > 0 {
					killed.Store(time.Now().UnixNano())
					_ = p.Signal(syscall.SIGKILL)
					return
				}
			}
		}()
	})
	res := runWithin(t, o, 90*time.Second, "the run still goes 90 s after a prefill died: decode waits for the waiting timeout")
	if res == nil || killed.Load() == 0 {
		t.Fatalf("no result (%v) or prefill never killed", res)
	}
	t.Logf("the run ended %v after prefill-0 was killed; decode: %d checks, %d failed, %d prefills lost, %d rooms failed",
		time.Since(time.Unix(0, killed.Load())), res.Decode.SGLHeartbeats, res.Decode.SGLHeartbeatFailures,
		res.Decode.SGLPrefillsLost, res.Decode.SGLRoomsFailed)
	if !strings.HasPrefix(res.EndpointDied, "prefill-0") {
		t.Errorf("endpoint_died %q, want prefill-0", res.EndpointDied)
	}
	s := res.Summary
	if s.Requests != 48 || s.Failed == 0 || s.Failed >= 12 || s.CorruptBlocks != 0 || res.Decode.BlocksInUse != 0 {
		t.Errorf("summary: %d requests, %d failed, %d corrupt; decode holds %d blocks", s.Requests, s.Failed, s.CorruptBlocks, res.Decode.BlocksInUse)
	}
	if d := res.Decode; d.SGLPrefillsLost != 1 || d.SGLHeartbeatFailures < 2 || d.RegTimeouts != 0 {
		t.Errorf("decode did not give the dead prefill up by its heartbeat: %+v", d)
	}
	if c := res.Config; c.SGLWaitingTimeout != runcore.Duration(engine.SGLDefaultWaitingTimeout) || c.SGLHeartbeatInterval != runcore.Duration(2*time.Second) {
		t.Errorf("config: waiting %v, heartbeat %v", c.SGLWaitingTimeout, c.SGLHeartbeatInterval)
	}
}

// TestHandoffPP: --pp reaches every engine's config and the result, and a
// block weighs the whole model whichever way the stages split it.
func TestHandoffPP(t *testing.T) {
	one := handoffOpts(t, engine.ProtoPull, 2, 1)
	for _, c := range []struct {
		pp, recorded int
		label        string
	}{{1, 0, "TP 2 -> 1"}, {2, 2, "TP 2 -> 1, PP 2"}, {4, 4, "TP 2 -> 1, PP 4"}} {
		t.Run(fmt.Sprint(c.pp), func(t *testing.T) {
			o := handoffOpts(t, engine.ProtoPull, 2, 1)
			o.Spec.PP = c.pp
			cfg := o.config(8)
			if cfg.PP != c.recorded || cfg.parallelLabel() != c.label {
				t.Errorf("config pp %d label %q, want %d %q", cfg.PP, cfg.parallelLabel(), c.recorded, c.label)
			}
			for _, role := range []engine.Role{engine.RolePrefill, engine.RoleDecode} {
				if got := o.EngineConfig(role, "ucx", 8).PP; got != c.pp {
					t.Errorf("%s engine pp %d, want %d", role, got, c.pp)
				}
			}
			if got, want := o.Spec.BlockBytesAllRanks(2), one.Spec.BlockBytesAllRanks(2); got != want {
				t.Errorf("a block on all ranks weighs %d with pp %d, %d with pp 1", got, c.pp, want)
			}
		})
	}
}

// TestDrainFreedWaitsOnlyForVLLM: vLLM's prefill reports each release and
// the driver waits (up to its limit) for the ones still missing; SGLang's
// reports none, and waiting for them added the whole limit to every run.
func TestDrainFreedWaitsOnlyForVLLM(t *testing.T) {
	for _, proto := range []engine.Protocol{engine.ProtoPull, engine.ProtoSGLang} {
		h := &handoff{o: &HandoffOptions{Protocol: proto}, records: []HandoffRecord{{ID: "cmpl-000000-0"}}, freed: map[string]engine.FreedEvent{}}
		limit := 50 * time.Millisecond
		if proto == engine.ProtoSGLang {
			limit = time.Hour // a wait would time the test out
		}
		done := make(chan time.Duration, 1)
		go func() {
			t0 := time.Now()
			h.drainFreed(limit)
			done <- time.Since(t0)
		}()
		select {
		case took := <-done:
			if proto == engine.ProtoPull && took < limit {
				t.Errorf("pull: drainFreed returned after %v with a release missing, want the whole %v", took, limit)
			}
		case <-time.After(30 * time.Second):
			t.Fatalf("%s: drainFreed still waiting after 30 s for releases this protocol never sends", proto)
		}
	}
}

// TestTagWorkWarning: a result warns when any endpoint ran its tag work
// at normal priority, and only then.
func TestTagWorkWarning(t *testing.T) {
	idle := engine.Stats{TagWork: "idle priority"}
	normal := engine.Stats{TagWork: "normal priority (sched_setattr SCHED_IDLE: operation not permitted)"}
	for _, tc := range []struct {
		name  string
		stats []engine.Stats
		warns bool
	}{
		{"every endpoint idle", []engine.Stats{idle, idle}, false},
		{"an older endpoint that does not say", []engine.Stats{idle, {}}, false},
		{"decode at normal priority", []engine.Stats{idle, normal}, true},
		{"prefill at normal priority", []engine.Stats{normal, idle}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := tagWorkWarning(tc.stats)
			if got := w != ""; got != tc.warns {
				t.Fatalf("warning %q, want one: %v", w, tc.warns)
			}
			if tc.warns && !strings.Contains(w, "operation not permitted") {
				t.Errorf("warning %q does not say why", w)
			}
		})
	}
}

// An open loop faster than its endpoints keeps at most --max-inflight
// requests in flight, counts the arrivals that waited and says so; before,
// every arrival started at once, without bound.
func TestHandoffOpenLoopMaxInflight(t *testing.T) {
	o := handoffOpts(t, engine.ProtoPull, 1, 1)
	o.Requests, o.Warmup, o.Rate, o.MaxInflight = 12, 0, 10000, 2
	o.ISL, o.PrefillPerToken = ISL{Dist: ISLFixed, Fixed: 64}, runcore.Duration(time.Millisecond) // 64 ms of prefill each
	res, err := RunHandoff(context.Background(), o)
	if err != nil {
		t.Fatal(err)
	}
	if res.Summary.Failed != 0 || res.Summary.Requests != 12 {
		t.Fatalf("summary %+v", res.Summary)
	}
	if res.Summary.ArrivalsDelayed == 0 || res.Config.MaxInflight != 2 {
		t.Errorf("arrivals delayed %d, config max_inflight %d", res.Summary.ArrivalsDelayed, res.Config.MaxInflight)
	}
	if !slices.ContainsFunc(res.Warnings, func(w string) bool { return strings.Contains(w, "--max-inflight 2") }) {
		t.Errorf("no warning about the delayed arrivals: %q", res.Warnings)
	}
	// No moment had more than 2 requests between their start and ready.
	type edge struct {
		t     int64
		delta int
	}
	var edges []edge
	for _, r := range res.Records {
		edges = append(edges, edge{r.TStart, 1}, edge{r.TReady, -1})
	}
	slices.SortFunc(edges, func(a, b edge) int {
		if a.t != b.t {
			return int(min(max(a.t-b.t, -1), 1))
		}
		return a.delta - b.delta // a finish before a start at the same stamp
	})
	in, most := 0, 0
	for _, e := range edges {
		in += e.delta
		most = max(most, in)
	}
	if most > 2 {
		t.Errorf("%d requests in flight at once with --max-inflight 2", most)
	}
}
