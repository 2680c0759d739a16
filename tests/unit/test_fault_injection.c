/* Fault injection: every allocation, process spawn, thread start, file
 * open and dlopen the library makes in one scenario is failed once, in
 * turn, and nothing crashes, leaks or is lost.
 *
 * The scenario opens a CPU client, compiles and launches three cube C
 * kernels (two meet at cube_sync(): one the barrier pass rewrites into
 * loops over its units, with libclang loaded at run time, and one it
 * refuses, whose units run as fibers)
 * and a raw C kernel (cube_kernel_create_raw), labels a buffer, writes
 * (once from a staging buffer) and reads buffers, makes one in a
 * persistent window, captures and replays a graph, profiles a window,
 * reads and formats the memory report, installs the expandable preset
 * and writes, reads and releases a buffer in its expandable pool (a range
 * of address space reserved with mmap, pages mapped with mprotect), cleans
 * up, traces all of it to a file and closes. A clean run counts the calls it
 * makes; a call is named by its kind, its site (the return address in the
 * library, with the two above it, so that a helper called from two places
 * counts as two sites) and its occurrence there. Then, for each call, a fresh
 * child process (fork) runs the scenario failing only that call, and checks
 * that:
 *  - the API call that met the failure, or a later one it surfaced in,
 *    answers a code its header comment names and that fits what failed
 *    (fi_group_codes); nothing else is ever an answer, and a failure the
 *    library absorbs must leave every result right;
 *  - what completed is right: every read is compared with a host
 *    computation, and after a failure the buffers already verified still
 *    read back as they were;
 *  - the disk cache kept its secret and its entries;
 *  - the scenario retried right away in the same process, without an
 *    injection, completes with the right data (and a trace that parses);
 *  - no descriptor, temporary directory or child process is left, and no
 *    memory: each child exits through exit(), so in the ASan build
 *    LeakSanitizer checks it, and the parent checks its exit status.
 * Most runs load the kernels from a warmed disk cache (a private copy per
 * child); the calls that only a cold cache makes (the compiler, its
 * temporary directories, dlopen of a new object, the cache writes, and the
 * portability check's C++ compiler and temporary file, whose failures the
 * compile absorbs) are failed in a second set of runs, each with an empty
 * cache.
 *
 * The mechanism is link-time wrapping (tests/CMakeLists.txt links this
 * executable with -Wl,--wrap=<function> for each function below): the
 * static library's objects are linked in, so their calls reach
 * __wrap_<function>, which fails the chosen one. The library carries no
 * test code. Calls made inside shared libraries are not reachable this
 * way: glibc's own allocations (the FILE of fopen/fdopen, the DIR of
 * opendir, dlopen's and posix_spawn's internals, stdio buffers, the line
 * buffer of getline, which is failed at getline instead), libxxhash's
 * malloc (failed at XXH3_createState) and the thread stacks of
 * pthread_create.
 *
 * How many: the plain build fails every counted call, the ASan build up to
 * 400 (each site at least once, the rest sampled evenly), the TSan build
 * each site once; the summary says how many were tried. Environment:
 * CUBE_FI_ALL=1 fails every counted call in any build; CUBE_FI_BUDGET=n
 * at most n per set of runs (0: each site once); CUBE_FI_JOBS=n runs
 * n children at once (default: one per core, at most 8);
 * CUBE_FI_VERBOSE=1 prints every run. */
#include <dirent.h>
#include <dlfcn.h>
#include <errno.h>
#include <execinfo.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <signal.h>
#include <spawn.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <ftw.h>
#include <unistd.h>

#include <jansson.h>
#include <xxhash.h>

#include "cubert/cubert.h"

#if defined(__SANITIZE_THREAD__)
#define FI_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define FI_TSAN 1
#endif
#endif
#if defined(__SANITIZE_ADDRESS__)
#define FI_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define FI_ASAN 1
#endif
#endif

#if defined(FI_TSAN)
/* TSan waits a second at every exit by default: hundreds of children would
 * spend minutes asleep. TSAN_OPTIONS still wins. */
const char *__tsan_default_options(void);
const char *__tsan_default_options(void)
{
    return "atexit_sleep_ms=0";
}
#endif

/* A child that has not finished by then is taken to hang (a run takes
 * well under a second on a quiet machine: room for a very busy one). */
#if defined(FI_TSAN) || defined(FI_ASAN)
#define FI_CHILD_TIMEOUT 600
#else
#define FI_CHILD_TIMEOUT 180
#endif

/* ================================================================ kinds */

/* What a failed call stands for, and so which codes may report it. */
typedef enum fi_group {
    FI_ALLOC,  /* memory */
    FI_SPAWN,  /* starting the compiler */
    FI_THREAD, /* starting a thread */
    FI_FILE,   /* opening a file, directory, pipe or temporary directory */
    FI_DLOPEN, /* loading a compiled kernel */
    FI_GROUPS
} fi_group;

static const char *const fi_group_names[FI_GROUPS] = {
    "allocation", "process spawn", "thread start", "file open", "dlopen"};

typedef enum fi_kind {
    FI_MALLOC,
    FI_CALLOC,
    FI_REALLOC,
    FI_STRDUP,
    FI_ALIGNED_ALLOC,
    FI_MMAP,
    FI_MPROTECT,
    FI_GETLINE,
    FI_XXH_STATE,
    FI_SPAWN_ACTIONS,
    FI_POSIX_SPAWNP,
    FI_PTHREAD_CREATE,
    FI_OPEN,
    FI_OPENAT,
    FI_FOPEN,
    FI_FDOPEN,
    FI_OPENDIR,
    FI_PIPE2,
    FI_MKDTEMP,
    FI_DLOPEN_CALL,
    FI_KINDS
} fi_kind;

static const struct {
    const char *name;
    fi_group group;
} fi_kinds[FI_KINDS] = {
    [FI_MALLOC] = {"malloc", FI_ALLOC},
    [FI_CALLOC] = {"calloc", FI_ALLOC},
    [FI_REALLOC] = {"realloc", FI_ALLOC},
    [FI_STRDUP] = {"strdup", FI_ALLOC},
    [FI_ALIGNED_ALLOC] = {"aligned_alloc", FI_ALLOC},
    [FI_MMAP] = {"mmap", FI_ALLOC},
    [FI_MPROTECT] = {"mprotect", FI_ALLOC},
    [FI_GETLINE] = {"getline", FI_ALLOC},
    [FI_XXH_STATE] = {"XXH3_createState", FI_ALLOC},
    [FI_SPAWN_ACTIONS] = {"posix_spawn_file_actions_*", FI_SPAWN},
    [FI_POSIX_SPAWNP] = {"posix_spawnp", FI_SPAWN},
    [FI_PTHREAD_CREATE] = {"pthread_create", FI_THREAD},
    [FI_OPEN] = {"open", FI_FILE},
    [FI_OPENAT] = {"openat", FI_FILE},
    [FI_FOPEN] = {"fopen", FI_FILE},
    [FI_FDOPEN] = {"fdopen", FI_FILE},
    [FI_OPENDIR] = {"opendir", FI_FILE},
    [FI_PIPE2] = {"pipe2", FI_FILE},
    [FI_MKDTEMP] = {"mkdtemp", FI_FILE},
    [FI_DLOPEN_CALL] = {"dlopen", FI_DLOPEN},
};

#define FI_BIT(code) (1u << (unsigned)(code))

/* The codes that may report a failure of each group: the machine ran out
 * of something (memory, threads), a system call failed, or the compiler
 * could not be run. */
static const unsigned fi_group_codes[FI_GROUPS] = {
    [FI_ALLOC] = FI_BIT(CUBE_ERR_OUT_OF_MEMORY),
    [FI_SPAWN] = FI_BIT(CUBE_ERR_IO) | FI_BIT(CUBE_ERR_COMPILE) |
                 FI_BIT(CUBE_ERR_UNAVAILABLE),
    [FI_THREAD] = FI_BIT(CUBE_ERR_OUT_OF_MEMORY) |
                  FI_BIT(CUBE_ERR_RESOURCE_LIMIT) |
                  FI_BIT(CUBE_ERR_UNAVAILABLE) | FI_BIT(CUBE_ERR_IO),
    [FI_FILE] = FI_BIT(CUBE_ERR_IO) | FI_BIT(CUBE_ERR_UNAVAILABLE),
    [FI_DLOPEN] = FI_BIT(CUBE_ERR_IO) | FI_BIT(CUBE_ERR_UNAVAILABLE) |
                  FI_BIT(CUBE_ERR_COMPILE),
};

/* ======================================================= the API calls */

/* Each API call of the scenario, with the header whose comment lists its
 * errors (and a second function whose list it refers to: "as cube_write").
 * header NULL: the call returns no error. */
typedef enum fi_api {
    API_TRACE_START,
    API_OPEN,
    API_KERNEL_CREATE,
    API_KERNEL_CREATE_RAW,
    API_CREATE,
    API_EMPTY,
    API_SET_LABEL,
    API_LAUNCH,
    API_READ,
    API_WRITE,
    API_STAGING,
    API_STAGING_FREE,
    API_PERSISTENT_BEGIN,
    API_PERSISTENT_END,
    API_GRAPH_PREPARE,
    API_GRAPH_BEGIN,
    API_GRAPH_END,
    API_GRAPH_REPLAY,
    API_GRAPH_DESTROY,
    API_PROFILE_START,
    API_PROFILE_END,
    API_RANGE_PUSH,
    API_RANGE_POP,
    API_READ_ASYNC,
    API_FUTURE_WAIT,
    API_MEMORY_REPORT,
    API_REPORT_FORMAT,
    API_COMM_INIT,
    API_ALL_REDUCE,
    API_GROUP_END,
    API_COPY_PEER,
    API_COMM_DESTROY,
    API_LAYOUT_PRESET,
    API_INSTALL_POOLS,
    API_CLEANUP,
    API_RELEASE,
    API_KERNEL_RELEASE,
    API_CLOSE,
    API_TRACE_STOP,
    API_COUNT
} fi_api;

static const struct {
    const char *function;
    const char *header;
    const char *also;        /* in the same header, or in also_header */
    const char *also_header; /* NULL: the same */
} fi_apis[API_COUNT] = {
    [API_TRACE_START] = {"cube_trace_start", "profile.h", NULL},
    [API_OPEN] = {"cube_client_open", "client.h", NULL},
    [API_KERNEL_CREATE] = {"cube_kernel_create", "kernel.h", NULL},
    [API_KERNEL_CREATE_RAW] = {"cube_kernel_create_raw", "kernel.h", NULL},
    [API_CREATE] = {"cube_create", "buffer.h", "cube_empty"},
    [API_EMPTY] = {"cube_empty", "buffer.h", NULL},
    [API_SET_LABEL] = {"cube_handle_set_label", "buffer.h", NULL},
    [API_LAUNCH] = {"cube_launch", "kernel.h", NULL},
    [API_READ] = {"cube_read", "buffer.h", "cube_write"},
    [API_WRITE] = {"cube_write", "buffer.h", NULL},
    [API_STAGING] = {"cube_staging", "buffer.h", NULL},
    [API_STAGING_FREE] = {"cube_staging_free", "buffer.h", NULL},
    /* One comment covers the pair. */
    [API_PERSISTENT_BEGIN] = {"cube_persistent_begin", "memory.h", NULL},
    [API_PERSISTENT_END] = {"cube_persistent_end", "memory.h",
                            "cube_persistent_begin"},
    [API_GRAPH_PREPARE] = {"cube_graph_prepare", "graph.h", NULL},
    [API_GRAPH_BEGIN] = {"cube_graph_begin", "graph.h", NULL},
    [API_GRAPH_END] = {"cube_graph_end", "graph.h", NULL},
    [API_GRAPH_REPLAY] = {"cube_graph_replay", "graph.h", "cube_launch",
                          "kernel.h"},
    [API_GRAPH_DESTROY] = {"cube_graph_destroy", "graph.h", NULL},
    [API_PROFILE_START] = {"cube_profile_start", "profile.h", NULL},
    [API_PROFILE_END] = {"cube_profile_end", "profile.h", NULL},
    [API_RANGE_PUSH] = {"cube_range_push", "profile.h", NULL},
    [API_RANGE_POP] = {"cube_range_pop", "profile.h", NULL},
    [API_READ_ASYNC] = {"cube_read_async", "buffer.h", NULL},
    [API_FUTURE_WAIT] = {"cube_future_wait", "buffer.h", "cube_read"},
    [API_MEMORY_REPORT] = {"cube_memory_report_get", "memory.h", NULL},
    [API_REPORT_FORMAT] = {"cube_memory_report_format", NULL, NULL},
    [API_COMM_INIT] = {"cube_comm_init_all", "comm.h", NULL},
    [API_ALL_REDUCE] = {"cube_all_reduce", "comm.h", NULL},
    [API_GROUP_END] = {"cube_group_end", "comm.h", "cube_all_reduce"},
    [API_COPY_PEER] = {"cube_copy_peer", "comm.h", NULL},
    [API_COMM_DESTROY] = {"cube_comm_destroy", NULL, NULL},
    [API_LAYOUT_PRESET] = {"cube_memory_layout_preset", "memory.h", NULL},
    [API_INSTALL_POOLS] = {"cube_install_memory_pools", "memory.h", NULL},
    [API_CLEANUP] = {"cube_memory_cleanup", "client.h", NULL},
    [API_RELEASE] = {"cube_handle_release", "buffer.h", NULL},
    [API_KERNEL_RELEASE] = {"cube_kernel_release", NULL, NULL},
    [API_CLOSE] = {"cube_client_close", NULL, NULL},
    [API_TRACE_STOP] = {"cube_trace_stop", "profile.h", NULL},
};

/* Codes named in each call's comment (bit per code), read by the parent
 * before any fork. */
static unsigned fi_documented[API_COUNT];

/* ============================================ shared with the children */

/* One counted call. */
typedef struct fi_call {
    uintptr_t site; /* return address: the call instruction in the library */
    uintptr_t callers[2]; /* the two return addresses above it */
    uint16_t kind;
    uint16_t api;      /* the scenario's API call running then */
    uint8_t on_worker; /* made on a thread other than the scenario's */
} fi_call;

#define FI_MAX_CALLS 65536u
#define FI_MSG 1024

/* What a child reports back. */
typedef struct fi_outcome {
    int reached;  /* the chosen call was made, and failed */
    int api;      /* the API call that met it */
    int answered; /* the API call whose answer reported it, or -1 */
    int code;     /* that answer's code */
    char msg[FI_MSG];
} fi_outcome;

typedef struct fi_shared {
    atomic_uint ncalls;
    atomic_uint dropped;
    fi_call calls[FI_MAX_CALLS];
} fi_shared;

static fi_shared *fi_sh;

/* ================================================ the wrapper's state */

enum { FI_OFF = 0, FI_COUNT = 1, FI_INJECT = 2 };

static atomic_int fi_mode;
static uintptr_t fi_target_site;
static uintptr_t fi_target_callers[2];
static int fi_target_kind;
static unsigned fi_target_occ;
static atomic_uint fi_target_seen;
static atomic_int fi_injected;     /* 1 once the target failed */
static atomic_int fi_injected_api; /* the API call running then */
static atomic_int fi_injected_pos; /* and its place in the scenario */
static atomic_int fi_api_now = -1; /* the API call the scenario is in */
static atomic_int fi_pos_now;      /* its place: 1, 2, ... */
static _Thread_local int fi_scenario_thread;

/* The two return addresses above `ra` on this thread's stack (0 where
 * there are none): a call site is told apart by where it was reached
 * from, so a helper's one call (the temporary directory of a compile and
 * that of a load) counts as one site per caller. */
static void fi_callers(const void *ra, uintptr_t out[2])
{
    void *frames[24];
    int n = backtrace(frames, 24);
    out[0] = out[1] = 0;
    for (int i = 0; i < n; i++)
        if (frames[i] == ra) {
            if (i + 1 < n)
                out[0] = (uintptr_t)frames[i + 1];
            if (i + 2 < n)
                out[1] = (uintptr_t)frames[i + 2];
            return;
        }
}

static int fi_fail(fi_kind kind, void *ra)
{
    int mode = atomic_load_explicit(&fi_mode, memory_order_acquire);
    if (mode == FI_OFF)
        return 0;
    if (mode == FI_COUNT) {
        unsigned i = atomic_fetch_add(&fi_sh->ncalls, 1);
        if (i >= FI_MAX_CALLS) {
            atomic_fetch_add(&fi_sh->dropped, 1);
            return 0;
        }
        fi_call *call = &fi_sh->calls[i];
        *call = (fi_call){.site = (uintptr_t)ra,
                          .kind = (uint16_t)kind,
                          .api = (uint16_t)atomic_load(&fi_api_now),
                          .on_worker = !fi_scenario_thread};
        fi_callers(ra, call->callers);
        return 0;
    }
    if ((uintptr_t)ra != fi_target_site || (int)kind != fi_target_kind)
        return 0;
    uintptr_t callers[2];
    fi_callers(ra, callers);
    if (callers[0] != fi_target_callers[0] ||
        callers[1] != fi_target_callers[1])
        return 0;
    if (atomic_fetch_add(&fi_target_seen, 1) + 1 != fi_target_occ)
        return 0;
    atomic_store(&fi_injected_api, atomic_load(&fi_api_now));
    atomic_store(&fi_injected_pos, atomic_load(&fi_pos_now));
    atomic_store(&fi_injected, 1);
    return 1;
}

#define FI_RA __builtin_return_address(0)

/* The real functions and their wrappers. */
void *__real_malloc(size_t n);
void *__real_calloc(size_t n, size_t size);
void *__real_realloc(void *p, size_t n);
char *__real_strdup(const char *s);
void *__real_aligned_alloc(size_t align, size_t n);
void *__real_mmap(void *addr, size_t len, int prot, int flags, int fd,
                  off_t off);
int __real_mprotect(void *addr, size_t len, int prot);
ssize_t __real_getline(char **line, size_t *cap, FILE *f);
ssize_t __real___getdelim(char **line, size_t *cap, int delim, FILE *f);
XXH3_state_t *__real_XXH3_createState(void);
int __real_posix_spawn_file_actions_addopen(posix_spawn_file_actions_t *fa,
                                            int fd, const char *path, int flags,
                                            mode_t mode);
int __real_posix_spawn_file_actions_adddup2(posix_spawn_file_actions_t *fa,
                                            int fd, int to);
int __real_posix_spawnp(pid_t *pid, const char *file,
                        const posix_spawn_file_actions_t *fa,
                        const posix_spawnattr_t *attr, char *const argv[],
                        char *const envp[]);
int __real_pthread_create(pthread_t *t, const pthread_attr_t *attr,
                          void *(*fn)(void *), void *arg);
int __real_open(const char *path, int flags, ...);
int __real_openat(int dirfd, const char *path, int flags, ...);
FILE *__real_fopen(const char *path, const char *mode);
FILE *__real_fdopen(int fd, const char *mode);
DIR *__real_opendir(const char *path);
int __real_pipe2(int fds[2], int flags);
char *__real_mkdtemp(char *tmpl);
void *__real_dlopen(const char *path, int flags);

void *__wrap_malloc(size_t n);
void *__wrap_calloc(size_t n, size_t size);
void *__wrap_realloc(void *p, size_t n);
char *__wrap_strdup(const char *s);
void *__wrap_aligned_alloc(size_t align, size_t n);
void *__wrap_mmap(void *addr, size_t len, int prot, int flags, int fd,
                  off_t off);
int __wrap_mprotect(void *addr, size_t len, int prot);
ssize_t __wrap_getline(char **line, size_t *cap, FILE *f);
ssize_t __wrap___getdelim(char **line, size_t *cap, int delim, FILE *f);
XXH3_state_t *__wrap_XXH3_createState(void);
int __wrap_posix_spawn_file_actions_addopen(posix_spawn_file_actions_t *fa,
                                            int fd, const char *path, int flags,
                                            mode_t mode);
int __wrap_posix_spawn_file_actions_adddup2(posix_spawn_file_actions_t *fa,
                                            int fd, int to);
int __wrap_posix_spawnp(pid_t *pid, const char *file,
                        const posix_spawn_file_actions_t *fa,
                        const posix_spawnattr_t *attr, char *const argv[],
                        char *const envp[]);
int __wrap_pthread_create(pthread_t *t, const pthread_attr_t *attr,
                          void *(*fn)(void *), void *arg);
int __wrap_open(const char *path, int flags, ...);
int __wrap_openat(int dirfd, const char *path, int flags, ...);
FILE *__wrap_fopen(const char *path, const char *mode);
FILE *__wrap_fdopen(int fd, const char *mode);
DIR *__wrap_opendir(const char *path);
int __wrap_pipe2(int fds[2], int flags);
char *__wrap_mkdtemp(char *tmpl);
void *__wrap_dlopen(const char *path, int flags);

void *__wrap_malloc(size_t n)
{
    if (fi_fail(FI_MALLOC, FI_RA)) {
        errno = ENOMEM;
        return NULL;
    }
    return __real_malloc(n);
}

void *__wrap_calloc(size_t n, size_t size)
{
    if (fi_fail(FI_CALLOC, FI_RA)) {
        errno = ENOMEM;
        return NULL;
    }
    return __real_calloc(n, size);
}

void *__wrap_realloc(void *p, size_t n)
{
    if (fi_fail(FI_REALLOC, FI_RA)) {
        errno = ENOMEM;
        return NULL;
    }
    return __real_realloc(p, n);
}

char *__wrap_strdup(const char *s)
{
    if (fi_fail(FI_STRDUP, FI_RA)) {
        errno = ENOMEM;
        return NULL;
    }
    return __real_strdup(s);
}

void *__wrap_aligned_alloc(size_t align, size_t n)
{
    if (fi_fail(FI_ALIGNED_ALLOC, FI_RA)) {
        errno = ENOMEM;
        return NULL;
    }
    return __real_aligned_alloc(align, n);
}

void *__wrap_mmap(void *addr, size_t len, int prot, int flags, int fd,
                  off_t off)
{
    if (fi_fail(FI_MMAP, FI_RA)) {
        errno = ENOMEM;
        return MAP_FAILED;
    }
    return __real_mmap(addr, len, prot, flags, fd, off);
}

int __wrap_mprotect(void *addr, size_t len, int prot)
{
    if (fi_fail(FI_MPROTECT, FI_RA)) {
        errno = ENOMEM;
        return -1;
    }
    return __real_mprotect(addr, len, prot);
}

ssize_t __wrap_getline(char **line, size_t *cap, FILE *f)
{
    if (fi_fail(FI_GETLINE, FI_RA)) {
        errno = ENOMEM;
        return -1;
    }
    return __real_getline(line, cap, f);
}

ssize_t __wrap___getdelim(char **line, size_t *cap, int delim, FILE *f)
{
    if (fi_fail(FI_GETLINE, FI_RA)) {
        errno = ENOMEM;
        return -1;
    }
    return __real___getdelim(line, cap, delim, f);
}

XXH3_state_t *__wrap_XXH3_createState(void)
{
    if (fi_fail(FI_XXH_STATE, FI_RA))
        return NULL;
    return __real_XXH3_createState();
}

int __wrap_posix_spawn_file_actions_addopen(posix_spawn_file_actions_t *fa,
                                            int fd, const char *path, int flags,
                                            mode_t mode)
{
    if (fi_fail(FI_SPAWN_ACTIONS, FI_RA))
        return ENOMEM;
    return __real_posix_spawn_file_actions_addopen(fa, fd, path, flags, mode);
}

int __wrap_posix_spawn_file_actions_adddup2(posix_spawn_file_actions_t *fa,
                                            int fd, int to)
{
    if (fi_fail(FI_SPAWN_ACTIONS, FI_RA))
        return ENOMEM;
    return __real_posix_spawn_file_actions_adddup2(fa, fd, to);
}

int __wrap_posix_spawnp(pid_t *pid, const char *file,
                        const posix_spawn_file_actions_t *fa,
                        const posix_spawnattr_t *attr, char *const argv[],
                        char *const envp[])
{
    if (fi_fail(FI_POSIX_SPAWNP, FI_RA))
        return EAGAIN;
    return __real_posix_spawnp(pid, file, fa, attr, argv, envp);
}

int __wrap_pthread_create(pthread_t *t, const pthread_attr_t *attr,
                          void *(*fn)(void *), void *arg)
{
    if (fi_fail(FI_PTHREAD_CREATE, FI_RA))
        return EAGAIN;
    return __real_pthread_create(t, attr, fn, arg);
}

int __wrap_open(const char *path, int flags, ...)
{
    mode_t mode = 0;
    if (flags & (O_CREAT | O_TMPFILE)) {
        va_list ap;
        va_start(ap, flags);
        mode = (mode_t)va_arg(ap, int);
        va_end(ap);
    }
    if (fi_fail(FI_OPEN, FI_RA)) {
        errno = EMFILE;
        return -1;
    }
    return __real_open(path, flags, mode);
}

int __wrap_openat(int dirfd, const char *path, int flags, ...)
{
    mode_t mode = 0;
    if (flags & (O_CREAT | O_TMPFILE)) {
        va_list ap;
        va_start(ap, flags);
        mode = (mode_t)va_arg(ap, int);
        va_end(ap);
    }
    if (fi_fail(FI_OPENAT, FI_RA)) {
        errno = EMFILE;
        return -1;
    }
    return __real_openat(dirfd, path, flags, mode);
}

FILE *__wrap_fopen(const char *path, const char *mode)
{
    if (fi_fail(FI_FOPEN, FI_RA)) {
        errno = EMFILE;
        return NULL;
    }
    return __real_fopen(path, mode);
}

FILE *__wrap_fdopen(int fd, const char *mode)
{
    if (fi_fail(FI_FDOPEN, FI_RA)) {
        errno = ENOMEM;
        return NULL;
    }
    return __real_fdopen(fd, mode);
}

DIR *__wrap_opendir(const char *path)
{
    if (fi_fail(FI_OPENDIR, FI_RA)) {
        errno = EMFILE;
        return NULL;
    }
    return __real_opendir(path);
}

int __wrap_pipe2(int fds[2], int flags)
{
    if (fi_fail(FI_PIPE2, FI_RA)) {
        errno = EMFILE;
        return -1;
    }
    return __real_pipe2(fds, flags);
}

char *__wrap_mkdtemp(char *tmpl)
{
    if (fi_fail(FI_MKDTEMP, FI_RA)) {
        errno = ENOSPC;
        return NULL;
    }
    return __real_mkdtemp(tmpl);
}

void *__wrap_dlopen(const char *path, int flags)
{
    if (fi_fail(FI_DLOPEN_CALL, FI_RA))
        return NULL;
    return __real_dlopen(path, flags);
}

/* ========================================================== the scenario */

#define FI_N 256u /* elements: four cubes of 64 */
#define FI_BYTES ((uint64_t)FI_N * sizeof(float))
#define FI_WIDE (4u << 20) /* room for a buffer in the expandable pool */

static const char FI_SRC_AFFINE[] =
    "CUBE_KERNEL(fi_affine, CUBE_IN(float, x), CUBE_OUT(float, y),\n"
    "            CUBE_SCALAR(float, a), CUBE_SCALAR(float, b))\n"
    "{\n"
    "    uint32_t i = ABSOLUTE_POS_X;\n"
    "    if (i < CUBE_LEN(y))\n"
    "        y[i] = a * x[i] + b;\n"
    "}\n";

/* Each cube reverses its 64 elements through shared memory: the units
 * meet at cube_sync(), and run as loops between it (the barrier pass). */
static const char FI_SRC_REVERSE[] =
    "CUBE_KERNEL(fi_reverse, CUBE_IN(float, x), CUBE_OUT(float, y),\n"
    "            CUBE_SHARED(float, t, 64))\n"
    "{\n"
    "    uint32_t u = UNIT_POS_X, i = ABSOLUTE_POS_X;\n"
    "    t[u] = i < CUBE_LEN(x) ? x[i] : 0.0f;\n"
    "    cube_sync();\n"
    "    if (i < CUBE_LEN(y))\n"
    "        y[i] = t[63 - u];\n"
    "}\n";

/* The same, with the barrier under a condition the barrier pass cannot
 * prove uniform: the units run as fibers (their stacks are mapped). */
static const char FI_SRC_REVERSE_FIBERS[] =
    "CUBE_KERNEL(fi_reverse_fibers, CUBE_IN(float, x), CUBE_OUT(float, y),\n"
    "            CUBE_SHARED(float, t, 64))\n"
    "{\n"
    "    uint32_t u = UNIT_POS_X, i = ABSOLUTE_POS_X;\n"
    "    t[u] = i < CUBE_LEN(x) ? x[i] : 0.0f;\n"
    "    if (u < 64)\n"
    "        cube_sync();\n"
    "    if (i < CUBE_LEN(y))\n"
    "        y[i] = t[63 - u];\n"
    "}\n";

/* A raw C kernel (cubert/cpu_kernel.h): y = a * x + b, one element per
 * unit, compiled and cached like cube C. */
static const char FI_SRC_RAW[] =
    "void fi_raw(const cube_cpu_cube *c)\n"
    "{\n"
    "    const float *x = c->params[0].data;\n"
    "    float *y = c->params[1].data;\n"
    "    float a = *(const float *)c->params[2].data;\n"
    "    float b = *(const float *)c->params[3].data;\n"
    "    for (uint32_t u = 0; u < c->dim[0]; u++) {\n"
    "        uint64_t i = (uint64_t)c->index * c->dim[0] + u;\n"
    "        if (i * sizeof(float) < c->params[1].bytes)\n"
    "            y[i] = a * x[i] + b;\n"
    "    }\n"
    "}\n";

static const cube_raw_param FI_RAW_PARAMS[4] = {{CUBE_RAW_BUFFER_IN, 4},
                                                {CUBE_RAW_BUFFER_OUT, 4},
                                                {CUBE_RAW_SCALAR, 4},
                                                {CUBE_RAW_SCALAR, 4}};

/* Where a child works: its own directory, temporary directory, cache and
 * configuration file. */
typedef struct fi_paths {
    char dir[600];
    char tmp[700];
    char cache[700];
    char config[700];
    char log[700];
} fi_paths;

typedef struct fi_scene {
    const fi_paths *paths;
    int attempt;
    cube_client *c;
    cube_kernel *affine, *reverse, *reverse_fibers, *raw;
    cube_handle x, y, z;
    cube_handle w; /* in the expandable pool */
    cube_graph_id graph;
    cube_graph_id comm_graph; /* a group of collectives captured */
    int capturing;
    cube_profile_token token;
    int profiling;
    cube_future *future;
    void *stage;
    int persistent;
    cube_comm *comm;
    /* Host copies of what each buffer must hold, and whether that is
     * known (the buffer was written or verified since its last change). */
    float hx[FI_N], hy[FI_N], hz[FI_N];
    int known_x, known_y, known_z;
    char trace[800];
    /* The outcome. */
    int failed;      /* an API call answered an error */
    int failed_api;  /* which */
    int failed_pos;  /* its place in the scenario */
    cube_error *err; /* its answer */
    int report_null; /* cube_memory_report_format answered NULL */
    char wrong[FI_MSG];
} fi_scene;

static void fi_wrong(fi_scene *sc, const char *fmt, ...) CUBE_PRINTF(2, 3);
static void fi_wrong(fi_scene *sc, const char *fmt, ...)
{
    if (sc->wrong[0])
        return; /* the first one says most */
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(sc->wrong, sizeof sc->wrong, fmt, ap);
    va_end(ap);
}

static void fi_enter(fi_api api)
{
    atomic_store(&fi_api_now, (int)api);
    atomic_fetch_add(&fi_pos_now, 1);
}

/* Takes the answer of an API call; false when it is an error (kept for
 * the checks: the scenario then stops). */
static bool fi_ok(fi_scene *sc, fi_api api, cube_error *err)
{
    if (!err)
        return true;
    sc->failed = 1;
    sc->failed_api = (int)api;
    sc->failed_pos = atomic_load(&fi_pos_now);
    sc->err = err;
    return false;
}

#define FI_CALL(api, expr) (fi_enter(api), fi_ok(sc, (api), (expr)))

static void fi_fill(float *v, float base, float step)
{
    for (uint32_t i = 0; i < FI_N; i++)
        v[i] = base + step * (float)i;
}

static void fi_affine_host(const float *x, float *y, float a, float b)
{
    for (uint32_t i = 0; i < FI_N; i++)
        y[i] = a * x[i] + b;
}

static void fi_reverse_host(const float *x, float *y)
{
    for (uint32_t i = 0; i < FI_N; i++)
        y[i] = x[(i / 64u) * 64u + (63u - i % 64u)];
}

static void fi_compare(fi_scene *sc, const char *what, const float *got,
                       const float *want)
{
    for (uint32_t i = 0; i < FI_N; i++)
        if (got[i] != want[i]) {
            fi_wrong(sc, "%s: element %u is %g, expected %g", what, i,
                     (double)got[i], (double)want[i]);
            return;
        }
}

static cube_error *fi_launch(fi_scene *sc, cube_kernel *k, cube_handle in,
                             cube_handle out, int affine, float a, float b)
{
    cube_arg args[4] = {cube_arg_buffer(in), cube_arg_buffer(out),
                        cube_arg_f32(a), cube_arg_f32(b)};
    return cube_launch(sc->c, k, cube_count_static(FI_N / 64u, 1, 1), args,
                       affine ? 4 : 2, CUBE_LAUNCH_EXECUTE);
}

static cube_error *fi_read1(cube_client *c, cube_handle h, float *out)
{
    cube_copy_desc d = cube_copy_desc_contiguous(h, FI_BYTES, sizeof(float));
    void *dst[1] = {out};
    uint64_t size[1] = {FI_BYTES};
    return cube_read(c, &d, dst, size, 1);
}

/* After a failure (injection off): buffers whose contents were known must
 * still read back as they were. A capture or window left open ends
 * first. */
static void fi_check_survivors(fi_scene *sc)
{
    if (!sc->c)
        return;
    if (sc->future) {
        cube_error_free(cube_future_wait(sc->future));
        cube_future_free(sc->future);
        sc->future = NULL;
    }
    if (sc->capturing) {
        cube_graph_id g = 0;
        cube_error_free(cube_graph_end(sc->c, &g));
        if (g)
            cube_error_free(cube_graph_destroy(sc->c, g));
        sc->capturing = 0;
    }
    if (sc->profiling) {
        cube_profile_abandon(sc->c, sc->token);
        sc->profiling = 0;
    }
    if (sc->persistent) {
        cube_error_free(cube_persistent_end(sc->c));
        sc->persistent = 0;
    }
    const struct {
        const char *name;
        cube_handle h;
        int known;
        const float *want;
    } bufs[3] = {{"x", sc->x, sc->known_x, sc->hx},
                 {"y", sc->y, sc->known_y, sc->hy},
                 {"z", sc->z, sc->known_z, sc->hz}};
    for (int i = 0; i < 3; i++) {
        if (!bufs[i].h.bits || !bufs[i].known)
            continue;
        float got[FI_N];
        cube_error *err = fi_read1(sc->c, bufs[i].h, got);
        if (err) {
            fi_wrong(sc,
                     "after the failure, %s (written before it) cannot "
                     "be read: %s: %s",
                     bufs[i].name, cube_code_name(cube_error_code(err)),
                     cube_error_message(err));
            cube_error_free(err);
            continue;
        }
        char what[64];
        snprintf(what, sizeof what, "after the failure, %s", bufs[i].name);
        fi_compare(sc, what, got, bufs[i].want);
    }
}

/* Releases what the scenario still holds (injection off after a
 * failure; part of the scenario otherwise). */
static void fi_release_all(fi_scene *sc)
{
    cube_comm_destroy(sc->comm);
    sc->comm = NULL;
    if (sc->c) {
        if (sc->stage) {
            cube_error *err = cube_staging_free(sc->c, sc->stage);
            if (err) {
                fi_wrong(sc, "cleanup: cube_staging_free: %s",
                         cube_error_message(err));
                cube_error_free(err);
            }
            sc->stage = NULL;
        }
        cube_graph_id *graphs[2] = {&sc->graph, &sc->comm_graph};
        for (int i = 0; i < 2; i++) {
            if (!*graphs[i])
                continue;
            cube_error *err = cube_graph_destroy(sc->c, *graphs[i]);
            if (err) {
                fi_wrong(sc, "cleanup: cube_graph_destroy: %s",
                         cube_error_message(err));
                cube_error_free(err);
            }
            *graphs[i] = 0;
        }
        cube_handle *hs[4] = {&sc->x, &sc->y, &sc->z, &sc->w};
        for (int i = 0; i < 4; i++) {
            if (!hs[i]->bits)
                continue;
            cube_error *err = cube_handle_release(sc->c, *hs[i]);
            if (err) {
                fi_wrong(sc, "cleanup: cube_handle_release: %s",
                         cube_error_message(err));
                cube_error_free(err);
            }
        }
    }
    cube_kernel_release(sc->affine);
    cube_kernel_release(sc->reverse);
    cube_kernel_release(sc->reverse_fibers);
    cube_kernel_release(sc->raw);
    cube_client_close(sc->c);
    sc->c = NULL;
    cube_error_free(cube_trace_stop());
}

static void fi_disarm(void)
{
    atomic_store_explicit(&fi_mode, FI_OFF, memory_order_release);
}

/* The steps, in order; the first error ends them. */
static void fi_steps(fi_scene *sc)
{
    float got[FI_N], got2[FI_N];
    snprintf(sc->trace, sizeof sc->trace, "%s/trace-%d.json", sc->paths->dir,
             sc->attempt);
    if (!FI_CALL(API_TRACE_START, cube_trace_start(sc->trace)))
        return;

    cube_client_options o = cube_client_options_default();
    o.cpu_threads = 2; /* one worker thread besides the caller */
    o.cache_dir = sc->paths->cache;
    if (!FI_CALL(API_OPEN, cube_client_open("cpu", &o, &sc->c)))
        return;

    cube_kernel_desc da = {"fi_affine", FI_SRC_AFFINE, {64, 1, 1}};
    cube_kernel_desc dr = {"fi_reverse", FI_SRC_REVERSE, {64, 1, 1}};
    cube_kernel_desc drf = {
        "fi_reverse_fibers", FI_SRC_REVERSE_FIBERS, {64, 1, 1}};
    if (!FI_CALL(API_KERNEL_CREATE, cube_kernel_create(&da, &sc->affine)) ||
        !FI_CALL(API_KERNEL_CREATE, cube_kernel_create(&dr, &sc->reverse)) ||
        !FI_CALL(API_KERNEL_CREATE,
                 cube_kernel_create(&drf, &sc->reverse_fibers)))
        return;
    cube_raw_kernel_desc draw;
    memset(&draw, 0, sizeof draw);
    draw.name = "fi_raw";
    draw.format = CUBE_KERNEL_C_SOURCE;
    draw.source = FI_SRC_RAW;
    draw.params = FI_RAW_PARAMS;
    draw.nparams = 4;
    draw.cube_dim[0] = 64;
    if (!FI_CALL(API_KERNEL_CREATE_RAW,
                 cube_kernel_create_raw(&draw, &sc->raw)))
        return;

    /* A buffer made from host data, two empty ones, a launch and a read. */
    fi_fill(sc->hx, 1.0f, 1.0f);
    if (!FI_CALL(API_CREATE, cube_create(sc->c, sc->hx, FI_BYTES, &sc->x)))
        return;
    sc->known_x = 1;
    if (!FI_CALL(API_EMPTY, cube_empty(sc->c, FI_BYTES, &sc->y)))
        return;
    /* The label is copied: its allocation is failed too. */
    if (!FI_CALL(API_SET_LABEL, cube_handle_set_label(sc->c, sc->y, "fi y")))
        return;
    /* z lives as long as the graph: from the persistent pool. */
    if (!FI_CALL(API_PERSISTENT_BEGIN, cube_persistent_begin(sc->c)))
        return;
    sc->persistent = 1;
    if (!FI_CALL(API_EMPTY, cube_empty(sc->c, FI_BYTES, &sc->z)))
        return;
    sc->persistent = 0;
    if (!FI_CALL(API_PERSISTENT_END, cube_persistent_end(sc->c)))
        return;
    if (!FI_CALL(API_LAUNCH,
                 fi_launch(sc, sc->affine, sc->x, sc->y, 1, 2.0f, 1.0f)))
        return;
    if (!FI_CALL(API_READ, fi_read1(sc->c, sc->y, got)))
        return;
    fi_affine_host(sc->hx, sc->hy, 2.0f, 1.0f);
    fi_compare(sc, "y after the first launch", got, sc->hy);
    sc->known_y = 1;
    /* The raw kernel computes the same function. */
    sc->known_y = 0;
    if (!FI_CALL(API_LAUNCH,
                 fi_launch(sc, sc->raw, sc->x, sc->y, 1, -1.0f, 4.0f)))
        return;
    if (!FI_CALL(API_READ, fi_read1(sc->c, sc->y, got)))
        return;
    fi_affine_host(sc->hx, sc->hy, -1.0f, 4.0f);
    fi_compare(sc, "y after the raw kernel's launch", got, sc->hy);
    sc->known_y = 1;

    /* New input, then a graph: prepare, warm up, capture two launches. */
    float nx[FI_N];
    fi_fill(nx, -7.0f, 3.0f);
    cube_copy_desc dx = cube_copy_desc_contiguous(sc->x, FI_BYTES, 4);
    const void *src[1] = {nx};
    uint64_t src_size[1] = {FI_BYTES};
    sc->known_x = 0; /* a failed write may leave any part of it */
    if (!FI_CALL(API_WRITE, cube_write(sc->c, &dx, src, src_size, 1)))
        return;
    memcpy(sc->hx, nx, sizeof nx);
    sc->known_x = 1;
    if (!FI_CALL(API_GRAPH_PREPARE, cube_graph_prepare(sc->c)))
        return;
    sc->known_y = sc->known_z = 0;
    if (!FI_CALL(API_LAUNCH,
                 fi_launch(sc, sc->affine, sc->x, sc->y, 1, 3.0f, -2.0f)) ||
        !FI_CALL(API_LAUNCH, fi_launch(sc, sc->reverse_fibers, sc->y, sc->z, 0,
                                       0.0f, 0.0f)) ||
        !FI_CALL(API_LAUNCH,
                 fi_launch(sc, sc->reverse, sc->y, sc->z, 0, 0.0f, 0.0f)))
        return;
    if (!FI_CALL(API_GRAPH_BEGIN, cube_graph_begin(sc->c)))
        return;
    sc->capturing = 1;
    if (!FI_CALL(API_LAUNCH,
                 fi_launch(sc, sc->affine, sc->x, sc->y, 1, 3.0f, -2.0f)) ||
        !FI_CALL(API_LAUNCH,
                 fi_launch(sc, sc->reverse, sc->y, sc->z, 0, 0.0f, 0.0f)))
        return;
    sc->capturing = 0; /* cube_graph_end ends it even when it fails */
    if (!FI_CALL(API_GRAPH_END, cube_graph_end(sc->c, &sc->graph)))
        return;

    /* Another input, written from a staging buffer, and the graph replayed
     * inside a profiling window. */
    uint64_t stage_size = FI_BYTES;
    if (!FI_CALL(API_STAGING, cube_staging(sc->c, &stage_size, 1, &sc->stage)))
        return;
    fi_fill(sc->stage, 5.0f, -2.0f);
    const void *staged[1] = {sc->stage};
    sc->known_x = 0;
    if (!FI_CALL(API_WRITE, cube_write(sc->c, &dx, staged, src_size, 1)))
        return;
    memcpy(sc->hx, sc->stage, FI_BYTES);
    sc->known_x = 1;
    void *stage = sc->stage;
    sc->stage = NULL;
    if (!FI_CALL(API_STAGING_FREE, cube_staging_free(sc->c, stage)))
        return;
    /* A range around the profiled replay: one that a failure below
     * leaves open is ended by the close. */
    if (!FI_CALL(API_RANGE_PUSH, cube_range_push(sc->c, "fi profiled")))
        return;
    if (!FI_CALL(API_PROFILE_START, cube_profile_start(sc->c, &sc->token)))
        return;
    sc->profiling = 1;
    if (!FI_CALL(API_GRAPH_REPLAY, cube_graph_replay(sc->c, sc->graph)))
        return;
    cube_profile_result pr;
    memset(&pr, 0, sizeof pr);
    sc->profiling = 0; /* ended either way */
    if (!FI_CALL(API_PROFILE_END, cube_profile_end(sc->c, sc->token, &pr)))
        return;
    if (pr.method != CUBE_TIMING_HOST_CLOCK || !(pr.seconds >= 0.0))
        fi_wrong(sc, "profile: method %d, %g seconds", (int)pr.method,
                 pr.seconds);
    if (!FI_CALL(API_RANGE_POP, cube_range_pop(sc->c)))
        return;

    /* Both outputs in one read, the input through an asynchronous one. */
    cube_copy_desc dyz[2] = {cube_copy_desc_contiguous(sc->y, FI_BYTES, 4),
                             cube_copy_desc_contiguous(sc->z, FI_BYTES, 4)};
    void *dst[2] = {got, got2};
    uint64_t dst_size[2] = {FI_BYTES, FI_BYTES};
    if (!FI_CALL(API_READ, cube_read(sc->c, dyz, dst, dst_size, 2)))
        return;
    fi_affine_host(sc->hx, sc->hy, 3.0f, -2.0f);
    fi_reverse_host(sc->hy, sc->hz);
    fi_compare(sc, "y after the replay", got, sc->hy);
    fi_compare(sc, "z after the replay", got2, sc->hz);
    sc->known_y = sc->known_z = 1;
    void *dst_x[1] = {got};
    memset(got, 0, sizeof got);
    if (!FI_CALL(API_READ_ASYNC,
                 cube_read_async(sc->c, &dx, dst_x, dst_size, 1, &sc->future)))
        return;
    cube_error *werr =
        (fi_enter(API_FUTURE_WAIT), cube_future_wait(sc->future));
    cube_future_free(sc->future);
    sc->future = NULL;
    if (!fi_ok(sc, API_FUTURE_WAIT, werr))
        return;
    fi_compare(sc, "x read asynchronously", got, sc->hx);

    /* The memory report, as numbers and as text. */
    cube_memory_report rep;
    if (!FI_CALL(API_MEMORY_REPORT, cube_memory_report_get(sc->c, &rep)))
        return;
    if (rep.usage.buffers < 3 || rep.usage.bytes_in_use < 3 * FI_BYTES)
        fi_wrong(sc, "memory report: %" PRIu64 " buffers, %" PRIu64 " bytes",
                 rep.usage.buffers, rep.usage.bytes_in_use);
    fi_enter(API_REPORT_FORMAT);
    char *text = cube_memory_report_format(&rep, CUBE_REPORT_JSON);
    if (!text) {
        sc->report_null = 1;
    } else {
        json_error_t jerr;
        json_t *j = json_loads(text, 0, &jerr);
        if (!j)
            fi_wrong(sc, "memory report JSON: %s", jerr.text);
        json_decref(j);
        free(text);
    }

    /* A communicator of one rank: an all-reduce in place leaves y as it
     * was; a copy between the client's buffers moves z into x. */
    if (!FI_CALL(API_COMM_INIT, cube_comm_init_all(&sc->c, 1, NULL, &sc->comm)))
        return;
    sc->known_y = 0;
    if (!FI_CALL(API_ALL_REDUCE,
                 cube_all_reduce(sc->comm, sc->y, sc->y, FI_N, CUBE_DTYPE_F32,
                                 CUBE_REDUCE_SUM)))
        return;
    sc->known_y = 1;
    /* Two of them in a group, captured in a graph of their own and
     * replayed: the group's calls are recorded together and replay as
     * one group; y stays as it was. */
    if (!FI_CALL(API_GRAPH_PREPARE, cube_graph_prepare(sc->c)) ||
        !FI_CALL(API_GRAPH_BEGIN, cube_graph_begin(sc->c)))
        return;
    sc->capturing = 1;
    cube_error_free(cube_group_begin()); /* fails only 1024 levels deep */
    for (int i = 0; i < 2; i++)
        /* queued; an error here is also cube_group_end's */
        cube_error_free(cube_all_reduce(sc->comm, sc->y, sc->y, FI_N,
                                        CUBE_DTYPE_F32, CUBE_REDUCE_SUM));
    if (!FI_CALL(API_GROUP_END, cube_group_end()))
        return;
    sc->capturing = 0; /* cube_graph_end ends it even when it fails */
    if (!FI_CALL(API_GRAPH_END, cube_graph_end(sc->c, &sc->comm_graph)))
        return;
    sc->known_y = 0;
    if (!FI_CALL(API_GRAPH_REPLAY, cube_graph_replay(sc->c, sc->comm_graph)))
        return;
    sc->known_y = 1;
    /* It pins y: gone before the pools are rebuilt below. */
    cube_graph_id g = sc->comm_graph;
    sc->comm_graph = 0;
    if (!FI_CALL(API_GRAPH_DESTROY, cube_graph_destroy(sc->c, g)))
        return;
    sc->known_x = 0;
    if (!FI_CALL(API_COPY_PEER, cube_copy_peer(sc->c, sc->x, sc->c, sc->z)))
        return;
    memcpy(sc->hx, sc->hz, FI_BYTES);
    sc->known_x = 1;
    fi_enter(API_COMM_DESTROY);
    cube_comm_destroy(sc->comm);
    sc->comm = NULL;

    /* Everything goes back. */
    if (!FI_CALL(API_GRAPH_DESTROY, cube_graph_destroy(sc->c, sc->graph)))
        return;
    sc->graph = 0;
    cube_handle *hs[3] = {&sc->x, &sc->y, &sc->z};
    int *known[3] = {&sc->known_x, &sc->known_y, &sc->known_z};
    for (int i = 0; i < 3; i++) {
        cube_handle h = *hs[i];
        hs[i]->bits = 0;
        *known[i] = 0;
        if (!FI_CALL(API_RELEASE, cube_handle_release(sc->c, h)))
            return;
    }
    /* The expandable preset: the pool's range is reserved at the first
     * buffer it holds, its pages mapped for it, and unmapped by the
     * cleanup after the release. */
    cube_memory_layout vl;
    if (!FI_CALL(API_LAYOUT_PRESET, cube_memory_layout_preset(
                                        sc->c, CUBE_PRESET_EXPANDABLE, &vl)) ||
        !FI_CALL(API_INSTALL_POOLS, cube_install_memory_pools(sc->c, &vl)))
        return;
    static unsigned char wide[FI_WIDE], wide_back[FI_WIDE];
    uint64_t wsize = vl.pools[vl.count - 1].min_size + 3000u;
    if (wsize < (2u << 20) + 3000u)
        wsize = (2u << 20) + 3000u; /* two pages of 2 MiB */
    if (wsize > FI_WIDE)
        fi_wrong(sc, "the expandable pool starts at %" PRIu64 " bytes",
                 vl.pools[vl.count - 1].min_size);
    if (wsize > FI_WIDE)
        return;
    for (uint64_t i = 0; i < wsize; i++)
        wide[i] = (unsigned char)(i * 7u + 3u);
    if (!FI_CALL(API_CREATE, cube_create(sc->c, wide, wsize, &sc->w)))
        return;
    cube_copy_desc dw = cube_copy_desc_contiguous(sc->w, wsize, 1);
    void *dst_w[1] = {wide_back};
    uint64_t wsizes[1] = {wsize};
    memset(wide_back, 0, sizeof wide_back);
    if (!FI_CALL(API_READ, cube_read(sc->c, &dw, dst_w, wsizes, 1)))
        return;
    if (memcmp(wide, wide_back, (size_t)wsize) != 0)
        fi_wrong(sc, "the buffer in the expandable pool reads back wrong");
    cube_memory_report wrep;
    if (!FI_CALL(API_MEMORY_REPORT, cube_memory_report_get(sc->c, &wrep)))
        return;
    if (wrep.pools[vl.count - 1].config.kind != CUBE_POOL_EXPANDABLE ||
        wrep.pools[vl.count - 1].buffers != 1)
        fi_wrong(sc, "the expandable pool does not hold the buffer");
    cube_handle w = sc->w;
    sc->w.bits = 0;
    if (!FI_CALL(API_RELEASE, cube_handle_release(sc->c, w)) ||
        !FI_CALL(API_CLEANUP, cube_memory_cleanup(sc->c)) ||
        !FI_CALL(API_MEMORY_REPORT, cube_memory_report_get(sc->c, &wrep)))
        return;
    if (wrep.pools[vl.count - 1].bytes_reserved != 0)
        fi_wrong(sc, "cleanup left %" PRIu64 " bytes mapped",
                 wrep.pools[vl.count - 1].bytes_reserved);

    fi_enter(API_KERNEL_RELEASE);
    cube_kernel_release(sc->affine);
    cube_kernel_release(sc->reverse);
    cube_kernel_release(sc->reverse_fibers);
    cube_kernel_release(sc->raw);
    sc->affine = sc->reverse = sc->reverse_fibers = sc->raw = NULL;
    fi_enter(API_CLOSE);
    cube_client_close(sc->c);
    sc->c = NULL;
    FI_CALL(API_TRACE_STOP, cube_trace_stop());
}

/* Runs the scenario: the steps, then (after a failure, with the injection
 * off) the survivors' check, then the cleanup. */
static void fi_scenario(fi_scene *sc, const fi_paths *paths, int attempt)
{
    memset(sc, 0, sizeof *sc);
    sc->paths = paths;
    sc->attempt = attempt;
    fi_scenario_thread = 1;
    atomic_store(&fi_pos_now, 0);
    fi_steps(sc);
    fi_enter(API_COUNT);
    if (sc->failed) {
        fi_disarm();
        fi_check_survivors(sc);
    }
    fi_release_all(sc);
    fi_disarm();
}

/* ========================================================== the checks */

/* Whether every code at the leaves of `err` (an error with causes is
 * judged by its causes) is one of `allowed`. */
static bool fi_leaves_in(const cube_error *err, unsigned allowed)
{
    size_t n = cube_error_cause_count(err);
    if (n == 0)
        return (allowed & FI_BIT(cube_error_code(err))) != 0;
    for (size_t i = 0; i < n; i++)
        if (!fi_leaves_in(cube_error_cause(err, i), allowed))
            return false;
    return true;
}

static void fi_say(fi_outcome *out, const char *fmt, ...) CUBE_PRINTF(2, 3);
static void fi_say(fi_outcome *out, const char *fmt, ...)
{
    size_t len = strlen(out->msg);
    if (len + 2 >= sizeof out->msg)
        return;
    if (len)
        out->msg[len++] = ';', out->msg[len++] = ' ', out->msg[len] = '\0';
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(out->msg + len, sizeof out->msg - len, fmt, ap);
    va_end(ap);
}

/* Judges the injected attempt. Returns 0 when it behaved. */
static int fi_judge(const fi_scene *sc, fi_kind kind, fi_outcome *out)
{
    int bad = 0;
    out->reached = atomic_load(&fi_injected);
    out->api = atomic_load(&fi_injected_api);
    out->answered = sc->failed ? sc->failed_api : -1;
    out->code = sc->failed ? (int)cube_error_code(sc->err) : 0;
    if (sc->wrong[0]) {
        fi_say(out, "wrong data: %s", sc->wrong);
        bad = 1;
    }
    if (sc->failed) {
        const char *fn = fi_apis[sc->failed_api].function;
        cube_code code = cube_error_code(sc->err);
        char *text = cube_error_format(sc->err);
        if (!out->reached) {
            fi_say(out, "%s failed with nothing injected: %s", fn,
                   text ? text : "");
            bad = 1;
        } else if (!(fi_documented[sc->failed_api] & FI_BIT(code))) {
            fi_say(out, "%s answered %s, which its header does not list: %s",
                   fn, cube_code_name(code), text ? text : "");
            bad = 1;
        } else if (!fi_leaves_in(sc->err,
                                 fi_group_codes[fi_kinds[kind].group])) {
            fi_say(out, "%s answered a failed %s with %s: %s", fn,
                   fi_kinds[kind].name, cube_code_name(code), text ? text : "");
            bad = 1;
        } else if (sc->failed_pos < atomic_load(&fi_injected_pos)) {
            fi_say(out, "%s failed before the injection (in %s)", fn,
                   fi_apis[out->api].function);
            bad = 1;
        }
        free(text);
    }
    if (sc->report_null) {
        if (out->reached && out->api == API_REPORT_FORMAT &&
            fi_kinds[kind].group == FI_ALLOC) {
            /* Its documented answer when memory runs out. */
            out->answered = API_REPORT_FORMAT;
            out->code = CUBE_ERR_OUT_OF_MEMORY;
        } else {
            fi_say(out, "cube_memory_report_format answered NULL without "
                        "running out of memory");
            bad = 1;
        }
    }
    return bad;
}

/* ==================================================== children: set-up */

/* Open descriptors, the one on `skip` (the log file, opened once per
 * process) not counted. */
static int fi_count_fds(const char *skip)
{
    DIR *d = opendir("/proc/self/fd");
    if (!d)
        return -1;
    int n = 0;
    struct dirent *ent;
    while ((ent = readdir(d)) != NULL) {
        if (ent->d_name[0] == '.' || atoi(ent->d_name) == dirfd(d))
            continue;
        char link[300], target[1024];
        snprintf(link, sizeof link, "/proc/self/fd/%s", ent->d_name);
        ssize_t len = readlink(link, target, sizeof target - 1);
        if (len > 0) {
            target[len] = '\0';
            if (strcmp(target, skip) == 0)
                continue;
        }
        n++;
    }
    closedir(d);
    return n;
}

static int fi_copy_file(const char *from, const char *to)
{
    int in = open(from, O_RDONLY | O_CLOEXEC);
    if (in < 0)
        return -1;
    int out = open(to, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (out < 0) {
        close(in);
        return -1;
    }
    char buf[65536];
    int rc = 0;
    for (;;) {
        ssize_t n = read(in, buf, sizeof buf);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0) {
            rc = n < 0 ? -1 : 0;
            break;
        }
        if (write(out, buf, (size_t)n) != n) {
            rc = -1;
            break;
        }
    }
    close(in);
    if (close(out) != 0)
        rc = -1;
    return rc;
}

/* Copies the directory tree `from` (directories and regular files) to
 * `to`, private to the user as the disk cache wants it. */
static int fi_copy_tree(const char *from, const char *to)
{
    if (mkdir(to, 0700) != 0)
        return -1;
    DIR *d = opendir(from);
    if (!d)
        return -1;
    int rc = 0;
    struct dirent *ent;
    while (rc == 0 && (ent = readdir(d)) != NULL) {
        if (strcmp(ent->d_name, ".") == 0 || strcmp(ent->d_name, "..") == 0)
            continue;
        char a[1024], b[1024];
        snprintf(a, sizeof a, "%s/%s", from, ent->d_name);
        snprintf(b, sizeof b, "%s/%s", to, ent->d_name);
        struct stat st;
        if (lstat(a, &st) != 0)
            rc = -1;
        else if (S_ISDIR(st.st_mode))
            rc = fi_copy_tree(a, b);
        else if (S_ISREG(st.st_mode))
            rc = fi_copy_file(a, b);
    }
    closedir(d);
    return rc;
}

/* Whether the files `a` and `b` hold the same bytes. */
static bool fi_same_file(const char *a, const char *b)
{
    FILE *fa = fopen(a, "rb"), *fb = fopen(b, "rb");
    bool same = fa && fb;
    while (same) {
        int ca = getc(fa), cb = getc(fb);
        same = ca == cb;
        if (ca == EOF)
            break;
    }
    if (fa)
        fclose(fa);
    if (fb)
        fclose(fb);
    return same;
}

/* After a warm run: the cache still has the secret it was copied with
 * (a new one would cost every entry made with the old, in every process)
 * and every entry (a failed call may cost a rebuild, never an entry).
 * Returns 0, or -1 after saying what is missing. */
static int fi_check_cache(const char *warm, const char *cache, fi_outcome *out)
{
    char from[1024], to[1024];
    snprintf(from, sizeof from, "%s/cpu", warm);
    DIR *d = opendir(from);
    if (!d)
        return -1;
    int rc = 0;
    struct dirent *ent;
    while ((ent = readdir(d)) != NULL) {
        if (ent->d_name[0] == '.')
            continue;
        snprintf(from, sizeof from, "%s/cpu/%s", warm, ent->d_name);
        snprintf(to, sizeof to, "%s/cpu/%s", cache, ent->d_name);
        if (strcmp(ent->d_name, "secret") == 0 ? !fi_same_file(from, to)
                                               : access(to, F_OK) != 0) {
            fi_say(out, "the disk cache lost %s '%s'",
                   strcmp(ent->d_name, "secret") == 0 ? "its secret"
                                                      : "the entry",
                   ent->d_name);
            rc = -1;
        }
    }
    closedir(d);
    return rc;
}

static int fi_write_text(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");
    if (!f)
        return -1;
    int rc = fputs(text, f) == EOF ? -1 : 0;
    if (fclose(f) != 0)
        rc = -1;
    return rc;
}

static void fi_discard_log(void *user, cube_log_level level,
                           const char *category, const char *message)
{
    (void)user;
    (void)level;
    (void)category;
    (void)message;
}

/* A child's directory: a temporary directory the library compiles in
 * (TMPDIR), a cache (a copy of `warm_cache`, or none yet: cold) and a
 * configuration file naming a log file. */
static int fi_child_setup(const char *dir, const char *warm_cache, fi_paths *p)
{
    memset(p, 0, sizeof *p);
    snprintf(p->dir, sizeof p->dir, "%s", dir);
    snprintf(p->tmp, sizeof p->tmp, "%s/tmp", dir);
    snprintf(p->cache, sizeof p->cache, "%s/cache", dir);
    snprintf(p->config, sizeof p->config, "%s/config", dir);
    snprintf(p->log, sizeof p->log, "%s/cubert.log", dir);
    if (mkdir(p->tmp, 0700) != 0)
        return -1;
    if (warm_cache && fi_copy_tree(warm_cache, p->cache) != 0)
        return -1;
    /* Kernels compiled without optimization: the compiler is run, and
     * can be failed, exactly as with the defaults, in half the time (a
     * compile is most of a cold-cache run); every result is still checked
     * against the host. */
    char text[1024];
    snprintf(text, sizeof text,
             "# written by test_fault_injection\n"
             "log_file = %s\n"
             "log_level = info\n"
             "cpu_cflags = -O0\n",
             p->log);
    if (fi_write_text(p->config, text) != 0)
        return -1;
    if (setenv("TMPDIR", p->tmp, 1) != 0 ||
        setenv("CUBERT_CONFIG", p->config, 1) != 0)
        return -1;
    unsetenv("CUBERT_TRACE");
    unsetenv("CUBERT_CPU_CFLAGS");
    unsetenv("CUBERT_CPU_THREADS");
    cube_log_set_sink(fi_discard_log, NULL);
    return 0;
}

/* ============================================================ the child */

/* What one child does. */
typedef struct fi_job {
    int count;            /* count the calls instead of failing one */
    const char *warm;     /* the warm cache to copy, or NULL */
    uintptr_t site;       /* the call to fail: site, callers, kind, */
    uintptr_t callers[2]; /* occurrence */
    int kind;
    unsigned occ;
} fi_job;

enum {
    FI_EXIT_OK = 0,
    FI_EXIT_BAD = 1,
    FI_EXIT_SETUP = 2,
    FI_EXIT_NOT_REACHED = 3
};

static int fi_trace_parses(const char *path, fi_outcome *out)
{
    json_error_t jerr;
    json_t *j = json_load_file(path, 0, &jerr);
    if (!j) {
        fi_say(out, "the trace '%s' does not parse: %s (line %d)", path,
               jerr.text, jerr.line);
        return 0;
    }
    json_t *ev = json_object_get(j, "traceEvents");
    int ok = json_is_array(ev) && json_array_size(ev) > 0;
    if (!ok)
        fi_say(out, "the trace '%s' has no events", path);
    json_decref(j);
    return ok;
}

static int fi_child(const fi_job *job, const char *dir, fi_outcome *out)
{
    alarm(FI_CHILD_TIMEOUT);
    fi_paths paths;
    if (fi_child_setup(dir, job->warm, &paths) != 0) {
        fi_say(out, "cannot set up '%s': %s", dir, strerror(errno));
        return FI_EXIT_SETUP;
    }
    int fds0 = fi_count_fds(paths.log);
    fi_scene *sc = calloc(1, sizeof *sc);
    if (!sc)
        return FI_EXIT_SETUP;

    /* The attempt: counting, or failing one call. */
    if (job->count) {
        atomic_store(&fi_mode, FI_COUNT);
    } else {
        fi_target_site = job->site;
        fi_target_callers[0] = job->callers[0];
        fi_target_callers[1] = job->callers[1];
        fi_target_kind = job->kind;
        fi_target_occ = job->occ;
        atomic_store(&fi_mode, FI_INJECT);
    }
    fi_scenario(sc, &paths, 1);
    int bad = 0;
    if (job->count) {
        if (sc->failed || sc->wrong[0] || sc->report_null) {
            char *text = sc->err ? cube_error_format(sc->err) : NULL;
            fi_say(out, "the clean run failed: %s%s",
                   sc->wrong[0] ? sc->wrong : "", text ? text : "");
            free(text);
            bad = 1;
        }
    } else {
        bad = fi_judge(sc, (fi_kind)job->kind, out);
    }
    cube_error_free(sc->err);
    sc->err = NULL;
    if (job->warm && fi_check_cache(job->warm, paths.cache, out) != 0)
        bad = 1;
    int fds1 = fi_count_fds(paths.log);

    /* The same again, nothing injected: it must all work. */
    fi_scenario(sc, &paths, 2);
    if (sc->failed || sc->wrong[0] || sc->report_null) {
        char *text = sc->err ? cube_error_format(sc->err) : NULL;
        fi_say(out, "the retry failed: %s%s%s", sc->wrong,
               sc->wrong[0] && text ? "; " : "", text ? text : "");
        free(text);
        bad = 1;
    } else if (!fi_trace_parses(sc->trace, out)) {
        bad = 1;
    }
    cube_error_free(sc->err);
    free(sc);
    int fds2 = fi_count_fds(paths.log);

    /* Nothing left behind: descriptors, child processes. */
    if (fds1 != fds0 || fds2 != fds0) {
        fi_say(out,
               "descriptors: %d before, %d after the attempt, %d after "
               "the retry",
               fds0, fds1, fds2);
        bad = 1;
    }
    int st;
    if (waitpid(-1, &st, WNOHANG) != -1 || errno != ECHILD) {
        fi_say(out, "a child process was left behind");
        bad = 1;
    }
    if (bad)
        return FI_EXIT_BAD;
    if (!job->count && !out->reached)
        return FI_EXIT_NOT_REACHED;
    return FI_EXIT_OK;
}

/* =========================================================== the parent */

extern const char __executable_start[];

static char fi_root[512];   /* this test's temporary directory */
static char fi_warm[600];   /* the warm cache the children copy */
static int fi_jobs_at_once; /* children at once */
static int fi_verbose;

static int fi_rm_entry(const char *path, const struct stat *st, int flag,
                       struct FTW *ftw)
{
    (void)st;
    (void)ftw;
    return flag == FTW_DP ? rmdir(path) : unlink(path);
}

static void fi_rm_tree(const char *path)
{
    nftw(path, fi_rm_entry, 16, FTW_DEPTH | FTW_PHYS);
}

/* Entries of `dir` ("." and ".." aside), or -1 when it cannot be read. */
static int fi_dir_entries(const char *dir)
{
    DIR *d = opendir(dir);
    if (!d)
        return -1;
    int n = 0;
    struct dirent *ent;
    while ((ent = readdir(d)) != NULL)
        if (strcmp(ent->d_name, ".") && strcmp(ent->d_name, ".."))
            n++;
    closedir(d);
    return n;
}

static void *fi_shared_map(size_t bytes)
{
    void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE,
                   MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    return p == MAP_FAILED ? NULL : p;
}

/* Runs jobs[0, n) in children, fi_jobs_at_once at a time; each child
 * reports in outs[i] (shared memory) and status[i] gets its wait status.
 * `keep_cache`: where the first job's cache is moved before its directory
 * goes. */
static int fi_run_all(const fi_job *jobs, size_t n, fi_outcome *outs,
                      int *status, const char *keep_cache)
{
    enum { FI_MAX_AT_ONCE = 64 };
    pid_t pids[FI_MAX_AT_ONCE];
    size_t which[FI_MAX_AT_ONCE];
    int at_once = fi_jobs_at_once;
    if (at_once > FI_MAX_AT_ONCE)
        at_once = FI_MAX_AT_ONCE;
    for (int s = 0; s < at_once; s++)
        pids[s] = 0;
    size_t next = 0, done = 0;
    fflush(stdout);
    fflush(stderr);
    while (done < n) {
        for (int s = 0; s < at_once && next < n; s++) {
            if (pids[s])
                continue;
            char dir[600];
            snprintf(dir, sizeof dir, "%s/run-%d", fi_root, s);
            if (mkdir(dir, 0700) != 0) {
                fprintf(stderr, "cannot make '%s': %s\n", dir, strerror(errno));
                return -1;
            }
            memset(&outs[next], 0, sizeof outs[next]);
            pid_t pid = fork();
            if (pid < 0) {
                fprintf(stderr, "fork: %s\n", strerror(errno));
                return -1;
            }
            if (pid == 0) {
                int rc = fi_child(&jobs[next], dir, &outs[next]);
                fflush(stdout);
                exit(rc); /* exit, not _exit: LeakSanitizer checks here */
            }
            pids[s] = pid;
            which[s] = next++;
        }
        int st = 0;
        pid_t pid = waitpid(-1, &st, 0);
        if (pid < 0) {
            if (errno == EINTR)
                continue;
            fprintf(stderr, "waitpid: %s\n", strerror(errno));
            return -1;
        }
        for (int s = 0; s < at_once; s++) {
            if (pids[s] != pid)
                continue;
            size_t i = which[s];
            status[i] = st;
            char dir[600], tmp[700];
            snprintf(dir, sizeof dir, "%s/run-%d", fi_root, s);
            snprintf(tmp, sizeof tmp, "%s/tmp", dir);
            int left = fi_dir_entries(tmp);
            if (left > 0 && WIFEXITED(st) && WEXITSTATUS(st) != FI_EXIT_SETUP) {
                fi_say(&outs[i], "%d temporary file(s) left in '%s'", left,
                       tmp);
                status[i] = FI_EXIT_BAD << 8; /* as exit(FI_EXIT_BAD) */
            }
            if (keep_cache && i == 0) {
                char cache[700];
                snprintf(cache, sizeof cache, "%s/cache", dir);
                if (rename(cache, keep_cache) != 0)
                    fprintf(stderr, "cannot keep the cache '%s': %s\n", cache,
                            strerror(errno));
            }
            fi_rm_tree(dir);
            pids[s] = 0;
            done++;
        }
    }
    return 0;
}

/* The counted calls of one clean run. */
typedef struct fi_count {
    fi_call *calls;
    size_t n;
    double seconds; /* the child's wall time */
} fi_count;

static double fi_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static int fi_status_ok(int st)
{
    return WIFEXITED(st) && WEXITSTATUS(st) == FI_EXIT_OK;
}

static void fi_describe_status(int st, char *buf, size_t size)
{
    if (WIFSIGNALED(st) && WTERMSIG(st) == SIGALRM)
        snprintf(buf, size, "hung (no end within %d s)", FI_CHILD_TIMEOUT);
    else if (WIFSIGNALED(st) && WTERMSIG(st) == SIGABRT)
        snprintf(buf, size,
                 "aborted (a sanitizer's report, if any, is "
                 "above)");
    else if (WIFSIGNALED(st))
        snprintf(buf, size, "crashed: signal %d (%s)", WTERMSIG(st),
                 strsignal(WTERMSIG(st)));
    else if (WIFEXITED(st) && WEXITSTATUS(st) == 23)
        snprintf(buf, size, "leaked (LeakSanitizer's report is above)");
    else if (WIFEXITED(st) && WEXITSTATUS(st) == FI_EXIT_SETUP)
        snprintf(buf, size, "could not be set up");
    else if (WIFEXITED(st) && WEXITSTATUS(st) == FI_EXIT_BAD)
        snprintf(buf, size, "misbehaved");
    else if (WIFEXITED(st) && WEXITSTATUS(st) == FI_EXIT_NOT_REACHED)
        snprintf(buf, size, "did not reach the call");
    else
        snprintf(buf, size, "exited with status %d", WEXITSTATUS(st));
}

/* Counts the calls of a clean scenario (cache warm or cold). */
static int fi_count_calls(const char *warm, const char *keep, fi_count *out)
{
    memset(out, 0, sizeof *out);
    atomic_store(&fi_sh->ncalls, 0);
    atomic_store(&fi_sh->dropped, 0);
    fi_job job = {.count = 1, .warm = warm};
    fi_outcome *o = fi_shared_map(sizeof *o);
    if (!o)
        return -1;
    int st = 0;
    double t0 = fi_now();
    int rc = fi_run_all(&job, 1, o, &st, keep);
    out->seconds = fi_now() - t0;
    if (rc == 0 && !fi_status_ok(st)) {
        char how[128];
        fi_describe_status(st, how, sizeof how);
        fprintf(stderr, "the clean scenario (%s cache) %s: %s\n",
                warm ? "warm" : "cold", how, o->msg);
        rc = -1;
    }
    munmap(o, sizeof *o);
    if (rc != 0)
        return -1;
    if (atomic_load(&fi_sh->dropped)) {
        fprintf(stderr, "more than %u calls: raise FI_MAX_CALLS\n",
                FI_MAX_CALLS);
        return -1;
    }
    out->n = atomic_load(&fi_sh->ncalls);
    out->calls = malloc((out->n ? out->n : 1) * sizeof *out->calls);
    if (!out->calls)
        return -1;
    memcpy(out->calls, fi_sh->calls, out->n * sizeof *out->calls);
    return 0;
}

/* Distinct call sites (site and kind) and how often each was called. */
typedef struct fi_sites {
    struct {
        uintptr_t site, callers[2];
        int kind;
        unsigned count;
    } * at;
    size_t n;
} fi_sites;

static size_t fi_site_find(const fi_sites *s, const fi_call *call)
{
    for (size_t i = 0; i < s->n; i++)
        if (s->at[i].site == call->site && s->at[i].kind == call->kind &&
            s->at[i].callers[0] == call->callers[0] &&
            s->at[i].callers[1] == call->callers[1])
            return i;
    return (size_t)-1;
}

/* The sites of `c`, and each call's occurrence at its site (1-based). */
static int fi_sites_of(const fi_count *c, fi_sites *s, unsigned *occ)
{
    s->n = 0;
    s->at = calloc(c->n ? c->n : 1, sizeof *s->at);
    if (!s->at)
        return -1;
    for (size_t i = 0; i < c->n; i++) {
        size_t k = fi_site_find(s, &c->calls[i]);
        if (k == (size_t)-1) {
            k = s->n++;
            s->at[k].site = c->calls[i].site;
            s->at[k].callers[0] = c->calls[i].callers[0];
            s->at[k].callers[1] = c->calls[i].callers[1];
            s->at[k].kind = c->calls[i].kind;
        }
        occ[i] = ++s->at[k].count;
    }
    return 0;
}

/* Whether the call `occ` at `site` was made in the run of `skip` too
 * (it made at least that many calls there). */
static bool fi_covered(const fi_sites *skip, const fi_call *call, unsigned occ)
{
    if (!skip)
        return false;
    size_t k = fi_site_find(skip, call);
    return k != (size_t)-1 && skip->at[k].count >= occ;
}

/* The jobs for the calls of `c` that the run of `skip` (may be NULL) did
 * not make: every one when they are at most `budget`, else the first one
 * of every site and an even sample of the others. */
static size_t fi_plan(const fi_count *c, const fi_sites *skip, size_t budget,
                      const char *warm, fi_job *jobs, size_t *eligible)
{
    size_t cap = c->n ? c->n : 1;
    unsigned *occ = calloc(cap, sizeof *occ);
    char *pick = calloc(cap, 1), *first = calloc(cap, 1);
    char *site_seen = calloc(cap, 1);
    fi_sites s = {0};
    size_t n_pick = 0;
    *eligible = 0;
    if (!occ || !pick || !first || !site_seen || fi_sites_of(c, &s, occ) != 0)
        goto out;
    size_t n_eligible = 0, n_first = 0;
    for (size_t i = 0; i < c->n; i++) {
        if (fi_covered(skip, &c->calls[i], occ[i]))
            continue;
        n_eligible++;
        size_t k = fi_site_find(&s, &c->calls[i]);
        if (!site_seen[k]) {
            site_seen[k] = 1;
            first[i] = pick[i] = 1;
            n_first++;
        }
    }
    size_t rest = n_eligible - n_first;
    size_t room = budget > n_first ? budget - n_first : 0;
    /* Every k-th of the others, k chosen to fit the room. */
    size_t every = room >= rest ? 1 : room ? (rest + room - 1) / room : 0;
    size_t seen = 0;
    for (size_t i = 0; i < c->n; i++) {
        if (first[i] || fi_covered(skip, &c->calls[i], occ[i]))
            continue;
        if (every && seen++ % every == 0)
            pick[i] = 1;
    }
    for (size_t i = 0; i < c->n; i++)
        if (pick[i])
            jobs[n_pick++] = (fi_job){
                .warm = warm,
                .site = c->calls[i].site,
                .callers = {c->calls[i].callers[0], c->calls[i].callers[1]},
                .kind = c->calls[i].kind,
                .occ = occ[i]};
    *eligible = n_eligible;
out:
    free(site_seen);
    free(first);
    free(pick);
    free(occ);
    free(s.at);
    return n_pick;
}

/* The figures of one set of runs. */
typedef struct fi_tally {
    unsigned tried[FI_KINDS]; /* failed in turn */
    unsigned reported[FI_KINDS];
    unsigned absorbed[FI_KINDS];
    unsigned missed[FI_KINDS]; /* not reached */
    unsigned bad[FI_KINDS];
    /* Codes answered, per API call and group. */
    unsigned codes[API_COUNT][FI_GROUPS][CUBE_CODE_LAST + 1];
} fi_tally;

static fi_tally fi_total;

/* The sites of a call, for a person: an offset addr2line takes. */
static uintptr_t fi_offset(uintptr_t site)
{
    return site - (uintptr_t)__executable_start;
}

/* Where a job's call is: the site and its two callers, as offsets in
 * this executable ("addr2line -f -i -e test_fault_injection OFFSET"). */
static const char *fi_where(const fi_job *job, char *buf, size_t size)
{
    snprintf(buf, size, "+0x%" PRIxPTR " < +0x%" PRIxPTR " < +0x%" PRIxPTR,
             fi_offset(job->site), fi_offset(job->callers[0]),
             fi_offset(job->callers[1]));
    return buf;
}

static const char *fi_api_name(int api)
{
    return api >= 0 && api < API_COUNT ? fi_apis[api].function : "(none)";
}

/* Runs the planned jobs and adds up what came back. Returns the number
 * of runs that misbehaved. */
static unsigned fi_sweep(const char *title, const fi_job *jobs, size_t n,
                         size_t eligible)
{
    fi_outcome *outs = fi_shared_map((n ? n : 1) * sizeof *outs);
    int *status = calloc(n ? n : 1, sizeof *status);
    if (!outs || !status) {
        fprintf(stderr, "%s: out of memory\n", title);
        free(status);
        return 1;
    }
    double t0 = fi_now();
    if (fi_run_all(jobs, n, outs, status, NULL) != 0) {
        munmap(outs, (n ? n : 1) * sizeof *outs);
        free(status);
        return 1;
    }
    double seconds = fi_now() - t0;
    fi_tally t;
    memset(&t, 0, sizeof t);
    unsigned bad = 0, missed = 0;
    for (size_t i = 0; i < n; i++) {
        int k = jobs[i].kind;
        const fi_outcome *o = &outs[i];
        t.tried[k]++;
        int st = status[i];
        char where[96];
        fi_where(&jobs[i], where, sizeof where);
        if (WIFEXITED(st) && WEXITSTATUS(st) == FI_EXIT_NOT_REACHED) {
            t.missed[k]++;
            missed++;
            if (fi_verbose)
                printf("  not reached: %s at %s, call %u there\n",
                       fi_kinds[k].name, where, jobs[i].occ);
            continue;
        }
        if (!fi_status_ok(st)) {
            char how[128];
            fi_describe_status(st, how, sizeof how);
            printf("FAIL %s: %s failed at %s (call %u there) in %s: the run "
                   "%s%s%s\n",
                   title, fi_kinds[k].name, where, jobs[i].occ,
                   fi_api_name(o->api), how, o->msg[0] ? ": " : "", o->msg);
            t.bad[k]++;
            bad++;
            continue;
        }
        if (o->answered >= 0) {
            t.reported[k]++;
            int code = o->code;
            if (code >= 0 && code <= CUBE_CODE_LAST)
                t.codes[o->answered][fi_kinds[k].group][code]++;
        } else {
            t.absorbed[k]++;
        }
        if (fi_verbose)
            printf("  ok: %s at %s, call %u there, in %s: %s%s%s\n",
                   fi_kinds[k].name, where, jobs[i].occ, fi_api_name(o->api),
                   o->answered >= 0 ? fi_api_name(o->answered) : "absorbed",
                   o->answered >= 0 ? " answered " : "",
                   o->answered >= 0 ? cube_code_name((cube_code)o->code) : "");
    }
    printf("%s: %zu calls eligible, %zu failed in turn (%u not reached), "
           "%u misbehaved, in %.1f s\n",
           title, eligible, n, missed, bad, seconds);
    for (int k = 0; k < FI_KINDS; k++) {
        fi_total.tried[k] += t.tried[k];
        fi_total.reported[k] += t.reported[k];
        fi_total.absorbed[k] += t.absorbed[k];
        fi_total.missed[k] += t.missed[k];
        fi_total.bad[k] += t.bad[k];
    }
    for (int a = 0; a < API_COUNT; a++)
        for (int g = 0; g < FI_GROUPS; g++)
            for (int code = 0; code <= CUBE_CODE_LAST; code++)
                fi_total.codes[a][g][code] += t.codes[a][g][code];
    munmap(outs, (n ? n : 1) * sizeof *outs);
    free(status);
    return bad;
}

/* ---------------------------------------------------- the headers' lists */

static char *fi_read_file(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    size_t cap = 1 << 16, len = 0;
    char *text = malloc(cap);
    while (text) {
        size_t got = fread(text + len, 1, cap - len - 1, f);
        len += got;
        if (len + 1 < cap)
            break;
        char *grown = realloc(text, cap * 2);
        if (!grown) {
            free(text);
            text = NULL;
            break;
        }
        text = grown;
        cap *= 2;
    }
    fclose(f);
    if (text)
        text[len] = '\0';
    return text;
}

/* The codes (bits) named in the block comment right above the CUBE_API
 * declaration of `function` in `text`; *found says whether there is
 * one. */
static unsigned fi_codes_in_doc(const char *text, const char *function,
                                int *found)
{
    *found = 0;
    char call[128];
    snprintf(call, sizeof call, "%s(", function);
    const char *decl = NULL;
    for (const char *p = strstr(text, call); p && !decl;
         p = strstr(p + 1, call)) {
        char before = p > text ? p[-1] : '\n';
        if (before != ' ' && before != '*' && before != '\n')
            continue;
        const char *api = NULL;
        for (const char *q = p; q > text; q--)
            if (strncmp(q, "CUBE_API", 8) == 0) {
                api = q;
                break;
            }
        if (api && !memchr(api, ';', (size_t)(p - api)) &&
            !memchr(api, '{', (size_t)(p - api)))
            decl = api;
    }
    if (!decl)
        return 0;
    /* Back over the blank space between the comment and the declaration. */
    size_t at = (size_t)(decl - text);
    while (at > 0 && (text[at - 1] == ' ' || text[at - 1] == '\n'))
        at--;
    if (at < 2 || strncmp(text + at - 2, "*/", 2) != 0)
        return 0;
    const char *end = text + at;
    *found = 1;
    const char *start = end - 2;
    while (start > text && strncmp(start, "/*", 2) != 0)
        start--;
    unsigned codes = 0;
    for (int code = 1; code <= CUBE_CODE_LAST; code++) {
        /* cube_code_name gives "out of memory"; the comment spells the
         * enumerator. */
        static const char *const spell[] = {
            "",
            "CUBE_ERR_INVALID_ARGUMENT",
            "CUBE_ERR_NOT_FOUND",
            "CUBE_ERR_OUT_OF_MEMORY",
            "CUBE_ERR_BUFFER_TOO_BIG",
            "CUBE_ERR_POOL_CAPACITY_EXCEEDED",
            "CUBE_ERR_COMPILE",
            "CUBE_ERR_RESOURCE_LIMIT",
            "CUBE_ERR_UNSUPPORTED",
            "CUBE_ERR_GRAPH_STATE",
            "CUBE_ERR_DEVICE_FAULT",
            "CUBE_ERR_SEVERAL",
            "CUBE_ERR_IO",
            "CUBE_ERR_UNAVAILABLE",
            "CUBE_ERR_INTERNAL",
            "CUBE_ERR_STORAGE_MAPPING_FAILED",
            "CUBE_ERR_PROFILE",
            "CUBE_ERR_POOLS_IN_USE",
            "CUBE_ERR_STREAM_UNAVAILABLE",
            "CUBE_ERR_TIMEOUT",
            "CUBE_ERR_ABORTED",
        };
        size_t len = strlen(spell[code]);
        for (const char *p = start; p && p < end; p++) {
            p = strstr(p, spell[code]);
            if (!p || p >= end)
                break;
            /* Whole words: CUBE_ERR_IO is not CUBE_ERR_IOx. */
            char after = p[len];
            if (!(after == '_' || (after >= 'A' && after <= 'Z'))) {
                codes |= FI_BIT(code);
                break;
            }
        }
    }
    return codes;
}

static int fi_read_docs(void)
{
    for (int a = 0; a < API_COUNT; a++) {
        if (!fi_apis[a].header)
            continue;
        char path[1024];
        snprintf(path, sizeof path, "%s/include/cubert/%s", CUBE_SOURCE_DIR,
                 fi_apis[a].header);
        char *text = fi_read_file(path);
        if (!text) {
            fprintf(stderr, "cannot read '%s'\n", path);
            return -1;
        }
        int found = 0, found_also = 0;
        fi_documented[a] = fi_codes_in_doc(text, fi_apis[a].function, &found);
        if (fi_apis[a].also && fi_apis[a].also_header) {
            free(text);
            snprintf(path, sizeof path, "%s/include/cubert/%s", CUBE_SOURCE_DIR,
                     fi_apis[a].also_header);
            if (!(text = fi_read_file(path))) {
                fprintf(stderr, "cannot read '%s'\n", path);
                return -1;
            }
        }
        if (fi_apis[a].also)
            fi_documented[a] |=
                fi_codes_in_doc(text, fi_apis[a].also, &found_also);
        free(text);
        if (!found && !found_also) {
            fprintf(stderr, "%s: no comment found above %s\n", path,
                    fi_apis[a].function);
            return -1;
        }
    }
    return 0;
}

/* ------------------------------------------------------------ the summary */

static void fi_count_kinds(const fi_count *c, const fi_sites *skip,
                           unsigned *per_kind, unsigned *on_workers)
{
    unsigned *occ = calloc(c->n ? c->n : 1, sizeof *occ);
    fi_sites s = {0};
    if (occ && fi_sites_of(c, &s, occ) == 0)
        for (size_t i = 0; i < c->n; i++) {
            if (fi_covered(skip, &c->calls[i], occ[i]))
                continue;
            per_kind[c->calls[i].kind]++;
            if (c->calls[i].on_worker)
                (*on_workers)++;
        }
    free(s.at);
    free(occ);
}

static void fi_summary(const fi_count *warm, const fi_count *cold,
                       const fi_sites *warm_sites)
{
    unsigned cw[FI_KINDS] = {0}, cc[FI_KINDS] = {0}, ww = 0, wc = 0;
    fi_count_kinds(warm, NULL, cw, &ww);
    fi_count_kinds(cold, warm_sites, cc, &wc);
    enum { COLS = 8 };
    printf("\n%-28s %7s %9s %7s %7s %9s %9s %7s %6s\n", "call", "counted",
           "cold-only", "failed", "passed", "reported", "absorbed", "missed",
           "bad");
    unsigned sum[COLS] = {0};
    for (int k = 0; k < FI_KINDS; k++) {
        unsigned row[COLS] = {cw[k],
                              cc[k],
                              fi_total.tried[k],
                              fi_total.reported[k] + fi_total.absorbed[k],
                              fi_total.reported[k],
                              fi_total.absorbed[k],
                              fi_total.missed[k],
                              fi_total.bad[k]};
        printf("%-28s %7u %9u %7u %7u %9u %9u %7u %6u\n", fi_kinds[k].name,
               row[0], row[1], row[2], row[3], row[4], row[5], row[6], row[7]);
        for (int j = 0; j < COLS; j++)
            sum[j] += row[j];
    }
    printf("%-28s %7u %9u %7u %7u %9u %9u %7u %6u\n", "all", sum[0], sum[1],
           sum[2], sum[3], sum[4], sum[5], sum[6], sum[7]);
    printf("counted: the calls of one run with a warm cache (%u on the worker "
           "thread); cold-only: the further calls of one with a cold cache "
           "(%u on the worker thread); failed: runs failing one of them; "
           "passed: runs where an API call answered the failure (reported) "
           "or the library got by without it (absorbed), all results right; "
           "missed: the call was not made in that run; bad: runs that "
           "misbehaved\n",
           ww, wc);
    printf("\nanswers, by API call and what failed:\n");
    for (int a = 0; a < API_COUNT; a++)
        for (int g = 0; g < FI_GROUPS; g++) {
            char line[512] = "";
            size_t len = 0;
            for (int code = 0; code <= CUBE_CODE_LAST; code++) {
                if (!fi_total.codes[a][g][code] || len >= sizeof line)
                    continue;
                int n = snprintf(line + len, sizeof line - len, " %s x%u",
                                 cube_code_name((cube_code)code),
                                 fi_total.codes[a][g][code]);
                if (n > 0)
                    len += (size_t)n;
            }
            if (len)
                printf("  %-26s %-14s%s\n", fi_apis[a].function,
                       fi_group_names[g], line);
        }
}

/* ------------------------------------------------------------------ main */

static size_t fi_env_size(const char *name, size_t fallback)
{
    const char *v = getenv(name);
    if (!v || !*v)
        return fallback;
    char *end;
    unsigned long long n = strtoull(v, &end, 10);
    return *end ? fallback : (size_t)n;
}

int main(void)
{
    setvbuf(stdout, NULL, _IOLBF, 0);
    double t_start = fi_now();
    fi_verbose = (int)fi_env_size("CUBE_FI_VERBOSE", 0);
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    fi_jobs_at_once =
        (int)fi_env_size("CUBE_FI_JOBS", cores > 0 ? (size_t)cores : 1);
    if (fi_jobs_at_once < 1)
        fi_jobs_at_once = 1;
    if (fi_jobs_at_once > 8)
        fi_jobs_at_once = 8;
    int all = (int)fi_env_size("CUBE_FI_ALL", 0);
#if defined(FI_TSAN)
    /* Every site once: each run is several times slower under TSan. */
    size_t budget = all ? (size_t)-1 : 0;
    const char *build = "TSan";
#elif defined(FI_ASAN)
    size_t budget = all ? (size_t)-1 : 400;
    const char *build = "ASan+UBSan";
#else
    size_t budget = all ? (size_t)-1 : 1500;
    const char *build = "plain";
#endif

    /* CUBE_FI_BUDGET=n: at most n runs per set (0: each site once).
     * `make test` gives the plain build 0, since its ASan build then fails
     * every call (CUBE_FI_ALL) with the same checks and LeakSanitizer's
     * besides. */
    if (!all)
        budget = fi_env_size("CUBE_FI_BUDGET", budget);

    if (fi_read_docs() != 0)
        return 1;
    /* backtrace loads the unwinder on first use: here, not in a child. */
    void *frames[4];
    (void)backtrace(frames, 4);
    const char *tmp = getenv("TMPDIR");
    snprintf(fi_root, sizeof fi_root, "%s/cubert-fi-XXXXXX",
             tmp && tmp[0] == '/' ? tmp : "/tmp");
    if (!mkdtemp(fi_root)) {
        fprintf(stderr, "mkdtemp: %s\n", strerror(errno));
        return 1;
    }
    snprintf(fi_warm, sizeof fi_warm, "%s/warm-cache", fi_root);
    fi_sh = fi_shared_map(sizeof *fi_sh);
    if (!fi_sh)
        return 1;

    int failed = 0;
    fi_count cold = {0}, warm = {0}, warm2 = {0};
    fi_sites warm_sites = {0};
    fi_job *jobs = NULL;
    /* The clean runs: cold (which fills the warm cache), then warm twice,
     * to say whether the calls come in a fixed order (the worker thread's
     * need not: a call is named by its site and occurrence there, not by
     * its place in the run; one a run does not make is "missed"). */
    if (fi_count_calls(NULL, fi_warm, &cold) != 0 ||
        fi_count_calls(fi_warm, NULL, &warm) != 0 ||
        fi_count_calls(fi_warm, NULL, &warm2) != 0) {
        failed = 1;
        goto out;
    }
    size_t differ = warm.n == warm2.n ? 0 : 1;
    for (size_t i = 0; !differ && i < warm.n; i++)
        differ = warm.calls[i].site != warm2.calls[i].site ||
                 warm.calls[i].callers[0] != warm2.calls[i].callers[0] ||
                 warm.calls[i].kind != warm2.calls[i].kind;
    printf("fault injection, %s build, %d children at once\n", build,
           fi_jobs_at_once);
    printf("clean runs: cold cache %zu calls in %.2f s; warm cache %zu "
           "calls in %.2f s (again: %zu calls%s)\n",
           cold.n, cold.seconds, warm.n, warm.seconds, warm2.n,
           differ ? ", in another order" : ", the same");

    /* Every wrapper must have seen calls: one that saw none means the
     * library reaches that function under another name (open64, a
     * fortified __open_2) and the sweep would miss it without a word. */
    for (int k = 0; k < FI_KINDS; k++) {
        size_t seen = 0;
        for (size_t i = 0; i < cold.n; i++)
            seen += cold.calls[i].kind == k;
        if (!seen) {
            printf("FAIL: no call of %s reached its wrapper; does the library "
                   "call it under another name? (tests/CMakeLists.txt lists "
                   "the wrapped names)\n",
                   fi_kinds[k].name);
            failed = 1;
        }
    }

    unsigned *occ = calloc(warm.n ? warm.n : 1, sizeof *occ);
    if (!occ || fi_sites_of(&warm, &warm_sites, occ) != 0) {
        free(occ);
        failed = 1;
        goto out;
    }
    free(occ);
    size_t most = warm.n > cold.n ? warm.n : cold.n;
    jobs = calloc(most ? most : 1, sizeof *jobs);
    if (!jobs) {
        failed = 1;
        goto out;
    }
    size_t eligible = 0;
    size_t n = fi_plan(&warm, NULL, budget, fi_warm, jobs, &eligible);
    if (fi_sweep("warm cache", jobs, n, eligible))
        failed = 1;
    n = fi_plan(&cold, &warm_sites, budget, NULL, jobs, &eligible);
    if (fi_sweep("cold cache (the further calls)", jobs, n, eligible))
        failed = 1;
    fi_summary(&warm, &cold, &warm_sites);
    printf("\n%s in %.1f s\n", failed ? "FAILED" : "passed",
           fi_now() - t_start);
out:
    free(jobs);
    free(warm_sites.at);
    free(cold.calls);
    free(warm.calls);
    free(warm2.calls);
    munmap(fi_sh, sizeof *fi_sh);
    fi_rm_tree(fi_root);
    return failed;
}
