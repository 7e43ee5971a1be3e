/* nixlctl's own declarations of the part of NIXL's C API (libnixl_capi.so)
 * that the nixl backend calls, written from the ABI NIXL 1.4.0 documents,
 * and a loader that resolves every one of them with dlsym at run time.
 * Nothing here links against NIXL: the binary runs without it, and a
 * library that lacks a function fails to load instead of failing later. */
#ifndef NIXLCTL_CAPI_SHIM_H
#define NIXLCTL_CAPI_SHIM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* nixl_capi_status_t is a C enum (int). */
typedef int nxc_status_t;
enum {
    NXC_SUCCESS = 0,
    NXC_IN_PROG = 1,
    NXC_ERR_INVALID_PARAM = -1,
    NXC_ERR_BACKEND = -2,
    NXC_ERR_INVALID_STATE = -3,
    NXC_ERR_EXCEPTION = -4,
    NXC_ERR_NO_TELEMETRY = -5,
    NXC_ERR_NOT_FOUND = -6,
    /* Ours, never NIXL's: a wrapper was called before a library was in use. */
    NXC_ERR_NOT_LOADED = -1000,
};

/* nixl_capi_mem_type_t, nixl_capi_xfer_op_t, nixl_capi_thread_sync_t. */
enum { NXC_MEM_DRAM = 0, NXC_MEM_VRAM = 1 };
enum { NXC_OP_READ = 0, NXC_OP_WRITE = 1 };
enum { NXC_SYNC_NONE = 0, NXC_SYNC_STRICT = 1, NXC_SYNC_RW = 2 };

/* nixl_capi_agent_config_t: layout checked in shim.c (40 bytes). */
typedef struct {
    bool enable_prog_thread;
    bool enable_listen_thread;
    int listen_port;
    int thread_sync;
    unsigned int num_workers; /* ignored by NIXL 1.4.0 */
    uint64_t pthr_delay_us;
    uint64_t lthr_delay_us;
    bool capture_telemetry;
} nxc_agent_config_t;

/* struct nixl_capi_xfer_telemetry_s (40 bytes); start_time_us is on the
 * steady clock, not Unix time. */
typedef struct {
    uint64_t start_time_us;
    uint64_t post_duration_us;
    uint64_t xfer_duration_us;
    uint64_t total_bytes;
    uint64_t desc_count;
} nxc_telemetry_t;

/* The opaque handles: each a pointer to a struct NIXL never shows. */
typedef struct nxc_agent_s *nxc_agent_t;
typedef struct nxc_params_s *nxc_params_t;
typedef struct nxc_mem_list_s *nxc_mem_list_t;
typedef struct nxc_string_list_s *nxc_string_list_t;
typedef struct nxc_backend_s *nxc_backend_t;
typedef struct nxc_opt_args_s *nxc_opt_args_t;
typedef struct nxc_param_iter_s *nxc_param_iter_t;
typedef struct nxc_xfer_dlist_s *nxc_xfer_dlist_t;
typedef struct nxc_xfer_dlist_handle_s *nxc_xfer_dlist_handle_t;
typedef struct nxc_reg_dlist_s *nxc_reg_dlist_t;
typedef struct nxc_xfer_req_s *nxc_xfer_req_t;
typedef struct nxc_notif_map_s *nxc_notif_map_t;

/* Every NIXL function the backend uses, as
 * X(name, (parameters), (arguments)); each returns nxc_status_t and is
 * exported by the library as nixl_capi_<name>. */
#define NXC_FUNCS(X)                                                                              \
    X(create_configured_agent, (const char *name, const nxc_agent_config_t *cfg, nxc_agent_t *out), \
      (name, cfg, out))                                                                           \
    X(destroy_agent, (nxc_agent_t a), (a))                                                        \
    X(get_available_plugins, (nxc_agent_t a, nxc_string_list_t *out), (a, out))                   \
    X(destroy_string_list, (nxc_string_list_t l), (l))                                            \
    X(string_list_size, (nxc_string_list_t l, size_t *n), (l, n))                                 \
    X(string_list_get, (nxc_string_list_t l, size_t i, const char **s), (l, i, s))                \
    X(get_plugin_params, (nxc_agent_t a, const char *plugin, nxc_mem_list_t *mems, nxc_params_t *p), \
      (a, plugin, mems, p))                                                                       \
    X(get_backend_params, (nxc_agent_t a, nxc_backend_t b, nxc_mem_list_t *mems, nxc_params_t *p), \
      (a, b, mems, p))                                                                            \
    X(destroy_mem_list, (nxc_mem_list_t l), (l))                                                  \
    X(destroy_params, (nxc_params_t p), (p))                                                      \
    X(params_add, (nxc_params_t p, const char *k, const char *v), (p, k, v))                      \
    X(params_is_empty, (nxc_params_t p, bool *empty), (p, empty))                                 \
    X(params_create_iterator, (nxc_params_t p, nxc_param_iter_t *it), (p, it))                    \
    X(params_iterator_next, (nxc_param_iter_t it, const char **k, const char **v, bool *more),    \
      (it, k, v, more))                                                                           \
    X(params_destroy_iterator, (nxc_param_iter_t it), (it))                                       \
    X(create_backend, (nxc_agent_t a, const char *plugin, nxc_params_t p, nxc_backend_t *out),    \
      (a, plugin, p, out))                                                                        \
    X(destroy_backend, (nxc_backend_t b), (b))                                                    \
    X(create_opt_args, (nxc_opt_args_t *out), (out))                                              \
    X(destroy_opt_args, (nxc_opt_args_t o), (o))                                                  \
    X(opt_args_add_backend, (nxc_opt_args_t o, nxc_backend_t b), (o, b))                          \
    X(opt_args_set_notif_msg, (nxc_opt_args_t o, const void *d, size_t n), (o, d, n))             \
    X(opt_args_set_has_notif, (nxc_opt_args_t o, bool has), (o, has))                             \
    X(create_reg_dlist, (int mem, nxc_reg_dlist_t *out), (mem, out))                              \
    X(destroy_reg_dlist, (nxc_reg_dlist_t d), (d))                                                \
    X(reg_dlist_add_desc,                                                                         \
      (nxc_reg_dlist_t d, uintptr_t addr, size_t len, uint64_t dev, const void *md, size_t mdlen), \
      (d, addr, len, dev, md, mdlen))                                                             \
    X(register_mem, (nxc_agent_t a, nxc_reg_dlist_t d, nxc_opt_args_t o), (a, d, o))              \
    X(deregister_mem, (nxc_agent_t a, nxc_reg_dlist_t d, nxc_opt_args_t o), (a, d, o))            \
    X(get_local_md, (nxc_agent_t a, void **data, size_t *len), (a, data, len))                    \
    X(load_remote_md, (nxc_agent_t a, const void *data, size_t len, char **name), (a, data, len, name)) \
    X(invalidate_remote_md, (nxc_agent_t a, const char *name), (a, name))                         \
    X(check_remote_md, (nxc_agent_t a, const char *name, nxc_xfer_dlist_t d), (a, name, d))       \
    X(create_xfer_dlist, (int mem, nxc_xfer_dlist_t *out), (mem, out))                            \
    X(destroy_xfer_dlist, (nxc_xfer_dlist_t d), (d))                                              \
    X(xfer_dlist_add_desc, (nxc_xfer_dlist_t d, uintptr_t addr, size_t len, uint64_t dev),        \
      (d, addr, len, dev))                                                                        \
    X(prep_xfer_dlist,                                                                            \
      (nxc_agent_t a, const char *agent, nxc_xfer_dlist_t d, nxc_xfer_dlist_handle_t *out, nxc_opt_args_t o), \
      (a, agent, d, out, o))                                                                      \
    X(release_xfer_dlist_handle, (nxc_agent_t a, nxc_xfer_dlist_handle_t h), (a, h))              \
    X(make_xfer_req,                                                                              \
      (nxc_agent_t a, int op, nxc_xfer_dlist_handle_t l, const int *li, size_t ln,                \
       nxc_xfer_dlist_handle_t r, const int *ri, size_t rn, nxc_xfer_req_t *out, nxc_opt_args_t o), \
      (a, op, l, li, ln, r, ri, rn, out, o))                                                      \
    X(create_xfer_req,                                                                            \
      (nxc_agent_t a, int op, nxc_xfer_dlist_t l, nxc_xfer_dlist_t r, const char *remote,         \
       nxc_xfer_req_t *out, nxc_opt_args_t o),                                                    \
      (a, op, l, r, remote, out, o))                                                              \
    X(post_xfer_req, (nxc_agent_t a, nxc_xfer_req_t r, nxc_opt_args_t o), (a, r, o))              \
    X(get_xfer_status, (nxc_agent_t a, nxc_xfer_req_t r), (a, r))                                 \
    X(get_xfer_telemetry, (nxc_agent_t a, nxc_xfer_req_t r, nxc_telemetry_t *t), (a, r, t))       \
    X(release_xfer_req, (nxc_agent_t a, nxc_xfer_req_t r), (a, r))                                \
    X(destroy_xfer_req, (nxc_xfer_req_t r), (r))                                                  \
    X(create_notif_map, (nxc_notif_map_t *out), (out))                                            \
    X(destroy_notif_map, (nxc_notif_map_t m), (m))                                                \
    X(get_notifs, (nxc_agent_t a, nxc_notif_map_t m, nxc_opt_args_t o), (a, m, o))                \
    X(notif_map_size, (nxc_notif_map_t m, size_t *n), (m, n))                                     \
    X(notif_map_get_agent_at, (nxc_notif_map_t m, size_t i, const char **name), (m, i, name))     \
    X(notif_map_get_notifs_size, (nxc_notif_map_t m, const char *name, size_t *n), (m, name, n))  \
    X(notif_map_get_notif, (nxc_notif_map_t m, const char *name, size_t i, const void **d, size_t *n), \
      (m, name, i, d, n))                                                                         \
    X(notif_map_clear, (nxc_notif_map_t m), (m))                                                  \
    X(gen_notif, (nxc_agent_t a, const char *remote, const void *d, size_t n, nxc_opt_args_t o),  \
      (a, remote, d, n, o))

#define NXC_DECLARE(name, params, args) nxc_status_t nxc_##name params;
NXC_FUNCS(NXC_DECLARE)
#undef NXC_DECLARE

/* A loaded library: its handle and the resolved functions. */
typedef struct nxc_lib nxc_lib_t;

/* nxc_open dlopens path (a file name without a slash goes through the
 * loader's search) and resolves every function, or returns NULL with the
 * reason in err. *not_found is set when the file itself was not found, so
 * that the caller can go on searching. */
nxc_lib_t *nxc_open(const char *path, int *not_found, char *err, size_t errlen);
/* nxc_close unloads a library that was never handed to nxc_use. */
void nxc_close(nxc_lib_t *lib);
/* nxc_use makes lib the one the nxc_* wrappers call; it stays loaded. */
void nxc_use(nxc_lib_t *lib);
/* nxc_is_stub calls nixl_capi_is_stub: true for NIXL's stub builds, which
 * have the API and none of the implementation. */
bool nxc_is_stub(const nxc_lib_t *lib);
/* nxc_path_of tells where the loader found the library. */
int nxc_path_of(const nxc_lib_t *lib, char *buf, size_t len);

void nxc_free(void *p);

/* nxc_poll_notifs is get_notifs into m and notif_map_size in one call, and
 * clears m itself when it holds nothing: a spinning poll that finds no
 * notification costs one cgo call, not three. */
nxc_status_t nxc_poll_notifs(nxc_agent_t a, nxc_notif_map_t m, size_t *senders);

/* nxc_status_telemetry is get_xfer_status, and once the request has ended
 * its telemetry too (*tele_ok says whether NIXL had any): a polling loop
 * pays one cgo call per poll and none more per request. */
nxc_status_t nxc_status_telemetry(nxc_agent_t a, nxc_xfer_req_t r, nxc_telemetry_t *t, bool *tele_ok);

#endif
