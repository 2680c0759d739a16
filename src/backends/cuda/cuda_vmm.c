/* Device virtual memory: the optional half of a stream's storage that
 * expandable pools are built on (cube_storage_ops in
 * cubert/backend/server.h states the contract).
 *
 * A reservation is cuMemAddressReserve'd address space. A map backs each
 * page (the driver's minimum granularity, 2 MiB on current GPUs) with a
 * physical allocation of its own (cuMemCreate, pinned on this device),
 * maps it (cuMemMap) and drops the handle at once (cuMemRelease): the
 * memory lives while it is mapped, and an unmap (cuMemUnmap) gives it
 * back. One allocation per page is what lets the manager unmap any run of
 * pages, part of what one map call mapped included: the driver unmaps
 * only whole mappings. Access is read/write for this device and for every
 * device that can reach its memory (cuDeviceCanAccessPeer; none when
 * cuda_peer_access is 0), granted at map: peer access enabled on a
 * context does not cover memory mapped this way.
 *
 * Unmapping never races queued work: the owner stream is synchronized
 * first, as a device free is (every other stream's use was ordered before
 * the owner's current point when the block went back to the manager, see
 * cuda_memory.c). A live graph's memory is never unmapped: a graph pins
 * every buffer it names, so its blocks stay live, and the manager unmaps
 * only pages no live block touches.
 *
 * Captures. Synchronizing, or an unmap (which may synchronize), could
 * break a capture running on another thread, so while one runs an unmap
 * only notes the pages (deferred): they stay mapped, out of the manager's
 * accounting, and a later map of them takes them back as they are. The
 * stream's next unmap or release with no capture running unmaps them (the
 * manager's cleanup and out-of-memory retry both unmap), and so does a map
 * the driver refuses for want of memory. A release while a capture runs
 * hands the whole range to the server (vm_later), freed when the last
 * capture ends (cuda_free_deferred) or at the first stream close.
 *
 * Locks: the manager calls the storage's virtual-memory functions under
 * its lock, so a stream's ranges need no lock of their own; deferred_lock
 * for the server's gate and vm_later, never held across a driver call.
 */
#include <stdlib.h>
#include <string.h>

#include "backends/cuda/cuda_internal.h"
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

static int bit_get(const uint64_t *bits, uint64_t i)
{
    return (int)((bits[i / 64u] >> (i % 64u)) & 1u);
}

static void bit_set(uint64_t *bits, uint64_t i, int on)
{
    if (on)
        bits[i / 64u] |= 1ull << (i % 64u);
    else
        bits[i / 64u] &= ~(1ull << (i % 64u));
}

static cuda_vm_range *range_of(cuda_stream *st, uint64_t address)
{
    for (cuda_vm_range *r = st->vm_ranges; r; r = r->next)
        if (address >= r->base && address - r->base < r->size)
            return r;
    return NULL;
}

/* Unmaps one page (its allocation goes with it); a refusal is logged
 * once per server: the memory stays with the driver. */
static void page_unmap(cuda_server *s, uint64_t address)
{
    CUresult r = s->api->cuMemUnmap((CUdeviceptr)address, s->vm_granularity);
    if (r != CUDA_SUCCESS && !atomic_exchange(&s->vm_unmap_warned, 1))
        cube_log_write(CUBE_LOG_WARN, "memory",
                       "cuMemUnmap of the page at 0x%llx: %s; its memory "
                       "stays with the driver",
                       (ull)address, cuda_result_text(s->api, r));
}

/* Unmaps the deferred pages of `r` but those of [keep, keep + kept) (the
 * owner stream synchronized). */
static uint64_t range_flush(cuda_server *s, cuda_vm_range *r, uint64_t keep,
                            uint64_t kept)
{
    uint64_t n = 0, pages = r->size / s->vm_granularity;
    for (uint64_t i = 0; i < pages && r->deferred_count > n; i++) {
        if (!bit_get(r->deferred, i) || (i >= keep && i - keep < kept))
            continue;
        page_unmap(s, r->base + i * s->vm_granularity);
        bit_set(r->deferred, i, 0);
        n++;
    }
    r->deferred_count -= n;
    return n;
}

/* The stream's deferred pages, unmapped now when no capture runs, but
 * pages [keep, keep + kept) of `kr` (about to be taken back); returns how
 * many. */
static uint64_t stream_flush(cuda_server *s, cuda_stream *st,
                             const cuda_vm_range *kr, uint64_t keep,
                             uint64_t kept)
{
    int any = 0;
    for (cuda_vm_range *r = st->vm_ranges; r && !any; r = r->next)
        any = r->deferred_count != 0;
    if (!any || !cuda_free_begin(s))
        return 0;
    int mode = CU_STREAM_CAPTURE_MODE_RELAXED;
    s->api->cuThreadExchangeStreamCaptureMode(&mode);
    s->api->cuStreamSynchronize(st->cu);
    uint64_t n = 0;
    for (cuda_vm_range *r = st->vm_ranges; r; r = r->next)
        n += range_flush(s, r, r == kr ? keep : 0, r == kr ? kept : 0);
    s->api->cuThreadExchangeStreamCaptureMode(&mode);
    cuda_free_end(s);
    return n;
}

/* Backs one page: its own allocation, mapped, its handle dropped, then
 * readable and writable by the devices of vm_access. */
static CUresult page_map(cuda_server *s, uint64_t address)
{
    const cuda_api *a = s->api;
    size_t g = s->vm_granularity;
    CUmemGenericAllocationHandle h = 0;
    CUresult r = a->cuMemCreate(&h, g, &s->vm_prop, 0);
    if (r != CUDA_SUCCESS)
        return r;
    r = a->cuMemMap((CUdeviceptr)address, g, 0, h, 0);
    /* Mapped, the memory lives until the unmap; unmapped, it goes now. */
    a->cuMemRelease(h);
    if (r != CUDA_SUCCESS)
        return r;
    r = a->cuMemSetAccess((CUdeviceptr)address, g, s->vm_access,
                          s->vm_access_count);
    if (r != CUDA_SUCCESS)
        a->cuMemUnmap((CUdeviceptr)address, g);
    return r;
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
    uint64_t pages = size / s->vm_granularity;
    cuda_vm_range *r = calloc(1, sizeof *r);
    uint64_t *bits =
        r ? calloc((size_t)((pages + 63u) / 64u), sizeof *bits) : NULL;
    if (!bits) {
        free(r);
        return cube_error_new(CUBE_ERR_OUT_OF_MEMORY,
                              "no host memory for a reservation's record");
    }
    int mode = CU_STREAM_CAPTURE_MODE_RELAXED;
    s->api->cuThreadExchangeStreamCaptureMode(&mode);
    CUdeviceptr p = 0;
    CUresult res =
        s->api->cuMemAddressReserve(&p, (size_t)size, (size_t)align, 0, 0);
    s->api->cuThreadExchangeStreamCaptureMode(&mode);
    if (res != CUDA_SUCCESS) {
        free(bits);
        free(r);
        return cuda_fail_alloc(s, res,
                               "cuMemAddressReserve of %llu bytes aligned to "
                               "%llu",
                               (ull)size, (ull)align);
    }
    r->base = p;
    r->size = size;
    r->deferred = bits;
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
    int mode = CU_STREAM_CAPTURE_MODE_RELAXED;
    s->api->cuThreadExchangeStreamCaptureMode(&mode);
    /* Pages still mapped from a deferred unmap are taken back as they
     * are, after the new ones are in (a failure then leaves them as they
     * were). */
    CUresult res = CUDA_SUCCESS;
    uint64_t i = 0;
    int flushed = 0;
    for (; i < n; i++) {
        if (bit_get(r->deferred, first + i))
            continue;
        res = page_map(s, address + i * g);
        if (res == CUDA_ERROR_OUT_OF_MEMORY && !flushed) {
            /* Deferred pages hold memory the manager does not count. */
            flushed = 1;
            s->api->cuThreadExchangeStreamCaptureMode(&mode);
            uint64_t freed = stream_flush(s, st, r, first, n);
            s->api->cuThreadExchangeStreamCaptureMode(&mode);
            if (freed) {
                i--;
                continue;
            }
        }
        if (res != CUDA_SUCCESS)
            break;
    }
    if (res != CUDA_SUCCESS) {
        /* The pages mapped here are new: no work has used them. */
        for (uint64_t k = 0; k < i; k++)
            if (!bit_get(r->deferred, first + k))
                s->api->cuMemUnmap((CUdeviceptr)(address + k * g), g);
        s->api->cuThreadExchangeStreamCaptureMode(&mode);
        return cuda_fail_alloc(s, res,
                               "mapping %llu bytes at 0x%llx (page %llu of "
                               "the range)",
                               (ull)size, (ull)address, (ull)(first + i));
    }
    s->api->cuThreadExchangeStreamCaptureMode(&mode);
    for (i = 0; i < n && r->deferred_count; i++)
        if (bit_get(r->deferred, first + i)) {
            bit_set(r->deferred, first + i, 0);
            r->deferred_count--;
        }
    return NULL;
}

void cuda_vm_unmap(void *self, uint64_t address, uint64_t size)
{
    cuda_stream *st = self;
    cuda_server *s = st->server;
    cube_error_free(cuda_enter(s));
    cuda_vm_range *r = range_of(st, address);
    uint64_t g = s->vm_granularity;
    if (!r || size > r->size - (address - r->base))
        return;
    uint64_t first = (address - r->base) / g, n = size / g;
    if (!cuda_free_begin(s)) {
        for (uint64_t i = 0; i < n; i++)
            if (!bit_get(r->deferred, first + i)) {
                bit_set(r->deferred, first + i, 1);
                r->deferred_count++;
            }
        return;
    }
    int mode = CU_STREAM_CAPTURE_MODE_RELAXED;
    s->api->cuThreadExchangeStreamCaptureMode(&mode);
    /* Work queued before the blocks of these pages went back may still
     * run. */
    s->api->cuStreamSynchronize(st->cu);
    for (cuda_vm_range *o = st->vm_ranges; o; o = o->next)
        range_flush(s, o, 0, 0);
    for (uint64_t i = 0; i < n; i++)
        page_unmap(s, address + i * g);
    s->api->cuThreadExchangeStreamCaptureMode(&mode);
    cuda_free_end(s);
}

/* Unmaps what `r` still has deferred and gives its address space back;
 * call as a running free (cuda_free_begin). */
static void range_free(cuda_server *s, cuda_vm_range *r)
{
    int mode = CU_STREAM_CAPTURE_MODE_RELAXED;
    s->api->cuThreadExchangeStreamCaptureMode(&mode);
    if (r->deferred_count) {
        s->api->cuStreamSynchronize(r->stream->cu);
        range_flush(s, r, 0, 0);
    }
    CUresult res = s->api->cuMemAddressFree((CUdeviceptr)r->base, r->size);
    s->api->cuThreadExchangeStreamCaptureMode(&mode);
    if (res != CUDA_SUCCESS)
        cube_log_write(CUBE_LOG_WARN, "memory",
                       "cuMemAddressFree of %llu bytes at 0x%llx: %s",
                       (ull)r->size, (ull)r->base,
                       cuda_result_text(s->api, res));
    free(r->deferred);
    free(r);
}

void cuda_vm_release(void *self, uint64_t base, uint64_t size)
{
    cuda_stream *st = self;
    cuda_server *s = st->server;
    (void)size;
    cube_error_free(cuda_enter(s));
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
