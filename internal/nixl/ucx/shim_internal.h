/* Internal to the ucx shim: the structures its C files share, the small
 * helpers they inline, and the functions one file calls in another. Go sees
 * only shim.h. Files by concern:
 *   ctx.c       global init, agent (context/worker) create/destroy, address
 *   xfer.c      the transfer state machine and pending-request tracking
 *   progress.c  the progress thread and its pacing
 *   notif.c     the notification queue, its active-message receive and send
 *   peer.c      endpoints, connect ping/pong, rkeys, peer failure, flush
 *   mem.c       memory registration and packed rkeys
 *   logfold.c   folding of UCX's repeated warnings and errors */
#ifndef NIXLCTL_UCX_SHIM_INTERNAL_H
#define NIXLCTL_UCX_SHIM_INTERNAL_H

#include "shim.h"

#include <pthread.h>
#include <stdatomic.h>
#include <time.h>
#include <unistd.h>

#include <ucp/api/ucp.h>

#define NX_AM_ID   0x4e58 /* notifications */
#define NX_AM_PING 0x4e59 /* connect probe: answered with a PONG */
#define NX_AM_PONG 0x4e5a

struct nx_notif {
    struct nx_notif *next;
    char            *sender;
    size_t           slen;
    char            *msg;
    size_t           mlen;
};

struct nx_ctx {
    ucp_worker_h    worker;
    pthread_mutex_t mu;       /* serialises every UCX call on this worker */
    pthread_t       thread;   /* progress thread */
    int             epfd;     /* worker efd + wake fd */
    int             efd;      /* the worker's event fd */
    int             wakefd;   /* eventfd to wake the progress thread */
    int             notifyfd; /* eventfd Go waits on for notifications */
    atomic_int      stop;
    int             inflight; /* transfers not yet DONE/ERROR (under mu) */
    uint64_t        now_hint; /* a fresh clock reading finish may reuse (under mu) */
    nx_xfer_t      *ready;    /* transfers whose outstanding ops reached 0 (under mu) */
    nx_xfer_t      *active;   /* transfers in flight, doubly linked (under mu) */
    char            name[256];
    size_t          namelen;

    struct pend    *pending;    /* UCX requests in flight (under mu) */
    uint64_t        released;   /* requests pend_del took off pending (under mu) */
    uint64_t        pong;       /* last connect-probe token answered (under mu) */
    uint64_t        ping_token; /* next token (under mu) */

    atomic_int      pace_ms; /* >0: progress only every pace_ms (nx_ctx_set_progress_pace) */
    atomic_int      waiters; /* API calls waiting for mu (nx_lock) */

    pthread_mutex_t qmu; /* notification queue */
    struct nx_notif *qhead, *qtail;
    uint64_t        malformed;
};

/* Every UCX request we hold is linked here (the links live in the
 * request's user area, reserved with request_size) until its callback
 * frees it. When an agent goes away with operations that will never
 * complete (a dead peer), the rest are released before the worker is
 * destroyed: UCX 1.13 asserts on requests its user never released. */
struct pend {
    struct pend *next, *prev;
    nx_ctx_t    *c;
};

struct nx_peer {
    ucp_ep_h             ep;
    int                  peer_mode; /* UCP_ERR_HANDLING_MODE_PEER */
    int                  rma_local; /* RMA is a CPU copy on this host (mapped shm, cma) */
    _Atomic ucs_status_t status;
};

struct nx_mem {
    ucp_mem_h memh;
    void     *addr;
    size_t    len;
};

struct nx_xfer {
    nx_xfer_pub_t pub; /* must stay first: Go reads it in place */
    nx_ctx_t    *c;
    nx_peer_t   *peer;
    int          op;
    nx_op_t     *ops;
    size_t       n;
    void        *notif;
    size_t       nlen;
    int          outstanding;
    ucs_status_t err;
    int          all_inline; /* every operation of this posting completed in place */
    nx_xfer_t   *next_ready;
    int          queued;
    nx_xfer_t   *next_active, *prev_active;
    int          free_when_idle; /* released while UCX still owns requests */
    void        *am_buf;         /* the notification being sent */
};

/* Frames a notification and sends it as one active message (notif.c). */
ucs_status_ptr_t nx_notif_send(nx_ctx_t *c, ucp_ep_h ep, const void *msg, size_t len,
                               ucp_send_nbx_callback_t cb, void *user, void **frame);

/* The process's one UCP context (nx_global_init). */
extern ucp_context_h nx_g_ctx;

static inline void pend_add(nx_ctx_t *c, void *req)
{
    struct pend *n = req;
    n->c           = c;
    n->prev        = NULL;
    n->next        = c->pending;
    if (c->pending) {
        c->pending->prev = n;
    }
    c->pending = n;
}

static inline void pend_del(void *req)
{
    struct pend *n = req;
    if (req == NULL || n->c == NULL) {
        return;
    }
    if (n->prev) {
        n->prev->next = n->next;
    } else {
        n->c->pending = n->next;
    }
    if (n->next) {
        n->next->prev = n->prev;
    }
    n->c->released++;
    n->c = NULL;
}

/* done_req is what every completion callback does with its request. */
static inline void done_req(void *req)
{
    if (req != NULL) {
        pend_del(req);
        ucp_request_free(req);
    }
}

/* nx_lock takes mu for an API call, counted in waiters while it waits, so
 * a progress loop holding mu lets go between two ucp_worker_progress calls
 * (nx_progress_locked). Without that, a worker streaming fragments (UCX's
 * emulated RMA moves 256 MiB as tens of thousands of them) kept mu for as
 * long as data came: posts and notifications waited up to 95 ms, and the
 * pipeline drained before the next transfer could start. */
static inline void nx_lock(nx_ctx_t *c)
{
    atomic_fetch_add(&c->waiters, 1);
    pthread_mutex_lock(&c->mu);
    atomic_fetch_sub(&c->waiters, 1);
}

/* A transfer's state is published with release stores, after its times,
 * so that Go can read both without a call into C. */
static inline int  xstate(nx_xfer_t *x) { return __atomic_load_n(&x->pub.state, __ATOMIC_ACQUIRE); }
static inline void set_state(nx_xfer_t *x, int st)
{
    if (st == NX_ERROR) {
        x->pub.err = (int32_t)x->err;
    }
    __atomic_store_n(&x->pub.state, st, __ATOMIC_RELEASE);
}

static inline uint64_t nx_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static inline void wake_eventfd(int fd)
{
    uint64_t one = 1;
    ssize_t  r   = write(fd, &one, sizeof(one));
    (void)r;
}

/* Across files (all under c->mu unless said otherwise). */
unsigned nx_progress_locked(nx_ctx_t *c);            /* progress.c */
void    *nx_progress_main(void *arg);                /* progress.c: the progress thread */
void     nx_process_ready(nx_ctx_t *c);              /* xfer.c */
void     nx_xfer_finish(nx_xfer_t *x, int state);    /* xfer.c */
void     nx_enqueue_notif(nx_ctx_t *c, char *payload, size_t len); /* notif.c; takes c->qmu */
ucs_status_t nx_am_recv(void *arg, const void *header, size_t header_length, void *data, size_t length,
                        const ucp_am_recv_param_t *param); /* notif.c */
ucs_status_t nx_am_ping(void *arg, const void *header, size_t header_length, void *data, size_t length,
                        const ucp_am_recv_param_t *param); /* peer.c */
ucs_status_t nx_am_pong(void *arg, const void *header, size_t header_length, void *data, size_t length,
                        const ucp_am_recv_param_t *param); /* peer.c */

#endif
