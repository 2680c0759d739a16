/* Device virtual memory: the optional half of a stream's storage that
 * expandable pools are built on (cube_storage_ops in
 * cubert/backend/server.h states the contract).
 *
 * A reservation is cuMemAddressReserve'd address space. A map backs its
 * range (a chunk of the manager's: whole pages of the driver's minimum
 * granularity, 2 MiB on current GPUs) with one physical allocation
 * (cuMemCreate of the range's size, pinned on this device), maps it
 * (cuMemMap) and drops the handle at once (cuMemRelease): the memory
 * lives while it is mapped, and an unmap (cuMemUnmap of the whole
 * mapping: the driver unmaps only whole mappings) gives it back. The
 * manager unmaps exactly what one map call mapped, so a map is a chunk
 * here too; two bitmaps per range (pages mapped, first pages of chunks)
 * find a chunk's extent. One allocation per chunk instead of per page:
 * 64 MiB mapped as 32 pages cost 1.0-1.4 ms on an H200, as one
 * allocation 50-66 us. Access is read/write for this device and for every
 * device that can reach its memory (cuDeviceCanAccessPeer; none when
 * cuda_peer_access is 0), granted at map: peer access enabled on a
 * context does not cover memory mapped this way.
 *
 * Unmapping never races queued work, and never waits on the unmap's
 * path. An unmap defers its pages (vm_defer.h): they stay mapped and one
 * event from the server's pool is recorded on the owner stream after
 * their last use (every other stream's use was ordered before the owner's
 * current point when the block went back to the manager, see
 * cuda_memory.c). The stream's next map, unmap or release unmaps the
 * deferred pages whose event has completed (cuEventQuery); only a map the
 * driver refuses for want of memory (the manager's out-of-memory retry
 * comes through there) and a range released wait (cuEventSynchronize).
 * A map takes deferred chunks lying wholly inside its range back as they
 * are (no second mapping; its new pages get allocations of their own);
 * a deferred chunk that only overlaps it (the manager cut its chunks
 * differently since) is unmapped first, waiting for the stream's
 * deferred work (cuEventSynchronize): rare, as the manager sheds chunks
 * only to map past its mark. While a capture runs that wait cannot
 * happen, and such a map is CUBE_ERR_OUT_OF_MEMORY.
 * The manager counts deferred pages as unmapped (they are out of its
 * bytes_reserved from its unmap on); the driver holds them until their
 * event completes and the stream next maps, unmaps or releases. Without
 * an event (the pool has none and cannot create one) or room to note the
 * batch, an unmap synchronizes the owner stream and unmaps at once. A
 * live graph's memory is never unmapped: a graph pins every buffer it
 * names, so its blocks stay live, and the manager unmaps only pages no
 * live block touches.
 *
 * Captures. Recording an event on the owner stream (which may be the one
 * capturing), synchronizing or an unmap could break a capture running on
 * another thread, so while one runs an unmap only notes its pages, with
 * no event; the first map, unmap or release with no capture running
 * records one for them, and unmaps them once it has completed. A release
 * while a capture runs hands the whole range to the server (vm_later),
 * freed when the last capture ends (cuda_free_deferred) or at the first
 * stream close.
 *
 * Locks: the manager calls the storage's virtual-memory functions under
 * its lock, so a stream's ranges need no lock of their own; deferred_lock
 * for the server's gate and vm_later, never held across a driver call.
 */
#include <stdlib.h>
#include <string.h>

#include "backends/cuda/cuda_internal.h"
#include "base/error.h"
#include "cubert/log.h"

typedef unsigned long long ull;

int cuda_free_begin(cuda_server *s)
{
    cube_mutex_lock(&s->deferred_lock);
    int now = atomic_load(&s->captures) == 0;
    if (now)
        s->frees_running++;
    cube_mutex_unlock(&s->deferred_lock);
    return now;
}

void cuda_free_end(cuda_server *s)
{
    cube_mutex_lock(&s->deferred_lock);
    if (--s->frees_running == 0)
        pthread_cond_broadcast(&s->frees_idle);
    cube_mutex_unlock(&s->deferred_lock);
}

void cuda_vm_setup(cuda_server *s)
{
    const cuda_api *a = s->api;
    s->vm_granularity = 0;
    s->vm_access_count = 0;
    if (!a->cuMemGetAllocationGranularity || !a->cuMemAddressReserve ||
        !a->cuMemAddressFree || !a->cuMemCreate || !a->cuMemRelease ||
        !a->cuMemMap || !a->cuMemUnmap || !a->cuMemSetAccess) {
        cube_log_write(CUBE_LOG_INFO, "cuda",
                       "the driver has no virtual memory management "
                       "(cuMemCreate, cuMemMap...): expandable pools are "
                       "unsupported on %s",
                       s->props.name);
        return;
    }
    int supported = 0;
    if (a->cuDeviceGetAttribute(
            &supported, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED,
            s->device) != CUDA_SUCCESS ||
        !supported) {
        cube_log_write(CUBE_LOG_INFO, "cuda",
                       "%s has no virtual memory management: expandable "
                       "pools are unsupported there",
                       s->props.name);
        return;
    }
    memset(&s->vm_prop, 0, sizeof s->vm_prop);
    s->vm_prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    s->vm_prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_NONE;
    s->vm_prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    s->vm_prop.location.id = s->device;
    size_t g = 0;
    CUresult r = a->cuMemGetAllocationGranularity(
        &g, &s->vm_prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM);
    if (r != CUDA_SUCCESS || g == 0 || (g & (g - 1)) != 0) {
        cube_log_write(CUBE_LOG_INFO, "cuda",
                       "no allocation granularity for %s (%s): expandable "
                       "pools are unsupported there",
                       s->props.name,
                       r ? cuda_result_text(a, r) : "not a power of two");
        return;
    }
    /* This device, then every device that can reach its memory. */
    cuda_mem_access_desc *d = &s->vm_access[s->vm_access_count++];
    d->location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    d->location.id = s->device;
    d->flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    cube_config_value off;
    int peers =
        !(cube_config_lookup("cuda_peer_access", &off) == 0 && off.number == 0);
    int count = 0;
    if (peers && a->cuDeviceGetCount(&count) != CUDA_SUCCESS)
        count = 0;
    for (int i = 0; i < count && s->vm_access_count < CUDA_MAX_PEERS; i++) {
        CUdevice peer = 0;
        int can = 0;
        if (a->cuDeviceGet(&peer, i) != CUDA_SUCCESS || peer == s->device ||
            a->cuDeviceCanAccessPeer(&can, peer, s->device) != CUDA_SUCCESS ||
            !can)
            continue;
        d = &s->vm_access[s->vm_access_count++];
        d->location.type = CU_MEM_LOCATION_TYPE_DEVICE;
        d->location.id = peer;
        d->flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    }
    s->vm_granularity = g;
    cube_log_write(CUBE_LOG_DEBUG, "cuda",
                   "virtual memory on %s: pages of %zu bytes, read/write for "
                   "%zu device(s)",
                   s->props.name, g, s->vm_access_count);
}

/* --- pages --- */

static cuda_vm_range *range_of(cuda_stream *st, uint64_t address)
{
    for (cuda_vm_range *r = st->vm_ranges; r; r = r->next)
        if (address >= r->base && address - r->base < r->size)
            return r;
    return NULL;
}

static int bit_get(const uint64_t *bits, uint64_t i)
{
    return (int)((bits[i / 64u] >> (i % 64u)) & 1u);
}

static void bits_set(uint64_t *bits, uint64_t i, uint64_t n, int on)
{
    for (uint64_t k = i; k < i + n; k++) {
        if (on)
            bits[k / 64u] |= 1ull << (k % 64u);
        else
            bits[k / 64u] &= ~(1ull << (k % 64u));
    }
}

/* One past the last page of the chunk starting at page `h`. */
static uint64_t chunk_end(const cuda_vm_range *r, uint64_t h, uint64_t pages)
{
    uint64_t e = h + 1;
    while (e < pages && bit_get(r->mapped, e) && !bit_get(r->heads, e))
        e++;
    return e;
}

/* Unmaps the chunk starting at page `h` (its allocation goes with it); a
 * refusal is logged once per server: the memory stays with the driver. */
static void chunk_unmap(cuda_server *s, cuda_vm_range *r, uint64_t h)
{
    uint64_t g = s->vm_granularity, pages = r->size / g;
    uint64_t e = chunk_end(r, h, pages);
    uint64_t address = r->base + h * g;
    CUresult res = s->api->cuMemUnmap((CUdeviceptr)address, (e - h) * g);
    if (res != CUDA_SUCCESS && !atomic_exchange(&s->vm_unmap_warned, 1))
        cube_log_write(CUBE_LOG_WARN, "memory",
                       "cuMemUnmap of %llu bytes at 0x%llx: %s; the memory "
                       "stays with the driver",
                       (ull)((e - h) * g), (ull)address,
                       cuda_result_text(s->api, res));
    bits_set(r->mapped, h, e - h, 0);
    bits_set(r->heads, h, 1, 0);
}

/* Unmaps the chunks starting among pages [first, first + count): the
 * manager unmaps whole chunks, so they end inside it too. */
static void chunks_unmap(cuda_server *s, cuda_vm_range *r, uint64_t first,
                         uint64_t count)
{
    for (uint64_t i = first; i < first + count; i++)
        if (bit_get(r->heads, i))
            chunk_unmap(s, r, i);
}

/* --- deferred unmaps: vm_defer's markers are pooled events --- */

static int marker_done(void *self, void *marker, int wait)
{
    cuda_vm_range *r = self;
    cuda_server *s = r->stream->server;
    if (!marker) {
        /* Noted while a capture ran; no event could be recorded since. */
        if (wait)
            s->api->cuStreamSynchronize(r->stream->cu);
        return wait;
    }
    CUresult res = wait ? s->api->cuEventSynchronize(marker)
                        : s->api->cuEventQuery(marker);
    /* A failed wait means a failed device: no queued work runs any more. */
    return res == CUDA_SUCCESS || wait;
}

static void marker_put(void *self, void *marker)
{
    cuda_vm_range *r = self;
    cuda_event_put(r->stream->server, marker);
}

static void pages_unmap(void *self, uint64_t first, uint64_t count)
{
    cuda_vm_range *r = self;
    chunks_unmap(r->stream->server, r, first, count);
}

/* An event recorded on the owner stream now: after every use queued. */
static void *marker_record(void *self)
{
    cuda_stream *st = self;
    cuda_server *s = st->server;
    CUevent ev = NULL;
    cube_error *err = cuda_event_get(s, &ev);
    if (err) {
        cube_error_ignore(err, "without a marker the pages are unmapped "
                               "after a synchronize");
        return NULL;
    }
    if (s->api->cuEventRecord(ev, st->cu) != CUDA_SUCCESS) {
        cuda_event_put(s, ev);
        return NULL;
    }
    return ev;
}

/* Unmaps the stream's deferred pages whose event has completed (`wait`:
 * all of them, waiting), but pages [keep, keep + kept) of `kr` (about to
 * be taken back); events first for the pages noted during a capture.
 * Call with no capture running (cuda_free_begin) and the capture mode
 * relaxed. Returns the pages unmapped. */
static uint64_t stream_reap(cuda_stream *st, int wait, const cuda_vm_range *kr,
                            uint64_t keep, uint64_t kept)
{
    uint64_t n = 0;
    for (cuda_vm_range *r = st->vm_ranges; r; r = r->next) {
        if (!r->defer.batch_count)
            continue;
        vm_defer_mark(&r->defer, marker_record, st);
        vm_defer_ops o = {r, marker_done, marker_put, pages_unmap};
        n += vm_defer_reap(&r->defer, &o, wait, r == kr ? keep : 0,
                           r == kr ? kept : 0);
    }
    return n;
}

/* stream_reap behind the capture gate; 0 while a capture runs. */
static uint64_t stream_reap_gated(cuda_server *s, cuda_stream *st, int wait,
                                  const cuda_vm_range *kr, uint64_t keep,
                                  uint64_t kept)
{
    int any = 0;
    for (cuda_vm_range *r = st->vm_ranges; r && !any; r = r->next)
        any = r->defer.batch_count != 0;
    if (!any || !cuda_free_begin(s))
        return 0;
    int mode = CU_STREAM_CAPTURE_MODE_RELAXED;
    s->api->cuThreadExchangeStreamCaptureMode(&mode);
    uint64_t n = stream_reap(st, wait, kr, keep, kept);
    s->api->cuThreadExchangeStreamCaptureMode(&mode);
    cuda_free_end(s);
    return n;
}

/* Backs pages [first, first + n) of `r` with one allocation of their
 * size (a multiple of the granularity), mapped, its handle dropped, then
 * readable and writable by the devices of vm_access; notes the chunk. */
static CUresult chunk_map(cuda_server *s, cuda_vm_range *r, uint64_t first,
                          uint64_t n)
{
    const cuda_api *a = s->api;
    size_t size = (size_t)(n * s->vm_granularity);
    CUdeviceptr address = (CUdeviceptr)(r->base + first * s->vm_granularity);
    CUmemGenericAllocationHandle h = 0;
    CUresult res = a->cuMemCreate(&h, size, &s->vm_prop, 0);
    if (res != CUDA_SUCCESS)
        return res;
    res = a->cuMemMap(address, size, 0, h, 0);
    /* Mapped, the memory lives until the unmap; unmapped, it goes now. */
    a->cuMemRelease(h);
    if (res != CUDA_SUCCESS)
        return res;
    res = a->cuMemSetAccess(address, size, s->vm_access, s->vm_access_count);
    if (res != CUDA_SUCCESS) {
        a->cuMemUnmap(address, size);
        return res;
    }
    bits_set(r->mapped, first, n, 1);
    bits_set(r->heads, first, 1, 1);
    return CUDA_SUCCESS;
}

/* Whether a deferred chunk overlaps pages [first, first + n) without lying
 * wholly inside them (it cannot be taken back as it is). */
static int straddles(const cuda_vm_range *r, uint64_t first, uint64_t n,
                     uint64_t pages)
{
    uint64_t end = first + n;
    if (bit_get(r->mapped, first) && !bit_get(r->heads, first))
        return 1;
    return end < pages && bit_get(r->mapped, end) && !bit_get(r->heads, end) &&
           bit_get(r->mapped, end - 1);
}

/* --- the storage's virtual-memory functions --- */

cube_error *cuda_vm_reserve(void *self, uint64_t size, uint64_t align,
                            uint64_t *base)
{
    cuda_stream *st = self;
    cuda_server *s = st->server;
    cube_error *err = cuda_enter(s);
    if (err)
        return err;
    cuda_vm_range *r = calloc(1, sizeof *r);
    if (!r)
        return cube_error_new(CUBE_ERR_OUT_OF_MEMORY,
                              "no host memory for a reservation's record");
    size_t words = (size_t)((size / s->vm_granularity + 63u) / 64u);
    r->mapped = calloc(words ? 2 * words : 1, sizeof *r->mapped);
    if (!r->mapped) {
        free(r);
        return cube_error_new(CUBE_ERR_OUT_OF_MEMORY,
                              "no host memory for a reservation's map");
    }
    r->heads = r->mapped + words;
    err = vm_defer_init(&r->defer, size / s->vm_granularity);
    if (err) {
        free(r->mapped);
        free(r);
        return err;
    }
    int mode = CU_STREAM_CAPTURE_MODE_RELAXED;
    s->api->cuThreadExchangeStreamCaptureMode(&mode);
    CUdeviceptr p = 0;
    CUresult res =
        s->api->cuMemAddressReserve(&p, (size_t)size, (size_t)align, 0, 0);
    s->api->cuThreadExchangeStreamCaptureMode(&mode);
    if (res != CUDA_SUCCESS) {
        vm_defer_fini(&r->defer);
        free(r->mapped);
        free(r);
        return cuda_fail_alloc(s, res,
                               "cuMemAddressReserve of %llu bytes aligned to "
                               "%llu",
                               (ull)size, (ull)align);
    }
    r->base = p;
    r->size = size;
    r->stream = st;
    r->next = st->vm_ranges;
    st->vm_ranges = r;
    *base = p;
    return NULL;
}

cube_error *cuda_vm_map(void *self, uint64_t address, uint64_t size)
{
    cuda_stream *st = self;
    cuda_server *s = st->server;
    cube_error *err = cuda_enter(s);
    if (err)
        return err;
    cuda_vm_range *r = range_of(st, address);
    uint64_t g = s->vm_granularity;
    if (!r || size % g || address % g || size > r->size - (address - r->base))
        return cube_error_new(CUBE_ERR_INTERNAL,
                              "map of %llu bytes at 0x%llx: not whole pages "
                              "of a reservation of this stream",
                              (ull)size, (ull)address);
    uint64_t first = (address - r->base) / g, n = size / g;
    uint64_t pages = r->size / g;
    if (r->defer.count && straddles(r, first, n, pages))
        /* A deferred chunk reaches out of the range: it goes whole, after
         * its last uses, with every other deferred one. */
        stream_reap_gated(s, st, 1, NULL, 0, 0);
    if (straddles(r, first, n, pages))
        /* Still there: a capture runs (no wait may break it), or the pages
         * could not be noted at their unmap. Taking part of a mapping
         * back would leave the rest unmapped with it later. */
        return cube_error_new(CUBE_ERR_OUT_OF_MEMORY,
                              "mapping %llu bytes at 0x%llx: an earlier "
                              "mapping overlapping it is not unmapped yet "
                              "(a graph capture is running)",
                              (ull)size, (ull)address);
    /* What completed goes first, but the chunks this map takes back. */
    stream_reap_gated(s, st, 0, r, first, n);
    int mode = CU_STREAM_CAPTURE_MODE_RELAXED;
    s->api->cuThreadExchangeStreamCaptureMode(&mode);
    /* Chunks still mapped from a deferred unmap are taken back as they
     * are; each run of pages between them gets an allocation of its own
     * (a failure then leaves the taken-back ones as they were). */
    CUresult res = CUDA_SUCCESS;
    uint64_t i = first;
    int flushed = 0;
    while (i < first + n) {
        if (bit_get(r->mapped, i)) {
            i++;
            continue;
        }
        uint64_t j = i + 1;
        while (j < first + n && !bit_get(r->mapped, j))
            j++;
        res = chunk_map(s, r, i, j - i);
        if (res == CUDA_ERROR_OUT_OF_MEMORY && !flushed) {
            /* Deferred chunks hold memory the manager does not count:
             * wait for their last uses and unmap them. */
            flushed = 1;
            s->api->cuThreadExchangeStreamCaptureMode(&mode);
            uint64_t freed = stream_reap_gated(s, st, 1, r, first, n);
            s->api->cuThreadExchangeStreamCaptureMode(&mode);
            if (freed)
                continue;
        }
        if (res != CUDA_SUCCESS)
            break;
        i = j;
    }
    if (res != CUDA_SUCCESS) {
        /* The chunks mapped here are new: no work has used them. */
        for (uint64_t k = first; k < i; k++)
            if (bit_get(r->heads, k) && !vm_defer_is(&r->defer, k))
                chunk_unmap(s, r, k);
        s->api->cuThreadExchangeStreamCaptureMode(&mode);
        return cuda_fail_alloc(s, res,
                               "mapping %llu bytes at 0x%llx (page %llu of "
                               "the range)",
                               (ull)size, (ull)address, (ull)i);
    }
    s->api->cuThreadExchangeStreamCaptureMode(&mode);
    vm_defer_take(&r->defer, first, n);
    return NULL;
}

void cuda_vm_unmap(void *self, uint64_t address, uint64_t size)
{
    cuda_stream *st = self;
    cuda_server *s = st->server;
    cube_error_ignore(cuda_enter(s), "unmapping goes on without the context");
    cuda_vm_range *r = range_of(st, address);
    uint64_t g = s->vm_granularity;
    if (!r || size > r->size - (address - r->base))
        return;
    uint64_t first = (address - r->base) / g, n = size / g;
    if (!cuda_free_begin(s)) {
        cube_error *err = vm_defer_add(&r->defer, first, n, NULL);
        if (err) {
            /* No room to note them: they stay mapped, given back with
             * the range. */
            cube_log_write(CUBE_LOG_WARN, "memory",
                           "%s; %llu bytes at 0x%llx stay mapped until "
                           "their pool is released",
                           cube_error_message(err), (ull)size, (ull)address);
            cube_error_free(err);
        }
        return;
    }
    int mode = CU_STREAM_CAPTURE_MODE_RELAXED;
    s->api->cuThreadExchangeStreamCaptureMode(&mode);
    stream_reap(st, 0, NULL, 0, 0);
    /* Work queued before the blocks of these pages went back may still
     * run: the pages go once the owner stream has passed this point. */
    void *ev = marker_record(st);
    cube_error *err = ev ? vm_defer_add(&r->defer, first, n, ev) : NULL;
    if (!ev || err) {
        cube_error_ignore(err, "the pages cannot wait for the marker: they "
                               "are unmapped after a synchronize");
        if (ev)
            cuda_event_put(s, ev);
        s->api->cuStreamSynchronize(st->cu);
        chunks_unmap(s, r, first, n);
    }
    s->api->cuThreadExchangeStreamCaptureMode(&mode);
    cuda_free_end(s);
}

/* Unmaps what `r` still has deferred, once its last uses have run, and
 * gives its address space back; call as a running free
 * (cuda_free_begin). */
static void range_free(cuda_server *s, cuda_vm_range *r)
{
    int mode = CU_STREAM_CAPTURE_MODE_RELAXED;
    s->api->cuThreadExchangeStreamCaptureMode(&mode);
    if (r->defer.batch_count) {
        vm_defer_mark(&r->defer, marker_record, r->stream);
        vm_defer_ops o = {r, marker_done, marker_put, pages_unmap};
        vm_defer_reap(&r->defer, &o, 1, 0, 0);
    }
    if (r->defer.count) {
        /* Noted with no batch (no host memory then). */
        s->api->cuStreamSynchronize(r->stream->cu);
        for (uint64_t i = 0; i < r->defer.pages; i++)
            if (bit_get(r->heads, i) && vm_defer_is(&r->defer, i)) {
                uint64_t e = chunk_end(r, i, r->defer.pages);
                chunk_unmap(s, r, i);
                vm_defer_take(&r->defer, i, e - i);
            }
    }
    CUresult res = s->api->cuMemAddressFree((CUdeviceptr)r->base, r->size);
    s->api->cuThreadExchangeStreamCaptureMode(&mode);
    if (res != CUDA_SUCCESS)
        cube_log_write(CUBE_LOG_WARN, "memory",
                       "cuMemAddressFree of %llu bytes at 0x%llx: %s",
                       (ull)r->size, (ull)r->base,
                       cuda_result_text(s->api, res));
    vm_defer_fini(&r->defer);
    free(r->mapped);
    free(r);
}

void cuda_vm_release(void *self, uint64_t base, uint64_t size)
{
    cuda_stream *st = self;
    cuda_server *s = st->server;
    (void)size;
    cube_error_ignore(cuda_enter(s),
                      "releasing a reservation goes on without the context");
    cuda_vm_range **at = &st->vm_ranges;
    while (*at && (*at)->base != base)
        at = &(*at)->next;
    cuda_vm_range *r = *at;
    if (!r)
        return;
    *at = r->next;
    if (cuda_free_begin(s)) {
        range_free(s, r);
        cuda_free_end(s);
        return;
    }
    cube_mutex_lock(&s->deferred_lock);
    r->next = s->vm_later;
    s->vm_later = r;
    cube_mutex_unlock(&s->deferred_lock);
}

void cuda_vm_free_ranges(cuda_server *s, cuda_vm_range *list)
{
    while (list) {
        cuda_vm_range *next = list->next;
        range_free(s, list);
        list = next;
    }
}
