/* nixlctl's own declarations of the CUDA driver API functions it calls,
 * and thin wrappers around them. The driver (libcuda.so.1) is opened with
 * dlopen at run time and never linked, and no CUDA header is included: the
 * types below are declared here with the driver's ABI (CUdeviceptr is an
 * unsigned long long, handles are opaque pointers, CUresult an int,
 * CUipcMemHandle 64 bytes passed by value).
 *
 * Every wrapper that needs a CUDA context takes it as its first argument
 * and makes it current on the calling thread before the call: a context is
 * per thread in CUDA, and a Go goroutine may run each cgo call on a
 * different OS thread, so binding inside the same C call is the only
 * binding that is sure to hold. (cuCtxSetCurrent of the context already
 * current is a thread-local store: cheap.) */
#ifndef NIXLCTL_CUDA_SHIM_H
#define NIXLCTL_CUDA_SHIM_H

#include <stddef.h>
#include <stdint.h>

typedef int                       CUresult;
typedef int                       CUdevice;
typedef unsigned long long        CUdeviceptr;
typedef struct nxcu_opaque_ctx   *CUcontext;
typedef struct nxcu_opaque_strm  *CUstream;
typedef struct nxcu_opaque_event *CUevent;
typedef struct {
    char reserved[64];
} CUipcMemHandle;
typedef struct {
    char bytes[16];
} CUuuid;

/* Driver result codes nixlctl acts on (values from the driver's ABI). */
enum {
    NXCU_SUCCESS                   = 0,
    NXCU_ERROR_INVALID_VALUE       = 1,
    NXCU_ERROR_NO_DEVICE           = 100,
    NXCU_ERROR_INVALID_CONTEXT     = 201,
    NXCU_ERROR_NOT_READY           = 600,
    NXCU_ERROR_PEER_ALREADY_ENABLED = 704,
    /* Not a driver code: the library is not loaded. */
    NXCU_NOT_LOADED = -1,
};

/* Flags (driver ABI values). */
enum {
    NXCU_STREAM_NON_BLOCKING       = 0x1, /* no implicit sync with the legacy default stream */
    NXCU_EVENT_BLOCKING_SYNC       = 0x1, /* waiting threads sleep instead of spinning */
    NXCU_EVENT_DISABLE_TIMING      = 0x2,
    NXCU_IPC_LAZY_ENABLE_PEER      = 0x1, /* cuIpcOpenMemHandle enables peer access when needed */
};

/* One device-to-device copy. */
typedef struct {
    uint64_t dst, src, len;
} nxcu_copy_t;

/* Loading: 0 on success, else err says why. not_found is set when the
 * file itself is missing (as opposed to unusable). */
int  nxcu_load(const char *path, int *not_found, char *err, size_t errlen);
int  nxcu_is_fake(void);
int  nxcu_lib_path(char *buf, size_t len);
const char *nxcu_error_name(int code);
const char *nxcu_error_string(int code);

int nxcu_init(void);
int nxcu_driver_version(int *v);
int nxcu_device_count(int *n);
int nxcu_device_name(int dev, char *buf, int len);
int nxcu_device_uuid(int dev, unsigned char out[16]);
int nxcu_primary_ctx(int dev, CUcontext *ctx);
int nxcu_can_access_peer(int dev, int peer, int *can);
int nxcu_enable_peer(CUcontext ctx, CUcontext peer);

int nxcu_mem_info(CUcontext ctx, uint64_t *free_b, uint64_t *total_b);
int nxcu_mem_alloc(CUcontext ctx, uint64_t size, uint64_t *ptr);
int nxcu_mem_free(CUcontext ctx, uint64_t ptr);
int nxcu_mem_range(CUcontext ctx, uint64_t ptr, uint64_t *base, uint64_t *size);

/* Copies between spans of device memory at base+off[i] (len[i] bytes each)
 * and host memory holding them back to back: into the device (to_device)
 * or out of it. */
int nxcu_copy_spans(CUcontext ctx, uint64_t base, const uint64_t *off, const uint64_t *len, size_t n, void *host,
                    int to_device);

int nxcu_stream_create(CUcontext ctx, CUstream *s);
int nxcu_stream_destroy(CUcontext ctx, CUstream s);
int nxcu_stream_sync(CUcontext ctx, CUstream s);
int nxcu_event_create(CUcontext ctx, unsigned flags, CUevent *e);
int nxcu_event_destroy(CUcontext ctx, CUevent e);
int nxcu_event_query(CUcontext ctx, CUevent e);
int nxcu_event_sync(CUcontext ctx, CUevent e);

/* Issues n async copies on s, then records done on s (when not NULL).
 * *issued counts the copies the driver accepted. */
int nxcu_copy_batch(CUcontext ctx, CUstream s, const nxcu_copy_t *ops, size_t n, CUevent done, size_t *issued);
/* Times reps rounds of the n copies between events e0 and e1 (GPU time). */
int nxcu_time_copies(CUcontext ctx, CUstream s, CUevent e0, CUevent e1, const nxcu_copy_t *ops, size_t n, int reps,
                     float *ms);

int nxcu_ipc_get(CUcontext ctx, uint64_t ptr, unsigned char out[64]);
int nxcu_ipc_open(CUcontext ctx, const unsigned char handle[64], uint64_t *ptr);
int nxcu_ipc_close(CUcontext ctx, uint64_t ptr);

/* The system's driver (system.c): libcuda.so.1 on a handle of its own,
 * whatever NIXLCTL_CUDA_LIB says. nxcu_sys_open loads it and runs cuInit
 * (0, or -1 with the reason in err; once loaded, 0 again). Then: the driver
 * version (-1 unknown), the device count (-1 unknown), and device i's name
 * and total memory (0 when the driver cannot say); -1 if it has none. */
int nxcu_sys_open(char *err, size_t errlen);
int nxcu_sys_driver_version(void);
int nxcu_sys_device_count(void);
int nxcu_sys_device(int i, char *name, int namelen, size_t *mem);

#endif
