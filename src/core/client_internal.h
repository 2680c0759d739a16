/* The client's internals, shared by the files of src/core. */
#ifndef CUBE_CORE_CLIENT_INTERNAL_H
#define CUBE_CORE_CLIENT_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>

#include "cubert/backend/errors.h"
#include "cubert/backend/server.h"
#include "cubert/cubert.h"

/* An allocation: device memory plus its failure record. Reference counted
 * by the handles (and in-flight operations) that name it. */
typedef struct core_alloc {
    uint32_t refs; /* under handles_lock */
    cube_storage storage;
    cube_stream_id stream; /* the stream whose memory it came from */
    cube_error *failure;   /* under failure_lock; NULL when trusted */
} core_alloc;

/* A handle's slot in the table. */
typedef struct core_slot {
    uint32_t gen;
    uint32_t refs; /* 0: free */
    core_alloc *alloc;
    uint64_t offset, size;
    uint32_t next_free;
} core_slot;

/* A resolved handle, holding a reference on its allocation until
 * core_resolved_drop. */
typedef struct core_resolved {
    cube_handle handle;
    core_alloc *alloc;
    uint64_t offset, size;
} core_resolved;

typedef struct core_stream {
    cube_stream_id id;
    pthread_mutex_t lock; /* serializes the backend calls of this stream */
} core_stream;

typedef struct core_cache_entry {
    uint64_t key;
    const cube_kernel *kernel; /* retained, to tell collisions apart */
    uint32_t mode;
    cube_compiled compiled;
    struct core_cache_entry *next;
} core_cache_entry;

#define CORE_CACHE_BUCKETS 256
#define CORE_CHUNK_SLOTS 4096u

struct cube_client {
    cube_server *server;
    const cube_server_vtable *vt;
    uint64_t serial; /* process-unique */
    uint32_t tag;    /* 12 bits in every handle of this client */
    cube_properties props;
    char device[48];

    pthread_mutex_t handles_lock;
    core_slot **chunks;
    uint32_t chunk_count, chunk_cap;
    uint32_t slot_count;           /* slots ever used */
    uint32_t free_head, free_tail; /* FIFO of free slots, UINT32_MAX: none */

    pthread_mutex_t failure_lock;
    atomic_int faulted;
    cube_error *fault; /* under failure_lock */

    pthread_mutex_t streams_lock;
    core_stream **streams;
    size_t stream_count, stream_cap;

    pthread_mutex_t cache_lock;
    core_cache_entry *cache[CORE_CACHE_BUCKETS];

    pthread_mutex_t staging_lock;
    void **staging;
    size_t staging_count, staging_cap;
};

/* --- handles.c --- */
void core_handles_init(cube_client *c);
void core_handles_destroy(cube_client *c);
/* Resolves and pins `h`. Errors: CUBE_ERR_NOT_FOUND (message names `what`). */
cube_error *core_resolve(cube_client *c, cube_handle h, const char *what,
                         core_resolved *out);
void core_resolved_drop(cube_client *c, core_resolved *r);
cube_binding core_binding(const core_resolved *r);

/* --- failure.c --- */
void core_failure_record(cube_client *c, core_alloc *a, const cube_error *err);
void core_failure_clear(cube_client *c, core_alloc *a);
/* A copy of the allocation's failure, or NULL when it is trusted. */
cube_error *core_failure_get(cube_client *c, core_alloc *a);
/* CUBE_ERR_SEVERAL naming each failed buffer among `r`, or NULL. */
cube_error *core_failure_claim_check(cube_client *c, const core_resolved *r,
                                     size_t n, const char *operation);
/* A copy of the device fault, or NULL. */
cube_error *core_fault_get(cube_client *c);
/* Makes `err` the client's terminal fault when it is a device fault. */
void core_fault_note(cube_client *c, const cube_error *err);

/* --- streams (client.c) --- */
/* The calling thread's stream, locked. Errors: CUBE_ERR_OUT_OF_MEMORY. */
cube_error *core_stream_enter(cube_client *c, core_stream **out);
void core_stream_leave(core_stream *s);

/* --- launch.c --- */
void core_cache_destroy(cube_client *c);

/* --- transfer.c --- */
void core_staging_destroy(cube_client *c);

/* --- config.c --- */
typedef struct core_config {
    uint32_t cpu_threads;
    char cache_dir[1024]; /* "" with cache_dir_set: disabled */
    int cache_dir_set;
    char device[64];
} core_config;
/* Reads CUBERT_* once (first call) and applies the log settings. */
const core_config *core_config_get(void);

/* --- registry.c --- */
const cube_backend *core_backend_find(const char *name);
const cube_backend *const *core_backends(void);

#define CORE_CHECK_CLIENT(c, fn)                                               \
    do {                                                                       \
        if (!(c))                                                              \
            return cube_error_new(CUBE_ERR_INVALID_ARGUMENT,                   \
                                  fn ": client is NULL");                      \
        if (atomic_load_explicit(&(c)->faulted, memory_order_acquire))         \
            return core_fault_get(c);                                          \
    } while (0)

#endif /* CUBE_CORE_CLIENT_INTERNAL_H */
