/* The CUDA driver as the system has it, for `nixlctl probe env`: a light
 * look through a dlopen("libcuda.so.1") handle of its own, apart from the
 * loader in shim.c (which honours NIXLCTL_CUDA_LIB and may hold a fake
 * driver in tests). Only the calls a "which GPUs, which driver" answer
 * needs; CUresult 0 is success. */
#include <dlfcn.h>
#include <stdio.h>
#include <string.h>

#include "shim.h"

typedef int (*nxcu_sys_init_t)(unsigned);
typedef int (*nxcu_sys_int_t)(int *);
typedef int (*nxcu_sys_dev_get_t)(int *, int);
typedef int (*nxcu_sys_dev_name_t)(char *, int, int);
typedef int (*nxcu_sys_dev_mem_t)(size_t *, int);

static struct {
    void               *h;
    nxcu_sys_int_t      driver_version;
    nxcu_sys_int_t      device_count;
    nxcu_sys_dev_get_t  device_get;
    nxcu_sys_dev_name_t device_name;
    nxcu_sys_dev_mem_t  device_mem;
} sys_cu;

int nxcu_sys_open(char *err, size_t errlen)
{
    if (sys_cu.h != NULL) {
        return 0;
    }
    void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (h == NULL) {
        const char *e = dlerror();
        snprintf(err, errlen, "%s", e ? e : "libcuda.so.1 not found");
        return -1;
    }
    nxcu_sys_init_t init  = (nxcu_sys_init_t)dlsym(h, "cuInit");
    sys_cu.driver_version = (nxcu_sys_int_t)dlsym(h, "cuDriverGetVersion");
    sys_cu.device_count   = (nxcu_sys_int_t)dlsym(h, "cuDeviceGetCount");
    sys_cu.device_get     = (nxcu_sys_dev_get_t)dlsym(h, "cuDeviceGet");
    sys_cu.device_name    = (nxcu_sys_dev_name_t)dlsym(h, "cuDeviceGetName");
    sys_cu.device_mem     = (nxcu_sys_dev_mem_t)dlsym(h, "cuDeviceTotalMem_v2");
    if (init == NULL || sys_cu.driver_version == NULL || sys_cu.device_count == NULL ||
        sys_cu.device_get == NULL || sys_cu.device_name == NULL) {
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
    sys_cu.h = h;
    return 0;
}

int nxcu_sys_driver_version(void)
{
    int v = 0;
    return sys_cu.driver_version(&v) == 0 ? v : -1;
}

int nxcu_sys_device_count(void)
{
    int n = 0;
    return sys_cu.device_count(&n) == 0 ? n : -1;
}

int nxcu_sys_device(int i, char *name, int namelen, size_t *mem)
{
    int dev;
    if (sys_cu.device_get(&dev, i) != 0 || sys_cu.device_name(name, namelen, dev) != 0) {
        return -1;
    }
    *mem = 0;
    if (sys_cu.device_mem != NULL) {
        sys_cu.device_mem(mem, dev);
    }
    return 0;
}
