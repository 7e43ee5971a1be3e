package ecbench

import (
	"github.com/nixlctl/nixlctl/internal/ec"
	"github.com/nixlctl/nixlctl/internal/report"
	"github.com/nixlctl/nixlctl/internal/runcore"
)

// ECResult is a whole run.
type ECResult struct {
	report.Meta
	Config    ECConfig           `json:"config"`
	Summary   ECSummary          `json:"summary"`
	Reference ECReference        `json:"reference"`
	Consumers []ec.ConsumerStats `json:"consumers"`
	Producer  *ec.ProducerStats  `json:"producer,omitempty"`
	NetPath   runcore.NetPath    `json:"net_path,omitempty"` // producer and consumers
	// Endpoints and Placement say where the consumers (this process) and
	// the encoder ran.
	Endpoints   []runcore.EndpointInfo `json:"endpoints,omitempty"`
	Placement   string                 `json:"placement,omitempty"`
	Interrupted bool                   `json:"interrupted,omitempty"`
}

// ECConfig echoes what ran.
type ECConfig struct {
	Model            string   `json:"model"`
	HFName           string   `json:"hf_name"`
	HiddenSize       int      `json:"hidden_size"`
	DType            string   `json:"dtype"`
	SpatialMerge     int      `json:"spatial_merge_size"`
	BlockBytes       int      `json:"block_bytes"`
	Grids            []string `json:"grids"`
	ImageBytes       []int64  `json:"image_bytes"`
	ImageBlocks      []int    `json:"image_blocks"`
	Direction        string   `json:"direction"`
	Requests         int      `json:"requests"`
	ImagesPerRequest int      `json:"images_per_request"`
	UniqueImages     int      `json:"unique_images"`
	ZipfS            float64  `json:"zipf_s"`
	Consumers        int      `json:"consumers"`
	ConsumersRunAs   string   `json:"consumers_run_as"`
	ProducerRegion   int      `json:"producer_region_bytes"`
	ProducerBlocks   int      `json:"producer_region_blocks"`
	ConsumerRegion   int      `json:"consumer_region_bytes"`
	ConsumerBlocks   int      `json:"consumer_region_blocks"`
	AckTimeoutMS     float64  `json:"ack_timeout_ms"`
	EncodeTimeMS     float64  `json:"encode_time_ms"`
	Overlap          bool     `json:"overlap"`
	Verify           bool     `json:"verify"`
	Warmup           int      `json:"warmup"`
	Seed             uint64   `json:"seed"`
	Producer         string   `json:"producer"` // process, inproc or the address
	CompatHash       string   `json:"compatibility_hash"`
}

// ECSummary aggregates the image requests. Latencies are per image:
// latency_ms is a cold transfer from sending the XferReq to the blocks
// being in the consumer's region; hit_latency_ms a local hit (lookup and
// pin); ack_ms and transfer_ms split the cold path.
type ECSummary struct {
	Requests            int                `json:"requests"`
	Images              int                `json:"images"`
	Hits                int                `json:"hits"`
	Transfers           int                `json:"transfers"`
	Failed              int                `json:"failed"`
	HitRate             float64            `json:"hit_rate"`
	Evictions           int64              `json:"evictions"`
	PinnedSkips         int64              `json:"pinned_skips"`
	Exhausted           int64              `json:"exhausted"`
	ProducerEvictions   int64              `json:"producer_evictions"`
	ProducerPinnedSkips int64              `json:"producer_pinned_skips"`
	NotReadyRetries     int64              `json:"not_ready_retries"`
	StaleAcks           int64              `json:"stale_acks"`
	Quarantined         int64              `json:"quarantined"`
	ProducerReloads     int64              `json:"producer_reloads"`
	AckBytes            int                `json:"ack_bytes"` // the largest OK ack: it carries the producer's mem descriptor
	Bytes               int64              `json:"bytes"`     // moved by transfers
	HitBytes            int64              `json:"hit_bytes"` // re-served from local caches
	LatencyMS           report.Percentiles `json:"latency_ms"`
	AckMS               report.Percentiles `json:"ack_ms"`
	TransferMS          report.Percentiles `json:"transfer_ms"`
	HitLatencyMS        report.Percentiles `json:"hit_latency_ms"`
	TransferGBps        float64            `json:"transfer_gbps"` // bytes / summed transfer time
	ColdGBps            float64            `json:"cold_gbps"`     // bytes / summed cold latency (ack included)
	WarmSpeedup         float64            `json:"warm_speedup"`  // cold p50 / hit p50
	FailuresByStatus    map[string]int64   `json:"failures_by_status"`
	Transport           string             `json:"transport,omitempty"`
	Histogram           string             `json:"latency_histogram,omitempty"`
}

// ECReference is memcpy of one image's bytes in this process, in the same
// run: the ceiling a same-host transfer can reach.
type ECReference struct {
	Bytes      int64   `json:"bytes"`
	MemcpyGBps float64 `json:"memcpy_gbps"`
	Efficiency float64 `json:"efficiency"` // transfer_gbps / memcpy_gbps
}

// ECRecord is one image request (the --records file has one per line).
type ECRecord struct {
	Request    int     `json:"request"`
	Consumer   int     `json:"consumer"`
	MMHash     string  `json:"mm_hash"`
	Outcome    string  `json:"outcome"`
	Status     string  `json:"status"`
	Bytes      int64   `json:"bytes"`
	Blocks     int     `json:"blocks"`
	AckMS      float64 `json:"ack_ms"`
	TransferMS float64 `json:"transfer_ms"`
	TotalMS    float64 `json:"total_ms"`
	Retries    int     `json:"not_ready_retries,omitempty"`
	Error      string  `json:"error,omitempty"`
	ackBytes   int
}
