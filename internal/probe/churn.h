/* Allocation churn for nixlctl probe ucx-leak: mmap/munmap traffic made
 * through libc (so that UCX's memory hooks see it), shaped like the arenas
 * of Python's allocator and the buffers of PyTorch's CPU allocator. */
#ifndef NIXLCTL_PROBE_CHURN_H
#define NIXLCTL_PROBE_CHURN_H

#include <stddef.h>
#include <stdint.h>

typedef struct nxp_churn nxp_churn_t;

nxp_churn_t *nxp_churn_new(int slots, size_t min, size_t max, uint64_t seed);
/* nxp_churn_step replaces n slots: munmap what a slot holds, mmap a new
 * size and touch its first page. Returns the number of failed mmaps. */
int  nxp_churn_step(nxp_churn_t *c, int n);
void nxp_churn_stats(nxp_churn_t *c, uint64_t *ops, uint64_t *live_bytes);
void nxp_churn_free(nxp_churn_t *c);

/* nxp_leak maps and touches len bytes and never frees them (the probe's
 * self-test). Returns 0, or -1 when mmap failed. */
int nxp_leak(size_t len);

#endif
