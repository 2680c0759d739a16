/* Worker pool (see cpu_workers.h). Jobs sit in a list; idle workers spin
 * briefly on an epoch counter (a launch right after another should not pay
 * a futex wake), then sleep on a condition variable. */
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <time.h>

#include "base/error.h"
#include "base/mutex.h"
#include "backends/cpu/cpu_workers.h"
#include "cubert/backend/errors.h"

typedef struct cpu_job {
    cpu_range_fn fn;
    void *ctx;
    uint32_t total, chunk;
    atomic_uint next; /* first cube not yet claimed */
    atomic_uint done; /* cubes finished */
    uint32_t helpers; /* workers inside the job, under the pool lock */
    _Atomic(cube_error *) error;
    struct cpu_job *next_job;
} cpu_job;

struct cpu_workers {
    pthread_t *threads;
    uint32_t count; /* worker threads (the caller not counted) */
    cube_mutex lock;
    pthread_cond_t work_cv;
    pthread_cond_t done_cv;
    cpu_job *jobs CUBE_GUARDED_FIELD(lock);
    atomic_uint_fast64_t epoch;
    int stop CUBE_GUARDED_FIELD(lock);
};

static pthread_key_t local_key;
static pthread_once_t local_once = PTHREAD_ONCE_INIT;

static void local_free(void *p)
{
    cpu_thread_local *l = p;
    free(l->shared);
    cpu_fibers_destroy(l->fibers);
    free(l);
}

static void local_key_init(void)
{
    pthread_key_create(&local_key, local_free);
}

cpu_thread_local *cpu_thread_local_get(void)
{
    /* The key owns the scratch (its destructor frees it at thread exit);
     * this pointer only saves the lookup on every launch. */
    static _Thread_local cpu_thread_local *cached;
    if (cached)
        return cached;
    pthread_once(&local_once, local_key_init);
    cpu_thread_local *l = pthread_getspecific(local_key);
    if (!l) {
        l = calloc(1, sizeof *l);
        if (l && pthread_setspecific(local_key, l) != 0) {
            free(l);
            l = NULL;
        }
    }
    cached = l;
    return l;
}

/* Claims and runs chunks until none are left. */
static void work_on(cpu_job *j, cpu_thread_local *local)
{
    for (;;) {
        uint32_t begin = atomic_fetch_add(&j->next, j->chunk);
        if (begin >= j->total)
            return;
        uint32_t end =
            j->total - begin < j->chunk ? j->total : begin + j->chunk;
        cube_error *err = local ? j->fn(j->ctx, begin, end, local)
                                : cube_error_new(CUBE_ERR_OUT_OF_MEMORY,
                                                 "worker scratch memory");
        if (err) {
            cube_error *expected = NULL;
            if (!atomic_compare_exchange_strong(&j->error, &expected, err))
                cube_error_ignore(err, "another part of the job failed "
                                       "first: the job reports that one");
        }
        atomic_fetch_add(&j->done, end - begin);
    }
}

static cpu_job *find_job_locked(cpu_workers *w)
{
    for (cpu_job *j = w->jobs; j; j = j->next_job)
        if (atomic_load(&j->next) < j->total)
            return j;
    return NULL;
}

static void *worker_main(void *arg)
{
    cpu_workers *w = arg;
    cpu_thread_local *local = cpu_thread_local_get();
    cube_mutex_lock(&w->lock);
    while (!w->stop) {
        cpu_job *j = find_job_locked(w);
        if (j) {
            j->helpers++;
            cube_mutex_unlock(&w->lock);
            work_on(j, local);
            cube_mutex_lock(&w->lock);
            if (--j->helpers == 0)
                pthread_cond_broadcast(&w->done_cv);
            continue;
        }
        /* Spin a little before sleeping: launches often come in bursts. */
        uint64_t seen = atomic_load(&w->epoch);
        cube_mutex_unlock(&w->lock);
        for (int i = 0; i < 2000 && atomic_load(&w->epoch) == seen; i++)
            sched_yield();
        cube_mutex_lock(&w->lock);
        if (!w->stop && atomic_load(&w->epoch) == seen && !find_job_locked(w))
            cube_cond_wait(&w->work_cv, &w->lock);
    }
    cube_mutex_unlock(&w->lock);
    return NULL;
}

cube_error *cpu_workers_create(uint32_t threads, cpu_workers **out)
{
    *out = NULL;
    cpu_workers *w = calloc(1, sizeof *w);
    if (!w)
        return cube_error_new(CUBE_ERR_OUT_OF_MEMORY, "cpu worker pool");
    cube_mutex_init(&w->lock);
    pthread_cond_init(&w->work_cv, NULL);
    pthread_cond_init(&w->done_cv, NULL);
    uint32_t n = threads > 1 ? threads - 1 : 0;
    w->threads = n ? calloc(n, sizeof *w->threads) : NULL;
    if (n && !w->threads) {
        cpu_workers_destroy(w);
        return cube_error_new(CUBE_ERR_OUT_OF_MEMORY, "cpu worker pool");
    }
    for (uint32_t i = 0; i < n; i++) {
        if (pthread_create(&w->threads[i], NULL, worker_main, w) != 0) {
            cpu_workers_destroy(w);
            return cube_error_new(
                CUBE_ERR_IO, "could not start worker thread %u of %u", i, n);
        }
        w->count++;
    }
    *out = w;
    return NULL;
}

void cpu_workers_destroy(cpu_workers *w)
{
    if (!w)
        return;
    cube_mutex_lock(&w->lock);
    w->stop = 1;
    atomic_fetch_add(&w->epoch, 1);
    pthread_cond_broadcast(&w->work_cv);
    cube_mutex_unlock(&w->lock);
    for (uint32_t i = 0; i < w->count; i++)
        pthread_join(w->threads[i], NULL);
    free(w->threads);
    pthread_cond_destroy(&w->work_cv);
    pthread_cond_destroy(&w->done_cv);
    cube_mutex_destroy(&w->lock);
    free(w);
}

uint32_t cpu_workers_threads(const cpu_workers *w)
{
    return w->count + 1;
}

cube_error *cpu_workers_run(cpu_workers *w, uint32_t total, uint32_t chunk,
                            cpu_range_fn fn, void *ctx)
{
    if (total == 0)
        return NULL;
    if (chunk == 0)
        chunk = 1;
    cpu_thread_local *local = cpu_thread_local_get();
    if (!local)
        return cube_error_new(CUBE_ERR_OUT_OF_MEMORY, "worker scratch memory");
    if (w->count == 0 || total <= chunk)
        return fn(ctx, 0, total, local); /* not worth waking anyone */

    cpu_job j = {.fn = fn, .ctx = ctx, .total = total, .chunk = chunk};
    atomic_init(&j.next, 0);
    atomic_init(&j.done, 0);
    atomic_init(&j.error, NULL);
    cube_mutex_lock(&w->lock);
    j.next_job = w->jobs;
    /* The job lives on this stack: it leaves the list, and every helper
     * leaves it, before this function returns. */
    // cppcheck-suppress autoVariables
    w->jobs = &j;
    atomic_fetch_add(&w->epoch, 1);
    pthread_cond_broadcast(&w->work_cv);
    cube_mutex_unlock(&w->lock);

    work_on(&j, local);

    cube_mutex_lock(&w->lock);
    for (cpu_job **p = &w->jobs; *p; p = &(*p)->next_job) {
        if (*p == &j) {
            *p = j.next_job;
            break;
        }
    }
    /* No new helper can join now; wait for those inside to leave. */
    while (j.helpers > 0)
        cube_cond_wait(&w->done_cv, &w->lock);
    cube_mutex_unlock(&w->lock);
    return atomic_load(&j.error);
}
