/* UCX log folding: a log handler that lets the first few lines of each
 * repeated UCX warning or error through and only counts the rest. A
 * prefill whose decode died mid-transfer prints one "object ... was not
 * returned to mpool" line per request UCX still held when its worker
 * closed (203 in one run), burying everything else; Go prints one summary
 * line per folded message when the process ends (FoldedLogs). */
#include "shim_internal.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <ucs/debug/log_def.h>

#define NX_FOLD_KEYS 64
#define NX_FOLD_MSG 256

typedef struct {
    const char   *file; /* with line, the key: one ucs_warn call site */
    unsigned      line;
    int           level;
    unsigned long count;
    char          example[NX_FOLD_MSG]; /* the first message, formatted */
} nx_fold_entry_t;

static pthread_mutex_t nx_fold_lock = PTHREAD_MUTEX_INITIALIZER;
static nx_fold_entry_t nx_fold[NX_FOLD_KEYS];
static int             nx_fold_n;
static unsigned long   nx_fold_repeats;
static int             nx_fold_installed;

static ucs_log_func_rc_t nx_fold_handler(const char *file, unsigned line, const char *function,
                                         ucs_log_level_t level, const ucs_log_component_config_t *comp_conf,
                                         const char *message, va_list ap)
{
    (void)function;
    if (level > UCS_LOG_LEVEL_WARN || level == UCS_LOG_LEVEL_FATAL ||
        !ucs_log_component_is_enabled(level, comp_conf)) {
        return UCS_LOG_FUNC_RC_CONTINUE;
    }
    ucs_log_func_rc_t rc = UCS_LOG_FUNC_RC_CONTINUE;
    pthread_mutex_lock(&nx_fold_lock);
    int i;
    for (i = 0; i < nx_fold_n; i++) {
        if (nx_fold[i].line == line && (nx_fold[i].file == file || strcmp(nx_fold[i].file, file) == 0)) {
            break;
        }
    }
    if (i == nx_fold_n) {
        if (nx_fold_n == NX_FOLD_KEYS) {
            /* Full: a process with this many distinct messages is not
             * the one this folds for; let them through. */
            pthread_mutex_unlock(&nx_fold_lock);
            return UCS_LOG_FUNC_RC_CONTINUE;
        }
        nx_fold_entry_t *e = &nx_fold[nx_fold_n++];
        e->file  = file;
        e->line  = line;
        e->level = (int)level;
        e->count = 0;
        va_list cp; /* the next handler formats ap again */
        va_copy(cp, ap);
        vsnprintf(e->example, sizeof(e->example), message, cp);
        va_end(cp);
    }
    if (++nx_fold[i].count > nx_fold_repeats) {
        rc = UCS_LOG_FUNC_RC_STOP;
    }
    pthread_mutex_unlock(&nx_fold_lock);
    return rc;
}

void nx_logfold_install(unsigned repeats)
{
    pthread_mutex_lock(&nx_fold_lock);
    nx_fold_repeats = repeats;
    if (!nx_fold_installed) {
        nx_fold_installed = 1;
        /* UCX prints to C's stdout, which is fully buffered when it is
         * not a terminal, and Go's exit does not flush it: lines sat in
         * the buffer for the rest of the run and the last ones were lost
         * at exit. Line buffering writes each as UCX logs it. */
        setvbuf(stdout, NULL, _IOLBF, 0);
        ucs_log_push_handler(nx_fold_handler);
    }
    pthread_mutex_unlock(&nx_fold_lock);
}

/* nx_logfold_get copies entry i (0 <= i) into the arguments; it returns 0
 * past the last entry. */
int nx_logfold_get(int i, char *file, size_t filelen, unsigned *line, int *level, unsigned long *count,
                   char *example, size_t examplelen)
{
    pthread_mutex_lock(&nx_fold_lock);
    if (i < 0 || i >= nx_fold_n) {
        pthread_mutex_unlock(&nx_fold_lock);
        return 0;
    }
    snprintf(file, filelen, "%s", nx_fold[i].file);
    snprintf(example, examplelen, "%s", nx_fold[i].example);
    *line  = nx_fold[i].line;
    *level = nx_fold[i].level;
    *count = nx_fold[i].count;
    pthread_mutex_unlock(&nx_fold_lock);
    return 1;
}

/* nx_logfold_test logs n warnings from one call site and one from
 * another, through UCX's own macro, so tests see what real call sites do. */
void nx_logfold_test(int n)
{
    for (int i = 0; i < n; i++) {
        ucs_warn("nixlctl logfold test object %p was not returned to mpool test", (void *)(long)(0x1000 + i));
    }
    ucs_warn("nixlctl logfold test: a different warning");
}
