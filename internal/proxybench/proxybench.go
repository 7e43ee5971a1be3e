// Package proxybench drives a disaggregated-serving proxy (vLLM's
// toy_proxy_server.py, llm-d's routing sidecar, a router of your own) the
// way a client does: N completion requests through its /v1/completions,
// timed as the client sees them. Behind the proxy run nixlctl's stand-in
// prefill and decode (serve prefill --side-channel, serve decode --http),
// which move real KV blocks over NIXL/UCX and check them; their stats say
// whether every block was read and checked, and their per-leg stamps
// (CLOCK_MONOTONIC, moved onto this process's clock) split each request's
// latency into the prefill leg, the KV handoff and the decode leg.
package proxybench

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nixlctl/nixlctl/internal/mono"
	"github.com/nixlctl/nixlctl/internal/report"
	"github.com/nixlctl/nixlctl/internal/standin"
	"github.com/nixlctl/nixlctl/internal/stats"
)

// Options configure a run. The CLI decodes its flags into them
// (mapstructure tags are the flag names, "-" is not a flag).
type Options struct {
	Proxy       string        `json:"proxy" mapstructure:"proxy"` // base URL
	Path        string        `json:"path" mapstructure:"path"`   // /v1/completions
	Requests    int           `json:"requests" mapstructure:"requests"`
	Concurrency int           `json:"concurrency" mapstructure:"concurrency"`
	ISL         int           `json:"isl" mapstructure:"isl"` // prompt tokens (token ids)
	MaxTokens   int           `json:"max_tokens" mapstructure:"max-tokens"`
	Model       string        `json:"model" mapstructure:"model"`
	Timeout     time.Duration `json:"timeout_ns" mapstructure:"timeout"`
	// Prefill and Decode are the stand-ins' base URLs (their --http):
	// their stats are checked and their stamps split the latency.
	Prefill []string `json:"prefill" mapstructure:"prefill"`
	Decode  []string `json:"decode" mapstructure:"decode"`
	// Settle bounds the wait, after the last answer, for the prefills to
	// free the blocks the decodes' notifications released.
	Settle time.Duration `json:"settle_ns" mapstructure:"settle"`
	Seed   uint64        `json:"seed" mapstructure:"seed"`
	// Headers go on every request (llm-d's routing sidecar picks the
	// prefill by x-prefiller-host-port). The CLI's --header is a list
	// of NAME:VALUE, parsed into this.
	Headers map[string]string `json:"headers,omitempty" mapstructure:"-"`
	Version string            `json:"-" mapstructure:"-"`
}

// Validate refuses options a run cannot use.
func (o Options) Validate() error {
	var errs []error
	if !strings.HasPrefix(o.Proxy, "http://") && !strings.HasPrefix(o.Proxy, "https://") {
		errs = append(errs, fmt.Errorf("--proxy %q: want an http:// or https:// URL", o.Proxy))
	}
	if o.Requests < 1 {
		errs = append(errs, fmt.Errorf("--requests %d: want 1 or more", o.Requests))
	}
	if o.Concurrency < 1 {
		errs = append(errs, fmt.Errorf("--concurrency %d: want 1 or more", o.Concurrency))
	}
	if o.ISL < 1 || o.ISL > 1<<20 {
		errs = append(errs, fmt.Errorf("--isl %d: want 1 to %d tokens", o.ISL, 1<<20))
	}
	if o.MaxTokens < 1 {
		errs = append(errs, fmt.Errorf("--max-tokens %d: want 1 or more", o.MaxTokens))
	}
	for _, u := range append(append([]string{}, o.Prefill...), o.Decode...) {
		if !strings.HasPrefix(u, "http://") && !strings.HasPrefix(u, "https://") {
			errs = append(errs, fmt.Errorf("stand-in %q: want an http:// URL (its --http)", u))
		}
	}
	return errors.Join(errs...)
}

// Record is one request as the client saw it, with the stand-ins' split
// where both legs' stamps were found.
type Record struct {
	Index           int     `json:"index"`
	RequestID       string  `json:"request_id"`
	RemoteRequestID string  `json:"remote_request_id,omitempty"`
	Status          int     `json:"status"`
	Error           string  `json:"error,omitempty"`
	E2EMS           float64 `json:"e2e_ms"`
	Blocks          int     `json:"blocks,omitempty"`
	// The split (stand-ins' stamps on this process's clock): the prefill
	// leg runs from sending to the prefill's answer, the KV handoff from
	// that answer to the decode's blocks read and checked (the proxy's
	// relay, the decode's handshake and READ), the decode leg from there
	// to the answer here. ReadMS is the decode's part of the handoff
	// (its arrival to the blocks checked).
	PrefillMS *float64 `json:"prefill_leg_ms,omitempty"`
	HandoffMS *float64 `json:"kv_handoff_ms,omitempty"`
	DecodeMS  *float64 `json:"decode_leg_ms,omitempty"`
	ReadMS    *float64 `json:"decode_read_ms,omitempty"`

	t0, t1 int64
}

// Dist is a latency distribution in milliseconds.
type Dist struct {
	Count int     `json:"count"`
	Mean  float64 `json:"mean"`
	P50   float64 `json:"p50"`
	P90   float64 `json:"p90"`
	P99   float64 `json:"p99"`
	Max   float64 `json:"max"`
}

func dist(xs []float64) Dist {
	if len(xs) == 0 {
		return Dist{}
	}
	var sum, mx float64
	for _, x := range xs {
		sum += x
		mx = max(mx, x)
	}
	return Dist{Count: len(xs), Mean: sum / float64(len(xs)), P50: stats.Quantile(xs, 0.5), P90: stats.Quantile(xs, 0.9),
		P99: stats.Quantile(xs, 0.99), Max: mx}
}

// StandIn is one stand-in's counters over the run (after less before).
type StandIn struct {
	URL      string `json:"url"`
	Role     string `json:"role"`
	Served   int64  `json:"served"`
	Rejected int64  `json:"rejected"`
	Failed   int64  `json:"failed"`
	// Decode: blocks read and checked, and those with wrong bytes.
	BlocksRead    int64 `json:"blocks_read,omitempty"`
	CorruptBlocks int64 `json:"corrupt_blocks,omitempty"`
	Handshakes    int64 `json:"handshakes,omitempty"`
	// Prefill: blocks still held after the settle wait (absolute).
	BlocksHeld int64 `json:"blocks_held"`
	// ClockOffsetMS: the stand-in's clock less this process's.
	ClockOffsetMS float64 `json:"clock_offset_ms"`
	Error         string  `json:"error,omitempty"`
}

// Summary is the run's outcome.
type Summary struct {
	Requests   int     `json:"requests"`
	OK         int     `json:"ok"`
	Failed     int     `json:"failed"`
	Seconds    float64 `json:"seconds"`
	Throughput float64 `json:"requests_per_s"`
	E2E        Dist    `json:"e2e_ms"`
	// Split: requests whose stamps were found in both legs.
	Split   int  `json:"split"`
	Prefill Dist `json:"prefill_leg_ms"`
	Handoff Dist `json:"kv_handoff_ms"`
	Decode  Dist `json:"decode_leg_ms"`
	Read    Dist `json:"decode_read_ms"`
	// BlocksChecked: blocks the decode stand-ins read and checked in the
	// run; BlocksExpected: those the prefill legs of the ok requests held.
	BlocksChecked  int64     `json:"blocks_checked"`
	BlocksExpected int64     `json:"blocks_expected"`
	StandIns       []StandIn `json:"stand_ins"`
	// Checks failed; empty when every request came back and every block
	// was read and checked with the right bytes.
	Problems []string `json:"problems"`
}

// Result is a run.
type Result struct {
	Meta    report.Meta `json:"meta"`
	Options Options     `json:"options"`
	Summary Summary     `json:"summary"`
	Records []Record    `json:"records"`
	// PerRequest prints every request in the table.
	PerRequest bool `json:"-"`
}

// Header implements report.Result.
func (r *Result) Header() *report.Meta { return &r.Meta }

// Metrics implements report.Result.
func (r *Result) Metrics() []report.Metric {
	s := r.Summary
	return []report.Metric{
		{Key: "e2e_ms.p50", Value: s.E2E.P50, Unit: "ms", Better: report.LowerIsBetter},
		{Key: "e2e_ms.p99", Value: s.E2E.P99, Unit: "ms", Better: report.LowerIsBetter},
		{Key: "kv_handoff_ms.p50", Value: s.Handoff.P50, Unit: "ms", Better: report.LowerIsBetter},
		{Key: "requests_per_s", Value: s.Throughput, Unit: "req/s", Better: report.HigherIsBetter},
		{Key: "failed", Value: float64(s.Failed), Better: report.LowerIsBetter},
	}
}

// Render implements report.Result: json and table.
func (r *Result) Render(w io.Writer, f report.Format) error {
	switch f {
	case report.FormatCSV, report.FormatMarkdown, report.FormatProm:
		return fmt.Errorf("%w: bench proxy writes json or table, not %s", report.ErrFormat, f)
	}
	return report.Write(w, f, r)
}

// WriteText is the table: the latencies of each stage, then the outcome.
func (r *Result) WriteText(w io.Writer) error {
	s, o := r.Summary, r.Options
	var b strings.Builder
	fmt.Fprintf(&b, "bench proxy: %d requests through %s%s (isl %d, max_tokens %d, concurrency %d, model %s)\n\n",
		s.Requests, o.Proxy, o.Path, o.ISL, o.MaxTokens, o.Concurrency, o.Model)
	fmt.Fprintf(&b, "  ok %d, failed %d in %.2f s: %.1f requests/s\n\n", s.OK, s.Failed, s.Seconds, s.Throughput)
	fmt.Fprintf(&b, "  %-22s %8s %8s %8s %8s %8s %6s\n", "latency (ms)", "mean", "p50", "p90", "p99", "max", "n")
	row := func(name string, d Dist) {
		fmt.Fprintf(&b, "  %-22s %8.2f %8.2f %8.2f %8.2f %8.2f %6d\n", name, d.Mean, d.P50, d.P90, d.P99, d.Max, d.Count)
	}
	row("end to end", s.E2E)
	if s.Split > 0 {
		row("prefill leg", s.Prefill)
		row("KV handoff", s.Handoff)
		row("  decode READ+check", s.Read)
		row("decode leg", s.Decode)
	} else {
		b.WriteString("  (no split: give --prefill and --decode, the stand-ins' --http URLs)\n")
	}
	b.WriteString("\n")
	for _, si := range s.StandIns {
		if si.Error != "" {
			fmt.Fprintf(&b, "  %s %s: %s\n", si.Role, si.URL, si.Error)
			continue
		}
		switch si.Role {
		case "prefill":
			fmt.Fprintf(&b, "  prefill %s: %d legs served, %d refused, %d failed, %d blocks held after the run (clock %+.3f ms)\n",
				si.URL, si.Served, si.Rejected, si.Failed, si.BlocksHeld, si.ClockOffsetMS)
		default:
			fmt.Fprintf(&b, "  decode  %s: %d legs served, %d refused, %d failed, %d blocks read and checked, %d corrupt, %d handshakes (clock %+.3f ms)\n",
				si.URL, si.Served, si.Rejected, si.Failed, si.BlocksRead, si.CorruptBlocks, si.Handshakes, si.ClockOffsetMS)
		}
	}
	if len(s.StandIns) > 0 {
		fmt.Fprintf(&b, "  blocks checked %d of %d the prefill legs held\n", s.BlocksChecked, s.BlocksExpected)
	}
	if r.PerRequest {
		fmt.Fprintf(&b, "\n  %5s %-24s %6s %9s %9s %9s %9s %6s\n", "#", "request", "status", "e2e", "prefill", "handoff", "decode", "blocks")
		for _, rec := range r.Records {
			fmt.Fprintf(&b, "  %5d %-24s %6d %9.3f %9s %9s %9s %6d\n", rec.Index, rec.RequestID, rec.Status, rec.E2EMS,
				opt(rec.PrefillMS), opt(rec.HandoffMS), opt(rec.DecodeMS), rec.Blocks)
		}
	}
	for _, w := range r.Meta.Warnings {
		fmt.Fprintf(&b, "\n  warning: %s\n", w)
	}
	switch {
	case len(s.Problems) == 0 && len(o.Decode) == 0:
		// Said "every block read and checked" with no decode asked.
		b.WriteString("\n  check: passed (every request answered; no --decode stand-in, so no block was checked)\n")
	case len(s.Problems) == 0:
		b.WriteString("\n  check: passed (every request answered, every block read and checked, none corrupt)\n")
	default:
		b.WriteString("\n  check: FAILED\n")
		for _, p := range s.Problems {
			fmt.Fprintf(&b, "    %s\n", p)
		}
	}
	_, err := io.WriteString(w, b.String())
	return err
}

func opt(x *float64) string {
	if x == nil {
		return "-"
	}
	return fmt.Sprintf("%.3f", *x)
}

// Run sends the requests and checks the stand-ins.
func Run(ctx context.Context, o Options) (*Result, error) {
	if err := o.Validate(); err != nil {
		return nil, err
	}
	if o.Path == "" {
		o.Path = "/v1/completions"
	}
	o.Proxy = strings.TrimRight(o.Proxy, "/")
	res := &Result{Meta: report.NewMeta("bench proxy", o.Version), Options: o}
	client := &http.Client{Timeout: o.Timeout, Transport: &http.Transport{MaxIdleConnsPerHost: o.Concurrency}}
	peers, err := contactStandIns(ctx, client, o)
	if err != nil {
		return nil, err
	}
	start := time.Now()
	recs := sendAll(ctx, client, o)
	res.Summary.Seconds = time.Since(start).Seconds()
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	splitLegs(ctx, client, res, peers, recs)
	res.Records = recs
	decodeServed := checkStandIns(ctx, client, o, &res.Summary, peers)
	s := &res.Summary
	if s.Failed > 0 {
		first := ""
		for _, r := range recs {
			if r.Error != "" {
				first = r.Error
				break
			}
		}
		s.Problems = append(s.Problems, fmt.Sprintf("%d of %d requests failed (first: %s)", s.Failed, s.Requests, first))
	}
	if len(o.Decode) > 0 {
		if decodeServed != int64(s.OK) {
			s.Problems = append(s.Problems, fmt.Sprintf("the decode stand-ins served %d legs for %d requests answered: the proxy answered some without a decode leg", decodeServed, s.OK))
		}
		if len(o.Prefill) > 0 && s.BlocksChecked != s.BlocksExpected {
			s.Problems = append(s.Problems, fmt.Sprintf("the decodes read and checked %d blocks, the prefill legs held %d", s.BlocksChecked, s.BlocksExpected))
		}
	} else {
		res.Meta.Warn("no --decode stand-in: nothing says the KV was read and checked")
	}
	if s.Problems == nil {
		s.Problems = []string{}
	}
	res.Meta.Finish()
	return res, nil
}

// standInPeer is one stand-in the run reads: its clock's offset from
// this process's and its counters before the run.
type standInPeer struct {
	url, role string
	off       int64
	before    statsDoc
}

// contactStandIns reads every stand-in's clock and counters before the
// run; one that does not answer ends it before a request is sent.
func contactStandIns(ctx context.Context, client *http.Client, o Options) ([]*standInPeer, error) {
	var peers []*standInPeer
	for _, u := range o.Prefill {
		peers = append(peers, &standInPeer{url: strings.TrimRight(u, "/"), role: "prefill"})
	}
	for _, u := range o.Decode {
		peers = append(peers, &standInPeer{url: strings.TrimRight(u, "/"), role: "decode"})
	}
	for _, p := range peers {
		var err error
		if p.off, err = clockOffset(ctx, client, p.url); err == nil {
			p.before, err = getStats(ctx, client, p.url)
		}
		if err != nil {
			return nil, fmt.Errorf("%s stand-in %s: %w", p.role, p.url, err)
		}
	}
	return peers, nil
}

// sendAll sends the run's requests through the proxy, o.Concurrency at a
// time, each with its own prompt of token ids (from o.Seed).
func sendAll(ctx context.Context, client *http.Client, o Options) []Record {
	run := fmt.Sprintf("%08x", rand.Uint32())
	rng := rand.New(rand.NewPCG(o.Seed, 0x6e69786c))
	prompts := make([][]int, o.Requests)
	for i := range prompts {
		ids := make([]int, o.ISL)
		for j := range ids {
			ids[j] = 1 + rng.IntN(32000)
		}
		prompts[i] = ids
	}
	recs := make([]Record, o.Requests)
	var next atomic.Int64
	var wg sync.WaitGroup
	for range o.Concurrency {
		wg.Go(func() {
			for {
				i := int(next.Add(1)) - 1
				if i >= o.Requests || ctx.Err() != nil {
					return
				}
				recs[i] = send(ctx, client, o, i, fmt.Sprintf("bench-%s-%d", run, i), prompts[i])
			}
		})
	}
	wg.Wait()
	return recs
}

// splitLegs joins each request with its prefill and decode legs (by
// remote_request_id, as the stand-ins logged them) and splits its time
// into prefill, handoff and decode, each leg's stamps moved onto this
// process's clock by its stand-in's offset.
func splitLegs(ctx context.Context, client *http.Client, res *Result, peers []*standInPeer, recs []Record) {
	type leg struct {
		s   standin.LegStamps
		off int64
	}
	pre, dec, byClientID := map[string]leg{}, map[string]leg{}, map[string]string{}
	for _, p := range peers {
		legs, err := getLegs(ctx, client, p.url)
		if err != nil {
			res.Meta.Warn(fmt.Sprintf("%s stand-in %s: its legs: %v", p.role, p.url, err))
			continue
		}
		m := pre
		if p.role == "decode" {
			m = dec
		}
		for _, l := range legs {
			m[l.RemoteRequestID] = leg{l, p.off}
			if p.role == "decode" && l.RequestID != "" {
				// A proxy that passes this client's X-Request-Id on
				// but rewrites the answer's body: join by that.
				byClientID[l.RequestID] = l.RemoteRequestID
			}
		}
	}
	s := &res.Summary
	s.Requests = len(recs)
	var e2e, pl, ho, dl, rd []float64
	for i := range recs {
		r := &recs[i]
		if r.Error != "" {
			s.Failed++
			continue
		}
		s.OK++
		e2e = append(e2e, r.E2EMS)
		if r.RemoteRequestID == "" {
			r.RemoteRequestID = byClientID[r.RequestID]
		}
		p, okP := pre[r.RemoteRequestID]
		d, okD := dec[r.RemoteRequestID]
		if okP {
			s.BlocksExpected += int64(p.s.Blocks)
		}
		if !okP || !okD {
			continue
		}
		pSent := p.s.TSent - p.off
		dReady := d.s.TReady - d.off
		ms := func(ns int64) *float64 { v := float64(ns) / 1e6; return &v }
		r.PrefillMS, r.HandoffMS, r.DecodeMS = ms(pSent-r.t0), ms(dReady-pSent), ms(r.t1-dReady)
		r.ReadMS = ms(d.s.TReady - d.s.TArrive)
		r.Blocks = d.s.Blocks
		s.Split++
		pl, ho, dl, rd = append(pl, *r.PrefillMS), append(ho, *r.HandoffMS), append(dl, *r.DecodeMS), append(rd, *r.ReadMS)
	}
	s.E2E, s.Prefill, s.Handoff, s.Decode, s.Read = dist(e2e), dist(pl), dist(ho), dist(dl), dist(rd)
	if s.Seconds > 0 {
		s.Throughput = float64(s.OK) / s.Seconds
	}
}

// checkStandIns reads the stand-ins' counters over the run into s and
// says what is wrong with them: the prefills' held blocks are read once
// the decodes' notifications have freed them (up to o.Settle). It
// returns the legs the decodes served.
func checkStandIns(ctx context.Context, client *http.Client, o Options, s *Summary, peers []*standInPeer) (decodeServed int64) {
	deadline := time.Now().Add(o.Settle)
	for _, p := range peers {
		si := StandIn{URL: p.url, Role: p.role, ClockOffsetMS: float64(p.off) / 1e6}
		after, err := getStats(ctx, client, p.url)
		for err == nil && p.role == "prefill" && after.Engine.BlocksInUse > p.before.Engine.BlocksInUse && time.Now().Before(deadline) {
			time.Sleep(20 * time.Millisecond)
			after, err = getStats(ctx, client, p.url)
		}
		if err != nil {
			si.Error = err.Error()
			s.Problems = append(s.Problems, fmt.Sprintf("%s stand-in %s: %v", p.role, p.url, err))
			s.StandIns = append(s.StandIns, si)
			continue
		}
		si.Served, si.Rejected, si.Failed = after.API.Served-p.before.API.Served, after.API.Rejected-p.before.API.Rejected, after.API.Failed-p.before.API.Failed
		si.BlocksHeld = after.Engine.BlocksInUse
		if p.role == "decode" {
			si.BlocksRead = after.API.BlocksRead - p.before.API.BlocksRead
			si.CorruptBlocks = after.API.CorruptBlocks - p.before.API.CorruptBlocks
			si.Handshakes = after.Engine.Handshakes - p.before.Engine.Handshakes
			s.BlocksChecked += si.BlocksRead
			decodeServed += si.Served
			if si.CorruptBlocks > 0 {
				s.Problems = append(s.Problems, fmt.Sprintf("decode %s: %d blocks read with wrong bytes", p.url, si.CorruptBlocks))
			}
		} else if si.BlocksHeld > p.before.Engine.BlocksInUse {
			s.Problems = append(s.Problems, fmt.Sprintf("prefill %s still holds %d blocks %v after the run (%d before): no completion notification freed them",
				p.url, si.BlocksHeld, o.Settle, p.before.Engine.BlocksInUse))
		}
		if si.Failed > 0 || si.Rejected > 0 {
			s.Problems = append(s.Problems, fmt.Sprintf("%s %s: %d legs failed, %d refused", p.role, p.url, si.Failed, si.Rejected))
		}
		s.StandIns = append(s.StandIns, si)
	}
	return decodeServed
}

func send(ctx context.Context, c *http.Client, o Options, i int, id string, prompt []int) Record {
	rec := Record{Index: i, RequestID: id}
	body, _ := json.Marshal(map[string]any{"model": o.Model, "prompt": prompt, "max_tokens": o.MaxTokens, "stream": false})
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, o.Proxy+o.Path, bytes.NewReader(body))
	if err != nil {
		rec.Error = err.Error()
		return rec
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-Request-Id", id)
	for k, v := range o.Headers {
		req.Header.Set(k, v)
	}
	rec.t0 = mono.Now()
	resp, err := c.Do(req)
	if err != nil {
		rec.Error = err.Error()
		return rec
	}
	b, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	rec.t1 = mono.Now()
	rec.Status = resp.StatusCode
	rec.E2EMS = float64(rec.t1-rec.t0) / 1e6
	if err != nil {
		rec.Error = err.Error()
		return rec
	}
	if resp.StatusCode != http.StatusOK {
		rec.Error = fmt.Sprintf("HTTP %d: %s", resp.StatusCode, bytes.TrimSpace(trunc(b, 300)))
		return rec
	}
	var ans struct {
		Choices []json.RawMessage  `json:"choices"`
		NixlCtl *standin.LegStamps `json:"nixlctl"`
	}
	if err := json.Unmarshal(b, &ans); err != nil || len(ans.Choices) == 0 {
		rec.Error = fmt.Sprintf("not a completion: %s", trunc(b, 300))
		return rec
	}
	if ans.NixlCtl != nil {
		rec.RemoteRequestID = ans.NixlCtl.RemoteRequestID
	}
	return rec
}

func trunc(b []byte, n int) []byte {
	if len(b) > n {
		return append(b[:n:n], "..."...)
	}
	return b
}

// statsDoc is what bench proxy reads of a stand-in's /nixlctl/stats.
type statsDoc struct {
	API struct {
		Served        int64 `json:"served"`
		Rejected      int64 `json:"rejected"`
		Failed        int64 `json:"failed"`
		BlocksRead    int64 `json:"blocks_read"`
		CorruptBlocks int64 `json:"corrupt_blocks"`
	} `json:"api"`
	Engine struct {
		Handshakes  int64 `json:"handshakes"`
		BlocksInUse int64 `json:"blocks_in_use"`
	} `json:"engine"`
	MonoNS int64 `json:"mono_ns"`
}

func getJSON(ctx context.Context, c *http.Client, url string, v any) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	resp, err := c.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET %s: HTTP %d (is it a nixlctl stand-in?)", url, resp.StatusCode)
	}
	return json.NewDecoder(resp.Body).Decode(v)
}

func getStats(ctx context.Context, c *http.Client, base string) (statsDoc, error) {
	var d statsDoc
	err := getJSON(ctx, c, base+"/nixlctl/stats", &d)
	return d, err
}

func getLegs(ctx context.Context, c *http.Client, base string) ([]standin.LegStamps, error) {
	var d struct {
		Legs []standin.LegStamps `json:"legs"`
	}
	err := getJSON(ctx, c, base+"/nixlctl/legs", &d)
	return d.Legs, err
}

// clockOffset estimates the stand-in's CLOCK_MONOTONIC less this
// process's from the quickest of a few stats round trips (the stand-in
// read its clock halfway through, within half that round trip). On one
// host it is about 0.
func clockOffset(ctx context.Context, c *http.Client, base string) (int64, error) {
	best, off := int64(-1), int64(0)
	for range 5 {
		t0 := mono.Now()
		d, err := getStats(ctx, c, base)
		t1 := mono.Now()
		if err != nil {
			return 0, err
		}
		if d.MonoNS == 0 {
			return 0, fmt.Errorf("%s/nixlctl/stats has no mono_ns: not a nixlctl stand-in, or an older one", base)
		}
		if rtt := t1 - t0; best < 0 || rtt < best {
			best, off = rtt, d.MonoNS-(t0+t1)/2
		}
	}
	return off, nil
}
