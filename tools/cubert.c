/* cubert — the command-line program.
 *
 *   cubert info                         backends, each one's properties,
 *                                       and the configuration
 *   cubert demo [--device D] [--size N] a tiled matrix product, a reduction
 *                                       and a softmax, checked against C
 *   cubert memory [--device D] [--json] [--demo] [--buffers]
 *                                       the calling stream's memory report
 *                                       (and the client's live buffers)
 *
 * The demo is a small real workload: every kernel result is compared with a
 * plain C reference, and the exit status is 0 only when every check passes.
 */
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cubert/backend/config.h"
#include "cubert/cubert.h"
#include "cubert_tool.h"

/* --- small helpers --- */

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec * 1e-6;
}

/* Prints `err` in full (code, message, log, causes) and frees it.
 * Returns 1 when there was an error, 0 for NULL. */
static int report(cube_error *err, const char *what)
{
    if (!err)
        return 0;
    char *text = cube_error_format(err);
    fprintf(stderr, "cubert: %s failed:\n%s\n", what,
            text ? text : cube_error_message(err));
    free(text);
    cube_error_free(err);
    return 1;
}

/* A deterministic pseudo-random stream (xorshift64*), uniform in [lo, hi). */
typedef struct rng {
    uint64_t s;
} rng;

static float rng_float(rng *r, float lo, float hi)
{
    r->s ^= r->s >> 12;
    r->s ^= r->s << 25;
    r->s ^= r->s >> 27;
    uint64_t v = r->s * 0x2545F4914F6CDD1Dull;
    double u = (double)(v >> 40) / (double)(1ull << 24); /* [0, 1) */
    return (float)(lo + (hi - lo) * u);
}

static void fill(float *x, size_t n, uint64_t seed, float lo, float hi)
{
    rng r = {seed * 0x9E3779B97F4A7C15ull + 1};
    for (size_t i = 0; i < n; i++)
        x[i] = rng_float(&r, lo, hi);
}

static void format_bytes(uint64_t b, char *out, size_t cap)
{
    if (b >= (1ull << 30))
        snprintf(out, cap, "%.2f GiB", (double)b / (double)(1ull << 30));
    else if (b >= (1ull << 20))
        snprintf(out, cap, "%.2f MiB", (double)b / (double)(1ull << 20));
    else if (b >= (1ull << 10))
        snprintf(out, cap, "%.2f KiB", (double)b / (double)(1ull << 10));
    else
        snprintf(out, cap, "%llu B", (unsigned long long)b);
}

/* --- info --- */

static void print_features(uint32_t f)
{
    int any = 0;
    uint32_t unknown = 0;
    for (uint32_t bit = 1; bit; bit <<= 1) {
        if (!(f & bit))
            continue;
        const char *name = cube_feature_name(bit);
        if (!name) {
            unknown |= bit;
            continue;
        }
        printf("%s%s", any ? " " : "", name);
        any = 1;
    }
    if (unknown) {
        printf("%s0x%x", any ? " " : "", unknown);
        any = 1;
    }
    if (!any)
        printf("(none)");
    printf("\n");
}

static void print_properties(const cube_properties *p, const char *indent)
{
    char total[32], shared[32], maxbuf[32];
    format_bytes(p->memory_total, total, sizeof total);
    format_bytes(p->max_shared_memory, shared, sizeof shared);
    format_bytes(p->max_buffer_size, maxbuf, sizeof maxbuf);
    printf("%sname:              %s\n", indent, p->name);
    printf("%sbackend:           %s\n", indent, p->backend);
    printf("%sarchitecture:      %s\n", indent, p->architecture);
    printf("%scompute units:     %u\n", indent, p->compute_units);
    printf("%smax cube dim:      %u x %u x %u\n", indent, p->max_cube_dim[0],
           p->max_cube_dim[1], p->max_cube_dim[2]);
    printf("%sunits per cube:    %u\n", indent, p->max_units_per_cube);
    printf("%smax cube count:    %u x %u x %u\n", indent, p->max_cube_count[0],
           p->max_cube_count[1], p->max_cube_count[2]);
    printf("%sshared memory:     %s per cube\n", indent, shared);
    printf("%smemory total:      %s\n", indent, total);
    printf("%salignment:         %llu bytes\n", indent,
           (unsigned long long)p->memory_alignment);
    printf("%smax buffer:        %s\n", indent, maxbuf);
    printf("%sfeatures:          ", indent);
    print_features(p->features);
    printf("%stiming method:     %s\n", indent,
           p->timing == CUBE_TIMING_DEVICE ? "device timer" : "host clock");
}

/* A key's value as `info` shows it: the value in force, else what the
 * default is. */
static const char *config_value_text(const cube_config_value *v, char *buf,
                                     size_t cap)
{
    const cube_config_key *key = v->key;
    if (v->origin == CUBE_CONFIG_UNSET)
        return key->default_text ? key->default_text : "";
    switch (key->type) {
    case CUBE_CONFIG_UINT:
        snprintf(buf, cap, "%u", (unsigned)v->number);
        return buf;
    case CUBE_CONFIG_WORD:
        for (const cube_config_word *w = key->words; w && w->word; w++)
            if (!w->alias && (uint32_t)w->value == v->number)
                return w->word;
        snprintf(buf, cap, "%u", (unsigned)v->number);
        return buf;
    case CUBE_CONFIG_TEXT:
    case CUBE_CONFIG_PATH: break;
    }
    /* An empty value means something (cache_dir: no disk cache). */
    return v->text && *v->text ? v->text : "\"\"";
}

static void print_configuration(void)
{
    const char *file = cube_config_file();
    printf("\n[configuration]\n");
    printf("  file: %s\n", file ? file : "none");
    int width = 0;
    cube_config_value v;
    for (size_t i = 0; cube_config_entry(i, &v) == 0; i++) {
        int n = (int)strlen(v.key->name);
        width = n > width ? n : width;
    }
    for (size_t i = 0; cube_config_entry(i, &v) == 0; i++) {
        char buf[32];
        printf("  %-*s  %s (", width, v.key->name,
               config_value_text(&v, buf, sizeof buf));
        if (v.origin == CUBE_CONFIG_ENVIRONMENT)
            printf("environment, %s", v.variable);
        else if (v.origin == CUBE_CONFIG_FILE)
            printf("file %s", v.file ? v.file : "");
        else
            printf("default");
        printf(")");
        if (v.rejected)
            printf("; %s='%s' is not usable, ignored", v.variable, v.rejected);
        printf("\n");
    }
}

/* "  unavailable: REASON" for the error `call` gave about the backend or
 * device just named, then the error's causes, if any; frees `err`. A code
 * other than "unavailable" is named, since the reason alone may not say
 * it. */
static void print_unavailable(cube_error *err, const char *call)
{
    cube_code code = cube_error_code(err);
    if (code == CUBE_ERR_UNAVAILABLE)
        printf("  unavailable: %s\n", cubert_unavailable_reason(err, call));
    else
        printf("  unavailable (%s): %s\n", cube_code_name(code),
               cubert_unavailable_reason(err, call));
    for (size_t i = 0; i < cube_error_cause_count(err); i++)
        printf("    %s\n", cube_error_message(cube_error_cause(err, i)));
    cube_error_free(err);
}

static void print_version(void)
{
    printf("cubert %d.%d.%d\n", CUBE_VERSION_MAJOR, CUBE_VERSION_MINOR,
           CUBE_VERSION_PATCH);
}

static int cmd_info(int argc, char **argv)
{
    static const struct option options[] = {{"json", no_argument, NULL, 'j'},
                                            {"help", no_argument, NULL, 'h'},
                                            {NULL, 0, NULL, 0}};
    cubert_args args = {
        .command = "info", .argc = argc, .argv = argv, .options = options};
    int json = 0, opt;
    while ((opt = cubert_args_next(&args)) > 0)
        json = 1;
    if (opt != CUBERT_ARGS_END)
        return cubert_args_stop(&args, opt);
    if (json)
        return cubert_info_json();
    print_version();

    /* The backends compiled in, then the ones cubert knows of but this build
     * lacks (so `info` says why they are missing). */
    const char *const *built = cube_backend_names();
    const char *list[32];
    size_t n = 0;
    for (size_t i = 0; built && built[i] && n < 30; i++)
        list[n++] = built[i];
    const char *const *left_out = cube_backend_names_left_out();
    for (size_t k = 0; left_out && left_out[k] && n < 31; k++)
        list[n++] = left_out[k];

    printf("backends compiled in:");
    for (size_t i = 0; built && built[i]; i++)
        printf(" %s", built[i]);
    printf("\n");

    /* Every device of every backend, described without opening it (an
     * open device would say the same). */
    for (size_t i = 0; i < n; i++) {
        uint32_t count = 0;
        cube_error *err = cube_device_count(list[i], &count);
        if (err) {
            printf("\n[%s]\n", list[i]);
            print_unavailable(err, "cube_device_count");
            continue;
        }
        for (uint32_t d = 0; d < count; d++) {
            char name[64];
            snprintf(name, sizeof name, "%s:%u", list[i], d);
            cube_device_info info;
            err = cube_device_describe(name, &info);
            printf("\n[%s]%s\n", name,
                   count > 1 ? "" : "  (the backend's only device)");
            if (err) {
                print_unavailable(err, "cube_device_describe");
                continue;
            }
            print_properties(&info.properties, "  ");
        }
    }
    print_configuration();
    return 0;
}

/* --- demo: kernels --- */

#define TILE 16
#define RED_DIM 256
#define RED_PER_UNIT 16
#define SM_DIM 256

/* C = A . B over n x n row-major floats. Each cube computes one TILE x TILE
 * block of C; per step the units load one tile of A and one of B into
 * shared memory (zero past the edges, so n need not be a multiple of TILE),
 * wait, accumulate, and wait again before the tiles are overwritten. */
static const char matmul_src[] =
    "#define TILE 16\n"
    "CUBE_KERNEL(matmul, CUBE_IN(float, a), CUBE_IN(float, b),\n"
    "            CUBE_OUT(float, c), CUBE_SCALAR(uint32_t, n),\n"
    "            CUBE_SHARED(float, ta, TILE * TILE),\n"
    "            CUBE_SHARED(float, tb, TILE * TILE))\n"
    "{\n"
    "    unsigned int tx = UNIT_POS_X, ty = UNIT_POS_Y;\n"
    "    unsigned long long row = ABSOLUTE_POS_Y, col = ABSOLUTE_POS_X;\n"
    "    unsigned long long nn = n;\n"
    "    float acc = 0.0f;\n"
    "    unsigned int tiles = (n + TILE - 1) / TILE;\n"
    "    for (unsigned int t = 0; t < tiles; t++) {\n"
    "        unsigned long long ak = (unsigned long long)t * TILE + tx;\n"
    "        unsigned long long bk = (unsigned long long)t * TILE + ty;\n"
    "        ta[ty * TILE + tx] =\n"
    "            (row < nn && ak < nn) ? CUBE_AT(a, row * nn + ak) : 0.0f;\n"
    "        tb[ty * TILE + tx] =\n"
    "            (bk < nn && col < nn) ? CUBE_AT(b, bk * nn + col) : 0.0f;\n"
    "        cube_sync();\n"
    "        for (unsigned int k = 0; k < TILE; k++)\n"
    "            acc += ta[ty * TILE + k] * tb[k * TILE + tx];\n"
    "        cube_sync();\n"
    "    }\n"
    "    if (row < nn && col < nn)\n"
    "        CUBE_AT(c, row * nn + col) = acc;\n"
    "}\n";

/* sum += x[0..n): each unit adds a strided slice of x, the cube reduces its
 * units' partial sums as a tree in shared memory, and unit 0 adds the
 * cube's total into sum[0] atomically. */
static const char reduce_src[] =
    "#define RED_DIM 256\n"
    "CUBE_KERNEL(reduce_sum, CUBE_IN(float, x), CUBE_INOUT(float, sum),\n"
    "            CUBE_SCALAR(uint32_t, n),\n"
    "            CUBE_SHARED(float, part, RED_DIM))\n"
    "{\n"
    "    unsigned int u = UNIT_POS_X;\n"
    "    unsigned int stride = CUBE_COUNT_X * CUBE_DIM_X;\n"
    "    float acc = 0.0f;\n"
    "    for (unsigned int i = ABSOLUTE_POS_X; i < n; i += stride)\n"
    "        acc += CUBE_AT(x, i);\n"
    "    part[u] = acc;\n"
    "    cube_sync();\n"
    "    for (unsigned int s = RED_DIM / 2; s > 0; s >>= 1) {\n"
    "        if (u < s)\n"
    "            part[u] += part[u + s];\n"
    "        cube_sync();\n"
    "    }\n"
    "    if (u == 0)\n"
    "        cube_atomic_add_f32(&CUBE_AT(sum, 0), part[0]);\n"
    "}\n";

/* y = softmax(x) along each row of a rows x cols matrix: one cube per row.
 * The row's maximum and then the sum of exp(x - max) are reduced in shared
 * memory; subtracting the maximum keeps exp() in range for any input. */
static const char softmax_src[] =
    "#define SM_DIM 256\n"
    "CUBE_KERNEL(softmax_rows, CUBE_IN(float, x), CUBE_OUT(float, y),\n"
    "            CUBE_SCALAR(uint32_t, cols),\n"
    "            CUBE_SHARED(float, smax, SM_DIM),\n"
    "            CUBE_SHARED(float, ssum, SM_DIM))\n"
    "{\n"
    "    unsigned int u = UNIT_POS_X;\n"
    "    unsigned long long base = (unsigned long long)CUBE_POS_X * cols;\n"
    "    float m = -3.402823466e+38f;\n"
    "    for (unsigned int j = u; j < cols; j += SM_DIM)\n"
    "        m = fmaxf(m, CUBE_AT(x, base + j));\n"
    "    smax[u] = m;\n"
    "    cube_sync();\n"
    "    for (unsigned int s = SM_DIM / 2; s > 0; s >>= 1) {\n"
    "        if (u < s)\n"
    "            smax[u] = fmaxf(smax[u], smax[u + s]);\n"
    "        cube_sync();\n"
    "    }\n"
    "    m = smax[0];\n"
    "    float acc = 0.0f;\n"
    "    for (unsigned int j = u; j < cols; j += SM_DIM) {\n"
    "        float e = expf(CUBE_AT(x, base + j) - m);\n"
    "        CUBE_AT(y, base + j) = e;\n"
    "        acc += e;\n"
    "    }\n"
    "    ssum[u] = acc;\n"
    "    cube_sync();\n"
    "    for (unsigned int s = SM_DIM / 2; s > 0; s >>= 1) {\n"
    "        if (u < s)\n"
    "            ssum[u] += ssum[u + s];\n"
    "        cube_sync();\n"
    "    }\n"
    "    float inv = 1.0f / ssum[0];\n"
    "    for (unsigned int j = u; j < cols; j += SM_DIM)\n"
    "        CUBE_AT(y, base + j) *= inv;\n"
    "}\n";

/* --- demo: plumbing --- */

typedef struct timing {
    const char *kernel;
    double first_ms;  /* first launch + sync, compile included */
    double steady_ms; /* average launch + sync afterwards */
    int reps;
    double work;      /* flops or bytes per launch, for the rate column */
    const char *unit; /* "GFLOP/s", "GB/s" */
} timing;

typedef struct demo {
    cube_client *client;
    cube_properties props;
    int checks, passed;
    timing times[3];
    int ntimes;
    /* Usage while workload i's buffers are live (before its timing). */
    cube_memory_usage mem[3];
    int have_mem[3];
} demo;

static void check_result(demo *d, const char *what, int ok, const char *fmt,
                         ...) CUBE_PRINTF(4, 5);

static void check_result(demo *d, const char *what, int ok, const char *fmt,
                         ...)
{
    va_list ap;
    va_start(ap, fmt);
    printf("  %-4s %-34s ", ok ? "PASS" : "FAIL", what);
    vprintf(fmt, ap);
    printf("\n");
    va_end(ap);
    d->checks++;
    d->passed += ok != 0;
}

static cube_error *make_kernel(const char *name, const char *source,
                               uint32_t dx, uint32_t dy, cube_kernel **out)
{
    cube_kernel_desc desc;
    memset(&desc, 0, sizeof desc);
    desc.name = name;
    desc.source = source;
    desc.cube_dim[0] = dx;
    desc.cube_dim[1] = dy;
    desc.cube_dim[2] = 1;
    return cube_kernel_create(&desc, out);
}

static cube_error *upload(cube_client *c, const float *x, size_t n,
                          cube_handle *out)
{
    return cube_create(c, x, (uint64_t)n * sizeof(float), out);
}

static cube_error *download(cube_client *c, cube_handle h, float *x, size_t n)
{
    cube_copy_desc desc =
        cube_copy_desc_contiguous(h, (uint64_t)n * sizeof(float), 4);
    void *dst = x;
    uint64_t size = (uint64_t)n * sizeof(float);
    return cube_read(c, &desc, (void *const *)&dst, &size, 1);
}

static cube_error *overwrite(cube_client *c, cube_handle h, const float *x,
                             size_t n)
{
    cube_copy_desc desc =
        cube_copy_desc_contiguous(h, (uint64_t)n * sizeof(float), 4);
    const void *src = x;
    uint64_t size = (uint64_t)n * sizeof(float);
    return cube_write(c, &desc, &src, &size, 1);
}

/* One launch and the barrier after it, timed with the monotonic clock.
 * The sync names the outputs so a failure recorded on them surfaces. */
static cube_error *launch_sync(cube_client *c, cube_kernel *k, cube_count count,
                               const cube_arg *args, size_t nargs,
                               const cube_handle *outs, size_t nouts,
                               double *ms)
{
    double t0 = now_ms();
    cube_error *err = cube_launch(c, k, count, args, nargs, 0);
    if (!err)
        err = cube_sync(c, outs, nouts);
    *ms = now_ms() - t0;
    return err;
}

static void note_memory(demo *d)
{
    cube_memory_usage u;
    cube_error *err = cube_memory_usage_get(d->client, &u);
    if (report(err, "cube_memory_usage_get"))
        return;
    d->mem[d->ntimes] = u;
    d->have_mem[d->ntimes] = 1;
}

/* Steady-state repetitions: at least 3, at most 20, about 0.3 s worth. */
#define STEADY_BUDGET_MS 300.0
#define STEADY_MIN 3
#define STEADY_MAX 20

/* Times launch + sync after the first launch: at least STEADY_MIN runs,
 * then until STEADY_BUDGET_MS have passed, at most STEADY_MAX. `reset`,
 * when not NULL, is a float zeroed (outside the timed part) before each
 * run, for kernels that accumulate. Returns 0, or 1 after reporting. */
static int steady_state(cube_client *c, cube_kernel *k, cube_count count,
                        const cube_arg *args, size_t nargs, cube_handle out,
                        const cube_handle *reset, const char *what, timing *t)
{
    const float zero = 0.0f;
    double total = 0.0;
    int reps = 0;
    while (reps < STEADY_MAX &&
           (reps < STEADY_MIN || total < STEADY_BUDGET_MS)) {
        double ms;
        if (reset && (report(overwrite(c, *reset, &zero, 1), "cube_write") ||
                      report(cube_sync(c, reset, 1), "cube_sync")))
            return 1;
        if (report(launch_sync(c, k, count, args, nargs, &out, 1, &ms), what))
            return 1;
        total += ms;
        reps++;
    }
    t->steady_ms = total / reps;
    t->reps = reps;
    return 0;
}

/* --- demo: (a) tiled matrix product --- */

static int demo_matmul(demo *d, uint32_t n)
{
    cube_client *c = d->client;
    size_t elems = (size_t)n * n;
    float *a = calloc(elems, sizeof *a);
    float *b = calloc(elems, sizeof *b);
    float *out = malloc(elems * sizeof *out);
    double *ref = calloc(elems, sizeof *ref);
    cube_kernel *k = NULL;
    cube_handle ha = {0}, hb = {0}, hc = {0};
    int rc = -1;
    if (!a || !b || !out || !ref) {
        fprintf(stderr, "cubert: out of host memory\n");
        goto done;
    }
    fill(a, elems, 1, -1.0f, 1.0f);
    fill(b, elems, 2, -1.0f, 1.0f);

    printf("\n(a) tiled matrix product C = A.B, %u x %u floats, cube dim "
           "%dx%d, %u x %u cubes\n",
           n, n, TILE, TILE, (n + TILE - 1) / TILE, (n + TILE - 1) / TILE);
    if (report(make_kernel("matmul", matmul_src, TILE, TILE, &k),
               "cube_kernel_create(matmul)") ||
        report(upload(c, a, elems, &ha), "cube_create(A)") ||
        report(upload(c, b, elems, &hb), "cube_create(B)") ||
        report(cube_empty(c, (uint64_t)elems * sizeof(float), &hc),
               "cube_empty(C)"))
        goto done;
    note_memory(d);

    uint32_t cubes = (n + TILE - 1) / TILE;
    cube_count count = cube_count_static(cubes, cubes, 1);
    cube_arg args[4] = {cube_arg_buffer(ha), cube_arg_buffer(hb),
                        cube_arg_buffer(hc), cube_arg_u32(n)};
    timing *t = &d->times[d->ntimes++];
    memset(t, 0, sizeof *t);
    t->kernel = "matmul";
    t->work = 2.0 * (double)n * n * n;
    t->unit = "GFLOP/s";
    if (report(launch_sync(c, k, count, args, 4, &hc, 1, &t->first_ms),
               "matmul launch") ||
        report(download(c, hc, out, elems), "cube_read(C)"))
        goto done;

    /* The reference, accumulated in double. */
    for (size_t i = 0; i < n; i++) {
        double *ri = ref + i * n;
        for (size_t j = 0; j < n; j++)
            ri[j] = 0.0;
        for (size_t kk = 0; kk < n; kk++) {
            double aik = a[i * n + kk];
            const float *bk = b + kk * n;
            for (size_t j = 0; j < n; j++)
                ri[j] += aik * bk[j];
        }
    }
    /* Relative error in the Frobenius norm: ||C - ref|| / ||ref||. */
    double num = 0.0, den = 0.0, maxabs = 0.0;
    size_t nonfinite = 0;
    for (size_t i = 0; i < elems; i++) {
        den += ref[i] * ref[i];
        if (!isfinite(out[i])) {
            nonfinite++;
            continue;
        }
        double e = (double)out[i] - ref[i];
        num += e * e;
        if (fabs(e) > maxabs)
            maxabs = fabs(e);
    }
    double rel = den > 0 ? sqrt(num / den) : sqrt(num);
    char extra[64] = "";
    if (nonfinite)
        snprintf(extra, sizeof extra, ", %zu outputs not finite", nonfinite);
    check_result(d, "matmul vs C reference", !nonfinite && rel <= 1e-4,
                 "relative error %.3g (tolerance 1e-4), max abs error "
                 "%.3g%s",
                 rel, maxabs, extra);

    if (steady_state(c, k, count, args, 4, hc, NULL, "matmul launch", t))
        goto done;
    rc = 0;

done:
    if (ha.bits)
        report(cube_handle_release(c, ha), "cube_handle_release(A)");
    if (hb.bits)
        report(cube_handle_release(c, hb), "cube_handle_release(B)");
    if (hc.bits)
        report(cube_handle_release(c, hc), "cube_handle_release(C)");
    cube_kernel_release(k);
    free(a);
    free(b);
    free(out);
    free(ref);
    return rc;
}

/* --- demo: (b) reduction --- */

static int demo_reduce(demo *d, uint32_t n)
{
    cube_client *c = d->client;
    float *x = malloc((size_t)n * sizeof *x);
    cube_kernel *k = NULL;
    cube_handle hx = {0}, hs = {0};
    int rc = -1;
    if (!x) {
        fprintf(stderr, "cubert: out of host memory\n");
        goto done;
    }
    /* Non-negative inputs: the sum has no cancellation, so a relative
     * tolerance is meaningful. */
    fill(x, n, 3, 0.0f, 1.0f);
    const uint64_t per_cube = (uint64_t)RED_DIM * RED_PER_UNIT;
    uint32_t cubes = (uint32_t)(((uint64_t)n + per_cube - 1) / per_cube);
    if (cubes == 0)
        cubes = 1;
    printf("\n(b) reduction: sum of %u floats, cube dim %d, %u cubes, "
           "shared-memory tree + cube_atomic_add_f32\n",
           n, RED_DIM, cubes);
    const float zero = 0.0f;
    if (report(make_kernel("reduce_sum", reduce_src, RED_DIM, 1, &k),
               "cube_kernel_create(reduce_sum)") ||
        report(upload(c, x, n, &hx), "cube_create(x)") ||
        report(upload(c, &zero, 1, &hs), "cube_create(sum)"))
        goto done;
    note_memory(d);

    cube_count count = cube_count_static(cubes, 1, 1);
    cube_arg args[3] = {cube_arg_buffer(hx), cube_arg_buffer(hs),
                        cube_arg_u32(n)};
    timing *t = &d->times[d->ntimes++];
    memset(t, 0, sizeof *t);
    t->kernel = "reduce_sum";
    t->work = (double)n * sizeof(float);
    t->unit = "GB/s";
    float got = 0.0f;
    if (report(launch_sync(c, k, count, args, 3, &hs, 1, &t->first_ms),
               "reduce_sum launch") ||
        report(download(c, hs, &got, 1), "cube_read(sum)"))
        goto done;

    double want = 0.0;
    for (uint32_t i = 0; i < n; i++)
        want += x[i];
    double rel = fabs((double)got - want) / (want != 0.0 ? fabs(want) : 1.0);
    check_result(d, "reduction vs C reference (double)",
                 isfinite(got) && rel <= 1e-4,
                 "got %.6f, want %.6f, relative error %.3g (tolerance 1e-4)",
                 (double)got, want, rel);

    float again = 0.0f;
    /* The sum accumulates: it is reset before each run. */
    if (steady_state(c, k, count, args, 3, hs, &hs, "reduce_sum launch", t))
        goto done;
    if (report(download(c, hs, &again, 1), "cube_read(sum)"))
        goto done;
    rel = fabs((double)again - want) / (want != 0.0 ? fabs(want) : 1.0);
    check_result(
        d, "reduction, repeated launch", isfinite(again) && rel <= 1e-4,
        "got %.6f, relative error %.3g (tolerance 1e-4)", (double)again, rel);
    rc = 0;

done:
    if (hx.bits)
        report(cube_handle_release(c, hx), "cube_handle_release(x)");
    if (hs.bits)
        report(cube_handle_release(c, hs), "cube_handle_release(sum)");
    cube_kernel_release(k);
    free(x);
    return rc;
}

/* --- demo: (c) softmax --- */

static int demo_softmax(demo *d, uint32_t rows, uint32_t cols)
{
    cube_client *c = d->client;
    size_t elems = (size_t)rows * cols;
    float *x = malloc(elems * sizeof *x);
    float *y = malloc(elems * sizeof *y);
    cube_kernel *k = NULL;
    cube_handle hx = {0}, hy = {0};
    int rc = -1;
    if (!x || !y) {
        fprintf(stderr, "cubert: out of host memory\n");
        goto done;
    }
    fill(x, elems, 4, -8.0f, 8.0f);
    /* Every 8th row is shifted far up: exp() of those values would overflow
     * a float, so this row passes only if the kernel subtracts the max. */
    for (uint32_t r = 0; r < rows; r += 8)
        for (uint32_t j = 0; j < cols; j++)
            x[(size_t)r * cols + j] += 200.0f;
    printf("\n(c) row-wise softmax, %u x %u floats, one cube of %d units per "
           "row, shared-memory max and sum\n",
           rows, cols, SM_DIM);
    if (report(make_kernel("softmax_rows", softmax_src, SM_DIM, 1, &k),
               "cube_kernel_create(softmax_rows)") ||
        report(upload(c, x, elems, &hx), "cube_create(x)") ||
        report(cube_empty(c, (uint64_t)elems * sizeof(float), &hy),
               "cube_empty(y)"))
        goto done;
    note_memory(d);

    cube_count count = cube_count_static(rows, 1, 1);
    cube_arg args[3] = {cube_arg_buffer(hx), cube_arg_buffer(hy),
                        cube_arg_u32(cols)};
    timing *t = &d->times[d->ntimes++];
    memset(t, 0, sizeof *t);
    t->kernel = "softmax_rows";
    t->work = 2.0 * (double)elems * sizeof(float);
    t->unit = "GB/s";
    if (report(launch_sync(c, k, count, args, 3, &hy, 1, &t->first_ms),
               "softmax_rows launch") ||
        report(download(c, hy, y, elems), "cube_read(y)"))
        goto done;

    double maxabs = 0.0, maxsum = 0.0;
    size_t nonfinite = 0;
    for (uint32_t r = 0; r < rows; r++) {
        const float *xr = x + (size_t)r * cols;
        const float *yr = y + (size_t)r * cols;
        double m = xr[0];
        for (uint32_t j = 1; j < cols; j++)
            if (xr[j] > m)
                m = xr[j];
        double s = 0.0;
        for (uint32_t j = 0; j < cols; j++)
            s += exp((double)xr[j] - m);
        double ysum = 0.0;
        for (uint32_t j = 0; j < cols; j++) {
            double want = exp((double)xr[j] - m) / s;
            if (!isfinite(yr[j])) {
                nonfinite++;
                continue;
            }
            double e = fabs((double)yr[j] - want);
            if (e > maxabs)
                maxabs = e;
            ysum += yr[j];
        }
        double se = fabs(ysum - 1.0);
        if (se > maxsum)
            maxsum = se;
    }
    char extra[64] = "";
    if (nonfinite)
        snprintf(extra, sizeof extra, ", %zu outputs not finite", nonfinite);
    check_result(d, "softmax vs C reference (double)",
                 !nonfinite && maxabs <= 1e-5,
                 "max abs error %.3g (tolerance 1e-5)%s", maxabs, extra);
    check_result(d, "softmax rows sum to 1", !nonfinite && maxsum <= 1e-5,
                 "max |row sum - 1| %.3g (tolerance 1e-5)%s", maxsum, extra);

    if (steady_state(c, k, count, args, 3, hy, NULL, "softmax_rows launch", t))
        goto done;
    rc = 0;

done:
    if (hx.bits)
        report(cube_handle_release(c, hx), "cube_handle_release(x)");
    if (hy.bits)
        report(cube_handle_release(c, hy), "cube_handle_release(y)");
    cube_kernel_release(k);
    free(x);
    free(y);
    return rc;
}

/* --- demo --- */

static int parse_u32(const char *s, uint32_t lo, uint32_t hi, uint32_t *out)
{
    char *end;
    errno = 0;
    unsigned long v = strtoul(s, &end, 10);
    if (errno || end == s || *end || s[0] == '-' || v < lo || v > hi)
        return -1;
    *out = (uint32_t)v;
    return 0;
}

static int cmd_demo(int argc, char **argv)
{
    static const struct option options[] = {
        {"device", required_argument, NULL, 'd'},
        {"size", required_argument, NULL, 's'},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0}};
    cubert_args args = {
        .command = "demo", .argc = argc, .argv = argv, .options = options};
    const char *device = NULL;
    uint32_t n = 256;
    int opt;
    while ((opt = cubert_args_next(&args)) > 0) {
        if (opt == 'd') {
            device = args.value;
        } else if (parse_u32(args.value, 1, 2048, &n)) {
            return cubert_usage_error(
                "demo", "--size '%s' is not a number in 1..2048", args.value);
        }
    }
    if (opt != CUBERT_ARGS_END)
        return cubert_args_stop(&args, opt);

    demo d;
    memset(&d, 0, sizeof d);
    if (report(cube_client_open(device, NULL, &d.client), "cube_client_open"))
        return 1;
    if (report(cube_client_properties(d.client, &d.props),
               "cube_client_properties")) {
        cube_client_close(d.client);
        return 1;
    }
    printf("cubert demo on %s: %s (%s, %u compute units)\n", d.props.backend,
           d.props.name, d.props.architecture, d.props.compute_units);

    int errors = 0;
    errors += demo_matmul(&d, n) < 0;
    errors += demo_reduce(&d, 1u << 20) < 0;
    errors += demo_softmax(&d, 512, 1000) < 0;

    /* Memory: what each workload held while its buffers were live, and
     * what is left once every handle is released. */
    cube_memory_usage now;
    memset(&now, 0, sizeof now);
    errors +=
        report(cube_memory_usage_get(d.client, &now), "cube_memory_usage_get");
    printf("\nmemory (cube_memory_usage_get, this thread's stream)\n");
    printf("  %-14s %8s %12s %12s %12s\n", "while running", "buffers", "in use",
           "padding", "reserved");
    for (int i = 0; i <= d.ntimes && i < 4; i++) {
        const cube_memory_usage *u = i < d.ntimes ? &d.mem[i] : &now;
        if (i < d.ntimes && !d.have_mem[i])
            continue;
        char a[32], b[32], c[32];
        format_bytes(u->bytes_in_use, a, sizeof a);
        format_bytes(u->bytes_padding, b, sizeof b);
        format_bytes(u->bytes_reserved, c, sizeof c);
        printf("  %-14s %8llu %12s %12s %12s\n",
               i < d.ntimes ? d.times[i].kernel : "(all released)",
               (unsigned long long)u->buffers, a, b, c);
    }

    printf("\nwall time per kernel (launch + cube_sync, CLOCK_MONOTONIC)\n");
    printf("  %-14s %14s %16s %12s\n", "kernel", "first launch",
           "steady average", "rate");
    for (int i = 0; i < d.ntimes; i++) {
        const timing *t = &d.times[i];
        if (t->reps == 0) {
            printf("  %-14s %11.2f ms %16s %12s\n", t->kernel, t->first_ms, "-",
                   "-");
            continue;
        }
        char steady[32];
        snprintf(steady, sizeof steady, "%.3f ms (x%d)", t->steady_ms, t->reps);
        printf("  %-14s %11.2f ms %16s %7.2f %s\n", t->kernel, t->first_ms,
               steady, t->work / (t->steady_ms * 1e-3) * 1e-9, t->unit);
    }
    printf("  (the first launch includes compiling the kernel, or loading it "
           "from the disk cache)\n");

    cube_client_close(d.client);

    int ok = errors == 0 && d.checks > 0 && d.passed == d.checks;
    printf("\n%s: %d of %d checks passed%s\n", ok ? "PASS" : "FAIL", d.passed,
           d.checks, errors ? " (and some steps failed with an error)" : "");
    return ok ? 0 : 1;
}

/* --- memory --- */

/* The counters of cube_memory_stats, in its order, with their names in
 * the table and the JSON. */
#define MEMORY_STAT_FIELDS(X)                                                  \
    X(allocations, "allocations", 0)                                           \
    X(releases, "releases", 0)                                                 \
    X(pool_hits, "pool hits", 0)                                               \
    X(pool_misses, "pool misses", 0)                                           \
    X(device_allocations, "device allocations", 0)                             \
    X(device_frees, "device frees", 0)                                         \
    X(oom_events, "out-of-memory events", 0)                                   \
    X(oom_retries, "retries after release", 0)                                 \
    X(buffers, "live buffers", 0)                                              \
    X(buffers_peak, "live buffers, peak", 0)                                   \
    X(allocated_bytes, "allocated", 1)                                         \
    X(allocated_bytes_peak, "allocated, peak", 1)                              \
    X(reserved_bytes, "reserved", 1)                                           \
    X(reserved_bytes_peak, "reserved, peak", 1)                                \
    X(free_bytes, "free in pools", 1)                                          \
    X(free_bytes_peak, "free in pools, peak", 1)

/* The counters of `s` as the members of a JSON object, the first of them
 * after `members_before` others. */
static void json_stat_members(const cube_memory_stats *s, int members_before)
{
    int n = members_before;
#define X(field, name, bytes)                                                  \
    printf("%s\"%s\":%llu", n++ ? "," : "", #field,                            \
           (unsigned long long)s->field);
    MEMORY_STAT_FIELDS(X)
#undef X
}

/* The counters of the calling stream and of the whole device after the
 * report: a table, or one JSON object on a line of its own. */
static int print_memory_stats(cube_client *c, int json)
{
    cube_memory_stats one, all;
    memset(&one, 0, sizeof one);
    memset(&all, 0, sizeof all);
    one.struct_size = all.struct_size = sizeof one;
    if (report(cube_memory_stats_get(c, CUBE_MEMORY_STREAM, &one),
               "cube_memory_stats_get") ||
        report(cube_memory_stats_get(c, CUBE_MEMORY_DEVICE, &all),
               "cube_memory_stats_get"))
        return 1;
    if (json) {
        printf("{\"stats\":{\"stream\":{");
        json_stat_members(&one, 0);
        printf("},\"device\":{\"streams\":%u", all.streams);
        json_stat_members(&all, 1);
        printf("}}}\n");
        return 0;
    }
    printf("\ncounters (cube_memory_stats_get): this stream, and all %u "
           "stream(s) of the device\n",
           all.streams);
#define X(field, name, bytes)                                                  \
    if (bytes) {                                                               \
        char a[32], b[32];                                                     \
        format_bytes(one.field, a, sizeof a);                                  \
        format_bytes(all.field, b, sizeof b);                                  \
        printf("  %-24s %14s %14s\n", name, a, b);                             \
    } else {                                                                   \
        printf("  %-24s %14llu %14llu\n", name, (unsigned long long)one.field, \
               (unsigned long long)all.field);                                 \
    }
    MEMORY_STAT_FIELDS(X)
#undef X
    return 0;
}

static const char *pool_kind_name(cube_pool_kind kind)
{
    switch (kind) {
    case CUBE_POOL_SLICED: return "sliced";
    case CUBE_POOL_EXCLUSIVE: return "exclusive";
    case CUBE_POOL_PERSISTENT: return "persistent";
    case CUBE_POOL_EXPANDABLE: return "expandable";
    }
    return "?";
}

static int larger_first(const void *a, const void *b)
{
    const cube_buffer_info *x = a, *y = b;
    if (x->size != y->size)
        return x->size < y->size ? 1 : -1;
    return x->handle.bits < y->handle.bits ? -1
                                           : x->handle.bits > y->handle.bits;
}

/* The client's live buffers (every stream), largest first: a table, or
 * one JSON object on a line of its own. Returns 1 on error. */
static int print_buffers(cube_client *c, int json)
{
    cube_buffer_info *list = NULL;
    size_t count = 0, cap = 0;
    /* Buffers made meanwhile on other threads: ask until the list fits. */
    for (;;) {
        if (count > 0) {
            cap = count + 16;
            cube_buffer_info *grown = realloc(list, cap * sizeof *list);
            if (!grown) {
                free(list);
                fprintf(stderr, "cubert memory: out of host memory\n");
                return 1;
            }
            list = grown;
            list[0].struct_size = sizeof *list;
        }
        if (report(
                cube_memory_snapshot(c, CUBE_MEMORY_DEVICE, list, cap, &count),
                "cube_memory_snapshot")) {
            free(list);
            return 1;
        }
        if (count <= cap)
            break;
    }
    if (count > 0)
        qsort(list, count, sizeof *list, larger_first);
    if (json) {
        printf("{\"buffers\":[");
        for (size_t i = 0; i < count; i++) {
            const cube_buffer_info *b = &list[i];
            char pool[16];
            if (b->pool == CUBE_BUFFER_NO_POOL)
                snprintf(pool, sizeof pool, "null");
            else
                snprintf(pool, sizeof pool, "%u", b->pool);
            /* Labels hold no byte JSON would need escaped. */
            printf(
                "%s{\"handle\":\"0x%016llx\",\"size\":%llu,"
                "\"stream\":%llu,\"pool\":%s,\"kind\":%s%s%s,"
                "\"foreign\":%s,\"deferred\":%s,\"label\":\"%s\"}",
                i ? "," : "", (unsigned long long)b->handle.bits,
                (unsigned long long)b->size, (unsigned long long)b->stream,
                pool, b->pool == CUBE_BUFFER_NO_POOL ? "" : "\"",
                b->pool == CUBE_BUFFER_NO_POOL ? "null"
                                               : pool_kind_name(b->pool_kind),
                b->pool == CUBE_BUFFER_NO_POOL ? "" : "\"",
                b->flags & CUBE_BUFFER_FOREIGN ? "true" : "false",
                b->flags & CUBE_BUFFER_DEFERRED ? "true" : "false", b->label);
        }
        printf("]}\n");
        free(list);
        return 0;
    }
    printf("\nlive buffers (cube_memory_snapshot): %zu, largest first\n",
           count);
    if (count > 0)
        printf("  %-18s %10s %18s %-16s %s\n", "handle", "size", "stream",
               "pool", "label");
    for (size_t i = 0; i < count; i++) {
        const cube_buffer_info *b = &list[i];
        char size[32], pool[32];
        format_bytes(b->size, size, sizeof size);
        if (b->flags & CUBE_BUFFER_FOREIGN)
            snprintf(pool, sizeof pool, "(wrapped)");
        else if (b->flags & CUBE_BUFFER_DEFERRED)
            snprintf(pool, sizeof pool, "(not backed)");
        else
            snprintf(pool, sizeof pool, "%u %s", b->pool,
                     pool_kind_name(b->pool_kind));
        printf("  0x%016llx %10s 0x%016llx %-16s %s\n",
               (unsigned long long)b->handle.bits, size,
               (unsigned long long)b->stream, pool, b->label);
    }
    free(list);
    return 0;
}

/* Prints the calling stream's report, then the counters, then with
 * `buffers` the live buffers; `title` heads the table form (the JSON form
 * is one object per line, nothing else). Returns 1 on error. */
static int print_memory_report(cube_client *c, int json, int buffers,
                               const char *title)
{
    cube_memory_report r;
    if (report(cube_memory_report_get(c, &r), "cube_memory_report_get"))
        return 1;
    char *text = cube_memory_report_format(&r, json ? CUBE_REPORT_JSON
                                                    : CUBE_REPORT_TABLE);
    if (!text) {
        fprintf(stderr, "cubert memory: cannot format the report: out of "
                        "memory\n");
        return 1;
    }
    if (!json)
        printf("\n%s\n", title);
    fputs(text, stdout);
    free(text);
    if (print_memory_stats(c, json))
        return 1;
    return buffers ? print_buffers(c, json) : 0;
}

/* Allocates buffers of varied sizes up to an eighth of the device (one in
 * a persistent window, one in the large tail when that fits in the same
 * budget), prints the report, releases them, resets the high-water marks
 * and prints it again. */
static int memory_demo(cube_client *c, const cube_properties *p, int json,
                       int buffers)
{
    enum { MAX_BUFFERS = 16 };
    uint64_t sizes[MAX_BUFFERS];
    int persistent[MAX_BUFFERS];
    size_t n = 0;
    static const uint64_t varied[] = {64,      1000,        4096,
                                      10000,   100000,      1ull << 20,
                                      3000000, 16ull << 20, 40ull << 20};
    uint64_t budget = p->memory_total / 8;
    for (size_t i = 0; i < sizeof varied / sizeof varied[0]; i++) {
        if (varied[i] <= budget) {
            sizes[n] = varied[i];
            persistent[n++] = 0;
        }
    }
    if (budget >= 256ull * 1024) {
        sizes[n] = 256ull * 1024;
        persistent[n++] = 1;
    }
    /* One buffer above every pool's largest request, for the tail. */
    cube_memory_report r;
    if (report(cube_memory_report_get(c, &r), "cube_memory_report_get"))
        return 1;
    uint64_t widest = 0;
    for (uint32_t i = 0; i + 2 < r.count; i++)
        if (r.pools[i].config.max_size > widest)
            widest = r.pools[i].config.max_size;
    int tail = widest > 0 && widest < budget;
    if (tail) {
        sizes[n] = widest + 1;
        persistent[n++] = 0;
    }

    cube_handle h[MAX_BUFFERS];
    size_t made = 0;
    uint64_t total = 0;
    int errors = 0;
    for (size_t i = 0; i < n && !errors; i++) {
        if (persistent[i])
            errors += report(cube_persistent_begin(c), "cube_persistent_begin");
        if (!errors) {
            errors += report(cube_empty(c, sizes[i], &h[made]), "cube_empty");
            if (!errors) {
                /* Named, so the buffer list shows what each one is. */
                char label[32];
                snprintf(label, sizeof label, "demo %llu bytes%s",
                         (unsigned long long)sizes[i],
                         persistent[i] ? ", persistent" : "");
                errors += report(cube_handle_set_label(c, h[made], label),
                                 "cube_handle_set_label");
            }
            if (!errors) {
                total += sizes[i];
                made++;
            }
        }
        if (persistent[i])
            errors += report(cube_persistent_end(c), "cube_persistent_end");
    }
    char amount[32], title[160];
    format_bytes(total, amount, sizeof amount);
    snprintf(title, sizeof title,
             "with %zu buffers live (%s in all, from %llu bytes up; one in "
             "a persistent window%s)",
             made, amount, (unsigned long long)sizes[0],
             tail ? ", one above every pool, in the large tail" : "");
    if (!errors)
        errors += print_memory_report(c, json, buffers, title);
    for (size_t i = 0; i < made; i++)
        errors += report(cube_handle_release(c, h[i]), "cube_handle_release");
    errors += report(cube_sync(c, NULL, 0), "cube_sync");
    errors += report(cube_memory_reset_peaks(c), "cube_memory_reset_peaks");
    if (!errors)
        errors += print_memory_report(
            c, json, buffers,
            "after releasing them and resetting the high-water marks "
            "(released memory may stay reserved in its pool until "
            "cube_memory_cleanup)");
    return errors ? 1 : 0;
}

static int cmd_memory(int argc, char **argv)
{
    static const struct option options[] = {
        {"device", required_argument, NULL, 'd'},
        {"json", no_argument, NULL, 'j'},
        {"demo", no_argument, NULL, 'D'},
        {"buffers", no_argument, NULL, 'b'},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0}};
    cubert_args args = {
        .command = "memory", .argc = argc, .argv = argv, .options = options};
    const char *device = NULL;
    int json = 0, demo_mode = 0, buffers = 0, opt;
    while ((opt = cubert_args_next(&args)) > 0) {
        if (opt == 'd')
            device = args.value;
        else if (opt == 'j')
            json = 1;
        else if (opt == 'b')
            buffers = 1;
        else
            demo_mode = 1;
    }
    if (opt != CUBERT_ARGS_END)
        return cubert_args_stop(&args, opt);

    cube_client *c = NULL;
    if (report(cube_client_open(device, NULL, &c), "cube_client_open"))
        return 1;
    cube_properties p;
    if (report(cube_client_properties(c, &p), "cube_client_properties")) {
        cube_client_close(c);
        return 1;
    }
    if (!json) {
        char total[32];
        format_bytes(p.memory_total, total, sizeof total);
        printf("cubert memory on %s: %s (%s, alignment %llu bytes)\n",
               p.backend, p.name, total,
               (unsigned long long)p.memory_alignment);
    }
    int rc;
    if (demo_mode)
        rc = memory_demo(c, &p, json, buffers);
    else
        rc = print_memory_report(c, json, buffers,
                                 "default layout, nothing allocated "
                                 "(the calling thread's stream)");
    cube_client_close(c);
    return rc;
}

/* --- the commands and their help --- */

const cubert_command cubert_commands[] = {
    {"info", "[--json]",
     "backends, devices (or why unavailable), configuration",
     "Lists the backends compiled in and, for each backend cubert knows,\n"
     "every device with its properties (limits, memory, features, timing\n"
     "method) or why it is unavailable; then every configuration key, its\n"
     "value and where the value came from (default, environment or the\n"
     "configuration file). Opens no device.\n"
     "\n"
     "options:\n"
     "  --json      all of it as one JSON object\n"
     "  -h, --help  this text\n"
     "\n"
     "exit status: 0; 1 when the output could not be written; 2 a usage\n"
     "error\n",
     cmd_info},
    {"demo", "[--device D] [--size N]",
     "three kernels checked against plain C, with timings",
     "Runs a tiled matrix product (N x N), a reduction of 1M floats and a\n"
     "row-wise softmax (512 x 1000) on device D, checks each result against\n"
     "plain C and prints the timings and the memory used.\n"
     "\n"
     "options:\n"
     "  --device D  a backend (cpu, cuda) or one of its devices (cuda:1);\n"
     "              default $CUBERT_DEVICE, else cpu\n"
     "  --size N    the matrix product's size, 1 to 2048 (default 256)\n"
     "  -h, --help  this text\n"
     "\n"
     "exit status: 0 when every check passes; 1 a failed check or an\n"
     "error; 2 a usage error\n",
     cmd_demo},
    {"memory", "[--device D] [--json] [--demo] [--buffers]",
     "a device's memory pools, counters and live buffers",
     "Opens device D and prints the memory report of the calling thread's\n"
     "stream for the default layout: each pool's page and size range,\n"
     "pages, buffers, bytes in use and reserved with their high-water\n"
     "marks, then the large tail and the persistent pool; then the counters\n"
     "(allocations, releases, pool hits and misses, device allocations and\n"
     "frees, out-of-memory events and retries, bytes allocated, reserved\n"
     "and free in the pools with their peaks) of the stream and of the\n"
     "whole device. Without --demo it allocates nothing.\n"
     "\n"
     "options:\n"
     "  --device D  a backend or one of its devices (default\n"
     "              $CUBERT_DEVICE, else cpu)\n"
     "  --json      the report as JSON, one object per line\n"
     "  --demo      allocate buffers of varied sizes, print the report,\n"
     "              release them, reset the high-water marks and print it\n"
     "              again\n"
     "  --buffers   after each report, the live buffers, largest first:\n"
     "              handle, size, stream, pool, label (with --json a\n"
     "              {\"buffers\": [...]} line)\n"
     "  -h, --help  this text\n"
     "\n"
     "exit status: 0; 1 an error; 2 a usage error\n",
     cmd_memory},
    {"allreduce", "[--backend B] [--ranks N] [--max BYTES]",
     "a checked all-reduce over a backend's devices",
     "All-reduces f32 sums over the devices of backend B, one thread per\n"
     "rank, at sizes from 1 KiB up to BYTES (each four times the last);\n"
     "checks every result and prints the time per call, the algorithm\n"
     "bandwidth and the bus bandwidth.\n"
     "\n"
     "options:\n"
     "  --backend B  the backend (default: cuda when it has a device, else\n"
     "               cpu, which has $CUBERT_CPU_DEVICES devices)\n"
     "  --ranks N    at most N ranks (default, or 0: one per device)\n"
     "  --max BYTES  the largest size, at least 1024 (default 64 MiB)\n"
     "  -h, --help   this text\n"
     "\n"
     "exit status: 0 when every result checks out; 1 a wrong result or an\n"
     "error; 2 a usage error\n",
     cubert_cmd_allreduce},
    {NULL, NULL, NULL, NULL, NULL}};

const cubert_command *cubert_command_find(const char *name)
{
    for (const cubert_command *c = cubert_commands; c->name; c++)
        if (!strcmp(c->name, name))
            return c;
    return NULL;
}

void cubert_help(const char *command, FILE *f)
{
    const cubert_command *cmd = cubert_command_find(command);
    if (cmd) {
        fprintf(f, "usage: cubert %s %s\n\n%s", cmd->name, cmd->synopsis,
                cmd->help);
        return;
    }
    fprintf(f, "usage: cubert <command> [options]\n\ncommands:\n");
    for (const cubert_command *c = cubert_commands; c->name; c++)
        fprintf(f, "  %-19s %s\n", c->name, c->summary);
    fprintf(f,
            "  %-19s %s\n  %-19s %s\n", "help [COMMAND]",
            "this text, or a command's (as COMMAND --help)",
            "version, --version", "the library version");
    fprintf(f,
            "\n"
            "'cubert COMMAND --help' describes a command and its options.\n"
            "Options take their value as --opt VALUE or --opt=VALUE; a unique\n"
            "prefix of an option's name is that option.\n"
            "\n"
            "exit status: 0 success; 1 a failure (an error, a failed check);\n"
            "2 a usage error (unknown command, option or argument, a missing\n"
            "or bad option value, no command)\n");
}

/* "info, demo, memory, allreduce": for the messages that name them. */
static const char *command_list(void)
{
    static char list[128];
    size_t used = 0;
    for (const cubert_command *c = cubert_commands; c->name; c++) {
        int n = snprintf(list + used, sizeof list - used, "%s%s",
                         used ? ", " : "", c->name);
        if (n < 0 || (size_t)n >= sizeof list - used)
            break;
        used += (size_t)n;
    }
    return list;
}

/* `cubert help [COMMAND]`: argv[0] is "help". */
static int cmd_help(int argc, char **argv)
{
    if (argc > 2)
        return cubert_usage_error("", "help takes one command, not '%s'",
                                  argv[2]);
    const char *name = argc > 1 ? argv[1] : "";
    if (!strcmp(name, "-h") || !strcmp(name, "--help"))
        name = "";
    if (*name && !cubert_command_find(name))
        return cubert_usage_error("", "unknown command '%s' (commands: %s)", name,
                                  command_list());
    cubert_help(name, stdout);
    return 0;
}

int main(int argc, char **argv)
{
    /* The program's own options come before the command; the command
     * parses the words from its name on. */
    static const struct option options[] = {{"version", no_argument, NULL, 'V'},
                                            {"help", no_argument, NULL, 'h'},
                                            {NULL, 0, NULL, 0}};
    cubert_args args = {.command = "",
                        .argc = argc,
                        .argv = argv,
                        .options = options,
                        .operands = 1};
    int opt = cubert_args_next(&args);
    if (opt == 'V') {
        print_version();
        return 0;
    }
    if (opt != CUBERT_ARGS_END)
        return cubert_args_stop(&args, opt);
    int first = args.rest;
    if (first >= argc)
        return cubert_usage_error("", "no command given (commands: %s)", command_list());
    const char *name = argv[first];
    int cargc = argc - first;
    char **cargv = argv + first;
    if (!strcmp(name, "help"))
        return cmd_help(cargc, cargv);
    if (!strcmp(name, "version")) {
        if (cargc > 1)
            return cubert_usage_error("", "version takes no argument, not '%s'",
                                      cargv[1]);
        print_version();
        return 0;
    }
    const cubert_command *cmd = cubert_command_find(name);
    if (cmd)
        return cmd->run(cargc, cargv);
    return cubert_usage_error("", "unknown command '%s' (commands: %s)", name,
                              command_list());
}
