/* A thin C layer over UCP for nixlctl's ucx backend. Go calls these
 * functions; every UCX call for one agent happens under that agent's mutex,
 * from the calling thread or from the agent's progress thread. */
#ifndef NIXLCTL_UCX_SHIM_H
#define NIXLCTL_UCX_SHIM_H

#include <stddef.h>
#include <stdint.h>

typedef struct nx_ctx nx_ctx_t;
typedef struct nx_peer nx_peer_t;
typedef struct nx_mem nx_mem_t;
typedef struct nx_xfer nx_xfer_t;

/* Transfer states seen by Go. */
enum { NX_IDLE = 0, NX_RUNNING = 1, NX_FLUSHING = 2, NX_NOTIFYING = 3, NX_DONE = 4, NX_ERROR = 5 };
enum { NX_OP_READ = 0, NX_OP_WRITE = 1 };

/* The part of a transfer Go reads in place: state is stored last, with
 * release semantics, so times read after an acquire load of it are valid. */
typedef struct {
    int32_t  state;
    int32_t  err;
    uint64_t t_post0, t_post1, t_done;
} nx_xfer_pub_t;

/* One RMA operation of a transfer. */
typedef struct {
    uint64_t local;
    uint64_t remote;
    uint64_t len;
    void    *rkey; /* ucp_rkey_h of the remote region */
} nx_op_t;

int         nx_global_init(char *err, size_t errlen);
void        nx_logfold_install(unsigned repeats);
int  nx_logfold_get(int i, char *file, size_t filelen, unsigned *line, int *level, unsigned long *count, char *example,
                    size_t examplelen);
void nx_logfold_test(int n);
const char *nx_ucx_version(void);
const char *nx_ucp_path(void);

nx_ctx_t *nx_ctx_create(const char *name, char *err, size_t errlen);
void      nx_ctx_destroy(nx_ctx_t *c);
int       nx_ctx_address(nx_ctx_t *c, void **addr, size_t *len);
int       nx_ctx_notify_fd(nx_ctx_t *c);
uint64_t  nx_ctx_malformed_notifs(nx_ctx_t *c);
void      nx_ctx_set_progress_pace(nx_ctx_t *c, int ms);

int   nx_mem_map(nx_ctx_t *c, uint64_t addr, size_t len, int allocate, nx_mem_t **out, char *err, size_t errlen);
void *nx_mem_addr(nx_mem_t *m);
int   nx_mem_rkey(nx_ctx_t *c, nx_mem_t *m, void **buf, size_t *len);
void  nx_mem_unmap(nx_ctx_t *c, nx_mem_t *m);

nx_peer_t *nx_peer_create(nx_ctx_t *c, const void *addr, size_t len, int peer_mode, char *err, size_t errlen);
void       nx_peer_fail(nx_ctx_t *c, nx_peer_t *p, int status);
int        nx_rkey_mapped(nx_ctx_t *c, void *rkey, uint64_t raddr);
char      *nx_ucx_config(void);
int        nx_peer_rkey(nx_ctx_t *c, nx_peer_t *p, const void *packed, void **rkey, char *err, size_t errlen);
void       nx_rkey_destroy(nx_ctx_t *c, void *rkey);
int        nx_peer_status(nx_peer_t *p);
void       nx_peer_set_rma_local(nx_peer_t *p, int local);
const char *nx_status_string(int status);
int         nx_status_peer_died(void);
int        nx_peer_info(nx_ctx_t *c, nx_peer_t *p, char *buf, size_t cap);
int        nx_peer_destroy(nx_ctx_t *c, nx_peer_t *p);

nx_xfer_t *nx_xfer_create(nx_ctx_t *c, nx_peer_t *p, int op, const nx_op_t *ops, size_t n,
                          const void *notif, size_t nlen);
int  nx_xfer_post(nx_ctx_t *c, nx_xfer_t *x);
int  nx_xfer_state(nx_ctx_t *c, nx_xfer_t *x, int progress);
int  nx_xfer_release(nx_ctx_t *c, nx_xfer_t *x);

int nx_send_notif(nx_ctx_t *c, nx_peer_t *p, const void *msg, size_t len);
int nx_pop_notif(nx_ctx_t *c, char **sender, size_t *slen, char **msg, size_t *mlen);
void nx_free(void *p);

#endif
