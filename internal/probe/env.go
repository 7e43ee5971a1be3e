package probe

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/nixlctl/nixlctl/internal/kv"
	"github.com/nixlctl/nixlctl/internal/nixl"
	"github.com/nixlctl/nixlctl/internal/procfs"
	"github.com/nixlctl/nixlctl/internal/report"
)

// EnvOptions configure `probe env`.
type EnvOptions struct {
	Backend  string // for the loopback: auto, ucx or nixl
	Requests int    // loopback requests (0: skip the loopback)
	// PeerModeCheck runs a second loopback on the ucx backend with UCX's
	// peer error handling, NIXL's default, to show what NIXL would get.
	PeerModeCheck bool
	Peer          PeerSpec
	Version       string
	Log           *slog.Logger
}

// EnvResult is the transport doctor's screen.
type EnvResult struct {
	report.Meta
	UCX    UCXReport    `json:"ucx"`
	NIXL   NIXLReport   `json:"nixl"`
	CUDA   CUDAReport   `json:"cuda"`
	System SystemReport `json:"system"`
	Path   *PathReport  `json:"path,omitempty"`
	// PeerMode is the same loopback with peer error handling (NIXL's
	// default), when asked for.
	PeerMode *PathReport `json:"peer_mode_path,omitempty"`
	Notes    []string    `json:"notes"`
}

// UCXReport is UCX as this process loads it and as ucx_info sees it.
type UCXReport struct {
	Library      string            `json:"library_version"` // libucp this process loaded
	InfoPath     string            `json:"ucx_info_path,omitempty"`
	Info         UCXBuild          `json:"ucx_info"`
	InfoMatches  bool              `json:"ucx_info_matches_library"`
	Devices      []UCXDevice       `json:"devices"`
	RDMA         []string          `json:"rdma_transports"`
	GPU          []string          `json:"gpu_transports"`
	Settings     map[string]string `json:"settings"` // effective values of the variables that decide the path
	Set          map[string]bool   `json:"set_by_user"`
	RcacheLimit  bool              `json:"rcache_max_unreleased_known"`
	InfoProblems string            `json:"ucx_info_problem,omitempty"`
}

// NIXLReport is the nixl backend as nixlctl's registry sees it.
type NIXLReport struct {
	BuiltIn   bool     `json:"built_in"`
	Available bool     `json:"available"`
	Reason    string   `json:"reason,omitempty"`
	Version   string   `json:"version,omitempty"`
	PluginDir string   `json:"plugin_dir,omitempty"`
	Plugins   []string `json:"plugins,omitempty"`
}

// SystemReport is what the kernel allows.
type SystemReport struct {
	MemlockSoft int64          `json:"memlock_soft_bytes"` // -1: unlimited
	MemlockHard int64          `json:"memlock_hard_bytes"`
	MemInfo     procfs.MemInfo `json:"meminfo"`
	// THP is the kernel's transparent huge page mode (always, madvise or
	// never): whether --dram-alloc thp can have huge pages, and whether
	// an engine's plain allocations get them unasked (always).
	THP string `json:"transparent_hugepages,omitempty"`
}

// PathReport is what a short loopback transfer really used.
type PathReport struct {
	Backend        string       `json:"backend"`
	BackendVersion string       `json:"backend_version,omitempty"`
	Env            []string     `json:"env,omitempty"` // variables set for it beyond the user's
	Asked          int          `json:"asked"`         // requests it was to move
	Transport      string       `json:"transport,omitempty"`
	Used           string       `json:"used,omitempty"` // "cma on memory"
	TCP            bool         `json:"tcp_fallback"`
	Requests       int64        `json:"requests"`
	Bytes          int64        `json:"bytes"`
	Notifs         int64        `json:"notifications"`
	BlocksChecked  int          `json:"blocks_checked"`
	BlocksCorrupt  int          `json:"blocks_corrupt"`
	FirstCorrupt   string       `json:"first_corrupt,omitempty"`
	Protocols      []ProtoTable `json:"protocols,omitempty"`
	ProtocolNote   string       `json:"protocol_note,omitempty"`
	Seconds        float64      `json:"seconds"`
	Error          string       `json:"error,omitempty"`
}

// The variables whose effective values the screen shows.
var pathVars = []string{"UCX_TLS", "UCX_NET_DEVICES", HookModeVar, RcacheUnreleasedVar, "UCX_PROTO_ENABLE", "UCX_RNDV_THRESH", "UCX_IB_GPU_DIRECT_RDMA", "UCX_MEMTYPE_CACHE"}

// RunEnv gathers the screen and, unless Requests is 0, proves the path.
// It never fails for what it finds: findings are warnings.
func RunEnv(ctx context.Context, o EnvOptions) (*EnvResult, error) {
	if o.Log == nil {
		o.Log = slog.New(slog.DiscardHandler)
	}
	if o.Requests < 0 || o.Requests > 10000 {
		return nil, fmt.Errorf("--requests %d: want 0..10000", o.Requests)
	}
	if o.Backend != "" && o.Backend != "auto" {
		if _, ok := nixl.Lookup(o.Backend); !ok && o.Backend != "nixl" {
			return nil, fmt.Errorf("unknown backend %q (want auto, ucx or nixl)", o.Backend)
		}
	}
	res := &EnvResult{Meta: report.NewMeta("probe env", o.Version), Notes: []string{}}
	res.UCX = inspectUCX()
	res.Env.UCX = res.UCX.Library
	res.NIXL = inspectNIXL()
	if res.NIXL.Available {
		res.Env.NIXL = res.NIXL.Version
	}
	res.CUDA = ProbeCUDA()
	if res.CUDA.Driver {
		res.Env.CUDA = res.CUDA.DriverVersion
	}
	res.System = inspectSystem()
	checkSettings(res)

	if o.Requests > 0 {
		backend := o.Backend
		if backend == "" || backend == "auto" {
			backend = "ucx"
			if res.NIXL.Available {
				backend = "nixl"
			}
		}
		if why := backendUnusable(backend); why != "" {
			res.Warn("no loopback transfer: " + why)
		} else {
			res.Path = provePath(ctx, o, backend, nil)
			res.Env.Backend = backend
			res.Env.Transport = res.Path.Transport
			judgePath(res, res.Path, "")
			if o.PeerModeCheck && backend == "ucx" && ctx.Err() == nil {
				res.PeerMode = provePath(ctx, o, "ucx", []string{"NIXLCTL_UCX_ERR_MODE=peer"})
				judgePeerMode(res)
			}
		}
	}
	res.Finish()
	return res, ctx.Err()
}

func inspectUCX() UCXReport {
	r := UCXReport{Library: UCXLibraryVersion(), Settings: map[string]string{}, Set: map[string]bool{}}
	lib := UCXLibraryConfig()
	for _, v := range pathVars {
		if val := os.Getenv(v); val != "" { // UCX treats an empty variable as unset
			r.Settings[v], r.Set[v] = val, true
		} else if val, ok := lib[v]; ok {
			r.Settings[v] = val
		}
	}
	r.RcacheLimit, _ = UCXKnows(RcacheUnreleasedVar)
	path, build, match := FindUCXInfo()
	if path == "" {
		r.InfoProblems = "no ucx_info that runs, beside libucp or on PATH (Debian: apt install ucx-utils): no device list"
		return r
	}
	r.InfoPath, r.Info, r.InfoMatches = path, build, match
	// ucx_info -d honours UCX_TLS and UCX_NET_DEVICES; the list of what
	// exists must not, so they are unset for it.
	cmd := exec.Command(path, "-d")
	for _, kv := range os.Environ() {
		if k, _, _ := strings.Cut(kv, "="); k != "UCX_TLS" && k != "UCX_NET_DEVICES" {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	out, err := cmd.Output()
	if err != nil {
		r.InfoProblems = fmt.Sprintf("ucx_info -d failed: %v", err)
		return r
	}
	r.Devices = ParseUCXDevices(string(out))
	for _, d := range r.Devices {
		switch {
		case isRDMA(d.Transport) && !contains(r.RDMA, d.Transport):
			r.RDMA = append(r.RDMA, d.Transport)
		case isGPU(d.Transport) && !contains(r.GPU, d.Transport):
			r.GPU = append(r.GPU, d.Transport)
		}
	}
	if _, ok := lib[HookModeVar]; !ok && !r.Set[HookModeVar] && r.InfoMatches {
		// A UCM variable: ucp_config_print does not list it; ucx_info -c
		// of the same version does.
		if c, err := exec.Command(path, "-c").Output(); err == nil {
			if v, ok := ParseUCXConfig(string(c))[HookModeVar]; ok {
				r.Settings[HookModeVar] = v
			}
		}
	}
	return r
}

var rdmaName = regexp.MustCompile(`^(rc|ud|dc|rc_verbs|rc_mlx5|ud_verbs|ud_mlx5|dc_mlx5|srd|efa|gga)`)

func isRDMA(tl string) bool { return rdmaName.MatchString(tl) }
func isGPU(tl string) bool {
	return strings.HasPrefix(tl, "cuda") || strings.HasPrefix(tl, "gdr") || strings.HasPrefix(tl, "rocm") || strings.HasPrefix(tl, "ze_")
}

func inspectNIXL() NIXLReport {
	var r NIXLReport
	b, ok := nixl.Lookup("nixl")
	r.BuiltIn = ok
	if !ok {
		r.Reason = "the nixl backend is not built into this nixlctl"
	} else if avail, why := b.Available(); avail {
		r.Available, r.Version = true, b.Version()
	} else {
		r.Reason = why
	}
	r.PluginDir = os.Getenv("NIXL_PLUGIN_DIR")
	if r.PluginDir == "" && strings.HasSuffix(r.Version, ".so") {
		// NIXL looks in plugins/ next to its library unless told otherwise.
		r.PluginDir = filepath.Join(filepath.Dir(r.Version), "plugins")
	}
	if r.PluginDir != "" {
		ents, _ := os.ReadDir(r.PluginDir)
		for _, e := range ents {
			if n := e.Name(); strings.HasPrefix(n, "libplugin_") && strings.HasSuffix(n, ".so") {
				r.Plugins = append(r.Plugins, strings.TrimSuffix(strings.TrimPrefix(n, "libplugin_"), ".so"))
			}
		}
	}
	return r
}

func inspectSystem() SystemReport {
	var s SystemReport
	var rl unix.Rlimit
	if unix.Getrlimit(unix.RLIMIT_MEMLOCK, &rl) == nil {
		s.MemlockSoft, s.MemlockHard = rlim(rl.Cur), rlim(rl.Max)
	}
	if b, err := os.ReadFile("/proc/meminfo"); err == nil {
		s.MemInfo, _ = procfs.ParseMemInfo(b)
	}
	s.THP, _ = nixl.THPMode(nixl.THPEnabledPath)
	return s
}

func rlim(v uint64) int64 {
	if v == unix.RLIM_INFINITY || v > 1<<62 {
		return -1
	}
	return int64(v)
}

// shmTransports are UCX's intra-node transports and the aliases that
// include them.
var shmTransports = []string{"sm", "shm", "mm", "sysv", "posix", "cma", "knem", "xpmem"}

// tlAliases are UCX_TLS names that stand for several transports.
var tlAliases = map[string][]string{
	"all": nil, "sm": {"sysv", "posix", "cma", "knem", "xpmem"}, "shm": {"sysv", "posix", "cma", "knem", "xpmem"},
	"mm": {"sysv", "posix", "xpmem"}, "ib": {"rc_verbs", "rc_mlx5", "ud_verbs", "ud_mlx5", "dc_mlx5"},
	"rc": {"rc_verbs", "rc_mlx5"}, "ud": {"ud_verbs", "ud_mlx5"}, "dc": {"dc_mlx5"}, "rc_x": {"rc_mlx5"},
	"ud_x": {"ud_mlx5"}, "dc_x": {"dc_mlx5"}, "cuda": {"cuda_copy", "cuda_ipc", "gdr_copy"},
	"rocm": {"rocm_copy", "rocm_ipc", "rocm_gdr"}, "ugni": {"ugni_rdma", "ugni_udt", "ugni_smsg"},
}

// checkSettings turns the gathered facts into warnings and notes.
func checkSettings(res *EnvResult) {
	u := &res.UCX
	have := map[string]bool{}
	devices := map[string]bool{}
	for _, d := range u.Devices {
		have[d.Transport] = true
		devices[d.Device] = true
	}
	if u.InfoProblems != "" {
		res.Warn(u.InfoProblems)
	} else if !u.InfoMatches {
		res.Warn(fmt.Sprintf("ucx_info (%s) is UCX %s but this process loaded libucp %s: its device list may not be what transfers see",
			u.InfoPath, u.Info.Version, u.Library))
	}

	// UCX_TLS: TCP only, no shared memory, or transports UCX lacks.
	if tls, ok := u.Settings["UCX_TLS"]; ok && u.Set["UCX_TLS"] {
		names := strings.Split(tls, ",")
		negated := strings.HasPrefix(tls, "^")
		var plain []string
		for _, n := range names {
			n = strings.TrimPrefix(strings.TrimSpace(n), "^")
			n, _, _ = strings.Cut(n, ":") // tl:aux
			if n != "" {
				plain = append(plain, n)
			}
		}
		if !negated {
			onlyTCP, shm := true, false
			for _, n := range plain {
				if n != "tcp" && n != "self" {
					onlyTCP = false
				}
				if n == "all" || contains(shmTransports, n) {
					shm = true
				}
			}
			switch {
			case onlyTCP:
				res.Warn(fmt.Sprintf("UCX_TLS=%s: TCP only. KV moves through the kernel's socket stack, with no shared memory between processes on one host and no RDMA: expect a small fraction of the bandwidth", tls))
			case !shm:
				res.Warn(fmt.Sprintf("UCX_TLS=%s has no shared-memory transport (sm, sysv, posix, cma): a prefill and a decode on the same host will talk over the network", tls))
			}
			if u.Devices != nil {
				for _, n := range plain {
					if n == "all" || have[n] {
						continue
					}
					expands, alias := tlAliases[n]
					found := false
					for _, e := range expands {
						found = found || have[e]
					}
					if alias && found {
						continue
					}
					res.Warn(fmt.Sprintf("UCX_TLS names %s, which this UCX does not have (it has: %s)", n, strings.Join(transportNames(u.Devices), ", ")))
				}
			}
		}
	}
	// UCX_NET_DEVICES that match no device.
	if nd, ok := u.Settings["UCX_NET_DEVICES"]; ok && u.Set["UCX_NET_DEVICES"] && nd != "all" && u.Devices != nil {
		for _, d := range strings.Split(nd, ",") {
			d = strings.TrimSpace(d)
			base, _, _ := strings.Cut(d, ":")
			if d != "" && !devices[d] && !devices[base] {
				res.Warn(fmt.Sprintf("UCX_NET_DEVICES names %s, which matches no device this UCX sees (network devices: %s)", d, strings.Join(networkDevices(u.Devices), ", ")))
			}
		}
	}

	// Several network devices, none pinned: UCX may open a lane on one
	// that does not reach the peers (a docker or libvirt bridge), and every
	// request then fails with only "Destination is unreachable" to go by.
	if !u.Set["UCX_NET_DEVICES"] && u.Devices != nil {
		var nics []string
		for _, d := range networkDevices(u.Devices) {
			if d != "none" && d != "lo" {
				nics = append(nics, d)
			}
		}
		if len(nics) > 1 {
			res.Notes = append(res.Notes, fmt.Sprintf("UCX sees %d network devices (%s) and UCX_NET_DEVICES is unset, so it may use any of them; if requests fail with \"Destination is unreachable\", one does not reach the peers: pin the one that does with nixlctl's --net-devices (or UCX_NET_DEVICES)",
				len(nics), strings.Join(nics, ", ")))
		}
	}

	// The leak settings.
	hook := u.Settings[HookModeVar]
	switch {
	case u.Set[HookModeVar] && hook == "none":
		res.Notes = append(res.Notes, fmt.Sprintf("%s=none: UCX does not intercept mmap/munmap, the fix for the decode-side RSS leak (vllm#32181); fine for engines that register one KV pool at start-up. vLLM reverted it on ROCm (a crash) in favour of %s=1024.", HookModeVar, RcacheUnreleasedVar))
	case len(u.RDMA) > 0 && !u.Set[RcacheUnreleasedVar]:
		res.Warn(fmt.Sprintf("%s is the library default (%s) and %s is not set, with RDMA transports (%s) present: the combination behind the known decode-side RSS leak (~400 MB/min). Set %s=none for the decode engine, or run nixlctl probe ucx-leak on this node to measure.",
			HookModeVar, valueLabel(hook), RcacheUnreleasedVar, strings.Join(u.RDMA, ", "), HookModeVar))
	default:
		res.Notes = append(res.Notes, fmt.Sprintf("%s is %s: UCX intercepts every mmap/munmap in the process. No RDMA transport here, so no registration cache for that to feed; on an RDMA decode node this is the known leak's setting (probe ucx-leak measures it).", HookModeVar, valueLabel(hook)))
	}
	if v, ok := os.LookupEnv(RcacheUnreleasedVar); ok && !u.RcacheLimit {
		res.Warn(fmt.Sprintf("%s=%s has no effect: libucp %s does not know the variable (newer UCX releases do)", RcacheUnreleasedVar, v, u.Library))
	}

	// Peer error handling (NIXL's UCX default) needs transports that
	// report peer failures; the intra-node ones that cannot are left out.
	var noPeer []string
	for _, d := range u.Devices {
		if d.Type == "intra-node" && !strings.Contains(d.ErrorHandling, "peer failure") && !contains(noPeer, d.Transport) {
			noPeer = append(noPeer, d.Transport)
		}
	}
	if len(noPeer) > 0 {
		msg := fmt.Sprintf("UCX %s: %s cannot serve endpoints with peer error handling (no \"peer failure\" in ucx_info -d). NIXL's UCX backend uses peer mode by default, so NIXL agents on one host cannot use them and fall back to what can (cma, tcp); nixlctl's own ucx backend uses error mode none towards same-host peers (it watches the peer's process itself) to keep them.",
			u.Library, strings.Join(noPeer, ", "))
		if strings.HasPrefix(u.Library, "1.13") {
			res.Warn(msg)
		} else {
			res.Notes = append(res.Notes, msg)
		}
	}

	// GPUs and UCX's GPU transports.
	switch {
	case res.CUDA.Driver && len(u.GPU) == 0 && u.Devices != nil:
		res.Warn(fmt.Sprintf("%d GPU(s) with CUDA driver %s, but this UCX has no CUDA transports (cuda_copy, cuda_ipc, gdr_copy): VRAM transfers through it fail or are staged by the caller", len(res.CUDA.GPUs), res.CUDA.DriverVersion))
	case !res.CUDA.Driver:
		res.Notes = append(res.Notes, "No CUDA driver: VRAM transfers cannot run on this host (DRAM only).")
	}

	// RDMA needs pinned memory.
	if len(u.RDMA) > 0 && res.System.MemlockSoft >= 0 && res.System.MemlockSoft < 1<<30 {
		res.Warn(fmt.Sprintf("RLIMIT_MEMLOCK is %s with RDMA transports present: registering a KV pool pins it; raise it (ulimit -l unlimited; containers: --ulimit memlock=-1)", report.Bytes(res.System.MemlockSoft)))
	}

	if !res.NIXL.Available {
		res.Notes = append(res.Notes, "NIXL: "+res.NIXL.Reason+".")
	} else if len(res.NIXL.Plugins) == 0 {
		res.Warn(fmt.Sprintf("NIXL is available but no plugins were found in %q", res.NIXL.PluginDir))
	}
	if d := os.Getenv("NIXL_PLUGIN_DIR"); d != "" {
		if st, err := os.Stat(d); err != nil || !st.IsDir() {
			res.Warn(fmt.Sprintf("NIXL_PLUGIN_DIR=%s is not a directory", d))
		}
	}
}

func transportNames(ds []UCXDevice) []string {
	var out []string
	for _, d := range ds {
		if !contains(out, d.Transport) {
			out = append(out, d.Transport)
		}
	}
	return out
}

func networkDevices(ds []UCXDevice) []string {
	var out []string
	for _, d := range ds {
		if d.Type == "network" && !contains(out, d.Device) {
			out = append(out, d.Device)
		}
	}
	if len(out) == 0 {
		return []string{"none"}
	}
	return out
}

// loopbackTokens sizes the loopback: a few KV blocks per layer region of
// a small model, enough descriptors to cross UCX's protocol thresholds.
const loopbackTokens = 64

// provePath moves a few KV-shaped WRITEs from a sender process to a
// receiver process over backend, with UCX_PROTO_INFO=y, verifies every
// written block at the receiver, and reports what carried them.
func provePath(ctx context.Context, o EnvOptions, backend string, extra []string) *PathReport {
	start := time.Now()
	p := &PathReport{Backend: backend, Asked: o.Requests}
	if b, ok := nixl.Lookup(backend); ok {
		p.BackendVersion = b.Version()
	}
	defer func() { p.Seconds = time.Since(start).Seconds() }()
	fail := func(err error) *PathReport {
		p.Error = err.Error()
		return p
	}
	m, _ := kv.Preset("llama-3.2-1b")
	shape, err := KVShape(kv.Spec{Model: m, BlockSize: 16}, loopbackTokens)
	if err != nil {
		return fail(err)
	}
	// Newer releases print the protocol each operation chose. The
	// loopback runs with the user's settings (it proves their path), so
	// protocols v2 are not forced on a UCX that defaults to v1.
	env := append([]string(nil), extra...)
	if _, set := os.LookupEnv("UCX_PROTO_INFO"); !set {
		env = append(env, "UCX_PROTO_INFO=y")
	}
	p.Env = env
	base := childEnv(nil, nil, env...)
	recv, err := startPeer(ctx, "receiver", o.Peer, base, nil)
	if err != nil {
		return fail(err)
	}
	defer recv.Close()
	send, err := startPeer(ctx, "sender", o.Peer, base, nil)
	if err != nil {
		return fail(err)
	}
	defer send.Close()
	rrep, err := connectPeers(recv, send, PeerRequest{Backend: backend, Name: "env-receiver", Shape: &shape},
		PeerRequest{Backend: backend, Name: "env-sender", Shape: &shape})
	if err != nil {
		return fail(err)
	}
	const seed = 0x656e76
	if _, err := send.Call(PeerRequest{Op: "start", RemoteAddr: rrep.Addr, Count: int64(o.Requests), Seed: 7, Tag: true, TagSeed: seed}); err != nil {
		return fail(err)
	}
	deadline := time.Now().Add(60 * time.Second)
	var st PeerStats
	for {
		rep, err := send.Call(PeerRequest{Op: "stats"})
		if err != nil {
			return fail(err)
		}
		st = rep.Stats
		if !st.Running || ctx.Err() != nil || time.Now().After(deadline) {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	p.Requests, p.Bytes = st.Requests, st.Bytes
	if st.Errors > 0 {
		p.Error = fmt.Sprintf("%d of %d requests failed: %s", st.Errors, st.Errors+st.Requests, st.LastError)
	}
	// Every notification follows its data: wait for them, then check
	// every block.
	for time.Now().Before(deadline) && ctx.Err() == nil {
		rep, err := recv.Call(PeerRequest{Op: "stats"})
		if err != nil {
			return fail(err)
		}
		p.Notifs = rep.Stats.Notifs
		if p.Notifs >= st.Requests {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if v, err := recv.Call(PeerRequest{Op: "verify", TagSeed: seed}); err == nil {
		p.BlocksChecked, p.BlocksCorrupt, p.FirstCorrupt = v.Written, v.Corrupt, v.First
	}
	if info, err := send.Call(PeerRequest{Op: "info"}); err == nil {
		p.Transport = info.Transport
	}
	send.Close()
	recv.Close()
	// UCX prints its tables in the process that does the operation; the
	// receiver's may hold the notification path.
	p.Protocols = uniqueTables(append(ParseProtoInfo(send.Stderr()), ParseProtoInfo(recv.Stderr())...))
	if len(p.Protocols) == 0 {
		p.ProtocolNote = fmt.Sprintf("UCX_PROTO_INFO=y: libucp %s printed no protocol tables", UCXLibraryVersion())
		p.ProtocolNote += " (protocols v1 print none): the path above is inferred from the endpoint's lanes"
	}
	p.Used, p.TCP = pathUsed(p)
	if p.Requests == 0 && p.Error == "" {
		p.Error = "no request completed"
	}
	return p
}

// uniqueTables drops repeats: UCX prints a table per endpoint
// configuration, and every agent of both processes prints its own.
func uniqueTables(ts []ProtoTable) []ProtoTable {
	var out []ProtoTable
	seen := map[string]bool{}
	for _, t := range ts {
		key := t.Operation
		for _, r := range t.Ranges {
			key += "|" + r.Range + "|" + r.Description + "|" + r.Config
		}
		if !seen[key] {
			seen[key] = true
			out = append(out, t)
		}
	}
	// A table cut short (its process exited while printing) repeats the
	// start of a whole one.
	var whole []ProtoTable
	for i, t := range out {
		cut := false
		for j, u := range out {
			if i != j && u.Operation == t.Operation && len(u.Ranges) > len(t.Ranges) && slices.Equal(u.Ranges[:len(t.Ranges)], t.Ranges) {
				cut = true
			}
		}
		if !cut {
			whole = append(whole, t)
		}
	}
	return whole
}

// amTransports lists the transports UCX's tables put active messages on.
func amTransports(ts []ProtoTable) []string {
	var out []string
	for _, t := range ts {
		if !strings.HasPrefix(t.Operation, "active message") {
			continue
		}
		for _, r := range t.Ranges {
			if !contains(out, r.Config) {
				out = append(out, r.Config)
			}
		}
	}
	return out
}

// pathUsed says in words what carried the WRITEs, from UCX's own
// protocol table for ucp_put when it printed one, else from the lanes,
// and whether that is TCP.
func pathUsed(p *PathReport) (string, bool) {
	for _, t := range p.Protocols {
		if !strings.Contains(t.Operation, "ucp_put") {
			continue
		}
		var cfgs []string
		for _, r := range t.Ranges {
			if !contains(cfgs, r.Config) {
				cfgs = append(cfgs, r.Config)
			}
		}
		used := describeTL(strings.Join(cfgs, ", ")) + " (UCX's protocol table for ucp_put*)"
		return used, strings.Contains(used, "tcp")
	}
	t := p.Transport
	rma, _, _ := strings.Cut(strings.TrimPrefix(t, "rma: "), ";")
	switch {
	case rma == "" || t == "":
		return "", false
	case strings.HasPrefix(rma, "shared-memory mapping"):
		return "a shared-memory mapping (sysv/posix): a memcpy into the peer's segment", false
	case strings.HasPrefix(rma, "emulated over active messages on "):
		tl, _, _ := strings.Cut(strings.TrimPrefix(rma, "emulated over active messages on "), " (")
		return describeTL(tl) + ", RMA emulated over active messages (each side copies every byte)", strings.Contains(tl, "tcp")
	}
	tl, kind, _ := strings.Cut(rma, " (")
	if kind = strings.TrimSuffix(kind, ")"); kind == "" || kind == "zero-copy" {
		kind = "zero-copy"
	}
	return describeTL(tl) + " (" + kind + " RMA)", strings.Contains(tl, "tcp")
}

// describeTL turns "cma/memory" or "tcp/lo,tcp/eth0" into "cma on
// memory", "tcp on lo, tcp on eth0".
func describeTL(s string) string {
	var out []string
	for _, part := range strings.Split(s, ",") {
		part = strings.TrimSpace(part)
		if tl, dev, ok := strings.Cut(part, "/"); ok {
			out = append(out, tl+" on "+dev)
		} else if part != "" {
			out = append(out, part)
		}
	}
	return strings.Join(out, ", ")
}

// judgePath warns about what the loopback showed.
func judgePath(res *EnvResult, p *PathReport, what string) {
	if p.Error != "" {
		res.Warn(fmt.Sprintf("loopback transfer%s over %s failed: %s", what, p.Backend, p.Error))
	}
	if p.BlocksCorrupt > 0 {
		res.Warn(fmt.Sprintf("loopback transfer%s: %d of %d blocks arrived wrong; first: %s", what, p.BlocksCorrupt, p.BlocksChecked, p.FirstCorrupt))
	}
	if am := amTransports(p.Protocols); !p.TCP && len(am) > 0 && strings.Contains(strings.Join(am, ","), "tcp") {
		res.Notes = append(res.Notes, fmt.Sprintf("Per UCX's protocol tables, active messages (notifications, rendezvous control) ran over %s; the data (RMA) used %s.",
			describeTL(strings.Join(am, ",")), p.Used))
	}
	if p.TCP {
		res.Warn(fmt.Sprintf("TCP FALLBACK: this transfer used %s. Between two processes on one host that means no shared memory; between hosts, no RDMA. Check UCX_TLS/UCX_NET_DEVICES and the UCX build (transports: %s)",
			p.Used, strings.Join(transportNames(res.UCX.Devices), ", ")))
	} else if strings.Contains(p.Used, "RMA emulated over active messages") {
		res.Warn(fmt.Sprintf("SOFTWARE RMA: this transfer used %s: UCX has no one-sided path to memory it did not allocate (cma is only a rendezvous lane with protocols v1), so each process copies every byte. Memory UCX allocates (bench xfer --dram-alloc ucx) is mapped instead. UCX 1.14 and later with UCX_PROTO_ENABLE=y (the default from 1.16) put and get zero-copy over cma (UCX 1.22 was seen to); a NIXL engine on this UCX copies as this does",
			p.Used))
	}
}

func judgePeerMode(res *EnvResult) {
	p := res.PeerMode
	if p == nil {
		return
	}
	if p.Error != "" {
		res.Notes = append(res.Notes, "The peer-error-handling loopback failed: "+p.Error)
		return
	}
	if p.TCP && res.Path != nil && !res.Path.TCP {
		res.Warn(fmt.Sprintf("with peer error handling (NIXL's UCX default) the same loopback used %s instead of %s: peer-mode endpoints on this UCX fall back to TCP, and NIXL agents running on it may too (where NIXL is installed, probe env --backend nixl shows its own path)",
			p.Used, res.Path.Used))
	}
}
