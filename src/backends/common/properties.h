/* A backend's cube_properties, started with what every backend sets the
 * same way; each then writes its own figures (name, architecture, limits,
 * features) over them. Used by each backend's open (cpu_server.c,
 * cuda_server.c, null_server.c).
 *
 * Thread safety: any thread, on properties the caller alone holds.
 * Errors: none.
 */
#ifndef CUBE_BACKENDS_COMMON_PROPERTIES_H
#define CUBE_BACKENDS_COMMON_PROPERTIES_H

#include <stdint.h>

#include "cubert/client.h"
#include "cubert/error.h"

/* What a backend that compiles and runs cube C offers of itself (atomics,
 * doubles, shared memory, cube_sync, bounds checks, dynamic counts, graphs,
 * kernels); a device adds its own bits. */
#define PROPERTIES_CUBE_C_FEATURES                                             \
    (CUBE_FEATURE_ATOMIC_F32_ADD | CUBE_FEATURE_F64 |                          \
     CUBE_FEATURE_SHARED_MEMORY | CUBE_FEATURE_CUBE_SYNC |                     \
     CUBE_FEATURE_BOUNDS_CHECK | CUBE_FEATURE_DYNAMIC_COUNT |                  \
     CUBE_FEATURE_GRAPHS | CUBE_FEATURE_KERNELS)

/* `p` zeroed, then: its backend name; wide cube count limits (2^32-1
 * along x, 65535 along y and z, as a CUDA grid's); timing by the host's
 * clock; the memory figures: `total` bytes, all of them allowed in one
 * buffer, each buffer's address a multiple of `alignment`. */
void properties_defaults(cube_properties *p, const char *backend,
                         uint64_t total, uint64_t alignment);

/* NULL when a dynamic cube count (read from its buffer) is within
 * p->max_cube_count along every axis, else CUBE_ERR_RESOURCE_LIMIT naming
 * the first axis over it and `limit` ("the maximum"). Caller owns the
 * error. */
cube_error *properties_check_count(const cube_properties *p,
                                   const uint32_t count[3], const char *limit);

#endif /* CUBE_BACKENDS_COMMON_PROPERTIES_H */
