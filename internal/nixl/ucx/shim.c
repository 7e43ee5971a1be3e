#define _GNU_SOURCE
#include "shim.h"

#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <time.h>
#include <unistd.h>

#include <ucp/api/ucp.h>

#define NX_AM_ID   0x4e58 /* notifications */
#define NX_AM_PING 0x4e59 /* connect probe: answered with a PONG */
#define NX_AM_PONG 0x4e5a

static ucp_context_h g_ctx;

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
    uint64_t        pong;       /* last connect-probe token answered (under mu) */
    uint64_t        ping_token; /* next token (under mu) */

    atomic_int      pace_ms; /* >0: progress only every pace_ms (nx_ctx_set_progress_pace) */

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

static void pend_add(nx_ctx_t *c, void *req)
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

static void pend_del(void *req)
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
    n->c = NULL;
}

/* done_req is what every completion callback does with its request. */
static void done_req(void *req)
{
    if (req != NULL) {
        pend_del(req);
        ucp_request_free(req);
    }
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

uint64_t nx_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

const char *nx_ucx_version(void) { return ucp_get_version_string(); }

/* nx_ucx_config prints the UCP configuration as the library reads it
 * from the environment (UCX_*=value lines, hidden ones too); NULL when it
 * refuses its environment. The caller frees the string. */
char *nx_ucx_config(void)
{
    ucp_config_t *cfg;
    if (ucp_config_read(NULL, NULL, &cfg) != UCS_OK) {
        return NULL;
    }
    char  *buf = NULL;
    size_t len = 0;
    FILE  *f   = open_memstream(&buf, &len);
    if (f != NULL) {
        ucp_config_print(cfg, f, NULL, (ucs_config_print_flags_t)(UCS_CONFIG_PRINT_CONFIG | UCS_CONFIG_PRINT_HIDDEN));
        fclose(f);
    }
    ucp_config_release(cfg);
    return buf;
}
const char *nx_status_string(int status) { return ucs_status_string((ucs_status_t)status); }
int         nx_status_peer_died(void) { return (int)UCS_ERR_CONNECTION_RESET; }
void nx_free(void *p) { free(p); }

int nx_global_init(char *err, size_t errlen)
{
    ucp_config_t *cfg;
    ucs_status_t  st = ucp_config_read(NULL, NULL, &cfg);
    if (st != UCS_OK) {
        snprintf(err, errlen, "ucp_config_read: %s", ucs_status_string(st));
        return -1;
    }
    /* Notice a dead peer within about a second instead of UCX's 20 s
     * default, unless the user chose a value. */
    if (getenv("UCX_KEEPALIVE_INTERVAL") == NULL) {
        ucp_config_modify(cfg, "KEEPALIVE_INTERVAL", "1s");
    }
    ucp_params_t p;
    memset(&p, 0, sizeof(p));
    p.field_mask        = UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_MT_WORKERS_SHARED;
    p.features          = UCP_FEATURE_RMA | UCP_FEATURE_AM | UCP_FEATURE_WAKEUP;
    p.mt_workers_shared = 1;
    p.field_mask |= UCP_PARAM_FIELD_REQUEST_SIZE;
    p.request_size = sizeof(struct pend);
    st                  = ucp_init(&p, cfg, &g_ctx);
    ucp_config_release(cfg);
    if (st != UCS_OK) {
        snprintf(err, errlen, "ucp_init: %s", ucs_status_string(st));
        return -1;
    }
    return 0;
}

/* ---- notifications ---------------------------------------------------- */

static void wake_eventfd(int fd)
{
    uint64_t one = 1;
    ssize_t  r   = write(fd, &one, sizeof(one));
    (void)r;
}

/* enqueue_notif takes ownership of payload (sender-name header + message). */
static void enqueue_notif(nx_ctx_t *c, char *payload, size_t len)
{
    uint16_t namelen;
    if (len < 2) {
        goto malformed;
    }
    memcpy(&namelen, payload, 2);
    if ((size_t)namelen + 2 > len) {
        goto malformed;
    }
    struct nx_notif *n = calloc(1, sizeof(*n));
    if (n == NULL) {
        free(payload);
        return;
    }
    n->sender = malloc(namelen + 1);
    n->msg    = malloc(len - 2 - namelen + 1);
    if (n->sender == NULL || n->msg == NULL) {
        free(n->sender);
        free(n->msg);
        free(n);
        free(payload);
        return;
    }
    memcpy(n->sender, payload + 2, namelen);
    n->slen = namelen;
    memcpy(n->msg, payload + 2 + namelen, len - 2 - namelen);
    n->mlen = len - 2 - namelen;
    free(payload);
    pthread_mutex_lock(&c->qmu);
    if (c->qtail) {
        c->qtail->next = n;
    } else {
        c->qhead = n;
    }
    c->qtail = n;
    pthread_mutex_unlock(&c->qmu);
    wake_eventfd(c->notifyfd);
    return;
malformed:
    free(payload);
    pthread_mutex_lock(&c->qmu);
    c->malformed++;
    pthread_mutex_unlock(&c->qmu);
}

uint64_t nx_ctx_malformed_notifs(nx_ctx_t *c)
{
    pthread_mutex_lock(&c->qmu);
    uint64_t m = c->malformed;
    pthread_mutex_unlock(&c->qmu);
    return m;
}

int nx_pop_notif(nx_ctx_t *c, char **sender, size_t *slen, char **msg, size_t *mlen)
{
    pthread_mutex_lock(&c->qmu);
    struct nx_notif *n = c->qhead;
    if (n) {
        c->qhead = n->next;
        if (c->qhead == NULL) {
            c->qtail = NULL;
        }
    }
    pthread_mutex_unlock(&c->qmu);
    if (n == NULL) {
        return 0;
    }
    *sender = n->sender;
    *slen   = n->slen;
    *msg    = n->msg;
    *mlen   = n->mlen;
    free(n);
    return 1;
}

struct rndv_recv {
    nx_ctx_t *c;
    char     *buf;
    size_t    len;
};

static void rndv_done(void *req, ucs_status_t st, size_t length, void *user)
{
    struct rndv_recv *r = user;
    if (st == UCS_OK) {
        enqueue_notif(r->c, r->buf, length);
    } else {
        free(r->buf);
    }
    free(r);
    done_req(req);
}

static ucs_status_t am_recv(void *arg, const void *header, size_t header_length, void *data,
                            size_t length, const ucp_am_recv_param_t *param)
{
    nx_ctx_t *c = arg;
    (void)header;
    (void)header_length;
    char *buf = malloc(length ? length : 1);
    if (buf == NULL) {
        return UCS_OK;
    }
    if (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) {
        struct rndv_recv *r = malloc(sizeof(*r));
        if (r == NULL) {
            free(buf);
            return UCS_OK;
        }
        r->c = c;
        r->buf = buf;
        r->len = length;
        ucp_request_param_t p;
        memset(&p, 0, sizeof(p));
        p.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
        p.cb.recv_am   = rndv_done;
        p.user_data    = r;
        ucs_status_ptr_t sp = ucp_am_recv_data_nbx(c->worker, data, buf, length, &p);
        if (sp == NULL) {
            rndv_done(NULL, UCS_OK, length, r);
        } else if (UCS_PTR_IS_ERR(sp)) {
            rndv_done(NULL, UCS_PTR_STATUS(sp), 0, r);
        } else {
            pend_add(c, sp);
        }
        return UCS_OK;
    }
    memcpy(buf, data, length);
    enqueue_notif(c, buf, length);
    return UCS_OK;
}

/* ---- transfers -------------------------------------------------------- */

static void xfer_free(nx_xfer_t *x);

static void mark_ready(nx_xfer_t *x)
{
    if (!x->queued) {
        x->queued     = 1;
        x->next_ready = x->c->ready;
        x->c->ready   = x;
    }
}

static void op_done(void *req, ucs_status_t st, void *user)
{
    nx_xfer_t *x = user;
    if (st != UCS_OK && x->err == UCS_OK) {
        x->err = st;
    }
    done_req(req);
    if (--x->outstanding == 0) {
        if (x->free_when_idle) {
            xfer_free(x);
            return;
        }
        mark_ready(x);
    }
}

/* track issues one operation's status pointer: 0 done, 1 pending, -1 error. */
static int track(nx_xfer_t *x, ucs_status_ptr_t sp)
{
    if (sp == NULL) {
        return 0;
    }
    x->all_inline = 0;
    if (!UCS_PTR_IS_ERR(sp)) {
        pend_add(x->c, sp);
    }
    if (UCS_PTR_IS_ERR(sp)) {
        if (x->err == UCS_OK) {
            x->err = UCS_PTR_STATUS(sp);
        }
        return -1;
    }
    x->outstanding++;
    return 1;
}

static ucp_request_param_t op_param(nx_xfer_t *x)
{
    ucp_request_param_t p;
    memset(&p, 0, sizeof(p));
    p.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
    p.cb.send      = op_done;
    p.user_data    = x;
    return p;
}

static void am_sent(void *req, ucs_status_t st, void *user)
{
    (void)st;
    free(user);
    done_req(req);
}

/* send_am sends [u16 name length][sender name][msg] as one active message;
 * the buffer is freed when UCX is done with it. */
static ucs_status_ptr_t send_am(nx_ctx_t *c, nx_peer_t *p, const void *msg, size_t len)
{
    size_t total = 2 + c->namelen + len;
    char  *buf   = malloc(total);
    if (buf == NULL) {
        return UCS_STATUS_PTR(UCS_ERR_NO_MEMORY);
    }
    uint16_t nl = (uint16_t)c->namelen;
    memcpy(buf, &nl, 2);
    memcpy(buf + 2, c->name, c->namelen);
    memcpy(buf + 2 + c->namelen, msg, len);
    ucp_request_param_t prm;
    memset(&prm, 0, sizeof(prm));
    prm.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FIELD_FLAGS;
    prm.flags        = UCP_AM_SEND_FLAG_REPLY;
    prm.cb.send      = am_sent;
    prm.user_data    = buf;
    ucs_status_ptr_t sp = ucp_am_send_nbx(p->ep, NX_AM_ID, NULL, 0, buf, total, &prm);
    if (sp == NULL || UCS_PTR_IS_ERR(sp)) {
        free(buf);
    } else {
        pend_add(c, sp);
    }
    return sp;
}

/* xfer_am_sent completes a transfer's notification: the transfer is done
 * only once UCX finished sending it, and fails if the send failed. */
static void xfer_am_sent(void *req, ucs_status_t st, void *user)
{
    nx_xfer_t *x = user;
    free(x->am_buf);
    x->am_buf = NULL;
    op_done(req, st, user);
}

static ucs_status_ptr_t send_xfer_am(nx_xfer_t *x)
{
    nx_ctx_t *c     = x->c;
    size_t    total = 2 + c->namelen + x->nlen;
    char     *buf   = malloc(total);
    if (buf == NULL) {
        return UCS_STATUS_PTR(UCS_ERR_NO_MEMORY);
    }
    uint16_t nl = (uint16_t)c->namelen;
    memcpy(buf, &nl, 2);
    memcpy(buf + 2, c->name, c->namelen);
    memcpy(buf + 2 + c->namelen, x->notif, x->nlen);
    ucp_request_param_t prm;
    memset(&prm, 0, sizeof(prm));
    prm.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FIELD_FLAGS;
    prm.flags        = UCP_AM_SEND_FLAG_REPLY;
    prm.cb.send      = xfer_am_sent;
    prm.user_data    = x;
    x->am_buf        = buf;
    ucs_status_ptr_t sp = ucp_am_send_nbx(x->peer->ep, NX_AM_ID, NULL, 0, buf, total, &prm);
    if (sp == NULL || UCS_PTR_IS_ERR(sp)) {
        free(buf);
        x->am_buf = NULL;
    }
    return sp;
}

static void activate(nx_xfer_t *x)
{
    nx_ctx_t *c    = x->c;
    x->prev_active = NULL;
    x->next_active = c->active;
    if (c->active) {
        c->active->prev_active = x;
    }
    c->active = x;
    c->inflight++;
}

static void finish(nx_xfer_t *x, int state)
{
    nx_ctx_t *c = x->c;
    /* Completing inside the post: the post's end time is the completion
     * time (saves a clock read per request on the fast path). */
    x->pub.t_done = c->now_hint ? c->now_hint : nx_now_ns();
    set_state(x, state);
    if (x->prev_active) {
        x->prev_active->next_active = x->next_active;
    } else {
        c->active = x->next_active;
    }
    if (x->next_active) {
        x->next_active->prev_active = x->prev_active;
    }
    x->next_active = x->prev_active = NULL;
    c->inflight--;
}

static void xfer_free(nx_xfer_t *x)
{
    free(x->ops);
    free(x->notif);
    free(x);
}

/* advance moves a transfer whose outstanding operations all completed to
 * its next phase: ops -> flush (WRITE with a notification) -> notification
 * -> done. A flush completes only when the writes are visible at the
 * target, so the notification always arrives after the data. */
static void advance(nx_xfer_t *x)
{
    for (;;) {
        if (x->outstanding > 0) {
            return;
        }
        int st = xstate(x);
        if (st == NX_DONE || st == NX_ERROR || st == NX_IDLE) {
            return;
        }
        if (x->err == UCS_OK && atomic_load(&x->peer->status) != UCS_OK) {
            x->err = atomic_load(&x->peer->status);
        }
        if (x->err != UCS_OK) {
            finish(x, NX_ERROR);
            return;
        }
        switch (st) {
        case NX_RUNNING:
            /* Like NIXL, a WRITE is only done once a flush says the data is
             * visible at the target; the notification follows it. Writes that
             * a host-local transport (mapped shared memory) completed in
             * place are visible already: the copy itself was the delivery. */
            if (x->op == NX_OP_WRITE && x->n > 0 && !(x->peer->rma_local && x->all_inline)) {
                ucp_request_param_t p = op_param(x); /* only here: the fast path needs none */
                set_state(x, NX_FLUSHING);
                track(x, ucp_ep_flush_nbx(x->peer->ep, &p));
                continue;
            }
            if (x->nlen == 0) {
                finish(x, NX_DONE);
                return;
            }
            /* fall through: a READ's data is already here */
        case NX_FLUSHING: {
            if (x->nlen == 0) {
                finish(x, NX_DONE);
                return;
            }
            set_state(x, NX_NOTIFYING);
            /* Done when the notification's send completed (an error fails
             * the transfer rather than losing the notification). */
            track(x, send_xfer_am(x));
            continue;
        }
        case NX_NOTIFYING:
            finish(x, NX_DONE);
            return;
        }
    }
}

static void process_ready(nx_ctx_t *c)
{
    while (c->ready) {
        nx_xfer_t *x = c->ready;
        c->ready     = x->next_ready;
        x->queued    = 0;
        advance(x);
    }
}

static unsigned progress_locked(nx_ctx_t *c)
{
    unsigned total = 0, n;
    do {
        n = ucp_worker_progress(c->worker);
        total += n;
        process_ready(c);
    } while (n > 0);
    return total;
}

nx_xfer_t *nx_xfer_create(nx_ctx_t *c, nx_peer_t *p, int op, const nx_op_t *ops, size_t n,
                          const void *notif, size_t nlen)
{
    nx_xfer_t *x = calloc(1, sizeof(*x));
    if (x == NULL) {
        return NULL;
    }
    x->c    = c;
    x->peer = p;
    x->op   = op;
    x->n    = n;
    if (n > 0) {
        x->ops = malloc(n * sizeof(nx_op_t));
        if (x->ops == NULL) {
            free(x);
            return NULL;
        }
        memcpy(x->ops, ops, n * sizeof(nx_op_t));
    }
    if (nlen > 0) {
        x->notif = malloc(nlen);
        if (x->notif == NULL) {
            free(x->ops);
            free(x);
            return NULL;
        }
        memcpy(x->notif, notif, nlen);
        x->nlen = nlen;
    }
    set_state(x, NX_IDLE);
    return x;
}

int nx_xfer_post(nx_ctx_t *c, nx_xfer_t *x)
{
    pthread_mutex_lock(&c->mu);
    int st = xstate(x);
    if (st != NX_IDLE && st != NX_DONE && st != NX_ERROR) {
        pthread_mutex_unlock(&c->mu);
        return -1; /* still in flight */
    }
    x->err         = atomic_load(&x->peer->status);
    x->outstanding = 0;
    x->all_inline  = 1;
    x->pub.t_post0 = nx_now_ns();
    x->pub.t_done = 0;
    set_state(x, NX_RUNNING);
    activate(x);
    if (x->err == UCS_OK) {
        ucp_request_param_t p = op_param(x);
        ucp_ep_h            ep = x->peer->ep;
        for (size_t i = 0; i < x->n; i++) {
            const nx_op_t *o = &x->ops[i];
            ucs_status_ptr_t sp =
                x->op == NX_OP_WRITE
                    ? ucp_put_nbx(ep, (void *)(uintptr_t)o->local, o->len, o->remote, (ucp_rkey_h)o->rkey, &p)
                    : ucp_get_nbx(ep, (void *)(uintptr_t)o->local, o->len, o->remote, (ucp_rkey_h)o->rkey, &p);
            if (track(x, sp) < 0) {
                break;
            }
        }
    }
    x->pub.t_post1 = nx_now_ns();
    c->now_hint    = x->pub.t_post1;
    advance(x);
    c->now_hint = 0;
    st = xstate(x);
    /* Operations that did not complete in place need progress; the
     * caller usually polls, but measured here, completions come sooner
     * with the progress thread awake too. */
    int wake = st != NX_DONE && st != NX_ERROR;
    pthread_mutex_unlock(&c->mu);
    if (wake) {
        wake_eventfd(c->wakefd);
    }
    return st;
}

int nx_xfer_state(nx_ctx_t *c, nx_xfer_t *x, int progress)
{
    int st = xstate(x);
    if (st == NX_DONE || st == NX_ERROR || st == NX_IDLE || !progress) {
        return st;
    }
    if (pthread_mutex_trylock(&c->mu) == 0) {
        progress_locked(c);
        pthread_mutex_unlock(&c->mu);
    }
    return xstate(x);
}

int nx_xfer_error(nx_xfer_t *x) { return (int)x->err; }

void nx_xfer_times(nx_xfer_t *x, uint64_t *post_start, uint64_t *post_end, uint64_t *done)
{
    *post_start = x->pub.t_post0;
    *post_end   = x->pub.t_post1;
    *done       = __atomic_load_n(&x->pub.t_done, __ATOMIC_ACQUIRE);
}

int nx_xfer_release(nx_ctx_t *c, nx_xfer_t *x)
{
    pthread_mutex_lock(&c->mu);
    int st = xstate(x);
    if (st != NX_IDLE && st != NX_DONE && st != NX_ERROR) {
        pthread_mutex_unlock(&c->mu);
        return -1;
    }
    if (x->outstanding > 0) {
        /* Failed early (dead peer) while UCX still owns some of its
         * operations: the last completion frees it. */
        x->free_when_idle = 1;
    } else {
        xfer_free(x);
    }
    pthread_mutex_unlock(&c->mu);
    return 0;
}

/* nx_peer_fail marks a peer dead (our own liveness check saw its process
 * exit) and fails every transfer in flight towards it. */
void nx_peer_fail(nx_ctx_t *c, nx_peer_t *p, int status)
{
    pthread_mutex_lock(&c->mu);
    atomic_store(&p->status, (ucs_status_t)status);
    nx_xfer_t *x = c->active;
    while (x) {
        nx_xfer_t *next = x->next_active;
        if (x->peer == p) {
            if (x->err == UCS_OK) {
                x->err = (ucs_status_t)status;
            }
            finish(x, NX_ERROR);
        }
        x = next;
    }
    pthread_mutex_unlock(&c->mu);
}

int nx_send_notif(nx_ctx_t *c, nx_peer_t *p, const void *msg, size_t len)
{
    pthread_mutex_lock(&c->mu);
    ucs_status_t st = atomic_load(&p->status);
    if (st == UCS_OK) {
        ucs_status_ptr_t sp = send_am(c, p, msg, len);
        if (UCS_PTR_IS_ERR(sp)) {
            st = UCS_PTR_STATUS(sp);
        }
    }
    pthread_mutex_unlock(&c->mu);
    wake_eventfd(c->wakefd);
    return (int)st;
}

/* ---- progress thread -------------------------------------------------- */

/* ---- paced progress (nixlctl probe ucx-leak --progress-interval) ------
 * A paced worker is progressed once, then left alone for pace_ms whatever
 * happens on it: worker events are not waited for, and wake-ups from posts
 * only end the sleep when the agent stops. This starves UCX progress on
 * purpose, the way a busy engine thread does, so that work UCX defers to
 * ucp_worker_progress (its rcache invalidation queue) piles up. Unpaced
 * agents (the default) never reach this code. */
void nx_ctx_set_progress_pace(nx_ctx_t *c, int ms)
{
    atomic_store(&c->pace_ms, ms > 0 ? ms : 0);
    wake_eventfd(c->wakefd);
}

static void paced_progress(nx_ctx_t *c)
{
    pthread_mutex_lock(&c->mu);
    progress_locked(c);
    pthread_mutex_unlock(&c->mu);
    uint64_t deadline = nx_now_ns() + (uint64_t)atomic_load(&c->pace_ms) * 1000000ull;
    for (;;) {
        uint64_t now = nx_now_ns();
        if (atomic_load(&c->stop) || now >= deadline) {
            return;
        }
        struct pollfd pfd = {.fd = c->wakefd, .events = POLLIN};
        if (poll(&pfd, 1, (int)((deadline - now + 999999) / 1000000)) > 0) {
            uint64_t v;
            ssize_t  r = read(c->wakefd, &v, sizeof(v));
            (void)r;
        }
    }
}

static void *progress_main(void *arg)
{
    nx_ctx_t          *c = arg;
    struct epoll_event ev[4];
    while (!atomic_load(&c->stop)) {
        if (atomic_load(&c->pace_ms) > 0) {
            paced_progress(c);
            continue;
        }
        pthread_mutex_lock(&c->mu);
        progress_locked(c);
        ucs_status_t st = c->efd >= 0 ? ucp_worker_arm(c->worker) : UCS_OK;
        pthread_mutex_unlock(&c->mu);
        if (st == UCS_ERR_BUSY) {
            continue; /* more events already pending */
        }
        /* Sleep until the worker has events or someone posts; wake at least
         * every 100 ms (1 ms while transfers are in flight, for transports
         * that complete without an event) so keepalive and timers run. */
        pthread_mutex_lock(&c->mu);
        int timeout = c->inflight > 0 || c->efd < 0 ? 1 : 100;
        pthread_mutex_unlock(&c->mu);
        int n = epoll_wait(c->epfd, ev, 4, timeout);
        for (int i = 0; i < n; i++) {
            if (ev[i].data.fd == c->wakefd) {
                uint64_t v;
                ssize_t  r = read(c->wakefd, &v, sizeof(v));
                (void)r;
            }
        }
    }
    return NULL;
}

/* ---- connect probe ----------------------------------------------------- */

static void probe_sent(void *req, ucs_status_t st, void *user)
{
    (void)st;
    free(user);
    done_req(req);
}

static ucs_status_ptr_t send_token(nx_ctx_t *c, ucp_ep_h ep, unsigned id, uint64_t token, int reply)
{
    uint64_t *buf = malloc(sizeof(*buf));
    if (buf == NULL) {
        return UCS_STATUS_PTR(UCS_ERR_NO_MEMORY);
    }
    *buf = token;
    ucp_request_param_t prm;
    memset(&prm, 0, sizeof(prm));
    prm.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FIELD_FLAGS;
    prm.flags        = reply ? UCP_AM_SEND_FLAG_REPLY : 0;
    prm.cb.send      = probe_sent;
    prm.user_data    = buf;
    ucs_status_ptr_t sp = ucp_am_send_nbx(ep, id, NULL, 0, buf, sizeof(*buf), &prm);
    if (sp == NULL || UCS_PTR_IS_ERR(sp)) {
        free(buf);
    } else {
        pend_add(c, sp);
    }
    return sp;
}

/* A PING proves the peer can reach us and that our endpoint back to it is
 * fully wired up: we answer on the reply endpoint. */
static ucs_status_t am_ping(void *arg, const void *header, size_t header_length, void *data,
                            size_t length, const ucp_am_recv_param_t *param)
{
    (void)arg;
    (void)header;
    (void)header_length;
    uint64_t token;
    if (length != sizeof(token) || !(param->recv_attr & UCP_AM_RECV_ATTR_FIELD_REPLY_EP)) {
        return UCS_OK;
    }
    memcpy(&token, data, sizeof(token));
    send_token(arg, param->reply_ep, NX_AM_PONG, token, 0);
    return UCS_OK;
}

static ucs_status_t am_pong(void *arg, const void *header, size_t header_length, void *data,
                            size_t length, const ucp_am_recv_param_t *param)
{
    nx_ctx_t *c = arg;
    (void)header;
    (void)header_length;
    (void)param;
    if (length == sizeof(uint64_t)) {
        memcpy(&c->pong, data, sizeof(uint64_t)); /* runs under c->mu, inside progress */
    }
    return UCS_OK;
}

static ucs_status_t set_handler(ucp_worker_h w, unsigned id, ucp_am_recv_callback_t cb, void *arg)
{
    ucp_am_handler_param_t ap;
    memset(&ap, 0, sizeof(ap));
    ap.field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID | UCP_AM_HANDLER_PARAM_FIELD_CB |
                    UCP_AM_HANDLER_PARAM_FIELD_ARG | UCP_AM_HANDLER_PARAM_FIELD_FLAGS;
    ap.id    = id;
    ap.cb    = cb;
    ap.arg   = arg;
    ap.flags = UCP_AM_FLAG_WHOLE_MSG;
    return ucp_worker_set_am_recv_handler(w, &ap);
}

/* ---- agent ------------------------------------------------------------ */

nx_ctx_t *nx_ctx_create(const char *name, char *err, size_t errlen)
{
    nx_ctx_t *c = calloc(1, sizeof(*c));
    if (c == NULL) {
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    c->namelen = strlen(name);
    if (c->namelen >= sizeof(c->name)) {
        snprintf(err, errlen, "agent name longer than %zu bytes", sizeof(c->name) - 1);
        free(c);
        return NULL;
    }
    memcpy(c->name, name, c->namelen);
    pthread_mutex_init(&c->mu, NULL);
    pthread_mutex_init(&c->qmu, NULL);
    c->epfd = c->wakefd = c->notifyfd = -1;

    ucp_worker_params_t wp;
    memset(&wp, 0, sizeof(wp));
    wp.field_mask  = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
    wp.thread_mode = UCS_THREAD_MODE_SERIALIZED;
    ucs_status_t st = ucp_worker_create(g_ctx, &wp, &c->worker);
    if (st != UCS_OK) {
        snprintf(err, errlen, "ucp_worker_create: %s", ucs_status_string(st));
        goto fail;
    }
    if ((st = set_handler(c->worker, NX_AM_ID, am_recv, c)) != UCS_OK ||
        (st = set_handler(c->worker, NX_AM_PING, am_ping, c)) != UCS_OK ||
        (st = set_handler(c->worker, NX_AM_PONG, am_pong, c)) != UCS_OK) {
        snprintf(err, errlen, "ucp_worker_set_am_recv_handler: %s", ucs_status_string(st));
        goto fail;
    }
    if (ucp_worker_get_efd(c->worker, &c->efd) != UCS_OK) {
        c->efd = -1; /* no wakeup support: the progress thread polls on a timer */
    }
    c->wakefd   = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    c->notifyfd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    c->epfd     = epoll_create1(EPOLL_CLOEXEC);
    if (c->wakefd < 0 || c->notifyfd < 0 || c->epfd < 0) {
        snprintf(err, errlen, "eventfd/epoll: %s", strerror(errno));
        goto fail;
    }
    struct epoll_event e = {.events = EPOLLIN};
    if (c->efd >= 0) {
        e.data.fd = c->efd;
        epoll_ctl(c->epfd, EPOLL_CTL_ADD, c->efd, &e);
    }
    e.data.fd = c->wakefd;
    epoll_ctl(c->epfd, EPOLL_CTL_ADD, c->wakefd, &e);
    if (pthread_create(&c->thread, NULL, progress_main, c) != 0) {
        snprintf(err, errlen, "pthread_create: %s", strerror(errno));
        goto fail;
    }
    return c;
fail:
    if (c->worker) {
        ucp_worker_destroy(c->worker);
    }
    if (c->epfd >= 0) close(c->epfd);
    if (c->wakefd >= 0) close(c->wakefd);
    if (c->notifyfd >= 0) close(c->notifyfd);
    free(c);
    return NULL;
}

int nx_ctx_notify_fd(nx_ctx_t *c) { return c->notifyfd; }

int nx_ctx_address(nx_ctx_t *c, void **addr, size_t *len)
{
    ucp_address_t *a;
    size_t         l;
    pthread_mutex_lock(&c->mu);
    ucs_status_t st = ucp_worker_get_address(c->worker, &a, &l);
    if (st == UCS_OK) {
        *addr = malloc(l);
        if (*addr) {
            memcpy(*addr, a, l);
            *len = l;
        } else {
            st = UCS_ERR_NO_MEMORY;
        }
        ucp_worker_release_address(c->worker, a);
    }
    pthread_mutex_unlock(&c->mu);
    return (int)st;
}

/* nx_ctx_destroy stops the progress thread and frees the worker. Go closes
 * every peer first (force-closing endpoints fails their in-flight
 * requests), so no callback can run after this returns. */
void nx_ctx_destroy(nx_ctx_t *c)
{
    atomic_store(&c->stop, 1);
    wake_eventfd(c->wakefd);
    pthread_join(c->thread, NULL);
    pthread_mutex_lock(&c->mu);
    /* Let what can still finish finish, then release the rest. */
    uint64_t deadline = nx_now_ns() + 1000000000ull;
    do {
        progress_locked(c);
    } while (c->pending != NULL && nx_now_ns() < deadline);
    while (c->pending != NULL) {
        void *req = c->pending;
        pend_del(req);
        ucp_request_free(req);
    }
    ucp_worker_destroy(c->worker);
    pthread_mutex_unlock(&c->mu);
    close(c->epfd);
    close(c->wakefd);
    close(c->notifyfd);
    struct nx_notif *n = c->qhead;
    while (n) {
        struct nx_notif *next = n->next;
        free(n->sender);
        free(n->msg);
        free(n);
        n = next;
    }
    free(c);
}

/* ---- memory ----------------------------------------------------------- */

int nx_mem_map(nx_ctx_t *c, uint64_t addr, size_t len, int allocate, nx_mem_t **out, char *err, size_t errlen)
{
    (void)c;
    nx_mem_t *m = calloc(1, sizeof(*m));
    if (m == NULL) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    ucp_mem_map_params_t mp;
    memset(&mp, 0, sizeof(mp));
    mp.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH |
                    UCP_MEM_MAP_PARAM_FIELD_FLAGS;
    mp.address = allocate ? NULL : (void *)(uintptr_t)addr;
    mp.length  = len;
    mp.flags   = allocate ? UCP_MEM_MAP_ALLOCATE : 0;
    ucs_status_t st = ucp_mem_map(g_ctx, &mp, &m->memh);
    if (st != UCS_OK) {
        snprintf(err, errlen, "ucp_mem_map: %s", ucs_status_string(st));
        free(m);
        return -1;
    }
    ucp_mem_attr_t ma;
    ma.field_mask = UCP_MEM_ATTR_FIELD_ADDRESS | UCP_MEM_ATTR_FIELD_LENGTH;
    if ((st = ucp_mem_query(m->memh, &ma)) != UCS_OK) {
        snprintf(err, errlen, "ucp_mem_query: %s", ucs_status_string(st));
        ucp_mem_unmap(g_ctx, m->memh);
        free(m);
        return -1;
    }
    m->addr = ma.address;
    m->len  = ma.length;
    *out    = m;
    return 0;
}

void *nx_mem_addr(nx_mem_t *m) { return m->addr; }

int nx_mem_rkey(nx_ctx_t *c, nx_mem_t *m, void **buf, size_t *len)
{
    (void)c;
    void        *rb;
    size_t       rl;
    ucs_status_t st = ucp_rkey_pack(g_ctx, m->memh, &rb, &rl);
    if (st != UCS_OK) {
        return (int)st;
    }
    *buf = malloc(rl);
    if (*buf == NULL) {
        ucp_rkey_buffer_release(rb);
        return (int)UCS_ERR_NO_MEMORY;
    }
    memcpy(*buf, rb, rl);
    *len = rl;
    ucp_rkey_buffer_release(rb);
    return 0;
}

void nx_mem_unmap(nx_ctx_t *c, nx_mem_t *m)
{
    (void)c;
    ucp_mem_unmap(g_ctx, m->memh);
    free(m);
}

/* ---- peers ------------------------------------------------------------ */

static void ep_failed(void *arg, ucp_ep_h ep, ucs_status_t status)
{
    (void)ep;
    nx_peer_t *p = arg;
    atomic_store(&p->status, status);
}

static void flush_done(void *req, ucs_status_t st, void *user)
{
    *(ucs_status_t *)user = st;
    done_req(req);
}

nx_peer_t *nx_peer_create(nx_ctx_t *c, const void *addr, size_t len, int peer_mode, char *err, size_t errlen)
{
    (void)len;
    nx_peer_t *p = calloc(1, sizeof(*p));
    if (p == NULL) {
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    atomic_store(&p->status, UCS_OK);
    ucp_ep_params_t ep;
    memset(&ep, 0, sizeof(ep));
    ep.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE;
    if (peer_mode) {
        ep.field_mask |= UCP_EP_PARAM_FIELD_ERR_HANDLER;
    }
    ep.address         = (const ucp_address_t *)addr;
    ep.err_mode        = peer_mode ? UCP_ERR_HANDLING_MODE_PEER : UCP_ERR_HANDLING_MODE_NONE;
    ep.err_handler.cb  = ep_failed;
    ep.err_handler.arg = p;
    p->peer_mode       = peer_mode;
    pthread_mutex_lock(&c->mu);
    ucs_status_t st = ucp_ep_create(c->worker, &ep, &p->ep);
    if (st != UCS_OK) {
        pthread_mutex_unlock(&c->mu);
        snprintf(err, errlen, "ucp_ep_create: %s", ucs_status_string(st));
        free(p);
        return NULL;
    }
    /* Finish wire-up now (a flush completes only once the endpoint is
     * connected): unreachable peers fail here, not on the first transfer,
     * and no endpoint is torn down half-connected. */
    /* The flush callback writes its status here; on a timeout the request
     * stays with UCX, so the slot is on the heap and deliberately leaked. */
    ucs_status_t *slot = malloc(sizeof(*slot));
    ucs_status_t  fst  = UCS_ERR_NO_MEMORY;
    if (slot != NULL) {
        *slot = UCS_INPROGRESS;
        ucp_request_param_t prm;
        memset(&prm, 0, sizeof(prm));
        prm.op_attr_mask    = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
        prm.cb.send         = flush_done;
        prm.user_data       = slot;
        ucs_status_ptr_t sp = ucp_ep_flush_nbx(p->ep, &prm);
        if (sp == NULL) {
            *slot = UCS_OK;
        } else if (UCS_PTR_IS_ERR(sp)) {
            *slot = UCS_PTR_STATUS(sp);
        } else {
            pend_add(c, sp);
            uint64_t deadline = nx_now_ns() + 10000000000ull;
            while (*slot == UCS_INPROGRESS && nx_now_ns() < deadline) {
                progress_locked(c);
            }
        }
        fst = *slot;
        if (fst == UCS_INPROGRESS) {
            fst = UCS_ERR_TIMED_OUT;
        } else {
            free(slot);
        }
    }
    if (fst == UCS_OK) {
        /* Round trip: wait until the peer answered on its own endpoint back
         * to us, so neither side is torn down with wire-up half done (UCX
         * 1.13 asserts when a peer-mode tcp endpoint fails then). */
        uint64_t         token = ++c->ping_token;
        ucs_status_ptr_t sp    = send_token(c, p->ep, NX_AM_PING, token, 1);
        if (UCS_PTR_IS_ERR(sp)) {
            fst = UCS_PTR_STATUS(sp);
        } else {
            uint64_t deadline = nx_now_ns() + 10000000000ull;
            while (c->pong != token && atomic_load(&p->status) == UCS_OK && nx_now_ns() < deadline) {
                progress_locked(c);
            }
            if (c->pong != token) {
                fst = UCS_ERR_TIMED_OUT;
            }
        }
    }
    if (fst == UCS_OK && atomic_load(&p->status) != UCS_OK) {
        fst = atomic_load(&p->status);
    }
    pthread_mutex_unlock(&c->mu);
    if (fst != UCS_OK) {
        snprintf(err, errlen, "connect: %s", ucs_status_string(fst));
        nx_peer_destroy(c, p);
        return NULL;
    }
    return p;
}

/* nx_rkey_mapped reports whether remote memory behind rkey is mapped into
 * this process (a shared-memory transport copies into it directly). */
int nx_rkey_mapped(nx_ctx_t *c, void *rkey, uint64_t raddr)
{
    void *ptr = NULL;
    pthread_mutex_lock(&c->mu);
    ucs_status_t st = ucp_rkey_ptr((ucp_rkey_h)rkey, raddr, &ptr);
    pthread_mutex_unlock(&c->mu);
    return st == UCS_OK && ptr != NULL;
}

int nx_peer_rkey(nx_ctx_t *c, nx_peer_t *p, const void *packed, void **rkey, char *err, size_t errlen)
{
    pthread_mutex_lock(&c->mu);
    ucs_status_t st = ucp_ep_rkey_unpack(p->ep, packed, (ucp_rkey_h *)rkey);
    pthread_mutex_unlock(&c->mu);
    if (st != UCS_OK) {
        snprintf(err, errlen, "ucp_ep_rkey_unpack: %s", ucs_status_string(st));
        return -1;
    }
    return 0;
}

void nx_rkey_destroy(nx_ctx_t *c, void *rkey)
{
    pthread_mutex_lock(&c->mu);
    ucp_rkey_destroy((ucp_rkey_h)rkey);
    pthread_mutex_unlock(&c->mu);
}

int  nx_peer_status(nx_peer_t *p) { return (int)atomic_load(&p->status); }
void nx_peer_set_rma_local(nx_peer_t *p, int local) { p->rma_local = local; }

int nx_peer_info(nx_ctx_t *c, nx_peer_t *p, char *buf, size_t cap)
{
    char  *mem = NULL;
    size_t sz  = 0;
    FILE  *f   = open_memstream(&mem, &sz);
    if (f == NULL) {
        return -1;
    }
    pthread_mutex_lock(&c->mu);
    ucp_ep_print_info(p->ep, f);
    pthread_mutex_unlock(&c->mu);
    fclose(f);
    size_t n = sz < cap - 1 ? sz : cap - 1;
    memcpy(buf, mem, n);
    buf[n] = 0;
    free(mem);
    return (int)n;
}

/* nx_peer_destroy force-closes the endpoint: UCX fails its outstanding
 * requests, and we progress until the close completes. Returns the number
 * of transfers still in flight on the worker afterwards. */
int nx_peer_destroy(nx_ctx_t *c, nx_peer_t *p)
{
    pthread_mutex_lock(&c->mu);
    ucp_request_param_t prm;
    memset(&prm, 0, sizeof(prm));
    /* Force-closing (which fails in-flight requests) needs peer error
     * handling; without it a live peer gets a flushing close and a dead one
     * is left to the worker's destruction. */
    int dead   = atomic_load(&p->status) != UCS_OK;
    int closed = 0;
    if (p->peer_mode || !dead) {
        prm.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
        prm.flags        = p->peer_mode ? UCP_EP_CLOSE_FLAG_FORCE : 0;
        ucs_status_ptr_t sp = ucp_ep_close_nbx(p->ep, &prm);
        closed              = sp == NULL || UCS_PTR_IS_ERR(sp);
        if (!closed) {
            uint64_t deadline = nx_now_ns() + 2000000000ull;
            while (ucp_request_check_status(sp) == UCS_INPROGRESS && nx_now_ns() < deadline) {
                progress_locked(c);
            }
            closed = ucp_request_check_status(sp) != UCS_INPROGRESS;
            ucp_request_free(sp); /* released either way: UCX finishes it */
        }
    }
    /* Transfers still in flight towards this peer can never finish now. */
    nx_xfer_t *x = c->active;
    while (x) {
        nx_xfer_t *next = x->next_active;
        if (x->peer == p) {
            if (x->err == UCS_OK) {
                x->err = UCS_ERR_CANCELED;
            }
            finish(x, NX_ERROR);
        }
        x = next;
    }
    progress_locked(c);
    int inflight = c->inflight;
    pthread_mutex_unlock(&c->mu);
    if (!p->peer_mode || closed) {
        free(p); /* no error callback can refer to it any more */
    }
    return inflight;
}
