/* Host memory for backends whose buffers live in host memory (the CPU
 * backend, the null backend): the storage a stream's memory manager
 * allocates from, strided copies between a buffer and packed host bytes,
 * and the busy time a host-clock profiling window counts.
 *
 * Thread safety: every function may be called from any thread; the busy
 * counters of one stream are touched only by calls on that stream (the
 * client serializes them).
 */
#ifndef CUBE_BACKENDS_COMMON_HOST_MEMORY_H
#define CUBE_BACKENDS_COMMON_HOST_MEMORY_H

#include <stddef.h>
#include <stdint.h>

#include "cubert/backend/comm.h"
#include "cubert/backend/server.h"

/* cube_storage_ops.alloc over aligned_alloc: `size` bytes rounded up to
 * `align` (a power of two). A request of HOST_VM_GRANULARITY (2 MiB) or
 * more is aligned and rounded to 2 MiB at least, and its whole 2 MiB pages
 * ask for transparent huge pages (madvise(MADV_HUGEPAGE), a hint the
 * system may ignore). `self` is unused. Errors:
 * CUBE_ERR_OUT_OF_MEMORY (the host refused, or the rounded size does not
 * fit the address space), its message naming `self_name`'s backend is
 * left to the caller's prefix. */
cube_error *host_storage_alloc(void *self, uint64_t size, uint64_t align,
                               uint64_t *address);
/* cube_storage_ops.free: gives back what host_storage_alloc gave. */
void host_storage_free(void *self, uint64_t address, uint64_t size);

/* Virtual memory over the host's (cube_storage_ops, server.h), for
 * expandable pools: reserve is an mmap of PROT_NONE, MAP_NORESERVE
 * address space aligned to at least HOST_VM_GRANULARITY; map is an
 * mprotect to read and write (the kernel backs each page at its first
 * touch; the range asks for transparent huge pages, as large allocations
 * do); unmap is madvise(MADV_DONTNEED), which gives the pages back at
 * once, then an mprotect back to PROT_NONE; release is munmap. Errors
 * (reserve, map): CUBE_ERR_OUT_OF_MEMORY with the system's reason (ENOMEM
 * when the address space or, under strict overcommit, the commit limit
 * runs out); a failed map leaves its range inaccessible. `self` is
 * unused. */
#define HOST_VM_GRANULARITY (2ull << 20)
cube_error *host_storage_reserve(void *self, uint64_t size, uint64_t align,
                                 uint64_t *base);
cube_error *host_storage_map(void *self, uint64_t address, uint64_t size);
void host_storage_unmap(void *self, uint64_t address, uint64_t size);
void host_storage_release(void *self, uint64_t base, uint64_t size);

/* Fills `ops` with the functions above: aligned_alloc and free, and the
 * host's virtual memory with a granularity of HOST_VM_GRANULARITY. */
void host_storage_ops(cube_server *server, cube_storage_ops *ops);

/* The stream_open slot of a backend whose work runs at issue time and whose
 * memory is host memory: the stream needs no state (stream->impl stays
 * NULL) and its storage is host_storage_ops. */
cube_error *host_stream_open(cube_server *server, cube_server_stream *stream,
                             cube_storage_ops *storage);

/* Copies one op's elements between its binding and packed host bytes:
 * to the host when `to_host`, else from it. Strided layouts go row by row
 * (a row is the innermost dimension, one memcpy when it is dense). */
void host_copy_op(const cube_copy_op *op, unsigned char *host, int to_host);

/* Around work done at call time on `stream`: while a profiling window is
 * open (stream->profiling), the work's duration is added to
 * stream->busy_ns, which the client's host-clock window reports. */
uint64_t host_busy_begin(const cube_server_stream *stream);
void host_busy_end(cube_server_stream *stream, uint64_t t0);

/* Vtable slots for a backend that does its work at call time on host
 * memory: read and write copy before returning (no pending read, the
 * caller's memory free at once) and count busy time; sync and flush have
 * nothing left to wait for (host memory cannot fault). */
cube_error *host_read(cube_server *server, cube_server_stream *stream,
                      const cube_copy_op *ops, size_t n, void *const *dst,
                      cube_pending **pending);
cube_error *host_write(cube_server *server, cube_server_stream *stream,
                       const cube_copy_op *ops, size_t n,
                       const void *const *src);
cube_error *host_sync(cube_server *server, cube_server_stream *stream,
                      const cube_binding *bindings, size_t n);
cube_error *host_flush(cube_server *server, cube_server_stream *stream);

/* wrap_memory for host-memory backends: any host address is theirs
 * (nothing to check it against); the storage names it as it is. */
cube_error *host_wrap_memory(cube_server *server, cube_server_stream *stream,
                             uint64_t address, uint64_t size,
                             cube_storage *out);

/* ServerCommunication for host-memory backends (host_collective.c): the
 * collective slot over ranks that are threads of this process (every
 * rank's call shares out the work and returns when it is all done; the
 * rank keeps no state, `comm` is unused), host_comm_vtable, the
 * communicator table of a backend with only such ranks (the null
 * backend; the CPU backend adds MPI's between processes, cpu_mpi.c), and
 * copy_to_peer as one memmove at call time. */
cube_error *host_collective(cube_server *server, cube_server_stream *stream,
                            cube_backend_comm *comm,
                            const cube_collective_set *set);
extern const cube_comm_vtable host_comm_vtable;
cube_error *host_copy_to_peer(cube_server *server, cube_server_stream *stream,
                              const cube_binding *src, cube_server *peer,
                              cube_server_stream *peer_stream,
                              const cube_binding *dst);

/* Element-wise reductions as the host collectives do them: acc[i] = acc[i]
 * op in[i] over `n` elements of `dtype` (cube_dtype; halves through
 * float), and acc[i] /= ranks (an average's last step). */
void host_reduce_combine(void *acc, const void *in, size_t n, uint32_t dtype,
                         uint32_t op);
void host_reduce_divide(void *acc, size_t n, uint32_t dtype, uint32_t ranks);

#endif /* CUBE_BACKENDS_COMMON_HOST_MEMORY_H */
