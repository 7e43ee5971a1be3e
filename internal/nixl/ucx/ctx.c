/* Global UCP init, agents (context/worker create and destroy), the worker address, small utilities. */
#define _GNU_SOURCE
#include "shim_internal.h"

#include <dlfcn.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>

ucp_context_h nx_g_ctx;

const char *nx_ucx_version(void) { return ucp_get_version_string(); }

/* nx_ucp_path is the file libucp was loaded from (NULL if unknown). */
const char *nx_ucp_path(void)
{
    Dl_info info;
    if (dladdr((void *)ucp_get_version_string, &info) != 0 && info.dli_fname != NULL) {
        return info.dli_fname;
    }
    return NULL;
}

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
    st                  = ucp_init(&p, cfg, &nx_g_ctx);
    ucp_config_release(cfg);
    if (st != UCS_OK) {
        snprintf(err, errlen, "ucp_init: %s", ucs_status_string(st));
        return -1;
    }
    return 0;
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
    ucs_status_t st = ucp_worker_create(nx_g_ctx, &wp, &c->worker);
    if (st != UCS_OK) {
        snprintf(err, errlen, "ucp_worker_create: %s", ucs_status_string(st));
        goto fail;
    }
    if ((st = set_handler(c->worker, NX_AM_ID, nx_am_recv, c)) != UCS_OK ||
        (st = set_handler(c->worker, NX_AM_PING, nx_am_ping, c)) != UCS_OK ||
        (st = set_handler(c->worker, NX_AM_PONG, nx_am_pong, c)) != UCS_OK) {
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
    if (pthread_create(&c->thread, NULL, nx_progress_main, c) != 0) {
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
    nx_lock(c);
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
    nx_lock(c);
    /* Let what can still finish finish (up to a second), then release the
     * rest. Requests towards a dead peer (a rendezvous receive of its
     * notification, a reply on its endpoint) never finish: once nothing
     * has finished for 100 ms the rest are taken as those. Waiting out
     * the second made every agent that had talked to a killed decode
     * take a second to close (a push prefill's session end, and with it
     * the run's exit). */
    uint64_t start = nx_now_ns(), last = start, seen = c->released;
    do {
        nx_progress_locked(c);
        uint64_t now = nx_now_ns();
        if (c->released != seen) {
            seen = c->released;
            last = now;
        }
        if (now - start >= 1000000000ull || now - last >= 100000000ull) {
            break;
        }
    } while (c->pending != NULL);
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
