/* Compiling and launching cube C on OpenCL: the OpenCL prelude, the
 * device's compiler (clBuildProgram), a verified disk cache of program
 * binaries (CL_PROGRAM_BINARIES, loaded back with
 * clCreateProgramWithBinary), the signature read back from the program,
 * and the launch.
 *
 * Every program carries a stamp, as CUDA modules do: a kernel,
 * cube__stamp_kernel, that writes the entry (key and key material) the
 * program was built for. It runs with the signature kernel once after
 * loading; a cached binary whose stamp is another entry's is removed and
 * rebuilt, never run. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backends/common/kernel_source.h"
#include "backends/common/validate.h"
#include "backends/opencl/opencl_internal.h"
#include "base/clock.h"
#include "cubert/log.h"

extern const char cube_prelude_opencl[];

#define OPENCL_MAX_ARTIFACT ((size_t)256 << 20)
#define OPENCL_STAMP_CHARS 48
/* Words the signature kernel writes: the count, the shared bytes, then
 * four per parameter; the stamp's characters follow as bytes. */
#define OPENCL_SIG_WORDS ((size_t)2 + 4 * (size_t)CUBE_MAX_PARAMS)
#define OPENCL_SIG_BYTES (OPENCL_SIG_WORDS * 4 + OPENCL_STAMP_CHARS + 16)
/* Kernel arguments before the parameters: sinks, record and trap for a
 * checked or validating program, the trap alone for a plain one
 * (prelude_opencl.h). */
#define OPENCL_FIXED_ARGS 3
#define OPENCL_FIXED_ARGS_PLAIN 1

typedef struct opencl_kernel {
    cl_program program;
    cl_kernel kernel;
    cl_mem record; /* a validating program's cube__oob_rec */
    int checked;   /* built with sinks: CUBE_CHECKED or CUBE_VALIDATE */
    int validate;
    cube_mutex lock; /* the kernel object's arguments, see the header */
    /* The arguments as last set (under `lock`): a launch sets only those
     * that changed, since OpenCL keeps them on the kernel object. */
    unsigned char set[OPENCL_FIXED_ARGS + 3 * CUBE_MAX_PARAMS]
                     [8] CUBE_GUARDED_FIELD(lock);
    unsigned char
        known[OPENCL_FIXED_ARGS + 3 * CUBE_MAX_PARAMS] CUBE_GUARDED_FIELD(lock);
} opencl_kernel;

/* clSetKernelArg unless argument `i` already holds these `size` (at most
 * 8) bytes. */
static cl_int set_arg(const opencl_api *a, opencl_kernel *k, cl_uint i,
                      size_t size, const void *value) CUBE_REQUIRES(k->lock)
{
    if (k->known[i] && memcmp(k->set[i], value, size) == 0)
        return CL_SUCCESS;
    cl_int r = a->clSetKernelArg(k->kernel, i, size, value);
    k->known[i] = r == CL_SUCCESS;
    if (r == CL_SUCCESS)
        memcpy(k->set[i], value, size);
    return r;
}

/* ------------------------------------------------------------ the text */

static void stamp_text(const disk_cache_key *key, char *buf, size_t size)
{
    snprintf(buf, size, "%016" PRIx64 "%016" PRIx64 "%016" PRIx64, key->key,
             key->material_high, key->material_low);
}

/* The kernel's text followed by the stamp kernel for `key`. */
static char *stamped_source(const char *source, const disk_cache_key *key)
{
    char stamp[OPENCL_STAMP_CHARS + 1];
    stamp_text(key, stamp, sizeof stamp);
    static const char fmt[] =
        "%s\n#line 1 \"cubert-stamp\"\n"
        "__constant char cube__stamp[] = \"%s\";\n"
        "__kernel void cube__stamp_kernel(__global uchar *out)\n"
        "{\n    for (int i = 0; i < %d; i++)\n"
        "        out[i] = (uchar)cube__stamp[i];\n}\n";
    size_t n = strlen(source) + sizeof fmt + strlen(stamp) + 16;
    char *text = malloc(n);
    if (text)
        snprintf(text, n, fmt, source, stamp, OPENCL_STAMP_CHARS);
    return text;
}

/* The build options: the checking mode, and whether the source declares
 * shared arrays (prelude_opencl.h). */
static const char *build_options(uint32_t mode, const char *user)
{
    int shared = strstr(user, "CUBE_SHARED") != NULL;
    if (mode & CUBE_LAUNCH_VALIDATE)
        return shared ? "-DCUBE_VALIDATE=1 -DCUBE__SHARED_LOCAL=1"
                      : "-DCUBE_VALIDATE=1";
    if (mode & CUBE_LAUNCH_CHECKED)
        return shared ? "-DCUBE_CHECKED=1 -DCUBE__SHARED_LOCAL=1"
                      : "-DCUBE_CHECKED=1";
    return shared ? "-DCUBE_CHECKED=0 -DCUBE__SHARED_LOCAL=1"
                  : "-DCUBE_CHECKED=0";
}

/* The disk cache key: the source, the options, and who compiles it (the
 * platform, the device, its driver and OpenCL C versions). */
static void kernel_key(const opencl_server *s, const char *source,
                       const char *options, disk_cache_key *key)
{
    const void *parts[] = {source,        options,           s->platform_name,
                           s->props.name, s->driver_version, s->c_version};
    size_t lens[6];
    for (int i = 0; i < 6; i++)
        lens[i] = strlen(parts[i]);
    disk_cache_key_make(parts, lens, 6, key);
}

/* ------------------------------------------------------------ building */

static cube_error *build_log(opencl_server *s, cl_program program,
                             const char *name, cl_int r)
{
    size_t len = 0;
    s->api->clGetProgramBuildInfo(program, s->device, CL_PROGRAM_BUILD_LOG, 0,
                                  NULL, &len);
    char *log = malloc(len + 1);
    if (log) {
        log[0] = 0;
        if (len)
            s->api->clGetProgramBuildInfo(program, s->device,
                                          CL_PROGRAM_BUILD_LOG, len, log, NULL);
        log[len] = 0;
    }
    cube_error *err = cube_error_new(
        r == CL_OUT_OF_HOST_MEMORY ? CUBE_ERR_OUT_OF_MEMORY : CUBE_ERR_COMPILE,
        "kernel '%s': the OpenCL compiler of %s refused it (%s)", name,
        s->props.name, opencl_error_name(r));
    if (log && *log)
        cube_error_set_log(err, log);
    free(log);
    return err;
}

/* The program's binary for the device, a new buffer. */
static int program_binary(opencl_server *s, cl_program program,
                          unsigned char **bytes, size_t *len)
{
    size_t size = 0;
    *bytes = NULL;
    if (s->api->clGetProgramInfo(program, CL_PROGRAM_BINARY_SIZES, sizeof size,
                                 &size, NULL) != CL_SUCCESS ||
        size == 0 || size > OPENCL_MAX_ARTIFACT)
        return 0;
    unsigned char *buf = malloc(size);
    if (!buf)
        return 0;
    if (s->api->clGetProgramInfo(program, CL_PROGRAM_BINARIES, sizeof buf, &buf,
                                 NULL) != CL_SUCCESS) {
        free(buf);
        return 0;
    }
    *bytes = buf;
    *len = size;
    return 1;
}

/* Builds `program` (from source or a binary) with `options`. */
static cube_error *build(opencl_server *s, cl_program program, const char *name,
                         const char *options)
{
    cl_int r =
        s->api->clBuildProgram(program, 1, &s->device, options, NULL, NULL);
    if (r != CL_SUCCESS)
        return build_log(s, program, name, r);
    return NULL;
}

/* ------------------------------------------------------------ the signature */

/* Runs the signature and stamp kernels once and reads what they wrote
 * into `words` (OPENCL_SIG_BYTES bytes). */
static cube_error *read_signature(opencl_server *s, cl_program program,
                                  const char *name, unsigned char *words)
{
    const opencl_api *a = s->api;
    char sym[160];
    snprintf(sym, sizeof sym, "cube__sig_%s", name);
    cl_int r = CL_SUCCESS;
    cl_kernel sig = a->clCreateKernel(program, sym, &r);
    if (!sig)
        return cube_error_new(CUBE_ERR_COMPILE,
                              "kernel '%s': the source defines no "
                              "CUBE_KERNEL(%s, ...)",
                              name, name);
    cl_kernel stamp = a->clCreateKernel(program, "cube__stamp_kernel", &r);
    cl_mem out = a->clCreateBuffer(s->context, CL_MEM_READ_WRITE,
                                   OPENCL_SIG_BYTES, NULL, &r);
    cl_command_queue q = a->clCreateCommandQueue(s->context, s->device, 0, &r);
    cube_error *err = NULL;
    if (!stamp || !out || !q)
        err = opencl_fail(r, CUBE_ERR_COMPILE,
                          "kernel '%s': reading its signature", name);
    size_t one = 1;
    if (!err) {
        cl_mem stamp_at = out;
        r = a->clSetKernelArg(sig, 0, OPENCL_HANDLE_SIZE, &out);
        if (r == CL_SUCCESS)
            r = a->clSetKernelArg(stamp, 0, OPENCL_HANDLE_SIZE, &stamp_at);
        unsigned char zero[OPENCL_SIG_BYTES] = {0};
        if (r == CL_SUCCESS)
            r = a->clEnqueueWriteBuffer(q, out, CL_TRUE, 0, sizeof zero, zero,
                                        0, NULL, NULL);
        /* The stamp goes first, then the signature over its own words
         * (past the stamp's bytes). */
        if (r == CL_SUCCESS)
            r = a->clEnqueueNDRangeKernel(q, stamp, 1, NULL, &one, &one, 0,
                                          NULL, NULL);
        if (r == CL_SUCCESS)
            r = a->clEnqueueReadBuffer(q, out, CL_TRUE, 0, OPENCL_STAMP_CHARS,
                                       words + OPENCL_SIG_WORDS * 4, 0, NULL,
                                       NULL);
        if (r == CL_SUCCESS)
            r = a->clEnqueueNDRangeKernel(q, sig, 1, NULL, &one, &one, 0, NULL,
                                          NULL);
        if (r == CL_SUCCESS)
            r = a->clEnqueueReadBuffer(q, out, CL_TRUE, 0, OPENCL_SIG_WORDS * 4,
                                       words, 0, NULL, NULL);
        if (r != CL_SUCCESS)
            err =
                opencl_fail(r, CUBE_ERR_COMPILE,
                            "kernel '%s': running its signature kernel", name);
    }
    if (q)
        a->clReleaseCommandQueue(q);
    if (out)
        a->clReleaseMemObject(out);
    if (stamp)
        a->clReleaseKernel(stamp);
    a->clReleaseKernel(sig);
    return err;
}

/* Fills *out's signature from the words; NULL, or why they are wrong. */
static cube_error *parse_signature(const char *name, const unsigned char *raw,
                                   cube_compiled *out)
{
    uint32_t w[OPENCL_SIG_WORDS];
    memcpy(w, raw, sizeof w);
    if (w[0] > CUBE_MAX_PARAMS)
        return cube_error_new(CUBE_ERR_COMPILE,
                              "kernel '%s' has %u parameters, over %d", name,
                              w[0], CUBE_MAX_PARAMS);
    out->param_count = w[0];
    out->shared_bytes = w[1];
    for (uint32_t i = 0; i < w[0]; i++) {
        const uint32_t *p = &w[2 + 4 * i];
        out->params[i].kind = (cube_param_kind)p[0];
        out->params[i].elem_size = p[1];
        out->params[i].extent = (uint64_t)p[2] | (uint64_t)p[3] << 32;
    }
    return NULL;
}

/* ------------------------------------------------------------ loading */

/* Makes k's program from `bytes` (a binary, or NULL for `source`), builds
 * it, checks its stamp against `key` and reads its signature. On a
 * mismatch *wrong says why and the result is NULL. */
static cube_error *load_program(opencl_server *s, const char *name,
                                const char *source, const unsigned char *bytes,
                                size_t len, const char *options,
                                const disk_cache_key *key, opencl_kernel *k,
                                cube_compiled *out, const char **wrong)
{
    const opencl_api *a = s->api;
    cl_int r = CL_SUCCESS, status = CL_SUCCESS;
    *wrong = NULL;
    if (bytes)
        k->program = a->clCreateProgramWithBinary(s->context, 1, &s->device,
                                                  &len, &bytes, &status, &r);
    else
        k->program =
            a->clCreateProgramWithSource(s->context, 1, &source, NULL, &r);
    if (!k->program) {
        if (bytes) {
            *wrong = "the driver refuses the binary";
            return NULL;
        }
        return opencl_fail(r, CUBE_ERR_COMPILE, "kernel '%s': the program",
                           name);
    }
    cube_error *err = build(s, k->program, name, options);
    if (err && bytes) {
        cube_error_free(err);
        *wrong = "the driver cannot build the binary";
        return NULL;
    }
    unsigned char words[OPENCL_SIG_BYTES];
    if (!err)
        err = read_signature(s, k->program, name, words);
    if (!err) {
        char stamp[OPENCL_STAMP_CHARS + 1];
        stamp_text(key, stamp, sizeof stamp);
        if (memcmp(words + OPENCL_SIG_WORDS * 4, stamp, OPENCL_STAMP_CHARS) !=
            0) {
            *wrong = "its program's stamp names another entry";
            return NULL;
        }
        err = parse_signature(name, words, out);
    }
    char sym[160];
    snprintf(sym, sizeof sym, "cube__kernel_%s", name);
    if (!err) {
        k->kernel = a->clCreateKernel(k->program, sym, &r);
        if (!k->kernel)
            err = opencl_fail(r, CUBE_ERR_COMPILE, "kernel '%s': its entry",
                              name);
    }
    return err;
}

static void program_drop(opencl_server *s, opencl_kernel *k)
{
    if (k->kernel)
        s->api->clReleaseKernel(k->kernel);
    if (k->program)
        s->api->clReleaseProgram(k->program);
    k->kernel = NULL;
    k->program = NULL;
}

/* 1 when the disk cache held a good binary for `key`, now loaded. */
static int load_cached(opencl_server *s, const char *name, const char *options,
                       const disk_cache_key *key, opencl_kernel *k,
                       cube_compiled *out)
{
    unsigned char *bytes = NULL;
    size_t len = 0;
    if (disk_cache_get(s->cache, key, OPENCL_MAX_ARTIFACT, &bytes, &len) !=
        DISK_CACHE_HIT)
        return 0;
    const char *wrong = NULL;
    cube_error *err =
        load_program(s, name, NULL, bytes, len, options, key, k, out, &wrong);
    free(bytes);
    if (!err && !wrong)
        return 1;
    if (wrong) {
        cube_log_write(CUBE_LOG_WARN, "compile",
                       "disk cache entry %s is not the kernel '%s' it is "
                       "filed under (%s); removing it and rebuilding",
                       key->hex, name, wrong);
        disk_cache_remove(s->cache, key);
    } else {
        cube_log_write(CUBE_LOG_WARN, "compile",
                       "kernel '%s': cached program refused (%s); rebuilding",
                       name, cube_error_message(err));
        cube_error_free(err);
    }
    program_drop(s, k);
    memset(out, 0, sizeof *out);
    return 0;
}

static cube_error *build_and_cache(opencl_server *s, const char *name,
                                   const char *source, const char *options,
                                   const disk_cache_key *key, opencl_kernel *k,
                                   cube_compiled *out)
{
    const char *wrong = NULL;
    cube_error *err =
        load_program(s, name, source, NULL, 0, options, key, k, out, &wrong);
    if (!err && wrong)
        err = cube_error_new(CUBE_ERR_INTERNAL,
                             "kernel '%s': the program it built is not its "
                             "own (%s)",
                             name, wrong);
    unsigned char *bytes = NULL;
    size_t len = 0;
    if (!err && program_binary(s, k->program, &bytes, &len))
        disk_cache_put(s->cache, key, bytes, len);
    free(bytes);
    return err;
}

static cube_error *compile_program(opencl_server *s, const cube_kernel *kernel,
                                   uint32_t mode, opencl_kernel *k,
                                   cube_compiled *out)
{
    const char *name = cube_kernel_name(kernel);
    const char *preludes[] = {cube_prelude_opencl};
    char *source =
        kernel_source_cube_c(preludes, 1, name, cube_kernel_source(kernel));
    if (!source)
        return cube_error_new(CUBE_ERR_OUT_OF_MEMORY, "kernel source");
    const char *options = build_options(mode, cube_kernel_source(kernel));
    disk_cache_key key;
    kernel_key(s, source, options, &key);
    char *stamped = stamped_source(source, &key);
    free(source);
    if (!stamped)
        return cube_error_new(CUBE_ERR_OUT_OF_MEMORY, "kernel source");
    double t0 = cube_clock_ms();
    cube_error *err = NULL;
    int from_disk = load_cached(s, name, options, &key, k, out);
    if (!from_disk)
        err = build_and_cache(s, name, stamped, options, &key, k, out);
    free(stamped);
    out->compile_ms = cube_clock_ms() - t0;
    out->from_disk_cache = from_disk;
    if (!err)
        cube_log_write(CUBE_LOG_DEBUG, "compile",
                       "kernel '%s' for %s: %s in %.2f ms", name, s->props.name,
                       from_disk ? "loaded from the disk cache" : "compiled",
                       out->compile_ms);
    return err;
}

cube_error *opencl_compile(cube_server *server, const cube_kernel *kernel,
                           uint32_t mode, cube_compiled *out)
{
    opencl_server *s = (opencl_server *)server;
    memset(out, 0, sizeof *out);
    if (cube_kernel_format_of(kernel) != CUBE_KERNEL_CUBE_C)
        return cube_error_new(CUBE_ERR_UNSUPPORTED,
                              "kernel '%s' is a raw kernel of another "
                              "backend: the OpenCL backend runs cube C",
                              cube_kernel_name(kernel));
    cube_error *err = opencl_fault_check(s);
    if (err)
        return err;
    opencl_kernel *k = calloc(1, sizeof *k);
    if (!k)
        return cube_error_new(CUBE_ERR_OUT_OF_MEMORY, "kernel");
    k->validate = (mode & CUBE_LAUNCH_VALIDATE) != 0;
    k->checked = k->validate || (mode & CUBE_LAUNCH_CHECKED) != 0;
    err = compile_program(s, kernel, mode, k, out);
    if (!err && k->validate) {
        cl_int r = CL_SUCCESS;
        k->record = s->api->clCreateBuffer(s->context, CL_MEM_READ_WRITE,
                                           sizeof(validate_record), NULL, &r);
        if (!k->record)
            err = opencl_fail(r, CUBE_ERR_OUT_OF_MEMORY,
                              "kernel '%s': its validating record",
                              cube_kernel_name(kernel));
    }
    if (err) {
        program_drop(s, k);
        free(k);
        double ms = out->compile_ms;
        memset(out, 0, sizeof *out);
        out->compile_ms = ms;
        return err;
    }
    cube_mutex_init(&k->lock);
    const char *user = cube_kernel_source(kernel);
    out->uses_cube_sync = strstr(user, "cube_sync") != NULL;
    if (strstr(user, "cube_trap"))
        atomic_fetch_add(&s->trap_kernels, 1);
    out->impl = k;
    return NULL;
}

void opencl_compiled_release(cube_server *server, cube_compiled *compiled)
{
    opencl_server *s = (opencl_server *)server;
    opencl_kernel *k = compiled->impl;
    if (!k)
        return;
    program_drop(s, k);
    if (k->record)
        s->api->clReleaseMemObject(k->record);
    cube_mutex_destroy(&k->lock);
    free(k);
    compiled->impl = NULL;
}

/* ------------------------------------------------------------ launching */

/* A dynamic count: the three words read from the device, in stream order. */
static cube_error *read_count(opencl_server *s, cube_server_stream *stream,
                              const cube_binding *b, uint32_t count[3])
{
    cube_copy_op op;
    memset(&op, 0, sizeof op);
    op.binding = *b;
    op.rank = 1;
    op.elem_size = 4;
    op.shape[0] = 3;
    op.byte_strides[0] = 4;
    op.bytes = 12;
    op.contiguous = 1;
    void *dst[1] = {count};
    cube_pending *pending = NULL;
    return opencl_read(&s->base, stream, &op, 1, dst, &pending);
}

/* The arguments after the fixed three, from the dispatch. */
static cl_int set_params(const opencl_api *a, opencl_server *s,
                         opencl_kernel *k, const cube_dispatch *d)
    CUBE_REQUIRES(k->lock)
{
    const cube_compiled *cc = d->compiled;
    cl_uint arg = k->checked ? OPENCL_FIXED_ARGS : OPENCL_FIXED_ARGS_PLAIN;
    cl_int r = CL_SUCCESS;
    for (uint32_t p = 0; p < cc->param_count && r == CL_SUCCESS; p++) {
        const cube_param *param = &cc->params[p];
        if (param->kind == CUBE_PARAM_SHARED)
            continue;
        if (param->kind == CUBE_PARAM_SCALAR) {
            r = set_arg(a, k, arg++, param->elem_size, d->scalars[p]);
            continue;
        }
        const cube_binding *b = &d->bindings[p];
        cl_ulong offset = 0;
        cl_mem mem = opencl_page_of(s, b->storage->address + b->offset,
                                    (uint64_t *)&offset);
        cl_ulong len = param->elem_size ? b->size / param->elem_size : 0;
        r = set_arg(a, k, arg++, OPENCL_HANDLE_SIZE, &mem);
        if (r == CL_SUCCESS)
            r = set_arg(a, k, arg++, sizeof offset, &offset);
        if (r == CL_SUCCESS)
            r = set_arg(a, k, arg++, sizeof len, &len);
    }
    return r;
}

/* The dimensions a launch needs: fewer where the last axes are 1 (the
 * positions along them are 0 either way), which drivers run faster. */
static cl_uint work_dim(const size_t global[3])
{
    return global[2] > 1 ? 3 : global[1] > 1 ? 2 : 1;
}

static cube_error *enqueue_locked(opencl_server *s, cube_server_stream *stream,
                                  opencl_kernel *k, const cube_dispatch *d,
                                  const size_t global[3], const size_t local[3],
                                  cl_mem sinks) CUBE_REQUIRES(k->lock)
{
    const opencl_api *a = s->api;
    opencl_stream *st = stream->impl;
    cl_mem record = k->record;
    cl_int r = CL_SUCCESS;
    if (k->checked) {
        r = set_arg(a, k, 0, OPENCL_HANDLE_SIZE, &sinks);
        if (r == CL_SUCCESS)
            r = set_arg(a, k, 1, OPENCL_HANDLE_SIZE, &record);
    }
    if (r == CL_SUCCESS)
        r = set_arg(a, k, k->checked ? 2 : 0, OPENCL_HANDLE_SIZE, &s->trap);
    if (r == CL_SUCCESS)
        r = set_params(a, s, k, d);
    if (r != CL_SUCCESS)
        return opencl_fail(r, CUBE_ERR_INTERNAL,
                           "kernel: setting its arguments");
    opencl_wait_list w;
    cube_error *err = opencl_waits(s, stream, &w);
    if (err)
        return err;
    if (record) {
        validate_record zero;
        memset(&zero, 0, sizeof zero);
        r = a->clEnqueueWriteBuffer(st->queue, record, CL_TRUE, 0, sizeof zero,
                                    &zero, 0, NULL, NULL);
    }
    if (r == CL_SUCCESS)
        r = a->clEnqueueNDRangeKernel(st->queue, k->kernel, work_dim(global),
                                      NULL, global, local, w.n,
                                      w.n ? w.events : NULL, NULL);
    opencl_waits_release(s, &w);
    opencl_enqueued(st);
    if (r == CL_INVALID_WORK_GROUP_SIZE)
        return opencl_fail(r, CUBE_ERR_RESOURCE_LIMIT,
                           "the device runs no cube of %zux%zux%zu units of "
                           "this kernel",
                           local[0], local[1], local[2]);
    if (r != CL_SUCCESS)
        return opencl_fail(r, CUBE_ERR_INTERNAL, "enqueueing the kernel");
    if (!record)
        return NULL;
    validate_record rec;
    r = a->clEnqueueReadBuffer(st->queue, record, CL_TRUE, 0, sizeof rec, &rec,
                               0, NULL, NULL);
    if (r != CL_SUCCESS)
        return opencl_fail(r, CUBE_ERR_DEVICE_FAULT,
                           "reading the validating record");
    return validate_report(d->compiled, &rec);
}

cube_error *opencl_launch(cube_server *server, cube_server_stream *stream,
                          const cube_dispatch *dispatch)
{
    opencl_server *s = (opencl_server *)server;
    opencl_kernel *k = dispatch->compiled->impl;
    cube_error *err = opencl_fault_check(s);
    if (err)
        return err;
    uint32_t count[3] = {dispatch->cube_count[0], dispatch->cube_count[1],
                         dispatch->cube_count[2]};
    if (dispatch->count_buffer) {
        err = read_count(s, stream, dispatch->count_buffer, count);
        if (err)
            return err;
        if (!count[0] || !count[1] || !count[2]) {
            *dispatch->ran_nothing = 1;
            return NULL;
        }
        for (int i = 0; i < 3; i++)
            if (count[i] > s->props.max_cube_count[i])
                return cube_error_new(CUBE_ERR_RESOURCE_LIMIT,
                                      "a dynamic cube count of %u along "
                                      "axis %d is over the device's %u",
                                      count[i], i, s->props.max_cube_count[i]);
    }
    size_t global[3], local[3];
    uint64_t units = 1;
    for (int i = 0; i < 3; i++) {
        local[i] = dispatch->cube_dim[i];
        global[i] = (size_t)count[i] * dispatch->cube_dim[i];
        units *= global[i];
    }
    if (units == 0)
        return NULL;
    cl_mem sinks = NULL;
    if (k->checked) {
        err = opencl_sinks(s, stream->impl, units * (k->validate ? 72 : 64),
                           &sinks);
        if (err)
            return err;
    }
    cube_mutex_lock(&k->lock);
    err = enqueue_locked(s, stream, k, dispatch, global, local, sinks);
    cube_mutex_unlock(&k->lock);
    return err;
}
