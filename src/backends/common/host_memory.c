/* Host memory for host-memory backends (host_memory.h). */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

#include "backends/common/host_memory.h"
#include "base/clock.h"
#include "cubert/backend/errors.h"

/* Asks for transparent huge pages over the whole 2 MiB pages of
 * [p, p + size) that start at p (p is 2 MiB aligned). A kernel read over a
 * large buffer then misses the TLB once per 2 MiB instead of once per
 * 4 KiB, and the hardware prefetchers run across 4 KiB boundaries. Only a
 * hint: without THP (or with it off) the range keeps small pages. The tail
 * under 2 MiB is left out, so no buffer holds more memory than it asked
 * for once touched. */
static void host_huge_pages(void *p, uint64_t size)
{
    uint64_t whole = size & ~(HOST_VM_GRANULARITY - 1);
    if (whole)
        (void)madvise(p, (size_t)whole, MADV_HUGEPAGE);
}

cube_error *host_storage_alloc(void *self, uint64_t size, uint64_t align,
                               uint64_t *address)
{
    (void)self;
    /* A buffer of a huge page or more starts on a huge page. */
    if (size >= HOST_VM_GRANULARITY && align < HOST_VM_GRANULARITY)
        align = HOST_VM_GRANULARITY;
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
    if (size >= HOST_VM_GRANULARITY)
        host_huge_pages(p, size);
    *address = (uint64_t)(uintptr_t)p;
    return NULL;
}

void host_storage_free(void *self, uint64_t address, uint64_t size)
{
    (void)self;
    (void)size;
    free((void *)(uintptr_t)address);
}

/* --- virtual memory ---
 *
 * A reservation is an anonymous private mapping with no access and no
 * swap reservation (MAP_NORESERVE), trimmed to its alignment. Mapping a
 * range makes it readable and writable; the kernel backs each page at its
 * first touch, so what a mapped range costs is what was written to it.
 * Unmapping drops the pages (MADV_DONTNEED: the next touch would read
 * zeros) and takes the access away again, so a stray use faults. The range
 * asks for transparent huge pages (host_huge_pages). */

static cube_error *host_vm_errno(int e, const char *what, uint64_t size)
{
    return cube_error_new(CUBE_ERR_OUT_OF_MEMORY,
                          "host memory: %s %llu bytes failed: %s", what,
                          (unsigned long long)size, strerror(e));
}

cube_error *host_storage_reserve(void *self, uint64_t size, uint64_t align,
                                 uint64_t *base)
{
    (void)self;
    if (align < HOST_VM_GRANULARITY)
        align = HOST_VM_GRANULARITY;
    if (size == 0 || size > SIZE_MAX - align ||
        (size & (HOST_VM_GRANULARITY - 1)) != 0)
        return cube_error_new(CUBE_ERR_OUT_OF_MEMORY,
                              "host memory: cannot reserve %llu bytes of "
                              "address space aligned to %llu",
                              (unsigned long long)size,
                              (unsigned long long)align);
    size_t len = (size_t)size + (size_t)align;
    void *p = mmap(NULL, len, PROT_NONE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED)
        return host_vm_errno(errno, "reserving address space of", size);
    uintptr_t start = (uintptr_t)p;
    uintptr_t aligned =
        (start + (uintptr_t)align - 1) & ~((uintptr_t)align - 1);
    /* The slack before and after the aligned range goes back. */
    if (aligned > start)
        munmap(p, aligned - start);
    size_t after = (size_t)(start + len - (aligned + (size_t)size));
    if (after)
        munmap((void *)(aligned + (size_t)size), after);
    /* Mapped pages of the range are huge where the system allows it (the
     * pages and the range are 2 MiB multiples). */
    host_huge_pages((void *)aligned, size);
    *base = (uint64_t)aligned;
    return NULL;
}

cube_error *host_storage_map(void *self, uint64_t address, uint64_t size)
{
    (void)self;
    if (mprotect((void *)(uintptr_t)address, (size_t)size,
                 PROT_READ | PROT_WRITE) != 0) {
        int e = errno;
        /* A failed mprotect may have changed part of the range. */
        mprotect((void *)(uintptr_t)address, (size_t)size, PROT_NONE);
        return host_vm_errno(e, "mapping", size);
    }
    return NULL;
}

void host_storage_unmap(void *self, uint64_t address, uint64_t size)
{
    (void)self;
    void *p = (void *)(uintptr_t)address;
    /* The pages go back even when the protection cannot change (a split
     * mapping past vm.max_map_count): the range then stays accessible but
     * holds no memory. */
    madvise(p, (size_t)size, MADV_DONTNEED);
    mprotect(p, (size_t)size, PROT_NONE);
}

void host_storage_release(void *self, uint64_t base, uint64_t size)
{
    (void)self;
    munmap((void *)(uintptr_t)base, (size_t)size);
}

void host_storage_ops(cube_server *server, cube_storage_ops *ops)
{
    ops->self = server;
    ops->alloc = host_storage_alloc;
    ops->free = host_storage_free;
    ops->granularity = HOST_VM_GRANULARITY;
    ops->reserve = host_storage_reserve;
    ops->map = host_storage_map;
    ops->unmap = host_storage_unmap;
    ops->release = host_storage_release;
}

cube_error *host_stream_open(cube_server *server, cube_server_stream *stream,
                             cube_storage_ops *storage)
{
    (void)stream;
    host_storage_ops(server, storage);
    return NULL;
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
    return cube_clock_ns();
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
