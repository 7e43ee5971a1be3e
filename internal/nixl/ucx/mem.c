/* Memory registration (ucp_mem_map) and packed rkeys. */
#define _GNU_SOURCE
#include "shim_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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
    ucs_status_t st = ucp_mem_map(nx_g_ctx, &mp, &m->memh);
    if (st != UCS_OK) {
        snprintf(err, errlen, "ucp_mem_map: %s", ucs_status_string(st));
        free(m);
        return -1;
    }
    ucp_mem_attr_t ma;
    ma.field_mask = UCP_MEM_ATTR_FIELD_ADDRESS | UCP_MEM_ATTR_FIELD_LENGTH;
    if ((st = ucp_mem_query(m->memh, &ma)) != UCS_OK) {
        snprintf(err, errlen, "ucp_mem_query: %s", ucs_status_string(st));
        ucp_mem_unmap(nx_g_ctx, m->memh);
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
    ucs_status_t st = ucp_rkey_pack(nx_g_ctx, m->memh, &rb, &rl);
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
    ucp_mem_unmap(nx_g_ctx, m->memh);
    free(m);
}
