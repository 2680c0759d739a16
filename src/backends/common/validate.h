/* The validating mode (CUBE_LAUNCH_VALIDATE) on the runtime's side: the
 * record a validating kernel fills and the launch's verdict read from it.
 * The CPU backend (cpu_server.c) hands the record to the kernel in its
 * launch ABI; the CUDA backend (cuda_kernels.c, cuda_launch.c) keeps one
 * per module on the device and copies it back after the kernel.
 *
 * Thread safety: validate_report may be called from any thread. Errors:
 * as validate_report says.
 */
#ifndef CUBE_BACKENDS_COMMON_VALIDATE_H
#define CUBE_BACKENDS_COMMON_VALIDATE_H

#include "cubert/backend/server.h"

/* Laid out as cube__oob_rec in prelude_common.h (three 64-bit fields, a
 * 32-bit position, a 32-byte name, padded to 8): the kernel writes it.
 * The runtime zeroes it before the launch and reads it once every unit is
 * done. */
#define VALIDATE_NAME 32
typedef struct validate_record {
    unsigned long long count; /* accesses out of range */
    unsigned long long index; /* the first one's index and buffer length */
    unsigned long long len;
    unsigned int param;       /* its parameter position */
    char name[VALIDATE_NAME]; /* its parameter name (not trusted to end) */
} validate_record;

/* The launch's verdict: NULL when no access was out of range, else a
 * CUBE_ERR_INVALID_ARGUMENT naming the first one (buffer parameter, index,
 * length) and how many there were. `compiled` is the launched kernel's
 * (for the element size). Caller owns the error. */
cube_error *validate_report(const cube_compiled *compiled,
                            const validate_record *record);

#endif /* CUBE_BACKENDS_COMMON_VALIDATE_H */
