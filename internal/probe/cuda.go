package probe

/*
#cgo LDFLAGS: -ldl
#include <dlfcn.h>
#include <stdio.h>
#include <string.h>

// A light look at the CUDA driver, through dlopen: nixlctl never links
// libcuda, so the same binary runs where there is none. Only the calls a
// "which GPUs, which driver" answer needs; CUresult 0 is success.
typedef int (*nxp_cu_init_t)(unsigned);
typedef int (*nxp_cu_int_t)(int *);
typedef int (*nxp_cu_dev_get_t)(int *, int);
typedef int (*nxp_cu_dev_name_t)(char *, int, int);
typedef int (*nxp_cu_dev_mem_t)(size_t *, int);

static struct {
    void             *h;
    nxp_cu_int_t      driver_version;
    nxp_cu_int_t      device_count;
    nxp_cu_dev_get_t  device_get;
    nxp_cu_dev_name_t device_name;
    nxp_cu_dev_mem_t  device_mem;
} nxp_cu;

// nxp_cuda_open loads libcuda.so.1 and initialises the driver. 0 on
// success, else -1 with the reason in err.
static int nxp_cuda_open(char *err, size_t errlen)
{
    if (nxp_cu.h != NULL) {
        return 0;
    }
    void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (h == NULL) {
        const char *e = dlerror();
        snprintf(err, errlen, "%s", e ? e : "libcuda.so.1 not found");
        return -1;
    }
    nxp_cu_init_t init = (nxp_cu_init_t)dlsym(h, "cuInit");
    nxp_cu.driver_version = (nxp_cu_int_t)dlsym(h, "cuDriverGetVersion");
    nxp_cu.device_count   = (nxp_cu_int_t)dlsym(h, "cuDeviceGetCount");
    nxp_cu.device_get     = (nxp_cu_dev_get_t)dlsym(h, "cuDeviceGet");
    nxp_cu.device_name    = (nxp_cu_dev_name_t)dlsym(h, "cuDeviceGetName");
    nxp_cu.device_mem     = (nxp_cu_dev_mem_t)dlsym(h, "cuDeviceTotalMem_v2");
    if (init == NULL || nxp_cu.driver_version == NULL || nxp_cu.device_count == NULL ||
        nxp_cu.device_get == NULL || nxp_cu.device_name == NULL) {
        snprintf(err, errlen, "libcuda.so.1 lacks cuInit/cuDriverGetVersion/cuDeviceGetCount/cuDeviceGet/cuDeviceGetName");
        dlclose(h);
        return -1;
    }
    int rc = init(0);
    if (rc != 0) {
        snprintf(err, errlen, "cuInit failed with CUresult %d (no usable GPU, or driver and device mismatch)", rc);
        dlclose(h);
        return -1;
    }
    nxp_cu.h = h;
    return 0;
}

static int nxp_cuda_driver_version(void)
{
    int v = 0;
    return nxp_cu.driver_version(&v) == 0 ? v : -1;
}

static int nxp_cuda_device_count(void)
{
    int n = 0;
    return nxp_cu.device_count(&n) == 0 ? n : -1;
}

// nxp_cuda_device describes GPU i: its name, and total memory (0 when the
// driver cannot say).
static int nxp_cuda_device(int i, char *name, int namelen, size_t *mem)
{
    int dev;
    if (nxp_cu.device_get(&dev, i) != 0 || nxp_cu.device_name(name, namelen, dev) != 0) {
        return -1;
    }
    *mem = 0;
    if (nxp_cu.device_mem != NULL) {
        nxp_cu.device_mem(mem, dev);
    }
    return 0;
}
*/
import "C"

import (
	"fmt"
	"os/exec"
	"strconv"
	"strings"
	"sync"
)

// CUDAReport is what `probe env` says about GPUs: a light check, not the
// CUDA package the GPU backends use.
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
	var ebuf [512]C.char
	if C.nxp_cuda_open(&ebuf[0], C.size_t(len(ebuf))) != 0 {
		why := C.GoString(&ebuf[0])
		if r, ok := nvidiaSMI(); ok {
			r.Reason = "libcuda.so.1 did not load (" + why + "); nvidia-smi answered"
			return r
		}
		return CUDAReport{Reason: "no CUDA driver: " + why}
	}
	r := CUDAReport{Driver: true, Source: "libcuda.so.1"}
	if v := int(C.nxp_cuda_driver_version()); v > 0 {
		r.DriverVersion = fmt.Sprintf("%d.%d", v/1000, v%1000/10)
	}
	n := int(C.nxp_cuda_device_count())
	for i := 0; i < n; i++ {
		var name [256]C.char
		var mem C.size_t
		if C.nxp_cuda_device(C.int(i), &name[0], C.int(len(name)), &mem) == 0 {
			r.GPUs = append(r.GPUs, GPUInfo{Index: i, Name: C.GoString(&name[0]), MemBytes: int64(mem)})
		}
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
