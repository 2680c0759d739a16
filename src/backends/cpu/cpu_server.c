/* The CPU backend: host memory, kernels JIT-compiled by the system C
 * compiler, cubes across a worker pool, units as a loop or as fibers.
 *
 * Work runs in stream order on the calling thread (helped by the pool), so
 * every operation has finished when its call returns: sync and flush have
 * nothing left to wait for, and a dynamic cube count is read after the work
 * that wrote it. */
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "backends/common/host_memory.h"
#include "backends/common/kernel_source.h"
#include "backends/common/properties.h"
#include "backends/common/validate.h"
#include "backends/cpu/barrier_pass.h"
#include "backends/cpu/cpu_jit.h"
#include "backends/cpu/cpu_mpi.h"
#include "backends/cpu/cpu_portability.h"
#include "backends/cpu/cpu_workers.h"
#include "base/clock.h"
#include "cubert/backend/config.h"
#include "cubert/backend/errors.h"
#include "cubert/backend/server.h"
#include "cubert/cpu_kernel.h"
#include "cubert/log.h"

extern const char cube_prelude_cpu[];
/* cubert/cpu_kernel.h, put in front of raw C source. */
extern const char cube_prelude_cpu_raw[];

#define CPU_ABI 2
#define CPU_ALIGNMENT 64
#define CPU_MAX_UNITS 1024
#define CPU_MAX_SHARED ((uint64_t)64 * 1024)
#define CPU_FIBER_STACK ((size_t)128 * 1024)

/* Must match cube_cpu_launch in src/backends/cpu/prelude_cpu.h. */
typedef struct cpu_launch_abi {
    unsigned int dim[3];
    unsigned int count[3];
    void *const *ptr;
    const unsigned long long *len;
    void *oob; /* a validating launch's record (validate_record), else NULL */
} cpu_launch_abi;

typedef void (*cpu_run_fn)(const cpu_launch_abi *, unsigned, unsigned, void *);
typedef void (*cpu_unit_fn)(const cpu_launch_abi *, unsigned, unsigned, void *);
typedef void (*cpu_cubes_fn)(const cpu_launch_abi *, unsigned, unsigned,
                             void *);

typedef struct cpu_kernel_impl {
    cpu_module *module;
    cpu_run_fn run;
    cpu_unit_fn unit;
    /* A kernel with cube_sync() the barrier pass rewrote: runs whole cubes
     * of dimension cubes_dim with the units as loops; else NULL (fibers). */
    cpu_cubes_fn cubes;
    uint32_t cubes_dim[3];
    /* A raw kernel's entry (cubert/cpu_kernel.h), called once per cube;
     * run and unit are then NULL. */
    cube_cpu_kernel_fn raw;
    /* Nanoseconds one cube took when a launch last ran on one thread (0:
     * not yet known): how a launch of few units decides whether waking
     * the workers is worth it. Any launch may update it. */
    atomic_uint_fast64_t cube_ns;
} cpu_kernel_impl;

typedef struct cpu_server {
    cube_server base;
    cpu_jit *jit;
    cpu_portability *port; /* NULL: no memory for it, nothing checked */
    cpu_workers *workers;
    cube_properties props;
} cpu_server;

static void *addr(const cube_binding *b)
{
    return (unsigned char *)(uintptr_t)b->storage->address + b->offset;
}

/* Host-clock profiling (server.h): while a window is open on the stream,
 * the time each launch, read and write takes is added to its busy_ns
 * (host_busy_begin/end, backends/common/host_memory.c). */

/* --- properties --- */

static void read_cpu_name(char *out, size_t cap)
{
    snprintf(out, cap, "host CPU");
    FILE *f = fopen("/proc/cpuinfo", "r");
    if (!f)
        return;
    char line[512];
    while (fgets(line, sizeof line, f)) {
        if (strncmp(line, "model name", 10) == 0) {
            char *colon = strchr(line, ':');
            if (colon) {
                colon++;
                while (*colon == ' ')
                    colon++;
                colon[strcspn(colon, "\n")] = '\0';
                snprintf(out, cap, "%s", colon);
            }
            break;
        }
    }
    fclose(f);
}

/* Virtual devices: $CUBERT_CPU_DEVICES, else one. */
static uint32_t cpu_devices(void)
{
    cube_config_value v;
    if (cube_config_lookup("cpu_devices", &v) == 0 &&
        v.origin != CUBE_CONFIG_UNSET && v.number > 0)
        return v.number;
    return 1;
}

/* A device's memory: the host's physical memory shared evenly among the
 * virtual devices, in whole pages, so that the devices' figures add up to
 * the machine as N accelerators' would (two devices claiming the whole
 * host each would invite a program to place twice the machine's memory).
 * The memory manager sizes the pools and the largest buffer by it. */
static uint64_t cpu_device_memory(void)
{
    long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
    uint64_t size = page > 0 ? (uint64_t)page : 4096u;
    uint64_t host = (uint64_t)1 << 32; /* when the host will not say */
    if (pages > 0 && page > 0)
        host = (uint64_t)pages * size;
    uint64_t share = host / cpu_devices() / size * size;
    return share ? share : size;
}

static void fill_properties(cube_properties *p, uint32_t threads)
{
    properties_defaults(p, "cpu", cpu_device_memory(), CPU_ALIGNMENT);
    read_cpu_name(p->name, sizeof p->name);
#if defined(__x86_64__)
    snprintf(p->architecture, sizeof p->architecture, "x86_64");
#elif defined(__aarch64__)
    snprintf(p->architecture, sizeof p->architecture, "aarch64");
#else
    snprintf(p->architecture, sizeof p->architecture, "unknown");
#endif
    p->max_cube_dim[0] = CPU_MAX_UNITS;
    p->max_cube_dim[1] = CPU_MAX_UNITS;
    p->max_cube_dim[2] = 64;
    p->max_units_per_cube = CPU_MAX_UNITS;
    p->max_shared_memory = CPU_MAX_SHARED;
    p->compute_units = threads;
    /* Graphs are software graphs, in the client. */
    p->features = PROPERTIES_CUBE_C_FEATURES | CUBE_FEATURE_HOST_MEMORY;
}

static cube_error *cpu_properties(cube_server *server, cube_properties *out)
{
    *out = ((cpu_server *)server)->props;
    return NULL;
}

/* --- streams and memory ---
 *
 * Work runs at issue time, so a stream needs no state here; its memory is
 * aligned host memory, pooled by the stream's manager (the client's):
 * host_stream_open opens the streams. */

/* --- copies --- */

/* Reads, writes, sync and flush are done at call time:
 * backends/common/host_memory.c (work finishes before the call that
 * issued it returns, so sync and flush have nothing left to wait for). */

/* --- compilation --- */

/* Set by cube_trap() on the thread that ran the unit; run_range turns it
 * into the launch's device fault. */
static _Thread_local int cpu_trapped;

static void cpu_trap(void)
{
    cpu_trapped = 1;
}

static void cpu_sync_yield(void)
{
    cpu_fibers_yield(cpu_fibers_current());
}

/* Whether the source calls cube_sync(). Any mention counts: a false
 * positive only costs speed (fibers), a miss would break the barrier. */
static int mentions_cube_sync(const char *source)
{
    return strstr(source, "cube_sync") != NULL;
}

/* A launch of this many units or more runs over the workers. */
#define CPU_SPREAD_UNITS 16384u
/* A launch of fewer units runs over the workers too when its cubes took
 * this long together last time (about ten wake-ups of a worker). */
#define CPU_SPREAD_NS 50000u

static void *symbol(cpu_module *m, const char *prefix, const char *name)
{
    char buf[256];
    snprintf(buf, sizeof buf, "%s%s", prefix, name);
    return cpu_module_symbol(m, buf);
}

/* A kernel's state, owning module `m`; for want of memory, `m` is closed
 * and the error returned. */
static cube_error *cpu_kernel_impl_new(cpu_module *m, cpu_kernel_impl **out)
{
    *out = calloc(1, sizeof **out);
    if (!*out) {
        cpu_module_close(m);
        return cube_error_new(CUBE_ERR_OUT_OF_MEMORY, "kernel");
    }
    (*out)->module = m;
    return NULL;
}

/* A raw kernel: C source through the JIT (after the ABI header, with the
 * kernel's options as the last flags, cached on disk like cube C), or a
 * shared object loaded from its bytes; then its entry by name. Its
 * signature is the declared one. */
static cube_error *cpu_compile_raw(cpu_server *s, const cube_kernel *kernel,
                                   cube_compiled *out)
{
    const char *name = cube_kernel_name(kernel);
    size_t size = 0;
    const void *code = cube_kernel_code(kernel, &size);
    int is_source = cube_kernel_format_of(kernel) == CUBE_KERNEL_C_SOURCE;
    double t0 = cube_clock_ms();
    cpu_module *m = NULL;
    cpu_jit_origin origin = CPU_JIT_COMPILED;
    cube_error *err = NULL;
    if (is_source) {
        char *source =
            kernel_source_raw_c(cube_prelude_cpu_raw, name, (const char *)code);
        if (!source)
            return cube_error_new(CUBE_ERR_OUT_OF_MEMORY, "kernel source");
        err = cpu_jit_load(s->jit, source, cube_kernel_options(kernel), &m,
                           &origin);
        free(source);
    } else {
        err = cpu_jit_load_object(s->jit, code, size, &m);
    }
    if (err)
        return cube_error_prefix(err, "%s kernel '%s'",
                                 is_source ? "compiling" : "loading", name);
    cube_cpu_kernel_fn fn = (cube_cpu_kernel_fn)cpu_module_symbol(m, name);
    if (!fn) {
        cpu_module_close(m);
        return cube_error_new(
            CUBE_ERR_COMPILE, "kernel '%s': the %s exports no symbol '%s'",
            name, is_source ? "compiled source" : "shared object", name);
    }
    cpu_kernel_impl *impl = NULL;
    err = cpu_kernel_impl_new(m, &impl);
    if (err)
        return err;
    impl->raw = fn;
    *out = *cube_kernel_declared(kernel);
    out->compile_ms = cube_clock_ms() - t0;
    out->from_disk_cache = origin == CPU_JIT_DISK;
    out->impl = impl;
    return NULL;
}

/* The barrier pass as the JIT's derivation: its reason kept on refusal. */
typedef struct barrier_pass_job {
    const char *name;
    unsigned dim[3];
    int ran;   /* the pass ran (no disk hit) */
    double ms; /* how long it took */
    char why[256];
} barrier_pass_job;

static int barrier_pass_derive(void *ctx, const char *source, char **text)
{
    barrier_pass_job *p = ctx;
    char *extra = NULL;
    double t0 = cube_clock_ms();
    cpu_barrier_pass_status st = cpu_barrier_pass_transform(
        source, p->name, p->dim, &extra, p->why, sizeof p->why);
    p->ms = cube_clock_ms() - t0;
    p->ran = 1;
    *text = NULL;
    if (st != CPU_BARRIER_PASS_DONE)
        return -1;
    size_t n = strlen(source) + strlen(extra) + 2;
    *text = malloc(n);
    if (*text)
        snprintf(*text, n, "%s\n%s", source, extra);
    else
        snprintf(p->why, sizeof p->why, "out of memory");
    free(extra);
    return *text ? 0 : -1;
}

/* A kernel that calls cube_sync(): its body rewritten by the barrier pass
 * (barrier_pass.c) and compiled with the cube entry added, or nothing
 * (*out NULL) when the pass refuses it, is switched off, or its output
 * does not compile; the caller then compiles `source` as it is and the
 * units run as fibers. The reason is logged, once per compile. Errors:
 * those of cpu_jit_load other than CUBE_ERR_COMPILE. */
static cube_error *cpu_compile_unit_loops(cpu_server *s, const char *name,
                                          const char *source, const char *flags,
                                          const uint32_t dim[3],
                                          cpu_module **out,
                                          cpu_jit_origin *origin,
                                          const char **what)
{
    *out = NULL;
    *what = "refused";
    cube_config_value v;
    if (cube_config_lookup("cpu_barriers", &v) == 0 &&
        v.origin != CUBE_CONFIG_UNSET && v.number == CPU_BARRIERS_FIBERS) {
        *what = "off";
        cube_log_write(CUBE_LOG_INFO, "compile",
                       "kernel '%s' runs its units as fibers: cpu_barriers "
                       "is fibers",
                       name);
        return NULL;
    }
    barrier_pass_job pass = {name, {dim[0], dim[1], dim[2]}, 0, 0.0, ""};
    /* The cache key names the pass and the cube dimension beside the
     * source: a disk hit skips the parse (10-40 ms with libclang). */
    char variant[96];
    snprintf(variant, sizeof variant, "unit loops %d, cube %ux%ux%u",
             CPU_BARRIER_PASS_VERSION, dim[0], dim[1], dim[2]);
    cpu_module *m = NULL;
    cube_error *err = cpu_jit_load_derived(
        s->jit, source, flags, variant, barrier_pass_derive, &pass, &m, origin);
    if (!err && !m) {
        cube_log_write(CUBE_LOG_INFO, "compile",
                       "kernel '%s' runs its units as fibers: %s", name,
                       pass.why);
        return NULL;
    }
    if (err && cube_error_code(err) == CUBE_ERR_COMPILE) {
        cube_log_write(CUBE_LOG_INFO, "compile",
                       "kernel '%s' runs its units as fibers: its rewritten "
                       "source does not compile",
                       name);
        cube_log_write(CUBE_LOG_DEBUG, "compile", "%s",
                       cube_error_log(err) ? cube_error_log(err) : "");
        cube_error_free(err);
        return NULL;
    }
    if (err)
        return err;
    const unsigned *cdim = symbol(m, "cube__cubes_dim_", name);
    if (!symbol(m, "cube__cubes_", name) || !cdim || cdim[0] != dim[0] ||
        cdim[1] != dim[1] || cdim[2] != dim[2]) {
        cube_log_write(CUBE_LOG_INFO, "compile",
                       "kernel '%s' runs its units as fibers: its rewritten "
                       "source lacks the cube entry",
                       name);
        cpu_module_close(m);
        return NULL;
    }
    *what = pass.ran ? "ran" : "disk";
    if (pass.ran)
        cube_log_write(CUBE_LOG_INFO, "compile",
                       "kernel '%s' runs its units as loops between barriers "
                       "(cube dimension %ux%ux%u, pass %.1f ms)",
                       name, dim[0], dim[1], dim[2], pass.ms);
    else
        cube_log_write(CUBE_LOG_INFO, "compile",
                       "kernel '%s' runs its units as loops between barriers "
                       "(cube dimension %ux%ux%u, from the disk cache)",
                       name, dim[0], dim[1], dim[2]);
    *out = m;
    return NULL;
}

static cube_error *cpu_compile(cube_server *server, const cube_kernel *kernel,
                               uint32_t mode, cube_compiled *out)
{
    cpu_server *s = (cpu_server *)server;
    const char *name = cube_kernel_name(kernel);
    switch (cube_kernel_format_of(kernel)) {
    case CUBE_KERNEL_CUBE_C: break;
    case CUBE_KERNEL_C_SOURCE:
    case CUBE_KERNEL_SHARED_OBJECT: return cpu_compile_raw(s, kernel, out);
    default:
        return cube_error_new(CUBE_ERR_UNSUPPORTED,
                              "kernel '%s' is CUDA code: the CPU backend runs "
                              "cube C, C source and shared objects",
                              name);
    }
    const char *user = cube_kernel_source(kernel);
    const char *preludes[] = {cube_prelude_cpu};
    char *source = kernel_source_cube_c(preludes, 1, name, user);
    if (!source)
        return cube_error_new(CUBE_ERR_OUT_OF_MEMORY, "kernel source");
    const char *flags = (mode & CUBE_LAUNCH_VALIDATE)
                            ? "-DCUBE_CHECKED=0 -DCUBE_VALIDATE=1"
                        : (mode & CUBE_LAUNCH_CHECKED) ? "-DCUBE_CHECKED=1"
                                                       : "-DCUBE_CHECKED=0";
    double t0 = cube_clock_ms();
    cpu_module *m = NULL;
    cpu_jit_origin origin = CPU_JIT_COMPILED;
    uint32_t dim[3];
    cube_kernel_cube_dim(kernel, dim);
    uint64_t units = (uint64_t)dim[0] * dim[1] * dim[2];
    cube_error *err = NULL;
    const char *barrier_pass = NULL;
    /* A validating compile keeps the fibers: the barrier pass would have
     * to carry the parameters' hidden positions across its loops. */
    if (mentions_cube_sync(user) && units > 1 && units <= CPU_MAX_UNITS &&
        !(mode & CUBE_LAUNCH_VALIDATE))
        err = cpu_compile_unit_loops(s, name, source, flags, dim, &m, &origin,
                                     &barrier_pass);
    if (!err && !m)
        err = cpu_jit_load(s->jit, source, flags, &m, &origin);
    free(source);
    if (err)
        return cube_error_prefix(err, "compiling kernel '%s'", name);
    /* Only a real compile: a kernel loaded from a cache was checked when
     * it was built. */
    if (origin == CPU_JIT_COMPILED)
        cpu_portability_check(s->port, s->jit, cube_kernel_id(kernel), name,
                              user, flags);

    const unsigned *abi = cpu_module_symbol(m, "cube__abi_version");
    const cube_param_kind *sig = symbol(m, "cube__sig_", name);
    const unsigned *nparams = symbol(m, "cube__nparams_", name);
    const unsigned long long *shared = symbol(m, "cube__shared_", name);
    cpu_run_fn run = (cpu_run_fn)symbol(m, "cube__run_", name);
    cpu_unit_fn unit = (cpu_unit_fn)symbol(m, "cube__unit_", name);
    void (**sync_fn)(void) = cpu_module_symbol(m, "cube__sync_fn");
    void (**trap_fn)(void) = cpu_module_symbol(m, "cube__trap_fn");
    if (!abi || !sig || !nparams || !shared || !run || !unit || !sync_fn ||
        !trap_fn) {
        cpu_module_close(m);
        return cube_error_new(CUBE_ERR_COMPILE,
                              "kernel '%s': the source defines no "
                              "CUBE_KERNEL(%s, ...)",
                              name, name);
    }
    if (*abi != CPU_ABI || *nparams > CUBE_MAX_PARAMS) {
        cpu_module_close(m);
        return cube_error_new(CUBE_ERR_COMPILE,
                              "kernel '%s': ABI %u or %u parameters not "
                              "supported (ABI %d, at most %d parameters)",
                              name, *abi, *nparams, CPU_ABI, CUBE_MAX_PARAMS);
    }
    *sync_fn = cpu_sync_yield;
    *trap_fn = cpu_trap;
    cpu_kernel_impl *impl = NULL;
    err = cpu_kernel_impl_new(m, &impl);
    if (err)
        return err;
    impl->run = run;
    impl->unit = unit;
    impl->cubes = (cpu_cubes_fn)symbol(m, "cube__cubes_", name);
    memcpy(impl->cubes_dim, dim, sizeof dim);
    /* The signature table: {kind, elem_size, extent} per parameter. */
    typedef struct {
        unsigned int kind, elem_size;
        unsigned long long extent;
    } sig_entry;
    const sig_entry *table = (const sig_entry *)sig;
    memset(out, 0, sizeof *out);
    out->param_count = *nparams;
    for (unsigned i = 0; i < *nparams; i++) {
        out->params[i].kind = (cube_param_kind)table[i].kind;
        out->params[i].elem_size = table[i].elem_size;
        out->params[i].extent = table[i].extent;
    }
    out->shared_bytes = *shared;
    out->uses_cube_sync = mentions_cube_sync(user);
    out->compile_ms = cube_clock_ms() - t0;
    out->from_disk_cache = origin == CPU_JIT_DISK;
    out->barrier_pass = barrier_pass;
    out->impl = impl;
    return NULL;
}

static void cpu_compiled_release(cube_server *server, cube_compiled *compiled)
{
    (void)server;
    cpu_kernel_impl *impl = compiled->impl;
    if (!impl)
        return;
    cpu_module_close(impl->module);
    free(impl);
    compiled->impl = NULL;
}

/* --- launch --- */

typedef struct cpu_launch_ctx {
    const cpu_kernel_impl *impl;
    cpu_launch_abi abi;
    const cube_cpu_param *raw_params; /* a raw kernel's, by position */
    uint32_t nparams;
    uint64_t shared_bytes;
    uint32_t units;
    int fibers;
    int cubes; /* with fibers: the units as loops instead (impl->cubes) */
} cpu_launch_ctx;

static cube_error *ensure_shared(cpu_thread_local *local, uint64_t bytes)
{
    if (bytes == 0 || local->shared_cap >= bytes)
        return NULL;
    size_t size = (size_t)((bytes + 63) & ~(uint64_t)63);
    void *p = aligned_alloc(64, size);
    if (!p)
        return cube_error_new(CUBE_ERR_OUT_OF_MEMORY,
                              "%llu bytes of shared memory",
                              (unsigned long long)bytes);
    free(local->shared);
    local->shared = p;
    local->shared_cap = size;
    return NULL;
}

typedef struct fiber_arg {
    const cpu_launch_ctx *ctx;
    uint32_t cube;
    void *shared;
} fiber_arg;

static void run_unit(void *arg, uint32_t index)
{
    const fiber_arg *a = arg;
    a->ctx->impl->unit(&a->ctx->abi, a->cube, index, a->shared);
}

static cube_error *trap_check(void)
{
    if (!cpu_trapped)
        return NULL;
    cpu_trapped = 0;
    return cube_error_new(CUBE_ERR_DEVICE_FAULT,
                          "a kernel called cube_trap(); the device is "
                          "broken, reopen the client");
}

/* Cubes [begin, end) of a raw kernel: one call each (cubert/cpu_kernel.h). */
static void run_raw(const cpu_launch_ctx *ctx, uint32_t begin, uint32_t end)
{
    cube_cpu_cube cube;
    cube.abi = CUBE_CPU_KERNEL_ABI;
    for (int i = 0; i < 3; i++) {
        cube.count[i] = ctx->abi.count[i];
        cube.dim[i] = ctx->abi.dim[i];
    }
    cube.nparams = ctx->nparams;
    cube.params = ctx->raw_params;
    uint32_t plane = cube.count[0] * cube.count[1];
    for (uint32_t c = begin; c < end; c++) {
        cube.index = c;
        cube.id[0] = c % cube.count[0];
        cube.id[1] = (c / cube.count[0]) % cube.count[1];
        cube.id[2] = c / plane;
        ctx->impl->raw(&cube);
    }
}

static cube_error *run_range(void *arg, uint32_t begin, uint32_t end,
                             cpu_thread_local *local)
{
    const cpu_launch_ctx *ctx = arg;
    if (ctx->impl->raw) {
        run_raw(ctx, begin, end);
        return NULL;
    }
    cube_error *err = ensure_shared(local, ctx->shared_bytes);
    if (err)
        return err;
    if (!ctx->fibers) {
        ctx->impl->run(&ctx->abi, begin, end, local->shared);
        return trap_check();
    }
    if (ctx->cubes) {
        ctx->impl->cubes(&ctx->abi, begin, end, local->shared);
        return trap_check();
    }
    if (!local->fibers) {
        err = cpu_fibers_create(CPU_FIBER_STACK, &local->fibers);
        if (err)
            return err;
    }
    for (uint32_t c = begin; c < end; c++) {
        fiber_arg fa = {ctx, c, local->shared};
        err = cpu_fibers_run(local->fibers, ctx->units, run_unit, &fa);
        if (err)
            return err;
    }
    return trap_check();
}

static cube_error *run_cubes(cpu_server *s, const cube_compiled *cc,
                             cpu_launch_ctx *ctx, uint64_t total);

static cube_error *run_launch(cpu_server *s, const cube_dispatch *d)
{
    const cube_compiled *cc = d->compiled;
    cpu_launch_ctx ctx;
    memset(&ctx, 0, sizeof ctx);
    ctx.impl = cc->impl;
    uint32_t count[3] = {d->cube_count[0], d->cube_count[1], d->cube_count[2]};
    if (d->count_buffer) {
        /* Stream order: everything before this launch has completed. */
        memcpy(count, addr(d->count_buffer), sizeof count);
        cube_error *err =
            properties_check_count(&s->props, count, "the maximum");
        if (err)
            return err;
    }
    uint64_t total = (uint64_t)count[0] * count[1] * count[2];
    if (total == 0) {
        /* a dynamic count of zero cubes: nothing to run */
        if (d->ran_nothing)
            *d->ran_nothing = 1;
        return NULL;
    }
    if (total > UINT32_MAX)
        return cube_error_new(CUBE_ERR_RESOURCE_LIMIT,
                              "%llu cubes in one launch; the CPU backend runs "
                              "at most 2^32-1",
                              (unsigned long long)total);
    /* Only the kernel's positions are read: no need to clear the rest (a
     * launch's cost is mostly this function). */
    void *ptr[CUBE_MAX_PARAMS];
    unsigned long long len[CUBE_MAX_PARAMS];
    for (uint32_t p = 0; p < cc->param_count; p++) {
        switch (cc->params[p].kind) {
        case CUBE_PARAM_SCALAR:
            ptr[p] = (void *)d->scalars[p];
            len[p] = cc->params[p].elem_size;
            break;
        case CUBE_PARAM_SHARED:
            ptr[p] = NULL;
            len[p] = 0;
            break;
        default: ptr[p] = addr(&d->bindings[p]); len[p] = d->bindings[p].size;
        }
    }
    for (int i = 0; i < 3; i++) {
        ctx.abi.dim[i] = d->cube_dim[i];
        ctx.abi.count[i] = count[i];
    }
    ctx.abi.ptr = ptr;
    ctx.abi.len = len;
    validate_record oob;
    if ((d->mode & CUBE_LAUNCH_VALIDATE) && !ctx.impl->raw) {
        memset(&oob, 0, sizeof oob);
        ctx.abi.oob = &oob;
    }
    cube_cpu_param raw_params[CUBE_MAX_PARAMS];
    if (ctx.impl->raw) {
        for (uint32_t p = 0; p < cc->param_count; p++) {
            raw_params[p].data = ptr[p];
            raw_params[p].bytes = len[p];
        }
        ctx.raw_params = raw_params;
        ctx.nparams = cc->param_count;
    }
    ctx.shared_bytes = cc->shared_bytes;
    ctx.units = d->cube_dim[0] * d->cube_dim[1] * d->cube_dim[2];
    ctx.fibers = cc->uses_cube_sync && ctx.units > 1;
    /* The unit loops assume absolute positions that do not wrap (under
     * 2^32 along each axis); a launch past that runs as fibers. */
    ctx.cubes =
        ctx.fibers && ctx.impl->cubes &&
        memcmp(ctx.impl->cubes_dim, d->cube_dim, sizeof d->cube_dim) == 0 &&
        (uint64_t)count[0] * d->cube_dim[0] <= 0x100000000ull &&
        (uint64_t)count[1] * d->cube_dim[1] <= 0x100000000ull &&
        (uint64_t)count[2] * d->cube_dim[2] <= 0x100000000ull;
    cube_error *err = run_cubes(s, cc, &ctx, total);
    if (!err && ctx.abi.oob)
        err = validate_report(cc, ctx.abi.oob);
    return err;
}

/* Runs the launch's cubes across the pool, or on the caller alone when
 * they are few. */
static cube_error *run_cubes(cpu_server *s, const cube_compiled *cc,
                             cpu_launch_ctx *ctx, uint64_t total)
{
    uint32_t threads = cpu_workers_threads(s->workers);
    uint64_t work = total * ctx->units;
    if (work >= CPU_SPREAD_UNITS) {
        uint32_t chunk = (uint32_t)((total + (uint64_t)threads * 4 - 1) /
                                    ((uint64_t)threads * 4));
        return cpu_workers_run(s->workers, (uint32_t)total, chunk, run_range,
                               ctx);
    }
    /* Few units: the caller alone, where waking workers would cost more
     * than the work, judged by what a cube of this kernel took last time.
     * A few heavy cubes (long loops, barriers) go one per worker. */
    cpu_kernel_impl *impl = cc->impl;
    uint64_t cube_ns =
        atomic_load_explicit(&impl->cube_ns, memory_order_relaxed);
    int spread = threads > 1 && total > 1 && cube_ns * total >= CPU_SPREAD_NS;
    uint64_t t0 = cube_clock_ns();
    cube_error *err =
        cpu_workers_run(s->workers, (uint32_t)total,
                        spread ? 1 : (uint32_t)total, run_range, ctx);
    uint64_t ns = cube_clock_ns() - t0;
    /* Spread, each thread ran about total / threads cubes in that time. */
    uint64_t ran = spread ? (total + threads - 1) / threads : total;
    atomic_store_explicit(&impl->cube_ns, ns / ran + 1, memory_order_relaxed);
    return err;
}

static cube_error *cpu_launch(cube_server *server, cube_server_stream *stream,
                              const cube_dispatch *d)
{
    uint64_t t0 = host_busy_begin(stream);
    cube_error *err = run_launch((cpu_server *)server, d);
    host_busy_end(stream, t0);
    return err;
}

/* --- lifetime --- */

static void cpu_destroy(cube_server *server)
{
    cpu_server *s = (cpu_server *)server;
    cpu_workers_destroy(s->workers);
    cpu_portability_destroy(s->port);
    cpu_jit_destroy(s->jit);
    free(s);
}

static const cube_server_vtable cpu_vtable = {
    .name = "cpu",
    .destroy = cpu_destroy,
    .properties = cpu_properties,
    .stream_open = host_stream_open,
    .read = host_read,
    .write = host_write,
    .sync = host_sync,
    .compile = cpu_compile,
    .compiled_release = cpu_compiled_release,
    .launch = cpu_launch,
    .flush = host_flush,
    .copy_to_peer = host_copy_to_peer,
    .wrap_memory = host_wrap_memory,
};

static cube_error *cpu_device_count(uint32_t *out)
{
    *out = cpu_devices();
    return NULL;
}

/* The worker threads of a device: as asked, else the online cores shared
 * among the virtual devices (at least one each). */
static uint32_t cpu_device_threads(const cube_client_options *options)
{
    if (options->cpu_threads)
        return options->cpu_threads;
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    uint32_t n = (uint32_t)(cores > 0 ? cores : 1) / cpu_devices();
    return n ? n : 1;
}

static cube_error *cpu_device_properties(uint32_t index,
                                         const cube_client_options *options,
                                         cube_properties *out)
{
    (void)index;
    fill_properties(out, cpu_device_threads(options));
    return NULL;
}

/* Opens virtual device `index`: every device has its own workers, memory
 * and compiled kernels (the disk cache is shared). */
static cube_error *cpu_open(uint32_t index, const cube_client_options *options,
                            cube_server **out)
{
    (void)index;
    *out = NULL;
    cpu_server *s = calloc(1, sizeof *s);
    if (!s)
        return cube_error_new(CUBE_ERR_OUT_OF_MEMORY, "cpu server");
    s->base.vt = &cpu_vtable;
    char dir[1100];
    const char *cache_dir = NULL;
    if (options->cache_dir) {
        /* The client's cache dir holds one folder per backend. */
        if (*options->cache_dir) {
            snprintf(dir, sizeof dir, "%s/cpu", options->cache_dir);
            cache_dir = dir;
        } else {
            cache_dir = "";
        }
    }
    cpu_jit_options jo = {NULL, NULL, cache_dir};
    cube_error *err = cpu_jit_create(&jo, &s->jit);
    if (!err)
        err = cpu_workers_create(cpu_device_threads(options), &s->workers);
    if (err) {
        cpu_workers_destroy(s->workers);
        cpu_jit_destroy(s->jit);
        free(s);
        return err;
    }
    /* Without memory for it the device works, unchecked. */
    s->port = cpu_portability_create();
    fill_properties(&s->props, cpu_workers_threads(s->workers));
    *out = &s->base;
    return NULL;
}

const cube_backend cube_backend_cpu = {"cpu",
                                       cpu_device_count,
                                       cpu_open,
                                       .device_properties =
                                           cpu_device_properties,
                                       .uses_cpu_threads = 1,
                                       .comm = &cpu_comm_vtable,
                                       .config_keys = cpu_config_keys};
