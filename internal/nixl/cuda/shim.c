/* The loader and wrappers declared in shim.h. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <link.h>
#include <stdio.h>
#include <string.h>

#include "shim.h"

_Static_assert(sizeof(CUipcMemHandle) == 64, "CUipcMemHandle is 64 bytes");
_Static_assert(sizeof(CUdeviceptr) == 8, "CUdeviceptr is 64 bits");
_Static_assert(sizeof(nxcu_copy_t) == 24, "nxcu_copy_t is three u64");

/* Every driver function nixlctl calls: member, exported symbol, parameters.
 * The _v2 names are the ones the driver's header maps the plain names to
 * since CUDA 11; the plain symbols are older ABI versions. */
#define NXCU_SYMS(X)                                                                   \
    X(init, "cuInit", (unsigned int))                                                  \
    X(driverGetVersion, "cuDriverGetVersion", (int *))                                 \
    X(deviceGetCount, "cuDeviceGetCount", (int *))                                     \
    X(deviceGet, "cuDeviceGet", (CUdevice *, int))                                     \
    X(deviceGetName, "cuDeviceGetName", (char *, int, CUdevice))                       \
    X(deviceGetUuid, "cuDeviceGetUuid", (CUuuid *, CUdevice))                          \
    X(deviceCanAccessPeer, "cuDeviceCanAccessPeer", (int *, CUdevice, CUdevice))       \
    X(primaryCtxRetain, "cuDevicePrimaryCtxRetain", (CUcontext *, CUdevice))           \
    X(ctxSetCurrent, "cuCtxSetCurrent", (CUcontext))                                   \
    X(ctxEnablePeerAccess, "cuCtxEnablePeerAccess", (CUcontext, unsigned int))         \
    X(memGetInfo, "cuMemGetInfo_v2", (size_t *, size_t *))                             \
    X(memAlloc, "cuMemAlloc_v2", (CUdeviceptr *, size_t))                              \
    X(memFree, "cuMemFree_v2", (CUdeviceptr))                                          \
    X(memGetAddressRange, "cuMemGetAddressRange_v2", (CUdeviceptr *, size_t *, CUdeviceptr)) \
    X(memcpyHtoD, "cuMemcpyHtoD_v2", (CUdeviceptr, const void *, size_t))              \
    X(memcpyDtoH, "cuMemcpyDtoH_v2", (void *, CUdeviceptr, size_t))                    \
    X(memcpyDtoDAsync, "cuMemcpyDtoDAsync_v2", (CUdeviceptr, CUdeviceptr, size_t, CUstream)) \
    X(streamCreate, "cuStreamCreate", (CUstream *, unsigned int))                      \
    X(streamDestroy, "cuStreamDestroy_v2", (CUstream))                                 \
    X(streamSynchronize, "cuStreamSynchronize", (CUstream))                            \
    X(eventCreate, "cuEventCreate", (CUevent *, unsigned int))                         \
    X(eventRecord, "cuEventRecord", (CUevent, CUstream))                               \
    X(eventQuery, "cuEventQuery", (CUevent))                                           \
    X(eventSynchronize, "cuEventSynchronize", (CUevent))                               \
    X(eventElapsedTime, "cuEventElapsedTime", (float *, CUevent, CUevent))             \
    X(eventDestroy, "cuEventDestroy_v2", (CUevent))                                    \
    X(ipcGetMemHandle, "cuIpcGetMemHandle", (CUipcMemHandle *, CUdeviceptr))           \
    X(ipcOpenMemHandle, "cuIpcOpenMemHandle_v2", (CUdeviceptr *, CUipcMemHandle, unsigned int)) \
    X(ipcCloseMemHandle, "cuIpcCloseMemHandle", (CUdeviceptr))                         \
    X(getErrorName, "cuGetErrorName", (CUresult, const char **))                       \
    X(getErrorString, "cuGetErrorString", (CUresult, const char **))

static struct {
    void *dl;
    int   fake;
#define NXCU_MEMBER(name, sym, params) CUresult(*name) params;
    NXCU_SYMS(NXCU_MEMBER)
#undef NXCU_MEMBER
} L;

/* Set once, by the first successful nxcu_load (Go calls it once, under
 * sync.OnceValue); every wrapper checks it, so no unresolved symbol is
 * ever called. */
static int loaded;

int nxcu_load(const char *path, int *not_found, char *err, size_t errlen)
{
    *not_found = 0;
    if (loaded) {
        snprintf(err, errlen, "the CUDA driver is loaded already");
        return -1;
    }
    dlerror();
    void *dl = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (dl == NULL) {
        const char *why = dlerror();
        size_t      n   = strlen(path);
        /* glibc reports a missing file and a missing dependency alike as
         * "<name>: cannot open shared object file: No such file or
         * directory"; only the message about the file itself means absent. */
        if (why != NULL && strncmp(why, path, n) == 0 && why[n] == ':' && strstr(why, "No such file") != NULL) {
            *not_found = 1;
        }
        snprintf(err, errlen, "%s", why ? why : "dlopen failed");
        return -1;
    }
    const char *missing = NULL;
    void       *sym;
#define NXCU_RESOLVE(name, symname, params)   \
    if (missing == NULL) {                    \
        sym = dlsym(dl, symname);             \
        if (sym == NULL) {                    \
            missing = symname;                \
        }                                     \
        memcpy(&L.name, &sym, sizeof(sym));   \
    }
    NXCU_SYMS(NXCU_RESOLVE)
#undef NXCU_RESOLVE
    if (missing != NULL) {
        snprintf(err, errlen, "%s has no %s (a CUDA driver older than 11.0, or not a CUDA driver)", path, missing);
        memset(&L, 0, sizeof(L));
        dlclose(dl);
        return -1;
    }
    L.dl   = dl;
    L.fake = dlsym(dl, "nixlctl_fake_libcuda") != NULL;
    loaded = 1;
    return 0;
}

int nxcu_is_fake(void) { return loaded && L.fake; }

int nxcu_lib_path(char *buf, size_t len)
{
    struct link_map *lm = NULL;
    if (!loaded || dlinfo(L.dl, RTLD_DI_LINKMAP, &lm) != 0 || lm == NULL || lm->l_name == NULL) {
        return -1;
    }
    snprintf(buf, len, "%s", lm->l_name);
    return 0;
}

const char *nxcu_error_name(int code)
{
    const char *s = NULL;
    if (code == NXCU_NOT_LOADED) {
        return "NOT_LOADED";
    }
    if (!loaded || L.getErrorName(code, &s) != 0 || s == NULL) {
        return "CUDA_ERROR_UNKNOWN";
    }
    return s;
}

const char *nxcu_error_string(int code)
{
    const char *s = NULL;
    if (code == NXCU_NOT_LOADED) {
        return "the CUDA driver is not loaded";
    }
    if (!loaded || L.getErrorString(code, &s) != 0 || s == NULL) {
        return "unrecognized error code";
    }
    return s;
}

#define NEED_LIB()                   \
    do {                             \
        if (!loaded) {               \
            return NXCU_NOT_LOADED;  \
        }                            \
    } while (0)

/* BIND makes ctx current on this thread; see shim.h for why every call. */
#define BIND(ctx)                                 \
    do {                                          \
        NEED_LIB();                               \
        CUresult r_ = L.ctxSetCurrent(ctx);       \
        if (r_ != 0) {                            \
            return r_;                            \
        }                                         \
    } while (0)

int nxcu_init(void)
{
    NEED_LIB();
    return L.init(0);
}

int nxcu_driver_version(int *v)
{
    NEED_LIB();
    return L.driverGetVersion(v);
}

int nxcu_device_count(int *n)
{
    NEED_LIB();
    return L.deviceGetCount(n);
}

int nxcu_device_name(int dev, char *buf, int len)
{
    NEED_LIB();
    CUdevice d;
    CUresult r = L.deviceGet(&d, dev);
    return r != 0 ? r : L.deviceGetName(buf, len, d);
}

int nxcu_device_uuid(int dev, unsigned char out[16])
{
    NEED_LIB();
    CUdevice d;
    CUuuid   u;
    CUresult r = L.deviceGet(&d, dev);
    if (r == 0 && (r = L.deviceGetUuid(&u, d)) == 0) {
        memcpy(out, u.bytes, 16);
    }
    return r;
}

int nxcu_primary_ctx(int dev, CUcontext *ctx)
{
    NEED_LIB();
    CUdevice d;
    CUresult r = L.deviceGet(&d, dev);
    return r != 0 ? r : L.primaryCtxRetain(ctx, d);
}

int nxcu_can_access_peer(int dev, int peer, int *can)
{
    NEED_LIB();
    CUdevice a, b;
    CUresult r = L.deviceGet(&a, dev);
    if (r == 0) {
        r = L.deviceGet(&b, peer);
    }
    return r != 0 ? r : L.deviceCanAccessPeer(can, a, b);
}

int nxcu_enable_peer(CUcontext ctx, CUcontext peer)
{
    BIND(ctx);
    CUresult r = L.ctxEnablePeerAccess(peer, 0);
    return r == NXCU_ERROR_PEER_ALREADY_ENABLED ? 0 : r;
}

int nxcu_mem_info(CUcontext ctx, uint64_t *free_b, uint64_t *total_b)
{
    BIND(ctx);
    size_t   f = 0, t = 0;
    CUresult r = L.memGetInfo(&f, &t);
    *free_b    = f;
    *total_b   = t;
    return r;
}

int nxcu_mem_alloc(CUcontext ctx, uint64_t size, uint64_t *ptr)
{
    BIND(ctx);
    CUdeviceptr p = 0;
    CUresult    r = L.memAlloc(&p, (size_t)size);
    *ptr          = p;
    return r;
}

int nxcu_mem_free(CUcontext ctx, uint64_t ptr)
{
    BIND(ctx);
    return L.memFree(ptr);
}

int nxcu_mem_range(CUcontext ctx, uint64_t ptr, uint64_t *base, uint64_t *size)
{
    BIND(ctx);
    CUdeviceptr b = 0;
    size_t      s = 0;
    CUresult    r = L.memGetAddressRange(&b, &s, ptr);
    *base         = b;
    *size         = s;
    return r;
}

int nxcu_copy_spans(CUcontext ctx, uint64_t base, const uint64_t *off, const uint64_t *len, size_t n, void *host,
                    int to_device)
{
    BIND(ctx);
    char *h = host;
    for (size_t i = 0; i < n; i++) {
        CUresult r = to_device ? L.memcpyHtoD(base + off[i], h, len[i]) : L.memcpyDtoH(h, base + off[i], len[i]);
        if (r != 0) {
            return r;
        }
        h += len[i];
    }
    /* From pageable memory, cuMemcpyHtoD returns once the bytes are staged:
     * the DMA into device memory may still run, and copies on non-blocking
     * streams (every transfer's) do not wait for it. Seen on an H200: a
     * transfer posted right after a fill read the block half-written. The
     * copies run on the legacy stream; synchronizing it waits for them. */
    return to_device && n > 0 ? L.streamSynchronize(NULL) : 0;
}

int nxcu_stream_create(CUcontext ctx, CUstream *s)
{
    BIND(ctx);
    return L.streamCreate(s, NXCU_STREAM_NON_BLOCKING);
}

int nxcu_stream_destroy(CUcontext ctx, CUstream s)
{
    BIND(ctx);
    return L.streamDestroy(s);
}

int nxcu_stream_sync(CUcontext ctx, CUstream s)
{
    BIND(ctx);
    return L.streamSynchronize(s);
}

int nxcu_event_create(CUcontext ctx, unsigned flags, CUevent *e)
{
    BIND(ctx);
    return L.eventCreate(e, flags);
}

int nxcu_event_destroy(CUcontext ctx, CUevent e)
{
    BIND(ctx);
    return L.eventDestroy(e);
}

int nxcu_event_query(CUcontext ctx, CUevent e)
{
    BIND(ctx);
    return L.eventQuery(e);
}

int nxcu_event_sync(CUcontext ctx, CUevent e)
{
    BIND(ctx);
    return L.eventSynchronize(e);
}

int nxcu_copy_batch(CUcontext ctx, CUstream s, const nxcu_copy_t *ops, size_t n, CUevent done, size_t *issued)
{
    *issued = 0;
    BIND(ctx);
    for (size_t i = 0; i < n; i++) {
        CUresult r = L.memcpyDtoDAsync(ops[i].dst, ops[i].src, ops[i].len, s);
        if (r != 0) {
            return r;
        }
        *issued = i + 1;
    }
    return done != NULL ? L.eventRecord(done, s) : 0;
}

int nxcu_time_copies(CUcontext ctx, CUstream s, CUevent e0, CUevent e1, const nxcu_copy_t *ops, size_t n, int reps,
                     float *ms)
{
    BIND(ctx);
    CUresult r = L.eventRecord(e0, s);
    for (int k = 0; r == 0 && k < reps; k++) {
        for (size_t i = 0; r == 0 && i < n; i++) {
            r = L.memcpyDtoDAsync(ops[i].dst, ops[i].src, ops[i].len, s);
        }
    }
    if (r == 0) {
        r = L.eventRecord(e1, s);
    }
    if (r == 0) {
        r = L.eventSynchronize(e1);
    }
    if (r == 0) {
        r = L.eventElapsedTime(ms, e0, e1);
    } else {
        L.streamSynchronize(s); /* leave nothing of a failed round queued */
    }
    return r;
}

int nxcu_ipc_get(CUcontext ctx, uint64_t ptr, unsigned char out[64])
{
    BIND(ctx);
    CUipcMemHandle h;
    CUresult       r = L.ipcGetMemHandle(&h, ptr);
    if (r == 0) {
        memcpy(out, h.reserved, 64);
    }
    return r;
}

int nxcu_ipc_open(CUcontext ctx, const unsigned char handle[64], uint64_t *ptr)
{
    BIND(ctx);
    CUipcMemHandle h;
    CUdeviceptr    p = 0;
    memcpy(h.reserved, handle, 64);
    CUresult r = L.ipcOpenMemHandle(&p, h, NXCU_IPC_LAZY_ENABLE_PEER);
    *ptr       = p;
    return r;
}

int nxcu_ipc_close(CUcontext ctx, uint64_t ptr)
{
    BIND(ctx);
    return L.ipcCloseMemHandle(ptr);
}
