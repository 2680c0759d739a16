/* cubert — DLPack 1.x: buffers handed to other libraries as tensors, and
 * their tensors taken in as buffers, with nothing copied.
 *
 * The structs below have the memory layout of DLPack's (DLDevice,
 * DLDataType, DLTensor, DLManagedTensor and DLManagedTensorVersioned of
 * DLPack 1.0 and later), under cubert's names so that a program may include
 * dlpack.h beside this header: a pointer to one may be cast to the other.
 *
 * Streams (the array API's rule): before a consumer touches an exported
 * tensor on its own stream, the producer makes that stream wait for the
 * work that last wrote the buffer; cube_dlpack_export does this for the
 * stream it is given. An imported tensor's bytes are the producer's to
 * have made ready (the consumer, cubert, asks for none: make them ready on
 * the calling thread's native stream, or finished, before cubert uses
 * them; cubert/interop.h).
 *
 * Thread safety: any thread. Ownership: see each call.
 */
#ifndef CUBERT_DLPACK_H
#define CUBERT_DLPACK_H

#include <stdint.h>

#include "cubert/client.h"
#include "cubert/error.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The DLPack version cubert produces. */
#define CUBE_DLPACK_MAJOR 1u
#define CUBE_DLPACK_MINOR 0u

/* Device types (DLDeviceType) cubert uses. */
enum { CUBE_DL_CPU = 1, CUBE_DL_CUDA = 2, CUBE_DL_CUDA_HOST = 3 };

/* Type codes (DLDataTypeCode). */
enum {
    CUBE_DL_INT = 0,
    CUBE_DL_UINT = 1,
    CUBE_DL_FLOAT = 2,
    CUBE_DL_BFLOAT = 4,
    CUBE_DL_BOOL = 6
};

/* Flags of a versioned tensor. */
#define CUBE_DL_FLAG_READ_ONLY (UINT64_C(1) << 0)
#define CUBE_DL_FLAG_IS_COPIED (UINT64_C(1) << 1)

typedef struct cube_dl_version {
    uint32_t major, minor;
} cube_dl_version;

typedef struct cube_dl_device {
    int32_t device_type; /* CUBE_DL_CPU, CUBE_DL_CUDA, ... */
    int32_t device_id;
} cube_dl_device;

typedef struct cube_dl_dtype {
    uint8_t code; /* CUBE_DL_INT, ... */
    uint8_t bits; /* per lane */
    uint16_t lanes;
} cube_dl_dtype;

typedef struct cube_dl_tensor {
    void *data;
    cube_dl_device device;
    int32_t ndim;
    cube_dl_dtype dtype;
    int64_t *shape;
    int64_t *strides; /* in elements; NULL: compact row-major */
    uint64_t byte_offset;
} cube_dl_tensor;

/* DLManagedTensor (the legacy capsule's). */
typedef struct cube_dl_managed {
    cube_dl_tensor dl_tensor;
    void *manager_ctx;
    void (*deleter)(struct cube_dl_managed *self);
} cube_dl_managed;

/* DLManagedTensorVersioned. */
typedef struct cube_dl_managed_versioned {
    cube_dl_version version;
    void *manager_ctx;
    void (*deleter)(struct cube_dl_managed_versioned *self);
    uint64_t flags;
    cube_dl_tensor dl_tensor;
} cube_dl_managed_versioned;

/* For cube_dlpack_export's consumer_stream: make no stream wait (the
 * consumer orders its use itself). NULL means: wait on the host. */
#define CUBE_DLPACK_NO_SYNC ((void *)(intptr_t)-1)

/* Hands `handle`'s bytes out as a DLPack tensor of `ndim` dimensions
 * (0..CUBE_MAX_RANK) with `shape`, `strides` (in elements; NULL: compact
 * row-major) and `dtype` (one lane of 8, 16, 32 or 64 bits; bool 8). Every
 * element must lie in the handle's range. The tensor holds a reference on
 * the buffer until the consumer calls its deleter (once), which must be
 * before the client closes. As a read does, it first refuses a buffer that
 * carries a failure (CUBE_ERR_SEVERAL). Then it makes the bytes ready for
 * `consumer_stream`: a CUstream (CUDA) that is made to wait for the work
 * that last wrote the buffer; NULL: this call waits on the host;
 * CUBE_DLPACK_NO_SYNC: neither. On the CPU and null backends the bytes are
 * always ready. A buffer made in a dry run gets its memory here.
 * Errors: CUBE_ERR_INVALID_ARGUMENT (client or out NULL, ndim out of range,
 * shape NULL with ndim > 0, a negative extent or stride, a dtype that is
 * not one of the above, elements past the range), CUBE_ERR_NOT_FOUND,
 * CUBE_ERR_SEVERAL, CUBE_ERR_GRAPH_STATE (the stream is capturing),
 * CUBE_ERR_OUT_OF_MEMORY, CUBE_ERR_STORAGE_MAPPING_FAILED,
 * CUBE_ERR_DEVICE_FAULT. */
CUBE_API CUBE_MUST_USE cube_error *
cube_dlpack_export(cube_client *client, cube_handle handle, cube_dl_dtype dtype,
                   int32_t ndim, const int64_t *shape, const int64_t *strides,
                   void *consumer_stream, cube_dl_managed_versioned **out);

/* Takes a DLPack tensor in as a new buffer (one reference) over the bytes
 * its elements span, nothing copied: on success cubert owns `tensor` and
 * calls its deleter once, when the buffer's last reference goes (after
 * cubert's work queued on it is done); on error the caller still owns it.
 * The tensor must be on `client`'s device (CPU memory on the CPU and null
 * backends; CUDA memory of the client's GPU), start at a multiple of
 * CUBE_WRAP_ALIGNMENT, have non-negative strides and at least one element,
 * and not be read-only; data + byte_offset, and that plus the bytes the
 * elements span, must not run past the end of the address space. Errors:
 * CUBE_ERR_INVALID_ARGUMENT (NULL, another device, a major version other
 * than 1, misaligned, negative strides, empty, a span that overflows 64
 * bits, a byte_offset or span past the end of the address space),
 * CUBE_ERR_UNSUPPORTED (read-only, or the backend cannot take
 * foreign memory), CUBE_ERR_OUT_OF_MEMORY, CUBE_ERR_DEVICE_FAULT. */
CUBE_API CUBE_MUST_USE cube_error *
cube_dlpack_import(cube_client *client, cube_dl_managed_versioned *tensor,
                   cube_handle *out);

/* The same for a legacy (unversioned) tensor. */
CUBE_API CUBE_MUST_USE cube_error *
cube_dlpack_import_legacy(cube_client *client, cube_dl_managed *tensor,
                          cube_handle *out);

#ifdef __cplusplus
}
#endif

#endif /* CUBERT_DLPACK_H */
