package probe

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"regexp"
	"sort"
	"strings"
	"time"

	"github.com/nixlctl/nixlctl/internal/kv"
	"github.com/nixlctl/nixlctl/internal/live"
	"github.com/nixlctl/nixlctl/internal/nixl"
	"github.com/nixlctl/nixlctl/internal/nixl/ucx"
	"github.com/nixlctl/nixlctl/internal/procfs"
	"github.com/nixlctl/nixlctl/internal/report"
)

// The variables of the default matrix: the two fixes for the UCX
// mmap-hook leak of the decode side (seed §5.4, vllm#24264 and the fixes
// that followed it).
const (
	HookModeVar         = "UCX_MEM_MMAP_HOOK_MODE"
	RcacheUnreleasedVar = "UCX_RCACHE_MAX_UNRELEASED"
)

// EnvAxis is one variable the matrix varies. The value "" is the library
// default: the variable is removed from the peers' environment.
type EnvAxis struct {
	Key    string   `json:"key"`
	Values []string `json:"values"`
}

func (a EnvAxis) String() string {
	vals := make([]string, len(a.Values))
	for i, v := range a.Values {
		vals[i] = valueLabel(v)
	}
	sep := ","
	for _, v := range a.Values {
		if strings.Contains(v, ",") {
			sep = "|"
		}
	}
	return a.Key + "=" + strings.Join(vals, sep)
}

func valueLabel(v string) string {
	if v == "" {
		return "default"
	}
	return v
}

var envKey = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)

// ParseEnvAxis parses "KEY=V1,V2". Values that contain commas themselves
// (UCX_TLS=tcp,self) are separated with '|' instead: "UCX_TLS=tcp,self|all".
// The value "default" stands for the variable unset.
func ParseEnvAxis(s string) (EnvAxis, error) {
	k, v, ok := strings.Cut(s, "=")
	if !ok {
		return EnvAxis{}, fmt.Errorf("--env %q: want KEY=VALUE[,VALUE...]", s)
	}
	k = strings.TrimSpace(k)
	if !envKey.MatchString(k) {
		return EnvAxis{}, fmt.Errorf("--env %q: %q is not a variable name", s, k)
	}
	sep := ","
	if strings.Contains(v, "|") {
		sep = "|"
	}
	a := EnvAxis{Key: k}
	seen := map[string]bool{}
	for _, val := range strings.Split(v, sep) {
		val = strings.TrimSpace(val)
		if val == "" {
			return EnvAxis{}, fmt.Errorf("--env %q: empty value (use \"default\" for the variable unset)", s)
		}
		if val == "default" {
			val = ""
		}
		if !seen[val] {
			seen[val] = true
			a.Values = append(a.Values, val)
		}
	}
	return a, nil
}

// LeakOptions configure `probe ucx-leak`.
type LeakOptions struct {
	Backends   []string  // ucx, nixl (a backend not built in or unavailable is skipped)
	Axes       []EnvAxis // added to (or replacing) the default matrix's
	Duration   time.Duration
	Interval   time.Duration
	Thresholds Thresholds

	Spec   kv.Spec // the model whose KV blocks are moved
	Tokens int     // per request
	Rate   float64 // requests per second (0: back to back)

	Churn            ChurnConfig
	ProgressInterval time.Duration // pace the receiver's UCX progress (ucx backend)
	// SelfTestLeakMBPerS makes the receiver leak on purpose (tests, and
	// a user checking that the probe can see a leak at all).
	SelfTestLeakMBPerS float64

	Peer    PeerSpec
	Version string
	Log     *slog.Logger
	// Progress receives one line per sample and one per configuration.
	Progress io.Writer
	// Live receives a Start, an RSS Gauge per sample and a Fit and a
	// Point per configuration (the live view's RSS lines and slopes).
	Live live.Sink
	// PeerStderr receives the peers' standard error (nil: kept for errors).
	PeerStderr io.Writer
}

// Limits that keep a mistyped flag from starting something absurd.
const (
	maxConfigs   = 64
	maxPoolBytes = 2 << 30
	maxLeakRate  = 1e6 // requests per second; 0 is back to back, the fastest
)

// Validate checks the options.
func (o *LeakOptions) Validate() error {
	var errs []error
	bad := func(format string, a ...any) { errs = append(errs, fmt.Errorf(format, a...)) }
	if o.Interval <= 0 {
		bad("--interval must be > 0 (got %v)", o.Interval)
	}
	if o.Duration <= 0 {
		bad("--duration must be > 0 (got %v)", o.Duration)
	} else if o.Interval > 0 && o.Interval > o.Duration {
		bad("--interval %v is longer than --duration %v", o.Interval, o.Duration)
	}
	if w := o.Thresholds.WarmupS; w < 0 || (o.Duration > 0 && w >= o.Duration.Seconds()) {
		bad("--warmup-time %gs must be >= 0 and shorter than --duration %v", w, o.Duration)
	}
	// A rate too slow for one request in --duration measured nothing
	// (1e-30: an interval past a Duration's range), after the peers had
	// been started.
	if o.Rate < 0 || o.Rate > maxLeakRate {
		bad("--rate %g must be between 0 (back to back) and %g requests per second", o.Rate, float64(maxLeakRate))
	} else if o.Rate > 0 && o.Duration > 0 && o.Rate*o.Duration.Seconds() < 1 {
		bad("--rate %g: less than one request in --duration %v (0: back to back)", o.Rate, o.Duration)
	}
	if o.Tokens <= 0 || o.Tokens > kv.MaxTokens {
		bad("--isl must be between 1 and %d", kv.MaxTokens)
	}
	if o.ProgressInterval < 0 || o.ProgressInterval > time.Minute {
		bad("--progress-interval must be between 0 and 1m")
	}
	// The receiver really leaks it: what --duration of it comes to must
	// fit in the host's memory, or the self-test exhausts the host.
	if o.SelfTestLeakMBPerS < 0 {
		bad("--self-test-leak must be >= 0")
	} else if o.SelfTestLeakMBPerS > 0 && o.Duration > 0 {
		total := o.SelfTestLeakMBPerS * o.Duration.Seconds() * (1 << 20)
		if m, err := procfs.ReadMemInfo(); err == nil && m.AvailableBytes > 0 && total > float64(m.AvailableBytes)/2 {
			bad("--self-test-leak %g MB/s over --duration %v leaks %.3g GB; at most half of the %.3g GB of memory available",
				o.SelfTestLeakMBPerS, o.Duration, total/1e9, float64(m.AvailableBytes)/1e9)
		}
	}
	if err := o.Churn.Validate(); err != nil {
		errs = append(errs, err)
	}
	if len(o.Backends) == 0 {
		bad("no backend to probe")
	}
	for _, b := range o.Backends {
		if _, ok := nixl.Lookup(b); !ok && b != "nixl" {
			bad("unknown backend %q (want ucx or nixl)", b)
		}
	}
	keys := map[string]bool{}
	for _, a := range o.Axes {
		if keys[a.Key] {
			bad("--env %s given twice", a.Key)
		}
		keys[a.Key] = true
	}
	return errors.Join(errs...)
}

// LeakResult is the whole probe.
type LeakResult struct {
	report.Meta
	Config         LeakConfig     `json:"config"`
	Thresholds     Thresholds     `json:"thresholds"`
	Configs        []ConfigResult `json:"configs"`
	Recommendation string         `json:"recommendation"`
	Notes          []string       `json:"notes"`
	Interrupted    bool           `json:"interrupted,omitempty"`
}

// LeakConfig echoes what ran, so a result describes itself.
type LeakConfig struct {
	Backends              []string          `json:"backends"`
	Matrix                []EnvAxis         `json:"matrix"` // values as set; "default" = unset
	LibraryDefaults       map[string]string `json:"library_defaults,omitempty"`
	DurationS             float64           `json:"duration_s"`
	IntervalS             float64           `json:"interval_s"`
	Model                 string            `json:"model"`
	Tokens                int               `json:"tokens"`
	BlockSize             int               `json:"block_size"`
	DescriptorsPerRequest int               `json:"descriptors_per_request"`
	BytesPerRequest       int64             `json:"bytes_per_request"`
	PoolBytes             int64             `json:"pool_bytes"`
	Rate                  float64           `json:"rate"`
	Churn                 ChurnConfig       `json:"churn"`
	ProgressInterval      string            `json:"progress_interval,omitempty"`
	SelfTestLeakMBPerS    float64           `json:"self_test_leak_mb_per_s,omitempty"`
	UCXLibrary            string            `json:"ucx_library"`
	RcacheVarKnown        bool              `json:"rcache_max_unreleased_known"`
}

// ConfigResult is one configuration of the matrix.
type ConfigResult struct {
	Backend        string            `json:"backend"`
	BackendVersion string            `json:"backend_version,omitempty"`
	Env            map[string]string `json:"env"` // UCX variables set; a matrix variable absent here was unset (library default)
	Label          string            `json:"label"`
	Verdict        string            `json:"verdict"`
	Reason         string            `json:"reason"`
	SlopeMBPerMin  float64           `json:"slope_mb_per_min"`
	R2             float64           `json:"r2"`
	GrowthMB       float64           `json:"growth_mb"` // RSS, last minus first sample after the warm-up
	RSSFit         Fit               `json:"rss_fit"`
	VmDataGrowthMB float64           `json:"vmdata_growth_mb"`
	MapsGrowth     int               `json:"maps_growth"`
	FDsGrowth      int               `json:"fds_growth"`
	Transport      string            `json:"transport,omitempty"`
	Sender         PeerStats         `json:"sender"`
	Receiver       PeerStats         `json:"receiver"`
	ReceiverPID    int               `json:"receiver_pid,omitempty"`
	Samples        []Sample          `json:"samples"`
	Error          string            `json:"error,omitempty"`
	Interrupted    bool              `json:"interrupted,omitempty"`
}

// KVShape lays out one rank's KV pool for spec, with room for two
// requests of tokens tokens (so consecutive block tables differ).
func KVShape(spec kv.Spec, tokens int) (Shape, error) {
	spec, err := spec.Normalize()
	if err != nil {
		return Shape{}, err
	}
	rank := spec.Rank(0, 0)
	var s Shape
	maxReq := 0
	for _, reg := range rank.Regions {
		maxReq = max(maxReq, spec.BlocksFor(reg.Kind, tokens))
	}
	s.PoolBlocks = max(2*maxReq, 1)
	for _, reg := range rank.Regions {
		s.Regions = append(s.Regions, RegionShape{Offset: s.PoolBytes, BlockBytes: reg.BlockBytes, ReqBlocks: spec.BlocksFor(reg.Kind, tokens)})
		s.PoolBytes += reg.BlockBytes * int64(s.PoolBlocks)
	}
	if s.PoolBytes > maxPoolBytes {
		return Shape{}, fmt.Errorf("%s with %d tokens needs a %s pool per side (limit %s): use fewer --isl tokens or a smaller --model",
			spec.Model.Name, tokens, report.Bytes(s.PoolBytes), report.Bytes(maxPoolBytes))
	}
	return s, nil
}

// leakConfig is one point of the matrix before it runs.
type leakConfig struct {
	backend string
	set     map[string]string // variables to set (others of the matrix are unset)
	label   string
}

// matrix builds the configurations: the default axes (hook mode; max
// unreleased where the library knows it), the user's axes replacing or
// adding, every combination for every backend.
func matrix(backends []string, axes []EnvAxis) ([]EnvAxis, []leakConfig) {
	var all []EnvAxis
	all = append(all, axes...)
	combos := []map[string]string{{}}
	for _, a := range all {
		var next []map[string]string
		for _, c := range combos {
			for _, v := range a.Values {
				m := map[string]string{}
				for k, x := range c {
					m[k] = x
				}
				if v != "" {
					m[a.Key] = v
				}
				next = append(next, m)
			}
		}
		combos = next
	}
	var out []leakConfig
	for _, b := range backends {
		for _, c := range combos {
			out = append(out, leakConfig{backend: b, set: c, label: labelOf(all, c)})
		}
	}
	return all, out
}

func labelOf(axes []EnvAxis, set map[string]string) string {
	var parts []string
	for _, a := range axes {
		parts = append(parts, a.Key+"="+valueLabel(set[a.Key]))
	}
	return strings.Join(parts, " ")
}

// childEnv is the environment of one configuration's peers: ours, minus
// every variable the matrix varies (and the pacing knob), plus the
// configuration's values.
func childEnv(axes []EnvAxis, set map[string]string, extra ...string) []string {
	drop := map[string]bool{ucx.ProgressIntervalEnv: true}
	for _, a := range axes {
		drop[a.Key] = true
	}
	var env []string
	for _, kv := range os.Environ() {
		k, _, _ := strings.Cut(kv, "=")
		if !drop[k] {
			env = append(env, kv)
		}
	}
	keys := make([]string, 0, len(set))
	for k := range set {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		env = append(env, k+"="+set[k])
	}
	return append(env, extra...)
}

// RunUCXLeak runs the matrix. When ctx is cancelled it returns what was
// measured so far (Interrupted set) along with ctx's error.
func RunUCXLeak(ctx context.Context, o LeakOptions) (*LeakResult, error) {
	if o.Log == nil {
		o.Log = slog.New(slog.DiscardHandler)
	}
	if err := o.Validate(); err != nil {
		return nil, err
	}
	shape, err := KVShape(o.Spec, o.Tokens)
	if err != nil {
		return nil, err
	}
	spec, _ := o.Spec.Normalize()
	res := &LeakResult{Meta: report.NewMeta("probe ucx-leak", o.Version), Thresholds: o.Thresholds, Notes: []string{}}
	descs, bytes := shape.perRequest()
	res.Config = LeakConfig{Backends: o.Backends, DurationS: o.Duration.Seconds(), IntervalS: o.Interval.Seconds(),
		Model: spec.Model.Name, Tokens: o.Tokens, BlockSize: spec.BlockSize, DescriptorsPerRequest: descs, BytesPerRequest: bytes,
		PoolBytes: shape.PoolBytes, Rate: o.Rate, Churn: o.Churn, SelfTestLeakMBPerS: o.SelfTestLeakMBPerS, UCXLibrary: UCXLibraryVersion()}
	if o.ProgressInterval > 0 {
		res.Config.ProgressInterval = o.ProgressInterval.String()
	}
	res.Env.UCX = res.Config.UCXLibrary

	// The default matrix, then the user's axes replacing or adding.
	axes := []EnvAxis{{Key: HookModeVar, Values: []string{"", "none"}}}
	known, readable := UCXKnows(RcacheUnreleasedVar)
	res.Config.RcacheVarKnown = known
	if known {
		axes = append(axes, EnvAxis{Key: RcacheUnreleasedVar, Values: []string{"", "1024"}})
	} else {
		why := "does not know it (it is not among the variables ucp_config_print lists), so setting it would change nothing"
		if !readable {
			why = "could not be asked (it refused this environment's UCX_* settings)"
		}
		res.Warn(fmt.Sprintf("%s left out of the matrix: libucp %s, the UCX library this process loaded, %s",
			RcacheUnreleasedVar, res.Config.UCXLibrary, why))
		res.Notes = append(res.Notes, fmt.Sprintf("%s is unknown to libucp %s: the matrix varies %s only; use a newer UCX (or --env) to test the second fix.",
			RcacheUnreleasedVar, res.Config.UCXLibrary, HookModeVar))
	}
	for _, ua := range o.Axes {
		replaced := false
		for i := range axes {
			if axes[i].Key == ua.Key {
				axes[i], replaced = ua, true
			}
		}
		if !replaced {
			axes = append(axes, ua)
		}
	}
	axes, configs := matrix(o.Backends, axes)
	if len(configs) > maxConfigs {
		return nil, fmt.Errorf("the matrix has %d configurations (limit %d): fewer --env values or backends", len(configs), maxConfigs)
	}
	for _, a := range axes {
		labels := make([]string, len(a.Values))
		for i, v := range a.Values {
			labels[i] = valueLabel(v)
		}
		res.Config.Matrix = append(res.Config.Matrix, EnvAxis{Key: a.Key, Values: labels})
		if v, ok := os.LookupEnv(a.Key); ok {
			res.Warn(fmt.Sprintf("your environment sets %s=%s; each configuration sets or unsets it itself", a.Key, v))
		}
	}
	res.Config.LibraryDefaults = libraryDefaults(axes)

	// A backend that cannot run here gets one SKIPPED row, in its place,
	// not one per configuration.
	skip := map[string]string{}
	runnable := 0
	for _, b := range o.Backends {
		if skip[b] = backendUnusable(b); skip[b] != "" && o.Progress != nil {
			fmt.Fprintf(o.Progress, "[%s] %s: %s\n", b, Skipped, skip[b])
		}
	}
	for _, c := range configs {
		if skip[c.backend] == "" {
			runnable++
		}
	}
	live.Emit(o.Live, live.Start{Title: "probe ucx-leak", Total: runnable, Unit: "configurations"})
	var transports []string
	done, n := map[string]bool{}, 0
	for _, c := range configs {
		if ctx.Err() != nil {
			break
		}
		if why := skip[c.backend]; why != "" {
			if !done[c.backend] {
				done[c.backend] = true
				res.Configs = append(res.Configs, ConfigResult{Backend: c.backend, Label: "(every configuration)", Env: map[string]string{},
					Verdict: Skipped, Reason: why, Samples: []Sample{}})
			}
			continue
		}
		n++
		cr := runConfig(ctx, &o, shape, axes, c, fmt.Sprintf("[%d/%d %s %s]", n, runnable, c.backend, c.label))
		res.Configs = append(res.Configs, cr)
		if cr.Transport != "" {
			transports = append(transports, cr.Transport)
		}
		if cr.BackendVersion != "" {
			switch cr.Backend {
			case "nixl":
				res.Env.NIXL = cr.BackendVersion
			case "ucx":
				res.Env.BackendVersion = cr.BackendVersion
			}
		}
		if cr.Sender.Errors > 0 {
			res.Warn(fmt.Sprintf("%s %s: the sender saw %d failed transfers (last: %s)", cr.Backend, cr.Label, cr.Sender.Errors, cr.Sender.LastError))
		}
		if cr.Receiver.ChurnFailed > 0 {
			res.Warn(fmt.Sprintf("%s %s: %d churn allocations failed", cr.Backend, cr.Label, cr.Receiver.ChurnFailed))
		}
	}
	var used []string
	for _, c := range res.Configs {
		if c.Verdict != Skipped && !contains(used, c.Backend) {
			used = append(used, c.Backend)
		}
	}
	res.Env.Backend = strings.Join(used, ",")
	if len(transports) > 0 && allSame(transports) {
		res.Env.Transport = transports[0]
	}
	res.Notes = append(res.Notes, leakNotes(&o, res, transports)...)
	res.Recommendation = recommend(res.Configs)
	if o.SelfTestLeakMBPerS > 0 {
		res.Recommendation = selfTestVerdict(res.Configs, o.SelfTestLeakMBPerS*60)
	}
	res.Finish()
	if err := ctx.Err(); err != nil {
		res.Interrupted = true
		res.Warn("interrupted: the matrix stopped early; the last configuration's verdict covers only what was sampled")
		return res, err
	}
	return res, nil
}

func contains(xs []string, s string) bool {
	for _, x := range xs {
		if x == s {
			return true
		}
	}
	return false
}

func allSame(xs []string) bool {
	for _, x := range xs {
		if x != xs[0] {
			return false
		}
	}
	return true
}

// libraryDefaults asks ucx_info -c for the defaults of the matrix's
// variables, when ucx_info is the same UCX version as the library this
// process loaded (another UCX's defaults would mislead).
func libraryDefaults(axes []EnvAxis) map[string]string {
	path, _, match := FindUCXInfo()
	if !match {
		return nil
	}
	cmd := exec.Command(path, "-c", "-a")
	cmd.Env = childEnv(axes, nil)
	c, err := cmd.Output()
	if err != nil {
		return nil
	}
	cfg := ParseUCXConfig(string(c))
	out := map[string]string{}
	for _, a := range axes {
		if v, ok := cfg[a.Key]; ok {
			out[a.Key] = v
		}
	}
	return out
}

// backendUnusable says why a backend cannot run here ("" if it can).
func backendUnusable(name string) string {
	b, ok := nixl.Lookup(name)
	if !ok {
		return fmt.Sprintf("backend %s is not built into this nixlctl", name)
	}
	if ok, why := b.Available(); !ok {
		return fmt.Sprintf("backend %s unavailable: %s", name, why)
	}
	return ""
}

// runConfig runs one configuration in fresh processes and judges it.
func runConfig(ctx context.Context, o *LeakOptions, shape Shape, axes []EnvAxis, c leakConfig, tag string) ConfigResult {
	cr := ConfigResult{Backend: c.backend, Env: c.set, Label: c.label, Samples: []Sample{}}
	progress := func(format string, a ...any) {
		if o.Progress != nil {
			fmt.Fprintf(o.Progress, "%s "+format+"\n", append([]any{tag}, a...)...)
		}
		live.Emit(o.Live, live.Phase{Text: cr.Series() + ": " + fmt.Sprintf(format, a...)})
	}
	defer func() {
		live.Emit(o.Live, live.Point{Label: cr.Series(), OK: cr.Verdict != Failed})
	}()
	if b, ok := nixl.Lookup(c.backend); ok {
		cr.BackendVersion = b.Version()
	}
	fail := func(err error) ConfigResult {
		if ctx.Err() != nil {
			cr.Interrupted = true
		}
		cr.Verdict, cr.Error = Failed, err.Error()
		cr.Reason = "the configuration did not run to the end: " + err.Error()
		progress("%s: %v", Failed, err)
		return cr
	}
	var recvExtra []string
	if o.ProgressInterval > 0 && c.backend == "ucx" {
		recvExtra = append(recvExtra, ucx.ProgressIntervalEnv+"="+o.ProgressInterval.String())
	}
	recv, err := startPeer(ctx, "receiver", o.Peer, childEnv(axes, c.set, recvExtra...), o.PeerStderr)
	if err != nil {
		return fail(err)
	}
	defer recv.Close()
	send, err := startPeer(ctx, "sender", o.Peer, childEnv(axes, c.set), o.PeerStderr)
	if err != nil {
		return fail(err)
	}
	defer send.Close()
	rrep, err := connectPeers(recv, send,
		PeerRequest{Backend: c.backend, Name: "leak-receiver", Shape: &shape, Churn: o.Churn, LeakMBPerS: o.SelfTestLeakMBPerS, Seed: 1},
		PeerRequest{Backend: c.backend, Name: "leak-sender", Shape: &shape, Seed: 2})
	cr.ReceiverPID = rrep.PID
	if err != nil {
		return fail(err)
	}
	if info, err := send.Call(PeerRequest{Op: "info"}); err == nil {
		cr.Transport = info.Transport
	}
	if _, err := send.Call(PeerRequest{Op: "start", RemoteAddr: rrep.Addr, Rate: o.Rate, Seed: 3}); err != nil {
		return fail(err)
	}
	progress("receiver pid %d, sender pid %d, transport: %s", recv.PID(), send.PID(), cr.Transport)

	// Sample the receiver; a stats call per sample shows the transfers
	// are really flowing.
	stop := make(chan struct{})
	defer context.AfterFunc(ctx, func() { close(stop) })()
	var lastSent *PeerStats // the sender's last stats, in case it dies before "stop" (Ctrl-C reaches it too)
	samples, serr := NewSampler(recv.PID(), o.Interval).Run(o.Duration, stop, func(s Sample) {
		live.Emit(o.Live, live.Gauge{Series: cr.Series(), At: time.Duration(s.T * float64(time.Second)), Value: float64(s.RSS) / MB, Unit: "MB"})
		st, err := send.Call(PeerRequest{Op: "stats"})
		reqs := "?"
		if err == nil {
			reqs = fmt.Sprintf("%d", st.Stats.Requests)
			ps := st.Stats
			lastSent = &ps
		}
		progress("%5.1fs rss %s vmdata %s maps %d fds %d, %s requests sent", s.T,
			mb(float64(s.RSS)), mb(float64(s.VmData)), s.Maps, s.FDs, reqs)
	})
	cr.Samples = append(cr.Samples, samples...)
	if st, err := send.Call(PeerRequest{Op: "stop"}); err == nil {
		cr.Sender = st.Stats
	} else if lastSent != nil {
		cr.Sender = *lastSent
	}
	if st, err := recv.Call(PeerRequest{Op: "stats"}); err == nil {
		cr.Receiver = st.Stats
	}
	judge(&cr, o.Thresholds)
	live.Emit(o.Live, live.Fit{Series: cr.Series(), Slope: cr.SlopeMBPerMin, Unit: "MB/min", R2: cr.R2})
	if ctx.Err() != nil {
		cr.Interrupted = true
		cr.Reason = fmt.Sprintf("interrupted after %d samples; %s", len(samples), cr.Reason)
	}
	if serr != nil && ctx.Err() == nil {
		err := fmt.Errorf("%w (receiver: %s)", serr, recv.err.lastLine())
		out := fail(err)
		return out
	}
	if cr.Sender.Requests == 0 && ctx.Err() == nil {
		cr.Verdict = Inconclusive
		cr.Reason = "no transfer completed, so the receiver saw no KV traffic: " + cr.Sender.LastError
	}
	progress("%s: %s", cr.Verdict, cr.Reason)
	return cr
}

func mb(bytes float64) string { return fmt.Sprintf("%.1f MB", bytes/MB) }

// judge fits the samples and sets the verdict.
func judge(cr *ConfigResult, th Thresholds) {
	f := FitRSS(cr.Samples, th.WarmupS)
	cr.RSSFit = f
	cr.SlopeMBPerMin, cr.R2, cr.GrowthMB = f.Slope, f.R2, f.Growth
	cr.Verdict, cr.Reason = th.Verdict(f)
	var first, last *Sample
	for i := range cr.Samples {
		if cr.Samples[i].T >= th.WarmupS {
			if first == nil {
				first = &cr.Samples[i]
			}
			last = &cr.Samples[i]
		}
	}
	if first != nil {
		cr.VmDataGrowthMB = float64(last.VmData-first.VmData) / MB
		cr.MapsGrowth = last.Maps - first.Maps
		cr.FDsGrowth = last.FDs - first.FDs
	}
}

// rdmaTransport tells RDMA transports (whose memory registration goes
// through UCX's registration cache) from the rest.
var rdmaTransport = regexp.MustCompile(`\b(rc|rc_verbs|rc_mlx5|dc|dc_mlx5|ud|ud_verbs|ud_mlx5|ib|efa|srd|gga|mlx5_\d+)\b`)

func leakNotes(o *LeakOptions, res *LeakResult, transports []string) []string {
	th := o.Thresholds
	notes := []string{
		fmt.Sprintf("Each configuration ran in a fresh receiver (decode-like: a registered %s KV pool, notifications drained, %g mmap/munmap replacements a second of %s..%s made through libc) and a fresh sender (prefill-like: %d-descriptor WRITEs of %s, %s a second, each with a notification).",
			report.Bytes(res.Config.PoolBytes), o.Churn.Rate, report.Bytes(o.Churn.Min), report.Bytes(o.Churn.Max),
			res.Config.DescriptorsPerRequest, report.Bytes(res.Config.BytesPerRequest), rateLabel(o.Rate)),
		fmt.Sprintf("RSS, VmData, mappings and fds are the receiver's, sampled every %v for %v; samples before %gs are warm-up and not fitted. MB = 10^6 bytes.",
			o.Interval, o.Duration, th.WarmupS),
		fmt.Sprintf("Verdicts: LEAK if the RSS slope is >= %g MB/min with R² >= %g and both halves of the window grow >= %g MB/min; STABLE if the slope is < %g MB/min and the fitted growth < %g MB; else INCONCLUSIVE (run longer). STABLE means no growth this run could resolve, not none at all.",
			th.LeakSlope, th.LeakR2, th.LeakSlope/2, th.StableSlope, th.StableGrowth),
	}
	if len(res.Config.LibraryDefaults) > 0 {
		var d []string
		for k, v := range res.Config.LibraryDefaults {
			d = append(d, k+"="+v)
		}
		sort.Strings(d)
		notes = append(notes, fmt.Sprintf("\"default\" is the library's own value (ucx_info -c of the same UCX %s): %s.", res.Config.UCXLibrary, strings.Join(d, ", ")))
	}
	if o.ProgressInterval > 0 {
		notes = append(notes, fmt.Sprintf("The receiver's UCX worker was progressed only every %v (%s=%v), starving UCX of progress on purpose; this applies to the ucx backend only (NIXL runs its own progress thread).",
			o.ProgressInterval, ucx.ProgressIntervalEnv, o.ProgressInterval))
	}
	if o.SelfTestLeakMBPerS > 0 {
		notes = append(notes, fmt.Sprintf("Self-test: the receiver also leaked %g MB a second on purpose; every configuration should say LEAK at about %g MB/min.",
			o.SelfTestLeakMBPerS, o.SelfTestLeakMBPerS*60))
	}
	rdma := false
	for _, t := range transports {
		rdma = rdma || rdmaTransport.MatchString(t)
	}
	if len(transports) > 0 && !rdma {
		notes = append(notes, "No RDMA transport carried these transfers (see the transport lines). UCX's registration cache, whose invalidation queue grows in the known decode-side leak, belongs to RDMA memory domains (InfiniBand/RoCE): a STABLE here does not clear a node that moves KV over RDMA. Run the probe there.")
	}
	return notes
}

func rateLabel(r float64) string {
	if r == 0 {
		return "back to back"
	}
	return fmt.Sprintf("%g", r)
}

// selfTestVerdict replaces the advice when the receiver leaked on
// purpose: did the probe see the leak, at about its rate?
func selfTestVerdict(cs []ConfigResult, want float64) string {
	var seen, missed []string
	for _, c := range cs {
		if c.Verdict == Skipped || c.Verdict == Failed {
			continue
		}
		name := fmt.Sprintf("%s %s (%s, %.3g MB/min)", c.Backend, c.Label, c.Verdict, c.SlopeMBPerMin)
		if c.Verdict == Leak && c.SlopeMBPerMin > 0.75*want && c.SlopeMBPerMin < 1.25*want {
			seen = append(seen, name)
		} else {
			missed = append(missed, name)
		}
	}
	msg := fmt.Sprintf("Self-test: the receiver leaked %.3g MB/min on purpose. ", want)
	switch {
	case len(seen)+len(missed) == 0:
		return msg + "No configuration ran to the end."
	case len(missed) == 0:
		return msg + "The probe saw it in every configuration, within 25%: " + strings.Join(seen, "; ") + "."
	}
	return msg + "The probe MISSED it (not LEAK within 25% of that rate) in: " + strings.Join(missed, "; ") + ". Check the host's load, or run longer."
}

// recommend turns the verdicts into advice, naming the stable settings.
func recommend(cs []ConfigResult) string {
	var stable, leak, unsure []string
	defaultLeaked, defaultStable := false, false
	for _, c := range cs {
		name := c.Backend + " " + c.Label
		isDefault := len(c.Env) == 0
		switch c.Verdict {
		case Stable:
			stable = append(stable, name)
			defaultStable = defaultStable || isDefault
		case Leak:
			leak = append(leak, name)
			defaultLeaked = defaultLeaked || isDefault
		case Inconclusive:
			unsure = append(unsure, name)
		}
	}
	var b strings.Builder
	switch {
	case len(stable)+len(leak)+len(unsure) == 0:
		return "No configuration ran to the end; see the errors and skipped backends above."
	case len(leak) == 0 && len(unsure) == 0:
		fmt.Fprintf(&b, "No leak here: every configuration was stable (%s).", strings.Join(stable, "; "))
		if defaultStable {
			b.WriteString(" The library defaults need no workaround for this workload on this host.")
		}
	case len(leak) > 0 && len(stable) > 0:
		fmt.Fprintf(&b, "Leaked: %s. Stable: %s. Set the stable configuration's variables in the decode engine's environment before it loads UCX/NIXL (for vLLM, before importing nixl).",
			strings.Join(leak, "; "), strings.Join(stable, "; "))
	case len(leak) > 0:
		fmt.Fprintf(&b, "Leaked: %s. No configuration was stable; try more settings with --env (e.g. --env UCX_TLS=...) or a longer --duration.", strings.Join(leak, "; "))
	default:
		if len(stable) > 0 {
			fmt.Fprintf(&b, "Stable: %s. ", strings.Join(stable, "; "))
		}
		fmt.Fprintf(&b, "Inconclusive: %s: run longer (--duration 10m) before concluding.", strings.Join(unsure, "; "))
	}
	if len(leak) > 0 && len(unsure) > 0 && len(stable) > 0 {
		fmt.Fprintf(&b, " Inconclusive: %s.", strings.Join(unsure, "; "))
	}
	if defaultLeaked && len(stable) > 0 {
		b.WriteString(" The library defaults leaked: do not run the decode side with them.")
	}
	return b.String()
}
