/* Size-class caching memory manager (see memory_manager.h). */
#include <pthread.h>
#include <stdlib.h>

#include "cubert/backend/errors.h"
#include "cubert/log.h"
#include "memory/memory_manager.h"

/* Requests above this get an exact size and are not cached by class: big
 * buffers are rare and padding them by up to 25% would waste the most. */
#define MEM_LARGE_THRESHOLD (256ull << 20)
#define MEM_CLASS_COUNT 256

typedef struct mem_block {
    uint64_t address;
    uint64_t size;      /* bytes reserved from the storage */
    uint64_t requested; /* bytes asked for (while live) */
    int cls;            /* class index, -1 for large */
    struct mem_block *next;
} mem_block;

struct mem_manager {
    mem_storage_ops ops;
    uint64_t alignment;
    uint64_t max_buffer;
    pthread_mutex_t lock;
    mem_block *free_lists[MEM_CLASS_COUNT];
    mem_block *spare_records; /* block records to reuse */
    uint64_t live_buffers, live_requested, live_reserved, cached_reserved;
};

static unsigned floor_log2(uint64_t v)
{
    return 63u - (unsigned)__builtin_clzll(v);
}

/* Classes: below 4 * alignment, multiples of the alignment; above, four
 * steps per power of two. */
static int class_index(uint64_t size, uint64_t alignment, uint64_t *class_size)
{
    uint64_t a = alignment;
    uint64_t rounded = (size + a - 1) & ~(a - 1);
    if (rounded <= 4 * a) {
        *class_size = rounded;
        return (int)(rounded / a) - 1; /* 0..3 */
    }
    unsigned p = floor_log2(rounded - 1); /* 2^p < rounded <= 2^(p+1) */
    uint64_t step = (1ull << p) / 4;
    uint64_t k = (rounded - (1ull << p) + step - 1) / step; /* 1..4 */
    *class_size = (1ull << p) + k * step;
    unsigned base = floor_log2(4 * a); /* first p with four steps */
    return 4 + (int)((p - base) * 4 + (unsigned)(k - 1));
}

uint64_t mem_class_size(uint64_t size, uint64_t alignment)
{
    uint64_t cs = 0;
    if (size > MEM_LARGE_THRESHOLD)
        return (size + alignment - 1) & ~(alignment - 1);
    class_index(size, alignment, &cs);
    return cs;
}

cube_error *mem_manager_create(const mem_storage_ops *ops, uint64_t alignment,
                               uint64_t max_buffer, mem_manager **out)
{
    if (!out || !ops || !ops->alloc || !ops->free)
        return cube_error_new(CUBE_ERR_INVALID_ARGUMENT,
                              "mem_manager_create: missing storage or out");
    *out = NULL;
    if (alignment == 0 || (alignment & (alignment - 1)) != 0)
        return cube_error_new(CUBE_ERR_INVALID_ARGUMENT,
                              "mem_manager_create: alignment %llu is not a "
                              "power of two",
                              (unsigned long long)alignment);
    mem_manager *m = calloc(1, sizeof *m);
    if (!m)
        return cube_error_new(CUBE_ERR_OUT_OF_MEMORY, "memory manager");
    m->ops = *ops;
    m->alignment = alignment;
    m->max_buffer = max_buffer;
    pthread_mutex_init(&m->lock, NULL);
    *out = m;
    return NULL;
}

static void release_cached_locked(mem_manager *m)
{
    for (int c = 0; c < MEM_CLASS_COUNT; c++) {
        while (m->free_lists[c]) {
            mem_block *b = m->free_lists[c];
            m->free_lists[c] = b->next;
            m->ops.free(m->ops.self, b->address, b->size);
            m->cached_reserved -= b->size;
            b->next = m->spare_records;
            m->spare_records = b;
        }
    }
}

void mem_manager_destroy(mem_manager *m)
{
    if (!m)
        return;
    pthread_mutex_lock(&m->lock);
    release_cached_locked(m);
    pthread_mutex_unlock(&m->lock);
    if (m->live_buffers)
        cube_log_write(CUBE_LOG_DEBUG, "memory",
                       "%llu buffers still live at shutdown (%llu bytes); "
                       "their owner returns them",
                       (unsigned long long)m->live_buffers,
                       (unsigned long long)m->live_requested);
    while (m->spare_records) {
        mem_block *b = m->spare_records;
        m->spare_records = b->next;
        free(b);
    }
    pthread_mutex_destroy(&m->lock);
    free(m);
}

cube_error *mem_alloc(mem_manager *m, uint64_t size, cube_storage *out)
{
    if (!m || !out || size == 0)
        return cube_error_new(CUBE_ERR_INVALID_ARGUMENT,
                              "mem_alloc: size is 0 or arguments are NULL");
    if (size > m->max_buffer)
        return cube_error_new(CUBE_ERR_BUFFER_TOO_BIG,
                              "a buffer of %llu bytes can never fit: the "
                              "largest buffer this device holds is %llu bytes",
                              (unsigned long long)size,
                              (unsigned long long)m->max_buffer);
    uint64_t class_size;
    int cls = -1;
    if (size <= MEM_LARGE_THRESHOLD)
        cls = class_index(size, m->alignment, &class_size);
    else
        class_size = (size + m->alignment - 1) & ~(m->alignment - 1);
    if (class_size < size) /* rounding overflowed */
        return cube_error_new(CUBE_ERR_BUFFER_TOO_BIG,
                              "a buffer of %llu bytes can never fit",
                              (unsigned long long)size);

    pthread_mutex_lock(&m->lock);
    mem_block *b = NULL;
    if (cls >= 0 && m->free_lists[cls]) {
        b = m->free_lists[cls];
        m->free_lists[cls] = b->next;
        m->cached_reserved -= b->size;
    } else {
        if (m->spare_records) {
            b = m->spare_records;
            m->spare_records = b->next;
        } else {
            b = malloc(sizeof *b);
            if (!b) {
                pthread_mutex_unlock(&m->lock);
                return cube_error_new(CUBE_ERR_OUT_OF_MEMORY,
                                      "no host memory for a block record");
            }
        }
        uint64_t address = 0;
        cube_error *err =
            m->ops.alloc(m->ops.self, class_size, m->alignment, &address);
        if (err && m->cached_reserved > 0) {
            /* Retryable: give back what is cached, then try once more. */
            cube_error_free(err);
            release_cached_locked(m);
            err = m->ops.alloc(m->ops.self, class_size, m->alignment, &address);
        }
        if (err) {
            b->next = m->spare_records;
            m->spare_records = b;
            pthread_mutex_unlock(&m->lock);
            return cube_error_prefix(err, "allocating %llu bytes",
                                     (unsigned long long)size);
        }
        b->address = address;
        b->size = class_size;
        b->cls = cls;
    }
    b->requested = size;
    b->next = NULL;
    m->live_buffers++;
    m->live_requested += size;
    m->live_reserved += b->size;
    pthread_mutex_unlock(&m->lock);
    out->address = b->address;
    out->size = size;
    out->cookie = b;
    return NULL;
}

void mem_free(mem_manager *m, cube_storage *storage)
{
    if (!m || !storage || !storage->cookie)
        return;
    mem_block *b = storage->cookie;
    pthread_mutex_lock(&m->lock);
    m->live_buffers--;
    m->live_requested -= b->requested;
    m->live_reserved -= b->size;
    if (b->cls >= 0) {
        b->next = m->free_lists[b->cls];
        m->free_lists[b->cls] = b;
        m->cached_reserved += b->size;
    } else {
        m->ops.free(m->ops.self, b->address, b->size);
        b->next = m->spare_records;
        m->spare_records = b;
    }
    pthread_mutex_unlock(&m->lock);
    storage->cookie = NULL;
}

void mem_usage(mem_manager *m, cube_memory_usage *out)
{
    pthread_mutex_lock(&m->lock);
    out->buffers = m->live_buffers;
    out->bytes_in_use = m->live_requested;
    out->bytes_padding = m->live_reserved - m->live_requested;
    out->bytes_reserved = m->live_reserved + m->cached_reserved;
    pthread_mutex_unlock(&m->lock);
}

void mem_cleanup(mem_manager *m)
{
    pthread_mutex_lock(&m->lock);
    release_cached_locked(m);
    pthread_mutex_unlock(&m->lock);
}
