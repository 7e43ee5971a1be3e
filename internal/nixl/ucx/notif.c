/* The notification queue: active messages received, queued by sender, popped by Go; and sent. */
#define _GNU_SOURCE
#include "shim_internal.h"

#include <stdlib.h>
#include <string.h>

/* ---- notifications ---------------------------------------------------- */

/* nx_enqueue_notif takes ownership of payload (sender-name header + message). */
void nx_enqueue_notif(nx_ctx_t *c, char *payload, size_t len)
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
        nx_enqueue_notif(r->c, r->buf, length);
    } else {
        free(r->buf);
    }
    free(r);
    done_req(req);
}

ucs_status_t nx_am_recv(void *arg, const void *header, size_t header_length, void *data,
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
    nx_enqueue_notif(c, buf, length);
    return UCS_OK;
}

static void am_sent(void *req, ucs_status_t st, void *user)
{
    (void)st;
    free(user);
    done_req(req);
}

/* nx_notif_send frames a notification, [u16 name length][sender name]
 * [msg], and sends it to ep as one active message. Notifications sent
 * alone and those a transfer carries share it, so that the receiver
 * (nx_am_recv) parses one frame. While the send is pending *frame holds
 * the frame, set before sending so that cb (called with user, or with the
 * frame itself where user is NULL) can free it; where the send completed
 * or failed at once, the frame is freed here and *frame is NULL. */
ucs_status_ptr_t nx_notif_send(nx_ctx_t *c, ucp_ep_h ep, const void *msg, size_t len,
                               ucp_send_nbx_callback_t cb, void *user, void **frame)
{
    size_t total = 2 + c->namelen + len;
    char  *buf   = malloc(total);
    *frame       = NULL;
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
    prm.cb.send      = cb;
    prm.user_data    = user != NULL ? user : buf;
    *frame           = buf;
    ucs_status_ptr_t sp = ucp_am_send_nbx(ep, NX_AM_ID, NULL, 0, buf, total, &prm);
    if (sp == NULL || UCS_PTR_IS_ERR(sp)) {
        free(buf);
        *frame = NULL;
    }
    return sp;
}

/* send_am sends a notification as one active message; the frame is freed
 * when UCX is done with it. */
static ucs_status_ptr_t send_am(nx_ctx_t *c, nx_peer_t *p, const void *msg, size_t len)
{
    void            *frame;
    ucs_status_ptr_t sp = nx_notif_send(c, p->ep, msg, len, am_sent, NULL, &frame);
    if (frame != NULL) {
        pend_add(c, sp);
    }
    return sp;
}

int nx_send_notif(nx_ctx_t *c, nx_peer_t *p, const void *msg, size_t len)
{
    nx_lock(c);
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
