/* FAKE libcuda FOR nixlctl's TESTS ONLY. It is not a CUDA driver.
 *
 * It exports the CUDA driver API functions nixlctl's cuda package calls,
 * with the driver's symbol names and ABI, so that the real cuda package
 * and the real cuda-ipc backend run unchanged on machines without a GPU:
 *
 *   - "device memory" is host memory from a memfd per allocation, so that
 *     cuIpcGetMemHandle can put {pid, fd, size} in the 64-byte handle and
 *     cuIpcOpenMemHandle in another process maps /proc/PID/fd/FD;
 *   - each stream has a worker thread that runs its copies (memcpy) and
 *     event records in order, so copies really are asynchronous and events
 *     complete later than they are recorded;
 *   - it is strict where the driver is strict and nixlctl could be wrong:
 *     calls that need a context fail without one current on the calling
 *     thread, streams and events must belong to the current context,
 *     copies must stay inside known allocations, a handle cannot be opened
 *     in the process that exported it, opening on another device needs
 *     CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS or peer access;
 *   - cuMemFree waits for every queued copy, as the driver's implicit
 *     synchronization does, so freeing memory under a running copy is as
 *     safe here as it is on a GPU.
 *
 *   - cuMemcpyHtoD from (pageable) host memory returns once the bytes are
 *     staged, as the driver's does; the "DMA" into device memory runs later
 *     on a thread of its own, after a lag. cuMemcpyDtoH, cuMemFree and
 *     cuStreamSynchronize(NULL) (the legacy stream) wait for it; copies on
 *     streams do not. (The first fake wrote at once, and so hid a transfer
 *     that read a block its fill had not finished writing, which an H200
 *     showed.)
 *
 * Knobs (environment, read by cuInit): NIXLCTL_FAKE_CUDA_DEVICES (default
 * 2), NIXLCTL_FAKE_CUDA_DELAY_US (sleep before every async copy, to widen
 * races in ordering tests), NIXLCTL_FAKE_CUDA_DMA_LAG_US (how long staged
 * host-to-device copies wait before they land, default 200).
 *
 * nixlctl refuses this library outside test binaries: it recognises it by
 * the nixlctl_fake_libcuda symbol. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

const char nixlctl_fake_libcuda[] = "nixlctl FAKE CUDA driver: device memory is host memory; for tests only";

/* The driver's types and the result codes nixlctl acts on, as nixlctl's
 * cuda package declares them (build with internal/nixl/cuda on the include
 * path; cudatest writes shim.h beside this file):
 * what the fake implements and what nixlctl calls cannot drift apart. */
#include "shim.h"

/* Result codes nixlctl does not act on (driver ABI values). */
enum {
    NXCU_ERROR_OUT_OF_MEMORY   = 2,
    NXCU_ERROR_NOT_INITIALIZED = 3,
    NXCU_ERROR_INVALID_DEVICE  = 101,
    NXCU_ERROR_INVALID_HANDLE  = 400,
    NXCU_ERROR_NOT_FOUND       = 500,
    NXCU_ERROR_UNKNOWN         = 999,
};

#define MAXDEV 8
#define FAKE_TOTAL (16ull << 30)
#define MAGIC_CTX 0x4354584eu
#define MAGIC_STREAM 0x5254534eu
#define MAGIC_EVENT 0x5456454eu

struct ctx {
    uint32_t magic;
    int      dev;
    int      peer[MAXDEV];
};

struct alloc {
    struct alloc *next;
    uint64_t      base, size;
    int           fd;       /* memfd, kept for export; -1 for imports */
    int           dev;
    int           imported;
};

struct event {
    uint32_t     magic;
    struct ctx  *ctx;
    unsigned     flags;
    uint64_t     rec, done; /* records issued / completed */
    uint64_t     t_ns;
    int          refs;      /* the creator plus queued records */
};

struct op {
    struct op    *next;
    int           record;
    uint64_t      dst, src, n;
    struct event *ev;
    uint64_t      seq;
};

struct stream {
    uint32_t        magic;
    struct ctx     *ctx;
    pthread_t       th;
    pthread_mutex_t mu;
    pthread_cond_t  cv;
    struct op      *head, *tail;
    int             busy, stop;
};

static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER; /* allocations, events */
static pthread_cond_t  g_ev = PTHREAD_COND_INITIALIZER;  /* an event completed */
static struct alloc   *g_allocs;
static uint64_t        g_used[MAXDEV];
static struct ctx      g_ctx[MAXDEV];
static uint64_t        g_pending; /* ops queued on any stream and not yet run */
static int             g_init, g_ndev = 2;
static unsigned        g_delay_us;
static unsigned        g_dma_lag_us = 200;
static void            dma_drain(void);
static __thread struct ctx *cur;

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

#define NEED_INIT()                   \
    do {                              \
        if (!g_init)                  \
            return NXCU_ERROR_NOT_INITIALIZED; \
    } while (0)
#define NEED_CTX()                    \
    do {                              \
        NEED_INIT();                  \
        if (cur == NULL)              \
            return NXCU_ERROR_INVALID_CONTEXT; \
    } while (0)

/* find returns the allocation holding [p, p+n), under g_mu. */
static struct alloc *find(uint64_t p, uint64_t n)
{
    for (struct alloc *a = g_allocs; a; a = a->next) {
        if (p >= a->base && n <= a->size && p - a->base <= a->size - n)
            return a;
    }
    return NULL;
}

static int valid(uint64_t p, uint64_t n)
{
    pthread_mutex_lock(&g_mu);
    int ok = find(p, n ? n : 1) != NULL;
    pthread_mutex_unlock(&g_mu);
    return ok;
}

CUresult cuInit(unsigned int flags)
{
    if (flags != 0)
        return NXCU_ERROR_INVALID_VALUE;
    const char *s = getenv("NIXLCTL_FAKE_CUDA_DEVICES");
    if (s != NULL) {
        g_ndev = atoi(s);
        if (g_ndev < 0 || g_ndev > MAXDEV)
            g_ndev = 0;
    }
    if ((s = getenv("NIXLCTL_FAKE_CUDA_DELAY_US")) != NULL)
        g_delay_us = (unsigned)atoi(s);
    if ((s = getenv("NIXLCTL_FAKE_CUDA_DMA_LAG_US")) != NULL)
        g_dma_lag_us = (unsigned)atoi(s);
    for (int i = 0; i < MAXDEV; i++) {
        g_ctx[i].magic = MAGIC_CTX;
        g_ctx[i].dev   = i;
    }
    g_init = 1;
    return g_ndev == 0 ? NXCU_ERROR_NO_DEVICE : NXCU_SUCCESS;
}

CUresult cuDriverGetVersion(int *v)
{
    if (v == NULL)
        return NXCU_ERROR_INVALID_VALUE;
    *v = 12040;
    return NXCU_SUCCESS;
}

CUresult cuDeviceGetCount(int *n)
{
    NEED_INIT();
    *n = g_ndev;
    return NXCU_SUCCESS;
}

CUresult cuDeviceGet(CUdevice *d, int ordinal)
{
    NEED_INIT();
    if (ordinal < 0 || ordinal >= g_ndev)
        return NXCU_ERROR_INVALID_DEVICE;
    *d = ordinal;
    return NXCU_SUCCESS;
}

CUresult cuDeviceGetName(char *buf, int len, CUdevice d)
{
    NEED_INIT();
    if (d < 0 || d >= g_ndev)
        return NXCU_ERROR_INVALID_DEVICE;
    snprintf(buf, (size_t)len, "nixlctl FAKE CUDA device %d (host memory, tests only)", d);
    return NXCU_SUCCESS;
}

CUresult cuDeviceGetUuid(CUuuid *u, CUdevice d)
{
    NEED_INIT();
    if (d < 0 || d >= g_ndev)
        return NXCU_ERROR_INVALID_DEVICE;
    for (int i = 0; i < 16; i++)
        u->bytes[i] = (char)(0xf0 + i);
    u->bytes[15] = (char)d;
    return NXCU_SUCCESS;
}

CUresult cuDeviceCanAccessPeer(int *can, CUdevice a, CUdevice b)
{
    NEED_INIT();
    if (a < 0 || a >= g_ndev || b < 0 || b >= g_ndev)
        return NXCU_ERROR_INVALID_DEVICE;
    *can = a != b;
    return NXCU_SUCCESS;
}

CUresult cuDevicePrimaryCtxRetain(void **ctx, CUdevice d)
{
    NEED_INIT();
    if (d < 0 || d >= g_ndev)
        return NXCU_ERROR_INVALID_DEVICE;
    *ctx = &g_ctx[d];
    return NXCU_SUCCESS;
}

CUresult cuCtxSetCurrent(void *c)
{
    NEED_INIT();
    struct ctx *x = c;
    if (x != NULL && (x < &g_ctx[0] || x >= &g_ctx[g_ndev] || x->magic != MAGIC_CTX))
        return NXCU_ERROR_INVALID_CONTEXT;
    cur = x;
    return NXCU_SUCCESS;
}

CUresult cuCtxEnablePeerAccess(void *peer, unsigned int flags)
{
    NEED_CTX();
    struct ctx *p = peer;
    if (flags != 0 || p == NULL || p == cur || p->magic != MAGIC_CTX)
        return NXCU_ERROR_INVALID_VALUE;
    if (cur->peer[p->dev])
        return NXCU_ERROR_PEER_ALREADY_ENABLED;
    cur->peer[p->dev] = 1;
    return NXCU_SUCCESS;
}

CUresult cuMemGetInfo_v2(size_t *free_b, size_t *total)
{
    NEED_CTX();
    pthread_mutex_lock(&g_mu);
    *total  = FAKE_TOTAL;
    *free_b = FAKE_TOTAL - g_used[cur->dev];
    pthread_mutex_unlock(&g_mu);
    return NXCU_SUCCESS;
}

CUresult cuMemAlloc_v2(CUdeviceptr *ptr, size_t size)
{
    NEED_CTX();
    if (size == 0)
        return NXCU_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&g_mu);
    int over = g_used[cur->dev] + size > FAKE_TOTAL;
    pthread_mutex_unlock(&g_mu);
    if (over)
        return NXCU_ERROR_OUT_OF_MEMORY;
    int fd = memfd_create("nixlctl-fake-cuda", MFD_CLOEXEC);
    if (fd < 0)
        return NXCU_ERROR_OUT_OF_MEMORY;
    if (ftruncate(fd, (off_t)size) != 0) {
        close(fd);
        return NXCU_ERROR_OUT_OF_MEMORY;
    }
    void *p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) {
        close(fd);
        return NXCU_ERROR_OUT_OF_MEMORY;
    }
    struct alloc *a = calloc(1, sizeof(*a));
    a->base         = (uint64_t)(uintptr_t)p;
    a->size         = size;
    a->fd           = fd;
    a->dev          = cur->dev;
    pthread_mutex_lock(&g_mu);
    a->next  = g_allocs;
    g_allocs = a;
    g_used[cur->dev] += size;
    pthread_mutex_unlock(&g_mu);
    *ptr = a->base;
    return NXCU_SUCCESS;
}

/* unlink_alloc removes the allocation based at p of the given kind. */
static struct alloc *unlink_alloc(uint64_t p, int imported)
{
    pthread_mutex_lock(&g_mu);
    struct alloc **pp = &g_allocs, *a;
    while ((a = *pp) != NULL && !(a->base == p && a->imported == imported))
        pp = &a->next;
    if (a != NULL) {
        *pp = a->next;
        if (!imported)
            g_used[a->dev] -= a->size;
    }
    pthread_mutex_unlock(&g_mu);
    return a;
}

CUresult cuMemFree_v2(CUdeviceptr p)
{
    NEED_CTX();
    /* Like the driver's implicit synchronization: queued copies finish
     * before memory goes away (they might read or write it). */
    dma_drain();
    pthread_mutex_lock(&g_mu);
    while (g_pending > 0)
        pthread_cond_wait(&g_ev, &g_mu);
    pthread_mutex_unlock(&g_mu);
    struct alloc *a = unlink_alloc(p, 0);
    if (a == NULL)
        return NXCU_ERROR_INVALID_VALUE;
    munmap((void *)(uintptr_t)a->base, a->size);
    close(a->fd);
    free(a);
    return NXCU_SUCCESS;
}

CUresult cuMemGetAddressRange_v2(CUdeviceptr *base, size_t *size, CUdeviceptr p)
{
    NEED_CTX();
    pthread_mutex_lock(&g_mu);
    struct alloc *a = find(p, 1);
    if (a != NULL) {
        *base = a->base;
        *size = a->size;
    }
    pthread_mutex_unlock(&g_mu);
    return a != NULL ? NXCU_SUCCESS : NXCU_ERROR_NOT_FOUND;
}

/* ---- staged host-to-device copies (the legacy stream's DMA) -------------- */

struct dma {
    struct dma *next;
    uint64_t    dst;
    size_t      n;
    char        data[];
};
static pthread_mutex_t g_dma_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t  g_dma_cv = PTHREAD_COND_INITIALIZER;
static struct dma     *g_dma_head, *g_dma_tail;
static int             g_dma_busy, g_dma_started;

/* Lands staged copies in order; after being idle it first waits the lag,
 * the window in which a copy on another stream reads the old bytes. */
static void *dma_main(void *arg)
{
    (void)arg;
    pthread_mutex_lock(&g_dma_mu);
    for (;;) {
        while (g_dma_head == NULL)
            pthread_cond_wait(&g_dma_cv, &g_dma_mu);
        g_dma_busy = 1;
        pthread_mutex_unlock(&g_dma_mu);
        if (g_dma_lag_us > 0)
            usleep(g_dma_lag_us);
        pthread_mutex_lock(&g_dma_mu);
        while (g_dma_head != NULL) {
            struct dma *d = g_dma_head;
            g_dma_head    = d->next;
            if (g_dma_head == NULL)
                g_dma_tail = NULL;
            pthread_mutex_unlock(&g_dma_mu);
            memcpy((void *)(uintptr_t)d->dst, d->data, d->n);
            free(d);
            pthread_mutex_lock(&g_dma_mu);
        }
        g_dma_busy = 0;
        pthread_cond_broadcast(&g_dma_cv);
    }
    return NULL;
}

/* dma_drain waits until every staged copy has landed. */
static void dma_drain(void)
{
    pthread_mutex_lock(&g_dma_mu);
    while (g_dma_head != NULL || g_dma_busy)
        pthread_cond_wait(&g_dma_cv, &g_dma_mu);
    pthread_mutex_unlock(&g_dma_mu);
}

CUresult cuMemcpyHtoD_v2(CUdeviceptr dst, const void *src, size_t n)
{
    NEED_CTX();
    if (!valid(dst, n))
        return NXCU_ERROR_INVALID_VALUE;
    struct dma *d = malloc(sizeof *d + n);
    if (d == NULL)
        return NXCU_ERROR_OUT_OF_MEMORY;
    d->next = NULL;
    d->dst  = dst;
    d->n    = n;
    memcpy(d->data, src, n);
    pthread_mutex_lock(&g_dma_mu);
    if (!g_dma_started) {
        pthread_t th;
        if (pthread_create(&th, NULL, dma_main, NULL) != 0) {
            pthread_mutex_unlock(&g_dma_mu);
            free(d);
            return NXCU_ERROR_OUT_OF_MEMORY;
        }
        pthread_detach(th);
        g_dma_started = 1;
    }
    if (g_dma_tail != NULL)
        g_dma_tail->next = d;
    else
        g_dma_head = d;
    g_dma_tail = d;
    pthread_cond_broadcast(&g_dma_cv);
    pthread_mutex_unlock(&g_dma_mu);
    return NXCU_SUCCESS;
}

CUresult cuMemcpyDtoH_v2(void *dst, CUdeviceptr src, size_t n)
{
    NEED_CTX();
    if (!valid(src, n))
        return NXCU_ERROR_INVALID_VALUE;
    dma_drain(); /* the legacy stream: earlier staged copies land first */
    memcpy(dst, (const void *)(uintptr_t)src, n);
    return NXCU_SUCCESS;
}

/* ---- streams and events ------------------------------------------------ */

static void event_unref(struct event *e)
{
    /* under g_mu */
    if (--e->refs == 0) {
        e->magic = 0;
        free(e);
    }
}

static void *stream_main(void *arg)
{
    struct stream *s = arg;
    pthread_mutex_lock(&s->mu);
    for (;;) {
        while (s->head == NULL && !s->stop)
            pthread_cond_wait(&s->cv, &s->mu);
        if (s->head == NULL && s->stop)
            break;
        struct op *o = s->head;
        s->head      = o->next;
        if (s->head == NULL)
            s->tail = NULL;
        s->busy = 1;
        pthread_mutex_unlock(&s->mu);
        if (o->record) {
            pthread_mutex_lock(&g_mu);
            if (o->seq > o->ev->done) {
                o->ev->done = o->seq;
                o->ev->t_ns = now_ns();
            }
            event_unref(o->ev);
            pthread_cond_broadcast(&g_ev);
            pthread_mutex_unlock(&g_mu);
        } else {
            if (g_delay_us)
                usleep(g_delay_us);
            memmove((void *)(uintptr_t)o->dst, (const void *)(uintptr_t)o->src, o->n);
        }
        free(o);
        pthread_mutex_lock(&g_mu);
        g_pending--;
        pthread_cond_broadcast(&g_ev);
        pthread_mutex_unlock(&g_mu);
        pthread_mutex_lock(&s->mu);
        s->busy = 0;
        pthread_cond_broadcast(&s->cv);
    }
    pthread_mutex_unlock(&s->mu);
    return NULL;
}

static struct stream *as_stream(void *p)
{
    struct stream *s = p;
    return s != NULL && s->magic == MAGIC_STREAM ? s : NULL;
}

static struct event *as_event(void *p)
{
    struct event *e = p;
    return e != NULL && e->magic == MAGIC_EVENT ? e : NULL;
}

static void enqueue(struct stream *s, struct op *o)
{
    pthread_mutex_lock(&g_mu);
    g_pending++;
    pthread_mutex_unlock(&g_mu);
    pthread_mutex_lock(&s->mu);
    if (s->tail)
        s->tail->next = o;
    else
        s->head = o;
    s->tail = o;
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
}

CUresult cuStreamCreate(void **out, unsigned int flags)
{
    NEED_CTX();
    (void)flags;
    struct stream *s = calloc(1, sizeof(*s));
    s->magic         = MAGIC_STREAM;
    s->ctx           = cur;
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->cv, NULL);
    if (pthread_create(&s->th, NULL, stream_main, s) != 0) {
        free(s);
        return NXCU_ERROR_OUT_OF_MEMORY;
    }
    *out = s;
    return NXCU_SUCCESS;
}

CUresult cuStreamSynchronize(void *p)
{
    NEED_CTX();
    if (p == NULL) { /* the legacy stream: its staged copies */
        dma_drain();
        return NXCU_SUCCESS;
    }
    struct stream *s = as_stream(p);
    if (s == NULL)
        return NXCU_ERROR_INVALID_HANDLE;
    if (s->ctx != cur)
        return NXCU_ERROR_INVALID_CONTEXT;
    pthread_mutex_lock(&s->mu);
    while (s->head != NULL || s->busy)
        pthread_cond_wait(&s->cv, &s->mu);
    pthread_mutex_unlock(&s->mu);
    return NXCU_SUCCESS;
}

CUresult cuStreamDestroy_v2(void *p)
{
    CUresult r = cuStreamSynchronize(p);
    if (r != NXCU_SUCCESS)
        return r;
    struct stream *s = p;
    pthread_mutex_lock(&s->mu);
    s->stop = 1;
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
    pthread_join(s->th, NULL);
    s->magic = 0;
    free(s);
    return NXCU_SUCCESS;
}

CUresult cuMemcpyDtoDAsync_v2(CUdeviceptr dst, CUdeviceptr src, size_t n, void *stream)
{
    NEED_CTX();
    struct stream *s = as_stream(stream);
    if (s == NULL)
        return NXCU_ERROR_INVALID_HANDLE;
    if (s->ctx != cur)
        return NXCU_ERROR_INVALID_CONTEXT;
    if (!valid(dst, n) || !valid(src, n))
        return NXCU_ERROR_INVALID_VALUE;
    struct op *o = calloc(1, sizeof(*o));
    o->dst       = dst;
    o->src       = src;
    o->n         = n;
    enqueue(s, o);
    return NXCU_SUCCESS;
}

CUresult cuEventCreate(void **out, unsigned int flags)
{
    NEED_CTX();
    struct event *e = calloc(1, sizeof(*e));
    e->magic        = MAGIC_EVENT;
    e->ctx          = cur;
    e->flags        = flags;
    e->refs         = 1;
    *out            = e;
    return NXCU_SUCCESS;
}

CUresult cuEventRecord(void *ev, void *stream)
{
    NEED_CTX();
    struct event  *e = as_event(ev);
    struct stream *s = as_stream(stream);
    if (e == NULL || s == NULL)
        return NXCU_ERROR_INVALID_HANDLE;
    if (e->ctx != cur || s->ctx != cur)
        return NXCU_ERROR_INVALID_CONTEXT;
    struct op *o = calloc(1, sizeof(*o));
    o->record    = 1;
    o->ev        = e;
    pthread_mutex_lock(&g_mu);
    o->seq = ++e->rec;
    e->refs++;
    pthread_mutex_unlock(&g_mu);
    enqueue(s, o);
    return NXCU_SUCCESS;
}

CUresult cuEventQuery(void *ev)
{
    NEED_CTX();
    pthread_mutex_lock(&g_mu);
    struct event *e = as_event(ev);
    CUresult      r = e == NULL ? NXCU_ERROR_INVALID_HANDLE : e->done >= e->rec ? NXCU_SUCCESS : NXCU_ERROR_NOT_READY;
    pthread_mutex_unlock(&g_mu);
    return r;
}

CUresult cuEventSynchronize(void *ev)
{
    NEED_CTX();
    pthread_mutex_lock(&g_mu);
    struct event *e = as_event(ev);
    if (e == NULL) {
        pthread_mutex_unlock(&g_mu);
        return NXCU_ERROR_INVALID_HANDLE;
    }
    uint64_t want = e->rec;
    e->refs++;
    while (e->done < want)
        pthread_cond_wait(&g_ev, &g_mu);
    event_unref(e);
    pthread_mutex_unlock(&g_mu);
    return NXCU_SUCCESS;
}

CUresult cuEventElapsedTime(float *ms, void *a, void *b)
{
    NEED_CTX();
    pthread_mutex_lock(&g_mu);
    struct event *e0 = as_event(a), *e1 = as_event(b);
    CUresult      r  = NXCU_SUCCESS;
    if (e0 == NULL || e1 == NULL)
        r = NXCU_ERROR_INVALID_HANDLE;
    else if ((e0->flags | e1->flags) & 0x2)
        r = NXCU_ERROR_INVALID_HANDLE; /* the driver: timing disabled */
    else if (e0->done < e0->rec || e1->done < e1->rec || e0->rec == 0 || e1->rec == 0)
        r = NXCU_ERROR_NOT_READY;
    else
        *ms = (float)((double)(int64_t)(e1->t_ns - e0->t_ns) / 1e6);
    pthread_mutex_unlock(&g_mu);
    return r;
}

CUresult cuEventDestroy_v2(void *ev)
{
    NEED_CTX();
    pthread_mutex_lock(&g_mu);
    struct event *e = as_event(ev);
    if (e != NULL)
        event_unref(e); /* queued records keep it until they ran */
    pthread_mutex_unlock(&g_mu);
    return e != NULL ? NXCU_SUCCESS : NXCU_ERROR_INVALID_HANDLE;
}

/* ---- IPC --------------------------------------------------------------- */

struct fake_handle {
    char     magic[8];
    uint32_t pid;
    int32_t  fd;
    uint64_t size;
    uint32_t dev;
};
_Static_assert(sizeof(struct fake_handle) <= 64, "fits a CUipcMemHandle");

CUresult cuIpcGetMemHandle(CUipcMemHandle *h, CUdeviceptr p)
{
    NEED_CTX();
    pthread_mutex_lock(&g_mu);
    struct alloc *a = find(p, 1);
    int           ok = a != NULL && a->base == p && !a->imported;
    struct fake_handle fh;
    memset(&fh, 0, sizeof(fh));
    if (ok) {
        memcpy(fh.magic, "NXFKCUDA", 8);
        fh.pid  = (uint32_t)getpid();
        fh.fd   = a->fd;
        fh.size = a->size;
        fh.dev  = (uint32_t)a->dev;
    }
    pthread_mutex_unlock(&g_mu);
    if (!ok)
        return NXCU_ERROR_INVALID_VALUE;
    memset(h, 0, sizeof(*h));
    memcpy(h->reserved, &fh, sizeof(fh));
    return NXCU_SUCCESS;
}

CUresult cuIpcOpenMemHandle_v2(CUdeviceptr *out, CUipcMemHandle h, unsigned int flags)
{
    NEED_CTX();
    struct fake_handle fh;
    memcpy(&fh, h.reserved, sizeof(fh));
    if (memcmp(fh.magic, "NXFKCUDA", 8) != 0 || fh.size == 0)
        return NXCU_ERROR_INVALID_VALUE;
    if (fh.pid == (uint32_t)getpid())
        return NXCU_ERROR_INVALID_CONTEXT; /* like the driver: not in the exporting process */
    if ((int)fh.dev != cur->dev && !(flags & 0x1) && !cur->peer[fh.dev % MAXDEV])
        return NXCU_ERROR_INVALID_DEVICE;
    char path[64];
    snprintf(path, sizeof(path), "/proc/%u/fd/%d", fh.pid, fh.fd);
    int fd = open(path, O_RDWR | O_CLOEXEC);
    if (fd < 0)
        return NXCU_ERROR_INVALID_HANDLE;
    struct stat st;
    if (fstat(fd, &st) != 0 || (uint64_t)st.st_size < fh.size) {
        close(fd);
        return NXCU_ERROR_INVALID_HANDLE;
    }
    void *p = mmap(NULL, fh.size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (p == MAP_FAILED)
        return NXCU_ERROR_OUT_OF_MEMORY;
    struct alloc *a = calloc(1, sizeof(*a));
    a->base         = (uint64_t)(uintptr_t)p;
    a->size         = fh.size;
    a->fd           = -1;
    a->dev          = cur->dev;
    a->imported     = 1;
    pthread_mutex_lock(&g_mu);
    a->next  = g_allocs;
    g_allocs = a;
    pthread_mutex_unlock(&g_mu);
    *out = a->base;
    return NXCU_SUCCESS;
}

CUresult cuIpcCloseMemHandle(CUdeviceptr p)
{
    NEED_CTX();
    struct alloc *a = unlink_alloc(p, 1);
    if (a == NULL)
        return NXCU_ERROR_INVALID_VALUE;
    munmap((void *)(uintptr_t)a->base, a->size);
    free(a);
    return NXCU_SUCCESS;
}

/* ---- errors ------------------------------------------------------------ */

static const struct {
    int         code;
    const char *name, *text;
} errs[] = {
    {NXCU_SUCCESS, "CUDA_SUCCESS", "no error"},
    {NXCU_ERROR_INVALID_VALUE, "CUDA_ERROR_INVALID_VALUE", "invalid argument"},
    {NXCU_ERROR_OUT_OF_MEMORY, "CUDA_ERROR_OUT_OF_MEMORY", "out of memory"},
    {NXCU_ERROR_NOT_INITIALIZED, "CUDA_ERROR_NOT_INITIALIZED", "initialization error"},
    {NXCU_ERROR_NO_DEVICE, "CUDA_ERROR_NO_DEVICE", "no CUDA-capable device is detected"},
    {NXCU_ERROR_INVALID_DEVICE, "CUDA_ERROR_INVALID_DEVICE", "invalid device ordinal"},
    {NXCU_ERROR_INVALID_CONTEXT, "CUDA_ERROR_INVALID_CONTEXT", "invalid device context"},
    {NXCU_ERROR_INVALID_HANDLE, "CUDA_ERROR_INVALID_HANDLE", "invalid resource handle"},
    {NXCU_ERROR_NOT_FOUND, "CUDA_ERROR_NOT_FOUND", "named symbol not found"},
    {NXCU_ERROR_NOT_READY, "CUDA_ERROR_NOT_READY", "device not ready"},
    {NXCU_ERROR_PEER_ALREADY_ENABLED, "CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED", "peer access is already enabled"},
    {NXCU_ERROR_UNKNOWN, "CUDA_ERROR_UNKNOWN", "unknown error"},
};

static int lookup(int code)
{
    for (size_t i = 0; i < sizeof(errs) / sizeof(errs[0]); i++) {
        if (errs[i].code == code)
            return (int)i;
    }
    return -1;
}

CUresult cuGetErrorName(CUresult code, const char **s)
{
    int i = lookup(code);
    if (i < 0)
        return NXCU_ERROR_INVALID_VALUE;
    *s = errs[i].name;
    return NXCU_SUCCESS;
}

CUresult cuGetErrorString(CUresult code, const char **s)
{
    int i = lookup(code);
    if (i < 0)
        return NXCU_ERROR_INVALID_VALUE;
    *s = errs[i].text;
    return NXCU_SUCCESS;
}
