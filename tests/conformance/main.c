/* The conformance suite's entry point: `conformance <backend>`.
 *
 * Exits 77 (ctest's SKIP_RETURN_CODE) with "SKIP: <backend>: <message>" when
 * the backend is not built in or cannot run here; otherwise runs every test
 * of CONF_TESTS against one client opened in the group setup. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "conformance.h"

conf_state conf;

/* --- kernel sources
 * ----------------------------------------------------------- */

static const char SRC_SCALE_ADD[] =
    "CUBE_KERNEL(scale_add, CUBE_IN(float, x), CUBE_INOUT(float, y),\n"
    "            CUBE_SCALAR(float, a))\n"
    "{\n"
    "    uint32_t i = ABSOLUTE_POS_X;\n"
    "    if (i < CUBE_LEN(y))\n"
    "        y[i] = a * x[i] + y[i];\n"
    "}\n";

static const char SRC_SCALE[] =
    "CUBE_KERNEL(scale, CUBE_IN(float, x), CUBE_OUT(float, y),\n"
    "            CUBE_SCALAR(float, a))\n"
    "{\n"
    "    uint32_t i = ABSOLUTE_POS_X;\n"
    "    if (i < CUBE_LEN(y))\n"
    "        y[i] = a * x[i];\n"
    "}\n";

static const char SRC_FILL[] =
    "CUBE_KERNEL(fill, CUBE_OUT(uint32_t, y), CUBE_SCALAR(uint32_t, v))\n"
    "{\n"
    "    uint32_t i = ABSOLUTE_POS_X;\n"
    "    if (i < CUBE_LEN(y))\n"
    "        y[i] = v + i;\n"
    "}\n";

static const char SRC_POSITIONS[] =
    "CUBE_KERNEL(positions, CUBE_OUT(uint32_t, px), CUBE_OUT(uint32_t, py),\n"
    "            CUBE_OUT(uint32_t, pz), CUBE_OUT(uint32_t, lin))\n"
    "{\n"
    "    uint32_t w = CUBE_COUNT_X * CUBE_DIM_X, h = CUBE_COUNT_Y * "
    "CUBE_DIM_Y;\n"
    "    uint32_t x = ABSOLUTE_POS_X, y = ABSOLUTE_POS_Y, z = ABSOLUTE_POS_Z;\n"
    "    uint32_t i = x + w * (y + h * z);\n"
    "    if (i < CUBE_LEN(px)) {\n"
    "        px[i] = (ABSOLUTE_POS == i) ? x : 0xFFFFFFFFu;\n"
    "        py[i] = y;\n"
    "        pz[i] = z;\n"
    "        lin[i] = CUBE_POS * CUBE_DIM + UNIT_POS;\n"
    "    }\n"
    "}\n";

static const char SRC_SCALARS[] =
    "CUBE_KERNEL(scalars, CUBE_OUT(double, fd), CUBE_OUT(uint64_t, iu),\n"
    "            CUBE_SCALAR(float, f), CUBE_SCALAR(double, d),\n"
    "            CUBE_SCALAR(int32_t, i), CUBE_SCALAR(uint64_t, u),\n"
    "            CUBE_SCALAR(uint8_t, b), CUBE_SCALAR(int16_t, h))\n"
    "{\n"
    "    if (ABSOLUTE_POS_X == 0) {\n"
    "        fd[0] = (double)f;\n"
    "        fd[1] = d;\n"
    "        iu[0] = (uint64_t)(int64_t)i;\n"
    "        iu[1] = u;\n"
    "        iu[2] = (uint64_t)b;\n"
    "        iu[3] = (uint64_t)(int64_t)h;\n"
    "    }\n"
    "}\n";

static const char SRC_REVERSE[] =
    "CUBE_KERNEL(reverse, CUBE_IN(float, x), CUBE_OUT(float, y),\n"
    "            CUBE_SHARED(float, tile, 1024))\n"
    "{\n"
    "    uint32_t u = UNIT_POS_X, i = ABSOLUTE_POS_X;\n"
    "    tile[u] = x[i];\n"
    "    cube_sync();\n"
    "    y[i] = tile[CUBE_DIM_X - 1 - u];\n"
    "}\n";

static const char SRC_REDUCE[] =
    "CUBE_KERNEL(reduce, CUBE_IN(float, x), CUBE_OUT(float, sums),\n"
    "            CUBE_SHARED(float, part, 1024))\n"
    "{\n"
    "    uint32_t u = UNIT_POS_X;\n"
    "    part[u] = x[ABSOLUTE_POS_X];\n"
    "    cube_sync();\n"
    "    for (uint32_t s = CUBE_DIM_X / 2; s > 0; s /= 2) {\n"
    "        if (u < s)\n"
    "            part[u] += part[u + s];\n"
    "        cube_sync();\n"
    "    }\n"
    "    if (u == 0)\n"
    "        sums[CUBE_POS_X] = part[0];\n"
    "}\n";

static const char SRC_ATOMIC_INT[] =
    "CUBE_KERNEL(atomic_int, CUBE_IN(uint32_t, x), CUBE_INOUT(uint32_t, "
    "total),\n"
    "            CUBE_INOUT(uint32_t, bins), CUBE_INOUT(int32_t, neg))\n"
    "{\n"
    "    uint32_t i = ABSOLUTE_POS_X;\n"
    "    if (i < CUBE_LEN(x)) {\n"
    "        cube_atomic_add_u32(&total[0], x[i]);\n"
    "        cube_atomic_add_u32(&bins[i % CUBE_LEN(bins)], 1u);\n"
    "        cube_atomic_add_i32(&neg[0], -1);\n"
    "    }\n"
    "}\n";

static const char SRC_ATOMIC_F32[] =
    "CUBE_KERNEL(atomic_f32, CUBE_IN(float, x), CUBE_INOUT(float, acc))\n"
    "{\n"
    "    uint32_t i = ABSOLUTE_POS_X;\n"
    "    if (i < CUBE_LEN(x))\n"
    "        cube_atomic_add_f32(&acc[0], x[i]);\n"
    "}\n";

static const char SRC_WRITE_COUNT[] =
    "CUBE_KERNEL(write_count, CUBE_OUT(uint32_t, cnt), CUBE_SCALAR(uint32_t, "
    "n))\n"
    "{\n"
    "    if (ABSOLUTE_POS_X == 0) {\n"
    "        cnt[0] = n;\n"
    "        cnt[1] = 1;\n"
    "        cnt[2] = 1;\n"
    "    }\n"
    "}\n";

static const char SRC_COUNT_PROBE[] =
    "CUBE_KERNEL(count_probe, CUBE_OUT(uint32_t, y))\n"
    "{\n"
    "    uint32_t i = ABSOLUTE_POS_X;\n"
    "    if (i < CUBE_LEN(y))\n"
    "        y[i] = CUBE_COUNT_X * 1000u + CUBE_POS_X;\n"
    "}\n";

static const char SRC_OOB_WRITE[] =
    "CUBE_KERNEL(oob_write, CUBE_OUT(uint32_t, y), CUBE_SCALAR(uint32_t, v))\n"
    "{\n"
    "    CUBE_AT(y, ABSOLUTE_POS_X) = v;\n"
    "}\n";

static const char SRC_OOB_READ[] =
    "CUBE_KERNEL(oob_read, CUBE_IN(uint32_t, x), CUBE_OUT(uint32_t, y),\n"
    "            CUBE_SCALAR(uint32_t, off))\n"
    "{\n"
    "    uint32_t i = ABSOLUTE_POS_X;\n"
    "    if (i < CUBE_LEN(y))\n"
    "        y[i] = CUBE_AT(x, (unsigned long long)i + off);\n"
    "}\n";

static const char SRC_MATH[] =
    "CUBE_DEVICE float conf_twice(float v) { return 2.0f * v; }\n"
    "CUBE_KERNEL(math, CUBE_IN(float, x), CUBE_OUT(float, y))\n"
    "{\n"
    "    uint32_t i = ABSOLUTE_POS_X;\n"
    "    if (i < CUBE_LEN(y)) {\n"
    "        float v = x[i];\n"
    "        y[i] = sqrtf(fabsf(v)) + expf(0.0f) + CUBE_MAX(v, 0.0f) -\n"
    "               CUBE_MIN(v, 0.0f) + conf_twice(v);\n"
    "    }\n"
    "}\n";

static const char SRC_TWO_ENTRIES[] =
    "CUBE_KERNEL(entry_one, CUBE_OUT(uint32_t, y))\n"
    "{\n"
    "    if (ABSOLUTE_POS_X == 0) y[0] = 1;\n"
    "}\n"
    "CUBE_KERNEL(entry_two, CUBE_OUT(uint32_t, y))\n"
    "{\n"
    "    if (ABSOLUTE_POS_X == 0) y[0] = 2;\n"
    "}\n";

static const char SRC_BROKEN[] =
    "CUBE_KERNEL(broken, CUBE_IN(float, x), CUBE_OUT(float, y),\n"
    "            CUBE_OUT(float, z))\n"
    "{\n"
    "    y[0] = conf_undeclared_identifier + x[0];\n"
    "    z[0] = 0.0f;\n"
    "}\n";

static const char SRC_OTHER_ENTRY[] =
    "CUBE_KERNEL(something_else, CUBE_OUT(float, y))\n"
    "{\n"
    "    y[0] = 1.0f;\n"
    "}\n";

static const char SRC_MARK[] = "CUBE_KERNEL(mark, CUBE_OUT(uint8_t, y))\n"
                               "{\n"
                               "    if (ABSOLUTE_POS == 0) y[0] = 0;\n"
                               "}\n";

static const char SRC_LIMITS[] =
    "CUBE_KERNEL(limits, CUBE_IN(float, x), CUBE_OUT(float, y))\n"
    "{\n"
    "    uint32_t i = ABSOLUTE_POS;\n"
    "    if (i < CUBE_LEN(y)) y[i] = x[i];\n"
    "}\n";

static const char SRC_SKIP_PROBE[] =
    "CUBE_KERNEL(skip_probe, CUBE_OUT(uint32_t, y), CUBE_SCALAR(uint32_t, v))\n"
    "{\n"
    "    uint32_t i = ABSOLUTE_POS_X;\n"
    "    if (i < CUBE_LEN(y)) y[i] = v;\n"
    "}\n";

/* x = 3x + 1 (mod 2^32), `iters` times, in place: each result depends on
 * what the buffer held before, so a launch that misses a rewrite shows. */
static const char SRC_REWRITE[] =
    "CUBE_KERNEL(rewrite, CUBE_INOUT(uint32_t, x), CUBE_SCALAR(uint32_t, "
    "iters))\n"
    "{\n"
    "    int i = (int)ABSOLUTE_POS_X;\n"
    "    if (i < (int)CUBE_LEN(x)) {\n"
    "        uint32_t v = x[i];\n"
    "        for (uint32_t k = 0; k < iters; k++)\n"
    "            v = v * 3u + 1u;\n"
    "        x[i] = v;\n"
    "    }\n"
    "}\n";

/* v = x[i] taken through x = 3x + 1 `iters` times, then y[i] = v plus a
 * neighbour of x chosen by v: the second read comes after the loop and
 * cannot be hoisted, so the kernel keeps reading x until it ends. */
static const char SRC_SPIN[] =
    "CUBE_KERNEL(spin, CUBE_IN(uint32_t, x), CUBE_OUT(uint32_t, y),\n"
    "            CUBE_SCALAR(uint32_t, iters))\n"
    "{\n"
    "    int i = (int)ABSOLUTE_POS_X;\n"
    "    if (i < (int)CUBE_LEN(y) && i < (int)CUBE_LEN(x)) {\n"
    "        uint32_t n = (uint32_t)CUBE_LEN(x);\n"
    "        uint32_t v = x[i];\n"
    "        for (uint32_t k = 0; k < iters; k++)\n"
    "            v = v * 3u + 1u;\n"
    "        uint32_t j = (uint32_t)i + 1u + (v & 1u);\n"
    "        while (j >= n)\n"
    "            j -= n;\n"
    "        y[i] = v + x[j];\n"
    "    }\n"
    "}\n";

/* Stops on a device fault: unit 0 traps, the others write. */
static const char SRC_TRAP[] =
    "CUBE_KERNEL(fault_trap, CUBE_INOUT(uint32_t, y))\n"
    "{\n"
    "    uint32_t i = ABSOLUTE_POS_X;\n"
    "    if (i == 0) {\n"
    "        cube_trap();\n"
    "        return;\n"
    "    }\n"
    "    if (i < CUBE_LEN(y))\n"
    "        y[i] = 7u;\n"
    "}\n";

/* Shared memory of `bytes` bytes per cube: the struct the prelude makes
 * holds one char before the array, so the array gets bytes - 1. */
static char *shared_source(const char *name, uint64_t bytes)
{
    static const char fmt[] =
        "CUBE_KERNEL(%s, CUBE_IN(float, x), CUBE_OUT(float, y),\n"
        "            CUBE_SHARED(unsigned char, scratch, %lluull))\n"
        "{\n"
        "    uint32_t i = ABSOLUTE_POS_X;\n"
        "    scratch[i %% %lluull] = 1;\n"
        "    scratch[%lluull - 1] = 2;\n"
        "    if (i < CUBE_LEN(y)) y[i] = x[i] + (float)scratch[%lluull - 1];\n"
        "}\n";
    unsigned long long n = (unsigned long long)(bytes - 1);
    size_t cap = sizeof fmt + 128;
    char *s = malloc(cap);
    assert_non_null(s);
    snprintf(s, cap, fmt, name, n, n, n, n);
    return s;
}

static void make_kernels(void)
{
    conf_kernels *k = &conf.k;
    const cube_properties *p = &conf.props;
    k->scale_add = conf_kernel("scale_add", SRC_SCALE_ADD, 64, 1, 1);
    k->scale = conf_kernel("scale", SRC_SCALE, 64, 1, 1);
    k->fill = conf_kernel("fill", SRC_FILL, 32, 1, 1);
    k->pos2d = conf_kernel("positions", SRC_POSITIONS, 8, 4, 1);
    k->pos3d = conf_kernel("positions", SRC_POSITIONS, 4, 2, 3);
    k->scalars = conf_kernel("scalars", SRC_SCALARS, 1, 1, 1);
    static const uint32_t rev_dims[4] = {1, 4, 256, 1024};
    for (int i = 0; i < 4; i++)
        k->reverse[i] = conf_kernel("reverse", SRC_REVERSE, rev_dims[i], 1, 1);
    static const uint32_t red_dims[3] = {4, 256, 1024};
    for (int i = 0; i < 3; i++)
        k->reduce[i] = conf_kernel("reduce", SRC_REDUCE, red_dims[i], 1, 1);
    k->atomic_int = conf_kernel("atomic_int", SRC_ATOMIC_INT, 256, 1, 1);
    k->atomic_f32 = conf_kernel("atomic_f32", SRC_ATOMIC_F32, 256, 1, 1);
    k->write_count = conf_kernel("write_count", SRC_WRITE_COUNT, 1, 1, 1);
    k->count_probe = conf_kernel("count_probe", SRC_COUNT_PROBE, 32, 1, 1);
    k->oob_write = conf_kernel("oob_write", SRC_OOB_WRITE, 32, 1, 1);
    k->oob_read = conf_kernel("oob_read", SRC_OOB_READ, 32, 1, 1);
    k->math = conf_kernel("math", SRC_MATH, 64, 1, 1);
    k->two_entries = conf_kernel("entry_two", SRC_TWO_ENTRIES, 1, 1, 1);
    k->broken = conf_kernel("broken", SRC_BROKEN, 1, 1, 1);
    k->missing_entry =
        conf_kernel("not_defined_here", SRC_OTHER_ENTRY, 1, 1, 1);
    /* Over the limits: one more unit along x than a cube may have. */
    k->mark = conf_kernel("mark", SRC_MARK, p->max_cube_dim[0] + 1, 1, 1);
    /* Every axis within its own limit, the product over the unit limit
     * (or, where the axes cannot express that, an axis over its limit). */
    uint32_t dx = p->max_cube_dim[0];
    uint32_t dy = p->max_units_per_cube / (dx ? dx : 1) + 1;
    k->too_many_units = conf_kernel("limits", SRC_LIMITS, dx, dy, 1);
    k->dim_z_over =
        conf_kernel("limits", SRC_LIMITS, 1, 1, p->max_cube_dim[2] + 1);
    char *over = shared_source("shared_over", p->max_shared_memory + 1);
    char *at = shared_source("shared_at", p->max_shared_memory);
    k->shared_over = conf_kernel("shared_over", over, 32, 1, 1);
    k->shared_at = conf_kernel("shared_at", at, 32, 1, 1);
    free(over);
    free(at);
    k->skip_probe = conf_kernel("skip_probe", SRC_SKIP_PROBE, 16, 1, 1);
    k->rewrite = conf_kernel("rewrite", SRC_REWRITE, 256, 1, 1);
    k->spin = conf_kernel("spin", SRC_SPIN, 256, 1, 1);
    k->trap = conf_kernel("fault_trap", SRC_TRAP, 32, 1, 1);
}

static void release_kernels(void)
{
    cube_kernel **all = (cube_kernel **)&conf.k;
    for (size_t i = 0; i < sizeof conf.k / sizeof(cube_kernel *); i++) {
        cube_kernel_release(all[i]);
        all[i] = NULL;
    }
}

/* --- setup and teardown
 * --------------------------------------------------------- */

static int group_setup(void **state)
{
    (void)state;
    cube_error *err = cube_client_open(conf.backend, NULL, &conf.client);
    if (err) {
        char *text = cube_error_format(err);
        print_error("cannot open %s: %s\n", conf.backend, text ? text : "?");
        free(text);
        cube_error_free(err);
        return -1;
    }
    err = cube_client_properties(conf.client, &conf.props);
    if (err) {
        cube_error_free(err);
        return -1;
    }
    make_kernels();
    conf_pattern(conf.sentinel_bytes, CONF_SENTINEL_BYTES, 0x5E47);
    err = cube_create(conf.client, conf.sentinel_bytes, CONF_SENTINEL_BYTES,
                      &conf.sentinel);
    if (err) {
        cube_error_free(err);
        return -1;
    }
    return 0;
}

static int group_teardown(void **state)
{
    (void)state;
    cube_error_free(cube_handle_release(conf.client, conf.sentinel));
    release_kernels();
    cube_client_close(conf.client);
    conf.client = NULL;
    return 0;
}

static uint64_t live_buffers(void)
{
    cube_memory_usage u;
    cube_error *err = cube_memory_usage_get(conf.client, &u);
    if (err) {
        cube_error_free(err);
        return UINT64_MAX;
    }
    return u.buffers;
}

static int test_setup(void **state)
{
    (void)state;
    cube_error *err = cube_sync(conf.client, NULL, 0);
    if (err) {
        cube_error_free(err);
        return -1;
    }
    conf.buffers_at_setup = live_buffers();
    conf.finished = 0;
    return 0;
}

/* After every test: the client still works (a plain barrier and a read
 * succeed), the sentinel's bytes are what they were, and the test left no
 * buffer behind. */
static int test_teardown(void **state)
{
    (void)state;
    int bad = 0;
    CONF_OK(cube_sync(conf.client, NULL, 0));
    unsigned char now[CONF_SENTINEL_BYTES];
    memset(now, 0, sizeof now);
    cube_error *err = conf_read(conf.sentinel, now, CONF_SENTINEL_BYTES);
    if (err) {
        char *text = cube_error_format(err);
        print_error("teardown: the sentinel cannot be read: %s\n",
                    text ? text : "?");
        free(text);
        cube_error_free(err);
        bad = 1;
    } else if (memcmp(now, conf.sentinel_bytes, CONF_SENTINEL_BYTES) != 0) {
        print_error("teardown: the sentinel buffer's bytes changed\n");
        bad = 1;
    }
    /* A test that failed half-way left its buffers; that is not news. */
    uint64_t live = live_buffers();
    if (conf.finished && live != conf.buffers_at_setup) {
        print_error("teardown: %llu live buffers before the test, %llu "
                    "after (a leaked or over-released handle)\n",
                    (unsigned long long)conf.buffers_at_setup,
                    (unsigned long long)live);
        bad = 1;
    }
    if (bad)
        fail_msg("the test left the client or the sentinel in a bad state");
    return 0;
}

/* `conformance BACKEND --device-fault`: the device-fault scenario alone,
 * in a process whose only client is the one that faults. */
static int run_device_fault(void)
{
    cube_client *probe = NULL;
    cube_error *err = cube_client_open(conf.backend, NULL, &probe);
    if (!err)
        err = cube_client_properties(probe, &conf.props);
    cube_client_close(probe);
    if (err) {
        print_error("cannot open %s: %s\n", conf.backend,
                    cube_error_message(err));
        cube_error_free(err);
        return 1;
    }
    make_kernels();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(conf_device_fault_scenario)};
    char group[80];
    snprintf(group, sizeof group, "conformance.%s.device-fault", conf.backend);
    int failed = cmocka_run_group_tests_name(group, tests, NULL, NULL);
    release_kernels();
    return failed ? 1 : 0;
}

/* The environment as the process started, for the processes the suite
 * starts: a driver may change the process's own once it loads (PoCL
 * rewrites OCL_ICD_FILENAMES, hiding the other OpenCL drivers from a
 * child that inherits it). */
static char **start_environ;

char **conf_start_environ(void)
{
    extern char **environ;
    return start_environ ? start_environ : environ;
}

static void keep_start_environ(void)
{
    extern char **environ;
    size_t n = 0;
    while (environ[n])
        n++;
    start_environ = calloc(n + 1, sizeof *start_environ);
    for (size_t i = 0; start_environ && i < n; i++)
        start_environ[i] = strdup(environ[i]);
}

int main(int argc, char **argv)
{
    keep_start_environ();
    if (argc != 2 && !(argc == 3 && strcmp(argv[2], "--device-fault") == 0)) {
        fprintf(stderr,
                "usage: %s <backend> [--device-fault]   (cpu, cuda, cuda:N, "
                "null)\n",
                argv[0]);
        return 2;
    }
    conf.backend = argv[1];
    if (argc == 3)
        return run_device_fault();
    /* CONF_FILTER narrows the run to the tests whose names match it (a
     * cmocka pattern with '*' wildcards), e.g. for a sanitizer run. */
    const char *filter = getenv("CONF_FILTER");
    if (filter && *filter)
        cmocka_set_test_filter(filter);

    /* Probe: a backend that is not built in or cannot run here is skipped. */
    cube_client *probe = NULL;
    cube_error *err = cube_client_open(conf.backend, NULL, &probe);
    if (err) {
        cube_code code = cube_error_code(err);
        if (code == CUBE_ERR_UNAVAILABLE || code == CUBE_ERR_NOT_FOUND) {
            printf("SKIP: %s: %s\n", conf.backend, cube_error_message(err));
            cube_error_free(err);
            return 77;
        }
        char *text = cube_error_format(err);
        fprintf(stderr, "cannot open %s: %s\n", conf.backend,
                text ? text : "?");
        free(text);
        cube_error_free(err);
        return 1;
    }
    cube_client_close(probe);

#define CONF_ENTRY(name)                                                       \
    cmocka_unit_test_setup_teardown(name, test_setup, test_teardown),
    const struct CMUnitTest tests[] = {CONF_TESTS(CONF_ENTRY)};
#undef CONF_ENTRY

    char group[64];
    snprintf(group, sizeof group, "conformance.%s", conf.backend);
    return cmocka_run_group_tests_name(group, tests, group_setup,
                                       group_teardown);
}
