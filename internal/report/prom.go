package report

import (
	"fmt"
	"io"
	"math"
	"sort"
	"strconv"
	"strings"
	"time"
)

// vLLM's NixlConnector exports these histograms and counters (vLLM's
// kv_connector nixl metrics module); nixlctl writes the same names and
// buckets so synthetic runs and production scrapes line up in one
// dashboard.
var (
	promXferBuckets = []float64{0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.2, 0.3, 0.5, 0.75, 1, 5}
	promPostBuckets = []float64{0.001, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.2, 0.3, 0.5, 0.75, 1, 5}
	promByteBuckets = func() []float64 { // 2^(10+i) for i = 1, 3, ..., 23: 2 KiB .. 8 GiB
		var b []float64
		for i := 1; i <= 23; i += 2 {
			b = append(b, math.Ldexp(1, 10+i))
		}
		return b
	}()
	promDescBuckets = []float64{10, 20, 30, 50, 75, 100, 200, 400, 1000, 2000, 4000, 10000, 20000, 50000}
)

// promHist is a Prometheus histogram. It keeps a count per bucket, not
// the cumulative ones Prometheus exposes, so observing stays one
// increment; Write accumulates them.
type promHist struct {
	bounds []float64
	counts []float64 // per bucket, not cumulative; len(bounds)+1 with +Inf last
	sum    float64
	count  float64
}

func newPromHist(bounds []float64) *promHist {
	return &promHist{bounds: bounds, counts: make([]float64, len(bounds)+1)}
}

// observe adds n observations of value v (le is inclusive, as in
// Prometheus).
func (h *promHist) observe(v, n float64) {
	i := sort.SearchFloat64s(h.bounds, v) // first bound >= v
	h.counts[i] += n
	h.sum += v * n
	h.count += n
}

// VLLMTransfers accumulates transfers into vLLM NixlConnector's metrics.
type VLLMTransfers struct {
	xfer, post, bytes, descs                 *promHist
	FailedTransfers, FailedNotifs, ExpiredKV float64
	// Labels go on every sample; vLLM's own carry model_name and engine.
	Labels map[string]string
}

// NewVLLMTransfers starts an empty set.
func NewVLLMTransfers(labels map[string]string) *VLLMTransfers {
	return &VLLMTransfers{xfer: newPromHist(promXferBuckets), post: newPromHist(promPostBuckets),
		bytes: newPromHist(promByteBuckets), descs: newPromHist(promDescBuckets), Labels: labels}
}

// Observe adds one finished transfer, as vLLM records one NIXL handle
// reaching DONE: its transfer and post durations, bytes and descriptors.
func (v *VLLMTransfers) Observe(xfer, post time.Duration, bytes int64, descs int) {
	v.xfer.observe(xfer.Seconds(), 1)
	v.post.observe(post.Seconds(), 1)
	v.bytes.observe(float64(bytes), 1)
	v.descs.observe(float64(descs), 1)
}

// ObserveHistograms adds transfers known only through histograms of their
// transfer and post durations (bench xfer keeps no per-request records),
// all of the same size: each histogram bucket counts at its midpoint.
func (v *VLLMTransfers) ObserveHistograms(xfer, post *Histogram, bytes int64, descs int) {
	n := float64(xfer.Count())
	for _, b := range xfer.Bars() {
		v.xfer.observe((float64(b.From)+float64(b.To))/2/1e9, float64(b.Count))
	}
	for _, b := range post.Bars() {
		v.post.observe((float64(b.From)+float64(b.To))/2/1e9, float64(b.Count))
	}
	v.bytes.observe(float64(bytes), n)
	v.descs.observe(float64(descs), n)
}

// Write writes the text exposition format, as prometheus_client (which
// vLLM uses) does: counters are declared under their name and sampled
// with a _total suffix.
func (v *VLLMTransfers) Write(w io.Writer) error {
	var b strings.Builder
	labels := promLabels(v.Labels)
	hist := func(name, help string, h *promHist) {
		fmt.Fprintf(&b, "# HELP %s %s\n# TYPE %s histogram\n", name, help, name)
		cum := 0.0
		for i, ub := range h.bounds {
			cum += h.counts[i]
			fmt.Fprintf(&b, "%s_bucket{%s} %s\n", name, joinLabels(labels, "le=\""+promFloat(ub)+"\""), promFloat(cum))
		}
		cum += h.counts[len(h.bounds)]
		fmt.Fprintf(&b, "%s_bucket{%s} %s\n", name, joinLabels(labels, `le="+Inf"`), promFloat(cum))
		fmt.Fprintf(&b, "%s_count%s %s\n", name, braces(labels), promFloat(h.count))
		fmt.Fprintf(&b, "%s_sum%s %s\n", name, braces(labels), promFloat(h.sum))
	}
	counter := func(name, help string, x float64) {
		fmt.Fprintf(&b, "# HELP %s %s\n# TYPE %s counter\n%s_total%s %s\n", name, help, name, name, braces(labels), promFloat(x))
	}
	hist("vllm:nixl_xfer_time_seconds", "Histogram of transfer duration for NIXL KV Cache transfers.", v.xfer)
	hist("vllm:nixl_post_time_seconds", "Histogram of transfer post time for NIXL KV Cache transfers.", v.post)
	hist("vllm:nixl_bytes_transferred", "Histogram of bytes transferred per NIXL KV Cache transfers.", v.bytes)
	hist("vllm:nixl_num_descriptors", "Histogram of number of descriptors per NIXL KV Cache transfers.", v.descs)
	counter("vllm:nixl_num_failed_transfers", "Number of failed NIXL KV Cache transfers.", v.FailedTransfers)
	counter("vllm:nixl_num_failed_notifications", "Number of failed NIXL KV Cache notifications.", v.FailedNotifs)
	counter("vllm:nixl_num_kv_expired_reqs", "Number of requests that had their KV expire.", v.ExpiredKV)
	_, err := io.WriteString(w, b.String())
	return err
}

func promLabels(m map[string]string) string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = k + "=" + strconv.Quote(m[k])
	}
	return strings.Join(parts, ",")
}

func joinLabels(a, b string) string {
	if a == "" {
		return b
	}
	return a + "," + b
}

func braces(l string) string {
	if l == "" {
		return ""
	}
	return "{" + l + "}"
}

// promFloat formats like prometheus_client, so output diffs cleanly
// against a vLLM scrape: integers with one decimal ("3.0"; the format
// would accept "3"), others in shortest form.
func promFloat(x float64) string {
	if x == math.Trunc(x) && math.Abs(x) < 1e15 {
		return strconv.FormatFloat(x, 'f', 1, 64)
	}
	return strconv.FormatFloat(x, 'g', -1, 64)
}
