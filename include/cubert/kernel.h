/* cubert — kernels, cube counts, arguments and launches.
 *
 * A kernel is source in cube C (docs/kernels.md) plus the name of its entry
 * and the cube dimension it runs with. Kernel objects are independent of
 * clients: make one once, launch it on any client; each client compiles it
 * on first use and caches the result (in memory, and on disk where the
 * backend compiles to files).
 *
 * Thread safety: a kernel is immutable and may be shared between threads
 * and clients; cube_kernel_retain/release are atomic.
 */
#ifndef CUBERT_KERNEL_H
#define CUBERT_KERNEL_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "cubert/client.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct cube_kernel cube_kernel;

/* The most parameters a kernel may have (and arguments a launch may
 * give). */
#define CUBE_MAX_PARAMS 24

typedef struct cube_kernel_desc {
    /* The entry's name: the first argument of its CUBE_KERNEL(...). */
    const char *name;
    /* cube C source; copied. */
    const char *source;
    /* Units per cube along x, y, z; 0 counts as 1. */
    uint32_t cube_dim[3];
} cube_kernel_desc;

/* Makes a kernel (nothing is compiled yet). The caller owns one reference.
 * Errors: CUBE_ERR_INVALID_ARGUMENT (NULL desc/out/name/source, a name that
 * is not a C identifier, a cube dimension whose product overflows 32 bits),
 * CUBE_ERR_OUT_OF_MEMORY. */
CUBE_API CUBE_MUST_USE cube_error *
cube_kernel_create(const cube_kernel_desc *desc, cube_kernel **out);
CUBE_API void cube_kernel_retain(cube_kernel *kernel);
/* Drops a reference; the last frees the kernel. NULL is a no-op. */
CUBE_API void cube_kernel_release(cube_kernel *kernel);

/* --- kernels users already have: backend source and binaries ---
 *
 * A raw kernel is code in the backend's own language (CUDA C for NVRTC, C
 * for the CPU backend's compiler) or already compiled (CUBIN or PTX, an
 * ELF shared object), with its parameters declared by the caller since
 * nothing in the code tells cubert what it reads and writes. It is
 * launched by cube_launch like a cube C kernel, with everything a launch
 * does: stream order, the failure store (driven by the declared kinds),
 * graphs, profiling, the per-device compiled-kernel cache and, for source,
 * the backend's disk cache. docs/kernels.md ("Raw kernels") gives both
 * ABIs; cubert/cpu_kernel.h defines the CPU one. */

/* What a kernel's code is. */
typedef enum cube_kernel_format {
    /* cube C, from cube_kernel_create (never valid in a raw desc). */
    CUBE_KERNEL_CUBE_C = 0,
    /* CUDA C++ source for NVRTC (CUDA backend). */
    CUBE_KERNEL_CUDA_SOURCE = 1,
    /* A CUBIN, or PTX text, for the driver's module loader (CUDA backend),
     * which tells them apart. */
    CUBE_KERNEL_CUDA_BINARY = 2,
    /* C11 source for the CPU backend's compiler (CPU backend). */
    CUBE_KERNEL_C_SOURCE = 3,
    /* The bytes of an ELF shared object built for this machine (CPU
     * backend). */
    CUBE_KERNEL_SHARED_OBJECT = 4
} cube_kernel_format;

/* A declared parameter's kind. The buffer kinds decide, as CUBE_IN,
 * CUBE_OUT and CUBE_INOUT do in cube C, which buffers a launch orders
 * after which, and which carry its failure (CUBE_OUT and CUBE_INOUT). */
typedef enum cube_raw_param_kind {
    CUBE_RAW_BUFFER_IN = 1,
    CUBE_RAW_BUFFER_OUT = 2,
    CUBE_RAW_BUFFER_INOUT = 3,
    CUBE_RAW_SCALAR = 4
} cube_raw_param_kind;

typedef struct cube_raw_param {
    cube_raw_param_kind kind;
    /* A buffer: its element's size in bytes (1 or more; it sets the
     * alignment a slice must have, as cube_launch says). A scalar: its
     * size, 1, 2, 4 or 8. */
    uint32_t size;
} cube_raw_param;

typedef struct cube_raw_kernel_desc {
    /* The entry's name, a C identifier of at most 200 characters: the
     * extern "C" __global__ function (CUDA), the exported function (CPU). */
    const char *name;
    cube_kernel_format format;
    /* CUBE_KERNEL_CUDA_SOURCE, CUBE_KERNEL_C_SOURCE: NUL-terminated, not
     * empty; copied. NULL for the binary formats. */
    const char *source;
    /* CUBE_KERNEL_CUDA_BINARY, CUBE_KERNEL_SHARED_OBJECT: binary_size
     * bytes (at least one), copied; a NUL is kept after the copy, so PTX
     * need not end in one. NULL and 0 for the source formats. */
    const void *binary;
    size_t binary_size;
    /* The entry's parameters in order: at most CUBE_MAX_PARAMS;
     * params may be NULL when nparams is 0. Copied. */
    const cube_raw_param *params;
    uint32_t nparams;
    /* Units per cube along x, y, z; 0 counts as 1. CUDA: the block. CPU:
     * passed to the kernel, which loops over its units itself. */
    uint32_t cube_dim[3];
    /* Extra compiler options separated by blanks (NVRTC's, or the C
     * compiler's, placed after cubert's own), for the source formats;
     * NULL or "" for none. Must be NULL or "" for the binary formats. */
    const char *options;
} cube_raw_kernel_desc;

/* Makes a raw kernel (nothing is compiled or loaded yet). The caller owns
 * one reference; the kernel is like any other (retain, release, id, name,
 * thread safety). It runs on one backend only: the CUDA formats on CUDA,
 * the C and shared-object formats on the CPU backend. Launched on a client
 * of another backend it fails like a kernel that does not compile there:
 * cube_launch returns CUBE_ERR_UNSUPPORTED, recorded on the buffers given
 * for the declared CUBE_RAW_BUFFER_OUT and CUBE_RAW_BUFFER_INOUT
 * parameters. A compile error (CUBE_ERR_COMPILE, with the compiler's
 * log), a binary the driver or the dynamic loader refuses, an entry the
 * code does not define (CUBE_ERR_COMPILE naming it) and, on CUDA, an
 * entry whose parameters do not match the declared ones
 * (CUBE_ERR_INVALID_ARGUMENT naming the first that differs) are recorded
 * the same way: a raw kernel's parameters are known before it compiles.
 * Launch arguments are checked against the declared list (count, buffer
 * or scalar, scalar size) as cube_launch says; CUBE_LAUNCH_CHECKED has no
 * effect on raw code. Errors: CUBE_ERR_INVALID_ARGUMENT (NULL desc or out,
 * a name that is not a C identifier, a format that is not one of the four
 * raw ones, a missing or empty source or binary, or the field of the
 * other kind set, options given with a binary, nparams over
 * CUBE_MAX_PARAMS, params NULL with nparams > 0, an unknown parameter
 * kind, a buffer element size of 0, a scalar size other than 1, 2, 4 or
 * 8, a cube dimension whose product overflows 32 bits),
 * CUBE_ERR_OUT_OF_MEMORY. On error *out is NULL and nothing is kept. */
CUBE_API CUBE_MUST_USE cube_error *
cube_kernel_create_raw(const cube_raw_kernel_desc *desc, cube_kernel **out);

/* The kernel's format (CUBE_KERNEL_CUBE_C for cube C and for NULL). */
CUBE_API cube_kernel_format cube_kernel_format_of(const cube_kernel *kernel);

/* A stable 64-bit id over name, source and cube dimension (the cache key's
 * kernel part); for a raw kernel over its format, name, code, declared
 * parameters, cube dimension and options. 0 for NULL. */
CUBE_API uint64_t cube_kernel_id(const cube_kernel *kernel);
/* Borrowed; "" for NULL. */
CUBE_API const char *cube_kernel_name(const cube_kernel *kernel);

/* --- cube counts --- */

/* How many cubes to run: static (x, y, z), or dynamic: read at execution,
 * in stream order, from the first 12 bytes of a buffer (three uint32_t).
 * Zero cubes: a static count with a zero component is a mistake in the
 * call (cube_launch returns CUBE_ERR_INVALID_ARGUMENT, records nothing,
 * runs nothing, in Skip mode too). A dynamic count is only known when the
 * launch executes: one with a zero component runs no cube, and the launch
 * succeeds like one whose cubes all ran (every backend with kernels; a
 * software graph's replay of it too). Running nothing, it rewrites
 * nothing: its CUBE_OUT buffers keep any failure they carried (a launch
 * that ran clears it, a full write), and a graph replay in which such a
 * launch ran no cube leaves the failures of that launch's outputs as they
 * were. A dynamic component over the
 * device's maximum fails the launch with CUBE_ERR_RESOURCE_LIMIT, on its
 * outputs. */
typedef struct cube_count {
    uint32_t x, y, z;
    cube_handle dynamic; /* bits != 0 selects the dynamic count */
} cube_count;

static inline cube_count cube_count_static(uint32_t x, uint32_t y, uint32_t z)
{
    cube_count c = {x, y, z, {0}};
    return c;
}

static inline cube_count cube_count_dynamic(cube_handle buffer)
{
    cube_count c = {0, 0, 0, buffer};
    return c;
}

/* --- arguments --- */

typedef enum cube_arg_kind {
    CUBE_ARG_BUFFER = 1,
    CUBE_ARG_SCALAR = 2
} cube_arg_kind;

/* A kernel argument, in the order of the kernel's parameters (shared memory
 * parameters take no argument). */
typedef struct cube_arg {
    cube_arg_kind kind;
    uint32_t size; /* scalar bytes: 1, 2, 4 or 8 */
    union {
        cube_handle buffer;
        unsigned char bytes[8];
        uint64_t align_;
    } value;
} cube_arg;

static inline cube_arg cube_arg_buffer(cube_handle h)
{
    cube_arg a;
    memset(&a, 0, sizeof a);
    a.kind = CUBE_ARG_BUFFER;
    a.value.buffer = h;
    return a;
}

static inline cube_arg cube_arg_scalar(const void *value, uint32_t size)
{
    cube_arg a;
    memset(&a, 0, sizeof a);
    a.kind = CUBE_ARG_SCALAR;
    a.size = size;
    if (value && size <= sizeof a.value.bytes)
        memcpy(a.value.bytes, value, size);
    return a;
}

static inline cube_arg cube_arg_f32(float v)
{
    return cube_arg_scalar(&v, 4);
}
static inline cube_arg cube_arg_f64(double v)
{
    return cube_arg_scalar(&v, 8);
}
static inline cube_arg cube_arg_i32(int32_t v)
{
    return cube_arg_scalar(&v, 4);
}
static inline cube_arg cube_arg_u32(uint32_t v)
{
    return cube_arg_scalar(&v, 4);
}
static inline cube_arg cube_arg_i64(int64_t v)
{
    return cube_arg_scalar(&v, 8);
}
static inline cube_arg cube_arg_u64(uint64_t v)
{
    return cube_arg_scalar(&v, 8);
}

/* --- launch
 * -------------------------------------------------------------------- */

enum {
    /* Run the kernel (the default). */
    CUBE_LAUNCH_EXECUTE = 0,
    /* Do everything a first launch does — compile, validate, fill the
     * caches — then drop the launch. Buffers are untouched. */
    CUBE_LAUNCH_SKIP = 1u << 0,
    /* Bounds-checked access: CUBE_AT reads past a buffer give 0 and writes
     * past it are dropped, never touching memory out of range. */
    CUBE_LAUNCH_CHECKED = 1u << 1,
    /* Validating access, for debugging: as CUBE_LAUNCH_CHECKED, and every
     * CUBE_AT out of range is counted; when any was, the launch fails with
     * CUBE_ERR_INVALID_ARGUMENT naming the kernel, the first access's
     * buffer parameter (position and name), index and length, and the
     * count. That failure is recorded on the buffers the kernel writes,
     * like any failure of the launch (what it wrote in range stays
     * written, but reads of them fail until a launch rewrites them).
     * Cube C only (a raw kernel runs as without it). The kernel is
     * compiled apart from its checked and unchecked forms. A validating
     * launch has finished when cube_launch returns (on CUDA it waits for
     * the device, and validating launches of one kernel run one at a
     * time); a capturing stream refuses it with CUBE_ERR_GRAPH_STATE.
     * Overrides CUBE_LAUNCH_CHECKED. */
    CUBE_LAUNCH_VALIDATE = 1u << 2
};

/* Launches `kernel` over `count` cubes with `args`, on the calling thread's
 * stream. Malformed arguments (below) are returned and nothing is
 * recorded. Among them, once the kernel compiled and the arguments fit
 * its parameters (and before its limits are checked): a buffer argument
 * whose device address (its buffer's, plus a slice's offset) is not a
 * multiple of the alignment of the parameter's elements — the largest
 * power of two dividing cube_param.elem_size, at most 16, so 4 for float
 * and uint32_t, 8 for double — is CUBE_ERR_INVALID_ARGUMENT naming the
 * argument, its offset and the alignment, recorded nowhere and refused in
 * Skip mode too (on CUDA such an access is a device fault). Buffers are
 * allocated aligned; only a slice's offset can break the rule. A failure of the
 * launch itself — compile error (CUBE_ERR_COMPILE, with the compiler's log), a
 * cube dimension, unit count or shared memory over the device's limits
 * (CUBE_ERR_RESOURCE_LIMIT), an argument list that does not fit the kernel's
 * parameters (CUBE_ERR_INVALID_ARGUMENT), an input buffer that carries a
 * failure (CUBE_ERR_SEVERAL) — is returned to the caller and recorded on the
 * buffers the launch would have written, so reads of them fail: the
 * buffers given for its CUBE_OUT and CUBE_INOUT parameters (arguments are
 * matched to parameters by position, also when they do not fit them), or
 * every bound buffer when a cube C kernel did not compile (its parameters
 * are unknown). A raw kernel's parameters are declared
 * (cube_kernel_create_raw): whether or not it compiled, its failures land
 * on the buffers given for its declared CUBE_RAW_BUFFER_OUT and
 * CUBE_RAW_BUFFER_INOUT parameters, by position. A buffer given only
 * where the kernel reads or takes a scalar never carries the launch's
 * failure.
 * A compile that fails for want of the machine's resources rather than
 * through the kernel — CUBE_ERR_OUT_OF_MEMORY (host or device memory, the
 * compiler's included) or CUBE_ERR_IO (the compiler's private directory,
 * files or process could not be made, started or waited for, the
 * compiler was killed by a signal — the message names it — or failed
 * without a word of diagnostics, the compiled object could not be
 * loaded) — is returned and recorded on no
 * buffer: nothing ran, every buffer holds what it held, and the same
 * launch may be retried. CUBE_ERR_RESOURCE_LIMIT from a compile (the
 * kernel's shared memory refused by the device) is the kernel's and is
 * recorded like a compile error.
 * Under CUBE_LAUNCH_SKIP nothing is recorded: a dry run changes no buffer.
 * Failures discovered while executing land on the buffers only.
 * A buffer made in a dry run gets its memory at the first launch that
 * runs over it; if that fails, the launch returns
 * CUBE_ERR_STORAGE_MAPPING_FAILED, whose cause is the pool's answer
 * (CUBE_ERR_POOL_CAPACITY_EXCEEDED, CUBE_ERR_OUT_OF_MEMORY), records it on
 * that buffer and runs nothing.
 * Errors returned: CUBE_ERR_INVALID_ARGUMENT (NULL client/kernel, args NULL
 * with nargs > 0, unknown flag, a zero static count component, a
 * misaligned buffer argument),
 * CUBE_ERR_NOT_FOUND (released or foreign handle), CUBE_ERR_COMPILE,
 * CUBE_ERR_RESOURCE_LIMIT, CUBE_ERR_SEVERAL, CUBE_ERR_UNSUPPORTED (a
 * backend without CUBE_FEATURE_KERNELS, a raw kernel of another backend;
 * recorded like a compile error), CUBE_ERR_OUT_OF_MEMORY and
 * CUBE_ERR_IO (at compile, recorded nowhere),
 * CUBE_ERR_STORAGE_MAPPING_FAILED, CUBE_ERR_DEVICE_FAULT, CUBE_ERR_GRAPH_STATE
 * (a CUBE_LAUNCH_VALIDATE launch on a capturing stream, or a stream
 * capturing for another client; recorded nowhere). Under
 * CUBE_LAUNCH_VALIDATE an out-of-range CUBE_AT makes the launch
 * CUBE_ERR_INVALID_ARGUMENT, recorded on the buffers it writes. Caller
 * frees the error. */
CUBE_API CUBE_MUST_USE cube_error *
cube_launch(cube_client *client, cube_kernel *kernel, cube_count count,
            const cube_arg *args, size_t nargs, uint32_t mode);

#ifdef __cplusplus
}
#endif

#endif /* CUBERT_KERNEL_H */
