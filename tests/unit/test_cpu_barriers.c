/* The CPU backend's barrier pass (src/backends/cpu/barrier_pass.c): kernels
 * that call cube_sync() give the same bytes with their units as loops
 * between barriers (cpu_barriers auto) as with fibers (cpu_barriers
 * fibers), plain and bounds checked; the pass takes the kernels of its
 * subset and refuses the others, which then run as fibers and are still
 * right. Which way a kernel ran is read from the info line the backend
 * logs when it compiles it. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cubert/cubert.h>

#include "backends/cpu/barrier_pass.h"
#include "test_files.h"

/* ------------------------------------------------------------ kernels */

/* docs/kernels.md, "Tiled matrix product with shared memory". */
static const char matmul_src[] =
    "#define TILE 16\n"
    "CUBE_KERNEL(matmul_tiled, CUBE_IN(float, a), CUBE_IN(float, b),\n"
    "            CUBE_OUT(float, c), CUBE_SCALAR(uint32_t, n),\n"
    "            CUBE_SHARED(float, ta, TILE * TILE),\n"
    "            CUBE_SHARED(float, tb, TILE * TILE))\n"
    "{\n"
    "    uint32_t tx = UNIT_POS_X, ty = UNIT_POS_Y;\n"
    "    uint64_t row = ABSOLUTE_POS_Y, col = ABSOLUTE_POS_X;\n"
    "    float acc = 0.0f;\n"
    "    for (uint32_t t = 0; t < (n + TILE - 1) / TILE; t++) {\n"
    "        uint64_t ak = (uint64_t)t * TILE + tx;\n"
    "        uint64_t bk = (uint64_t)t * TILE + ty;\n"
    "        ta[ty * TILE + tx] = (row < n && ak < n) ? CUBE_AT(a, row * n + "
    "ak) : 0.0f;\n"
    "        tb[ty * TILE + tx] = (bk < n && col < n) ? CUBE_AT(b, bk * n + "
    "col) : 0.0f;\n"
    "        cube_sync();\n"
    "        for (uint32_t k = 0; k < TILE; k++)\n"
    "            acc += ta[ty * TILE + k] * tb[k * TILE + tx];\n"
    "        cube_sync();\n"
    "    }\n"
    "    if (row < n && col < n)\n"
    "        CUBE_AT(c, row * n + col) = acc;\n"
    "}\n";

/* docs/kernels.md, "Shared memory, cube_sync() and an atomic". */
static const char sum_src[] =
    "#define SUM_UNITS 256\n"
    "CUBE_KERNEL(sum_all, CUBE_IN(float, x), CUBE_INOUT(float, total),\n"
    "            CUBE_SHARED(float, partial, SUM_UNITS))\n"
    "{\n"
    "    uint32_t u = UNIT_POS_X;\n"
    "    uint64_t stride = (uint64_t)CUBE_COUNT_X * CUBE_DIM_X;\n"
    "    float acc = 0.0f;\n"
    "    for (uint64_t i = ABSOLUTE_POS_X; i < CUBE_LEN(x); i += stride)\n"
    "        acc += CUBE_AT(x, i);\n"
    "    partial[u] = acc;\n"
    "    cube_sync();\n"
    "    for (uint32_t half = SUM_UNITS / 2; half > 0; half /= 2) {\n"
    "        if (u < half)\n"
    "            partial[u] += partial[u + half];\n"
    "        cube_sync();\n"
    "    }\n"
    "    if (u == 0)\n"
    "        cube_atomic_add_f32(&CUBE_AT(total, 0), partial[0]);\n"
    "}\n";

/* Grid-stride loops whose step is made of positions (i += count * dim)
 * or is 1, reading the buffer at the counter more than once: the pass
 * prefetches them, and the result is the fibers' one. */
static const char strided_src[] =
    "CUBE_KERNEL(strided, CUBE_IN(uint32_t, x), CUBE_OUT(uint32_t, y),\n"
    "            CUBE_SHARED(uint32_t, s, 32))\n"
    "{\n"
    "    uint32_t acc = 0, near = 0;\n"
    "    for (uint32_t i = ABSOLUTE_POS_X; i < CUBE_LEN(x);\n"
    "         i += CUBE_COUNT_X * CUBE_DIM_X)\n"
    "        acc += CUBE_AT(x, i) * 3u + (CUBE_AT(x, i) ^ i);\n"
    "    for (uint32_t j = UNIT_POS_X; j < 40u; j++)\n"
    "        near += CUBE_AT(x, j);\n"
    "    s[UNIT_POS_X] = acc + near;\n"
    "    cube_sync();\n"
    "    CUBE_AT(y, ABSOLUTE_POS_X) = s[CUBE_DIM_X - 1 - UNIT_POS_X];\n"
    "}\n";

/* docs/kernels.md, "A 2-D stencil with a halo in shared memory": halo loads
 * under conditions on the unit, then a barrier, then the 5-point sum. */
static const char stencil_src[] =
    "#define BX 32\n"
    "#define BY 8\n"
    "#define PITCH (BX + 2)\n"
    "#define LOAD(xx, yy)                                                  \\\n"
    "    ((xx) >= 0 && (xx) < (int64_t)w && (yy) >= 0 && (yy) < (int64_t)h \\\n"
    "         ? CUBE_AT(in, (uint64_t)(yy) * w + (uint64_t)(xx))           \\\n"
    "         : 0.0f)\n"
    "CUBE_KERNEL(stencil_shared, CUBE_IN(float, in), CUBE_OUT(float, out),\n"
    "            CUBE_SCALAR(uint32_t, w), CUBE_SCALAR(uint32_t, h),\n"
    "            CUBE_SHARED(float, t, PITCH * (BY + 2)))\n"
    "{\n"
    "    int tx = UNIT_POS_X, ty = UNIT_POS_Y;\n"
    "    int64_t x = ABSOLUTE_POS_X, y = ABSOLUTE_POS_Y;\n"
    "    int c = (ty + 1) * (BX + 2) + tx + 1;\n"
    "    t[c] = LOAD(x, y);\n"
    "    if (tx == 0)\n"
    "        t[c - 1] = LOAD(x - 1, y);\n"
    "    if (tx == BX - 1)\n"
    "        t[c + 1] = LOAD(x + 1, y);\n"
    "    if (ty == 0)\n"
    "        t[c - PITCH] = LOAD(x, y - 1);\n"
    "    if (ty == BY - 1)\n"
    "        t[c + PITCH] = LOAD(x, y + 1);\n"
    "    cube_sync();\n"
    "    float v = 0.5f * t[c] +\n"
    "              0.125f * (t[c - 1] + t[c + 1] + t[c - PITCH] + t[c + "
    "PITCH]);\n"
    "    if (x < w && y < h)\n"
    "        CUBE_AT(out, (uint64_t)y * w + (uint64_t)x) = v;\n"
    "}\n";

/* The same stencil read straight from the buffer (no barrier: the units
 * run as one loop). */
static const char stencil_plain_src[] =
    "#define LOAD(xx, yy)                                                  \\\n"
    "    ((xx) >= 0 && (xx) < (int64_t)w && (yy) >= 0 && (yy) < (int64_t)h \\\n"
    "         ? CUBE_AT(in, (uint64_t)(yy) * w + (uint64_t)(xx))           \\\n"
    "         : 0.0f)\n"
    "CUBE_KERNEL(stencil_plain, CUBE_IN(float, in), CUBE_OUT(float, out),\n"
    "            CUBE_SCALAR(uint32_t, w), CUBE_SCALAR(uint32_t, h))\n"
    "{\n"
    "    int64_t x = ABSOLUTE_POS_X, y = ABSOLUTE_POS_Y;\n"
    "    float v = 0.5f * LOAD(x, y) +\n"
    "              0.125f * (LOAD(x - 1, y) + LOAD(x + 1, y) + LOAD(x, y - 1) "
    "+\n"
    "                        LOAD(x, y + 1));\n"
    "    if (x < w && y < h)\n"
    "        CUBE_AT(out, (uint64_t)y * w + (uint64_t)x) = v;\n"
    "}\n";

/* A uniform while loop and a uniform if around barriers, a value that
 * changes across them (kept per unit), a 2-D cube, shared memory indexed
 * by the unit, a do-while and a final early return. */
static const char mixed_src[] =
    "enum { W = 8, H = 4 };\n"
    "CUBE_KERNEL(mixed, CUBE_IN(uint32_t, x), CUBE_OUT(uint32_t, y),\n"
    "            CUBE_SCALAR(uint32_t, rounds), CUBE_SCALAR(int32_t, flip),\n"
    "            CUBE_SHARED(uint32_t, s, W * H))\n"
    "{\n"
    "    uint32_t lx = UNIT_POS_X, ly = UNIT_POS_Y;\n"
    "    uint32_t me = ly * W + lx;\n"
    "    uint32_t g = CUBE_POS_X * (W * H) + me;\n"
    "    uint32_t v = g < CUBE_LEN(x) ? CUBE_AT(x, g) : 0u;\n"
    "    uint32_t r = 0;\n"
    "    while (r < rounds) {\n"
    "        uint32_t q = r * 5u + lx;\n"
    "        s[me] = v;\n"
    "        cube_sync();\n"
    "        v = v * 3u + s[(me + 1) % (W * H)];\n"
    "        if (flip > 0) {\n"
    "            cube_sync();\n"
    "            s[me] = v ^ 0x55u;\n"
    "            cube_sync();\n"
    "            v += s[W * H - 1 - me];\n"
    "        } else {\n"
    "            v ^= me;\n"
    "        }\n"
    "        cube_sync();\n"
    "        r++;\n"
    "        v += q; /* q was made with the r before the update */\n"
    "    }\n"
    "    uint32_t k = 0;\n"
    "    do {\n"
    "        s[me] = v + k;\n"
    "        cube_sync();\n"
    "        v += s[(me + 3) % (W * H)];\n"
    "        cube_sync();\n"
    "        k++;\n"
    "    } while (k < 2);\n"
    "    if (g >= CUBE_LEN(y))\n"
    "        return;\n"
    "    CUBE_AT(y, g) = v;\n"
    "}\n";

/* Atomics on shared memory between barriers, integer and float. */
static const char atomics_src[] =
    "CUBE_KERNEL(shared_atomics, CUBE_IN(uint32_t, x), CUBE_OUT(uint32_t, "
    "y),\n"
    "            CUBE_SHARED(uint32_t, hist, 16), CUBE_SHARED(float, fsum, "
    "1))\n"
    "{\n"
    "    uint32_t u = UNIT_POS_X;\n"
    "    if (u < 16)\n"
    "        hist[u] = 0;\n"
    "    if (u == 0)\n"
    "        fsum[0] = 0.0f;\n"
    "    cube_sync();\n"
    "    uint32_t i = ABSOLUTE_POS_X;\n"
    "    uint32_t v = i < CUBE_LEN(x) ? CUBE_AT(x, i) : 0u;\n"
    "    cube_atomic_add_u32(&hist[v % 16], 1u);\n"
    "    cube_atomic_max_u32(&hist[(v + 1) % 16], v);\n"
    "    cube_atomic_add_f32(&fsum[0], (float)(v % 8));\n"
    "    cube_sync();\n"
    "    if (u < 16 && CUBE_POS_X * 17 + u < CUBE_LEN(y))\n"
    "        CUBE_AT(y, CUBE_POS_X * 17 + u) = hist[u];\n"
    "    if (u == 16 && CUBE_POS_X * 17 + 16 < CUBE_LEN(y))\n"
    "        CUBE_AT(y, CUBE_POS_X * 17 + 16) = (uint32_t)fsum[0];\n"
    "}\n";

/* Refused: a barrier under a condition that depends on the unit (every
 * unit still reaches the same barriers, so fibers run it right). */
static const char unit_if_src[] =
    "CUBE_KERNEL(unit_if, CUBE_INOUT(uint32_t, y), CUBE_SHARED(uint32_t, s, "
    "64))\n"
    "{\n"
    "    uint32_t u = UNIT_POS_X;\n"
    "    s[u] = u * 7u;\n"
    "    if (u < 64) {\n"
    "        cube_sync();\n"
    "        CUBE_AT(y, ABSOLUTE_POS_X) = s[63 - u] + 1u;\n"
    "    }\n"
    "}\n";

/* Refused: an early return before a barrier (the CPU backend tolerates it
 * with fibers: a finished unit leaves the rotation). */
static const char early_return_src[] =
    "CUBE_KERNEL(early_return, CUBE_INOUT(uint32_t, y), "
    "CUBE_SHARED(uint32_t, s, 32))\n"
    "{\n"
    "    uint32_t u = UNIT_POS_X;\n"
    "    s[u] = u + 100u;\n"
    "    if (ABSOLUTE_POS_X >= CUBE_LEN(y))\n"
    "        return;\n"
    "    cube_sync();\n"
    "    CUBE_AT(y, ABSOLUTE_POS_X) = s[31 - u];\n"
    "}\n";

/* Statements under conditions that fix a unit position (`if (tx == 0)`,
 * tx a unit position never changed) in a 3-D cube: equalities written
 * either way round, joined by &&, with a scalar, with values no unit has,
 * beside conditions the pass leaves in the loop over all units; the
 * statements after them read what they wrote. */
static const char peel_src[] =
    "CUBE_KERNEL(peel, CUBE_INOUT(uint32_t, y), CUBE_SCALAR(uint32_t, n),\n"
    "            CUBE_SHARED(uint32_t, s, 64))\n"
    "{\n"
    "    uint32_t tx = UNIT_POS_X;\n"
    "    int ty = UNIT_POS_Y;\n"
    "    long long tz = (long long)UNIT_POS_Z;\n"
    "    uint32_t i = tx + 8u * ((uint32_t)ty + 4u * (uint32_t)tz);\n"
    "    uint64_t a = ABSOLUTE_POS_X + 100u * ABSOLUTE_POS_Y;\n"
    "    s[i] = (uint32_t)a;\n"
    "    if (tx == 0)\n"
    "        s[i] += 1000u;\n"
    "    if (7u == tx && ty == 3)\n"
    "        s[i] += 2000u;\n"
    "    if (UNIT_POS_Z == 1)\n"
    "        s[i] *= 3u;\n"
    "    if (tx == n)\n"
    "        s[i] += 5u;\n"
    "    if (ty == -1)\n"
    "        s[i] = 0u;\n"
    "    if (tx == 40u)\n"
    "        s[i] = 1u;\n"
    "    if (tx == 1 && UNIT_POS_Z == 0 && ty == 2) {\n"
    "        s[i] ^= 0xffu;\n"
    "        s[i] += (uint32_t)a;\n"
    "    }\n"
    "    if (tx < 2)\n"
    "        s[i] += 7u;\n"
    "    s[i] += (uint32_t)tz;\n"
    "    cube_sync();\n"
    "    CUBE_AT(y, CUBE_POS_X * 64 + i) = s[63 - i] + i;\n"
    "}\n";

/* ------------------------------------------------------------ helpers */

#define OK(expr)                                                               \
    do {                                                                       \
        cube_error *err_ = (expr);                                             \
        if (err_) {                                                            \
            char *t_ = cube_error_format(err_);                                \
            fail_msg("%s: %s", #expr, t_ ? t_ : "?");                          \
        }                                                                      \
    } while (0)

/* The kernels' info lines, as the sink saw them; those of the last run
 * with cpu_barriers auto. */
static char log_lines[16384];
static char auto_lines[16384];

static void sink(void *user, cube_log_level level, const char *category,
                 const char *message)
{
    (void)user;
    (void)level;
    if (strcmp(category, "compile") != 0 || !strstr(message, "runs its units"))
        return;
    size_t n = strlen(log_lines);
    snprintf(log_lines + n, sizeof log_lines - n, "%s\n", message);
}

/* The line logged for kernel `name`, or NULL. */
static const char *line_for(const char *name)
{
    char key[96];
    snprintf(key, sizeof key, "kernel '%s' runs", name);
    return strstr(log_lines, key);
}

static int ran_as_loops(const char *name)
{
    const char *l = line_for(name);
    assert_non_null(l);
    return strncmp(strstr(l, "runs its units as ") + 18, "loops", 5) == 0;
}

typedef struct run_spec {
    const char *name, *source;
    uint32_t dim[3], count[3];
    /* Inputs (x, uint32 or float) and outputs (y) in bytes; scalars. */
    size_t in_bytes, out_bytes;
    int nscalars;
    cube_arg scalars[2];
    int float_in; /* the input holds whole numbers as floats */
    int two_in;   /* two inputs (matmul: a, b) */
} run_spec;

/* The disk cache of run()'s clients: "" (none) unless a test sets one. */
static const char *run_cache_dir = "";

/* Runs `sp` on a fresh client with cpu_barriers set to `mode` and returns
 * the output bytes (caller frees). */
static unsigned char *run(const run_spec *sp, const char *mode,
                          uint32_t launch_mode)
{
    setenv("CUBERT_CPU_BARRIERS", mode, 1);
    cube_client_options o;
    memset(&o, 0, sizeof o);
    o.struct_size = sizeof o;
    o.cache_dir = run_cache_dir;
    o.cpu_threads = 2;
    cube_client *c;
    OK(cube_client_open("cpu", &o, &c));
    cube_kernel *k;
    cube_kernel_desc d = {
        sp->name, sp->source, {sp->dim[0], sp->dim[1], sp->dim[2]}};
    OK(cube_kernel_create(&d, &k));
    unsigned char *in = malloc(sp->in_bytes + 4);
    unsigned char *out = calloc(1, sp->out_bytes);
    assert_non_null(in);
    assert_non_null(out);
    for (size_t i = 0; i < sp->in_bytes / 4; i++) {
        uint32_t v = (uint32_t)(i * 2654435761u) >> 7;
        if (sp->float_in) {
            float f = (float)(v % 9) - 4.0f;
            memcpy(in + 4 * i, &f, 4);
        } else {
            memcpy(in + 4 * i, &v, 4);
        }
    }
    cube_handle hin, hin2, hout;
    cube_arg args[6];
    int na = 0;
    if (sp->in_bytes) {
        OK(cube_create(c, in, sp->in_bytes, &hin));
        args[na++] = cube_arg_buffer(hin);
    }
    if (sp->two_in) {
        OK(cube_create(c, in, sp->in_bytes, &hin2));
        args[na++] = cube_arg_buffer(hin2);
    }
    OK(cube_create(c, out, sp->out_bytes, &hout));
    args[na++] = cube_arg_buffer(hout);
    for (int i = 0; i < sp->nscalars; i++)
        args[na++] = sp->scalars[i];
    OK(cube_launch(c, k,
                   cube_count_static(sp->count[0], sp->count[1], sp->count[2]),
                   args, (uint32_t)na, CUBE_LAUNCH_EXECUTE | launch_mode));
    cube_copy_desc cd =
        cube_copy_desc_contiguous(hout, sp->out_bytes, sizeof(uint32_t));
    void *dst[] = {out};
    uint64_t size[] = {sp->out_bytes};
    OK(cube_read(c, &cd, dst, size, 1));
    if (sp->in_bytes)
        cube_error_free(cube_handle_release(c, hin));
    if (sp->two_in)
        cube_error_free(cube_handle_release(c, hin2));
    cube_error_free(cube_handle_release(c, hout));
    cube_kernel_release(k);
    cube_client_close(c);
    free(in);
    unsetenv("CUBERT_CPU_BARRIERS");
    return out;
}

/* Runs `sp` both ways, plain and checked, expecting the same bytes, and
 * returns whether the pass took it. */
static int same_both_ways(const run_spec *sp)
{
    int loops = -1;
    for (int checked = 0; checked < 2; checked++) {
        uint32_t lm = checked ? CUBE_LAUNCH_CHECKED : 0;
        log_lines[0] = '\0';
        unsigned char *fast = run(sp, "auto", lm);
        int took = ran_as_loops(sp->name);
        memcpy(auto_lines, log_lines, sizeof auto_lines);
        assert_true(loops < 0 || loops == took);
        loops = took;
        log_lines[0] = '\0';
        unsigned char *slow = run(sp, "fibers", lm);
        assert_false(ran_as_loops(sp->name));
        assert_non_null(strstr(line_for(sp->name), "cpu_barriers is fibers"));
        assert_memory_equal(fast, slow, sp->out_bytes);
        free(fast);
        free(slow);
    }
    return loops;
}

static int setup(void **state)
{
    (void)state;
    cube_log_set_level(CUBE_LOG_INFO);
    cube_log_set_sink(sink, NULL);
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    cube_log_set_sink(NULL, NULL);
    cube_log_set_level(CUBE_LOG_WARN);
    return 0;
}

/* Whether this machine has libclang (the pass refuses every kernel
 * without it, saying so). */
static int have_libclang(void)
{
    static const char src[] = "#include <stddef.h>\n";
    unsigned dim[3] = {1, 1, 1};
    char *out = NULL;
    char why[256];
    cpu_barrier_pass_transform(src, "none", dim, &out, why, sizeof why);
    free(out);
    return strstr(why, "libclang is not available") == NULL &&
           strstr(why, "without libclang") == NULL;
}

/* ------------------------------------------------------------ tests */

static void matmul_both_ways(void **state)
{
    (void)state;
    const uint32_t n = 45; /* not a multiple of the tile */
    run_spec sp = {"matmul_tiled",
                   matmul_src,
                   {16, 16, 1},
                   {(n + 15) / 16, (n + 15) / 16, 1},
                   4u * n * n,
                   4u * n * n,
                   1,
                   {cube_arg_u32(n)},
                   1,
                   1};
    int loops = same_both_ways(&sp);
    if (have_libclang())
        assert_true(loops);
}

/* A new process (here: a new client) with the object on disk loads it
 * without running the pass; the results are the same. */
static void disk_hit_skips_the_pass(void **state)
{
    (void)state;
    if (!have_libclang())
        skip();
    char *dir = make_tmpdir_named("/tmp/cubert-barrier-cache-XXXXXX");
    run_cache_dir = dir;
    const uint32_t n = 40;
    run_spec sp = {"matmul_tiled",
                   matmul_src,
                   {16, 16, 1},
                   {(n + 15) / 16, (n + 15) / 16, 1},
                   4u * n * n,
                   4u * n * n,
                   1,
                   {cube_arg_u32(n)},
                   1,
                   1};
    log_lines[0] = '\0';
    unsigned char *first = run(&sp, "auto", 0);
    assert_true(ran_as_loops(sp.name));
    assert_non_null(strstr(line_for(sp.name), "pass "));
    log_lines[0] = '\0';
    unsigned char *again = run(&sp, "auto", 0);
    assert_true(ran_as_loops(sp.name));
    assert_non_null(strstr(line_for(sp.name), "from the disk cache"));
    assert_memory_equal(first, again, sp.out_bytes);
    /* Other flags (checked mode) are another entry: the pass runs. */
    log_lines[0] = '\0';
    unsigned char *other = run(&sp, "auto", CUBE_LAUNCH_CHECKED);
    assert_true(ran_as_loops(sp.name));
    assert_non_null(strstr(line_for(sp.name), "pass "));
    assert_memory_equal(first, other, sp.out_bytes);
    free(first);
    free(again);
    free(other);
    run_cache_dir = "";
    rm_tree(dir);
}

extern const char cube_prelude_common[];
extern const char cube_prelude_cpu[];

/* The pass's output for `user` (the kernel `name`) in a cube of `dim`, or NULL
 * when it refuses. Freed by the caller. */
static char *transformed(const char *user, const char *name,
                         const unsigned dim[3])
{
    size_t cap = strlen(cube_prelude_cpu) + strlen(cube_prelude_common) +
                 strlen(user) + 64;
    char *source = malloc(cap);
    assert_non_null(source);
    snprintf(source, cap, "%s\n%s\n#line 1 \"k.cube.c\"\n%s\n",
             cube_prelude_cpu, cube_prelude_common, user);
    char *out = NULL;
    char why[256];
    cpu_barrier_pass_status st =
        cpu_barrier_pass_transform(source, name, dim, &out, why, sizeof why);
    free(source);
    if (st != CPU_BARRIER_PASS_DONE) {
        free(out);
        return NULL;
    }
    if (getenv("CUBE_TEST_PRINT_PASS"))
        printf("%s\n", out);
    return out;
}

/* A grid-stride loop that reads a buffer at its counter prefetches that
 * buffer some steps ahead (into L2: the hardware prefetchers do not follow
 * runs of a few lines far apart); one that reads at another index, or only
 * shared memory, does not. */
static void stride_loop_prefetches(void **state)
{
    (void)state;
    if (!have_libclang())
        skip();
    unsigned dim[3] = {256, 1, 1};
    char *out = transformed(sum_src, "sum_all", dim);
    assert_non_null(out);
    assert_non_null(strstr(out, "__builtin_prefetch"));
    free(out);
    static const char scaled[] =
        "CUBE_KERNEL(k, CUBE_IN(float, x), CUBE_OUT(float, y),\n"
        "            CUBE_SHARED(float, s, 256))\n"
        "{\n"
        "    uint64_t stride = (uint64_t)CUBE_COUNT_X * CUBE_DIM_X;\n"
        "    float acc = 0.0f;\n"
        "    for (uint64_t i = ABSOLUTE_POS_X; i < CUBE_LEN(x) / 2; i += "
        "stride)\n"
        "        acc += CUBE_AT(x, 2 * i);\n"
        "    s[UNIT_POS_X] = acc;\n"
        "    cube_sync();\n"
        "    CUBE_AT(y, ABSOLUTE_POS_X) = s[255 - UNIT_POS_X];\n"
        "}\n";
    out = transformed(scaled, "k", dim);
    assert_non_null(out);
    assert_null(strstr(out, "__builtin_prefetch"));
    free(out);
    dim[0] = 32;
    out = transformed(strided_src, "strided", dim);
    assert_non_null(out);
    const char *first = strstr(out, "__builtin_prefetch");
    assert_non_null(first);
    assert_non_null(strstr(first + 1, "__builtin_prefetch"));
    free(out);
    run_spec sp = {"strided", strided_src, {32, 1, 1}, {3, 1, 1}, 4u * 1000,
                   4u * 96,   0,           {{0}},      0,         0};
    assert_true(same_both_ways(&sp));
}

static void sum_both_ways(void **state)
{
    (void)state;
    /* Whole numbers in floats: every order of addition gives the same
     * sum, so the atomic's order cannot change the bytes. */
    run_spec sp = {"sum_all", sum_src, {256, 1, 1}, {7, 1, 1}, 4u * 100003u,
                   4,         0,       {{0}},       1,         0};
    int loops = same_both_ways(&sp);
    if (have_libclang())
        assert_true(loops);
}

static void stencil_both_ways(void **state)
{
    (void)state;
    /* Not a multiple of the cube along either axis: the halo reads zeros
     * and the units past the edge still reach the barrier. */
    const uint32_t w = 70, h = 21;
    run_spec sp = {"stencil_shared",
                   stencil_src,
                   {32, 8, 1},
                   {(w + 31) / 32, (h + 7) / 8, 1},
                   4u * w * h,
                   4u * w * h,
                   2,
                   {cube_arg_u32(w), cube_arg_u32(h)},
                   1,
                   0};
    int loops = same_both_ways(&sp);
    if (have_libclang())
        assert_true(loops);
    /* The same numbers as the stencil without shared memory. */
    unsigned char *shared = run(&sp, "auto", 0);
    run_spec pl = sp;
    pl.name = "stencil_plain";
    pl.source = stencil_plain_src;
    unsigned char *plain = run(&pl, "auto", 0);
    assert_memory_equal(shared, plain, sp.out_bytes);
    free(shared);
    free(plain);
}

/* How many times `what` occurs in `s`. */
static int count_of(const char *s, const char *what)
{
    int k = 0;
    for (const char *p = strstr(s, what); p; p = strstr(p + 1, what))
        k++;
    return k;
}

#define PEELED "only the units the condition allows"

/* A statement under `if (<unit position> == <uniform integer>)` runs in a
 * loop over the units where that can hold; the same bytes as fibers. */
static void guarded_statements_peeled(void **state)
{
    (void)state;
    if (have_libclang()) {
        unsigned dim[3] = {32, 8, 1};
        char *out = transformed(stencil_src, "stencil_shared", dim);
        assert_non_null(out);
        assert_int_equal(count_of(out, PEELED), 4);
        free(out);
        unsigned pdim[3] = {8, 4, 2};
        out = transformed(peel_src, "peel", pdim);
        assert_non_null(out);
        /* All but `tx < 2`. */
        assert_int_equal(count_of(out, PEELED), 7);
        free(out);
    }
    for (uint32_t n = 3; n <= 9; n += 6) { /* 9: no unit has x == n */
        run_spec sp = {"peel", peel_src, {8, 4, 2}, {3, 2, 1},
                       0,      4u * 192, 1,         {cube_arg_u32(n)}};
        int loops = same_both_ways(&sp);
        if (have_libclang())
            assert_true(loops);
    }
}

/* Conditions the pass must leave in the loop over all units, and a barrier
 * under such a condition (the whole kernel then runs as fibers). */
static void guarded_statements_kept(void **state)
{
    (void)state;
    if (!have_libclang())
        skip();
    static const char *const kept[] = {
        /* the position's variable changes */
        "uint32_t u = UNIT_POS_X; s[u] = 1u; u = u + 0u; if (u == 0) s[1] = "
        "2u;",
        "uint32_t u = UNIT_POS_X; u++; if (u == 1) s[0] = 2u;",
        /* not an equality, an else, a value that may differ per unit */
        "uint32_t u = UNIT_POS_X; s[u] = 1u; if (u < 1) s[0] = 2u;",
        "uint32_t u = UNIT_POS_X; s[u] = 1u; if (u != 0) s[u] = 2u;",
        "uint32_t u = UNIT_POS_X; s[u] = 1u; if (u == 0) s[0] = 2u; else s[u] "
        "= 3u;",
        "uint32_t u = UNIT_POS_X; s[u] = 1u; if (u == CUBE_AT(y, 0)) s[u] = "
        "2u;",
        "uint32_t u = UNIT_POS_X; s[u] = 1u; if (u == 0 || n == 0) s[u] = 2u;",
        /* an absolute position, not the unit's */
        "uint64_t g = ABSOLUTE_POS_X; s[UNIT_POS_X] = 1u; if (g == 0) s[0] = "
        "2u;",
        /* a type that does not hold every position, a float compare */
        "uint8_t u = (uint8_t)UNIT_POS_X; s[UNIT_POS_X] = 1u; if (u == 0) "
        "s[UNIT_POS_X] = 2u;",
        "float f = UNIT_POS_X; s[UNIT_POS_X] = 1u; if (f == 0.0f) s[0] = 2u;",
        "uint32_t u = UNIT_POS_X; s[u] = 1u; if (u == 0.5f) s[0] = 2u;",
        /* a value made for the unit before the condition, used under it */
        "uint32_t u = UNIT_POS_X; uint32_t v = CUBE_AT(y, u); s[u] = v; if (u "
        "== 0) s[1] = v;",
        /* a call whose order between units shows */
        "uint32_t u = UNIT_POS_X; s[u] = 1u; if (u == 0) "
        "cube_atomic_add_u32(&s[0], 1u);",
    };
    for (size_t i = 0; i < sizeof kept / sizeof kept[0]; i++) {
        char user[1024];
        snprintf(user, sizeof user,
                 "CUBE_KERNEL(k, CUBE_INOUT(uint32_t, y), "
                 "CUBE_SCALAR(uint32_t, n), CUBE_SHARED(uint32_t, s, 512))\n"
                 "{\n%s\ncube_sync();\nCUBE_AT(y, ABSOLUTE_POS_X) = "
                 "s[UNIT_POS_X] + n;\n}\n",
                 kept[i]);
        unsigned dim[3] = {512, 1, 1};
        char *out = transformed(user, "k", dim);
        if (!out)
            fail_msg("case %zu: refused", i);
        if (strstr(out, PEELED))
            fail_msg("case %zu: split", i);
        free(out);
    }
    static const char barrier_src[] =
        "CUBE_KERNEL(guarded_sync, CUBE_INOUT(uint32_t, y),\n"
        "            CUBE_SHARED(uint32_t, s, 32))\n"
        "{\n"
        "    uint32_t u = UNIT_POS_X;\n"
        "    s[u] = u;\n"
        "    if (u == 0) {\n"
        "        s[0] = 99u;\n"
        "        cube_sync();\n"
        "    }\n"
        "    CUBE_AT(y, ABSOLUTE_POS_X) = s[u];\n"
        "}\n";
    unsigned dim[3] = {32, 1, 1};
    assert_null(transformed(barrier_src, "guarded_sync", dim));
}

static void mixed_both_ways(void **state)
{
    (void)state;
    for (int flip = -1; flip <= 1; flip += 2) {
        run_spec sp = {"mixed",   mixed_src,
                       {8, 4, 1}, {5, 1, 1},
                       4u * 150,  4u * 150,
                       2,         {cube_arg_u32(3), cube_arg_i32(flip)},
                       0};
        int loops = same_both_ways(&sp);
        if (have_libclang())
            assert_true(loops);
    }
}

static void shared_atomics_both_ways(void **state)
{
    (void)state;
    run_spec sp = {
        "shared_atomics", atomics_src, {64, 1, 1}, {9, 1, 1}, 4u * 500,
        4u * 9 * 17,      0,           {{0}},      0};
    int loops = same_both_ways(&sp);
    if (have_libclang())
        assert_true(loops);
}

static void refused_kernels_run_as_fibers(void **state)
{
    (void)state;
    run_spec a = {"unit_if", unit_if_src, {64, 1, 1}, {3, 1, 1}, 0,
                  4u * 192,  0,           {{0}},      0};
    assert_false(same_both_ways(&a));
    if (have_libclang())
        assert_non_null(strstr(auto_lines, "may differ"));
    run_spec b = {"early_return",
                  early_return_src,
                  {32, 1, 1},
                  {2, 1, 1},
                  0,
                  4u * 50,
                  0,
                  {{0}},
                  0};
    assert_false(same_both_ways(&b));
    if (have_libclang())
        assert_non_null(strstr(auto_lines, "return before"));
}

/* What the pass says about kernels it must refuse, without running them. */
static void refusals_name_the_reason(void **state)
{
    (void)state;
    if (!have_libclang())
        skip();
    static const struct {
        const char *body, *why;
    } cases[] = {
        {"uint32_t u = UNIT_POS_X; switch (u) { case 0: cube_sync(); break; "
         "default: cube_sync(); }",
         "switch"},
        {"uint32_t u = UNIT_POS_X; for (uint32_t i = 0; i < 4; i++) { if (i "
         "== n) break; cube_sync(); } CUBE_AT(y, u) = u;",
         "break"},
        {"uint32_t u = UNIT_POS_X; again: cube_sync(); if (u > 100) goto "
         "again; CUBE_AT(y, u) = u;",
         "goto"},
        {"uint32_t u = UNIT_POS_X; uint32_t *p = &u; cube_sync(); CUBE_AT(y, "
         "0) = *p;",
         "address"},
        {"uint32_t u = 0; while (CUBE_AT(y, u) < n) { u++; cube_sync(); }",
         "may differ"},
        {"uint32_t v = CUBE_AT(y, UNIT_POS_X); for (uint32_t i = 0; i < v; "
         "i++) cube_sync();",
         "may differ"},
        {"CUBE_AT(y, 0) = (cube_sync(), 1u);", "inside an expression"},
        {"uint32_t a[4] = {0}; a[UNIT_POS_X % 4] = 1; cube_sync(); "
         "CUBE_AT(y, UNIT_POS_X) = a[0];",
         "not a scalar"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char user[1024], *source;
        snprintf(
            user, sizeof user,
            "CUBE_KERNEL(k, CUBE_INOUT(uint32_t, y), CUBE_SCALAR(uint32_t, "
            "n))\n{\n%s\n}\n",
            cases[i].body);
        size_t cap = strlen(cube_prelude_cpu) + strlen(cube_prelude_common) +
                     strlen(user) + 64;
        source = malloc(cap);
        assert_non_null(source);
        snprintf(source, cap, "%s\n%s\n#line 1 \"k.cube.c\"\n%s\n",
                 cube_prelude_cpu, cube_prelude_common, user);
        unsigned dim[3] = {32, 1, 1};
        char *out = NULL;
        char why[256];
        cpu_barrier_pass_status st =
            cpu_barrier_pass_transform(source, "k", dim, &out, why, sizeof why);
        if (st != CPU_BARRIER_PASS_REFUSED || !strstr(why, cases[i].why))
            fail_msg("case %zu: status %d, '%s' (expected '%s')", i, (int)st,
                     why, cases[i].why);
        assert_null(out);
        free(source);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(matmul_both_ways),
        cmocka_unit_test(sum_both_ways),
        cmocka_unit_test(stride_loop_prefetches),
        cmocka_unit_test(disk_hit_skips_the_pass),
        cmocka_unit_test(stencil_both_ways),
        cmocka_unit_test(guarded_statements_peeled),
        cmocka_unit_test(guarded_statements_kept),
        cmocka_unit_test(mixed_both_ways),
        cmocka_unit_test(shared_atomics_both_ways),
        cmocka_unit_test(refused_kernels_run_as_fibers),
        cmocka_unit_test(refusals_name_the_reason),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
