/* Peers: endpoint create (flush, ping/pong), rkeys, peer failure, close. */
#define _GNU_SOURCE
#include "shim_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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
ucs_status_t nx_am_ping(void *arg, const void *header, size_t header_length, void *data,
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

ucs_status_t nx_am_pong(void *arg, const void *header, size_t header_length, void *data,
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
    nx_lock(c);
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
                nx_progress_locked(c);
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
                nx_progress_locked(c);
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
    nx_lock(c);
    ucs_status_t st = ucp_rkey_ptr((ucp_rkey_h)rkey, raddr, &ptr);
    pthread_mutex_unlock(&c->mu);
    return st == UCS_OK && ptr != NULL;
}

int nx_peer_rkey(nx_ctx_t *c, nx_peer_t *p, const void *packed, void **rkey, char *err, size_t errlen)
{
    nx_lock(c);
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
    nx_lock(c);
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
    nx_lock(c);
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
    nx_lock(c);
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
                nx_progress_locked(c);
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
            nx_xfer_finish(x, NX_ERROR);
        }
        x = next;
    }
    nx_progress_locked(c);
    int inflight = c->inflight;
    pthread_mutex_unlock(&c->mu);
    if (!p->peer_mode || closed) {
        free(p); /* no error callback can refer to it any more */
    }
    return inflight;
}

/* nx_peer_fail marks a peer dead (our own liveness check saw its process
 * exit) and fails every transfer in flight towards it. */
void nx_peer_fail(nx_ctx_t *c, nx_peer_t *p, int status)
{
    nx_lock(c);
    atomic_store(&p->status, (ucs_status_t)status);
    nx_xfer_t *x = c->active;
    while (x) {
        nx_xfer_t *next = x->next_active;
        if (x->peer == p) {
            if (x->err == UCS_OK) {
                x->err = (ucs_status_t)status;
            }
            nx_xfer_finish(x, NX_ERROR);
        }
        x = next;
    }
    pthread_mutex_unlock(&c->mu);
}
