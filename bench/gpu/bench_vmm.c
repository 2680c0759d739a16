/* cubert's expandable pool on CUDA beside the driver's own calls, in one
 * run on one GPU: the figures that decide whether the expandable preset
 * (CUBE_PRESET_EXPANDABLE) becomes the default.
 *
 *  (a) map + unmap: a fresh 2 MiB and 64 MiB block of the expandable
 *      pool. cubert: cube_empty on a stream whose pool holds no mapped
 *      page (the miss maps the block's pages: cuMemCreate + cuMemMap +
 *      cuMemSetAccess per chunk, a run of up to MEM_VM_CHUNK_PAGES = 16
 *      pages: one for 2 MiB, two for 64 MiB), then cube_handle_release +
 *      cube_memory_cleanup (the unmap path: an event recorded on the
 *      stream; the pages' cuMemUnmap runs at the stream's next map, in
 *      the next round's map). Driver: the same calls on a range reserved
 *      once, one allocation per page (as cubert made them before chunks),
 *      with the same
 *      access list (this device and every device that can reach it);
 *      also one allocation for the whole 64 MiB. Host µs, medians.
 *  (b) the pool-hit pair: cube_empty + cube_handle_release on a stream
 *      with the default preset (CUBE_PRESET_SUBSLICES) and on one with the
 *      expandable preset, beside cuMemAllocAsync + cuMemFreeAsync (the
 *      device's default memory pool); 256 B to 32 MiB (above 128 KiB the
 *      presets differ: the default's sliced 16 MiB pages up to 1 MiB and
 *      exclusive pages above, against the expandable pool).
 *      Host ns per pair, medians. Aim: at most 0.15x of the async pair.
 *  (c) the committed PyTorch traces (bench/traces/torch_*.trace.gz)
 *      replayed through the public API, each preset on its own stream:
 *      "a" is cube_empty, "f" cube_handle_release, and every EVERY-th
 *      allocation launches a kernel that writes the new buffer (the whole
 *      buffer, or its first 256 words with --touch), so the stream has
 *      work queued when the pool unmaps. Host time of a pass, closed by a
 *      cube_sync; a cold pass (the pools empty) and a warm one (the pools
 *      as the cold pass left them), per operation and in all; the maps and
 *      unmaps of the pass (cube_memory_stats: device_allocations and
 *      device_frees; on CUDA an unmap records an event, never a stream
 *      synchronization) and
 *      peak reserved ÷ peak live. The two presets alternate round by round.
 *
 * Checks: (a) a kernel writes each fresh block whole and its last word is
 * read back, on both sides, in the first round; every cubert round must
 * map and unmap (the counters say so). (b) the counters must show pool
 * hits only. (c) an untimed pass per preset reads back the first and last
 * word written of every 16th written buffer just before its release, and
 * every timed pass ends in a cube_sync that reports any device fault (a
 * kernel touching an unmapped page). Any failure prints what and exits 1;
 * when cubert cannot open the CUDA device the program exits 77 (skipped).
 *
 *   ./build/bench/bench_vmm [--device N] [--rounds R] [--every N]
 *                           [--touch] [--phases map,hit,trace] [TRACE...]
 *   ./build/bench/bench_vmm --client cpu [TRACE...]
 *
 * --client NAME opens another device ("cpu", "null") and runs (c) alone,
 * with no driver call: a check of the replay and its read-backs where no
 * GPU is.
 * Without TRACE arguments (c) replays bench/traces/torch_*.trace.gz.
 * Built only where CMake finds the CUDA toolkit; links libcuda.
 */
#include <cuda.h>
#include <glob.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <time.h>

#include "../trace_file.h"
#include "cubert/cubert.h"

#define PAGE (2ull << 20)
#define MAP_ROUNDS 31
#define HIT_PAIRS 1000
#define HIT_ROUNDS 51
#define TRACE_ROUNDS 5
#define CHECK_EVERY 16 /* written buffers read back in the checked pass */
#define TOUCH_WORDS 256u

static void cu_check(CUresult r, const char *call, int line)
{
    if (r == CUDA_SUCCESS)
        return;
    const char *name = NULL;
    cuGetErrorName(r, &name);
    fprintf(stderr, "bench_vmm: line %d: %s failed: %s\n", line, call,
            name ? name : "unknown error");
    exit(1);
}
#define CK(call) cu_check((call), #call, __LINE__)

static void die(const char *what)
{
    fprintf(stderr, "bench_vmm: %s\n", what);
    exit(1);
}

static void *xmalloc(size_t n)
{
    void *p = malloc(n ? n : 1);
    if (!p)
        die("out of host memory");
    return p;
}

static double now_ns(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec * 1e9 + (double)t.tv_nsec;
}

static void ok(cube_error *err, const char *what)
{
    if (!err)
        return;
    char *text = cube_error_format(err);
    fprintf(stderr, "bench_vmm: %s failed:\n%s\n", what,
            text ? text : cube_error_message(err));
    free(text);
    cube_error_free(err);
    exit(1);
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return v[n / 2];
}

/* Writes v + i to word i of `out`, i < n, grid-stride. */
static const char stamp_src[] =
    "CUBE_KERNEL(stamp, CUBE_OUT(uint32_t, out), CUBE_SCALAR(uint32_t, n),\n"
    "            CUBE_SCALAR(uint32_t, v))\n"
    "{\n"
    "    uint32_t step = CUBE_COUNT_X * CUBE_DIM_X;\n"
    "    for (uint32_t i = ABSOLUTE_POS_X; i < n; i += step)\n"
    "        out[i] = v + i;\n"
    "}\n";

static struct {
    cube_client *client;
    cube_kernel *stamp;
    CUdevice dev;
    CUcontext ctx;
    CUstream stream;
    CUmemAllocationProp prop;
    CUmemAccessDesc access[64];
    int access_count;
    int every;
    int touch;
    int rounds;
} S;

/* The presets, each on a stream of its own. */
enum { DEFAULT = 0, EXPANDABLE = 1 };
static const cube_stream_id stream_of[2] = {101, 102};
static const char *const preset_name[2] = {"default (subslices)", "expandable"};

static void use(int preset)
{
    ok(cube_stream_use(S.client, stream_of[preset]), "cube_stream_use");
}

static cube_memory_stats stats(void)
{
    cube_memory_stats st;
    memset(&st, 0, sizeof st);
    st.struct_size = sizeof st;
    ok(cube_memory_stats_get(S.client, CUBE_MEMORY_STREAM, &st),
       "cube_memory_stats_get");
    return st;
}

/* Launches stamp over the first `words` words of `h`. */
static void stamp(cube_handle h, uint64_t words, uint32_t v)
{
    uint32_t n = words > UINT32_MAX ? UINT32_MAX : (uint32_t)words;
    uint32_t cubes = (n + 255u) / 256u;
    if (cubes > 1024u)
        cubes = 1024u;
    cube_arg args[3] = {cube_arg_buffer(h), cube_arg_scalar(&n, 4),
                        cube_arg_scalar(&v, 4)};
    ok(cube_launch(S.client, S.stamp, cube_count_static(cubes, 1, 1), args, 3,
                   CUBE_LAUNCH_EXECUTE),
       "cube_launch(stamp)");
}

/* Reads word `i` of `h`. */
static uint32_t word_at(cube_handle h, uint64_t i)
{
    cube_handle s;
    ok(cube_handle_slice(S.client, h, i * 4, 4, &s), "cube_handle_slice");
    uint32_t w = 0;
    ok(cube_read_all(S.client, s, &w, 4), "cube_read_all");
    ok(cube_handle_release(S.client, s), "cube_handle_release(slice)");
    return w;
}

static void check_word(cube_handle h, uint64_t i, uint32_t want,
                       const char *what)
{
    uint32_t got = word_at(h, i);
    if (got != want) {
        fprintf(stderr, "bench_vmm: %s: word %llu reads %u, not %u\n", what,
                (unsigned long long)i, got, want);
        exit(1);
    }
}

/* --- setup --- */

static void setup_driver(int device)
{
    CK(cuInit(0));
    CK(cuDeviceGet(&S.dev, device));
    CK(cuDevicePrimaryCtxRetain(&S.ctx, S.dev));
    CK(cuCtxSetCurrent(S.ctx));
    CK(cuStreamCreate(&S.stream, CU_STREAM_NON_BLOCKING));
    memset(&S.prop, 0, sizeof S.prop);
    S.prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    S.prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    S.prop.location.id = S.dev;
    size_t g = 0;
    CK(cuMemGetAllocationGranularity(&g, &S.prop,
                                     CU_MEM_ALLOC_GRANULARITY_MINIMUM));
    if (g != PAGE) {
        fprintf(stderr,
                "bench_vmm: the device's page is %zu bytes, not 2 MiB\n", g);
        exit(1);
    }
    /* The access list cuda_vmm.c grants: this device, then every device
     * that can reach its memory. */
    S.access[0].location = S.prop.location;
    S.access[0].flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    S.access_count = 1;
    int count = 0;
    CK(cuDeviceGetCount(&count));
    for (int i = 0; i < count && S.access_count < 64; i++) {
        CUdevice peer;
        int can = 0;
        CK(cuDeviceGet(&peer, i));
        if (peer == S.dev)
            continue;
        CK(cuDeviceCanAccessPeer(&can, peer, S.dev));
        if (!can)
            continue;
        CUmemAccessDesc *d = &S.access[S.access_count++];
        d->location.type = CU_MEM_LOCATION_TYPE_DEVICE;
        d->location.id = peer;
        d->flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    }
}

/* Gives each preset its stream: the device's layout applies to streams
 * created after an install, and an install rebuilds the calling stream. */
static void setup_streams(void)
{
    cube_layout_preset presets[2] = {CUBE_PRESET_SUBSLICES,
                                     CUBE_PRESET_EXPANDABLE};
    for (int p = 0; p < 2; p++) {
        use(p);
        cube_handle h;
        ok(cube_empty(S.client, 256, &h), "cube_empty (stream setup)");
        ok(cube_handle_release(S.client, h), "cube_handle_release");
        cube_memory_layout layout;
        ok(cube_memory_layout_preset(S.client, presets[p], &layout),
           "cube_memory_layout_preset");
        ok(cube_install_memory_pools(S.client, &layout),
           "cube_install_memory_pools");
    }
    /* The default stream keeps its layout when the expandable one is
     * installed later: say so if that ever changes. */
    use(DEFAULT);
    cube_memory_report r;
    ok(cube_memory_report_get(S.client, &r), "cube_memory_report_get");
    for (uint32_t i = 0; i < r.count; i++)
        if (r.pools[i].config.kind == CUBE_POOL_EXPANDABLE) {
            fprintf(stderr, "bench_vmm: the default stream has an "
                            "expandable pool\n");
            exit(1);
        }
    use(EXPANDABLE);
    ok(cube_memory_report_get(S.client, &r), "cube_memory_report_get");
    int found = 0;
    for (uint32_t i = 0; i < r.count; i++)
        found |= r.pools[i].config.kind == CUBE_POOL_EXPANDABLE;
    if (!found) {
        fprintf(stderr, "bench_vmm: the expandable stream has no "
                        "expandable pool\n");
        exit(1);
    }
}

/* --- (a) map + unmap --- */

/* Maps `bytes` at `base` one allocation per `chunk` bytes (per page: the
 * expandable pool's maps before chunks; the whole block: one chunk). */
static void raw_map(CUdeviceptr base, uint64_t bytes, uint64_t chunk)
{
    for (uint64_t o = 0; o < bytes; o += chunk) {
        CUmemGenericAllocationHandle h;
        CK(cuMemCreate(&h, chunk, &S.prop, 0));
        CK(cuMemMap(base + o, chunk, 0, h, 0));
        CK(cuMemRelease(h));
        CK(cuMemSetAccess(base + o, chunk, S.access, (size_t)S.access_count));
    }
}

static void raw_unmap(CUdeviceptr base, uint64_t bytes, uint64_t chunk)
{
    for (uint64_t o = 0; o < bytes; o += chunk)
        CK(cuMemUnmap(base + o, chunk));
}

static void phase_map(void)
{
    const uint64_t sizes[2] = {PAGE, 64ull << 20};
    CUdeviceptr base;
    CK(cuMemAddressReserve(&base, 64ull << 20, PAGE, 0, 0));
    printf("## Expandable pool: mapping a fresh block and unmapping it, host "
           "µs, median of %d rounds (access for %d device(s))\n\n",
           MAP_ROUNDS, S.access_count);
    printf("| Size | cubert map (cube_empty, miss) | driver map, per page | "
           "driver map, one allocation | cubert unmap (release + cleanup) | "
           "driver unmap, per page | driver unmap, one allocation | "
           "cubert ÷ driver (map) | cubert ÷ driver (unmap) |\n");
    printf("|---|---:|---:|---:|---:|---:|---:|---:|---:|\n");
    use(EXPANDABLE);
    for (int s = 0; s < 2; s++) {
        uint64_t bytes = sizes[s];
        double cm[MAP_ROUNDS], cu_[MAP_ROUNDS], dm[MAP_ROUNDS], du[MAP_ROUNDS],
            om[MAP_ROUNDS], ou[MAP_ROUNDS];
        ok(cube_memory_cleanup(S.client), "cube_memory_cleanup");
        for (int r = 0; r < MAP_ROUNDS; r++) {
            for (int side = 0; side < 2; side++) {
                if ((side ^ (r & 1)) == 0) {
                    cube_memory_stats before = stats();
                    cube_handle h;
                    double t0 = now_ns();
                    ok(cube_empty(S.client, bytes, &h), "cube_empty");
                    cm[r] = (now_ns() - t0) / 1e3;
                    if (r == 0) {
                        stamp(h, bytes / 4, 7u);
                        check_word(h, bytes / 4 - 1,
                                   7u + (uint32_t)(bytes / 4 - 1),
                                   "a fresh expandable block");
                    }
                    ok(cube_sync(S.client, NULL, 0), "cube_sync");
                    t0 = now_ns();
                    ok(cube_handle_release(S.client, h), "cube_handle_release");
                    ok(cube_memory_cleanup(S.client), "cube_memory_cleanup");
                    cu_[r] = (now_ns() - t0) / 1e3;
                    cube_memory_stats after = stats();
                    if (after.device_allocations == before.device_allocations ||
                        after.device_frees == before.device_frees) {
                        fprintf(stderr,
                                "bench_vmm: %llu bytes: the expandable pool "
                                "did not map and unmap (maps %llu, unmaps "
                                "%llu)\n",
                                (unsigned long long)bytes,
                                (unsigned long long)(after.device_allocations -
                                                     before.device_allocations),
                                (unsigned long long)(after.device_frees -
                                                     before.device_frees));
                        exit(1);
                    }
                } else {
                    double t0 = now_ns();
                    raw_map(base, bytes, PAGE);
                    dm[r] = (now_ns() - t0) / 1e3;
                    if (r == 0) {
                        uint32_t w = 0;
                        CK(cuMemsetD32(base, 7u, bytes / 4));
                        CK(cuMemcpyDtoH(&w, base + bytes - 4, 4));
                        if (w != 7u)
                            die("the driver's mapped block reads wrong");
                    }
                    t0 = now_ns();
                    raw_unmap(base, bytes, PAGE);
                    du[r] = (now_ns() - t0) / 1e3;
                    t0 = now_ns();
                    raw_map(base, bytes, bytes);
                    om[r] = (now_ns() - t0) / 1e3;
                    t0 = now_ns();
                    raw_unmap(base, bytes, bytes);
                    ou[r] = (now_ns() - t0) / 1e3;
                }
            }
        }
        double a = median(cm, MAP_ROUNDS), b = median(dm, MAP_ROUNDS),
               c = median(om, MAP_ROUNDS), d = median(cu_, MAP_ROUNDS),
               e = median(du, MAP_ROUNDS), f = median(ou, MAP_ROUNDS);
        printf("| %llu MiB | %.1f | %.1f | %.1f | %.1f | %.1f | %.1f | %.2f | "
               "%.2f |\n",
               (unsigned long long)(bytes >> 20), a, b, c, d, e, f, a / b,
               d / e);
    }
    CK(cuMemAddressFree(base, 64ull << 20));
    printf("\ncubert's unmap is the cleanup's walk of the pools and an "
           "event recorded on the stream; the pages' cuMemUnmap runs at the "
           "next map, in its time.\n\n");
}

/* --- (b) pool hits --- */

static double cubert_pairs(uint64_t bytes)
{
    cube_handle h;
    double t0 = now_ns();
    for (int i = 0; i < HIT_PAIRS; i++) {
        ok(cube_empty(S.client, bytes, &h), "cube_empty");
        ok(cube_handle_release(S.client, h), "cube_handle_release");
    }
    return (now_ns() - t0) / HIT_PAIRS;
}

static double async_pairs(uint64_t bytes)
{
    CUdeviceptr p;
    double t0 = now_ns();
    for (int i = 0; i < HIT_PAIRS; i++) {
        CK(cuMemAllocAsync(&p, bytes, S.stream));
        CK(cuMemFreeAsync(p, S.stream));
    }
    double t = (now_ns() - t0) / HIT_PAIRS;
    CK(cuStreamSynchronize(S.stream));
    return t;
}

static void phase_hit(void)
{
    const uint64_t sizes[5] = {256, 64 << 10, 1 << 20, 4 << 20, 32 << 20};
    printf("## Allocate + release on a pool hit, host ns per pair, median of "
           "%d rounds of %d pairs\n\n",
           HIT_ROUNDS, HIT_PAIRS);
    printf("| Size | default preset | expandable preset | cuMemAllocAsync + "
           "cuMemFreeAsync | default ÷ async | expandable ÷ async |\n");
    printf("|---|---:|---:|---:|---:|---:|\n");
    for (int s = 0; s < 5; s++) {
        uint64_t bytes = sizes[s];
        double t[3][HIT_ROUNDS];
        cube_memory_stats before[2];
        for (int p = 0; p < 2; p++) {
            use(p);
            cube_handle h;
            ok(cube_empty(S.client, bytes, &h), "cube_empty (warm-up)");
            ok(cube_handle_release(S.client, h), "cube_handle_release");
            before[p] = stats();
        }
        async_pairs(bytes);
        for (int r = 0; r < HIT_ROUNDS; r++)
            for (int k = 0; k < 3; k++) {
                int side = (k + r) % 3;
                if (side < 2) {
                    use(side);
                    t[side][r] = cubert_pairs(bytes);
                } else {
                    t[2][r] = async_pairs(bytes);
                }
            }
        for (int p = 0; p < 2; p++) {
            use(p);
            cube_memory_stats after = stats();
            if (after.pool_misses != before[p].pool_misses) {
                fprintf(stderr,
                        "bench_vmm: %s preset, %llu bytes: %llu pool "
                        "misses in the timed pairs\n",
                        preset_name[p], (unsigned long long)bytes,
                        (unsigned long long)(after.pool_misses -
                                             before[p].pool_misses));
                exit(1);
            }
        }
        double d = median(t[0], HIT_ROUNDS), e = median(t[1], HIT_ROUNDS),
               a = median(t[2], HIT_ROUNDS);
        if (bytes >= (1u << 20))
            printf("| %llu MiB", (unsigned long long)(bytes >> 20));
        else if (bytes >= 1024)
            printf("| %llu KiB", (unsigned long long)(bytes >> 10));
        else
            printf("| %llu B", (unsigned long long)bytes);
        printf(" | %.1f | %.1f | %.1f | %.3f | %.3f |\n", d, e, a, d / a,
               e / a);
    }
    printf("\nAim: each preset's pair at most 0.15x of cuMemAllocAsync's.\n\n");
}

/* --- (c) traces --- */

typedef struct pass_result {
    double ns;
    uint64_t maps, unmaps;
    uint64_t reserved_peak, live_peak;
} pass_result;

/* Replays `t` on the calling stream; `checked`: reads back every
 * CHECK_EVERY-th written buffer before its release (untimed use). */
static pass_result replay(const trace *t, cube_handle *live, uint8_t *written,
                          uint32_t *value, int checked)
{
    pass_result out;
    memset(&out, 0, sizeof out);
    ok(cube_memory_reset_peaks(S.client), "cube_memory_reset_peaks");
    cube_memory_stats before = stats();
    uint64_t allocs = 0, writes = 0, live_bytes = 0;
    uint64_t *size = calloc((size_t)t->max_id + 1, sizeof *size);
    uint8_t *alive = calloc((size_t)t->max_id + 1, 1);
    if (!size || !alive)
        die("out of host memory");
    double t0 = now_ns();
    for (size_t i = 0; i < t->count; i++) {
        const trace_op *op = &t->ops[i];
        if (op->free) {
            if (checked && written[op->id] == 2) {
                uint64_t words = size[op->id] / 4;
                if (S.touch && words > TOUCH_WORDS)
                    words = TOUCH_WORDS;
                uint32_t v = value[op->id];
                check_word(live[op->id], 0, v, "a replayed buffer");
                check_word(live[op->id], words - 1, v + (uint32_t)(words - 1),
                           "a replayed buffer");
            }
            ok(cube_handle_release(S.client, live[op->id]),
               "cube_handle_release");
            alive[op->id] = 0;
            live_bytes -= size[op->id];
            continue;
        }
        ok(cube_empty(S.client, op->size, &live[op->id]), "cube_empty");
        alive[op->id] = 1;
        written[op->id] = 0;
        size[op->id] = op->size;
        live_bytes += op->size;
        if (live_bytes > out.live_peak)
            out.live_peak = live_bytes;
        if (allocs++ % (uint64_t)S.every == 0 && op->size >= 4) {
            uint64_t words = op->size / 4;
            uint32_t v = (uint32_t)(i * 2654435761u);
            stamp(live[op->id],
                  S.touch && words > TOUCH_WORDS ? TOUCH_WORDS : words, v);
            value[op->id] = v;
            written[op->id] = writes++ % CHECK_EVERY == 0 ? 2 : 1;
        }
    }
    ok(cube_sync(S.client, NULL, 0), "cube_sync (end of a trace pass)");
    out.ns = now_ns() - t0;
    cube_memory_stats after = stats();
    out.maps = after.device_allocations - before.device_allocations;
    out.unmaps = after.device_frees - before.device_frees;
    out.reserved_peak = after.reserved_bytes_peak;
    /* What the trace leaves live goes now (untimed). */
    for (uint32_t id = 1; id <= t->max_id; id++)
        if (alive[id])
            ok(cube_handle_release(S.client, live[id]), "cube_handle_release");
    free(alive);
    free(size);
    return out;
}

static const char *base_name(const char *path)
{
    const char *s = strrchr(path, '/');
    return s ? s + 1 : path;
}

static void phase_trace(char **paths, int n)
{
    printf("## Trace replay through the public API, a kernel writing %s "
           "every %d allocation(s); host time of a pass closed by a sync, "
           "median of %d rounds, presets alternating\n\n",
           S.touch ? "the first 256 words of the buffer" : "the whole buffer",
           S.every, S.rounds);
    printf("| Trace | Preset | Ops | Cold pass | Cold ns/op | Warm pass | "
           "Warm ns/op | Maps (cold / warm) | Unmaps = stream syncs (cold / "
           "warm) | Peak reserved ÷ peak live (cold) |\n");
    printf("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|\n");
    for (int f = 0; f < n; f++) {
        trace t;
        trace_summary sum;
        if (trace_load(paths[f], &t) || trace_check(paths[f], &t, &sum))
            exit(1);
        cube_handle *live = calloc((size_t)t.max_id + 1, sizeof *live);
        uint8_t *written = calloc((size_t)t.max_id + 1, 1);
        uint32_t *value = calloc((size_t)t.max_id + 1, sizeof *value);
        if (!live || !written || !value)
            die("out of host memory");
        /* The checked pass, once per preset, untimed. */
        for (int p = 0; p < 2; p++) {
            use(p);
            ok(cube_memory_cleanup(S.client), "cube_memory_cleanup");
            replay(&t, live, written, value, 1);
            ok(cube_memory_cleanup(S.client), "cube_memory_cleanup");
        }
        double cold[2][64], warm[2][64];
        pass_result rc[2], rw[2];
        for (int r = 0; r < S.rounds; r++)
            for (int k = 0; k < 2; k++) {
                int p = k ^ (r & 1);
                use(p);
                ok(cube_memory_cleanup(S.client), "cube_memory_cleanup");
                rc[p] = replay(&t, live, written, value, 0);
                rw[p] = replay(&t, live, written, value, 0);
                ok(cube_memory_cleanup(S.client), "cube_memory_cleanup");
                cold[p][r] = rc[p].ns;
                warm[p][r] = rw[p].ns;
            }
        for (int p = 0; p < 2; p++) {
            double c = median(cold[p], S.rounds), w = median(warm[p], S.rounds);
            printf("| %s | %s | %zu | %.2f ms | %.0f | %.2f ms | %.0f | "
                   "%llu / %llu | %llu / %llu | %.3f |\n",
                   base_name(paths[f]), preset_name[p], t.count, c / 1e6,
                   c / (double)t.count, w / 1e6, w / (double)t.count,
                   (unsigned long long)rc[p].maps,
                   (unsigned long long)rw[p].maps,
                   (unsigned long long)rc[p].unmaps,
                   (unsigned long long)rw[p].unmaps,
                   rc[p].live_peak
                       ? (double)rc[p].reserved_peak / (double)rc[p].live_peak
                       : 0.0);
        }
        free(live);
        free(written);
        free(value);
        free(t.ops);
    }
    printf("\nMaps and unmaps are cube_memory_stats' device_allocations and "
           "device_frees over the pass (for the default preset: device "
           "allocations and frees); on CUDA an unmap of the expandable "
           "pool records an event and synchronizes nothing. Peak live is the "
           "trace's "
           "requested bytes.\n");
}

int main(int argc, char **argv)
{
    int device = 0;
    const char *client_name = NULL;
    const char *phases = "map,hit,trace";
    char **paths = NULL;
    int npaths = 0;
    S.every = 1;
    S.rounds = TRACE_ROUNDS;
    paths = xmalloc(sizeof *paths * (size_t)(argc + 1));
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--device") == 0 && i + 1 < argc)
            device = atoi(argv[++i]);
        else if (strcmp(argv[i], "--client") == 0 && i + 1 < argc)
            client_name = argv[++i];
        else if (strcmp(argv[i], "--rounds") == 0 && i + 1 < argc)
            S.rounds = atoi(argv[++i]);
        else if (strcmp(argv[i], "--every") == 0 && i + 1 < argc)
            S.every = atoi(argv[++i]);
        else if (strcmp(argv[i], "--touch") == 0)
            S.touch = 1;
        else if (strcmp(argv[i], "--phases") == 0 && i + 1 < argc)
            phases = argv[++i];
        else if (argv[i][0] == '-') {
            fprintf(
                stderr,
                "usage: bench_vmm [--device N | --client NAME] [--rounds R] "
                "[--every N] "
                "[--touch] [--phases map,hit,trace] [TRACE...]\n");
            return 2;
        } else
            paths[npaths++] = argv[i];
    }
    if (S.rounds < 1 || S.rounds > 64 || S.every < 1) {
        fprintf(stderr, "bench_vmm: --rounds is 1..64, --every at least 1\n");
        return 2;
    }
    glob_t g;
    memset(&g, 0, sizeof g);
    if (npaths == 0) {
        if (glob(BENCH_TRACE_DIR "/torch_*.trace.gz", 0, NULL, &g) != 0) {
            fprintf(stderr, "bench_vmm: no trace in %s\n", BENCH_TRACE_DIR);
            return 1;
        }
        for (size_t i = 0; i < g.gl_pathc; i++)
            paths[npaths++] = g.gl_pathv[i];
    }

    char name[32];
    snprintf(name, sizeof name, "cuda:%d", device);
    if (client_name) {
        /* Another device: the trace phase alone (no driver calls). */
        snprintf(name, sizeof name, "%s", client_name);
        phases = "trace";
    }
    cube_client_options opts = cube_client_options_default();
    cube_error *err = cube_client_open(name, &opts, &S.client);
    if (err) {
        printf("bench_vmm: cannot open %s (%s); skipped\n", name,
               cube_error_message(err));
        cube_error_free(err);
        return 77;
    }
    if (!client_name)
        setup_driver(device);
    cube_kernel_desc desc;
    memset(&desc, 0, sizeof desc);
    desc.name = "stamp";
    desc.source = stamp_src;
    desc.cube_dim[0] = 256;
    desc.cube_dim[1] = 1;
    desc.cube_dim[2] = 1;
    ok(cube_kernel_create(&desc, &S.stamp), "cube_kernel_create");
    setup_streams();

    if (strstr(phases, "map"))
        phase_map();
    if (strstr(phases, "hit"))
        phase_hit();
    if (strstr(phases, "trace"))
        phase_trace(paths, npaths);

    cube_kernel_release(S.stamp);
    cube_client_close(S.client);
    if (!client_name) {
        CK(cuStreamDestroy(S.stream));
        CK(cuDevicePrimaryCtxRelease(S.dev));
    }
    globfree(&g);
    free(paths);
    return 0;
}
