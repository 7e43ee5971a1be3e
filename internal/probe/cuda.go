package probe

import (
	"fmt"
	"os/exec"
	"strconv"
	"strings"
	"sync"

	"github.com/nixlctl/nixlctl/internal/nixl/cuda"
)

// CUDAReport is what `probe env` says about GPUs: a light check of the
// host's libcuda.so.1 (cuda.QuerySystem), not the driver the GPU backends
// load.
type CUDAReport struct {
	Driver        bool      `json:"driver"`
	Reason        string    `json:"reason,omitempty"` // why there is no usable driver
	DriverVersion string    `json:"driver_version,omitempty"`
	Source        string    `json:"source,omitempty"` // libcuda.so.1 or nvidia-smi
	GPUs          []GPUInfo `json:"gpus,omitempty"`
}

// GPUInfo is one GPU.
type GPUInfo struct {
	Index    int    `json:"index"`
	Name     string `json:"name"`
	MemBytes int64  `json:"mem_bytes,omitempty"`
}

var cudaOnce = sync.OnceValue(probeCUDA)

// ProbeCUDA looks at the CUDA driver once per process.
func ProbeCUDA() CUDAReport { return cudaOnce() }

func probeCUDA() CUDAReport {
	// A light look at the CUDA driver, through dlopen: nixlctl never links
	// libcuda, so the same binary runs where there is none.
	d, err := cuda.QuerySystem()
	if err != nil {
		why := err.Error()
		if r, ok := nvidiaSMI(); ok {
			r.Reason = "libcuda.so.1 did not load (" + why + "); nvidia-smi answered"
			return r
		}
		return CUDAReport{Reason: "no CUDA driver: " + why}
	}
	r := CUDAReport{Driver: true, Source: "libcuda.so.1"}
	if v := d.Version; v > 0 {
		r.DriverVersion = fmt.Sprintf("%d.%d", v/1000, v%1000/10)
	}
	for _, g := range d.GPUs {
		r.GPUs = append(r.GPUs, GPUInfo{Index: g.Index, Name: g.Name, MemBytes: g.MemBytes})
	}
	return r
}

// nvidiaSMI asks nvidia-smi, for a driver libcuda would not load.
func nvidiaSMI() (CUDAReport, bool) {
	path, err := exec.LookPath("nvidia-smi")
	if err != nil {
		return CUDAReport{}, false
	}
	out, err := exec.Command(path, "--query-gpu=index,name,memory.total,driver_version", "--format=csv,noheader,nounits").Output()
	if err != nil {
		return CUDAReport{}, false
	}
	r := ParseNvidiaSMI(string(out))
	return r, r.Driver
}

// ParseNvidiaSMI reads "index, name, memory.total [MiB], driver_version"
// lines of nvidia-smi --format=csv,noheader,nounits.
func ParseNvidiaSMI(s string) CUDAReport {
	r := CUDAReport{Source: "nvidia-smi"}
	for _, line := range strings.Split(s, "\n") {
		f := strings.Split(line, ",")
		if len(f) != 4 {
			continue
		}
		for i := range f {
			f[i] = strings.TrimSpace(f[i])
		}
		idx, err1 := strconv.Atoi(f[0])
		mib, err2 := strconv.ParseInt(f[2], 10, 64)
		if err1 != nil || err2 != nil || f[1] == "" || mib < 0 {
			continue
		}
		r.Driver = true
		r.DriverVersion = f[3]
		r.GPUs = append(r.GPUs, GPUInfo{Index: idx, Name: f[1], MemBytes: mib << 20})
	}
	return r
}
