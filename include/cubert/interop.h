/* cubert — sharing memory and streams with other libraries.
 *
 * A buffer's native address goes to code cubert does not run (cuBLAS, a
 * CUDA kernel of one's own, a CPU routine); memory another library holds
 * (PyTorch, CuPy, NumPy, cudaMalloc, malloc) becomes a cubert buffer with
 * nothing copied.
 *
 * Ordering with foreign work: cubert orders its own work through the
 * failure store and its streams; work it did not issue it cannot see. So:
 * - before foreign code touches a buffer cubert wrote, either issue the
 *   foreign work on the calling thread's native stream (cube_native_stream:
 *   in order after everything the thread issued there), or wait for the
 *   buffer with cube_sync(client, &handle, 1);
 * - after foreign work wrote a buffer, tell cubert with cube_native_written
 *   (the work was issued on the calling thread's native stream: later
 *   cubert work on any stream waits for it), or finish that work before
 *   cubert's next use of the buffer.
 * On the CPU and null backends work is done when its call returns, there
 * is no native stream (NULL), and only the second half of each rule
 * matters.
 *
 * Thread safety: every call may be made from any thread.
 */
#ifndef CUBERT_INTEROP_H
#define CUBERT_INTEROP_H

#include <stdint.h>

#include "cubert/client.h"
#include "cubert/error.h"

#ifdef __cplusplus
extern "C" {
#endif

/* A buffer's memory as other code sees it. */
typedef struct cube_native_buffer {
    /* The handle's first byte: a CUDA device address (CUdeviceptr) on
     * CUDA, a host pointer on the CPU and null backends. */
    uint64_t address;
    uint64_t size; /* bytes of the handle's range */
    /* Nonzero when the host may dereference `address`. */
    int host_accessible;
} cube_native_buffer;

/* The native view of `handle`. The address stays valid while any
 * reference to the buffer lives (a slice's buffer included); a buffer made
 * in a dry run gets its memory here. The bytes are those of cubert's last
 * work on it only once that work is done (see above). Errors:
 * CUBE_ERR_INVALID_ARGUMENT (client or out NULL), CUBE_ERR_NOT_FOUND (a
 * released or foreign handle), CUBE_ERR_STORAGE_MAPPING_FAILED (a dry run's
 * buffer could not be backed), CUBE_ERR_DEVICE_FAULT. */
CUBE_API CUBE_MUST_USE cube_error *
cube_native_buffer_get(cube_client *client, cube_handle handle,
                       cube_native_buffer *out);

/* The calling thread's native stream on `client` (the stream
 * cube_stream_current names): a CUstream on CUDA, valid until the client
 * closes; NULL on backends without one (work done at call time). Errors:
 * CUBE_ERR_INVALID_ARGUMENT (client or out NULL), CUBE_ERR_OUT_OF_MEMORY
 * (the stream could not be made), CUBE_ERR_DEVICE_FAULT. */
CUBE_API CUBE_MUST_USE cube_error *cube_native_stream(cube_client *client,
                                                      void **out);

/* Foreign work issued on the calling thread's native stream (or finished
 * already) wrote `handle`'s range: cubert's later work on the buffer, on
 * any stream, is ordered after it, and a write of the whole buffer clears
 * its failure like cube_write. Errors: CUBE_ERR_INVALID_ARGUMENT (client
 * NULL), CUBE_ERR_NOT_FOUND, CUBE_ERR_GRAPH_STATE (the stream is
 * capturing), CUBE_ERR_DEVICE_FAULT. */
CUBE_API CUBE_MUST_USE cube_error *cube_native_written(cube_client *client,
                                                       cube_handle handle);

/* The native name of a CUDA default stream for cube_native_wait (the
 * driver's CU_STREAM_LEGACY and CU_STREAM_PER_THREAD). */
#define CUBE_NATIVE_STREAM_LEGACY ((void *)(uintptr_t)1)
#define CUBE_NATIVE_STREAM_PER_THREAD ((void *)(uintptr_t)2)

/* The calling thread's native stream waits, on the device and not on the
 * host, for the work issued so far on `foreign`, a native stream of
 * `client`'s device that cubert does not own (a CUstream of the same
 * context; NULL or CUBE_NATIVE_STREAM_LEGACY: the legacy default stream;
 * CUBE_NATIVE_STREAM_PER_THREAD: the calling thread's per-thread default
 * stream). cubert work this thread issues afterwards runs after that
 * foreign work; to order other streams' later work on a buffer the foreign
 * work wrote, follow with cube_native_written. This is how a consumer that
 * told a DLPack producer "the legacy stream" bridges to cubert's own
 * stream. On backends without native streams work is done at call time:
 * `foreign` must be NULL and nothing waits.
 * Errors: CUBE_ERR_INVALID_ARGUMENT (client NULL; a non-NULL `foreign` on
 * a backend without native streams; the driver refusing `foreign`, e.g. a
 * stream of another context), CUBE_ERR_GRAPH_STATE (the calling thread's
 * stream is capturing), CUBE_ERR_OUT_OF_MEMORY (the stream could not be
 * made), CUBE_ERR_DEVICE_FAULT. */
CUBE_API CUBE_MUST_USE cube_error *cube_native_wait(cube_client *client,
                                                    void *foreign);

/* Called once when the last reference to wrapped memory goes. */
typedef void (*cube_release_fn)(void *user);

/* Wrapped memory must start at a multiple of this many bytes (the largest
 * alignment a kernel parameter asks for). */
#define CUBE_WRAP_ALIGNMENT 16u

/* A new buffer (one reference) over `size` bytes at `address` that cubert
 * did not allocate: device memory of `client`'s device on CUDA (from
 * cudaMalloc, PyTorch, CuPy: the address must lie in one allocation with
 * `size` bytes after it), host memory on the CPU and null backends. Nothing
 * is copied. It lives outside the pools (cleanup never frees it; usage
 * counts it apart: cube_memory_usage's foreign fields). When the last
 * reference goes (a release, cube_client_close) and cubert's work queued on
 * it is done, `release(user)` is called exactly once, on the thread that
 * dropped it; `release` may be NULL. On error nothing was taken: release is
 * not called and the memory is the caller's.
 * Errors: CUBE_ERR_INVALID_ARGUMENT (client or out NULL, address 0, size 0,
 * address not a multiple of CUBE_WRAP_ALIGNMENT, memory that is not this
 * device's — host memory on CUDA, another GPU's, a range past the end of
 * its allocation; the message says which), CUBE_ERR_UNSUPPORTED (the
 * backend cannot wrap memory), CUBE_ERR_OUT_OF_MEMORY (the handle's
 * records), CUBE_ERR_DEVICE_FAULT. */
CUBE_API CUBE_MUST_USE cube_error *
cube_wrap_memory(cube_client *client, uint64_t address, uint64_t size,
                 cube_release_fn release, void *user, cube_handle *out);

#ifdef __cplusplus
}
#endif

#endif /* CUBERT_INTEROP_H */
