/* cubert — buffers and data movement.
 *
 * A buffer is device memory owned by a client. cube_empty/cube_create hand
 * back a handle holding one reference; cube_handle_retain adds one,
 * cube_handle_release drops one, and the memory returns to its pool when the
 * last reference is gone and the work queued on it is done. A slice
 * (cube_handle_slice) is a handle to a byte range of a buffer that keeps the
 * whole buffer alive.
 *
 * Data moves through copy descriptors: a handle plus a shape, strides (in
 * elements; NULL means contiguous, row-major) and an element size. Host data
 * is always packed contiguously in shape order.
 *
 * Thread safety: every call may be made from any thread. Writes and reads
 * are ordered on the calling thread's stream.
 */
#ifndef CUBERT_BUFFER_H
#define CUBERT_BUFFER_H

#include <stddef.h>
#include <stdint.h>

#include "cubert/client.h"

#ifdef __cplusplus
extern "C" {
#endif

#define CUBE_MAX_RANK 8

/* --- handles --- */

/* A new buffer of `size` bytes, contents undefined.
 * Errors: CUBE_ERR_INVALID_ARGUMENT (client or out NULL, size 0),
 * CUBE_ERR_BUFFER_TOO_BIG (larger than the device can ever hold),
 * CUBE_ERR_OUT_OF_MEMORY, CUBE_ERR_DEVICE_FAULT. */
CUBE_API CUBE_MUST_USE cube_error *cube_empty(cube_client *client,
                                              uint64_t size, cube_handle *out);

/* A new buffer holding a copy of `bytes[0, size)`; `bytes` is borrowed for
 * the call only. Errors: as cube_empty, plus CUBE_ERR_INVALID_ARGUMENT for
 * bytes NULL. */
CUBE_API CUBE_MUST_USE cube_error *cube_create(cube_client *client,
                                               const void *bytes, uint64_t size,
                                               cube_handle *out);

/* Adds a reference. Errors: CUBE_ERR_INVALID_ARGUMENT (client NULL),
 * CUBE_ERR_NOT_FOUND (released or foreign handle). */
CUBE_API CUBE_MUST_USE cube_error *cube_handle_retain(cube_client *client,
                                                      cube_handle handle);

/* Drops a reference; the last one frees the handle (the buffer's memory
 * returns to its pool once no handle or queued work uses it).
 * Errors: CUBE_ERR_INVALID_ARGUMENT, CUBE_ERR_NOT_FOUND. */
CUBE_API CUBE_MUST_USE cube_error *cube_handle_release(cube_client *client,
                                                       cube_handle handle);

/* A new handle (one reference, caller releases it) naming bytes
 * [offset, offset + size) of `handle`'s range. It keeps the buffer alive.
 * Any offset makes a slice that reads and writes, but a slice bound to a
 * kernel's buffer parameter must start aligned for the parameter's
 * elements: its offset in the buffer (offsets of slices of slices add up)
 * a multiple of the largest power of two dividing the element size, at
 * most 16 (4 for float or uint32_t, 8 for double, 1 for uint8_t).
 * cube_launch refuses a misaligned one (cubert/kernel.h).
 * Errors: CUBE_ERR_INVALID_ARGUMENT (range empty or past the end, overflow),
 * CUBE_ERR_NOT_FOUND. */
CUBE_API CUBE_MUST_USE cube_error *
cube_handle_slice(cube_client *client, cube_handle handle, uint64_t offset,
                  uint64_t size, cube_handle *out);

/* The longest buffer label, in bytes, without the terminating NUL. */
#define CUBE_LABEL_MAX 63

/* Names the buffer `handle` belongs to (every handle and slice of it
 * shares the label): the list of live buffers (cube_memory_snapshot in
 * cubert/memory.h, `cubert memory --buffers`) shows it, and the trace's
 * release events and error messages that name the buffer show it beside
 * the handle's hex bits. The
 * label is copied. It is 1 to CUBE_LABEL_MAX bytes of printable ASCII
 * (0x20-0x7e) other than '"' and '\\'; a longer or other label is
 * refused, not truncated, and the old label stays. NULL or "" clears it.
 * Thread-safe; a label set while a launch fails may or may not appear in
 * that launch's error.
 * Errors: CUBE_ERR_INVALID_ARGUMENT (NULL client, label too long or with
 * other bytes), CUBE_ERR_NOT_FOUND (released handle, or one of another
 * client), CUBE_ERR_OUT_OF_MEMORY. */
CUBE_API CUBE_MUST_USE cube_error *cube_handle_set_label(cube_client *client,
                                                         cube_handle handle,
                                                         const char *label);

/* Copies the label of the buffer `handle` belongs to into `out` ("" when
 * it has none); `cap` bytes, CUBE_LABEL_MAX + 1 always suffice.
 * Errors: CUBE_ERR_INVALID_ARGUMENT (NULL client or out, cap shorter than
 * the label and its NUL), CUBE_ERR_NOT_FOUND. */
CUBE_API CUBE_MUST_USE cube_error *cube_handle_label(cube_client *client,
                                                     cube_handle handle,
                                                     char *out, size_t cap);

/* The size in bytes of the range `handle` names.
 * Errors: CUBE_ERR_INVALID_ARGUMENT, CUBE_ERR_NOT_FOUND. */
CUBE_API CUBE_MUST_USE cube_error *
cube_handle_size(cube_client *client, cube_handle handle, uint64_t *out);

/* --- copy descriptors --- */

typedef struct cube_copy_desc {
    cube_handle handle;
    uint32_t rank; /* 1..CUBE_MAX_RANK */
    uint64_t shape[CUBE_MAX_RANK];
    /* Element strides per dimension; all zero means contiguous row-major.
     * A zero stride on a dimension of extent above 1 (among nonzero ones)
     * is refused: it would name one element several times. */
    uint64_t strides[CUBE_MAX_RANK];
    uint32_t elem_size; /* bytes per element, 1..64 */
} cube_copy_desc;

/* A contiguous descriptor over the whole of `handle` range: rank 1,
 * shape = bytes / elem_size. */
CUBE_API cube_copy_desc cube_copy_desc_contiguous(cube_handle handle,
                                                  uint64_t bytes,
                                                  uint32_t elem_size);

/* --- writes and reads
 * ---------------------------------------------------------
 *
 * cube_write copies host data into buffers in stream order and returns once
 * the host memory may be reused. A failure while executing lands on the
 * written buffers (see cube_check); a successful write that covers a whole
 * buffer densely (offset 0, every byte: a contiguous descriptor, or strides
 * that are row-major and leave no gap) clears that buffer's failure; a
 * partial write, or one with gaps, leaves it. Argument errors are returned
 * at once and nothing is written:
 * CUBE_ERR_INVALID_ARGUMENT (NULL pointers, n 0, rank 0 or over the limit,
 * a zero or overflowing extent, a zero stride on a dimension of extent
 * above 1, a descriptor that runs past its handle's range, a source size
 * that differs from the descriptor's bytes),
 * CUBE_ERR_NOT_FOUND (released or foreign handle),
 * CUBE_ERR_GRAPH_STATE (the calling stream is capturing a graph),
 * CUBE_ERR_DEVICE_FAULT. A buffer made in a dry run gets its memory at its
 * first write or read; if that fails the call returns
 * CUBE_ERR_STORAGE_MAPPING_FAILED, whose cause is the pool's answer
 * (CUBE_ERR_POOL_CAPACITY_EXCEEDED, CUBE_ERR_OUT_OF_MEMORY), and later
 * reads of the buffer are refused with it until a write backs it. */
CUBE_API CUBE_MUST_USE cube_error *
cube_write(cube_client *client, const cube_copy_desc *descs,
           const void *const *sources, const uint64_t *source_sizes, size_t n);

/* Copies each descriptor's elements, packed, into destinations[i] (capacity
 * destination_sizes[i] bytes; must equal the descriptor's bytes). Waits for
 * the work that writes those buffers. On a capturing stream it is refused
 * with CUBE_ERR_GRAPH_STATE, whatever the buffers hold. Otherwise, before
 * copying anything it asks the failure store: if any buffer read carries a
 * failure, it returns CUBE_ERR_SEVERAL (one cause per failed buffer) and
 * no destination is touched. Other errors: as cube_write, among them
 * CUBE_ERR_STORAGE_MAPPING_FAILED for a buffer made in a dry run that
 * cannot be backed now. Blocks. */
CUBE_API CUBE_MUST_USE cube_error *cube_read(cube_client *client,
                                             const cube_copy_desc *descs,
                                             void *const *destinations,
                                             const uint64_t *destination_sizes,
                                             size_t n);

/* The whole of `handle`'s range from or to one host pointer: the
 * descriptor forms above with a contiguous descriptor of the handle's
 * size. `size` must be that size exactly. Same semantics as cube_write
 * (a whole-buffer write clears the buffer's failure) and cube_read
 * (refused with CUBE_ERR_SEVERAL, nothing copied, when the buffer carries
 * a failure; blocks). Errors: CUBE_ERR_INVALID_ARGUMENT (client or
 * pointer NULL, a size other than the handle's: the message gives both),
 * CUBE_ERR_NOT_FOUND (released or foreign handle), and every error of
 * cube_write or cube_read. */
CUBE_API CUBE_MUST_USE cube_error *cube_write_all(cube_client *client,
                                                  cube_handle handle,
                                                  const void *src,
                                                  uint64_t size);
CUBE_API CUBE_MUST_USE cube_error *cube_read_all(cube_client *client,
                                                 cube_handle handle, void *dst,
                                                 uint64_t size);

/* An outstanding asynchronous read. */
typedef struct cube_future cube_future;

/* Starts a read and returns at once with a future. The destinations are
 * borrowed until cube_future_wait returns; do not touch them before. An
 * argument error is returned at once (no future is made); a failure found
 * later is returned by cube_future_wait. Errors returned at once:
 * CUBE_ERR_INVALID_ARGUMENT and CUBE_ERR_NOT_FOUND (as cube_read),
 * CUBE_ERR_OUT_OF_MEMORY, CUBE_ERR_DEVICE_FAULT; every other answer,
 * CUBE_ERR_GRAPH_STATE among them, comes from cube_future_wait.
 * Ownership: the caller frees the future with cube_future_free (after or
 * without waiting; freeing an unwaited future waits first).
 * A future outlives its client: cube_client_close completes every read
 * whose future was not waited on yet (it waits for the read, so the
 * destinations then hold the bytes, or the read failed) and detaches the
 * future; cube_future_wait, cube_future_ready and cube_future_free on it
 * afterwards touch nothing of the client, and the wait answers the read's
 * result. A wait running on another thread while the client closes is
 * finished by that thread (close waits for it). */
CUBE_API CUBE_MUST_USE cube_error *
cube_read_async(cube_client *client, const cube_copy_desc *descs,
                void *const *destinations, const uint64_t *destination_sizes,
                size_t n, cube_future **out);

/* Waits for the read; returns its result (as cube_read would). Waiting a
 * second time returns NULL. Errors: CUBE_ERR_INVALID_ARGUMENT (NULL). */
CUBE_API CUBE_MUST_USE cube_error *cube_future_wait(cube_future *future);

/* Non-blocking: 1 when cube_future_wait would not block, else 0. */
CUBE_API int cube_future_ready(const cube_future *future);

CUBE_API void cube_future_free(cube_future *future);

/* --- staging ----------------------------------------------------------------
 *
 * Host buffers for data on its way to the device, which the caller fills
 * and then passes to cube_write/cube_create without another copy where the
 * backend can (pinned memory on CUDA, aligned host memory on the CPU).
 * out[i] receives a buffer of sizes[i] bytes; the caller frees each with
 * cube_staging_free. On any error nothing is allocated and every out[i]
 * is NULL. Errors: CUBE_ERR_INVALID_ARGUMENT (client, sizes or out NULL,
 * n 0, a zero size), CUBE_ERR_BUFFER_TOO_BIG (a size that can never be
 * staged: above the device's memory_total, or on CUDA above the host's
 * memory), CUBE_ERR_OUT_OF_MEMORY (the host, or on CUDA the driver's
 * pinned allocation, refused it now), CUBE_ERR_DEVICE_FAULT (the client
 * is faulted, or on CUDA the pinned allocation broke the context),
 * CUBE_ERR_INTERNAL (CUDA: the device's context could not be made
 * current). */
CUBE_API CUBE_MUST_USE cube_error *
cube_staging(cube_client *client, const uint64_t *sizes, size_t n, void **out);

/* Frees a staging buffer. NULL is a no-op. Errors: CUBE_ERR_INVALID_ARGUMENT
 * (client NULL), CUBE_ERR_NOT_FOUND (not a staging buffer of this
 * client). */
CUBE_API CUBE_MUST_USE cube_error *cube_staging_free(cube_client *client,
                                                     void *buffer);

#ifdef __cplusplus
}
#endif

#endif /* CUBERT_BUFFER_H */
