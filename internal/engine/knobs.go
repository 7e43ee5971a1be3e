package engine

import (
	"cmp"
	"reflect"
	"slices"
	"strings"
	"time"

	"github.com/nixlctl/nixlctl/internal/lease"
	"github.com/nixlctl/nixlctl/internal/runcore"
)

// Knobs are the engine settings a user sets for a handoff run, the same
// for every endpoint of the run. This struct is their one declaration:
// `bench pull|push|sglang` embeds it in its options (the mapstructure tag
// is the flag's name, help its help, DefaultKnobs its default), Config
// embeds it (what the endpoints run with), and the result embeds it (the
// echo, JSON names as tagged; Echo clears what a protocol does not use).
// A new knob is a field here, with its check in Validate, the code that
// uses it, and its docs.
//
// A field tagged protocols:"..." only matters to those protocols: Validate
// settles it for them alone and Echo leaves it out of other results.
type Knobs struct {
	// PrefillPerToken models prefill compute time.
	PrefillPerToken runcore.Duration `mapstructure:"prefill-time" json:"prefill_time_per_token" help:"modelled prefill compute per token (e.g. 20us)"`
	// Lease is how long prefill keeps a finished request's blocks for its
	// consumers (vLLM's kv_lease_duration) until a heartbeat extends it.
	Lease runcore.Duration `mapstructure:"kv-lease-duration" json:"lease" help:"how long prefill keeps a finished request's blocks"`
	// RegTimeout is push mode's decode-side registration watchdog (0 in
	// an engine's Config: upstream's push_registration_timeout,
	// DefaultRegTimeout) and RegWatchdog what it does when it fires ("":
	// upstream's, drop).
	RegTimeout  runcore.Duration `mapstructure:"registration-timeout" json:"registration_timeout,omitempty" protocols:"push" help:"push decode-side watchdog (bench default; upstream vLLM push: 480s)"`
	RegWatchdog WatchdogAction   `mapstructure:"registration-watchdog" json:"registration_watchdog,omitempty" protocols:"push" help:"push: when the watchdog fires, fail the request (bench default) or drop the registration and keep waiting (upstream vLLM)"`
	// PushHeartbeatKeys is what push mode's heartbeats are keyed by ("":
	// upstream's, which never renew: vLLM #53095).
	PushHeartbeatKeys HeartbeatKeys `mapstructure:"push-heartbeat-keys" json:"push_heartbeat_keys,omitempty" protocols:"push" help:"push: upstream (heartbeats keyed by the router's id never renew a lease, vLLM #53095) or fixed (decode's id matched by base id; not upstream behaviour)"`
	// SGLang's timeouts (0 in an engine's Config: upstream's defaults,
	// see sglDefaults): prefill's bootstrap timeout (a room whose
	// TransferInfos do not all come), decode's waiting timeout (a room
	// whose KV does not come), and decode's /health heartbeat to each
	// prefill's bootstrap server, every SGLHeartbeatInterval, that fails
	// the rooms waiting on a prefill after SGLHeartbeatMaxFailures
	// consecutive failed checks. The CLI reads upstream's environment
	// variables for their defaults.
	SGLBootstrapTimeout     runcore.Duration `mapstructure:"sglang-bootstrap-timeout" json:"sglang_bootstrap_timeout,omitempty" protocols:"sglang" help:"SGLang prefill: how long a room waits for decode's TransferInfo (default: $SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT seconds, else upstream's 300s)"`
	SGLWaitingTimeout       runcore.Duration `mapstructure:"sglang-waiting-timeout" json:"sglang_waiting_timeout,omitempty" protocols:"sglang" help:"SGLang decode: how long a room waits for its KV (default: $SGLANG_DISAGGREGATION_WAITING_TIMEOUT seconds, else upstream's 300s)"`
	SGLHeartbeatInterval    runcore.Duration `mapstructure:"sglang-heartbeat-interval" json:"sglang_heartbeat_interval,omitempty" protocols:"sglang" help:"SGLang decode: GET /health on each prefill's bootstrap server this often, at least 2s (default: $SGLANG_DISAGGREGATION_HEARTBEAT_INTERVAL, else upstream's 5s)"`
	SGLHeartbeatMaxFailures int              `mapstructure:"sglang-heartbeat-max-failures" json:"sglang_heartbeat_max_failures,omitempty" protocols:"sglang" help:"SGLang decode: failed /health checks in a row that fail the rooms waiting on that prefill (default: $SGLANG_DISAGGREGATION_HEARTBEAT_MAX_FAILURE, else upstream's 2)"`
	// SGLKVCacheDType is SGLang's --kv-cache-dtype as a prefill registers
	// it with the bootstrap server and a decode compares it, as a string
	// ("" in an engine's Config: SGLang's default, SGLDefaultKVCacheDType).
	SGLKVCacheDType string `mapstructure:"sglang-kv-dtype" json:"sglang_kv_cache_dtype,omitempty" protocols:"sglang" help:"SGLang: the --kv-cache-dtype string the prefill registers and the decode compares, exactly as SGLang compares it (a real SGLang peer's setting; its default is \"auto\")"`
	// Verify is how much of every block decode checks.
	Verify Verify `mapstructure:"verify" json:"verify" help:"tag check: sparse (4 words per block: its ends and both ends of one head that moves on per block; NHD: of 3 tokens) or full (every byte)"`
	// DRAMAlloc is how DRAM pools are allocated.
	DRAMAlloc DRAMAlloc `mapstructure:"dram-alloc" json:"dram_alloc" help:"pool allocation: mmap (4 KiB pages), thp (mmap advised for transparent huge pages, as PyTorch with C10_THP_MEM_ALLOC_ENABLE=1) or ucx (UCX-allocated)"`
	// NetDevices, when set, is UCX_NET_DEVICES for the engine's agents
	// (which interface UCX may carry the KV cache over).
	NetDevices string `mapstructure:"net-devices" json:"net_devices,omitempty" help:"UCX_NET_DEVICES for both endpoints (e.g. eth1 or mlx5_0:1), recorded in the result"`
}

// BenchRegTimeout is the bench's registration timeout by default, shorter
// than upstream's 480 s (DefaultRegTimeout) so that a run whose requests
// lose their KV ends in minutes.
const BenchRegTimeout = 60 * time.Second

// DefaultKnobs are the bench's defaults, its flags' defaults. The push
// watchdog's (60 s, fail) are this bench's, not upstream's (480 s, drop:
// the request keeps waiting), so that a run whose prefill never writes
// ends; results record both and warn. An engine given zero values uses
// upstream's.
func DefaultKnobs() Knobs {
	return Knobs{Lease: runcore.Duration(lease.DefaultDuration), RegTimeout: runcore.Duration(BenchRegTimeout),
		RegWatchdog: WatchdogFail, PushHeartbeatKeys: HBKeysUpstream,
		SGLBootstrapTimeout: runcore.Duration(SGLDefaultBootstrapTimeout), SGLWaitingTimeout: runcore.Duration(SGLDefaultWaitingTimeout),
		SGLHeartbeatInterval: runcore.Duration(SGLDefaultHeartbeatInterval), SGLHeartbeatMaxFailures: SGLDefaultHeartbeatMaxFailures,
		SGLKVCacheDType: SGLDefaultKVCacheDType, Verify: Sparse, DRAMAlloc: AllocMmap}
}

// Validate settles the knobs for a run of protocol p: what options built
// without DefaultKnobs left zero gets the default, and each field is
// checked alone, each problem told to bad with the field's name (the run
// kind's validation collects them as errkind.FieldErrors). Checks that
// need the rest of the run (--net-devices against this host) are the run
// kind's.
func (k *Knobs) Validate(p Protocol, bad func(field, format string, a ...any)) {
	if !slices.Contains(Verifies, k.Verify) {
		bad("Verify", "unknown verify mode %v (want sparse or full)", k.Verify)
	}
	if !k.DRAMAlloc.Valid() {
		bad("DRAMAlloc", "unknown DRAM allocation %q (want %s)", k.DRAMAlloc, DRAMAllocChoices())
	}
	if k.PrefillPerToken < 0 {
		bad("PrefillPerToken", "must not be negative")
	}
	if k.Lease <= 0 {
		bad("Lease", "must be positive")
	}
	if k.RegTimeout <= 0 {
		bad("RegTimeout", "must be positive")
	}
	k.RegWatchdog = cmp.Or(k.RegWatchdog, WatchdogFail)
	k.PushHeartbeatKeys = cmp.Or(k.PushHeartbeatKeys, HBKeysUpstream)
	if !k.RegWatchdog.Valid() {
		bad("RegWatchdog", "unknown registration watchdog action %q (want drop or fail)", k.RegWatchdog)
	}
	if !k.PushHeartbeatKeys.Valid() {
		bad("PushHeartbeatKeys", "unknown push heartbeat keys %q (want upstream or fixed)", k.PushHeartbeatKeys)
	}
	if p == ProtoSGLang {
		k.validateSGL(bad)
	}
}

func (k *Knobs) validateSGL(bad func(field, format string, a ...any)) {
	k.SGLBootstrapTimeout = cmp.Or(k.SGLBootstrapTimeout, runcore.Duration(SGLDefaultBootstrapTimeout))
	k.SGLWaitingTimeout = cmp.Or(k.SGLWaitingTimeout, runcore.Duration(SGLDefaultWaitingTimeout))
	k.SGLHeartbeatInterval = cmp.Or(k.SGLHeartbeatInterval, runcore.Duration(SGLDefaultHeartbeatInterval))
	k.SGLHeartbeatMaxFailures = cmp.Or(k.SGLHeartbeatMaxFailures, SGLDefaultHeartbeatMaxFailures)
	k.SGLKVCacheDType = cmp.Or(k.SGLKVCacheDType, SGLDefaultKVCacheDType)
	if strings.TrimSpace(k.SGLKVCacheDType) != k.SGLKVCacheDType {
		bad("SGLKVCacheDType", "%q has surrounding spaces: SGLang compares the strings exactly", k.SGLKVCacheDType)
	}
	if k.SGLBootstrapTimeout < 0 {
		bad("SGLBootstrapTimeout", "must be positive")
	}
	if k.SGLWaitingTimeout < 0 {
		bad("SGLWaitingTimeout", "must be positive")
	}
	// SGLang's decode raises smaller settings to these floors; a flag
	// that asks for less would be silently changed, so it is refused.
	if k.SGLHeartbeatInterval < runcore.Duration(SGLMinHeartbeatInterval) {
		bad("SGLHeartbeatInterval", "%v is below SGLang's floor of %v", k.SGLHeartbeatInterval, SGLMinHeartbeatInterval)
	}
	if k.SGLHeartbeatMaxFailures < 1 {
		bad("SGLHeartbeatMaxFailures", "must be at least 1")
	}
}

// Echo is k as a result of protocol p records it: a knob tagged for other
// protocols is left out (zero, and omitted from the JSON).
func (k Knobs) Echo(p Protocol) Knobs {
	v := reflect.ValueOf(&k).Elem()
	t := v.Type()
	for i := range t.NumField() {
		if !KnobAppliesTo(t.Field(i), p) {
			v.Field(i).SetZero()
		}
	}
	return k
}

// KnobAppliesTo says whether the Knobs field f matters to protocol p
// (its protocols tag names p, or it has none).
func KnobAppliesTo(f reflect.StructField, p Protocol) bool {
	tag, ok := f.Tag.Lookup("protocols")
	return !ok || slices.Contains(strings.Split(tag, ","), string(p))
}
