package xferbench

import (
	"fmt"

	"github.com/nixlctl/nixlctl/internal/hostload"
	"github.com/nixlctl/nixlctl/internal/report"
	"github.com/nixlctl/nixlctl/internal/runcore"
)

// XferResult is the whole sweep.
type XferResult struct {
	report.Meta
	Config  XferConfig      `json:"config"`
	Points  []XferPoint     `json:"points"`
	NetPath runcore.NetPath `json:"net_path,omitempty"` // initiator and target
	// Transports is the initiator agent's own description (nixl.Info
	// Details), as bench push/pull record it: the UCX backend's lanes per
	// peer, or NIXL's plugin, its UCX parameters and the libucp file.
	Transports map[string]string `json:"transports,omitempty"`
	// Endpoints and Placement say where the initiator (this process) and
	// the target ran.
	Endpoints   []runcore.EndpointInfo `json:"endpoints,omitempty"`
	Placement   string                 `json:"placement,omitempty"`
	Interrupted bool                   `json:"interrupted,omitempty"`
	// Failure is why the sweep stopped before its last point (a target
	// that died, a transfer error), with the point it stopped at: a
	// result with fewer points must say why, or it reads as a shorter
	// sweep.
	Failure string `json:"failure,omitempty"`
	// HostOthers is the CPU time processes other than this one and the
	// target it started took of this host during the sweep.
	hostload.Field
}

// The gate reads these through interfaces: a method lost would drop the
// run's problems or its neighbour silently.
var (
	_ report.HealthReporter = (*XferResult)(nil)
	_ report.HostSharer     = (*XferResult)(nil)
)

// XferConfig echoes what was asked, so a result describes itself.
type XferConfig struct {
	Op              string `json:"op"`
	InitiatorSeg    string `json:"initiator_seg_type"`
	TargetSeg       string `json:"target_seg_type"`
	InitiatorDevice *int   `json:"initiator_device,omitempty"` // GPU, for VRAM
	TargetDevice    *int   `json:"target_device,omitempty"`
	// Reference is the copy measured in the same run that efficiency
	// divides by: memcpy (DRAM to DRAM), cuda-d2d (cuMemcpyDtoDAsync on
	// the initiator's GPU, for VRAM to VRAM), cuda-h2d or cuda-d2h (mixed).
	Reference        string `json:"reference"`
	StartBlock       int    `json:"start_block_size"`
	MaxBlock         int    `json:"max_block_size"`
	StartBatch       int    `json:"start_batch_size"`
	MaxBatch         int    `json:"max_batch_size"`
	NumIter          int    `json:"num_iter"`
	WarmupIter       int    `json:"warmup_iter"`
	PipelineDepth    int    `json:"pipeline_depth"`
	TotalBufferSize  int    `json:"total_buffer_size"`
	DRAMAlloc        string `json:"dram_alloc"`
	InitiatorAlloc   string `json:"initiator_alloc"`
	TargetAlloc      string `json:"target_alloc"`
	CheckConsistency bool   `json:"check_consistency"`
	RecreateXfer     bool   `json:"recreate_xfer"`
	DescOrder        string `json:"desc_order"`
	// Progress: poll (nixlbench's: the initiator polls, the target spins)
	// or thread (the backend's progress thread on both sides).
	Progress string `json:"progress,omitempty"`
	Notif    bool   `json:"notif"`
	Target   string `json:"target"` // process, inproc or the address
	Shape    string `json:"shape,omitempty"`
}

// XferPoint is one (block size, batch size) of the sweep. Latency is per
// request from the start of its post to its completion, from the agent's
// own clock; AvgLatUS is nixlbench's wall time per descriptor.
type XferPoint struct {
	Backend         string             `json:"backend"`
	Op              string             `json:"op"`
	BlockSize       int                `json:"block_size"`
	BatchSize       int                `json:"batch_size"`
	Iterations      int                `json:"iterations"`
	Bytes           int64              `json:"bytes"`
	Seconds         float64            `json:"seconds"`
	BandwidthGBps   float64            `json:"bandwidth_gbps"`
	AvgLatUS        float64            `json:"avg_lat_us"`
	LatencyUS       report.Percentiles `json:"latency_us"`
	PrepUS          report.Percentiles `json:"prep_us"`
	PostUS          report.Percentiles `json:"post_us"`
	TxUS            report.Percentiles `json:"tx_us"`
	DescriptorsPerS float64            `json:"descriptors_per_s"`
	PostNSPerDesc   float64            `json:"post_ns_per_desc"`
	MemcpyGBps      float64            `json:"memcpy_gbps"` // the reference copy's bandwidth (config.reference)
	Efficiency      float64            `json:"efficiency"`
	Consistency     string             `json:"consistency,omitempty"`
	Transport       string             `json:"transport,omitempty"`
	Histogram       string             `json:"latency_histogram,omitempty"`
	// Stage histograms (same encoding): vLLM's transfer and post times
	// for -o prom, and whoever wants to merge them later.
	TxHistogram   string `json:"tx_histogram,omitempty"`
	PostHistogram string `json:"post_histogram,omitempty"`
}

// Series names the point in metrics and plots: "WRITE 4 KiB x 1".
func (p XferPoint) Series() string {
	return fmt.Sprintf("%s %s x %d", p.Op, report.Bytes(int64(p.BlockSize)), p.BatchSize)
}
