/* The transfer state machine: create, post, advance, finish, release. */
#define _GNU_SOURCE
#include "shim_internal.h"

#include <stdlib.h>
#include <string.h>

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
    return nx_notif_send(x->c, x->peer->ep, x->notif, x->nlen, xfer_am_sent, x, &x->am_buf);
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

void nx_xfer_finish(nx_xfer_t *x, int state)
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
            nx_xfer_finish(x, NX_ERROR);
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
                nx_xfer_finish(x, NX_DONE);
                return;
            }
            /* fall through: a READ's data is already here */
        case NX_FLUSHING: {
            if (x->nlen == 0) {
                nx_xfer_finish(x, NX_DONE);
                return;
            }
            set_state(x, NX_NOTIFYING);
            /* Done when the notification's send completed (an error fails
             * the transfer rather than losing the notification). */
            track(x, send_xfer_am(x));
            continue;
        }
        case NX_NOTIFYING:
            nx_xfer_finish(x, NX_DONE);
            return;
        }
    }
}

void nx_process_ready(nx_ctx_t *c)
{
    while (c->ready) {
        nx_xfer_t *x = c->ready;
        c->ready     = x->next_ready;
        x->queued    = 0;
        advance(x);
    }
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
    nx_lock(c);
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
        nx_progress_locked(c);
        pthread_mutex_unlock(&c->mu);
    }
    return xstate(x);
}

int nx_xfer_release(nx_ctx_t *c, nx_xfer_t *x)
{
    nx_lock(c);
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
