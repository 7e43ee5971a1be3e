/* The loader and call-through wrappers declared in shim.h. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <limits.h>
#include <link.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "shim.h"

/* The struct is shared with C++ code we do not compile: a layout mistake
 * would corrupt the agent configuration silently, so check it here. */
_Static_assert(sizeof(nxc_agent_config_t) == 40, "nixl_capi_agent_config_t is 40 bytes");
_Static_assert(offsetof(nxc_agent_config_t, listen_port) == 4, "listen_port at 4");
_Static_assert(offsetof(nxc_agent_config_t, thread_sync) == 8, "thread_sync at 8");
_Static_assert(offsetof(nxc_agent_config_t, num_workers) == 12, "num_workers at 12");
_Static_assert(offsetof(nxc_agent_config_t, pthr_delay_us) == 16, "pthr_delay_us at 16");
_Static_assert(offsetof(nxc_agent_config_t, lthr_delay_us) == 24, "lthr_delay_us at 24");
_Static_assert(offsetof(nxc_agent_config_t, capture_telemetry) == 32, "capture_telemetry at 32");
_Static_assert(sizeof(nxc_telemetry_t) == 40, "nixl_capi_xfer_telemetry_s is 40 bytes");
_Static_assert(sizeof(bool) == 1, "C99 _Bool is one byte");

struct nxc_lib {
    void *dl;
    bool (*is_stub)(void);
#define NXC_MEMBER(name, params, args) nxc_status_t(*name) params;
    NXC_FUNCS(NXC_MEMBER)
#undef NXC_MEMBER
};

static nxc_lib_t *current;

nxc_lib_t *nxc_open(const char *path, int *not_found, char *err, size_t errlen) {
    *not_found = 0;
    err[0] = 0;
    dlerror();
    void *dl = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!dl) {
        const char *why = dlerror();
        /* glibc says "<file>: cannot open shared object file: No such file or
         * directory" both for a missing file and for a missing dependency;
         * only the first means "keep searching". */
        if (why && strstr(why, "No such file or directory") && strncmp(why, path, strlen(path)) == 0 &&
            why[strlen(path)] == ':')
            *not_found = 1;
        snprintf(err, errlen, "dlopen %s: %s", path, why ? why : "unknown error");
        return NULL;
    }
    nxc_lib_t *lib = calloc(1, sizeof *lib);
    if (!lib) {
        dlclose(dl);
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    lib->dl = dl;
    /* Every function is resolved now, so a library from another NIXL
     * version that lacks one is refused before anything is called. */
    const char *missing = NULL;
    void *sym = dlsym(dl, "nixl_capi_is_stub");
    if (!sym)
        missing = "nixl_capi_is_stub";
    memcpy(&lib->is_stub, &sym, sizeof sym);
#define NXC_RESOLVE(name, params, args)                  \
    if (!missing) {                                      \
        sym = dlsym(dl, "nixl_capi_" #name);             \
        if (!sym)                                        \
            missing = "nixl_capi_" #name;                \
        memcpy(&lib->name, &sym, sizeof sym);            \
    }
    NXC_FUNCS(NXC_RESOLVE)
#undef NXC_RESOLVE
    if (missing) {
        char where[PATH_MAX];
        if (nxc_path_of(lib, where, sizeof where) != 0)
            snprintf(where, sizeof where, "%s", path);
        snprintf(err, errlen, "%s has no %s (not a NIXL C API library this nixlctl can use)", where, missing);
        dlclose(dl);
        free(lib);
        return NULL;
    }
    return lib;
}

void nxc_close(nxc_lib_t *lib) {
    if (!lib || lib == current)
        return;
    dlclose(lib->dl);
    free(lib);
}

void nxc_use(nxc_lib_t *lib) { current = lib; }

bool nxc_is_stub(const nxc_lib_t *lib) { return lib->is_stub(); }

int nxc_path_of(const nxc_lib_t *lib, char *buf, size_t len) {
    struct link_map *lm = NULL;
    if (dlinfo(lib->dl, RTLD_DI_LINKMAP, &lm) != 0 || !lm || !lm->l_name || !lm->l_name[0])
        return -1;
    snprintf(buf, len, "%s", lm->l_name);
    return 0;
}

void nxc_free(void *p) { free(p); }

nxc_status_t nxc_status_telemetry(nxc_agent_t a, nxc_xfer_req_t r, nxc_telemetry_t *t, bool *tele_ok) {
    *tele_ok = false;
    if (!current)
        return NXC_ERR_NOT_LOADED;
    nxc_status_t st = current->get_xfer_status(a, r);
    if (st != NXC_IN_PROG)
        *tele_ok = current->get_xfer_telemetry(a, r, t) == NXC_SUCCESS;
    return st;
}

nxc_status_t nxc_poll_notifs(nxc_agent_t a, nxc_notif_map_t m, size_t *senders) {
    *senders = 0;
    if (!current)
        return NXC_ERR_NOT_LOADED;
    nxc_status_t st = current->get_notifs(a, m, NULL);
    if (st != NXC_SUCCESS)
        return st;
    st = current->notif_map_size(m, senders);
    if (st != NXC_SUCCESS || *senders == 0)
        current->notif_map_clear(m);
    return st;
}

#define NXC_WRAP(name, params, args)     \
    nxc_status_t nxc_##name params {      \
        if (!current)                     \
            return NXC_ERR_NOT_LOADED;    \
        return current->name args;        \
    }
NXC_FUNCS(NXC_WRAP)
#undef NXC_WRAP
