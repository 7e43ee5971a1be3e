package report

import (
	"io/fs"
	"os"
	"runtime"
	"sort"
	"strconv"
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
	Schema  string `json:"schema"`
	Command string `json:"command"`
	Version string `json:"nixlctl_version"`
	// Args is the command line after "nixlctl", as typed: it says how to
	// reproduce the run, and `nixlctl gate --repeat` runs it again.
	Args        []string    `json:"args,omitempty"`
	StartedAt   time.Time   `json:"started_at"`
	Seconds     float64     `json:"duration_s"`
	Host        Host        `json:"host"`
	Env         Environment `json:"environment"`
	Warnings    []string    `json:"warnings"`
	RecordsFile *RecordsRef `json:"records_file,omitempty"`
	// Partial marks a provisional result: --save writes one when the
	// timed phase starts and replaces it with the final one at the end,
	// so one found on disk says the run never finished (killed), and its
	// records file holds what it had measured. Loading a partial records
	// file sets it too.
	Partial bool `json:"partial,omitempty"`
	// Repeats holds every run's metrics when the command ran with
	// --repeat N; this result is their representative.
	Repeats *Repeats `json:"repeats,omitempty"`
}

// RecordsRef links a result to the raw per-request records it was
// summarised from. Path is relative to the result file's directory when the
// two were saved together (--save), else as given to --records.
type RecordsRef struct {
	Path   string `json:"path"`
	Schema string `json:"schema"` // nixlctl.records/v1
	Count  int    `json:"count"`  // records, header line not counted
	SHA256 string `json:"sha256,omitempty"`
}

// RecordsSchema names the version of the JSON-lines records format.
const RecordsSchema = "nixlctl.records/v1"

// Header returns the metadata; every result embeds Meta, so every result
// gets this method (part of the Result interface) for free.
func (m *Meta) Header() *Meta { return m }

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
	Backend        string `json:"backend"`
	BackendVersion string `json:"backend_version,omitempty"`
	UCX            string `json:"ucx,omitempty"`
	NIXL           string `json:"nixl,omitempty"`
	CUDA           string `json:"cuda,omitempty"`
	Transport      string `json:"transport,omitempty"`
	// NvidiaDriver and GPUs come from /proc/driver/nvidia: what the host
	// has, whether or not the run used it (the segment types say that).
	NvidiaDriver string            `json:"nvidia_driver,omitempty"`
	GPUs         []GPU             `json:"gpus,omitempty"`
	Vars         map[string]string `json:"vars,omitempty"` // UCX_*, NIXL_* and NIXLCTL_* settings in effect
}

// NewMeta starts a result's metadata.
func NewMeta(command, version string) Meta {
	return Meta{Schema: Schema, Command: command, Version: version, StartedAt: time.Now().UTC(), Host: ThisHost(),
		Env: ThisEnvironment(), Warnings: []string{}}
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

// GPU is one NVIDIA GPU as the kernel driver lists it.
type GPU struct {
	Index int    `json:"index"` // the device minor number: /dev/nvidia<index>
	Name  string `json:"name"`
	UUID  string `json:"uuid,omitempty"`
	Bus   string `json:"bus,omitempty"` // PCI bus location
}

// ThisEnvironment is the part of Environment known before a backend is
// chosen: the transfer variables in effect and the GPUs the driver lists.
func ThisEnvironment() Environment {
	e := Environment{Vars: TransferEnv()}
	e.NvidiaDriver, e.GPUs = NvidiaGPUs(os.DirFS("/proc/driver/nvidia"))
	return e
}

// NvidiaGPUs reads the NVIDIA kernel driver's version and GPU list from
// its procfs directory (given as fsys so tests can fake it). Reading
// procfs needs neither libcuda nor NVML, so every result can say what the
// host has, even where no CUDA library is installed.
func NvidiaGPUs(fsys fs.FS) (driver string, gpus []GPU) {
	if b, err := fs.ReadFile(fsys, "version"); err == nil {
		// "NVRM version: NVIDIA UNIX x86_64 Kernel Module  550.54.15  Tue Mar ..."
		line, _, _ := strings.Cut(string(b), "\n")
		if _, rest, ok := strings.Cut(line, "Kernel Module"); ok {
			if f := strings.Fields(rest); len(f) > 0 {
				driver = f[0]
			}
		}
	}
	dirs, _ := fs.ReadDir(fsys, "gpus")
	for _, d := range dirs {
		b, err := fs.ReadFile(fsys, "gpus/"+d.Name()+"/information")
		if err != nil {
			continue
		}
		g := GPU{Bus: d.Name(), Index: -1}
		for _, line := range strings.Split(string(b), "\n") {
			k, v, ok := strings.Cut(line, ":")
			if !ok {
				continue
			}
			v = strings.TrimSpace(v)
			switch strings.TrimSpace(k) {
			case "Model":
				g.Name = v
			case "GPU UUID":
				g.UUID = v
			case "Bus Location":
				g.Bus = v
			case "Device Minor":
				if n, err := strconv.Atoi(v); err == nil {
					g.Index = n
				}
			}
		}
		gpus = append(gpus, g)
	}
	sort.Slice(gpus, func(i, j int) bool { return gpus[i].Index < gpus[j].Index })
	return driver, gpus
}
