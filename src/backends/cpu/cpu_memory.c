/* Per-stream memory managers over aligned host memory (cpu_memory.h). */
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "backends/cpu/cpu_memory.h"
#include "cubert/backend/errors.h"

typedef struct stream_memory {
    cube_stream_id stream;
    mem_manager *manager;
} stream_memory;

struct cpu_memory {
    uint64_t serial; /* process-unique: keys the per-thread cache */
    mem_device dev;
    pthread_mutex_t lock;
    cube_memory_layout layout; /* what new streams are built with */
    int has_layout;            /* 0: the manager's default preset */
    stream_memory *streams;
    size_t count, cap;
};

static cube_error *host_alloc(void *self, uint64_t size, uint64_t align,
                              uint64_t *address)
{
    (void)self;
    uint64_t rounded = (size + align - 1) & ~(align - 1);
    if (rounded < size || rounded > SIZE_MAX)
        return cube_error_new(CUBE_ERR_OUT_OF_MEMORY,
                              "%llu bytes do not fit the address space",
                              (unsigned long long)size);
    void *p = aligned_alloc((size_t)align, (size_t)rounded);
    if (!p)
        return cube_error_new(CUBE_ERR_OUT_OF_MEMORY,
                              "the host refused %llu bytes",
                              (unsigned long long)size);
    *address = (uint64_t)(uintptr_t)p;
    return NULL;
}

static void host_free(void *self, uint64_t address, uint64_t size)
{
    (void)self;
    (void)size;
    free((void *)(uintptr_t)address);
}

cube_error *cpu_memory_create(const mem_device *dev, cpu_memory **out)
{
    *out = NULL;
    cpu_memory *mem = calloc(1, sizeof *mem);
    if (!mem)
        return cube_error_new(CUBE_ERR_OUT_OF_MEMORY, "cpu memory");
    static atomic_uint_fast64_t next_serial = 1;
    mem->serial = atomic_fetch_add(&next_serial, 1);
    mem->dev = *dev;
    pthread_mutex_init(&mem->lock, NULL);
    *out = mem;
    return NULL;
}

void cpu_memory_destroy(cpu_memory *mem)
{
    if (!mem)
        return;
    for (size_t i = 0; i < mem->count; i++)
        mem_manager_destroy(mem->streams[i].manager);
    free(mem->streams);
    pthread_mutex_destroy(&mem->lock);
    free(mem);
}

/* Under mem->lock. */
static cube_error *find_locked(cpu_memory *mem, cube_stream_id stream,
                               int create, mem_manager **out)
{
    for (size_t i = 0; i < mem->count; i++) {
        if (mem->streams[i].stream == stream) {
            *out = mem->streams[i].manager;
            return NULL;
        }
    }
    *out = NULL;
    if (!create)
        return NULL;
    if (mem->count == mem->cap) {
        size_t cap = mem->cap ? mem->cap * 2 : 8;
        stream_memory *grown = realloc(mem->streams, cap * sizeof *grown);
        if (!grown)
            return cube_error_new(CUBE_ERR_OUT_OF_MEMORY, "cpu memory");
        mem->streams = grown;
        mem->cap = cap;
    }
    mem_storage_ops ops = {mem, host_alloc, host_free};
    mem_manager *m = NULL;
    cube_error *err = mem_manager_create(
        &ops, &mem->dev, mem->has_layout ? &mem->layout : NULL, &m);
    if (err)
        return err;
    mem->streams[mem->count].stream = stream;
    mem->streams[mem->count].manager = m;
    mem->count++;
    *out = m;
    return NULL;
}

/* The manager a thread used last: managers live as long as their
 * cpu_memory and serials are never reused, so a hit needs no lock. */
static _Thread_local struct {
    // cppcheck-suppress unusedStructMember
    uint64_t serial; /* (cppcheck does not follow _Thread_local) */
    // cppcheck-suppress unusedStructMember
    cube_stream_id stream;
    // cppcheck-suppress unusedStructMember
    mem_manager *manager;
} last;

cube_error *cpu_memory_stream(cpu_memory *mem, cube_stream_id stream,
                              int create, mem_manager **out)
{
    if (last.serial == mem->serial && last.stream == stream) {
        *out = last.manager;
        return NULL;
    }
    pthread_mutex_lock(&mem->lock);
    cube_error *err = find_locked(mem, stream, create, out);
    pthread_mutex_unlock(&mem->lock);
    if (!err && *out) {
        last.serial = mem->serial;
        last.stream = stream;
        last.manager = *out;
    }
    return err;
}

cube_error *cpu_memory_install(cpu_memory *mem, cube_stream_id stream,
                               const cube_memory_layout *layout)
{
    pthread_mutex_lock(&mem->lock);
    mem_manager *m = NULL;
    cube_error *err = find_locked(mem, stream, 0, &m);
    /* New streams take the layout whatever happens to this one. */
    mem->layout = *layout;
    mem->has_layout = 1;
    if (!err && !m) {
        /* The calling stream gets its pools now, with this layout, so a
         * later install from another stream cannot change them. */
        err = find_locked(mem, stream, 1, &m);
        pthread_mutex_unlock(&mem->lock);
        return err;
    }
    pthread_mutex_unlock(&mem->lock);
    return err ? err : mem_install(m, layout);
}

cube_error *cpu_memory_persistent(cpu_memory *mem, cube_stream_id stream,
                                  int persistent)
{
    mem_manager *m = NULL;
    cube_error *err = cpu_memory_stream(mem, stream, 1, &m);
    if (!err)
        mem_set_persistent(m, persistent);
    return err;
}
