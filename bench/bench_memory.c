/* cubert memory benchmarks.
 *
 * Every cubert figure is printed beside a peer measured in the same run on
 * the same machine, with the ratio, as markdown table rows that can be
 * pasted into docs/BENCHMARKS.md:
 *
 *  (a) allocation hot path: an allocate + release pair that a pool serves
 *      from memory it already holds (a pool hit), for 256 B, 64 KiB and
 *      1 MiB:
 *       - manager level: mem_alloc + mem_free on a memory manager with the
 *         default (subslices) preset for the CPU device, over host storage
 *         from aligned_alloc/free;
 *       - public API: cube_empty + cube_handle_release on a "cpu" client;
 *      each against malloc + free of the same size. Nanoseconds per pair:
 *      the median over rounds of PAIR_BATCH pairs; the sides take turns
 *      round by round and the order alternates. Then the same manager pair
 *      with the expandable preset, over the host storage's virtual memory
 *      (backends/common/host_memory.c, as the CPU backend's), beside the
 *      default preset's pair of the same size: 256 B .. 1 MiB go to the
 *      sliced pools both presets share, 4 MiB and 64 MiB to the expandable
 *      pool (the default's request-sized sliced pool).
 *  (b) scaling: the manager-level pair of (a) with 10, 1,000 and 100,000
 *      other buffers live in the same manager. They are allocated first,
 *      with mixed sizes (log-uniform over 64 B .. 64 KiB, one in a hundred
 *      256 KiB .. 1 MiB), half as many again being allocated and a random
 *      third of all freed, so the pools hold holes as well as live
 *      buffers. Ratios are against the 10-live figure of the same size.
 *  (c) fragmentation: each trace (the files named as arguments, else every
 *      *.trace and *.trace.gz in bench/traces: the synthetic
 *      training_step.trace and the ones recorded from PyTorch by
 *      tools/record-torch-trace.py) replayed through a manager with the default
 *      preset for a GPU-like device (REPLAY_ALIGNMENT-byte alignment,
 *      REPLAY_MEMORY bytes), over a storage that hands out addresses from a
 *      bump counter and only counts bytes (no memory is touched or even
 *      reserved). Figure: peak bytes reserved from the storage ÷ peak bytes
 *      live (the sum of the requested sizes of live buffers). Peers: the
 *      same trace through glibc malloc/free (real calls, the memory is
 *      never written), counting (1) the peak sum of malloc_usable_size over
 *      live buffers — rounding and headers only, no fragmentation — and (2)
 *      the peak of heap plus mmapped bytes held by malloc (mallinfo2
 *      arena + hblkhd, after a malloc_trim before the replay, less the
 *      bytes the process had live then) — what malloc really takes from
 *      the system. The replay takes well under a second, so pages that the
 *      layout releases only after some time unused (release_after_ms) stay
 *      reserved throughout, as in a training loop whose steps come faster
 *      than that. The exclusive preset's figure is printed beside the
 *      default's, as is each replay's time per operation (for malloc, with
 *      the mallinfo2 calls outside the timed part). The expandable preset
 *      replays over the same counting storage with virtual memory of
 *      2 MiB pages (the granularity of an H200): a reservation takes
 *      addresses only, and what it counts is the bytes mapped. The manager's
 *      per-pool report (mem_report, printed with cube_memory_report_format)
 *      is taken at the moment reserved bytes peak. The replay checks, every
 *      CHECK_EVERY operations, that live blocks are aligned and disjoint
 *      and that the manager's usage agrees with the trace.
 *
 *  (d) a summary: one row per trace and preset, peak reserved ÷ peak live,
 *      and the storage work of a warm pass: the trace replayed a second
 *      time on the same manager (what the first pass left live freed
 *      first, no cleanup in between, as in a training loop), counting the
 *      storage calls (allocations, frees, maps, unmaps) and the bytes they
 *      moved. A step that repeats should find its memory held: on a GPU
 *      each of these calls is a driver call.
 *
 * `--fragmentation` runs (c) and (d) only; `--check TRACE...` only loads
 * each trace and checks that its events pair up (bench/trace_file.h).
 *
 * Times use clock_gettime(CLOCK_MONOTONIC). The whole run takes a few
 * seconds on two cores.
 */
#include <glob.h>
#include <malloc.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "backends/common/host_memory.h"
#include "bench_util.h"
#include "trace_file.h"
#include "cubert/backend/errors.h"
#include "cubert/cubert.h"
#include "memory/memory_manager.h"

#ifndef BENCH_TRACE_DIR
#define BENCH_TRACE_DIR "bench/traces"
#endif

/* --- timing, statistics, output --- */

static double now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e9 + (double)ts.tv_nsec;
}

/* Prints the error in full and frees it; the bench then exits 1. */
static int failed(cube_error *err, const char *what)
{
    if (!err)
        return 0;
    char *text = cube_error_format(err);
    fprintf(stderr, "bench_memory: %s failed:\n%s\n", what,
            text ? text : cube_error_message(err));
    free(text);
    cube_error_free(err);
    return 1;
}

static void row(const char *what, const char *ours, const char *peer,
                const char *theirs, double ratio, const char *note)
{
    printf("| %s | %s | %s | %s | %.3g%s |\n", what, ours, peer, theirs, ratio,
           note ? note : "");
}

static void table_header(const char *ratio_label)
{
    printf("| Benchmark | cubert | Peer | Peer value | %s |\n", ratio_label);
    printf("|---|---:|---|---:|---:|\n");
}

static const char *size_name(uint64_t size, char *buf, size_t cap)
{
    if (size >= (1u << 20) && size % (1u << 20) == 0)
        snprintf(buf, cap, "%llu MiB", (unsigned long long)(size >> 20));
    else if (size >= 1024 && size % 1024 == 0)
        snprintf(buf, cap, "%llu KiB", (unsigned long long)(size >> 10));
    else
        snprintf(buf, cap, "%llu B", (unsigned long long)size);
    return buf;
}

/* A small deterministic generator (xorshift64*). */
static uint64_t rng_next(uint64_t *s)
{
    uint64_t x = *s;
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    *s = x;
    return x * 0x2545F4914F6CDD1DULL;
}

/* Uniform in [0, 1). */
static double rng_unit(uint64_t *s)
{
    return (double)(rng_next(s) >> 11) * (1.0 / 9007199254740992.0);
}

static void print_machine(const cube_properties *p)
{
    long nproc = sysconf(_SC_NPROCESSORS_ONLN);
    char model[256];
    bench_cpu_model(model, sizeof model);
    printf("# cubert memory benchmarks\n\n");
    printf("- machine: %ld online CPUs, %s\n", nproc, model);
    printf("- cubert %d.%d.%d, device: %s (%s), %.1f GiB, alignment %llu B\n",
           CUBE_VERSION_MAJOR, CUBE_VERSION_MINOR, CUBE_VERSION_PATCH, p->name,
           p->architecture, (double)p->memory_total / (double)(1ull << 30),
           (unsigned long long)p->memory_alignment);
#ifdef __GLIBC__
    printf("- peers: glibc %d.%d malloc/free (gcc %s, -O2)\n", __GLIBC__,
           __GLIBC_MINOR__, __VERSION__);
#else
    printf("- peers: the C library's malloc/free (-O2)\n");
#endif
    printf("\n");
}

/* --- storages --- */

/* Host memory from aligned_alloc, as the CPU backend's. */
static cube_error *host_alloc(void *self, uint64_t size, uint64_t align,
                              uint64_t *address)
{
    (void)self;
    if (align < sizeof(void *))
        align = sizeof(void *);
    uint64_t rounded = (size + align - 1) & ~(align - 1);
    if (rounded < size || rounded > SIZE_MAX)
        return cube_error_new(CUBE_ERR_OUT_OF_MEMORY,
                              "%llu bytes do not fit the address space",
                              (unsigned long long)size);
    void *p = aligned_alloc((size_t)align, (size_t)rounded);
    if (!p)
        return cube_error_new(CUBE_ERR_OUT_OF_MEMORY,
                              "the host refused %llu bytes",
                              (unsigned long long)size);
    *address = (uint64_t)(uintptr_t)p;
    return NULL;
}

static void host_free(void *self, uint64_t address, uint64_t size)
{
    (void)self;
    (void)size;
    free((void *)(uintptr_t)address);
}

/* Fake memory: addresses from a bump counter, bytes counted (allocated
 * and mapped; address space reserved is not memory). */
typedef struct count_storage {
    uint64_t next;  /* the next free address */
    uint64_t limit; /* the device's size */
    uint64_t reserved, reserved_peak;
    uint64_t allocs, frees; /* allocs count maps too, frees unmaps */
    /* Storage calls and bytes moved, for the warm pass: allocations and
     * frees, maps and unmaps, each counted with its bytes. */
    uint64_t maps, unmaps, bytes_in, bytes_out;
} count_storage;

#define REPLAY_GRANULARITY (2ull << 20)

static cube_error *count_alloc(void *self, uint64_t size, uint64_t align,
                               uint64_t *address)
{
    count_storage *s = self;
    if (size > s->limit || s->reserved > s->limit - size)
        return cube_error_new(CUBE_ERR_OUT_OF_MEMORY,
                              "the counted device refused %llu bytes "
                              "(%llu reserved)",
                              (unsigned long long)size,
                              (unsigned long long)s->reserved);
    uint64_t a = (s->next + align - 1) & ~(align - 1);
    *address = a;
    s->next = a + size;
    s->reserved += size;
    if (s->reserved > s->reserved_peak)
        s->reserved_peak = s->reserved;
    s->allocs++;
    s->bytes_in += size;
    return NULL;
}

static void count_free(void *self, uint64_t address, uint64_t size)
{
    count_storage *s = self;
    (void)address;
    s->reserved -= size;
    s->frees++;
    s->bytes_out += size;
}

static void count_unmap(void *self, uint64_t address, uint64_t size)
{
    count_storage *s = self;
    count_free(self, address, size);
    s->unmaps++;
}

static cube_error *count_reserve(void *self, uint64_t size, uint64_t align,
                                 uint64_t *base)
{
    count_storage *s = self;
    uint64_t a = (s->next + align - 1) & ~(align - 1);
    *base = a;
    s->next = a + size;
    return NULL;
}

static cube_error *count_map(void *self, uint64_t address, uint64_t size)
{
    count_storage *s = self;
    (void)address;
    if (size > s->limit || s->reserved > s->limit - size)
        return cube_error_new(CUBE_ERR_OUT_OF_MEMORY,
                              "the counted device refused to map %llu bytes "
                              "(%llu mapped)",
                              (unsigned long long)size,
                              (unsigned long long)s->reserved);
    s->reserved += size;
    if (s->reserved > s->reserved_peak)
        s->reserved_peak = s->reserved;
    s->allocs++;
    s->maps++;
    s->bytes_in += size;
    return NULL;
}

static void count_release(void *self, uint64_t base, uint64_t size)
{
    (void)self;
    (void)base;
    (void)size;
}

/* --- (a) allocation hot path --- */

#define PAIR_BATCH 1000
#define PAIR_ROUNDS 301
#define PAIR_WARMUP 20

/* Keeps malloc's result observable so the pair is not optimized away. */
static void *volatile sink;

/* `n` mem_alloc + mem_free pairs; ns per pair. */
static int manager_pairs(mem_manager *m, uint64_t size, int n, double *ns)
{
    double t0 = now_ns();
    for (int i = 0; i < n; i++) {
        cube_storage st;
        cube_error *err = mem_alloc(m, size, &st);
        if (err)
            return failed(err, "mem_alloc");
        mem_free(m, &st);
    }
    *ns = (now_ns() - t0) / n;
    return 0;
}

static void malloc_pairs(uint64_t size, int n, double *ns)
{
    double t0 = now_ns();
    for (int i = 0; i < n; i++) {
        void *p = malloc((size_t)size);
        sink = p;
        free(p);
    }
    *ns = (now_ns() - t0) / n;
}

static int api_pairs(cube_client *c, uint64_t size, int n, double *ns)
{
    double t0 = now_ns();
    for (int i = 0; i < n; i++) {
        cube_handle h;
        cube_error *err = cube_empty(c, size, &h);
        if (err)
            return failed(err, "cube_empty");
        err = cube_handle_release(c, h);
        if (err)
            return failed(err, "cube_handle_release");
    }
    *ns = (now_ns() - t0) / n;
    return 0;
}

/* Medians of one side (a manager or a client) and malloc, alternating
 * round by round. */
static int pair_medians(mem_manager *m, cube_client *c, uint64_t size,
                        double *ours, double *peer)
{
    static double to[PAIR_ROUNDS], tp[PAIR_ROUNDS];
    for (int r = -PAIR_WARMUP; r < PAIR_ROUNDS; r++) {
        double d[2];
        for (int turn = 0; turn < 2; turn++) {
            int who = (turn + r + PAIR_WARMUP) % 2;
            if (who == 1)
                malloc_pairs(size, PAIR_BATCH, &d[1]);
            else if (m ? manager_pairs(m, size, PAIR_BATCH, &d[0])
                       : api_pairs(c, size, PAIR_BATCH, &d[0]))
                return 1;
        }
        if (r >= 0) {
            to[r] = d[0];
            tp[r] = d[1];
        }
    }
    *ours = median(to, PAIR_ROUNDS);
    *peer = median(tp, PAIR_ROUNDS);
    return 0;
}

static const uint64_t pair_sizes[3] = {256, 64 << 10, 1 << 20};

/* Manager pairs of the expandable preset beside the default's. */
#define VM_PAIR_SIZES 5
static const uint64_t vm_pair_sizes[VM_PAIR_SIZES] = {256, 64 << 10, 1 << 20,
                                                      4 << 20, 64 << 20};

/* The host storage with virtual memory, as the CPU backend's. */
static void host_vm_ops(mem_storage_ops *ops)
{
    memset(ops, 0, sizeof *ops);
    ops->alloc = host_alloc;
    ops->free = host_free;
    ops->granularity = HOST_VM_GRANULARITY;
    ops->reserve = host_storage_reserve;
    ops->map = host_storage_map;
    ops->unmap = host_storage_unmap;
    ops->release = host_storage_release;
}

/* Medians of the manager pair on two managers, alternating round by
 * round. */
static int pair_medians_two(mem_manager *a, mem_manager *b, uint64_t size,
                            double *ta_out, double *tb_out)
{
    static double ta[PAIR_ROUNDS], tb[PAIR_ROUNDS];
    for (int r = -PAIR_WARMUP; r < PAIR_ROUNDS; r++) {
        double d[2];
        for (int turn = 0; turn < 2; turn++) {
            int who = (turn + r + PAIR_WARMUP) % 2;
            if (manager_pairs(who ? b : a, size, PAIR_BATCH, &d[who]))
                return 1;
        }
        if (r >= 0) {
            ta[r] = d[0];
            tb[r] = d[1];
        }
    }
    *ta_out = median(ta, PAIR_ROUNDS);
    *tb_out = median(tb, PAIR_ROUNDS);
    return 0;
}

/* The kind of the layout's pool that takes `size`, for the rows' labels. */
static const char *pool_kind_for(const cube_memory_layout *l, uint64_t size)
{
    for (uint32_t i = 0; i < l->count; i++)
        if (size >= l->pools[i].min_size && size <= l->pools[i].max_size)
            return l->pools[i].kind == CUBE_POOL_EXPANDABLE ? "expandable"
                   : l->pools[i].kind == CUBE_POOL_SLICED   ? "sliced"
                                                            : "exclusive";
    return "large";
}

static int bench_hot_path_expandable(const mem_device *dev)
{
    mem_storage_ops ops;
    host_vm_ops(&ops);
    mem_manager *def = NULL, *exp = NULL;
    cube_memory_layout ld, le;
    int rc = 1;
    if (failed(mem_layout_preset(CUBE_PRESET_SUBSLICES, dev, &ld),
               "mem_layout_preset") ||
        failed(mem_layout_preset(CUBE_PRESET_EXPANDABLE, dev, &le),
               "mem_layout_preset") ||
        failed(mem_manager_create(&ops, dev, &ld, &def),
               "mem_manager_create") ||
        failed(mem_manager_create(&ops, dev, &le, &exp), "mem_manager_create"))
        goto done;
    double te[VM_PAIR_SIZES], td[VM_PAIR_SIZES];
    for (int i = 0; i < VM_PAIR_SIZES; i++)
        if (pair_medians_two(exp, def, vm_pair_sizes[i], &te[i], &td[i]))
            goto done;
    printf("Expandable preset (host storage with virtual memory, 2 MiB "
           "pages), same pair beside the default preset's:\n\n");
    table_header("cubert ÷ peer");
    char what[128], ours[64], peer[96], theirs[64], sz[32];
    for (int i = 0; i < VM_PAIR_SIZES; i++) {
        size_name(vm_pair_sizes[i], sz, sizeof sz);
        snprintf(what, sizeof what,
                 "mem_alloc + mem_free, %s, expandable preset (%s pool)", sz,
                 pool_kind_for(&le, vm_pair_sizes[i]));
        snprintf(ours, sizeof ours, "%.1f ns", te[i]);
        snprintf(peer, sizeof peer, "same pair, subslices preset (default)");
        snprintf(theirs, sizeof theirs, "%.1f ns", td[i]);
        row(what, ours, peer, theirs, te[i] / td[i], NULL);
    }
    printf("\n");
    rc = 0;
done:
    mem_manager_destroy(def);
    mem_manager_destroy(exp);
    return rc;
}

static int bench_hot_path(cube_client *c, const mem_device *dev)
{
    mem_storage_ops ops = {NULL, host_alloc, host_free};
    mem_manager *m = NULL;
    cube_memory_layout layout;
    if (failed(mem_layout_preset(CUBE_PRESET_SUBSLICES, dev, &layout),
               "mem_layout_preset") ||
        failed(mem_manager_create(&ops, dev, &layout, &m),
               "mem_manager_create"))
        return 1;
    double mo[3], mp[3], ao[3], ap[3];
    int rc = 1;
    for (int i = 0; i < 3; i++)
        if (pair_medians(m, NULL, pair_sizes[i], &mo[i], &mp[i]) ||
            pair_medians(NULL, c, pair_sizes[i], &ao[i], &ap[i]))
            goto done;

    printf("## (a) Allocation hot path: allocate + release on a pool hit, "
           "ns per pair, median of %d rounds of %d pairs (after %d warm-up "
           "rounds)\n\n",
           PAIR_ROUNDS, PAIR_BATCH, PAIR_WARMUP);
    table_header("cubert ÷ peer");
    char what[128], ours[64], peer[64], theirs[64], note[64], sz[32];
    for (int i = 0; i < 3; i++) {
        size_name(pair_sizes[i], sz, sizeof sz);
        snprintf(what, sizeof what, "mem_alloc + mem_free, %s (manager)", sz);
        snprintf(ours, sizeof ours, "%.1f ns", mo[i]);
        snprintf(peer, sizeof peer, "malloc + free, %s", sz);
        snprintf(theirs, sizeof theirs, "%.1f ns", mp[i]);
        snprintf(note, sizeof note, " (aim: pair < 100 ns; %s)",
                 mo[i] < 100.0 ? "met" : "missed");
        row(what, ours, peer, theirs, mo[i] / mp[i], note);
    }
    for (int i = 0; i < 3; i++) {
        size_name(pair_sizes[i], sz, sizeof sz);
        snprintf(what, sizeof what,
                 "cube_empty + cube_handle_release, %s (cpu client)", sz);
        snprintf(ours, sizeof ours, "%.1f ns", ao[i]);
        snprintf(peer, sizeof peer, "malloc + free, %s", sz);
        snprintf(theirs, sizeof theirs, "%.1f ns", ap[i]);
        row(what, ours, peer, theirs, ao[i] / ap[i], NULL);
    }
    printf("\n");
    rc = 0;
done:
    mem_manager_destroy(m);
    return rc;
}

/* --- (b) scaling with live buffers --- */

static uint64_t mixed_size(uint64_t *rng)
{
    double lo = 64.0, hi = 65536.0;
    if (rng_unit(rng) < 0.01) {
        lo = 262144.0;
        hi = 1048576.0;
    }
    /* log-uniform in [lo, hi) */
    uint64_t size = (uint64_t)(lo * exp2(rng_unit(rng) * log2(hi / lo)));
    return size ? size : 1;
}

/* Buffers held in a manager: st[i] is live when alive[i]. */
typedef struct held_set {
    cube_storage *st;
    uint8_t *alive;
    size_t total;
} held_set;

static void held_release(mem_manager *m, held_set *h)
{
    for (size_t i = 0; h->alive && i < h->total; i++)
        if (h->alive[i])
            mem_free(m, &h->st[i]);
    free(h->st);
    free(h->alive);
    memset(h, 0, sizeof *h);
}

/* Makes `m` hold `live` buffers of mixed sizes, and holes: half as many
 * again are allocated, then a random third of all freed. */
static int held_fill(mem_manager *m, size_t live, held_set *h)
{
    h->total = live + live / 2;
    h->st = calloc(h->total, sizeof *h->st);
    h->alive = calloc(h->total, 1);
    size_t *order = malloc(h->total * sizeof *order);
    uint64_t rng = 0x9E3779B97F4A7C15ULL ^ (uint64_t)live;
    int rc = 1;
    if (!h->st || !h->alive || !order) {
        fprintf(stderr, "bench_memory: out of host memory\n");
        goto done;
    }
    for (size_t i = 0; i < h->total; i++) {
        if (failed(mem_alloc(m, mixed_size(&rng), &h->st[i]), "mem_alloc"))
            goto done;
        h->alive[i] = 1;
        order[i] = i;
    }
    /* Shuffle the indices and free the first total - live of them. */
    for (size_t i = h->total - 1; i > 0; i--) {
        size_t j = (size_t)(rng_next(&rng) % (i + 1));
        size_t tmp = order[i];
        order[i] = order[j];
        order[j] = tmp;
    }
    for (size_t i = 0; i < h->total - live; i++) {
        mem_free(m, &h->st[order[i]]);
        h->alive[order[i]] = 0;
    }
    rc = 0;
done:
    free(order);
    if (rc)
        held_release(m, h);
    return rc;
}

#define SCALE_ROUNDS 201

static int bench_scaling(const mem_device *dev)
{
    static const size_t lives[3] = {10, 1000, 100000};
    static double t[SCALE_ROUNDS];
    double ns[3][3];
    mem_storage_ops ops = {NULL, host_alloc, host_free};
    for (int k = 0; k < 3; k++) {
        mem_manager *m = NULL;
        held_set held = {NULL, NULL, 0};
        if (failed(mem_manager_create(&ops, dev, NULL, &m),
                   "mem_manager_create"))
            return 1;
        if (held_fill(m, lives[k], &held)) {
            mem_manager_destroy(m);
            return 1;
        }
        int bad = 0;
        for (int i = 0; i < 3 && !bad; i++) {
            for (int r = -PAIR_WARMUP; r < SCALE_ROUNDS && !bad; r++) {
                double d;
                bad = manager_pairs(m, pair_sizes[i], PAIR_BATCH, &d);
                if (r >= 0)
                    t[r] = d;
            }
            if (!bad)
                ns[k][i] = median(t, SCALE_ROUNDS);
        }
        held_release(m, &held);
        mem_manager_destroy(m);
        if (bad)
            return 1;
    }

    printf("## (b) Scaling: the manager-level pair of (a) with other buffers "
           "live (mixed sizes, with holes), ns per pair, median of %d "
           "rounds of %d pairs\n\n",
           SCALE_ROUNDS, PAIR_BATCH);
    table_header("cubert ÷ 10 live");
    char what[128], ours[64], peer[64], theirs[64], note[64], sz[32];
    for (int i = 0; i < 3; i++) {
        size_name(pair_sizes[i], sz, sizeof sz);
        snprintf(theirs, sizeof theirs, "%.1f ns", ns[0][i]);
        snprintf(peer, sizeof peer, "same pair, 10 other live buffers");
        for (int k = 1; k < 3; k++) {
            double ratio = ns[k][i] / ns[0][i];
            snprintf(what, sizeof what,
                     "mem_alloc + mem_free, %s, %zu other live buffers", sz,
                     lives[k]);
            snprintf(ours, sizeof ours, "%.1f ns", ns[k][i]);
            snprintf(note, sizeof note, " (aim ≤ 1.2; %s)",
                     ratio <= 1.2 ? "met" : "missed");
            row(what, ours, peer, theirs, ratio, note);
        }
    }
    printf("\n");
    return 0;
}

/* --- (c) fragmentation: trace replay --- */

#define REPLAY_ALIGNMENT 512ull
#define REPLAY_MEMORY (80ull << 30)
#define CHECK_EVERY 1000

typedef struct block {
    uint64_t address, size;
} block;

static int cmp_block(const void *a, const void *b)
{
    uint64_t x = ((const block *)a)->address, y = ((const block *)b)->address;
    return (x > y) - (x < y);
}

/* Checks that live blocks are aligned and disjoint and that the manager's
 * usage agrees with the trace; prints the first mistake. */
static int check_blocks(mem_manager *m, const cube_storage *st,
                        const uint8_t *live, uint32_t max_id,
                        uint64_t live_bytes, size_t op_index, block *scratch)
{
    size_t n = 0;
    for (uint32_t id = 1; id <= max_id; id++) {
        if (!live[id])
            continue;
        if (st[id].address % REPLAY_ALIGNMENT) {
            fprintf(stderr,
                    "bench_memory: after op %zu buffer %u is at 0x%llx, not "
                    "a multiple of %llu\n",
                    op_index, id, (unsigned long long)st[id].address,
                    REPLAY_ALIGNMENT);
            return 1;
        }
        scratch[n].address = st[id].address;
        scratch[n].size = st[id].size;
        n++;
    }
    qsort(scratch, n, sizeof *scratch, cmp_block);
    for (size_t i = 1; i < n; i++)
        if (scratch[i - 1].address + scratch[i - 1].size > scratch[i].address) {
            fprintf(stderr,
                    "bench_memory: after op %zu live blocks overlap: "
                    "[0x%llx, +%llu) and [0x%llx, +%llu)\n",
                    op_index, (unsigned long long)scratch[i - 1].address,
                    (unsigned long long)scratch[i - 1].size,
                    (unsigned long long)scratch[i].address,
                    (unsigned long long)scratch[i].size);
            return 1;
        }
    cube_memory_usage u;
    mem_usage(m, &u);
    if (u.buffers != n || u.bytes_in_use != live_bytes) {
        fprintf(stderr,
                "bench_memory: after op %zu the manager reports %llu "
                "buffers and %llu bytes in use; the trace has %zu and "
                "%llu\n",
                op_index, (unsigned long long)u.buffers,
                (unsigned long long)u.bytes_in_use, n,
                (unsigned long long)live_bytes);
        return 1;
    }
    return 0;
}

/* What a pass of the trace asked of the storage: calls (allocations,
 * frees, maps, unmaps) and the bytes they moved (allocated or mapped, and
 * freed or unmapped). */
typedef struct storage_work {
    uint64_t calls, maps, unmaps, bytes;
} storage_work;

typedef struct replay_result {
    uint64_t peak_live, peak_reserved;
    uint64_t storage_allocs, storage_frees; /* frees count unmaps */
    double ns_per_op;
    cube_memory_report at_peak; /* mem_report when reserved peaked */
    /* The warm pass: the trace replayed again on the same manager, after
     * the first pass and the release of what it left live. */
    storage_work warm;
    uint64_t warm_peak_reserved; /* over both passes */
} replay_result;

static storage_work work_of(const count_storage *cs)
{
    storage_work w = {cs->allocs + cs->frees, cs->maps, cs->unmaps,
                      cs->bytes_in + cs->bytes_out};
    return w;
}

/* One pass of the trace over `m`; live[] and st[] start empty and end as
 * the trace leaves them. */
static int replay_pass(const trace *t, mem_manager *m, count_storage *cs,
                       cube_storage *st, uint8_t *live, block *scratch,
                       replay_result *res, double *elapsed)
{
    uint64_t live_bytes = 0, best = 0;
    for (size_t i = 0; i < t->count; i++) {
        const trace_op *op = &t->ops[i];
        double t0 = now_ns();
        if (op->free) {
            if (!live[op->id]) {
                fprintf(stderr,
                        "bench_memory: trace op %zu frees %u, which is not "
                        "live\n",
                        i, op->id);
                return 1;
            }
            mem_free(m, &st[op->id]);
            *elapsed += now_ns() - t0;
            live[op->id] = 0;
            live_bytes -= st[op->id].size;
        } else {
            if (live[op->id]) {
                fprintf(stderr,
                        "bench_memory: trace op %zu allocates %u twice\n", i,
                        op->id);
                return 1;
            }
            cube_error *err = mem_alloc(m, op->size, &st[op->id]);
            *elapsed += now_ns() - t0;
            if (err) {
                char what[96];
                snprintf(what, sizeof what,
                         "mem_alloc of %llu bytes at trace op %zu",
                         (unsigned long long)op->size, i);
                failed(err, what);
                return 1;
            }
            if (st[op->id].size != op->size) {
                fprintf(stderr,
                        "bench_memory: mem_alloc(%llu) gave a storage of "
                        "size %llu\n",
                        (unsigned long long)op->size,
                        (unsigned long long)st[op->id].size);
                return 1;
            }
            live[op->id] = 1;
            live_bytes += op->size;
            if (live_bytes > res->peak_live)
                res->peak_live = live_bytes;
        }
        if (cs->reserved > best) {
            best = cs->reserved;
            mem_report(m, &res->at_peak);
        }
        if ((i + 1) % CHECK_EVERY == 0 &&
            check_blocks(m, st, live, t->max_id, live_bytes, i, scratch))
            return 1;
    }
    if (check_blocks(m, st, live, t->max_id, live_bytes, t->count, scratch))
        return 1;
    if (best && res->at_peak.usage.bytes_reserved != best) {
        fprintf(stderr,
                "bench_memory: at the peak the manager reports %llu bytes "
                "reserved; its storage holds %llu\n",
                (unsigned long long)res->at_peak.usage.bytes_reserved,
                (unsigned long long)best);
        return 1;
    }
    return 0;
}

static int replay_manager(const trace *t, cube_layout_preset preset,
                          replay_result *res)
{
    memset(res, 0, sizeof *res);
    mem_device dev = {REPLAY_ALIGNMENT, REPLAY_MEMORY};
    count_storage cs = {1ull << 40, REPLAY_MEMORY, 0, 0, 0, 0, 0, 0, 0, 0};
    mem_storage_ops ops = {
        &cs,           count_alloc, count_free,  REPLAY_GRANULARITY,
        count_reserve, count_map,   count_unmap, count_release};
    cube_memory_layout layout;
    mem_manager *m = NULL;
    cube_storage *st = calloc((size_t)t->max_id + 1, sizeof *st);
    uint8_t *live = calloc((size_t)t->max_id + 1, 1);
    block *scratch = calloc((size_t)t->max_id + 1, sizeof *scratch);
    replay_result *warm = calloc(1, sizeof *warm);
    int rc = 1;
    if (!st || !live || !scratch || !warm) {
        fprintf(stderr, "bench_memory: out of host memory\n");
        goto done;
    }
    if (failed(mem_layout_preset(preset, &dev, &layout), "mem_layout_preset") ||
        failed(mem_manager_create(&ops, &dev, &layout, &m),
               "mem_manager_create"))
        goto done;
    double elapsed = 0.0, warm_elapsed = 0.0;
    if (replay_pass(t, m, &cs, st, live, scratch, res, &elapsed))
        goto done;
    res->peak_reserved = cs.reserved_peak;
    res->storage_allocs = cs.allocs;
    res->storage_frees = cs.frees;
    res->ns_per_op = elapsed / (double)(t->count ? t->count : 1);
    /* The warm pass: what the first left live goes first (a step's
     * end), then the same operations again; no cleanup in between, as in
     * a training loop. */
    for (uint32_t id = 1; id <= t->max_id; id++)
        if (live[id]) {
            mem_free(m, &st[id]);
            live[id] = 0;
        }
    storage_work before = work_of(&cs);
    if (replay_pass(t, m, &cs, st, live, scratch, warm, &warm_elapsed))
        goto done;
    storage_work after = work_of(&cs);
    res->warm.calls = after.calls - before.calls;
    res->warm.maps = after.maps - before.maps;
    res->warm.unmaps = after.unmaps - before.unmaps;
    res->warm.bytes = after.bytes - before.bytes;
    res->warm_peak_reserved = cs.reserved_peak;
    rc = 0;
done:
    /* What the trace left live goes back before the manager does. */
    for (uint32_t id = 1; m && live && id <= t->max_id; id++)
        if (live[id])
            mem_free(m, &st[id]);
    mem_manager_destroy(m);
    if (!rc && cs.reserved != 0) {
        fprintf(stderr,
                "bench_memory: %llu bytes still reserved after "
                "mem_manager_destroy\n",
                (unsigned long long)cs.reserved);
        rc = 1;
    }
    free(st);
    free(live);
    free(scratch);
    free(warm);
    return rc;
}

typedef struct malloc_result {
    uint64_t peak_usable, peak_held;
    double ns_per_op;
} malloc_result;

#if defined(__GLIBC__) && (__GLIBC__ > 2 || __GLIBC_MINOR__ >= 33)
#define HAVE_MALLINFO2 1
#endif

/* Bytes malloc holds from the system (heap and mmapped chunks); with
 * `in_use` nonzero, only the bytes of live chunks. */
static uint64_t malloc_held(int in_use)
{
#ifdef HAVE_MALLINFO2
    struct mallinfo2 mi = mallinfo2();
    return (in_use ? (uint64_t)mi.uordblks : (uint64_t)mi.arena) +
           (uint64_t)mi.hblkhd;
#else
    (void)in_use;
    return 0;
#endif
}

/* The trace through malloc/free. The memory is never written: the
 * allocator touches only its headers. */
static int replay_malloc(const trace *t, malloc_result *res)
{
    memset(res, 0, sizeof *res);
    void **p = calloc((size_t)t->max_id + 1, sizeof *p);
    uint64_t *usable = calloc((size_t)t->max_id + 1, sizeof *usable);
    if (!p || !usable) {
        free(p);
        free(usable);
        fprintf(stderr, "bench_memory: out of host memory\n");
        return 1;
    }
    /* Free memory malloc kept from earlier work goes back first; what the
     * process still uses before the replay is not counted. */
#ifdef HAVE_MALLINFO2
    malloc_trim(0);
#endif
    uint64_t base = malloc_held(1), in_use = 0, held_peak = 0;
    double elapsed = 0.0;
    int rc = 0;
    for (size_t i = 0; i < t->count && !rc; i++) {
        const trace_op *op = &t->ops[i];
        double t0 = now_ns();
        if (op->free) {
            free(p[op->id]);
            elapsed += now_ns() - t0;
            p[op->id] = NULL;
            in_use -= usable[op->id];
        } else {
            p[op->id] = malloc((size_t)op->size);
            elapsed += now_ns() - t0;
            if (!p[op->id]) {
                fprintf(stderr,
                        "bench_memory: malloc(%llu) failed at trace op %zu\n",
                        (unsigned long long)op->size, i);
                rc = 1;
                break;
            }
            usable[op->id] = malloc_usable_size(p[op->id]);
            in_use += usable[op->id];
            if (in_use > res->peak_usable)
                res->peak_usable = in_use;
        }
        uint64_t held = malloc_held(0);
        if (held > held_peak)
            held_peak = held;
    }
    for (uint32_t id = 1; id <= t->max_id; id++)
        free(p[id]);
    free(p);
    free(usable);
    res->peak_held = held_peak > base ? held_peak - base : 0;
    res->ns_per_op = elapsed / (double)(t->count ? t->count : 1);
    return rc;
}

static double gib(uint64_t bytes)
{
    return (double)bytes / (double)(1ull << 30);
}

/* One row of the summary over every trace: peak reserved ÷ peak live per
 * preset. */
typedef struct trace_row {
    const char *path;
    uint64_t peak_live;
    uint64_t reserved[3];      /* subslices, exclusive, expandable */
    uint64_t reserved_both[3]; /* over the first and the warm pass */
    storage_work warm[3];
} trace_row;

static int bench_fragmentation(const char *path, trace_row *summary)
{
    trace t;
    if (trace_load(path, &t))
        return 1;
    replay_result *sub = calloc(1, sizeof *sub);
    replay_result *exc = calloc(1, sizeof *exc);
    replay_result *exp = calloc(1, sizeof *exp);
    malloc_result mal;
    int rc = 1;
    if (!sub || !exc || !exp) {
        fprintf(stderr, "bench_memory: out of host memory\n");
        goto done;
    }
    if (replay_manager(&t, CUBE_PRESET_SUBSLICES, sub) ||
        replay_manager(&t, CUBE_PRESET_EXCLUSIVE, exc) ||
        replay_manager(&t, CUBE_PRESET_EXPANDABLE, exp) ||
        replay_malloc(&t, &mal))
        goto done;
    summary->path = path;
    summary->peak_live = sub->peak_live;
    summary->reserved[0] = sub->peak_reserved;
    summary->reserved[1] = exc->peak_reserved;
    summary->reserved[2] = exp->peak_reserved;
    const replay_result *all[3] = {sub, exc, exp};
    for (int k = 0; k < 3; k++) {
        summary->reserved_both[k] = all[k]->warm_peak_reserved;
        summary->warm[k] = all[k]->warm;
    }

    size_t allocs = 0;
    for (size_t i = 0; i < t.count; i++)
        allocs += !t.ops[i].free;
    printf("## (c) Fragmentation: %s replayed (%zu ops, %zu allocations, "
           "peak live %.3f GiB), peak reserved ÷ peak live\n\n",
           path, t.count, allocs, gib(sub->peak_live));
    if (t.header[0])
        printf("Trace: `%s`\n\n", t.header + (t.header[1] == ' ' ? 2 : 1));
    printf("Manager: default preset for a device of %.0f GiB with %llu-byte "
           "alignment; storage that counts bytes (no memory touched).\n\n",
           gib(REPLAY_MEMORY), REPLAY_ALIGNMENT);
    table_header("cubert ÷ peer");
    double ours = (double)sub->peak_reserved / (double)sub->peak_live;
    double usable = (double)mal.peak_usable / (double)sub->peak_live;
    double held = (double)mal.peak_held / (double)sub->peak_live;
    char o[96], peer[160], theirs[96], note[64];
    snprintf(o, sizeof o, "%.3f (%.3f GiB reserved)", ours,
             gib(sub->peak_reserved));
    snprintf(note, sizeof note, " (aim: cubert ≤ 1.10; %s)",
             ours <= 1.10 ? "met" : "missed");
    snprintf(peer, sizeof peer,
             "glibc malloc: peak Σ malloc_usable_size of live buffers "
             "(rounding only) ÷ peak live");
    snprintf(theirs, sizeof theirs, "%.3f (%.3f GiB)", usable,
             gib(mal.peak_usable));
    row("mem_alloc/mem_free, subslices preset (default)", o, peer, theirs,
        ours / usable, note);
    if (mal.peak_held) {
        snprintf(peer, sizeof peer,
                 "glibc malloc: peak heap + mmapped bytes held (mallinfo2 "
                 "arena + hblkhd) ÷ peak live");
        snprintf(theirs, sizeof theirs, "%.3f (%.3f GiB)", held,
                 gib(mal.peak_held));
        row("mem_alloc/mem_free, subslices preset (default)", o, peer, theirs,
            ours / held, NULL);
    }
    double ex = (double)exc->peak_reserved / (double)exc->peak_live;
    snprintf(o, sizeof o, "%.3f (%.3f GiB reserved)", ex,
             gib(exc->peak_reserved));
    snprintf(peer, sizeof peer, "subslices preset (default), same replay");
    snprintf(theirs, sizeof theirs, "%.3f", ours);
    row("mem_alloc/mem_free, exclusive preset", o, peer, theirs, ex / ours,
        NULL);
    double vm = (double)exp->peak_reserved / (double)exp->peak_live;
    snprintf(o, sizeof o, "%.3f (%.3f GiB mapped)", vm,
             gib(exp->peak_reserved));
    row("mem_alloc/mem_free, expandable preset", o, peer, theirs, vm / ours,
        NULL);
    if (mal.peak_held) {
        snprintf(peer, sizeof peer,
                 "glibc malloc: peak heap + mmapped bytes held ÷ peak live");
        snprintf(theirs, sizeof theirs, "%.3f", held);
        row("mem_alloc/mem_free, expandable preset", o, peer, theirs, vm / held,
            NULL);
    }
    snprintf(o, sizeof o, "%.0f ns", sub->ns_per_op);
    snprintf(theirs, sizeof theirs, "%.0f ns", mal.ns_per_op);
    snprintf(note, sizeof note, " (%llu storage allocations)",
             (unsigned long long)sub->storage_allocs);
    row("replay time per op, subslices preset", o, "glibc malloc/free, per op",
        theirs, sub->ns_per_op / mal.ns_per_op, note);
    snprintf(o, sizeof o, "%.0f ns", exp->ns_per_op);
    snprintf(note, sizeof note,
             " (%llu storage allocations and maps, %llu frees and unmaps)",
             (unsigned long long)exp->storage_allocs,
             (unsigned long long)exp->storage_frees);
    row("replay time per op, expandable preset", o, "glibc malloc/free, per op",
        theirs, exp->ns_per_op / mal.ns_per_op, note);
    snprintf(theirs, sizeof theirs, "%.0f ns", sub->ns_per_op);
    row("replay time per op, expandable preset", o,
        "subslices preset (default), per op", theirs,
        exp->ns_per_op / sub->ns_per_op, NULL);
    printf("\n");

    char *text = cube_memory_report_format(&sub->at_peak, CUBE_REPORT_TABLE);
    if (!text) {
        fprintf(stderr, "bench_memory: cube_memory_report_format failed\n");
        goto done;
    }
    printf("Per-pool report when reserved bytes peaked (subslices "
           "preset):\n\n```\n%s```\n\n",
           text);
    free(text);
    text = cube_memory_report_format(&exp->at_peak, CUBE_REPORT_TABLE);
    if (!text) {
        fprintf(stderr, "bench_memory: cube_memory_report_format failed\n");
        goto done;
    }
    printf("Per-pool report when mapped bytes peaked (expandable "
           "preset):\n\n```\n%s```\n\n",
           text);
    free(text);
    rc = 0;
done:
    free(sub);
    free(exc);
    free(exp);
    free(t.ops);
    return rc;
}

/* --- every trace --- */

/* The traces committed beside the default one (*.trace, *.trace.gz),
 * sorted; NULL-terminated, in *out (free with globfree). */
static int committed_traces(glob_t *g)
{
    char pattern[1024];
    const char *dir = BENCH_TRACE_DIR;
    snprintf(pattern, sizeof pattern, "%s/*.trace", dir);
    int r = glob(pattern, 0, NULL, g);
    if (r != 0 && r != GLOB_NOMATCH)
        return -1;
    snprintf(pattern, sizeof pattern, "%s/*.trace.gz", dir);
    r = glob(pattern, r == 0 ? GLOB_APPEND : 0, NULL, g);
    if (r != 0 && r != GLOB_NOMATCH)
        return -1;
    return g->gl_pathc ? 0 : -1;
}

static void print_summary(const trace_row *rows, size_t n)
{
    static const char *const names[3] = {"subslices (default)", "exclusive",
                                         "expandable"};
    printf("## (d) Every trace: peak reserved ÷ peak live per preset, and "
           "the storage work of a warm pass\n\n");
    printf("The warm pass replays the trace a second time on the same "
           "manager (what the first pass left live freed first, no "
           "cleanup): storage calls are allocations, frees, maps and "
           "unmaps; bytes are those allocated or mapped plus those freed "
           "or unmapped. Ratio (both passes): the peak reserved over the "
           "two passes ÷ peak live.\n\n");
    printf("| Trace | Preset | Peak live (GiB) | Peak reserved (GiB) | "
           "Ratio | Ratio (both passes) | Warm calls | Warm maps / unmaps | "
           "Warm bytes (GiB) |\n"
           "|---|---|---:|---:|---:|---:|---:|---:|---:|\n");
    for (size_t i = 0; i < n; i++) {
        const char *base = strrchr(rows[i].path, '/');
        base = base ? base + 1 : rows[i].path;
        double live = (double)rows[i].peak_live;
        for (int k = 0; k < 3; k++)
            printf("| %s | %s | %.3f | %.3f | %.3f | %.3f | %llu | %llu / "
                   "%llu | %.3f |\n",
                   base, names[k], gib(rows[i].peak_live),
                   gib(rows[i].reserved[k]),
                   live ? (double)rows[i].reserved[k] / live : 0.0,
                   live ? (double)rows[i].reserved_both[k] / live : 0.0,
                   (unsigned long long)rows[i].warm[k].calls,
                   (unsigned long long)rows[i].warm[k].maps,
                   (unsigned long long)rows[i].warm[k].unmaps,
                   gib(rows[i].warm[k].bytes));
    }
    printf("\n");
}

/* --check: loads each trace and checks that its events pair up. */
static int check_traces(char **paths, int n)
{
    int rc = 0;
    for (int i = 0; i < n; i++) {
        trace t;
        trace_summary sum;
        if (trace_load(paths[i], &t)) {
            rc = 1;
            continue;
        }
        if (trace_check(paths[i], &t, &sum) == 0)
            printf("%s: %zu ops, %zu allocations, %zu frees, %zu left live, "
                   "peak live %llu bytes: ok\n",
                   paths[i], t.count, sum.allocs, sum.frees, sum.left_live,
                   (unsigned long long)sum.peak_live_bytes);
        else
            rc = 1;
        free(t.ops);
    }
    return rc;
}

/* --- main --- */

static int usage(void)
{
    fprintf(stderr,
            "usage: bench_memory [--fragmentation] [TRACE...]\n"
            "       bench_memory --check TRACE...\n"
            "TRACE: an allocation trace, plain or .gz (default: every "
            "*.trace and *.trace.gz in %s)\n",
            BENCH_TRACE_DIR);
    return 2;
}

int main(int argc, char **argv)
{
    double start = now_ns();
    int only_traces = 0, first = 1;
    if (argc > 1 && strcmp(argv[1], "--check") == 0)
        return argc > 2 ? check_traces(argv + 2, argc - 2) : usage();
    if (argc > 1 && strcmp(argv[1], "--fragmentation") == 0) {
        only_traces = 1;
        first = 2;
    }
    if (argc > first && argv[first][0] == '-')
        return usage();
    glob_t g;
    memset(&g, 0, sizeof g);
    char **paths = argv + first;
    size_t npaths = (size_t)(argc - first);
    if (npaths == 0) {
        if (committed_traces(&g) != 0) {
            fprintf(stderr, "bench_memory: no traces in %s\n", BENCH_TRACE_DIR);
            globfree(&g);
            return 1;
        }
        paths = g.gl_pathv;
        npaths = g.gl_pathc;
    }
    int rc = 0;
    if (!only_traces) {
        cube_client *c = NULL;
        if (failed(cube_client_open("cpu", NULL, &c), "cube_client_open"))
            return 1;
        cube_properties p;
        if (failed(cube_client_properties(c, &p), "cube_client_properties")) {
            cube_client_close(c);
            return 1;
        }
        print_machine(&p);
        /* The manager of (a) and (b) is built for the same device as the
         * CPU backend's. */
        mem_device dev = {p.memory_alignment, p.memory_total};
        rc = bench_hot_path(c, &dev);
        cube_client_close(c);
        if (!rc)
            rc = bench_hot_path_expandable(&dev);
        if (!rc)
            rc = bench_scaling(&dev);
    }
    trace_row *rows = calloc(npaths, sizeof *rows);
    if (!rows)
        rc = 1;
    for (size_t i = 0; i < npaths && !rc; i++)
        rc = bench_fragmentation(paths[i], &rows[i]);
    if (!rc)
        print_summary(rows, npaths);
    free(rows);
    globfree(&g);

    printf("Notes: the bench and its peers are compiled with -O2 and linked "
           "statically against cubert. Pairs (a) alternate the two sides "
           "round by round. The fragmentation replay (c) gives the ratio of "
           "two peaks, which may fall at different moments; its malloc "
           "peers run the same operations with real malloc/free calls on "
           "memory never written. Times: clock_gettime(CLOCK_MONOTONIC).\n");
    printf("\nbench_memory: %s in %.1f s\n", rc ? "FAILED" : "done",
           (now_ns() - start) * 1e-9);
    return rc ? 1 : 0;
}
