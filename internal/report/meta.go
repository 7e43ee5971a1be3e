package report

import (
	"os"
	"runtime"
	"sort"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// Schema names the version of the result format every measuring command
// writes (docs/result-schema.md).
const Schema = "nixlctl.result/v1"

// Meta is what every result says about itself: what ran, where, with what
// software, and what degraded it. Commands put their own fields beside it.
type Meta struct {
	Schema    string      `json:"schema"`
	Command   string      `json:"command"`
	Version   string      `json:"nixlctl_version"`
	StartedAt time.Time   `json:"started_at"`
	Seconds   float64     `json:"duration_s"`
	Host      Host        `json:"host"`
	Env       Environment `json:"environment"`
	Warnings  []string    `json:"warnings"`
}

// Host describes the machine.
type Host struct {
	Name     string `json:"name"`
	OS       string `json:"os"`
	Arch     string `json:"arch"`
	Kernel   string `json:"kernel"`
	CPUs     int    `json:"cpus"`
	MemBytes uint64 `json:"mem_bytes"`
	Go       string `json:"go"`
}

// Environment is the software that moved the bytes.
type Environment struct {
	Backend        string            `json:"backend"`
	BackendVersion string            `json:"backend_version,omitempty"`
	UCX            string            `json:"ucx,omitempty"`
	NIXL           string            `json:"nixl,omitempty"`
	CUDA           string            `json:"cuda,omitempty"`
	Transport      string            `json:"transport,omitempty"`
	Vars           map[string]string `json:"vars,omitempty"` // UCX_*, NIXL_* and NIXLCTL_* settings in effect
}

// NewMeta starts a result's metadata.
func NewMeta(command, version string) Meta {
	return Meta{Schema: Schema, Command: command, Version: version, StartedAt: time.Now().UTC(), Host: ThisHost(),
		Env: Environment{Vars: TransferEnv()}, Warnings: []string{}}
}

// Finish records the run's duration.
func (m *Meta) Finish() { m.Seconds = time.Since(m.StartedAt).Seconds() }

// Warn adds a warning once.
func (m *Meta) Warn(w string) {
	for _, x := range m.Warnings {
		if x == w {
			return
		}
	}
	m.Warnings = append(m.Warnings, w)
}

// ThisHost describes the local machine.
func ThisHost() Host {
	h := Host{OS: runtime.GOOS, Arch: runtime.GOARCH, CPUs: runtime.NumCPU(), Go: runtime.Version()}
	h.Name, _ = os.Hostname()
	var u unix.Utsname
	if unix.Uname(&u) == nil {
		h.Kernel = unix.ByteSliceToString(u.Release[:])
	}
	var si unix.Sysinfo_t
	if unix.Sysinfo(&si) == nil {
		h.MemBytes = uint64(si.Totalram) * uint64(si.Unit)
	}
	return h
}

// TransferEnv returns the environment variables that change how transfers
// behave (UCX_*, NIXL_*, NIXLCTL_UCX_*), sorted by name.
func TransferEnv() map[string]string {
	out := map[string]string{}
	env := os.Environ()
	sort.Strings(env)
	for _, kv := range env {
		k, v, _ := strings.Cut(kv, "=")
		if strings.HasPrefix(k, "UCX_") || strings.HasPrefix(k, "NIXL_") || strings.HasPrefix(k, "NIXLCTL_UCX_") {
			out[k] = v
		}
	}
	if len(out) == 0 {
		return nil
	}
	return out
}
