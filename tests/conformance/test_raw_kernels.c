/* Raw kernels: backend source and binaries with declared parameters
 * (cube_kernel_create_raw), launched through cube_launch: results, the
 * declared signature driving argument checks and the failure store,
 * graphs, profiling, Skip mode, and a kernel for another backend.
 *
 * The C and shared-object tests run on the backends that run those
 * formats, the CUDA source and PTX tests on those that run CUDA's
 * (backends.c lists them: cubert/kernel.h ties each format to a backend);
 * each is skipped elsewhere. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "conformance.h"

#define EXEC CUBE_LAUNCH_EXECUTE

static int runs_c(void)
{
    return conf_backend_note("raw_c_kernels") != NULL;
}

static int runs_cuda(void)
{
    return conf_backend_note("raw_cuda_kernels") != NULL;
}

static void require_raw_c(void)
{
    conf_require_backend("raw_c_kernels", "raw C kernels");
}

static void require_raw_cuda(void)
{
    conf_require_backend("raw_cuda_kernels", "raw CUDA kernels");
}

static cube_raw_param rp(cube_raw_param_kind kind, uint32_t size)
{
    cube_raw_param p = {kind, size};
    return p;
}

/* A desc for source `src` (NULL: a binary of `size` bytes at `bin`). */
static cube_raw_kernel_desc raw_desc(const char *name, cube_kernel_format f,
                                     const char *src, const void *bin,
                                     size_t size, const cube_raw_param *params,
                                     uint32_t nparams, uint32_t dx)
{
    cube_raw_kernel_desc d;
    memset(&d, 0, sizeof d);
    d.name = name;
    d.format = f;
    d.source = src;
    d.binary = bin;
    d.binary_size = size;
    d.params = params;
    d.nparams = nparams;
    d.cube_dim[0] = dx;
    return d;
}

static cube_kernel *raw_make(const cube_raw_kernel_desc *d)
{
    cube_kernel *k = NULL;
    CONF_OK(cube_kernel_create_raw(d, &k));
    assert_non_null(k);
    return k;
}

/* --- sources --- */

/* y = a * x + y + b, one element per unit (IN f32, INOUT f32, f32, f64). */
#define SAXPY_BODY                                                             \
    "{\n"                                                                      \
    "    const float *x = c->params[0].data;\n"                                \
    "    float *y = c->params[1].data;\n"                                      \
    "    float a = *(const float *)c->params[2].data;\n"                       \
    "    double b = *(const double *)c->params[3].data;\n"                     \
    "    uint64_t n = c->params[1].bytes / sizeof(float);\n"                   \
    "    uint64_t base = (uint64_t)c->index * c->dim[0];\n"                    \
    "    for (uint32_t u = 0; u < c->dim[0]; u++) {\n"                         \
    "        uint64_t i = base + u;\n"                                         \
    "        if (i < n)\n"                                                     \
    "            y[i] = a * x[i] + y[i] + (float)b;\n"                         \
    "    }\n"                                                                  \
    "}\n"

static const char C_SAXPY[] =
    "void raw_saxpy(const cube_cpu_cube *c)\n" SAXPY_BODY;

/* The same, as a file of its own for `cc -shared`. */
static const char SO_SAXPY[] =
    "#include <cubert/cpu_kernel.h>\n"
    "void raw_saxpy(const cube_cpu_cube *c);\n"
    "void raw_saxpy(const cube_cpu_cube *c)\n" SAXPY_BODY;

static const cube_raw_param SAXPY_PARAMS[4] = {{CUBE_RAW_BUFFER_IN, 4},
                                               {CUBE_RAW_BUFFER_INOUT, 4},
                                               {CUBE_RAW_SCALAR, 4},
                                               {CUBE_RAW_SCALAR, 8}};

/* Per cube: its id and the count in pos (OUT u32, 4 per cube); cube 0
 * also echoes its scalars and ABI into echo (OUT u64). */
static const char C_POSITIONS[] =
    "void raw_positions(const cube_cpu_cube *c)\n"
    "{\n"
    "    uint32_t *pos = c->params[0].data;\n"
    "    uint64_t *echo = c->params[1].data;\n"
    "    uint32_t at = 4 * c->index;\n"
    "    if ((uint64_t)(at + 4) * 4 > c->params[0].bytes)\n"
    "        return;\n"
    "    pos[at] = c->id[0];\n"
    "    pos[at + 1] = c->id[1];\n"
    "    pos[at + 2] = c->id[2];\n"
    "    pos[at + 3] = c->count[0] * 1000000u + c->count[1] * 1000u +\n"
    "                  c->count[2];\n"
    "    if (c->index == 0) {\n"
    "        echo[0] = *(const uint64_t *)c->params[2].data;\n"
    "        echo[1] = *(const uint8_t *)c->params[3].data;\n"
    "        echo[2] = (uint64_t)(int64_t)*(const int16_t *)"
    "c->params[4].data;\n"
    "        echo[3] = (uint64_t)c->dim[0] * 10000u + c->dim[1] * 100u + "
    "c->dim[2];\n"
    "        echo[4] = c->abi * 100u + c->nparams;\n"
    "        echo[5] = c->params[2].bytes * 100u + c->params[3].bytes * 10u "
    "+ c->params[4].bytes;\n"
    "    }\n"
    "}\n";

/* y = 2 * x (IN f32, OUT f32), one element per unit. */
static const char C_DOUBLE[] =
    "void raw_double(const cube_cpu_cube *c)\n"
    "{\n"
    "    const float *x = c->params[0].data;\n"
    "    float *y = c->params[1].data;\n"
    "    uint64_t n = c->params[1].bytes / sizeof(float);\n"
    "    for (uint32_t u = 0; u < c->dim[0]; u++) {\n"
    "        uint64_t i = (uint64_t)c->index * c->dim[0] + u;\n"
    "        if (i < n)\n"
    "            y[i] = 2.0f * x[i];\n"
    "    }\n"
    "}\n";

static const cube_raw_param DOUBLE_PARAMS[2] = {{CUBE_RAW_BUFFER_IN, 4},
                                                {CUBE_RAW_BUFFER_OUT, 4}};

/* --- descriptors --- */

CONF_TEST(raw_create_rejects_hostile_descriptors_and_keeps_nothing)
{
    cube_raw_param params[CUBE_MAX_PARAMS + 1];
    for (int i = 0; i <= CUBE_MAX_PARAMS; i++)
        params[i] = rp(CUBE_RAW_SCALAR, 4);
    static const unsigned char bytes[4] = {1, 2, 3, 4};
    const cube_raw_kernel_desc good = raw_desc(
        "ok_name", CUBE_KERNEL_C_SOURCE, C_SAXPY, NULL, 0, SAXPY_PARAMS, 4, 64);
    cube_kernel *k = NULL;
    CONF_EXPECT_MSG(cube_kernel_create_raw(NULL, &k), CUBE_ERR_INVALID_ARGUMENT,
                    "desc");
    CONF_EXPECT_MSG(cube_kernel_create_raw(&good, NULL),
                    CUBE_ERR_INVALID_ARGUMENT, "out");

    struct {
        const char *why;
        cube_raw_kernel_desc d;
        const char *needle;
    } bad[32];
    int n = 0;
#define BAD(text, needle_)                                                     \
    do {                                                                       \
        bad[n].why = (text);                                                   \
        bad[n].d = d;                                                          \
        bad[n].needle = (needle_);                                             \
        n++;                                                                   \
        d = good;                                                              \
    } while (0)
    cube_raw_kernel_desc d = good;
    d.name = NULL;
    BAD("NULL name", "name");
    d.name = "9lives";
    BAD("name starting with a digit", "name");
    d.name = "two words";
    BAD("name with a blank", "name");
    d.name = "";
    BAD("empty name", "name");
    d.format = CUBE_KERNEL_CUBE_C;
    BAD("cube C format", "format");
    d.format = (cube_kernel_format)99;
    BAD("unknown format", "format");
    d.source = NULL;
    BAD("NULL source", "source");
    d.source = "";
    BAD("empty source", "source");
    d.binary = bytes;
    d.binary_size = sizeof bytes;
    BAD("source and binary", "binary");
    d.format = CUBE_KERNEL_SHARED_OBJECT;
    d.source = NULL;
    BAD("binary format without a binary", "binary");
    d.format = CUBE_KERNEL_CUDA_BINARY;
    d.source = NULL;
    d.binary = bytes;
    BAD("binary of 0 bytes", "binary_size");
    d.format = CUBE_KERNEL_CUDA_BINARY;
    d.binary = bytes;
    d.binary_size = sizeof bytes;
    BAD("binary format with a source", "source");
    d.format = CUBE_KERNEL_SHARED_OBJECT;
    d.source = NULL;
    d.binary = bytes;
    d.binary_size = sizeof bytes;
    d.options = "-O1";
    BAD("options with a binary", "options");
    d.params = params;
    d.nparams = CUBE_MAX_PARAMS + 1;
    BAD("too many parameters", "nparams");
    d.params = NULL;
    BAD("NULL params with nparams", "params");
    params[2] = rp(CUBE_RAW_SCALAR, 3);
    d.params = params;
    d.nparams = 3;
    BAD("scalar of 3 bytes", "params[2]");
    params[2] = rp(CUBE_RAW_SCALAR, 16);
    d.params = params;
    d.nparams = 3;
    BAD("scalar of 16 bytes", "params[2]");
    params[2] = rp(CUBE_RAW_BUFFER_OUT, 0);
    d.params = params;
    d.nparams = 3;
    BAD("buffer of 0-byte elements", "params[2]");
    params[2] = rp((cube_raw_param_kind)0, 4);
    d.params = params;
    d.nparams = 3;
    BAD("parameter kind 0", "params[2]");
    params[2] = rp((cube_raw_param_kind)5, 4);
    d.params = params;
    d.nparams = 3;
    BAD("parameter kind 5 (shared memory)", "params[2]");
    d.cube_dim[0] = 65536;
    d.cube_dim[1] = 65536;
    d.cube_dim[2] = 2;
    BAD("cube dimension over 2^32 units", "cube_dim");
#undef BAD
    for (int i = 0; i < n; i++) {
        k = (cube_kernel *)&k; /* must come back NULL */
        cube_error *err = cube_kernel_create_raw(&bad[i].d, &k);
        if (cube_error_code(err) != CUBE_ERR_INVALID_ARGUMENT ||
            !strstr(cube_error_message(err), bad[i].needle))
            fail_msg("%s: got [%s] '%s', expected INVALID_ARGUMENT naming "
                     "'%s'",
                     bad[i].why, cube_code_name(cube_error_code(err)),
                     cube_error_message(err), bad[i].needle);
        cube_error_free(err);
        assert_null(k);
    }
    /* The good one, and every format with the fields it takes. */
    k = raw_make(&good);
    assert_int_equal(cube_kernel_format_of(k), CUBE_KERNEL_C_SOURCE);
    assert_string_equal(cube_kernel_name(k), "ok_name");
    cube_kernel_release(k);
    cube_raw_kernel_desc so = raw_desc("ok_name", CUBE_KERNEL_SHARED_OBJECT,
                                       NULL, bytes, sizeof bytes, NULL, 0, 1);
    k = raw_make(&so);
    assert_int_equal(cube_kernel_format_of(k), CUBE_KERNEL_SHARED_OBJECT);
    cube_kernel_release(k);
    /* The caller's memory may go once the call returns: everything was
     * copied. */
    char *src = strdup(C_SAXPY);
    cube_raw_param *ps = malloc(sizeof SAXPY_PARAMS);
    assert_non_null(src);
    assert_non_null(ps);
    memcpy(ps, SAXPY_PARAMS, sizeof SAXPY_PARAMS);
    cube_raw_kernel_desc heap =
        raw_desc("raw_saxpy", CUBE_KERNEL_C_SOURCE, src, NULL, 0, ps, 4, 64);
    heap.options = "-O2";
    k = raw_make(&heap);
    uint64_t id = cube_kernel_id(k);
    memset(src, 'x', strlen(src));
    memset(ps, 0, sizeof SAXPY_PARAMS);
    free(src);
    free(ps);
    heap = raw_desc("raw_saxpy", CUBE_KERNEL_C_SOURCE, C_SAXPY, NULL, 0,
                    SAXPY_PARAMS, 4, 64);
    heap.options = "-O2";
    cube_kernel *again = raw_make(&heap);
    assert_true(cube_kernel_id(again) == id);
    cube_kernel_release(again);
    cube_kernel_release(k);
    assert_int_equal(cube_kernel_format_of(NULL), CUBE_KERNEL_CUBE_C);
    assert_int_equal(cube_kernel_format_of(conf.k.scale), CUBE_KERNEL_CUBE_C);
}

CONF_TEST(raw_id_covers_format_code_params_cube_dim_and_options)
{
    const cube_raw_kernel_desc base =
        raw_desc("raw_saxpy", CUBE_KERNEL_C_SOURCE, C_SAXPY, NULL, 0,
                 SAXPY_PARAMS, 4, 64);
    cube_kernel *k0 = raw_make(&base);
    uint64_t id0 = cube_kernel_id(k0);
    cube_raw_param other[4];
    memcpy(other, SAXPY_PARAMS, sizeof other);
    other[3].size = 4;
    cube_raw_kernel_desc v[7];
    for (int i = 0; i < 7; i++)
        v[i] = base;
    v[0].format = CUBE_KERNEL_CUDA_SOURCE;
    v[1].source = C_DOUBLE;
    v[2].params = other;
    v[3].nparams = 3;
    v[4].cube_dim[0] = 32;
    v[5].options = "-O1";
    v[6].name = "raw_other";
    uint64_t ids[7];
    for (int i = 0; i < 7; i++) {
        cube_kernel *k = raw_make(&v[i]);
        ids[i] = cube_kernel_id(k);
        cube_kernel_release(k);
        if (ids[i] == id0)
            fail_msg("variant %d has the base kernel's id", i);
        for (int j = 0; j < i; j++)
            if (ids[j] == ids[i])
                fail_msg("variants %d and %d share an id", j, i);
    }
    /* A cube C kernel of the same name and source is another kernel. */
    cube_kernel *cube_c = conf_kernel("raw_saxpy", C_SAXPY, 64, 1, 1);
    assert_true(cube_kernel_id(cube_c) != id0);
    cube_kernel_release(cube_c);
    /* "" and NULL options are the same kernel. */
    cube_raw_kernel_desc empty = base;
    empty.options = "";
    cube_kernel *k1 = raw_make(&empty);
    assert_true(cube_kernel_id(k1) == id0);
    cube_kernel_release(k1);
    cube_kernel_release(k0);
}

/* --- a kernel for another backend --- */

static const char CUDA_SAXPY[] =
    "extern \"C\" __global__ void raw_saxpy(const float *x, float *y,\n"
    "                                       float a, double b)\n"
    "{\n"
    "    unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x\n"
    "                           + threadIdx.x;\n"
    "    y[i] = a * x[i] + y[i] + (float)b;\n"
    "}\n";

/* Launched where it cannot run, a raw kernel fails like one that does not
 * compile: CUBE_ERR_UNSUPPORTED, recorded on the buffers given for its
 * declared OUT and INOUT parameters and on no other. */
CONF_TEST(raw_kernel_of_another_backend_fails_on_its_declared_outputs)
{
    static const unsigned char junk[8] = {0x7f, 'E', 'L', 'F', 2, 1, 1, 0};
    struct {
        cube_kernel_format format;
        int c, cuda; /* the format is C's, CUDA's */
    } formats[4] = {{CUBE_KERNEL_CUDA_SOURCE, 0, 1},
                    {CUBE_KERNEL_CUDA_BINARY, 0, 1},
                    {CUBE_KERNEL_C_SOURCE, 1, 0},
                    {CUBE_KERNEL_SHARED_OBJECT, 1, 0}};
    cube_raw_param params[4] = {
        rp(CUBE_RAW_BUFFER_IN, 4), rp(CUBE_RAW_BUFFER_OUT, 4),
        rp(CUBE_RAW_BUFFER_INOUT, 4), rp(CUBE_RAW_SCALAR, 4)};
    int tried = 0;
    for (int f = 0; f < 4; f++) {
        if ((runs_c() && formats[f].c) || (runs_cuda() && formats[f].cuda))
            continue;
        int src = formats[f].format == CUBE_KERNEL_CUDA_SOURCE ||
                  formats[f].format == CUBE_KERNEL_C_SOURCE;
        cube_raw_kernel_desc d = raw_desc(
            "raw_elsewhere", formats[f].format,
            src ? (formats[f].format == CUBE_KERNEL_C_SOURCE ? C_SAXPY
                                                             : CUDA_SAXPY)
                : NULL,
            src ? NULL : junk, src ? 0 : sizeof junk, params, 4, 64);
        cube_kernel *k = raw_make(&d);
        float host[64];
        for (int i = 0; i < 64; i++)
            host[i] = (float)i;
        cube_handle x = conf_create(host, sizeof host),
                    y = conf_create(host, sizeof host),
                    z = conf_create(host, sizeof host),
                    w = conf_create(host, sizeof host);
        cube_arg args[4] = {cube_arg_buffer(x), cube_arg_buffer(y),
                            cube_arg_buffer(z), cube_arg_f32(1.0f)};
        CONF_EXPECT(conf_launch(k, cube_count_static(1, 1, 1), args, 4, EXEC),
                    CUBE_ERR_UNSUPPORTED);
        CONF_EXPECT_REFUSED(y, sizeof host, CUBE_ERR_UNSUPPORTED);
        CONF_EXPECT_REFUSED(z, sizeof host, CUBE_ERR_UNSUPPORTED);
        float got[64];
        CONF_READ_OK(x, got, sizeof got);
        assert_memory_equal(got, host, sizeof host);
        /* Skip mode answers the same and records nothing. */
        cube_handle v = conf_create(host, sizeof host);
        cube_arg args2[4] = {cube_arg_buffer(x), cube_arg_buffer(w),
                             cube_arg_buffer(v), cube_arg_f32(1.0f)};
        CONF_EXPECT(conf_launch(k, cube_count_static(1, 1, 1), args2, 4,
                                CUBE_LAUNCH_SKIP),
                    CUBE_ERR_UNSUPPORTED);
        CONF_READ_OK(w, got, sizeof got);
        CONF_READ_OK(v, got, sizeof got);
        conf_release(v);
        conf_release(x);
        conf_release(y);
        conf_release(z);
        conf_release(w);
        cube_kernel_release(k);
        tried++;
    }
    assert_true(tried >= 2);
}

/* --- raw C on the CPU backend --- */

/* Runs a saxpy kernel (C_SAXPY's parameters) over n elements in cubes of
 * 64 and checks every element. */
static void check_saxpy(cube_kernel *k, uint32_t n)
{
    float *x = malloc(n * sizeof *x), *y = malloc(n * sizeof *y);
    float *got = malloc(n * sizeof *got);
    assert_non_null(x);
    assert_non_null(y);
    assert_non_null(got);
    for (uint32_t i = 0; i < n; i++) {
        x[i] = (float)(i % 1000);
        y[i] = (float)(i % 7) - 3.0f;
    }
    cube_handle hx = conf_create(x, n * 4ull), hy = conf_create(y, n * 4ull);
    cube_arg args[4] = {cube_arg_buffer(hx), cube_arg_buffer(hy),
                        cube_arg_f32(3.0f), cube_arg_f64(0.5)};
    CONF_OK(conf_launch(k, cube_count_static(conf_div_up(n, 64), 1, 1), args, 4,
                        EXEC));
    CONF_READ_OK(hy, got, n * 4ull);
    for (uint32_t i = 0; i < n; i++) {
        float want = 3.0f * x[i] + y[i] + 0.5f;
        if (got[i] != want)
            fail_msg("n=%u: y[%u] = %g, expected %g", n, i, (double)got[i],
                     (double)want);
    }
    CONF_READ_OK(hx, got, n * 4ull);
    assert_memory_equal(got, x, n * 4ull);
    conf_release(hx);
    conf_release(hy);
    free(x);
    free(y);
    free(got);
}

CONF_TEST_NEEDS(raw_c_source_saxpy_over_many_cubes_with_4_and_8_byte_scalars,
                CUBE_FEATURE_KERNELS)
{
    require_raw_c();
    cube_raw_kernel_desc d = raw_desc("raw_saxpy", CUBE_KERNEL_C_SOURCE,
                                      C_SAXPY, NULL, 0, SAXPY_PARAMS, 4, 64);
    d.options = "-O2 -DUNUSED_BY_THE_KERNEL=1";
    cube_kernel *k = raw_make(&d);
    static const uint32_t sizes[] = {1, 64, 65, 4097, 100003};
    for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++)
        check_saxpy(k, sizes[s]);
    /* Bounds checking is cube C's: a checked launch of raw code runs the
     * same code. */
    float one = 1.0f, got = 0.0f;
    cube_handle hx = conf_create(&one, 4), hy = conf_create(&one, 4);
    cube_arg args[4] = {cube_arg_buffer(hx), cube_arg_buffer(hy),
                        cube_arg_f32(2.0f), cube_arg_f64(-1.0)};
    CONF_OK(conf_launch(k, cube_count_static(1, 1, 1), args, 4,
                        CUBE_LAUNCH_CHECKED));
    CONF_READ_OK(hy, &got, 4);
    assert_true(got == 2.0f);
    conf_release(hx);
    conf_release(hy);
    cube_kernel_release(k);
}

CONF_TEST_NEEDS(raw_c_source_2d_cube_count_reaches_every_cube_with_its_abi,
                CUBE_FEATURE_KERNELS)
{
    require_raw_c();
    cube_raw_param params[5] = {
        rp(CUBE_RAW_BUFFER_OUT, 4), rp(CUBE_RAW_BUFFER_OUT, 8),
        rp(CUBE_RAW_SCALAR, 8), rp(CUBE_RAW_SCALAR, 1), rp(CUBE_RAW_SCALAR, 2)};
    cube_raw_kernel_desc d = raw_desc("raw_positions", CUBE_KERNEL_C_SOURCE,
                                      C_POSITIONS, NULL, 0, params, 5, 3);
    d.cube_dim[1] = 2;
    d.cube_dim[2] = 5;
    cube_kernel *k = raw_make(&d);
    const uint32_t cx = 37, cy = 23, cz = 2;
    const uint32_t cubes = cx * cy * cz;
    cube_handle pos = conf_empty(cubes * 16ull), echo = conf_empty(6 * 8);
    uint8_t b = 0xA5;
    int16_t h = -1234;
    cube_arg args[5] = {cube_arg_buffer(pos), cube_arg_buffer(echo),
                        cube_arg_u64(0x0123456789ABCDEFull),
                        cube_arg_scalar(&b, 1), cube_arg_scalar(&h, 2)};
    CONF_OK(conf_launch(k, cube_count_static(cx, cy, cz), args, 5, EXEC));
    uint32_t *got = malloc(cubes * 16ull);
    assert_non_null(got);
    CONF_READ_OK(pos, got, cubes * 16ull);
    for (uint32_t z = 0; z < cz; z++)
        for (uint32_t y = 0; y < cy; y++)
            for (uint32_t x = 0; x < cx; x++) {
                uint32_t i = x + cx * (y + cy * z);
                const uint32_t *g = &got[4 * i];
                if (g[0] != x || g[1] != y || g[2] != z ||
                    g[3] != cx * 1000000u + cy * 1000u + cz)
                    fail_msg("cube %u (%u, %u, %u) saw (%u, %u, %u), count "
                             "%u",
                             i, x, y, z, g[0], g[1], g[2], g[3]);
            }
    free(got);
    uint64_t e[6];
    CONF_READ_OK(echo, e, sizeof e);
    assert_true(e[0] == 0x0123456789ABCDEFull);
    assert_true(e[1] == 0xA5);
    assert_true(e[2] == (uint64_t)(int64_t)-1234);
    assert_true(e[3] == 3u * 10000u + 2u * 100u + 5u);
    assert_true(e[4] == CUBE_CPU_KERNEL_ABI * 100u + 5u);
    assert_true(e[5] == 8u * 100u + 1u * 10u + 2u);
    conf_release(pos);
    conf_release(echo);
    cube_kernel_release(k);
}

/* Builds `source` into a shared object with the system C compiler in a
 * fresh temporary directory and returns its bytes (*size of them). */
static unsigned char *build_shared_object(const char *source, size_t *size)
{
    const char *tmp = getenv("TMPDIR");
    char dir[512];
    snprintf(dir, sizeof dir, "%s/cubert-raw-test-XXXXXX",
             tmp && tmp[0] == '/' ? tmp : "/tmp");
    if (!mkdtemp(dir))
        fail_msg("mkdtemp: %s", strerror(errno));
    char src[600], so[600], cmd[2048];
    snprintf(src, sizeof src, "%s/kernel.c", dir);
    snprintf(so, sizeof so, "%s/kernel.so", dir);
    FILE *f = fopen(src, "w");
    assert_non_null(f);
    fputs(source, f);
    fclose(f);
    snprintf(cmd, sizeof cmd,
             "cc -std=c11 -O2 -shared -fPIC -I'%s/include' -o '%s' '%s'",
             CUBE_SOURCE_DIR, so, src);
    int rc = system(cmd);
    f = rc == 0 ? fopen(so, "rb") : NULL;
    unsigned char *bytes = NULL;
    long len = 0;
    if (f && fseek(f, 0, SEEK_END) == 0 && (len = ftell(f)) > 0 &&
        fseek(f, 0, SEEK_SET) == 0 && (bytes = malloc((size_t)len)) &&
        fread(bytes, 1, (size_t)len, f) != (size_t)len) {
        free(bytes);
        bytes = NULL;
    }
    if (f)
        fclose(f);
    unlink(src);
    unlink(so);
    rmdir(dir);
    if (!bytes)
        fail_msg("could not build a shared object with: %s (exit %d)", cmd, rc);
    *size = (size_t)len;
    return bytes;
}

CONF_TEST_NEEDS(raw_shared_object_built_by_cc_runs_like_the_source,
                CUBE_FEATURE_KERNELS)
{
    require_raw_c();
    size_t size = 0;
    unsigned char *bytes = build_shared_object(SO_SAXPY, &size);
    cube_raw_kernel_desc d = raw_desc("raw_saxpy", CUBE_KERNEL_SHARED_OBJECT,
                                      NULL, bytes, size, SAXPY_PARAMS, 4, 64);
    cube_kernel *k = raw_make(&d);
    /* The kernel keeps its own copy. */
    memset(bytes, 0, size);
    free(bytes);
    check_saxpy(k, 5000);
    check_saxpy(k, 3);
    cube_kernel_release(k);
}

CONF_TEST_NEEDS(raw_shared_object_refused_or_missing_entry_is_compile_error,
                CUBE_FEATURE_KERNELS)
{
    require_raw_c();
    float host[64] = {0};
    /* Bytes the dynamic loader refuses: a compile error with its
     * message, on the declared outputs. */
    static const char not_elf[] = "this is not an ELF shared object";
    cube_raw_kernel_desc d =
        raw_desc("raw_saxpy", CUBE_KERNEL_SHARED_OBJECT, NULL, not_elf,
                 sizeof not_elf, SAXPY_PARAMS, 4, 64);
    cube_kernel *k = raw_make(&d);
    cube_handle x = conf_create(host, sizeof host),
                y = conf_create(host, sizeof host);
    cube_arg args[4] = {cube_arg_buffer(x), cube_arg_buffer(y),
                        cube_arg_f32(1.0f), cube_arg_f64(1.0)};
    CONF_EXPECT_MSG(conf_launch(k, cube_count_static(1, 1, 1), args, 4, EXEC),
                    CUBE_ERR_COMPILE, "raw_saxpy");
    CONF_EXPECT_REFUSED(y, sizeof host, CUBE_ERR_COMPILE);
    float got[64];
    CONF_READ_OK(x, got, sizeof got);
    cube_kernel_release(k);

    /* A good object without the entry: a compile error naming it. */
    size_t size = 0;
    unsigned char *bytes = build_shared_object(SO_SAXPY, &size);
    d = raw_desc("raw_absent", CUBE_KERNEL_SHARED_OBJECT, NULL, bytes, size,
                 SAXPY_PARAMS, 4, 64);
    k = raw_make(&d);
    free(bytes);
    cube_handle y2 = conf_create(host, sizeof host);
    args[1] = cube_arg_buffer(y2);
    CONF_EXPECT_MSG(conf_launch(k, cube_count_static(1, 1, 1), args, 4, EXEC),
                    CUBE_ERR_COMPILE, "'raw_absent'");
    CONF_EXPECT_REFUSED(y2, sizeof host, CUBE_ERR_COMPILE);
    cube_kernel_release(k);

    /* The same for C source that defines another function. */
    d = raw_desc("raw_absent", CUBE_KERNEL_C_SOURCE, C_SAXPY, NULL, 0,
                 SAXPY_PARAMS, 4, 64);
    k = raw_make(&d);
    cube_handle y3 = conf_create(host, sizeof host);
    args[1] = cube_arg_buffer(y3);
    CONF_EXPECT_MSG(conf_launch(k, cube_count_static(1, 1, 1), args, 4, EXEC),
                    CUBE_ERR_COMPILE, "'raw_absent'");
    CONF_EXPECT_REFUSED(y3, sizeof host, CUBE_ERR_COMPILE);
    cube_kernel_release(k);
    conf_release(x);
    conf_release(y);
    conf_release(y2);
    conf_release(y3);
}

CONF_TEST_NEEDS(
    raw_c_source_compile_error_has_the_log_and_fails_declared_outputs,
    CUBE_FEATURE_KERNELS)
{
    require_raw_c();
    cube_raw_param params[4] = {
        rp(CUBE_RAW_BUFFER_IN, 4), rp(CUBE_RAW_BUFFER_OUT, 4),
        rp(CUBE_RAW_BUFFER_INOUT, 4), rp(CUBE_RAW_SCALAR, 4)};
    cube_raw_kernel_desc d = raw_desc(
        "raw_broken", CUBE_KERNEL_C_SOURCE,
        "void raw_broken(const cube_cpu_cube *c)\n{\n    this is not C;\n}\n",
        NULL, 0, params, 4, 1);
    cube_kernel *k = raw_make(&d);
    float host[16];
    for (int i = 0; i < 16; i++)
        host[i] = (float)i;
    cube_handle x = conf_create(host, sizeof host),
                y = conf_create(host, sizeof host),
                z = conf_create(host, sizeof host),
                s = conf_create(host, sizeof host);
    cube_arg args[4] = {cube_arg_buffer(x), cube_arg_buffer(y),
                        cube_arg_buffer(z), cube_arg_f32(0)};
    for (int round = 0; round < 2; round++) {
        cube_error *err =
            conf_launch(k, cube_count_static(1, 1, 1), args, 4, EXEC);
        CONF_CODE(err, CUBE_ERR_COMPILE);
        const char *log = cube_error_log(err);
        assert_non_null(log);
        /* The log points into the kernel's own file, at its line. */
        if (!strstr(log, "raw_broken.c:3"))
            fail_msg("compiler log does not name raw_broken.c:3:\n%s", log);
        cube_error_free(err);
    }
    CONF_EXPECT_REFUSED(y, sizeof host, CUBE_ERR_COMPILE);
    CONF_EXPECT_REFUSED(z, sizeof host, CUBE_ERR_COMPILE);
    float got[16];
    CONF_READ_OK(x, got, sizeof got);
    assert_memory_equal(got, host, sizeof host);
    /* Skip mode: the same error, recorded nowhere. */
    cube_arg skip_args[4] = {cube_arg_buffer(x), cube_arg_buffer(s),
                             cube_arg_buffer(s), cube_arg_f32(0)};
    CONF_EXPECT(conf_launch(k, cube_count_static(1, 1, 1), skip_args, 4,
                            CUBE_LAUNCH_SKIP),
                CUBE_ERR_COMPILE);
    CONF_READ_OK(s, got, sizeof got);
    conf_release(x);
    conf_release(y);
    conf_release(z);
    conf_release(s);
    cube_kernel_release(k);
}

/* Arguments that do not fit the declaration: INVALID_ARGUMENT, recorded
 * on the buffers given in the positions of its outputs only. */
CONF_TEST_NEEDS(raw_launch_arguments_are_checked_against_the_declaration,
                CUBE_FEATURE_KERNELS)
{
    require_raw_c();
    cube_raw_param params[3] = {rp(CUBE_RAW_BUFFER_IN, 4),
                                rp(CUBE_RAW_BUFFER_OUT, 4),
                                rp(CUBE_RAW_SCALAR, 4)};
    cube_raw_kernel_desc d = raw_desc("raw_double", CUBE_KERNEL_C_SOURCE,
                                      C_DOUBLE, NULL, 0, params, 3, 16);
    cube_kernel *k = raw_make(&d);
    float host[16];
    for (int i = 0; i < 16; i++)
        host[i] = (float)i;
    enum { CASES = 5 };
    for (int c = 0; c < CASES; c++) {
        cube_handle x = conf_create(host, sizeof host),
                    y = conf_create(host, sizeof host),
                    w = conf_create(host, sizeof host);
        cube_arg args[4] = {cube_arg_buffer(x), cube_arg_buffer(y),
                            cube_arg_f32(1), cube_arg_buffer(w)};
        size_t nargs = 3;
        const char *needle = NULL;
        int y_fails = 1;
        switch (c) {
        case 0: nargs = 2, needle = "takes 3 arguments, 2"; break;
        case 1: nargs = 4, needle = "takes 3 arguments, 4"; break;
        case 2:
            args[2] = cube_arg_buffer(w);
            needle = "args[2] must be a scalar";
            break;
        case 3:
            args[2] = cube_arg_f64(1);
            needle = "8-byte scalar";
            break;
        case 4:
            args[0] = cube_arg_f32(1);
            needle = "args[0] must be an input buffer";
            break;
        }
        CONF_EXPECT_MSG(
            conf_launch(k, cube_count_static(1, 1, 1), args, nargs, EXEC),
            CUBE_ERR_INVALID_ARGUMENT, needle);
        float got[16];
        if (y_fails)
            CONF_EXPECT_REFUSED(y, sizeof host, CUBE_ERR_INVALID_ARGUMENT);
        CONF_READ_OK(x, got, sizeof got);
        CONF_READ_OK(w, got, sizeof got);
        /* A launch that fits writes y whole and clears its failure. */
        cube_arg good[3] = {cube_arg_buffer(x), cube_arg_buffer(y),
                            cube_arg_f32(1)};
        CONF_OK(conf_launch(k, cube_count_static(1, 1, 1), good, 3, EXEC));
        CONF_READ_OK(y, got, sizeof got);
        for (int i = 0; i < 16; i++)
            assert_true(got[i] == 2.0f * host[i]);
        conf_release(x);
        conf_release(y);
        conf_release(w);
    }
    cube_kernel_release(k);
}

CONF_TEST_NEEDS(raw_untrusted_input_fails_the_launch_and_its_outputs,
                CUBE_FEATURE_KERNELS)
{
    require_raw_c();
    cube_raw_kernel_desc d = raw_desc("raw_double", CUBE_KERNEL_C_SOURCE,
                                      C_DOUBLE, NULL, 0, DOUBLE_PARAMS, 2, 16);
    cube_kernel *k = raw_make(&d);
    float host[16] = {0};
    cube_handle x = conf_create(host, sizeof host),
                y = conf_create(host, sizeof host);
    conf_mark_failed(x);
    cube_arg args[2] = {cube_arg_buffer(x), cube_arg_buffer(y)};
    CONF_EXPECT(conf_launch(k, cube_count_static(1, 1, 1), args, 2, EXEC),
                CUBE_ERR_SEVERAL);
    CONF_EXPECT_REFUSED(y, sizeof host, conf_mark_code());
    conf_release(x);
    conf_release(y);
    cube_kernel_release(k);
}

CONF_TEST_NEEDS(raw_kernel_in_a_graph_replays_with_rewritten_input,
                CUBE_FEATURE_KERNELS)
{
    require_raw_c();
    enum { N = 300 };
    cube_raw_kernel_desc d = raw_desc("raw_double", CUBE_KERNEL_C_SOURCE,
                                      C_DOUBLE, NULL, 0, DOUBLE_PARAMS, 2, 64);
    cube_kernel *k = raw_make(&d);
    float x0[N], got[N];
    for (int i = 0; i < N; i++)
        x0[i] = (float)i;
    cube_handle x = conf_create(x0, sizeof x0), y = conf_empty(sizeof x0),
                z = conf_empty(sizeof x0);
    cube_arg a1[2] = {cube_arg_buffer(x), cube_arg_buffer(y)};
    cube_arg a2[2] = {cube_arg_buffer(y), cube_arg_buffer(z)};
    cube_count count = cube_count_static(conf_div_up(N, 64), 1, 1);
    CONF_OK(cube_graph_prepare(conf.client));
    CONF_OK(conf_launch(k, count, a1, 2, EXEC));
    CONF_OK(conf_launch(k, count, a2, 2, EXEC));
    CONF_OK(cube_graph_begin(conf.client));
    cube_code c1 = conf_code(conf_launch(k, count, a1, 2, EXEC));
    cube_code c2 = conf_code(conf_launch(k, count, a2, 2, EXEC));
    cube_graph_id id = 0;
    CONF_OK(cube_graph_end(conf.client, &id));
    assert_int_equal(c1, CUBE_OK);
    assert_int_equal(c2, CUBE_OK);
    for (int r = 0; r < 3; r++) {
        for (int i = 0; i < N; i++)
            x0[i] = (float)(r * 1000 - i);
        CONF_WRITE_OK(x, x0, sizeof x0);
        CONF_OK(cube_graph_replay(conf.client, id));
        CONF_READ_OK(z, got, sizeof got);
        for (int i = 0; i < N; i++)
            if (got[i] != 4.0f * x0[i])
                fail_msg("round %d: z[%d] = %g, expected %g", r, i,
                         (double)got[i], (double)(4.0f * x0[i]));
    }
    CONF_OK(cube_graph_destroy(conf.client, id));
    conf_release(x);
    conf_release(y);
    conf_release(z);
    cube_kernel_release(k);
}

CONF_TEST_NEEDS(raw_kernel_in_a_profile_window_and_skip_mode,
                CUBE_FEATURE_KERNELS)
{
    require_raw_c();
    enum { N = 1 << 16 };
    /* Options make it a kernel no earlier test compiled: the Skip launch
     * compiles it, and a launch after it runs. */
    cube_raw_kernel_desc d = raw_desc("raw_double", CUBE_KERNEL_C_SOURCE,
                                      C_DOUBLE, NULL, 0, DOUBLE_PARAMS, 2, 256);
    d.options = "-DRAW_PROFILE_TEST=1";
    cube_kernel *k = raw_make(&d);
    float *x0 = malloc(N * sizeof *x0), *got = malloc(N * sizeof *got);
    assert_non_null(x0);
    assert_non_null(got);
    for (int i = 0; i < N; i++)
        x0[i] = (float)(i % 4096);
    cube_handle x = conf_create(x0, N * 4ull), y = conf_create(x0, N * 4ull);
    cube_arg args[2] = {cube_arg_buffer(x), cube_arg_buffer(y)};
    cube_count count = cube_count_static(N / 256, 1, 1);
    CONF_OK(conf_launch(k, count, args, 2, CUBE_LAUNCH_SKIP));
    CONF_READ_OK(y, got, N * 4ull);
    assert_memory_equal(got, x0, N * 4ull); /* Skip ran nothing */
    cube_profile_token t = 0;
    CONF_OK(cube_profile_start(conf.client, &t));
    for (int r = 0; r < 4; r++)
        CONF_OK(conf_launch(k, count, args, 2, EXEC));
    cube_profile_result pr;
    memset(&pr, 0, sizeof pr);
    CONF_OK(cube_profile_end(conf.client, t, &pr));
    assert_true(pr.seconds > 0.0);
    CONF_READ_OK(y, got, N * 4ull);
    for (int i = 0; i < N; i++)
        assert_true(got[i] == 2.0f * x0[i]);
    conf_release(x);
    conf_release(y);
    free(x0);
    free(got);
    cube_kernel_release(k);
}

/* --- raw CUDA --- */

/* y = a * x + y + b over n elements (IN f32, INOUT f32, f32, f64, u64). */
static const char CUDA_SAXPY_N[] =
    "extern \"C\" __global__ void raw_saxpy_n(const float *x, float *y,\n"
    "                                         float a, double b,\n"
    "                                         unsigned long long n)\n"
    "{\n"
    "    unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x\n"
    "                           + threadIdx.x;\n"
    "    if (i < n)\n"
    "        y[i] = a * x[i] + y[i] + (float)b;\n"
    "}\n";

static const cube_raw_param CUDA_SAXPY_PARAMS[5] = {{CUBE_RAW_BUFFER_IN, 4},
                                                    {CUBE_RAW_BUFFER_INOUT, 4},
                                                    {CUBE_RAW_SCALAR, 4},
                                                    {CUBE_RAW_SCALAR, 8},
                                                    {CUBE_RAW_SCALAR, 8}};

CONF_TEST_NEEDS(raw_cuda_source_saxpy_and_compile_error, CUBE_FEATURE_KERNELS)
{
    require_raw_cuda();
    cube_raw_kernel_desc d =
        raw_desc("raw_saxpy_n", CUBE_KERNEL_CUDA_SOURCE, CUDA_SAXPY_N, NULL, 0,
                 CUDA_SAXPY_PARAMS, 5, 128);
    d.options = "-DUNUSED_BY_THE_KERNEL=1";
    cube_kernel *k = raw_make(&d);
    enum { N = 100003 };
    float *x = malloc(N * sizeof *x), *y = malloc(N * sizeof *y);
    float *got = malloc(N * sizeof *got);
    assert_non_null(x);
    assert_non_null(y);
    assert_non_null(got);
    for (uint32_t i = 0; i < N; i++) {
        x[i] = (float)(i % 1000);
        y[i] = (float)(i % 7) - 3.0f;
    }
    cube_handle hx = conf_create(x, N * 4ull), hy = conf_create(y, N * 4ull);
    cube_arg args[5] = {cube_arg_buffer(hx), cube_arg_buffer(hy),
                        cube_arg_f32(3.0f), cube_arg_f64(0.5), cube_arg_u64(N)};
    CONF_OK(conf_launch(k, cube_count_static(conf_div_up(N, 128), 1, 1), args,
                        5, EXEC));
    CONF_READ_OK(hy, got, N * 4ull);
    for (uint32_t i = 0; i < N; i++)
        if (got[i] != 3.0f * x[i] + y[i] + 0.5f)
            fail_msg("y[%u] = %g, expected %g", i, (double)got[i],
                     (double)(3.0f * x[i] + y[i] + 0.5f));
    cube_kernel_release(k);

    /* A compile error: NVRTC's log, recorded on the declared outputs. */
    d.name = "raw_broken";
    d.source = "extern \"C\" __global__ void raw_broken(const float *x, "
               "float *y, float a, double b, unsigned long long n)\n"
               "{ this is not CUDA; }\n";
    d.options = NULL;
    k = raw_make(&d);
    cube_error *err = conf_launch(
        k, cube_count_static(conf_div_up(N, 128), 1, 1), args, 5, EXEC);
    CONF_CODE(err, CUBE_ERR_COMPILE);
    assert_non_null(cube_error_log(err));
    cube_error_free(err);
    CONF_EXPECT_REFUSED(hy, N * 4ull, CUBE_ERR_COMPILE);
    CONF_READ_OK(hx, got, N * 4ull);
    cube_kernel_release(k);
    conf_release(hx);
    conf_release(hy);
    free(x);
    free(y);
    free(got);
}

/* The driver knows the entry's parameters: a declaration that differs
 * (count, a size) is refused naming the parameter, on the outputs. */
CONF_TEST_NEEDS(raw_cuda_declared_parameters_must_match_the_entry,
                CUBE_FEATURE_KERNELS)
{
    require_raw_cuda();
    cube_raw_param params[5];
    struct {
        uint32_t nparams;
        int change; /* which parameter gets size 4 (-1: none) */
        const char *needle;
    } cases[3] = {
        {4, -1, "5 parameters"}, {5, 3, "params[3]"}, {5, 4, "params[4]"}};
    for (int c = 0; c < 3; c++) {
        memcpy(params, CUDA_SAXPY_PARAMS, sizeof params);
        if (cases[c].change >= 0)
            params[cases[c].change].size = 4;
        cube_raw_kernel_desc d =
            raw_desc("raw_saxpy_n", CUBE_KERNEL_CUDA_SOURCE, CUDA_SAXPY_N, NULL,
                     0, params, cases[c].nparams, 128);
        cube_kernel *k = raw_make(&d);
        float host[128] = {0};
        cube_handle hx = conf_create(host, sizeof host),
                    hy = conf_create(host, sizeof host);
        cube_arg args[5] = {cube_arg_buffer(hx), cube_arg_buffer(hy),
                            cube_arg_f32(1), cube_arg_f64(1), cube_arg_u64(1)};
        for (uint32_t p = 0; p < cases[c].nparams; p++)
            if (params[p].kind == CUBE_RAW_SCALAR && params[p].size == 4)
                args[p] = cube_arg_u32(1);
        CONF_EXPECT_MSG(conf_launch(k, cube_count_static(1, 1, 1), args,
                                    cases[c].nparams, EXEC),
                        CUBE_ERR_INVALID_ARGUMENT, cases[c].needle);
        CONF_EXPECT_REFUSED(hy, sizeof host, CUBE_ERR_INVALID_ARGUMENT);
        CONF_READ_OK(hx, host, sizeof host);
        conf_release(hx);
        conf_release(hy);
        cube_kernel_release(k);
    }
}

/* y[i] = i + v for every thread (OUT u32, u32 scalar), hand-written PTX
 * for sm_90. */
static const char PTX_FILL[] = ".version 7.8\n"
                               ".target sm_90\n"
                               ".address_size 64\n"
                               "\n"
                               ".visible .entry raw_fill(\n"
                               "    .param .u64 raw_fill_param_0,\n"
                               "    .param .u32 raw_fill_param_1\n"
                               ")\n"
                               "{\n"
                               "    .reg .b32 %r<6>;\n"
                               "    .reg .b64 %rd<5>;\n"
                               "    ld.param.u64 %rd1, [raw_fill_param_0];\n"
                               "    ld.param.u32 %r1, [raw_fill_param_1];\n"
                               "    cvta.to.global.u64 %rd2, %rd1;\n"
                               "    mov.u32 %r2, %ctaid.x;\n"
                               "    mov.u32 %r3, %ntid.x;\n"
                               "    mov.u32 %r4, %tid.x;\n"
                               "    mad.lo.s32 %r5, %r2, %r3, %r4;\n"
                               "    mul.wide.u32 %rd3, %r5, 4;\n"
                               "    add.s64 %rd4, %rd2, %rd3;\n"
                               "    add.s32 %r5, %r5, %r1;\n"
                               "    st.global.u32 [%rd4], %r5;\n"
                               "    ret;\n"
                               "}\n";

CONF_TEST_NEEDS(raw_cuda_ptx_binary_runs_and_bad_binary_is_compile_error,
                CUBE_FEATURE_KERNELS)
{
    require_raw_cuda();
    cube_raw_param params[2] = {rp(CUBE_RAW_BUFFER_OUT, 4),
                                rp(CUBE_RAW_SCALAR, 4)};
    /* Without its NUL: the kernel keeps one after its copy. */
    cube_raw_kernel_desc d =
        raw_desc("raw_fill", CUBE_KERNEL_CUDA_BINARY, NULL, PTX_FILL,
                 strlen(PTX_FILL), params, 2, 64);
    cube_kernel *k = raw_make(&d);
    enum { N = 4 * 64 };
    cube_handle y = conf_empty(N * 4);
    cube_arg args[2] = {cube_arg_buffer(y), cube_arg_u32(1000)};
    CONF_OK(conf_launch(k, cube_count_static(4, 1, 1), args, 2, EXEC));
    uint32_t got[N];
    CONF_READ_OK(y, got, sizeof got);
    for (uint32_t i = 0; i < N; i++)
        assert_int_equal(got[i], i + 1000);
    cube_kernel_release(k);

    /* Bytes the driver cannot load: a compile error, on the outputs. */
    static const char junk[] = "not a module";
    d = raw_desc("raw_fill", CUBE_KERNEL_CUDA_BINARY, NULL, junk, sizeof junk,
                 params, 2, 64);
    k = raw_make(&d);
    CONF_EXPECT(conf_launch(k, cube_count_static(4, 1, 1), args, 2, EXEC),
                CUBE_ERR_COMPILE);
    CONF_EXPECT_REFUSED(y, sizeof got, CUBE_ERR_COMPILE);
    cube_kernel_release(k);
    conf_release(y);
}
