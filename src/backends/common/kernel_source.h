/* The text a backend hands its compiler for a kernel: its preludes, then a
 * #line directive, then the user's source, so that the compiler's
 * messages point into the user's file. The CPU backend (cpu_server.c, its
 * portability check in cpu_portability.c) and the CUDA backend
 * (cuda_kernels.c) build their texts here.
 *
 * Thread safety: any thread. Errors: NULL for want of memory.
 */
#ifndef CUBE_BACKENDS_COMMON_KERNEL_SOURCE_H
#define CUBE_BACKENDS_COMMON_KERNEL_SOURCE_H

#include <stddef.h>

/* prelude_common.h, embedded by the build (cmake/embed.cmake): the part of
 * the cube C prelude every backend puts after its own. */
extern const char cube_prelude_common[];

/* A cube C kernel's text: each of the `n` (at most 3) backend preludes, then
 * cube_prelude_common, each followed by a newline, then the user's source
 * as the file "<name>.cube.c". A new string the caller frees. */
char *kernel_source_cube_c(const char *const *preludes, size_t n,
                           const char *name, const char *user);

/* A raw C kernel's text: `prelude` (its ABI header) and a newline, then the
 * user's source as the file "<name>.c". A new string the caller frees. */
char *kernel_source_raw_c(const char *prelude, const char *name,
                          const char *user);

#endif /* CUBE_BACKENDS_COMMON_KERNEL_SOURCE_H */
