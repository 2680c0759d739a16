/* Host memory for host-memory backends (host_memory.h). */
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backends/common/host_memory.h"
#include "cubert/backend/errors.h"

cube_error *host_storage_alloc(void *self, uint64_t size, uint64_t align,
                               uint64_t *address)
{
    (void)self;
    uint64_t rounded = (size + align - 1) & ~(align - 1);
    if (rounded < size || rounded > SIZE_MAX)
        return cube_error_new(CUBE_ERR_OUT_OF_MEMORY,
                              "host memory: %llu bytes do not fit the "
                              "address space",
                              (unsigned long long)size);
    void *p = aligned_alloc((size_t)align, (size_t)rounded);
    if (!p)
        return cube_error_new(CUBE_ERR_OUT_OF_MEMORY,
                              "host memory: the host refused %llu bytes",
                              (unsigned long long)size);
    *address = (uint64_t)(uintptr_t)p;
    return NULL;
}

void host_storage_free(void *self, uint64_t address, uint64_t size)
{
    (void)self;
    (void)size;
    free((void *)(uintptr_t)address);
}

void host_storage_ops(cube_server *server, cube_storage_ops *ops)
{
    ops->self = server;
    ops->alloc = host_storage_alloc;
    ops->free = host_storage_free;
}

void host_copy_op(const cube_copy_op *op, unsigned char *host, int to_host)
{
    unsigned char *dev =
        (unsigned char *)(uintptr_t)op->binding.storage->address +
        op->binding.offset;
    if (op->contiguous) {
        if (to_host)
            memcpy(host, dev, op->bytes);
        else
            memcpy(dev, host, op->bytes);
        return;
    }
    uint32_t last = op->rank - 1;
    uint64_t idx[CUBE_MAX_RANK] = {0};
    uint64_t inner = op->shape[last];
    uint64_t es = op->elem_size;
    int dense_rows = op->byte_strides[last] == es;
    for (;;) {
        uint64_t off = 0;
        for (uint32_t k = 0; k < last; k++)
            off += idx[k] * op->byte_strides[k];
        unsigned char *row = dev + off;
        if (dense_rows) {
            if (to_host)
                memcpy(host, row, inner * es);
            else
                memcpy(row, host, inner * es);
            host += inner * es;
        } else {
            for (uint64_t e = 0; e < inner; e++) {
                unsigned char *el = row + e * op->byte_strides[last];
                if (to_host)
                    memcpy(host, el, es);
                else
                    memcpy(el, host, es);
                host += es;
            }
        }
        /* The next row: the outer indices count like an odometer. */
        int k = (int)last - 1;
        while (k >= 0 && ++idx[k] == op->shape[k])
            idx[k--] = 0;
        if (k < 0)
            return;
    }
}

uint64_t host_busy_begin(const cube_server_stream *stream)
{
    if (!stream->profiling)
        return 0;
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

void host_busy_end(cube_server_stream *stream, uint64_t t0)
{
    if (t0)
        stream->busy_ns += host_busy_begin(stream) - t0;
}

cube_error *host_read(cube_server *server, cube_server_stream *stream,
                      const cube_copy_op *ops, size_t n, void *const *dst,
                      cube_pending **pending)
{
    (void)server;
    uint64_t t0 = host_busy_begin(stream);
    *pending = NULL;
    for (size_t i = 0; i < n; i++)
        host_copy_op(&ops[i], dst[i], 1);
    host_busy_end(stream, t0);
    return NULL;
}

cube_error *host_write(cube_server *server, cube_server_stream *stream,
                       const cube_copy_op *ops, size_t n,
                       const void *const *src)
{
    (void)server;
    uint64_t t0 = host_busy_begin(stream);
    for (size_t i = 0; i < n; i++)
        host_copy_op(&ops[i], (unsigned char *)(uintptr_t)src[i], 0);
    host_busy_end(stream, t0);
    return NULL;
}

cube_error *host_sync(cube_server *server, cube_server_stream *stream,
                      const cube_binding *bindings, size_t n)
{
    (void)server;
    (void)stream;
    (void)bindings;
    (void)n;
    return NULL;
}

cube_error *host_flush(cube_server *server, cube_server_stream *stream)
{
    (void)server;
    (void)stream;
    return NULL;
}

cube_error *host_wrap_memory(cube_server *server, cube_server_stream *stream,
                             uint64_t address, uint64_t size, cube_storage *out)
{
    (void)server;
    (void)stream;
    out->address = address;
    out->size = size;
    out->cookie = NULL;
    return NULL;
}
