#define _GNU_SOURCE
#include "churn.h"

#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

struct nxp_churn {
    void   **ptr;
    size_t  *len;
    int      slots;
    size_t   min, max;
    uint64_t rng;
    uint64_t ops;
    size_t   live;
    size_t   page;
};

static uint64_t next_rand(nxp_churn_t *c)
{
    /* xorshift64*: the sizes need not be good randomness, only varied. */
    c->rng ^= c->rng >> 12;
    c->rng ^= c->rng << 25;
    c->rng ^= c->rng >> 27;
    return c->rng * 2685821657736338717ull;
}

/* size_for draws a size between min and max, log-uniformly (as many small
 * arenas as large tensors per octave), rounded to whole pages. */
static size_t size_for(nxp_churn_t *c)
{
    size_t s = c->min;
    size_t span = c->max > c->min ? c->max / c->min : 1;
    int    octaves = 0;
    while (span > 1) {
        span >>= 1;
        octaves++;
    }
    if (octaves > 0) {
        int    o    = (int)(next_rand(c) % (uint64_t)octaves);
        size_t base = c->min << o;
        s           = base + (size_t)(next_rand(c) % (uint64_t)base);
        if (s > c->max) {
            s = c->max;
        }
    }
    return (s + c->page - 1) / c->page * c->page;
}

nxp_churn_t *nxp_churn_new(int slots, size_t min, size_t max, uint64_t seed)
{
    if (slots <= 0 || min == 0 || max < min) {
        return NULL;
    }
    nxp_churn_t *c = calloc(1, sizeof(*c));
    if (c == NULL) {
        return NULL;
    }
    c->ptr = calloc((size_t)slots, sizeof(void *));
    c->len = calloc((size_t)slots, sizeof(size_t));
    if (c->ptr == NULL || c->len == NULL) {
        free(c->ptr);
        free(c->len);
        free(c);
        return NULL;
    }
    c->slots = slots;
    c->min   = min;
    c->max   = max;
    c->rng   = seed ? seed : 0x9e3779b97f4a7c15ull;
    long pg  = sysconf(_SC_PAGESIZE);
    c->page  = pg > 0 ? (size_t)pg : 4096;
    return c;
}

int nxp_churn_step(nxp_churn_t *c, int n)
{
    int failed = 0;
    for (int i = 0; i < n; i++) {
        int k = (int)(next_rand(c) % (uint64_t)c->slots);
        if (c->ptr[k] != NULL) {
            munmap(c->ptr[k], c->len[k]);
            c->live -= c->len[k];
            c->ptr[k] = NULL;
        }
        size_t len = size_for(c);
        void  *p   = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        c->ops++;
        if (p == MAP_FAILED) {
            failed++;
            continue;
        }
        /* One page only: the calls are what UCX intercepts, and a live set
         * that moved RSS up and down would only add noise to the fit. */
        *(volatile char *)p = 1;
        c->ptr[k] = p;
        c->len[k] = len;
        c->live += len;
    }
    return failed;
}

void nxp_churn_stats(nxp_churn_t *c, uint64_t *ops, uint64_t *live_bytes)
{
    *ops        = c->ops;
    *live_bytes = c->live;
}

void nxp_churn_free(nxp_churn_t *c)
{
    if (c == NULL) {
        return;
    }
    for (int k = 0; k < c->slots; k++) {
        if (c->ptr[k] != NULL) {
            munmap(c->ptr[k], c->len[k]);
        }
    }
    free(c->ptr);
    free(c->len);
    free(c);
}

int nxp_leak(size_t len)
{
    if (len == 0) {
        return 0;
    }
    void *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) {
        return -1;
    }
    memset(p, 0xa5, len);
    return 0;
}
