/* Transfers on CUDA: pinned staging through a pooled manager of its own,
 * pageable host memory moved through a pipeline of pinned chunks (packed
 * by several threads while the copy engine moves the previous chunk),
 * pitched 2-D copies for strided layouts, reads whose wait is on the
 * caller's side. */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "backends/cuda/cuda_internal.h"
#include "cubert/log.h"

/* Pageable transfers move in chunks of this size, at most CUDA_RING of
 * them in flight. */
#define CUDA_CHUNK ((uint64_t)8 << 20)
#define CUDA_RING 8
/* Pinned bytes a stream may have in flight from writes before a new one
 * waits for the oldest. */
#define CUDA_INFLIGHT_LIMIT ((uint64_t)64 << 20)
/* Below this, one thread copies (waking helpers costs more). */
#define CUDA_PARALLEL_MIN ((uint64_t)1 << 20)
#define CUDA_MAX_COPIERS 16

/* --- the copy helpers: memcpy of large chunks across a few threads --- */

struct cuda_copier {
    pthread_mutex_t busy; /* one parallel copy at a time */
    pthread_mutex_t lock;
    pthread_cond_t wake, done;
    pthread_t threads[CUDA_MAX_COPIERS];
    unsigned count;      /* helper threads */
    uint64_t generation; /* bumped per job */
    unsigned finished;   /* helpers done with the current job */
    int quit;
    unsigned char *dst;
    const unsigned char *src;
    uint64_t bytes;
};

static void part_of(const cuda_copier *c, unsigned who, uint64_t *off,
                    uint64_t *len)
{
    unsigned parts = c->count + 1;
    uint64_t each = (c->bytes / parts + 63) & ~(uint64_t)63;
    *off = (uint64_t)who * each;
    if (*off >= c->bytes) {
        *len = 0;
        return;
    }
    *len = c->bytes - *off < each ? c->bytes - *off : each;
}

static void *copier_main(void *arg)
{
    cuda_copier *c = arg;
    pthread_mutex_lock(&c->lock);
    unsigned who = c->finished++; /* 1..count, in start order */
    uint64_t seen = 0;
    for (;;) {
        while (!c->quit && c->generation == seen)
            pthread_cond_wait(&c->wake, &c->lock);
        if (c->quit)
            break;
        seen = c->generation;
        uint64_t off, len;
        part_of(c, who, &off, &len);
        unsigned char *dst = c->dst;
        const unsigned char *src = c->src;
        pthread_mutex_unlock(&c->lock);
        if (len)
            memcpy(dst + off, src + off, len);
        pthread_mutex_lock(&c->lock);
        if (++c->finished == c->count)
            pthread_cond_signal(&c->done);
    }
    pthread_mutex_unlock(&c->lock);
    return NULL;
}

static void copier_destroy(cuda_copier *c)
{
    if (!c)
        return;
    pthread_mutex_lock(&c->lock);
    c->quit = 1;
    pthread_cond_broadcast(&c->wake);
    pthread_mutex_unlock(&c->lock);
    for (unsigned i = 0; i < c->count; i++)
        pthread_join(c->threads[i], NULL);
    pthread_cond_destroy(&c->wake);
    pthread_cond_destroy(&c->done);
    pthread_mutex_destroy(&c->lock);
    pthread_mutex_destroy(&c->busy);
    free(c);
}

static cuda_copier *copier_create(void)
{
    cuda_copier *c = calloc(1, sizeof *c);
    if (!c)
        return NULL;
    pthread_mutex_init(&c->busy, NULL);
    pthread_mutex_init(&c->lock, NULL);
    pthread_cond_init(&c->wake, NULL);
    pthread_cond_init(&c->done, NULL);
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    /* Packing pageable memory is bound by memory bandwidth, which one
     * core cannot fill: use most of them (they sleep between copies). */
    unsigned want = cores > 2 ? (unsigned)(cores * 3 / 4) : 1;
    if (want > CUDA_MAX_COPIERS)
        want = CUDA_MAX_COPIERS;
    /* The caller copies a part too: want - 1 helpers. */
    pthread_mutex_lock(&c->lock);
    c->finished = 1;
    for (unsigned i = 0; i + 1 < want; i++) {
        if (pthread_create(&c->threads[i], NULL, copier_main, c) != 0)
            break;
        c->count++;
    }
    /* Helpers number themselves from c->finished; wait until all have. */
    pthread_mutex_unlock(&c->lock);
    for (;;) {
        pthread_mutex_lock(&c->lock);
        unsigned started = c->finished - 1;
        pthread_mutex_unlock(&c->lock);
        if (started >= c->count)
            break;
        sched_yield();
    }
    return c;
}

/* memcpy, spread over the helpers when large and when they are free. */
static void copy_bytes(cuda_copier *c, void *dst, const void *src,
                       uint64_t bytes)
{
    if (!c || c->count == 0 || bytes < CUDA_PARALLEL_MIN ||
        pthread_mutex_trylock(&c->busy) != 0) {
        memcpy(dst, src, bytes);
        return;
    }
    pthread_mutex_lock(&c->lock);
    c->dst = dst;
    c->src = src;
    c->bytes = bytes;
    c->finished = 0;
    c->generation++;
    pthread_cond_broadcast(&c->wake);
    pthread_mutex_unlock(&c->lock);
    uint64_t off, len;
    part_of(c, 0, &off, &len);
    if (len)
        memcpy((unsigned char *)dst + off, (const unsigned char *)src + off,
               len);
    pthread_mutex_lock(&c->lock);
    while (c->finished < c->count)
        pthread_cond_wait(&c->done, &c->lock);
    pthread_mutex_unlock(&c->lock);
    pthread_mutex_unlock(&c->busy);
}

/* --- pinned memory --- */

static cube_error *pinned_alloc(void *self, uint64_t size, uint64_t align,
                                uint64_t *address)
{
    cuda_server *s = self;
    (void)align; /* page-aligned */
    cube_error *err = cuda_enter(s);
    if (err)
        return err;
    void *p = NULL;
    int mode = CU_STREAM_CAPTURE_MODE_RELAXED;
    s->api->cuThreadExchangeStreamCaptureMode(&mode);
    CUresult r =
        s->api->cuMemHostAlloc(&p, (size_t)size, CU_MEMHOSTALLOC_PORTABLE);
    s->api->cuThreadExchangeStreamCaptureMode(&mode);
    if (r != CUDA_SUCCESS)
        return cuda_fail(s, r, CUBE_ERR_OUT_OF_MEMORY,
                         "cuMemHostAlloc of %llu bytes",
                         (unsigned long long)size);
    *address = (uint64_t)(uintptr_t)p;
    return NULL;
}

static void pinned_free(void *self, uint64_t address, uint64_t size)
{
    (void)size;
    cuda_free_later(self, NULL, address);
}

cube_error *cuda_pinned_create(cuda_server *s)
{
    long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
    mem_device dev = {4096, (pages > 0 && page > 0)
                                ? (uint64_t)pages * (uint64_t)page
                                : (uint64_t)1 << 34};
    mem_storage_ops ops = {s, pinned_alloc, pinned_free};
    cube_error *err = mem_manager_create(&ops, &dev, NULL, &s->pinned);
    if (err)
        return err;
    s->copier = copier_create();
    if (!s->copier)
        return cube_error_new(CUBE_ERR_OUT_OF_MEMORY, "copy helpers");
    return NULL;
}

void cuda_pinned_destroy(cuda_server *s)
{
    copier_destroy(s->copier);
    s->copier = NULL;
    free(s->staging);
    s->staging = NULL;
    if (s->pinned)
        mem_manager_destroy(s->pinned);
    s->pinned = NULL;
}

/* Whether [p, p + bytes) lies inside a buffer handed out by cube_staging. */
static int is_pinned(cuda_server *s, const void *p, uint64_t bytes)
{
    uint64_t a = (uint64_t)(uintptr_t)p;
    int found = 0;
    pthread_mutex_lock(&s->staging_lock);
    for (size_t i = 0; i < s->staging_count && !found; i++) {
        const cube_storage *st = &s->staging[i];
        found = a >= st->address && a - st->address <= st->size &&
                bytes <= st->size - (a - st->address);
    }
    pthread_mutex_unlock(&s->staging_lock);
    return found;
}

/* --- events --- */

static cube_error *event_get(cuda_server *s, CUevent *out)
{
    pthread_mutex_lock(&s->events_lock);
    if (s->free_event_count) {
        *out = s->free_events[--s->free_event_count];
        pthread_mutex_unlock(&s->events_lock);
        return NULL;
    }
    pthread_mutex_unlock(&s->events_lock);
    CUresult r = s->api->cuEventCreate(out, CU_EVENT_DEFAULT);
    return r ? cuda_fail(s, r, CUBE_ERR_INTERNAL, "cuEventCreate") : NULL;
}

static void event_put(cuda_server *s, CUevent ev)
{
    pthread_mutex_lock(&s->events_lock);
    if (s->free_event_count == s->free_event_cap) {
        size_t cap = s->free_event_cap ? s->free_event_cap * 2 : 32;
        CUevent *grown = realloc(s->free_events, cap * sizeof *grown);
        if (!grown) {
            pthread_mutex_unlock(&s->events_lock);
            s->api->cuEventDestroy(ev);
            return;
        }
        s->free_events = grown;
        s->free_event_cap = cap;
    }
    s->free_events[s->free_event_count++] = ev;
    pthread_mutex_unlock(&s->events_lock);
}

cube_error *cuda_event_get(cuda_server *s, CUevent *out)
{
    return event_get(s, out);
}

void cuda_event_put(cuda_server *s, CUevent ev)
{
    event_put(s, ev);
}

void cuda_events_destroy(cuda_server *s)
{
    for (size_t i = 0; i < s->free_event_count; i++)
        s->api->cuEventDestroy(s->free_events[i]);
    free(s->free_events);
    s->free_events = NULL;
    s->free_event_count = s->free_event_cap = 0;
}

/* --- pinned blocks in flight --- */

cube_error *cuda_inflight_reap(cuda_server *s, cuda_stream *st, int all)
{
    cube_error *err = NULL;
    while (st->inflight_count) {
        cuda_inflight *f = &st->inflight[st->inflight_head];
        CUresult r = all ? s->api->cuEventSynchronize(f->event)
                         : s->api->cuEventQuery(f->event);
        if (r == CUDA_ERROR_NOT_READY)
            break;
        if (r != CUDA_SUCCESS && !err)
            err = cuda_fail(s, r, CUBE_ERR_INTERNAL, "a transfer");
        mem_free(s->pinned, &f->pinned);
        event_put(s, f->event);
        st->inflight_bytes -= f->pinned.size;
        st->inflight_head = (st->inflight_head + 1) % st->inflight_cap;
        st->inflight_count--;
    }
    return err;
}

/* Hands `pinned` to the stream until the work enqueued so far is done. */
static cube_error *inflight_push(cuda_server *s, cuda_stream *st,
                                 cube_storage *pinned)
{
    CUevent ev = NULL;
    cube_error *err = event_get(s, &ev);
    CUresult r = err ? CUDA_SUCCESS : s->api->cuEventRecord(ev, st->cu);
    if (!err && r != CUDA_SUCCESS) {
        err = cuda_fail(s, r, CUBE_ERR_INTERNAL, "cuEventRecord");
        event_put(s, ev);
    }
    if (!err && st->inflight_count == st->inflight_cap) {
        size_t cap = st->inflight_cap ? st->inflight_cap * 2 : 16;
        cuda_inflight *grown = malloc(cap * sizeof *grown);
        if (!grown) {
            err = cube_error_new(CUBE_ERR_OUT_OF_MEMORY, "transfer");
            event_put(s, ev);
        } else {
            for (size_t i = 0; i < st->inflight_count; i++)
                grown[i] =
                    st->inflight[(st->inflight_head + i) % st->inflight_cap];
            free(st->inflight);
            st->inflight = grown;
            st->inflight_head = 0;
            st->inflight_cap = cap;
        }
    }
    if (err) {
        /* Cannot track it: wait for the copy, then give it back. */
        s->api->cuStreamSynchronize(st->cu);
        mem_free(s->pinned, pinned);
        return err;
    }
    cuda_inflight *f = &st->inflight[(st->inflight_head + st->inflight_count) %
                                     st->inflight_cap];
    f->pinned = *pinned;
    f->event = ev;
    st->inflight_count++;
    st->inflight_bytes += pinned->size;
    return NULL;
}

/* A pinned block of `bytes` for a write on `st`, after giving back what
 * finished and, past the limit, waiting for the oldest. */
static cube_error *stage(cuda_server *s, cuda_stream *st, uint64_t bytes,
                         cube_storage *out)
{
    cube_error *err = cuda_inflight_reap(s, st, 0);
    while (!err && st->inflight_count &&
           st->inflight_bytes + bytes > CUDA_INFLIGHT_LIMIT) {
        cuda_inflight *f = &st->inflight[st->inflight_head];
        CUresult r = s->api->cuEventSynchronize(f->event);
        if (r != CUDA_SUCCESS)
            err = cuda_fail(s, r, CUBE_ERR_INTERNAL, "a transfer");
        else
            err = cuda_inflight_reap(s, st, 0);
    }
    return err ? err : mem_alloc(s->pinned, bytes, out);
}

/* --- strided copies --- */

/* Enqueues the copy between packed host memory `host` (pinned) and op's
 * binding: one copy when contiguous, else pitched 2-D copies (one per
 * plane of the outer dimensions). */
static cube_error *enqueue_op(cuda_server *s, cuda_stream *st,
                              const cube_copy_op *op, unsigned char *host,
                              int to_host)
{
    const cuda_api *a = s->api;
    CUdeviceptr dev = op->binding.storage->address + op->binding.offset;
    CUresult r;
    if (op->contiguous) {
        r = to_host ? a->cuMemcpyDtoHAsync(host, dev, op->bytes, st->cu)
                    : a->cuMemcpyHtoDAsync(dev, host, op->bytes, st->cu);
        return r ? cuda_fail(s, r, CUBE_ERR_INTERNAL, "copy of %llu bytes",
                             (unsigned long long)op->bytes)
                 : NULL;
    }
    uint32_t last = op->rank - 1;
    uint64_t es = op->elem_size;
    uint64_t width, height, pitch;
    uint32_t outer;
    if (op->byte_strides[last] == es) {
        width = op->shape[last] * es;
        height = last ? op->shape[last - 1] : 1;
        pitch = last ? op->byte_strides[last - 1] : width;
        outer = last ? last - 1 : 0;
    } else {
        width = es;
        height = op->shape[last];
        pitch = op->byte_strides[last];
        outer = last;
    }
    uint64_t idx[CUBE_MAX_RANK] = {0};
    for (;;) {
        uint64_t base = 0;
        for (uint32_t k = 0; k < outer; k++)
            base += idx[k] * op->byte_strides[k];
        if (pitch >= width) {
            cuda_memcpy2d m;
            memset(&m, 0, sizeof m);
            m.WidthInBytes = width;
            m.Height = height;
            if (to_host) {
                m.srcMemoryType = CU_MEMORYTYPE_DEVICE;
                m.srcDevice = dev + base;
                m.srcPitch = pitch;
                m.dstMemoryType = CU_MEMORYTYPE_HOST;
                m.dstHost = host;
                m.dstPitch = width;
            } else {
                m.srcMemoryType = CU_MEMORYTYPE_HOST;
                m.srcHost = host;
                m.srcPitch = width;
                m.dstMemoryType = CU_MEMORYTYPE_DEVICE;
                m.dstDevice = dev + base;
                m.dstPitch = pitch;
            }
            r = a->cuMemcpy2DAsync(&m, st->cu);
        } else {
            /* Rows that overlap: one copy per row. */
            r = CUDA_SUCCESS;
            for (uint64_t y = 0; y < height && r == CUDA_SUCCESS; y++)
                r = to_host
                        ? a->cuMemcpyDtoHAsync(host + y * width,
                                               dev + base + y * pitch, width,
                                               st->cu)
                        : a->cuMemcpyHtoDAsync(dev + base + y * pitch,
                                               host + y * width, width, st->cu);
        }
        if (r != CUDA_SUCCESS)
            return cuda_fail(s, r, CUBE_ERR_INTERNAL, "strided copy");
        host += width * height;
        int k = (int)outer - 1;
        while (k >= 0 && ++idx[k] == op->shape[k])
            idx[k--] = 0;
        if (k < 0)
            return NULL;
    }
}

/* --- writes --- */

/* A large contiguous write from pageable memory: chunks packed by the
 * copy helpers while the copy engine moves the previous ones. */
static cube_error *write_pipelined(cuda_server *s, cuda_stream *st,
                                   const cube_copy_op *op,
                                   const unsigned char *src)
{
    CUdeviceptr dev = op->binding.storage->address + op->binding.offset;
    cube_error *err = NULL;
    for (uint64_t off = 0; off < op->bytes && !err; off += CUDA_CHUNK) {
        uint64_t n =
            op->bytes - off < CUDA_CHUNK ? op->bytes - off : CUDA_CHUNK;
        cube_storage pin;
        err = stage(s, st, n, &pin);
        if (err)
            break;
        copy_bytes(s->copier, (void *)(uintptr_t)pin.address, src + off, n);
        CUresult r = s->api->cuMemcpyHtoDAsync(
            dev + off, (void *)(uintptr_t)pin.address, n, st->cu);
        if (r != CUDA_SUCCESS) {
            mem_free(s->pinned, &pin);
            return cuda_fail(s, r, CUBE_ERR_INTERNAL, "cuMemcpyHtoDAsync");
        }
        err = inflight_push(s, st, &pin);
    }
    return err;
}

cube_error *cuda_write(cube_server *server, cube_server_stream *stream,
                       const cube_copy_op *ops, size_t n,
                       const void *const *src)
{
    cuda_server *s = (cuda_server *)server;
    cuda_stream *st = NULL;
    cube_error *err = cuda_stream_begin(s, stream, &st);
    int wait_direct = 0;
    for (size_t i = 0; i < n && !err; i++) {
        const cube_copy_op *op = &ops[i];
        cuda_block *blk = op->binding.storage->cookie;
        err = cuda_block_before_use(s, st, blk, 1);
        if (err)
            break;
        const unsigned char *from = src[i];
        if (is_pinned(s, from, op->bytes)) {
            /* Straight from the caller's pinned buffer; the caller may
             * reuse it when we return, so we wait below. */
            err = enqueue_op(s, st, op, (unsigned char *)(uintptr_t)from, 0);
            wait_direct = 1;
        } else if (op->contiguous && op->bytes > CUDA_CHUNK) {
            err = write_pipelined(s, st, op, from);
        } else {
            cube_storage pin;
            err = stage(s, st, op->bytes, &pin);
            if (!err) {
                copy_bytes(s->copier, (void *)(uintptr_t)pin.address, from,
                           op->bytes);
                err = enqueue_op(s, st, op,
                                 (unsigned char *)(uintptr_t)pin.address, 0);
                if (err)
                    mem_free(s->pinned, &pin);
                else
                    err = inflight_push(s, st, &pin);
            }
        }
        if (!err) {
            uint64_t seq = cuda_stream_next(st);
            if (cuda_block_used(st, blk, seq, 1))
                err = cuda_stream_record(s, st);
        }
    }
    if (!err && wait_direct) {
        CUresult r = s->api->cuEventRecord(st->done, st->cu);
        if (r == CUDA_SUCCESS)
            r = s->api->cuEventSynchronize(st->done);
        if (r != CUDA_SUCCESS)
            err = cuda_fail(s, r, CUBE_ERR_INTERNAL, "write");
    }
    return err;
}

/* --- reads --- */

typedef struct read_item {
    void *dst;
    cube_storage pinned; /* address 0: copied straight into dst */
    uint64_t bytes;
} read_item;

struct cube_pending {
    cuda_server *server;
    cuda_stream *stream;
    CUevent event; /* NULL while it is the stream's open read */
    size_t count;
    read_item items[];
};

/* A large contiguous read into pageable memory, done before returning:
 * the copy engine fills a ring of pinned chunks while the helpers empty
 * the previous ones. */
static cube_error *read_pipelined(cuda_server *s, cuda_stream *st,
                                  const cube_copy_op *op, unsigned char *dst)
{
    const cuda_api *a = s->api;
    CUdeviceptr dev = op->binding.storage->address + op->binding.offset;
    uint64_t chunks = (op->bytes + CUDA_CHUNK - 1) / CUDA_CHUNK;
    cube_storage ring[CUDA_RING];
    CUevent ev[CUDA_RING];
    memset(ring, 0, sizeof ring);
    memset(ev, 0, sizeof ev);
    uint64_t slots = chunks < CUDA_RING ? chunks : CUDA_RING;
    /* (cppcheck takes chunks for 0 in this function; the caller sends
     * only reads of more than two chunks.) */
    cube_error *err = NULL;
    // cppcheck-suppress knownConditionTrueFalse
    for (uint64_t i = 0; i < slots && !err; i++) {
        err = mem_alloc(s->pinned, CUDA_CHUNK, &ring[i]);
        if (!err)
            err = event_get(s, &ev[i]);
    }
    CUresult r = CUDA_SUCCESS;
    /* Enqueue chunk c into slot c % slots. */
    uint64_t next = 0, done = 0;
    while (!err && done < chunks) {
        // cppcheck-suppress knownConditionTrueFalse
        while (next < chunks && next - done < slots) {
            uint64_t k = next % slots, off = next * CUDA_CHUNK;
            uint64_t len =
                op->bytes - off < CUDA_CHUNK ? op->bytes - off : CUDA_CHUNK;
            r = a->cuMemcpyDtoHAsync((void *)(uintptr_t)ring[k].address,
                                     dev + off, len, st->cu);
            if (r == CUDA_SUCCESS)
                r = a->cuEventRecord(ev[k], st->cu);
            if (r != CUDA_SUCCESS)
                break;
            next++;
        }
        if (r != CUDA_SUCCESS)
            break;
        uint64_t k = done % slots, off = done * CUDA_CHUNK;
        uint64_t len =
            op->bytes - off < CUDA_CHUNK ? op->bytes - off : CUDA_CHUNK;
        r = a->cuEventSynchronize(ev[k]);
        if (r != CUDA_SUCCESS)
            break;
        copy_bytes(s->copier, dst + off, (void *)(uintptr_t)ring[k].address,
                   len);
        done++;
    }
    if (!err && r != CUDA_SUCCESS)
        err = cuda_fail(s, r, CUBE_ERR_INTERNAL, "read of %llu bytes",
                        (unsigned long long)op->bytes);
    if (err)
        a->cuStreamSynchronize(st->cu); /* nothing may still write the ring */
    for (uint64_t i = 0; i < slots; i++) {
        if (ring[i].address)
            mem_free(s->pinned, &ring[i]);
        if (ev[i])
            event_put(s, ev[i]);
    }
    return err;
}

static void pending_free(cuda_server *s, cube_pending *p)
{
    for (size_t i = 0; i < p->count; i++)
        if (p->items[i].pinned.address)
            mem_free(s->pinned, &p->items[i].pinned);
    if (p->event)
        event_put(s, p->event);
    free(p);
}

cube_error *cuda_read(cube_server *server, cube_server_stream *stream,
                      const cube_copy_op *ops, size_t n, void *const *dst,
                      cube_pending **pending)
{
    cuda_server *s = (cuda_server *)server;
    *pending = NULL;
    cuda_stream *st = NULL;
    cube_error *err = cuda_stream_begin(s, stream, &st);
    if (err)
        return err;
    cube_pending *p = calloc(1, sizeof *p + n * sizeof(read_item));
    if (!p)
        return cube_error_new(CUBE_ERR_OUT_OF_MEMORY, "read");
    p->server = s;
    size_t queued = 0;
    int shared = 0;
    for (size_t i = 0; i < n && !err; i++) {
        const cube_copy_op *op = &ops[i];
        cuda_block *blk = op->binding.storage->cookie;
        err = cuda_block_before_use(s, st, blk, 0);
        if (err)
            break;
        read_item *it = &p->items[p->count++];
        it->dst = dst[i];
        it->bytes = op->bytes;
        if (is_pinned(s, dst[i], op->bytes)) {
            err = enqueue_op(s, st, op, dst[i], 1);
            queued++;
        } else if (op->contiguous && op->bytes > 2 * CUDA_CHUNK) {
            p->count--; /* done here, nothing left for the wait */
            err = read_pipelined(s, st, op, dst[i]);
        } else {
            err = mem_alloc(s->pinned, op->bytes, &it->pinned);
            if (!err)
                err = enqueue_op(s, st, op,
                                 (unsigned char *)(uintptr_t)it->pinned.address,
                                 1);
            queued++;
        }
        if (!err)
            shared |= cuda_block_used(st, blk, cuda_stream_next(st), 0);
    }
    if (!err && shared)
        err = cuda_stream_record(s, st); /* writers elsewhere wait for it */
    if (!err && queued) {
        /* No event yet: see cuda_stream.open_read. */
        p->stream = st;
        pthread_mutex_lock(&st->lock);
        atomic_store(&st->open_read, p);
        pthread_mutex_unlock(&st->lock);
    }
    if (err) {
        if (queued)
            s->api->cuStreamSynchronize(st->cu);
        pending_free(s, p);
        return err;
    }
    if (!queued) {
        pending_free(s, p);
        return NULL;
    }
    *pending = p;
    return NULL;
}

cube_error *cuda_stream_seal_slow(cuda_server *s, cuda_stream *st)
{
    CUresult r = CUDA_SUCCESS;
    cube_error *err = NULL;
    pthread_mutex_lock(&st->lock);
    cube_pending *p = atomic_load(&st->open_read);
    if (p) {
        err = event_get(s, &p->event);
        if (!err) {
            r = s->api->cuEventRecord(p->event, st->cu);
            if (r != CUDA_SUCCESS) {
                event_put(s, p->event);
                p->event = NULL; /* its wait synchronizes the stream */
            }
        }
        atomic_store(&st->open_read, NULL);
    }
    pthread_mutex_unlock(&st->lock);
    if (!err && r != CUDA_SUCCESS)
        err = cuda_fail(s, r, CUBE_ERR_INTERNAL, "cuEventRecord");
    return err;
}

cube_error *cuda_read_wait(cube_server *server, cube_pending *p)
{
    cuda_server *s = (cuda_server *)server;
    cube_error *err = cuda_enter(s);
    cuda_stream *st = p->stream;
    pthread_mutex_lock(&st->lock);
    if (atomic_load(&st->open_read) == p)
        atomic_store(&st->open_read, NULL);
    CUevent ev = p->event;
    pthread_mutex_unlock(&st->lock);
    /* Nothing was enqueued after the read (else it has an event): the
     * stream's end is the read's end. */
    CUresult r = err  ? CUDA_SUCCESS
                 : ev ? s->api->cuEventSynchronize(ev)
                      : s->api->cuStreamSynchronize(st->cu);
    if (!err && r != CUDA_SUCCESS)
        err = cuda_fail(s, r, CUBE_ERR_INTERNAL, "read");
    for (size_t i = 0; i < p->count && !err; i++)
        if (p->items[i].pinned.address)
            copy_bytes(s->copier, p->items[i].dst,
                       (void *)(uintptr_t)p->items[i].pinned.address,
                       p->items[i].bytes);
    pending_free(s, p);
    return err;
}

/* --- staging --- */

cube_error *cuda_staging(cube_server *server, const uint64_t *sizes, size_t n,
                         void **out)
{
    cuda_server *s = (cuda_server *)server;
    cube_error *err = NULL;
    size_t made = 0;
    for (; made < n && !err; made++) {
        cube_storage b;
        err = mem_alloc(s->pinned, sizes[made], &b);
        if (err)
            break;
        pthread_mutex_lock(&s->staging_lock);
        if (s->staging_count == s->staging_cap) {
            size_t cap = s->staging_cap ? s->staging_cap * 2 : 16;
            cube_storage *grown = realloc(s->staging, cap * sizeof *grown);
            if (!grown) {
                pthread_mutex_unlock(&s->staging_lock);
                mem_free(s->pinned, &b);
                err = cube_error_new(CUBE_ERR_OUT_OF_MEMORY, "staging");
                break;
            }
            s->staging = grown;
            s->staging_cap = cap;
        }
        s->staging[s->staging_count++] = b;
        pthread_mutex_unlock(&s->staging_lock);
        out[made] = (void *)(uintptr_t)b.address;
    }
    if (err) {
        for (size_t i = 0; i < made; i++) {
            cuda_staging_free(server, out[i]);
            out[i] = NULL;
        }
    }
    return err;
}

void cuda_staging_free(cube_server *server, void *buffer)
{
    cuda_server *s = (cuda_server *)server;
    uint64_t a = (uint64_t)(uintptr_t)buffer;
    pthread_mutex_lock(&s->staging_lock);
    for (size_t i = 0; i < s->staging_count; i++) {
        if (s->staging[i].address == a) {
            cube_storage b = s->staging[i];
            s->staging[i] = s->staging[--s->staging_count];
            pthread_mutex_unlock(&s->staging_lock);
            mem_free(s->pinned, &b);
            return;
        }
    }
    pthread_mutex_unlock(&s->staging_lock);
}
