/* Compiling kernels on CUDA: cube C through the CUDA prelude and NVRTC to
 * CUBIN for the device's exact architecture (PTX when NVRTC does not know
 * it), a verified disk cache, and the module's signature read back.
 *
 * Every module carries a stamp, as the CPU backend's objects do: a device
 * global, cube__cuda_stamp, naming the entry (key and key material) it was
 * built for, added to the source after the key is made. A verified entry
 * is loaded only when its CUBIN holds its own stamp, and kept only when
 * the loaded module's global is that stamp: an entry that holds another
 * kernel's module (with a record that matches it) is removed and rebuilt,
 * never run. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* memmem */
#endif
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backends/common/kernel_source.h"
#include "backends/common/validate.h"
#include "backends/cuda/cuda_internal.h"
#include "base/clock.h"
#include "base/error.h"
#include "cubert/log.h"

extern const char cube_prelude_cuda[];

#define CUDA_MAX_ARTIFACT ((size_t)256 << 20)
#define CUDA_STATIC_SHARED_LIMIT 49152
/* nvrtcResult's NVRTC_ERROR_OUT_OF_MEMORY: the host ran out, not the
 * source's fault (the launch then records it on no buffer). */
#define NVRTC_OUT_OF_MEMORY 1

/* Entry parameter positions: the ABI tag, then per buffer its pointer
 * and length, per scalar its value (shared arrays take none). */
static void layout_params(cuda_server *s, cuda_kernel *k,
                          const cube_compiled *cc)
{
    size_t n = 1;
    for (uint32_t p = 0; p < cc->param_count; p++)
        n += cc->params[p].kind == CUBE_PARAM_SCALAR   ? 1
             : cc->params[p].kind == CUBE_PARAM_SHARED ? 0
                                                       : 2;
    k->packed_bytes = 0;
    if (!s->api->cuFuncGetParamInfo)
        return;
    size_t end = 0;
    for (size_t i = 0; i < n; i++) {
        size_t off = 0, size = 0;
        if (s->api->cuFuncGetParamInfo(k->function, i, &off, &size) !=
                CUDA_SUCCESS ||
            off + size > CUDA_PARAM_BUFFER)
            return;
        k->offset[i] = (uint16_t)off;
        if (off + size > end)
            end = off + size;
    }
    k->packed_bytes = (uint32_t)end;
}

/* The target: the device's own architecture when NVRTC supports it
 * (CUBIN), else the newest older one it supports, as PTX the driver
 * compiles at load. */
static void pick_target(const cuda_server *s, char *arch, size_t cap,
                        int *cubin)
{
    const cuda_api *a = s->api;
    int want = s->arch_major * 10 + s->arch_minor;
    int best = 0;
    int n = 0;
    if (a->nvrtcGetNumSupportedArchs && a->nvrtcGetSupportedArchs &&
        a->nvrtcGetNumSupportedArchs(&n) == 0 && n > 0 && n < 256) {
        int list[256];
        if (a->nvrtcGetSupportedArchs(list) == 0) {
            for (int i = 0; i < n; i++) {
                if (list[i] == want)
                    best = want;
                else if (list[i] < want && list[i] > best && best != want)
                    best = list[i];
            }
        }
    } else {
        best = want; /* no list: try the device's own */
    }
    if (best == 0)
        best = want;
    *cubin = best == want && a->nvrtcGetCUBIN && a->nvrtcGetCUBINSize;
    snprintf(arch, cap, "-arch=%s_%d", *cubin ? "sm" : "compute", best);
}

/* Runs NVRTC; *bytes is the CUBIN or the NUL-terminated PTX. The
 * program's file is <name>.cube.cu, or <name>.cu for raw CUDA source. */
static cube_error *nvrtc_build(cuda_server *s, const char *name, int raw,
                               const char *source, const char *const *opts,
                               int nopts, int cubin, unsigned char **bytes,
                               size_t *len)
{
    const cuda_api *a = s->api;
    nvrtcProgram prog = NULL;
    char file[160];
    snprintf(file, sizeof file, raw ? "%s.cu" : "%s.cube.cu", name);
    nvrtcResult r = a->nvrtcCreateProgram(&prog, source, file, 0, NULL, NULL);
    if (r != 0)
        return cube_error_new(r == NVRTC_OUT_OF_MEMORY ? CUBE_ERR_OUT_OF_MEMORY
                                                       : CUBE_ERR_COMPILE,
                              "kernel '%s': NVRTC cannot create a program: %s",
                              name, a->nvrtcGetErrorString(r));
    nvrtcResult cr = a->nvrtcCompileProgram(prog, nopts, opts);
    size_t log_size = 0;
    char *log = NULL;
    if (a->nvrtcGetProgramLogSize(prog, &log_size) == 0 && log_size > 1) {
        log = malloc(log_size);
        if (log && a->nvrtcGetProgramLog(prog, log) != 0) {
            free(log);
            log = NULL;
        }
    }
    cube_error *err = NULL;
    if (cr != 0) {
        err = cube_error_new(cr == NVRTC_OUT_OF_MEMORY ? CUBE_ERR_OUT_OF_MEMORY
                                                       : CUBE_ERR_COMPILE,
                             "kernel '%s' does not compile for CUDA (%s): %s",
                             name, opts[0],
                             log ? log : a->nvrtcGetErrorString(cr));
        if (log)
            cube_error_set_log(err, log);
    } else {
        if (log && log_size > 1)
            cube_log_write(CUBE_LOG_DEBUG, "compile", "kernel '%s': %s", name,
                           log);
        size_t size = 0;
        r = cubin ? a->nvrtcGetCUBINSize(prog, &size)
                  : a->nvrtcGetPTXSize(prog, &size);
        unsigned char *out = r == 0 && size ? malloc(size) : NULL;
        if (!out) {
            err = cube_error_new(r ? CUBE_ERR_COMPILE : CUBE_ERR_OUT_OF_MEMORY,
                                 "kernel '%s': no compiled code from NVRTC",
                                 name);
        } else {
            r = cubin ? a->nvrtcGetCUBIN(prog, (char *)out)
                      : a->nvrtcGetPTX(prog, (char *)out);
            if (r != 0) {
                free(out);
                err = cube_error_new(CUBE_ERR_COMPILE,
                                     "kernel '%s': NVRTC output: %s", name,
                                     a->nvrtcGetErrorString(r));
            } else {
                *bytes = out;
                *len = size;
            }
        }
    }
    free(log);
    a->nvrtcDestroyProgram(&prog);
    return err;
}

/* Reads a device global of the module into `out` (exactly `size` bytes;
 * *found 0 when the module has no such global). */
static cube_error *read_global(cuda_server *s, CUmodule m, const char *prefix,
                               const char *name, void *out, size_t size,
                               size_t *actual)
{
    char sym[256];
    snprintf(sym, sizeof sym, "%s%s", prefix, name);
    CUdeviceptr p = 0;
    size_t bytes = 0;
    CUresult r = s->api->cuModuleGetGlobal(&p, &bytes, m, sym);
    *actual = 0;
    if (r != CUDA_SUCCESS)
        return NULL;
    if (bytes > size)
        bytes = size;
    r = s->api->cuMemcpyDtoH(out, p, bytes);
    if (r != CUDA_SUCCESS)
        return cuda_fail(s, r, CUBE_ERR_INTERNAL, "reading %s", sym);
    *actual = bytes;
    return NULL;
}

/* ------------------------------------------------------------ the stamp */

void cuda_stamp_text(const disk_cache_key *key, char *buf, size_t size)
{
    snprintf(buf, size,
             CUDA_STAMP_PREFIX "%016" PRIx64 "%016" PRIx64 "%016" PRIx64,
             key->key, key->material_high, key->material_low);
}

char *cuda_stamped_source(const char *source, const disk_cache_key *key)
{
    char stamp[CUDA_STAMP_BUF];
    cuda_stamp_text(key, stamp, sizeof stamp);
    static const char fmt[] =
        "%s\n#line 1 \"cubert-stamp\"\n"
        "extern \"C\" __device__ const char " CUDA_STAMP_SYMBOL
        "[] = \"%s\";\n";
    size_t n = strlen(source) + sizeof fmt + strlen(stamp);
    char *text = malloc(n);
    if (text)
        snprintf(text, n, fmt, source, stamp);
    return text;
}

const char *cuda_artifact_wrong(const unsigned char *bytes, size_t len,
                                int cubin, const disk_cache_key *key)
{
    if (!cubin)
        return NULL;
    char stamp[CUDA_STAMP_BUF];
    cuda_stamp_text(key, stamp, sizeof stamp);
    /* With its terminating NUL: a longer stamp that starts alike is
     * another. */
    if (!bytes || !memmem(bytes, len, stamp, strlen(stamp) + 1))
        return "its CUBIN does not carry the entry's stamp";
    return NULL;
}

const char *cuda_module_stamp_wrong(const char *found, size_t n,
                                    const disk_cache_key *key)
{
    char stamp[CUDA_STAMP_BUF];
    cuda_stamp_text(key, stamp, sizeof stamp);
    size_t want = strlen(stamp) + 1;
    if (!found || n == 0)
        return "the loaded module has no " CUDA_STAMP_SYMBOL;
    if (n != want || memcmp(found, stamp, want) != 0)
        return "the loaded module's " CUDA_STAMP_SYMBOL " names another entry";
    return NULL;
}

/* Why the loaded module is not entry `key`'s, or NULL. A failure to read
 * its stamp is returned in *err. */
static const char *module_wrong(cuda_server *s, CUmodule m,
                                const disk_cache_key *key, cube_error **err)
{
    char found[CUDA_STAMP_BUF];
    size_t got = 0;
    *err = read_global(s, m, "", CUDA_STAMP_SYMBOL, found, sizeof found, &got);
    if (*err)
        return NULL;
    return cuda_module_stamp_wrong(found, got, key);
}

/* Loads `bytes` as k's module and finds its entry: cube__kernel_<name>
 * for cube C, the extern "C" function <name> for a raw kernel. */
static cube_error *load_entry(cuda_server *s, const char *name,
                              const unsigned char *bytes, cuda_kernel *k,
                              int raw)
{
    const cuda_api *a = s->api;
    CUresult r = a->cuModuleLoadData(&k->module, bytes);
    if (r != CUDA_SUCCESS)
        return cuda_fail(s, r, CUBE_ERR_COMPILE,
                         "kernel '%s': the driver cannot load the module",
                         name);
    char sym[256];
    snprintf(sym, sizeof sym, "cube__kernel_%s", name);
    r = a->cuModuleGetFunction(&k->function, k->module, raw ? name : sym);
    if (r == CUDA_SUCCESS)
        return NULL;
    if (raw)
        return cube_error_new(CUBE_ERR_COMPILE,
                              "kernel '%s': the module has no entry '%s' (an "
                              "extern \"C\" __global__ function)",
                              name, name);
    return cube_error_new(CUBE_ERR_COMPILE,
                          "kernel '%s': the source defines no "
                          "CUBE_KERNEL(%s, ...)",
                          name, name);
}

static cube_error *load_module(cuda_server *s, const char *name,
                               const unsigned char *bytes, cuda_kernel *k,
                               cube_compiled *out)
{
    const cuda_api *a = s->api;
    cube_error *err = load_entry(s, name, bytes, k, 0);
    if (err)
        return err;
    unsigned nparams = 0;
    unsigned long long shared = 0;
    size_t got = 0, got_shared = 0;
    err = read_global(s, k->module, "cube__nparams_", name, &nparams,
                      sizeof nparams, &got);
    if (!err)
        err = read_global(s, k->module, "cube__shared_", name, &shared,
                          sizeof shared, &got_shared);
    if (err)
        return err;
    if (got != sizeof nparams || got_shared != sizeof shared ||
        nparams > CUBE_MAX_PARAMS)
        return cube_error_new(CUBE_ERR_COMPILE,
                              "kernel '%s': its module lacks the signature "
                              "(or has %u parameters, over %d)",
                              name, nparams, CUBE_MAX_PARAMS);
    struct {
        unsigned int kind, elem_size;
        unsigned long long extent;
    } table[CUBE_MAX_PARAMS];
    memset(table, 0, sizeof table);
    if (nparams) {
        err = read_global(s, k->module, "cube__sig_", name, table,
                          nparams * sizeof table[0], &got);
        if (err)
            return err;
        if (got != nparams * sizeof table[0])
            return cube_error_new(CUBE_ERR_COMPILE,
                                  "kernel '%s': its signature table is "
                                  "truncated",
                                  name);
    }
    out->param_count = nparams;
    for (unsigned i = 0; i < nparams; i++) {
        out->params[i].kind = (cube_param_kind)table[i].kind;
        out->params[i].elem_size = table[i].elem_size;
        out->params[i].extent = table[i].extent;
    }
    out->shared_bytes = shared;
    k->shared_bytes = (uint32_t)shared;
    layout_params(s, k, out);
    /* Above the static limit a function must opt in, once. */
    if (shared > CUDA_STATIC_SHARED_LIMIT &&
        shared <= (unsigned long long)s->optin_shared) {
        CUresult r = a->cuFuncSetAttribute(
            k->function, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
            (int)shared);
        if (r != CUDA_SUCCESS)
            return cuda_fail(s, r, CUBE_ERR_RESOURCE_LIMIT,
                             "kernel '%s': %llu bytes of shared memory", name,
                             shared);
    }
    return NULL;
}

/* A raw kernel's module (from NVRTC or the caller's CUBIN or PTX): its
 * entry by name, checked against the declared parameters where the driver
 * tells them (cuFuncGetParamInfo), whose offsets also give the packed
 * layout. The signature is the declared one. */
static cube_error *load_raw_module(cuda_server *s, const cube_kernel *kernel,
                                   const unsigned char *bytes, cuda_kernel *k,
                                   cube_compiled *out)
{
    const cuda_api *a = s->api;
    const char *name = cube_kernel_name(kernel);
    cube_error *err = load_entry(s, name, bytes, k, 1);
    if (err)
        return err;
    const cube_compiled *declared = cube_kernel_declared(kernel);
    *out = *declared;
    k->raw = 1;
    k->shared_bytes = 0;
    k->packed_bytes = 0;
    if (!a->cuFuncGetParamInfo)
        return NULL; /* an older driver: the declaration is trusted */
    uint32_t n = declared->param_count;
    size_t end = 0;
    for (uint32_t i = 0; i <= n && i < CUDA_ENTRY_PARAMS; i++) {
        size_t off = 0, size = 0;
        CUresult r = a->cuFuncGetParamInfo(k->function, i, &off, &size);
        if (i == n && r != CUDA_SUCCESS)
            break; /* the entry ends where the declaration does */
        if (r != CUDA_SUCCESS || i == n) {
            /* Count the entry's parameters for the message. */
            uint32_t has = i;
            while (i == n && has < CUDA_ENTRY_PARAMS &&
                   a->cuFuncGetParamInfo(k->function, has, &off, &size) ==
                       CUDA_SUCCESS)
                has++;
            return cube_error_new(
                CUBE_ERR_INVALID_ARGUMENT,
                "kernel '%s': the entry takes %s%u "
                "parameters, %u are declared",
                name, i == n && has == CUDA_ENTRY_PARAMS ? "at least " : "",
                has, n);
        }
        const cube_param *p = &declared->params[i];
        int scalar = p->kind == CUBE_PARAM_SCALAR;
        size_t want = scalar ? p->elem_size : sizeof(CUdeviceptr);
        if (size != want)
            return cube_error_new(
                CUBE_ERR_INVALID_ARGUMENT,
                "kernel '%s': params[%u] is declared as %s (%zu bytes), but "
                "the entry's parameter %u has %zu bytes",
                name, i, scalar ? "a scalar" : "a buffer (a device pointer)",
                want, i, size);
        if (off + size <= CUDA_PARAM_BUFFER) {
            k->offset[i] = (uint16_t)off;
            if (off + size > end)
                end = off + size;
        } else {
            end = (size_t)-1;
        }
    }
    if (end <= CUDA_PARAM_BUFFER)
        k->packed_bytes = (uint32_t)end;
    return NULL;
}

/* At most this many words of a raw kernel's options, and of all the
 * options NVRTC is given (the target, the language and cube C's checking
 * mode before them). */
#define CUDA_MAX_USER_OPTIONS 64
#define CUDA_MAX_OPTIONS (3 + CUDA_MAX_USER_OPTIONS)

/* The text NVRTC compiles: a raw kernel's source as it is, cube C behind
 * the CUDA and common preludes. NULL for want of memory. */
static char *kernel_text(const cube_kernel *kernel, int raw)
{
    const char *user = cube_kernel_source(kernel);
    if (raw)
        return strdup(user);
    const char *preludes[] = {cube_prelude_cuda};
    return kernel_source_cube_c(preludes, 1, cube_kernel_name(kernel), user);
}

/* NVRTC's options: the target `arch`, the language, cube C's checking
 * mode, then a raw kernel's own options, split in place in `words` (which
 * opts[] then points into). Errors: CUBE_ERR_COMPILE (too many). */
static cube_error *kernel_options(const char *name, int raw, uint32_t mode,
                                  const char *arch, char *words,
                                  const char *opts[CUDA_MAX_OPTIONS],
                                  int *nopts)
{
    int n = 0;
    opts[n++] = arch;
    opts[n++] = "-std=c++17";
    if (!raw)
        opts[n++] = (mode & CUBE_LAUNCH_VALIDATE)  ? "-DCUBE_VALIDATE=1"
                    : (mode & CUBE_LAUNCH_CHECKED) ? "-DCUBE_CHECKED=1"
                                                   : "-DCUBE_CHECKED=0";
    char *save = NULL;
    for (char *w = strtok_r(words, " \t\n\r\v\f", &save); w;
         w = strtok_r(NULL, " \t\n\r\v\f", &save)) {
        if (n == CUDA_MAX_OPTIONS)
            return cube_error_new(CUBE_ERR_COMPILE,
                                  "kernel '%s': more than %d options", name,
                                  CUDA_MAX_USER_OPTIONS);
        opts[n++] = w;
    }
    *nopts = n;
    return NULL;
}

/* The disk cache key: the source, each option (with its length) and the
 * compiler's version and output kind. */
static void kernel_key(const cuda_server *s, const char *source,
                       const char *const *opts, int nopts, int cubin, int raw,
                       disk_cache_key *key)
{
    char version[64];
    snprintf(version, sizeof version, "nvrtc %d.%d %s%s", s->api->nvrtc_major,
             s->api->nvrtc_minor, cubin ? "cubin" : "ptx", raw ? " raw" : "");
    const void *parts[2 + CUDA_MAX_OPTIONS];
    size_t lens[2 + CUDA_MAX_OPTIONS];
    size_t nparts = 0;
    parts[nparts] = source;
    lens[nparts++] = strlen(source);
    for (int i = 0; i < nopts; i++) {
        parts[nparts] = opts[i];
        lens[nparts++] = strlen(opts[i]);
    }
    parts[nparts] = version;
    lens[nparts++] = strlen(version);
    disk_cache_key_make(parts, lens, nparts, key);
}

static cube_error *load_either(cuda_server *s, const cube_kernel *kernel,
                               int raw, const unsigned char *bytes,
                               cuda_kernel *k, cube_compiled *out)
{
    return raw ? load_raw_module(s, kernel, bytes, k, out)
               : load_module(s, cube_kernel_name(kernel), bytes, k, out);
}

/* Loads the kernel from its disk cache entry, checked to be this kernel's
 * (its stamp must be in the bytes before the driver sees them, and be the
 * module's global once loaded). 1 when loaded; 0 when there is no entry,
 * when it is another kernel's (it is removed) or when the driver refuses
 * it (a driver change): the kernel is then built again, with k and out
 * cleared of what the entry left. */
static int load_cached(cuda_server *s, const cube_kernel *kernel, int raw,
                       int cubin, const disk_cache_key *key, cuda_kernel *k,
                       cube_compiled *out)
{
    const char *name = cube_kernel_name(kernel);
    unsigned char *bytes = NULL;
    size_t len = 0;
    if (disk_cache_get(s->cache, key, CUDA_MAX_ARTIFACT, &bytes, &len) !=
        DISK_CACHE_HIT)
        return 0;
    cube_error *err = NULL;
    const char *wrong = cuda_artifact_wrong(bytes, len, cubin, key);
    if (!wrong) {
        err = load_either(s, kernel, raw, bytes, k, out);
        if (!err)
            wrong = module_wrong(s, k->module, key, &err);
    }
    free(bytes);
    if (!wrong && !err)
        return 1;
    if (wrong) {
        cube_log_write(CUBE_LOG_WARN, "compile",
                       "disk cache entry %s is not the kernel '%s' it "
                       "is filed under (%s); removing it and rebuilding",
                       key->hex, name, wrong);
        disk_cache_remove(s->cache, key);
        k->function = NULL;
        memset(out, 0, sizeof *out);
    } else {
        cube_log_write(CUBE_LOG_WARN, "compile",
                       "kernel '%s': cached module refused (%s); "
                       "rebuilding",
                       name, cube_error_message(err));
        cube_error_free(err);
    }
    if (k->module)
        s->api->cuModuleUnload(k->module);
    k->module = NULL;
    return 0;
}

/* Builds the kernel with NVRTC, loads it and files it in the disk cache
 * under `key`, unless its stamp cannot be found in the artifact or the
 * module (the module works, but a cached copy could never be told from
 * another kernel's). */
static cube_error *build_and_cache(cuda_server *s, const cube_kernel *kernel,
                                   int raw, int cubin, const char *source,
                                   const char *const *opts, int nopts,
                                   const disk_cache_key *key, cuda_kernel *k,
                                   cube_compiled *out)
{
    const char *name = cube_kernel_name(kernel);
    unsigned char *bytes = NULL;
    size_t len = 0;
    cube_error *err =
        nvrtc_build(s, name, raw, source, opts, nopts, cubin, &bytes, &len);
    if (!err)
        err = load_either(s, kernel, raw, bytes, k, out);
    const char *wrong = NULL;
    if (!err)
        wrong = cuda_artifact_wrong(bytes, len, cubin, key);
    if (!err && !wrong)
        wrong = module_wrong(s, k->module, key, &err);
    if (!err && wrong)
        cube_log_write(CUBE_LOG_WARN, "compile",
                       "not caching kernel '%s' (%s): %s", name, key->hex,
                       wrong);
    else if (!err)
        disk_cache_put(s->cache, key, bytes, len);
    free(bytes);
    return err;
}

static cube_error *compile_locked(cuda_server *s, const cube_kernel *kernel,
                                  uint32_t mode, cube_compiled *out,
                                  cuda_kernel *k)
{
    const char *name = cube_kernel_name(kernel);
    int raw = cube_kernel_format_of(kernel) == CUBE_KERNEL_CUDA_SOURCE;
    char *source = kernel_text(kernel, raw);
    /* A raw kernel's options, split into words (cube C has none). */
    char *user_opts = strdup(cube_kernel_options(kernel));
    if (!source || !user_opts) {
        free(source);
        free(user_opts);
        return cube_error_new(CUBE_ERR_OUT_OF_MEMORY, "kernel source");
    }
    char arch[32];
    int cubin = 0;
    pick_target(s, arch, sizeof arch, &cubin);
    const char *opts[CUDA_MAX_OPTIONS];
    int nopts = 0;
    cube_error *err =
        kernel_options(name, raw, mode, arch, user_opts, opts, &nopts);
    if (err) {
        free(source);
        free(user_opts);
        return err;
    }
    disk_cache_key key;
    kernel_key(s, source, opts, nopts, cubin, raw, &key);
    char *stamped = cuda_stamped_source(source, &key);
    free(source);
    if (!stamped) {
        free(user_opts);
        return cube_error_new(CUBE_ERR_OUT_OF_MEMORY, "kernel source");
    }

    double t0 = cube_clock_ms();
    int from_disk = load_cached(s, kernel, raw, cubin, &key, k, out);
    if (!from_disk)
        err = build_and_cache(s, kernel, raw, cubin, stamped, opts, nopts, &key,
                              k, out);
    free(stamped);
    free(user_opts);
    out->compile_ms = cube_clock_ms() - t0;
    out->from_disk_cache = from_disk;
    if (!err)
        cube_log_write(CUBE_LOG_DEBUG, "compile",
                       "kernel '%s' for %s: %s in %.2f ms", name, arch + 6,
                       from_disk ? "loaded from the disk cache" : "compiled",
                       out->compile_ms);
    return err;
}

cube_error *cuda_compile(cube_server *server, const cube_kernel *kernel,
                         uint32_t mode, cube_compiled *out)
{
    cuda_server *s = (cuda_server *)server;
    memset(out, 0, sizeof *out);
    cube_kernel_format format = cube_kernel_format_of(kernel);
    if (format != CUBE_KERNEL_CUBE_C && format != CUBE_KERNEL_CUDA_SOURCE &&
        format != CUBE_KERNEL_CUDA_BINARY)
        return cube_error_new(CUBE_ERR_UNSUPPORTED,
                              "kernel '%s' is C code for the CPU backend: the "
                              "CUDA backend runs cube C, CUDA source, CUBIN "
                              "and PTX",
                              cube_kernel_name(kernel));
    cube_error *err = cuda_enter(s);
    if (err)
        return err;
    cuda_kernel *k = calloc(1, sizeof *k);
    if (!k)
        return cube_error_new(CUBE_ERR_OUT_OF_MEMORY, "kernel");
    /* A first launch inside a capture compiles here: loading a module and
     * reading its globals must not break the capture. */
    int capture_mode = CU_STREAM_CAPTURE_MODE_RELAXED;
    s->api->cuThreadExchangeStreamCaptureMode(&capture_mode);
    if (format == CUBE_KERNEL_CUDA_BINARY) {
        /* The caller's CUBIN or PTX (a NUL follows the bytes): loaded as
         * it is, nothing to compile or cache. */
        double t0 = cube_clock_ms();
        err =
            load_raw_module(s, kernel, cube_kernel_code(kernel, NULL), k, out);
        out->compile_ms = cube_clock_ms() - t0;
    } else {
        err = compile_locked(s, kernel, mode, out, k);
    }
    s->api->cuThreadExchangeStreamCaptureMode(&capture_mode);
    if (err) {
        if (k->module)
            s->api->cuModuleUnload(k->module);
        free(k);
        double ms = out->compile_ms;
        memset(out, 0, sizeof *out);
        out->compile_ms = ms;
        return err;
    }
    if (format == CUBE_KERNEL_CUBE_C && (mode & CUBE_LAUNCH_VALIDATE)) {
        CUresult r = s->api->cuModuleGetGlobal(&k->oob_addr, &k->oob_bytes,
                                               k->module, "cube__oob_record");
        if (r != CUDA_SUCCESS || k->oob_bytes != sizeof(validate_record)) {
            err = r != CUDA_SUCCESS
                      ? cuda_fail(s, r, CUBE_ERR_COMPILE,
                                  "kernel '%s': the validating module has "
                                  "no cube__oob_record",
                                  cube_kernel_name(kernel))
                      : cube_error_new(CUBE_ERR_INTERNAL,
                                       "kernel '%s': cube__oob_record has "
                                       "%zu bytes, not %zu",
                                       cube_kernel_name(kernel), k->oob_bytes,
                                       sizeof(validate_record));
            s->api->cuModuleUnload(k->module);
            free(k);
            memset(out, 0, sizeof *out);
            return err;
        }
        pthread_mutex_init(&k->oob_lock.m, NULL);
    }
    out->uses_cube_sync =
        format == CUBE_KERNEL_CUBE_C &&
        strstr(cube_kernel_source(kernel), "cube_sync") != NULL;
    out->impl = k;
    return NULL;
}

void cuda_compiled_release(cube_server *server, cube_compiled *compiled)
{
    cuda_server *s = (cuda_server *)server;
    cuda_kernel *k = compiled->impl;
    if (!k)
        return;
    cube_error_ignore(cuda_enter(s),
                      "unloading a module goes on without its context");
    s->api->cuModuleUnload(k->module);
    if (k->oob_addr)
        pthread_mutex_destroy(&k->oob_lock.m);
    free(k);
    compiled->impl = NULL;
}
