package handoff

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/nixlctl/nixlctl/internal/engine"
	"github.com/nixlctl/nixlctl/internal/golden"
	"github.com/nixlctl/nixlctl/internal/netpath"
	"github.com/nixlctl/nixlctl/internal/report"
	"github.com/nixlctl/nixlctl/internal/runcore"
	"github.com/nixlctl/nixlctl/internal/xferbench"
)

// craftedMeta is a fixed Meta, so renderings do not depend on the host.
func craftedMeta(cmd string) report.Meta {
	return report.Meta{Schema: report.Schema, Command: cmd, Version: "test", Args: strings.Fields(cmd),
		StartedAt: time.Date(2026, 11, 21, 12, 0, 0, 0, time.UTC), Seconds: 3.5,
		Host: report.Host{Name: "host", OS: "linux", Arch: "amd64", CPUs: 2},
		Env: report.Environment{Backend: "ucx", BackendVersion: "1.13.1", UCX: "1.13.1", Transport: "rma: cma/memory",
			NvidiaDriver: "550.54.15", GPUs: []report.GPU{{Index: 0, Name: "NVIDIA H100 80GB HBM3"}}},
		Warnings: []string{}}
}

func hist(t *testing.T, unit time.Duration, vals ...float64) (*report.Histogram, string) {
	t.Helper()
	h := report.NewHistogram()
	for _, v := range vals {
		h.Record(time.Duration(v * float64(unit)))
	}
	s, err := h.Encode()
	if err != nil {
		t.Fatal(err)
	}
	return h, s
}

func craftedXfer(t *testing.T) *xferbench.XferResult {
	res := &xferbench.XferResult{Meta: craftedMeta("bench xfer"), Config: xferbench.XferConfig{Op: "WRITE", InitiatorSeg: "DRAM", TargetSeg: "DRAM",
		StartBlock: 4096, MaxBlock: 8192, StartBatch: 1, MaxBatch: 2, NumIter: 100, WarmupIter: 10, PipelineDepth: 1,
		TotalBufferSize: 65536, DRAMAlloc: "mmap", InitiatorAlloc: "mmap", TargetAlloc: "mmap", DescOrder: "sequential", Target: "process"}}
	for i, pt := range [][2]int{{4096, 1}, {4096, 2}, {8192, 1}, {8192, 2}} {
		lat, enc := hist(t, time.Microsecond, 10+float64(i), 11+float64(i), 12+float64(i), 30)
		_, tx := hist(t, time.Microsecond, 8, 9, 10)
		_, post := hist(t, time.Microsecond, 1, 1, 2)
		bytes := int64(pt[0] * pt[1] * 100)
		res.Points = append(res.Points, xferbench.XferPoint{Backend: "ucx", Op: "WRITE", BlockSize: pt[0], BatchSize: pt[1], Iterations: 100,
			Bytes: bytes, Seconds: 0.001 * float64(i+1), BandwidthGBps: float64(bytes) / 1e9 / (0.001 * float64(i+1)),
			AvgLatUS: 10, LatencyUS: lat.In(time.Microsecond), PrepUS: report.Percentiles{Mean: 2, P99: 3},
			PostUS: report.Percentiles{Mean: 1, P99: 2}, TxUS: report.Percentiles{Mean: 9, P99: 10}, DescriptorsPerS: 1e5,
			PostNSPerDesc: 500, MemcpyGBps: 4, Efficiency: float64(bytes) / 1e9 / (0.001 * float64(i+1)) / 4,
			Transport: "rma: cma/memory", Histogram: enc, TxHistogram: tx, PostHistogram: post})
	}
	res.NetPath = runcore.NetPath{
		"initiator": {Host: "host", Verdict: netpath.Verdict{Payload: 4 << 20, Direction: netpath.Send, NoDevice: true,
			Notes: []string{"no network device sent a significant share of the 4194304-byte payload: it moved through shared memory or another path inside this host"}}},
		"target": {Host: "host", Verdict: netpath.Verdict{Payload: 4 << 20, Direction: netpath.Receive, NoDevice: true,
			Notes: []string{"no network device received a significant share of the 4194304-byte payload: it moved through shared memory or another path inside this host"}}},
	}
	return res
}

func craftedHandoff(t *testing.T) *HandoffResult {
	res := &HandoffResult{Meta: craftedMeta("bench push"), Protocol: string(engine.ProtoPush), Backend: "ucx", Model: "llama-3.1-8b",
		Config: HandoffConfig{Protocol: engine.ProtoPush, Model: "llama-3.1-8b", ISL: ISL{Dist: ISLFixed, Fixed: 512}, KVDType: "bf16",
			PrefillTP: 1, DecodeTP: 1, BlockSize: 16, Fragmentation: engine.FragContiguous,
			Endpoints: "process", Concurrency: 2, Warmup: 1, Knobs: engine.Knobs{DRAMAlloc: engine.AllocMmap, Verify: engine.Sparse, Lease: runcore.Duration(30 * time.Second)}},
		Prefill: engine.Stats{ExpiredLeases: 1, FailedTransfers: 0}, Decode: engine.Stats{FailedNotifs: 1}}
	for i := range 6 {
		r := HandoffRecord{Index: i, ID: "cmpl-" + string(rune('a'+i)), Warmup: i == 0, ISL: 512, Blocks: 32, Descriptors: 64,
			LogicalDescs: 2048, Bytes: 64 << 20, FirstHandshake: i == 0, HandshakeMS: 1.5, RegRTTMS: 0.5 + float64(i)/10,
			FinishToPostMS: 0.2, PostMS: 0.15, TransferMS: 20 + float64(i), CompletionMS: 1, HandoffMS: 22 + float64(i),
			TStart: int64(i) * 30e6, TFinish: int64(i)*30e6 + 5e6, TReady: int64(i)*30e6 + 27e6}
		if i == 5 {
			r.Error, r.TransferMS = "decode: registration timeout", 0
		}
		res.Records = append(res.Records, r)
	}
	res.Summary = SummarizeHandoff(res.Records, 5)
	res.Summary.XferGBps, res.Summary.LeakedBlocks = 4, 0
	res.Summary.EfficiencyXfer = res.Summary.BandwidthGBps / 4
	res.NetPath = runcore.NetPath{
		"prefill": {Host: "prefill-host", Verdict: netpath.Verdict{Payload: 320 << 20, Direction: netpath.Send,
			Carriers: []netpath.Carrier{{Name: "veth0", Kind: netpath.Net, Bytes: 330 << 20, Share: 1}, {Name: "eth0", Kind: netpath.Net, Bytes: 12000, Share: 12000.0 / (320 << 20)}}}},
		"decode": {Host: "decode-host", Verdict: netpath.Verdict{Payload: 320 << 20, Direction: netpath.Receive,
			Carriers: []netpath.Carrier{{Name: "veth0", Kind: netpath.Net, Bytes: 314 << 20, Share: 314.0 / 320}}}},
	}
	return res
}

// Results survive JSON and the registry unchanged, and the fields earlier
// issues promised scripts are where they said.
func TestResultSchemaRoundTrip(t *testing.T) {
	for _, res := range []report.Result{craftedXfer(t), craftedHandoff(t)} {
		var b bytes.Buffer
		if err := report.WriteJSON(&b, res); err != nil {
			t.Fatal(err)
		}
		back, err := report.DecodeResult(b.Bytes())
		if err != nil {
			t.Fatal(err)
		}
		opt := cmp.FilterPath(func(p cmp.Path) bool { return p.String() == "Records" || p.String() == "Config" }, cmp.Ignore())
		if diff := cmp.Diff(res, back, opt); diff != "" {
			t.Errorf("%s round trip (-want +got):\n%s", res.Header().Command, diff)
		}
		if !cmp.Equal(res.Metrics(), back.Metrics(), cmp.Comparer(func(a, b *report.Histogram) bool {
			return (a == nil) == (b == nil) && (a == nil || a.In(time.Nanosecond) == b.In(time.Nanosecond))
		})) {
			t.Errorf("%s: metrics differ after a round trip", res.Header().Command)
		}
		var doc map[string]any
		if err := json.Unmarshal(b.Bytes(), &doc); err != nil {
			t.Fatal(err)
		}
		paths := []string{"schema", "command", "nixlctl_version", "args", "started_at", "environment.backend", "environment.ucx",
			"environment.transport", "environment.gpus", "environment.nvidia_driver", "host.name", "warnings"}
		if res.Header().Command == "bench xfer" {
			paths = append(paths, "points.block_size", "points.batch_size", "points.bandwidth_gbps", "points.latency_us.p50",
				"points.latency_us.p90", "points.latency_us.p99", "points.latency_us.p999", "points.latency_us.max",
				"points.efficiency", "points.backend", "points.op", "points.latency_histogram", "config.op")
		} else {
			paths = append(paths, "protocol", "backend", "model", "summary.requests", "summary.failed", "summary.corrupt_blocks",
				"summary.bytes", "summary.bandwidth_gbps", "summary.requests_per_s", "summary.handoff_latency_ms.p50",
				"summary.handoff_latency_ms.p99", "summary.handoff_latency_ms.p999", "summary.handoff_latency_ms.max",
				"summary.efficiency_vs_memcpy", "summary.efficiency_vs_xfer", "summary.handoff_histogram",
				"summary.stage_histograms.transfer_ms", "config.isl")
		}
		for _, p := range paths {
			if !hasPath(doc, strings.Split(p, ".")) {
				t.Errorf("%s: JSON lacks %s", res.Header().Command, p)
			}
		}
	}
}

// hasPath follows keys through objects; through an array it checks the
// first element.
func hasPath(v any, keys []string) bool {
	if len(keys) == 0 {
		return true
	}
	switch x := v.(type) {
	case map[string]any:
		next, ok := x[keys[0]]
		return ok && hasPath(next, keys[1:])
	case []any:
		return len(x) > 0 && hasPath(x[0], keys)
	}
	return false
}

// Records written by a result read back into the same summary; a records
// file of another command is refused.
func TestHandoffRecordsRecompute(t *testing.T) {
	res := craftedHandoff(t)
	var b bytes.Buffer
	n, err := res.WriteRecords(&b)
	if err != nil || n != 6 {
		t.Fatalf("%d %v", n, err)
	}
	back := &HandoffResult{Meta: res.Meta, Summary: HandoffSummary{MemcpyGBps: 5, XferGBps: 4}}
	if err := back.ReadRecords(bytes.NewReader(b.Bytes())); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(res.Summary, back.Summary); diff != "" {
		t.Errorf("recomputed summary (-want +got):\n%s", diff)
	}
	if res.Summary.Requests != 5 || res.Summary.Failed != 1 {
		t.Errorf("warm-up left out, failure counted: %+v", res.Summary)
	}
	other := &HandoffResult{Meta: craftedMeta("bench pull")}
	if err := other.ReadRecords(bytes.NewReader(b.Bytes())); err == nil || !strings.Contains(err.Error(), `records are from "bench push"`) {
		t.Errorf("mismatched records: %v", err)
	}
	if _, err := ReadHandoffRecords(strings.NewReader("{}\n"), ""); err == nil {
		t.Error("a file without the header accepted")
	}
}

func TestRenderingsGolden(t *testing.T) {
	for _, tc := range []struct {
		res    report.Result
		format report.Format
		file   string
	}{
		{craftedXfer(t), report.FormatTable, "xfer.txt"},
		{craftedXfer(t), report.FormatMarkdown, "xfer.md"},
		{craftedXfer(t), report.FormatProm, "xfer.prom"},
		{craftedHandoff(t), report.FormatTable, "handoff.txt"},
		{craftedHandoff(t), report.FormatMarkdown, "handoff.md"},
		{craftedHandoff(t), report.FormatProm, "handoff.prom"},
	} {
		var b bytes.Buffer
		if err := tc.res.Render(&b, tc.format); err != nil {
			t.Fatalf("%s: %v", tc.file, err)
		}
		golden.Check(t, tc.file, b.Bytes())
	}
	noRecs := craftedHandoff(t)
	noRecs.Records = nil
	if err := noRecs.Render(&bytes.Buffer{}, report.FormatProm); err == nil || !strings.Contains(err.Error(), "needs the per-request records") {
		t.Errorf("prom without records: %v", err)
	}
	for _, res := range []report.Plottable{craftedXfer(t), craftedHandoff(t), noRecs} {
		if f, err := res.Figure(); err != nil || len(f.Panels) != 2 {
			t.Errorf("figure: %v %+v", err, f)
		}
	}
}

// A result saved before the config was typed (a map written by the same
// names) reads back into HandoffConfig and writes the same keys again.
func TestHandoffConfigReadsSavedResults(t *testing.T) {
	saved := `{"alloc":"mmap","block_size":16,"chunk_tokens":0,"concurrency":8,"decode_tp":1,"dram_alloc":"mmap","endpoints":"process",
		"fragmentation":"scattered","isl":{"dist":"normal","fixed":4096,"min":128,"max":8192,"mean":4000,"std":1500},"kv_cache_layout":"HND",
		"kv_dtype":"bf16","layout":"flash-attn","lease":"30s","mem":"DRAM","merge_descriptors":true,"model":"llama-3.1-8b","num_blocks":1234,
		"pool_bytes_per_engine":5678,"prefill_time_per_token":"20µs","prefill_tp":2,"prefix_hit":0.25,"protocol":"push","rate":0,
		"requests":32,"verify":"full","warmup":2,
		"xfer_reference":{"op":"WRITE","block_size":4096,"batch_size":64,"pipeline_depth":8,"iterations":200}}`
	var c HandoffConfig
	if err := json.Unmarshal([]byte(saved), &c); err != nil {
		t.Fatal(err)
	}
	want := HandoffConfig{Protocol: engine.ProtoPush, Model: "llama-3.1-8b", KVDType: "bf16", BlockSize: 16, Layout: "flash-attn",
		Order: "HND", PrefillTP: 2, DecodeTP: 1, Requests: 32, Warmup: 2,
		ISL:         ISL{Dist: ISLNormal, Fixed: 4096, Min: 128, Max: 8192, Mean: 4000, Std: 1500},
		Concurrency: 8, PrefixHit: 0.25, Fragmentation: engine.FragScattered, Merge: true, NumBlocks: 1234, Mem: "DRAM", Endpoints: "process", PoolBytesPerEngine: 5678, Alloc: "mmap",
		XferReference: &XferReference{Op: "WRITE", BlockSize: 4096, BatchSize: 64, PipelineDepth: 8, Iterations: 200}, Knobs: engine.Knobs{PrefillPerToken: runcore.Duration(20 * time.Microsecond), Lease: runcore.Duration(30 * time.Second), Verify: engine.Full, DRAMAlloc: engine.AllocMmap}}
	if diff := cmp.Diff(want, c); diff != "" {
		t.Errorf("saved config (-want +got):\n%s", diff)
	}
	var before, after map[string]any
	b, err := json.Marshal(c)
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal([]byte(saved), &before); err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, &after); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(before, after); diff != "" {
		t.Errorf("written again (-saved +now):\n%s", diff)
	}
}
