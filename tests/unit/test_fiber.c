/* Unit tests for the CPU backend's fibers (src/backends/cpu/fiber.c).
 *
 * cmocka's assertions longjmp out of the test on failure, which must not
 * happen on a fiber's stack, so fibers only record what they saw and the
 * test asserts after the run. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <fenv.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdalign.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "backends/cpu/fiber.h"
#include "cubert/error.h"
#include "cubert/log.h"

#if defined(__x86_64__)
#include <emmintrin.h>
#endif

#define STACK (64 * 1024)

/* Under a sanitizer some tests are skipped (deliberate faults would be
 * reported) or scaled down. gcc defines __SANITIZE_*__; clang answers
 * __has_feature. */
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define SANITIZED 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
#define SANITIZED 1
#endif
#endif
#if defined(__SANITIZE_THREAD__)
#define TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define TSAN 1
#endif
#endif

/* Asserts that `err` is NULL, printing it otherwise. */
static void expect_ok(cube_error *err)
{
    if (err) {
        char *text = cube_error_format(err);
        print_error("unexpected error: %s\n", text ? text : "?");
        free(text);
        cube_error_free(err);
        fail();
    }
}

/* Asserts that `err` has `code`, then frees it. */
static void expect_code(cube_error *err, cube_code code)
{
    assert_non_null(err);
    assert_int_equal(cube_error_code(err), code);
    assert_true(cube_error_message(err)[0] != '\0');
    cube_error_free(err);
}

static cpu_fibers *make_fibers(size_t stack)
{
    cpu_fibers *f = NULL;
    expect_ok(cpu_fibers_create(stack, &f));
    assert_non_null(f);
    return f;
}

/* ---------------------------------------------------------------- barrier */

typedef struct barrier_ctx {
    cpu_fibers *f;
    uint32_t n;
    uint64_t *shared;
    uint64_t *sums;
} barrier_ctx;

/* Writes its slot, waits for everybody, then sums every slot. */
static void barrier_fn(void *arg, uint32_t i)
{
    barrier_ctx *c = arg;
    c->shared[i] = (uint64_t)i + 1;
    cpu_fibers_yield(c->f);
    uint64_t s = 0;
    for (uint32_t j = 0; j < c->n; j++)
        s += c->shared[j];
    c->sums[i] = s;
}

static void run_barrier(cpu_fibers *f, uint32_t n)
{
    barrier_ctx c = {f, n, calloc(n, sizeof(uint64_t)),
                     calloc(n, sizeof(uint64_t))};
    assert_non_null(c.shared);
    assert_non_null(c.sums);
    expect_ok(cpu_fibers_run(f, n, barrier_fn, &c));
    uint64_t want = (uint64_t)n * (n + 1) / 2;
    for (uint32_t i = 0; i < n; i++)
        assert_int_equal(c.sums[i], want);
    free(c.shared);
    free(c.sums);
}

static void test_barrier_small(void **state)
{
    (void)state;
    cpu_fibers *f = make_fibers(STACK);
    run_barrier(f, 2);
    run_barrier(f, 3);
    run_barrier(f, 64);
    cpu_fibers_destroy(f);
}

static void test_barrier_one(void **state)
{
    (void)state;
    cpu_fibers *f = make_fibers(STACK);
    run_barrier(f, 1);
    cpu_fibers_destroy(f);
}

static void test_barrier_1024(void **state)
{
    (void)state;
    cpu_fibers *f = make_fibers(STACK);
    run_barrier(f, 1024);
    cpu_fibers_destroy(f);
}

static void test_barrier_4096(void **state)
{
    (void)state;
    cpu_fibers *f = make_fibers(STACK);
    run_barrier(f, 4096);
    cpu_fibers_destroy(f);
}

/* ------------------------------------------------------------ multi-phase */

#define PHASES 16

typedef struct phase_ctx {
    cpu_fibers *f;
    uint32_t n;
    uint32_t arrived[PHASES]; /* fibers that reached each phase */
    uint64_t *buf[2];
    unsigned errors;
} phase_ctx;

/* Each phase: announce arrival, write, barrier, check that everybody
 * arrived and wrote, barrier again before the buffer is reused. */
static void phase_fn(void *arg, uint32_t i)
{
    phase_ctx *c = arg;
    for (uint32_t p = 0; p < PHASES; p++) {
        /* Nobody may be in a later phase yet. */
        if (p + 1 < PHASES && c->arrived[p + 1] != 0)
            c->errors++;
        c->arrived[p]++;
        c->buf[p & 1][i] = (uint64_t)p * c->n + i;
        cpu_fibers_yield(c->f);
        if (c->arrived[p] != c->n)
            c->errors++;
        for (uint32_t j = 0; j < c->n; j++)
            if (c->buf[p & 1][j] != (uint64_t)p * c->n + j)
                c->errors++;
        cpu_fibers_yield(c->f);
    }
}

static void test_multi_phase(void **state)
{
    (void)state;
    cpu_fibers *f = make_fibers(STACK);
    const uint32_t sizes[] = {1, 2, 5, 33, 300};
    for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++) {
        phase_ctx c;
        memset(&c, 0, sizeof c);
        c.f = f;
        c.n = sizes[s];
        c.buf[0] = calloc(c.n, sizeof(uint64_t));
        c.buf[1] = calloc(c.n, sizeof(uint64_t));
        assert_non_null(c.buf[0]);
        assert_non_null(c.buf[1]);
        expect_ok(cpu_fibers_run(f, c.n, phase_fn, &c));
        assert_int_equal(c.errors, 0);
        for (uint32_t p = 0; p < PHASES; p++)
            assert_int_equal(c.arrived[p], c.n);
        free(c.buf[0]);
        free(c.buf[1]);
    }
    cpu_fibers_destroy(f);
}

/* ------------------------------------------------------------ early return */

typedef struct order_ctx {
    cpu_fibers *f;
    uint32_t n;
    uint32_t *rounds; /* yields fiber i makes before returning */
    uint64_t *log;    /* (round << 32 | index) in execution order */
    size_t log_len;
    uint32_t *finished;
} order_ctx;

static void order_fn(void *arg, uint32_t i)
{
    order_ctx *c = arg;
    for (uint32_t r = 0;; r++) {
        c->log[c->log_len++] = (uint64_t)r << 32 | i;
        if (r == c->rounds[i])
            break;
        cpu_fibers_yield(c->f);
    }
    c->finished[i] = 1;
}

/* Fibers return after different numbers of yields; the rest keep going.
 * Round-robin in index order means the log is sorted by (round, index). */
static void test_early_return(void **state)
{
    (void)state;
    cpu_fibers *f = make_fibers(STACK);
    const uint32_t n = 97;
    order_ctx c = {f,    n, calloc(n, sizeof(uint32_t)),
                   NULL, 0, calloc(n, sizeof(uint32_t))};
    assert_non_null(c.rounds);
    assert_non_null(c.finished);
    size_t total = 0;
    for (uint32_t i = 0; i < n; i++) {
        c.rounds[i] = (i * 7u) % 11u; /* 0 .. 10, fiber 0 returns at once */
        total += c.rounds[i] + 1;
    }
    c.log = calloc(total, sizeof(uint64_t));
    assert_non_null(c.log);
    expect_ok(cpu_fibers_run(f, n, order_fn, &c));
    assert_int_equal(c.log_len, total);
    for (size_t k = 1; k < total; k++)
        assert_true(c.log[k - 1] < c.log[k]);
    for (uint32_t i = 0; i < n; i++)
        assert_int_equal(c.finished[i], 1);

    /* Only the last fiber keeps yielding: yield returns at once. */
    memset(c.finished, 0, n * sizeof(uint32_t));
    c.log_len = 0;
    total = 0;
    for (uint32_t i = 0; i < n; i++) {
        c.rounds[i] = i + 1 == n ? 50 : 0;
        total += c.rounds[i] + 1;
    }
    free(c.log);
    c.log = calloc(total, sizeof(uint64_t));
    assert_non_null(c.log);
    expect_ok(cpu_fibers_run(f, n, order_fn, &c));
    assert_int_equal(c.log_len, total);
    for (size_t k = 1; k < total; k++)
        assert_true(c.log[k - 1] < c.log[k]);

    free(c.rounds);
    free(c.log);
    free(c.finished);
    cpu_fibers_destroy(f);
}

/* ------------------------------------------------------------------ reuse */

static void test_reuse(void **state)
{
    (void)state;
    cpu_fibers *f = make_fibers(STACK);
    const uint32_t sizes[] = {1, 100, 7, 1024, 3, 2000, 1, 513, 2000, 64};
    for (int rep = 0; rep < 3; rep++)
        for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++)
            run_barrier(f, sizes[s]);
    for (uint32_t k = 0; k < 2000; k++)
        run_barrier(f, 1 + k % 17);
    cpu_fibers_destroy(f);
}

/* ----------------------------------------------------- floating point, libm */

typedef struct fp_ctx {
    cpu_fibers *f;
    double *out;
    unsigned misaligned;
    int *round_seen;
    int *round_after;
} fp_ctx;

/* Alignment of locals relies on rsp being right at entry; the compiler does
 * not realign for 16-byte alignment. */
static double fp_work(uint32_t i)
{
    alignas(16) volatile double v[4];
    v[0] = 0.25 * i;
    v[1] = 1.5;
    v[2] = sin(v[0]) + cos(v[1]);
    v[3] = exp(-v[0] * 0.001) * sqrt(v[1] + i);
#if defined(__x86_64__)
    alignas(16) double w[2] = {v[2], v[3]};
    __m128d x = _mm_load_pd(w); /* faults if w is misaligned */
    x = _mm_mul_pd(x, _mm_set1_pd(2.0));
    _mm_store_pd(w, x);
    return w[0] + w[1];
#else
    return 2.0 * (v[2] + v[3]);
#endif
}

static void fp_fn(void *arg, uint32_t i)
{
    fp_ctx *c = arg;
    alignas(16) double local[2];
    if (((uintptr_t)local & 15u) != 0)
        c->misaligned++;
    c->round_seen[i] = fegetround();
    /* Fiber 1 changes its rounding mode; on x86-64 the mode is part of a
     * fiber's saved state, so the others must not see it. */
    if (i == 1)
        fesetround(FE_UPWARD);
    double a = fp_work(i);
    cpu_fibers_yield(c->f);
    double b = fp_work(i + 1000);
    cpu_fibers_yield(c->f);
    c->round_after[i] = fegetround();
    if (i == 1)
        fesetround(FE_DOWNWARD);
    c->out[i] = a + b;
}

static void test_floating_point(void **state)
{
    (void)state;
    cpu_fibers *f = make_fibers(STACK);
    const uint32_t n = 40;
    fp_ctx c = {f, calloc(n, sizeof(double)), 0, calloc(n, sizeof(int)),
                calloc(n, sizeof(int))};
    assert_non_null(c.out);

    /* The fibers inherit the caller's rounding mode. */
    assert_int_equal(fesetround(FE_TOWARDZERO), 0);
    expect_ok(cpu_fibers_run(f, n, fp_fn, &c));
    int after = fegetround();
    assert_int_equal(fesetround(FE_TONEAREST), 0);
    /* The caller's own mode is untouched by what the fibers did. */
    assert_int_equal(after, FE_TOWARDZERO);

    assert_int_equal(c.misaligned, 0);
    for (uint32_t i = 0; i < n; i++) {
        assert_int_equal(c.round_seen[i], FE_TOWARDZERO);
#if defined(__x86_64__)
        assert_int_equal(c.round_after[i], i == 1 ? FE_UPWARD : FE_TOWARDZERO);
#endif
    }
    /* Same computation on the thread's own stack and rounding mode. */
    assert_int_equal(fesetround(FE_TOWARDZERO), 0);
    for (uint32_t i = 0; i < n; i++) {
        if (i == 1)
            continue; /* computed partly under FE_UPWARD */
        double want = fp_work(i) + fp_work(i + 1000);
        assert_true(c.out[i] == want);
    }
    assert_int_equal(fesetround(FE_TONEAREST), 0);
    free(c.out);
    free(c.round_seen);
    free(c.round_after);
    cpu_fibers_destroy(f);
}

/* ---------------------------------------------------------- deep stacks */

static unsigned deep(unsigned depth)
{
    volatile unsigned char pad[1024];
    memset((void *)pad, (int)depth, sizeof pad);
    if (depth == 0)
        return pad[7];
    return deep(depth - 1) + pad[depth % sizeof pad];
}

typedef struct deep_ctx {
    cpu_fibers *f;
    unsigned depth;
    unsigned *out;
} deep_ctx;

static void deep_fn(void *arg, uint32_t i)
{
    deep_ctx *c = arg;
    unsigned a = deep(c->depth);
    cpu_fibers_yield(c->f);
    c->out[i] = a + deep(c->depth / 2);
}

/* Fibers may use most of their stack, interleaved with each other. */
static void test_deep_stack(void **state)
{
    (void)state;
    cpu_fibers *f = make_fibers(1024 * 1024);
    deep_ctx c = {f, 400, calloc(8, sizeof(unsigned))};
    assert_non_null(c.out);
    expect_ok(cpu_fibers_run(f, 8, deep_fn, &c));
    unsigned want = deep(400) + deep(200);
    for (int i = 0; i < 8; i++)
        assert_int_equal(c.out[i], want);
    free(c.out);
    cpu_fibers_destroy(f);
}

/* ------------------------------------------------------------ guard page */

#if !defined(SANITIZED)
/* Far deeper than any fiber stack here; volatile so the compiler cannot
 * see the recursion is bounded only by it. */
static volatile unsigned runaway_limit = 1u << 30;

static unsigned runaway(unsigned depth)
{
    volatile unsigned char pad[4096];
    memset((void *)pad, (int)depth, sizeof pad);
    if (depth >= runaway_limit)
        return pad[0];
    return runaway(depth + 1) + pad[depth % sizeof pad];
}

static void overflow_fn(void *arg, uint32_t i)
{
    (void)i;
    *(volatile unsigned *)arg = runaway(0);
}

/* Overflowing a fiber's stack hits its guard page: a fault, in a child
 * process. Skipped under sanitizers, which would report the fault. */
static void test_guard_page(void **state)
{
    (void)state;
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        cpu_fibers *f = NULL;
        cube_error *err = cpu_fibers_create(STACK, &f);
        if (err)
            _exit(3);
        unsigned sink = 0;
        err = cpu_fibers_run(f, 2, overflow_fn, &sink);
        (void)err;
        _exit(0);
    }
    int status = 0;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_true(WIFSIGNALED(status));
    assert_int_equal(WTERMSIG(status), SIGSEGV);
}
#endif

/* ---------------------------------------------------- map count exhausted */

#if !defined(SANITIZED)
static unsigned cpu_warnings;

static void count_sink(void *user, cube_log_level level, const char *category,
                       const char *message)
{
    (void)user;
    (void)message;
    if (level == CUBE_LOG_WARN && strcmp(category, "cpu") == 0)
        cpu_warnings++;
}

/* Runs in a child: uses up vm.max_map_count but for a few entries, so the
 * guard pages of 1000 stacks cannot be placed. The run must still work,
 * unguarded, with a warning. Exit status says what went wrong. */
static int exhausted_child(void)
{
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    size_t max = 1u << 20;
    void **pages = malloc(max * sizeof *pages);
    cpu_fibers *f = NULL;
    cube_error *err = cpu_fibers_create(STACK, &f);
    if (!pages || err)
        return 10;
    /* Alternating protections keep neighbours from merging. */
    size_t used = 0;
    while (used < max) {
        void *p = mmap(NULL, page, used % 2 ? PROT_READ : PROT_NONE,
                       MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (p == MAP_FAILED)
            break;
        pages[used++] = p;
    }
    if (used == max || used < 200)
        return 11; /* no limit reached: cannot test */
    for (size_t k = 0; k < 100; k++)
        munmap(pages[--used], page);

    cube_log_set_sink(count_sink, NULL);
    const uint32_t n = 1000;
    uint64_t *shared = calloc(n, sizeof *shared);
    uint64_t *sums = calloc(n, sizeof *sums);
    if (!shared || !sums)
        return 12;
    barrier_ctx c = {f, n, shared, sums};
    err = cpu_fibers_run(f, n, barrier_fn, &c);
    if (err)
        return 13;
    for (uint32_t i = 0; i < n; i++)
        if (sums[i] != (uint64_t)n * (n + 1) / 2)
            return 14;
    if (cpu_warnings == 0)
        return 15;
    return 0;
}

static void test_map_count_exhausted(void **state)
{
    (void)state;
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0)
        _exit(exhausted_child());
    int status = 0;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_true(WIFEXITED(status));
    if (WEXITSTATUS(status) == 11) {
        print_message("    (no map count limit reached; skipped)\n");
        return;
    }
    assert_int_equal(WEXITSTATUS(status), 0);
}
#endif

/* ----------------------------------------------------- invalid arguments */

static void count_fn(void *arg, uint32_t i)
{
    (void)i;
    (*(unsigned *)arg)++;
}

static void test_invalid_arguments(void **state)
{
    (void)state;
    cpu_fibers *f = (cpu_fibers *)1;
    expect_code(cpu_fibers_create(STACK, NULL), CUBE_ERR_INVALID_ARGUMENT);
    expect_code(cpu_fibers_create(0, &f), CUBE_ERR_INVALID_ARGUMENT);
    assert_null(f);
    expect_code(cpu_fibers_create(16 * 1024 - 1, &f),
                CUBE_ERR_INVALID_ARGUMENT);
    expect_code(cpu_fibers_create(SIZE_MAX, &f), CUBE_ERR_INVALID_ARGUMENT);

    /* 16 KiB is the minimum and allowed. */
    f = make_fibers(16 * 1024);
    unsigned count = 0;
    expect_code(cpu_fibers_run(f, 0, count_fn, &count),
                CUBE_ERR_INVALID_ARGUMENT);
    expect_code(cpu_fibers_run(f, 4, NULL, &count), CUBE_ERR_INVALID_ARGUMENT);
    expect_code(cpu_fibers_run(NULL, 4, count_fn, &count),
                CUBE_ERR_INVALID_ARGUMENT);
    assert_int_equal(count, 0);
    expect_ok(cpu_fibers_run(f, 5, count_fn, &count));
    assert_int_equal(count, 5);
    cpu_fibers_destroy(f);
    cpu_fibers_destroy(NULL);
}

/* Stacks that cannot be mapped: out of memory, and nothing ran. */
static void test_out_of_memory(void **state)
{
    (void)state;
    cpu_fibers *f = make_fibers((size_t)1 << 44); /* 16 TiB each */
    unsigned count = 0;
    expect_code(cpu_fibers_run(f, 4096, count_fn, &count),
                CUBE_ERR_OUT_OF_MEMORY);
    assert_int_equal(count, 0);
    cpu_fibers_destroy(f);
}

typedef struct nest_ctx {
    cpu_fibers *f;
    cpu_fibers *other;
    cube_code same_code;
    cube_code other_code;
    unsigned inner_ran;
} nest_ctx;

static void inner_fn(void *arg, uint32_t i)
{
    (void)i;
    ((nest_ctx *)arg)->inner_ran++;
}

static void nest_fn(void *arg, uint32_t i)
{
    nest_ctx *c = arg;
    if (i != 0)
        return;
    cube_error *err = cpu_fibers_run(c->f, 2, inner_fn, c);
    c->same_code = cube_error_code(err);
    cube_error_free(err);
    err = cpu_fibers_run(c->other, 2, inner_fn, c);
    c->other_code = cube_error_code(err);
    cube_error_free(err);
}

static void test_nested_run(void **state)
{
    (void)state;
    nest_ctx c = {make_fibers(STACK), make_fibers(STACK), CUBE_OK, CUBE_OK, 0};
    expect_ok(cpu_fibers_run(c.f, 3, nest_fn, &c));
    assert_int_equal(c.same_code, CUBE_ERR_INVALID_ARGUMENT);
    assert_int_equal(c.other_code, CUBE_ERR_INVALID_ARGUMENT);
    assert_int_equal(c.inner_ran, 0);
    /* Both sets still work afterwards. */
    run_barrier(c.f, 10);
    run_barrier(c.other, 10);
    cpu_fibers_destroy(c.f);
    cpu_fibers_destroy(c.other);
}

/* ------------------------------------------------- current and stray yield */

typedef struct current_ctx {
    cpu_fibers *f;
    unsigned wrong;
} current_ctx;

static void current_fn(void *arg, uint32_t i)
{
    current_ctx *c = arg;
    (void)i;
    if (cpu_fibers_current() != c->f)
        c->wrong++;
    cpu_fibers_yield(cpu_fibers_current());
    if (cpu_fibers_current() != c->f)
        c->wrong++;
}

static void test_current(void **state)
{
    (void)state;
    current_ctx c = {make_fibers(STACK), 0};
    assert_null(cpu_fibers_current());
    expect_ok(cpu_fibers_run(c.f, 9, current_fn, &c));
    assert_int_equal(c.wrong, 0);
    assert_null(cpu_fibers_current());
    expect_ok(cpu_fibers_run(c.f, 1, current_fn, &c));
    assert_int_equal(c.wrong, 0);
    assert_null(cpu_fibers_current());
    cpu_fibers_destroy(c.f);
}

typedef struct stray_ctx {
    cpu_fibers *f;
    cpu_fibers *other;
    unsigned steps;
} stray_ctx;

/* A yield on a set that is not running on this thread does nothing. */
static void stray_fn(void *arg, uint32_t i)
{
    stray_ctx *c = arg;
    (void)i;
    c->steps++;
    cpu_fibers_yield(c->other);
    c->steps++;
}

static void test_yield_outside_run(void **state)
{
    (void)state;
    cpu_fibers *f = make_fibers(STACK);
    cpu_fibers_yield(f); /* before any run */
    cpu_fibers_yield(NULL);
    run_barrier(f, 4);
    cpu_fibers_yield(f); /* after a run */

    /* Yield on another set from inside a fiber: ignored, so the fiber runs
     * to the end before the next one starts. */
    stray_ctx c = {f, make_fibers(STACK), 0};
    expect_ok(cpu_fibers_run(f, 1, stray_fn, &c));
    assert_int_equal(c.steps, 2);
    cpu_fibers_destroy(c.other);
    cpu_fibers_destroy(f);
}

/* ------------------------------------------------------------ two threads */

typedef struct thread_ctx {
    uint32_t base;
    int ok;
} thread_ctx;

typedef struct thread_barrier {
    cpu_fibers *f;
    uint32_t n;
    uint32_t *shared;
    unsigned errors;
} thread_barrier;

static void thread_fn(void *arg, uint32_t i)
{
    thread_barrier *b = arg;
    for (uint32_t p = 0; p < 4; p++) {
        b->shared[i] = p * 1000 + i;
        cpu_fibers_yield(b->f);
        for (uint32_t j = 0; j < b->n; j++)
            if (b->shared[j] != p * 1000 + j)
                b->errors++;
        cpu_fibers_yield(b->f);
    }
    if (cpu_fibers_current() != b->f)
        b->errors++;
}

static void *thread_main(void *arg)
{
    thread_ctx *t = arg;
    cpu_fibers *f = NULL;
    cube_error *err = cpu_fibers_create(STACK, &f);
    if (err) {
        cube_error_free(err);
        return NULL;
    }
    int ok = 1;
    for (uint32_t r = 0; r < 200 && ok; r++) {
        uint32_t n = t->base + r % 50;
        thread_barrier b = {f, n, calloc(n, sizeof(uint32_t)), 0};
        if (!b.shared) {
            ok = 0;
            break;
        }
        err = cpu_fibers_run(f, n, thread_fn, &b);
        if (err || b.errors)
            ok = 0;
        cube_error_free(err);
        free(b.shared);
    }
    if (cpu_fibers_current() != NULL)
        ok = 0;
    cpu_fibers_destroy(f);
    t->ok = ok;
    return NULL;
}

static void test_two_threads(void **state)
{
    (void)state;
    thread_ctx t[2] = {{20, 0}, {150, 0}};
    pthread_t th[2];
    for (int k = 0; k < 2; k++)
        assert_int_equal(pthread_create(&th[k], NULL, thread_main, &t[k]), 0);
    for (int k = 0; k < 2; k++)
        assert_int_equal(pthread_join(th[k], NULL), 0);
    assert_true(t[0].ok);
    assert_true(t[1].ok);
}

/* ------------------------------------------------------------ switch rate */

typedef struct spin_ctx {
    cpu_fibers *f;
    uint32_t yields;
    uint64_t work;
} spin_ctx;

static void spin_fn(void *arg, uint32_t i)
{
    spin_ctx *c = arg;
    for (uint32_t k = 0; k < c->yields; k++) {
        c->work += i;
        cpu_fibers_yield(c->f);
    }
}

static double now_seconds(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Switches per measurement; TSan makes every switch microseconds long. */
#if defined(TSAN)
#define SPIN_SWITCHES 20000u
#else
#define SPIN_SWITCHES 4000000u
#endif

/* Printed, not asserted: machines and sanitizers differ too much. */
static void test_switch_rate(void **state)
{
    (void)state;
    cpu_fibers *f = make_fibers(STACK);
    const uint32_t ns[] = {2, 64, 1024};
    for (size_t s = 0; s < sizeof ns / sizeof ns[0]; s++) {
        uint32_t n = ns[s];
        spin_ctx c = {f, SPIN_SWITCHES / n, 0};
        double t0 = now_seconds();
        expect_ok(cpu_fibers_run(f, n, spin_fn, &c));
        double dt = now_seconds() - t0;
        double switches = (double)n * c.yields;
        printf("    fibers n=%-5u %10.0f switches in %.3f s: %.1f M/s "
               "(%.1f ns each)\n",
               (unsigned)n, switches, dt, switches / dt / 1e6,
               dt / switches * 1e9);
    }
    cpu_fibers_destroy(f);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_barrier_one),
        cmocka_unit_test(test_barrier_small),
        cmocka_unit_test(test_barrier_1024),
        cmocka_unit_test(test_barrier_4096),
        cmocka_unit_test(test_multi_phase),
        cmocka_unit_test(test_early_return),
        cmocka_unit_test(test_reuse),
        cmocka_unit_test(test_floating_point),
        cmocka_unit_test(test_deep_stack),
#if !defined(SANITIZED)
        cmocka_unit_test(test_guard_page),
        cmocka_unit_test(test_map_count_exhausted),
#endif
        cmocka_unit_test(test_invalid_arguments),
        cmocka_unit_test(test_out_of_memory),
        cmocka_unit_test(test_nested_run),
        cmocka_unit_test(test_current),
        cmocka_unit_test(test_yield_outside_run),
        cmocka_unit_test(test_two_threads),
        cmocka_unit_test(test_switch_rate),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
