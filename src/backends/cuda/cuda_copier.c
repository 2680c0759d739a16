/* The copy helpers: a few threads that share a large memcpy with the
 * caller, to pack pageable host memory into pinned chunks and to unpack
 * it (one core cannot fill the memory bandwidth).
 *
 * Locks (docs/threading.md): busy (one parallel copy), then lock (the
 * helpers' job).
 */
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "backends/cuda/cuda_internal.h"

/* Below this, one thread copies (waking helpers costs more). */
#define CUDA_PARALLEL_MIN ((uint64_t)1 << 20)
#define CUDA_MAX_COPIERS 16

struct cuda_copier {
    cube_mutex busy; /* one parallel copy at a time */
    cube_mutex lock;
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
    cube_mutex_lock(&c->lock);
    unsigned who = c->finished++; /* 1..count, in start order */
    uint64_t seen = 0;
    for (;;) {
        while (!c->quit && c->generation == seen)
            cube_cond_wait(&c->wake, &c->lock);
        if (c->quit)
            break;
        seen = c->generation;
        uint64_t off, len;
        part_of(c, who, &off, &len);
        unsigned char *dst = c->dst;
        const unsigned char *src = c->src;
        cube_mutex_unlock(&c->lock);
        if (len)
            memcpy(dst + off, src + off, len);
        cube_mutex_lock(&c->lock);
        if (++c->finished == c->count)
            pthread_cond_signal(&c->done);
    }
    cube_mutex_unlock(&c->lock);
    return NULL;
}

void cuda_copier_destroy(cuda_copier *c)
{
    if (!c)
        return;
    cube_mutex_lock(&c->lock);
    c->quit = 1;
    pthread_cond_broadcast(&c->wake);
    cube_mutex_unlock(&c->lock);
    for (unsigned i = 0; i < c->count; i++)
        pthread_join(c->threads[i], NULL);
    pthread_cond_destroy(&c->wake);
    pthread_cond_destroy(&c->done);
    cube_mutex_destroy(&c->lock);
    cube_mutex_destroy(&c->busy);
    free(c);
}

cuda_copier *cuda_copier_create(void)
{
    cuda_copier *c = calloc(1, sizeof *c);
    if (!c)
        return NULL;
    cube_mutex_init(&c->busy);
    cube_mutex_init(&c->lock);
    pthread_cond_init(&c->wake, NULL);
    pthread_cond_init(&c->done, NULL);
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    /* Packing pageable memory is bound by memory bandwidth, which one
     * core cannot fill: use most of them (they sleep between copies). */
    unsigned want = cores > 2 ? (unsigned)(cores * 3 / 4) : 1;
    if (want > CUDA_MAX_COPIERS)
        want = CUDA_MAX_COPIERS;
    /* The caller copies a part too: want - 1 helpers. */
    cube_mutex_lock(&c->lock);
    c->finished = 1;
    for (unsigned i = 0; i + 1 < want; i++) {
        if (pthread_create(&c->threads[i], NULL, copier_main, c) != 0)
            break;
        c->count++;
    }
    /* Helpers number themselves from c->finished; wait until all have. */
    cube_mutex_unlock(&c->lock);
    for (;;) {
        cube_mutex_lock(&c->lock);
        unsigned started = c->finished - 1;
        cube_mutex_unlock(&c->lock);
        if (started >= c->count)
            break;
        sched_yield();
    }
    return c;
}

/* memcpy, spread over the helpers when large and when they are free. */
void cuda_copy_bytes(cuda_copier *c, void *dst, const void *src, uint64_t bytes)
{
    if (!c || c->count == 0 || bytes < CUDA_PARALLEL_MIN) {
        memcpy(dst, src, bytes);
        return;
    }
    /* Another thread's copy has the helpers: copy alone. */
    if (!cube_mutex_trylock(&c->busy)) {
        memcpy(dst, src, bytes);
        return;
    }
    cube_mutex_lock(&c->lock);
    c->dst = dst;
    c->src = src;
    c->bytes = bytes;
    c->finished = 0;
    c->generation++;
    pthread_cond_broadcast(&c->wake);
    cube_mutex_unlock(&c->lock);
    uint64_t off, len;
    part_of(c, 0, &off, &len);
    if (len)
        memcpy((unsigned char *)dst + off, (const unsigned char *)src + off,
               len);
    cube_mutex_lock(&c->lock);
    while (c->finished < c->count)
        cube_cond_wait(&c->done, &c->lock);
    cube_mutex_unlock(&c->lock);
    cube_mutex_unlock(&c->busy);
}
