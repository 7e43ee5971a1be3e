package cuda

/*
#include "shim.h"
*/
import "C"

import "errors"

// SystemDriver is the CUDA driver as the host has it: the libcuda.so.1 the
// dynamic loader finds, opened on a handle of its own. Unlike Available and
// the GPU backends it ignores EnvLib (NIXLCTL_CUDA_LIB): `probe env`
// reports on the host's driver, not on the one a test substitutes.
type SystemDriver struct {
	Version int // cuDriverGetVersion, e.g. 12040; 0 when it cannot say
	GPUs    []SystemGPU
}

// SystemGPU is one GPU the driver lists.
type SystemGPU struct {
	Index    int
	Name     string
	MemBytes int64 // cuDeviceTotalMem; 0 when the driver cannot say
}

// QuerySystem loads libcuda.so.1 (once per process), runs cuInit and lists
// its GPUs. The error says why there is no usable driver, in the loader's
// words (e.g. "libcuda.so.1: cannot open shared object file: No such file
// or directory") or cuInit's result.
func QuerySystem() (SystemDriver, error) {
	var ebuf [512]C.char
	if C.nxcu_sys_open(&ebuf[0], C.size_t(len(ebuf))) != 0 {
		return SystemDriver{}, errors.New(C.GoString(&ebuf[0]))
	}
	var d SystemDriver
	if v := int(C.nxcu_sys_driver_version()); v > 0 {
		d.Version = v
	}
	n := int(C.nxcu_sys_device_count())
	for i := 0; i < n; i++ {
		var name [256]C.char
		var mem C.size_t
		if C.nxcu_sys_device(C.int(i), &name[0], C.int(len(name)), &mem) == 0 {
			d.GPUs = append(d.GPUs, SystemGPU{Index: i, Name: C.GoString(&name[0]), MemBytes: int64(mem)})
		}
	}
	return d, nil
}
