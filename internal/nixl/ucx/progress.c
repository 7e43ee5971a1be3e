/* The per-agent progress thread, and its pacing. */
#define _GNU_SOURCE
#include "shim_internal.h"

#include <poll.h>
#include <sched.h>
#include <sys/epoll.h>

/* ---- progress thread -------------------------------------------------- */

unsigned nx_progress_locked(nx_ctx_t *c)
{
    unsigned total = 0, n;
    do {
        n = ucp_worker_progress(c->worker);
        total += n;
        nx_process_ready(c);
    } while (n > 0 && atomic_load(&c->waiters) == 0);
    return total;
}

/* yield_to_waiters lets API calls that wait for mu take it before the
 * progress thread does again (a mutex is not fair: the thread that just
 * unlocked usually wins), for a bounded number of yields. */
static void yield_to_waiters(nx_ctx_t *c)
{
    for (int i = 0; i < 64 && atomic_load(&c->waiters) > 0; i++) {
        sched_yield();
    }
}

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
    nx_progress_locked(c);
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

void *nx_progress_main(void *arg)
{
    nx_ctx_t          *c = arg;
    struct epoll_event ev[4];
    while (!atomic_load(&c->stop)) {
        if (atomic_load(&c->pace_ms) > 0) {
            paced_progress(c);
            continue;
        }
        pthread_mutex_lock(&c->mu);
        nx_progress_locked(c);
        ucs_status_t st = c->efd >= 0 ? ucp_worker_arm(c->worker) : UCS_OK;
        pthread_mutex_unlock(&c->mu);
        yield_to_waiters(c);
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
