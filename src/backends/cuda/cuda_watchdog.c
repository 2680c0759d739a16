/* The watchdog of NCCL communicators between processes.
 *
 * Between processes nothing of cubert's sees a peer's call: a receive
 * whose sender never comes (a peer that crashed, or a program that
 * mismatched its calls) leaves NCCL's kernel waiting on the GPU, and
 * every later wait on that stream would hang. So each call of such a
 * rank is bracketed by two events on its stream (cuda_watch_begin,
 * cuda_watch_end), and one thread per process looks at every armed call
 * each millisecond: once the call's start event has passed (the call is
 * running on the device, whatever was queued before it) and its done
 * event has not after the communicator's timeout, or NCCL reports an
 * asynchronous error (a peer aborted), the communicator is aborted —
 * NCCL's kernels see the abort flag and end — and that call and every
 * call of the rank still running are failed with the reason. The core
 * learns each call's end from cuda_watch_poll and records a failure on
 * its destination.
 *
 * The rank's own thread and the watchdog share the NCCL communicator:
 * NCCL calls on it are made under the watch's nccl_lock
 * (cuda_watch_acquire), and the abort (from either side) under the same
 * lock, once.
 *
 * Locks: wd_lock (the list of watches; held by the watchdog across a
 * round), then a watch's `lock` (its calls), then nccl_lock, tried only
 * (the watchdog never waits for a rank's thread). A rank's thread takes
 * nccl_lock, then its watch's lock; the watchdog holds `lock` only
 * before it tries nccl_lock and releases it first.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backends/cuda/cuda_internal.h"
#include "base/grow.h"
#include "base/clock.h"
#include "base/error.h"
#include "cubert/log.h"

enum { CALL_ARMING, CALL_RUNNING, CALL_DONE, CALL_FAILED };

static cube_mutex wd_lock = CUBE_MUTEX_INIT;

typedef struct watch_call {
    uint64_t ticket;
    CUevent start, done;
    uint64_t started_ns; /* when the watchdog first saw start pass; 0 */
    int state;
    cube_error *why; /* CALL_FAILED */
} watch_call;

struct cuda_watch {
    cuda_server *s;
    const nccl_api *nccl;
    ncclComm_t comm;
    uint64_t timeout_ns;
    cube_mutex nccl_lock;
    atomic_int aborted;
    cube_mutex lock;
    watch_call *calls CUBE_GUARDED_FIELD(lock);
    size_t count CUBE_GUARDED_FIELD(lock), cap CUBE_GUARDED_FIELD(lock);
    uint64_t next_ticket CUBE_GUARDED_FIELD(lock);
    /* Set once the watchdog decided to abort and could not take nccl_lock
     * yet: it tries again each round. */
    int abort_wanted CUBE_GUARDED_FIELD(lock);
    CUevent *spare CUBE_GUARDED_FIELD(lock); /* events to reuse */
    size_t spare_count CUBE_GUARDED_FIELD(lock), spare_cap
        CUBE_GUARDED_FIELD(lock);
    struct cuda_watch *next CUBE_GUARDED_FIELD(wd_lock);
};

static pthread_cond_t wd_wake = PTHREAD_COND_INITIALIZER;
static cuda_watch *wd_list CUBE_GUARDED_BY(wd_lock);
static int wd_started CUBE_GUARDED_BY(wd_lock);
/* Calls armed and not yet seen to end, plus aborts still wanted: the
 * watchdog sleeps while it is 0. */
static atomic_size_t wd_busy;

/* The watchdog checks wd_busy under wd_lock before it sleeps: the first
 * increment wakes it under the same lock, so the wake is not lost. The
 * increment may come under a watch's lock (before a round can see the
 * call), the wake only after it is dropped (wd_lock comes first). */
static int busy_inc(void)
{
    return atomic_fetch_add(&wd_busy, 1) == 0;
}

static void busy_wake(int first)
{
    if (!first)
        return;
    cube_mutex_lock(&wd_lock);
    pthread_cond_signal(&wd_wake);
    cube_mutex_unlock(&wd_lock);
}

static void busy_sub(size_t n)
{
    if (n)
        atomic_fetch_sub(&wd_busy, n);
}

/* Aborts the communicator once (nccl_lock held). The calls still running
 * then end without their result: each fails, unless its end had passed. */
static void abort_now(cuda_watch *w)
{
    if (atomic_exchange(&w->aborted, 1))
        return;
    w->nccl->ncclCommAbort(w->comm);
    cube_error_ignore(cuda_enter(w->s), "the abort goes on without the "
                                        "context");
    size_t ended = 0;
    cube_mutex_lock(&w->lock);
    for (size_t i = 0; i < w->count; i++) {
        watch_call *c = &w->calls[i];
        if (c->state != CALL_RUNNING && c->state != CALL_ARMING)
            continue;
        ended += c->state == CALL_RUNNING;
        if (c->state == CALL_RUNNING &&
            w->s->api->cuEventQuery(c->done) == CUDA_SUCCESS) {
            c->state = CALL_DONE;
            continue;
        }
        c->state = CALL_FAILED;
        c->why = cube_error_new(CUBE_ERR_ABORTED,
                                "the NCCL communicator was aborted before "
                                "the call finished on the device");
    }
    cube_mutex_unlock(&w->lock);
    busy_sub(ended);
}

/* Aborts the communicator once; 0 when nccl_lock was busy (try later). */
static int try_abort(cuda_watch *w)
{
    if (!cube_mutex_trylock(&w->nccl_lock))
        return 0;
    abort_now(w);
    cube_mutex_unlock(&w->nccl_lock);
    return 1;
}

/* Fails every running call of w with `why` (taken). */
static size_t fail_running(cuda_watch *w, cube_error *why)
    CUBE_REQUIRES(w->lock)
{
    size_t ended = 0;
    for (size_t i = 0; i < w->count; i++) {
        watch_call *c = &w->calls[i];
        if (c->state != CALL_RUNNING && c->state != CALL_ARMING)
            continue;
        if (c->state == CALL_RUNNING)
            ended++;
        c->state = CALL_FAILED;
        c->why = cube_error_clone(why);
    }
    cube_error_free(why);
    return ended;
}

/* One look at w's calls. */
static void check(cuda_watch *w)
{
    const cuda_api *a = w->s->api;
    uint64_t now = cube_clock_ns();
    cube_error *why = NULL;
    size_t ended = 0;
    cube_mutex_lock(&w->lock);
    int entered = 0;
    for (size_t i = 0; i < w->count && !why; i++) {
        watch_call *c = &w->calls[i];
        if (c->state != CALL_RUNNING)
            continue;
        if (!entered) {
            cube_error_ignore(cuda_enter(w->s),
                              "without the context the event queries fail, "
                              "and fail the calls");
            entered = 1;
        }
        CUresult r = a->cuEventQuery(c->done);
        if (r == CUDA_SUCCESS) {
            c->state = CALL_DONE;
            ended++;
            continue;
        }
        if (r != CUDA_ERROR_NOT_READY) {
            c->state = CALL_FAILED;
            c->why = cuda_fail(w->s, r, CUBE_ERR_INTERNAL,
                               "waiting for NCCL's work on the device");
            ended++;
            continue;
        }
        if (!c->started_ns && a->cuEventQuery(c->start) == CUDA_SUCCESS)
            c->started_ns = now;
        if (c->started_ns && now - c->started_ns >= w->timeout_ns)
            why = cube_error_new(
                CUBE_ERR_TIMEOUT,
                "NCCL's work ran on the device for %llu ms (the "
                "communicator's timeout) without finishing: a peer that "
                "never made the matching call, or a send without its "
                "receive; the communicator was aborted",
                (unsigned long long)(w->timeout_ns / 1000000ull));
    }
    int wanted = w->abort_wanted;
    cube_mutex_unlock(&w->lock);
    /* A peer's failure reaches this rank as NCCL's asynchronous error. */
    if (!why && !atomic_load(&w->aborted) &&
        cube_mutex_trylock(&w->nccl_lock)) {
        ncclResult_t state = ncclSuccess;
        if (!atomic_load(&w->aborted) &&
            w->nccl->ncclCommGetAsyncError(w->comm, &state) == ncclSuccess &&
            state != ncclSuccess && state != ncclInProgress)
            why = cube_error_new(CUBE_ERR_ABORTED,
                                 "NCCL reported an error on the communicator "
                                 "(%s); the communicator was aborted",
                                 nccl_result_text(w->nccl, state, w->comm));
        cube_mutex_unlock(&w->nccl_lock);
    }
    cube_mutex_lock(&w->lock);
    if (why) {
        cube_log_write(CUBE_LOG_ERROR, "cuda", "%s", cube_error_message(why));
        ended += fail_running(w, why);
        if (!w->abort_wanted) {
            w->abort_wanted = 1;
            busy_inc(); /* this thread is awake */
            wanted = 1;
        }
    }
    cube_mutex_unlock(&w->lock);
    busy_sub(ended);
    if (wanted && try_abort(w)) {
        cube_mutex_lock(&w->lock);
        w->abort_wanted = 0;
        cube_mutex_unlock(&w->lock);
        busy_sub(1);
    }
}

static void *watchdog_main(void *arg)
{
    (void)arg;
    cube_mutex_lock(&wd_lock);
    for (;;) {
        while (atomic_load(&wd_busy) == 0)
            cube_cond_wait(&wd_wake, &wd_lock);
        for (cuda_watch *w = wd_list; w; w = w->next)
            check(w);
        cube_mutex_unlock(&wd_lock);
        struct timespec pause = {0, 1000000}; /* 1 ms */
        nanosleep(&pause, NULL);
        cube_mutex_lock(&wd_lock);
    }
    return NULL;
}

cube_error *cuda_watch_open(cuda_server *s, const nccl_api *nccl,
                            ncclComm_t comm, uint64_t timeout_ns,
                            cuda_watch **out)
{
    *out = NULL;
    cuda_watch *w = calloc(1, sizeof *w);
    if (!w)
        return cube_error_new(CUBE_ERR_OUT_OF_MEMORY, "NCCL watchdog");
    w->s = s;
    w->nccl = nccl;
    w->comm = comm;
    w->timeout_ns = timeout_ns;
    cube_mutex_init(&w->nccl_lock);
    cube_mutex_init(&w->lock);
    cube_mutex_lock(&wd_lock);
    if (!wd_started) {
        /* One thread for the process, for its life: it sleeps while no
         * call is armed. */
        pthread_t t;
        pthread_attr_t attr;
        int rc = pthread_attr_init(&attr);
        if (rc == 0) {
            pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
            rc = pthread_create(&t, &attr, watchdog_main, NULL);
            pthread_attr_destroy(&attr);
        }
        if (rc != 0) {
            cube_mutex_unlock(&wd_lock);
            cube_mutex_destroy(&w->lock);
            cube_mutex_destroy(&w->nccl_lock);
            free(w);
            return cube_error_new(CUBE_ERR_RESOURCE_LIMIT,
                                  "cannot start the thread that watches "
                                  "NCCL communicators between processes "
                                  "(%s)",
                                  strerror(rc));
        }
        wd_started = 1;
    }
    w->next = wd_list;
    wd_list = w;
    cube_mutex_unlock(&wd_lock);
    *out = w;
    return NULL;
}

int cuda_watch_close(cuda_watch *w)
{
    if (!w)
        return 0;
    cube_mutex_lock(&wd_lock);
    for (cuda_watch **p = &wd_list; *p; p = &(*p)->next)
        if (*p == w) {
            *p = w->next;
            break;
        }
    cube_mutex_unlock(&wd_lock);
    /* No round looks at it any more. */
    const cuda_api *a = w->s->api;
    cube_error_ignore(cuda_enter(w->s),
                      "closing a watch goes on without the context");
    size_t ended = 0;
    for (size_t i = 0; i < w->count; i++) {
        watch_call *c = &w->calls[i];
        if (c->state == CALL_RUNNING)
            ended++;
        cube_error_free(c->why);
        if (c->start)
            a->cuEventDestroy(c->start);
        if (c->done)
            a->cuEventDestroy(c->done);
    }
    if (w->abort_wanted)
        ended++;
    busy_sub(ended);
    for (size_t i = 0; i < w->spare_count; i++)
        a->cuEventDestroy(w->spare[i]);
    free(w->spare);
    free(w->calls);
    int aborted = atomic_load(&w->aborted);
    cube_mutex_destroy(&w->lock);
    cube_mutex_destroy(&w->nccl_lock);
    free(w);
    return aborted;
}

/* Holds nccl_lock past its return (released by cuda_watch_release): out
 * of the analysis's reach. */
int cuda_watch_acquire(cuda_watch *w) CUBE_NO_TSA
{
    cube_mutex_lock(&w->nccl_lock);
    if (atomic_load(&w->aborted)) {
        cube_mutex_unlock(&w->nccl_lock);
        return 1;
    }
    return 0;
}

void cuda_watch_release(cuda_watch *w) CUBE_NO_TSA
{
    cube_mutex_unlock(&w->nccl_lock);
}

void cuda_watch_abort(cuda_watch *w)
{
    if (try_abort(w))
        return;
    /* The rank's thread is inside an NCCL call: the watchdog aborts as
     * soon as it lets go (each round tries). */
    cube_mutex_lock(&w->lock);
    int first = 0;
    if (!w->abort_wanted) {
        w->abort_wanted = 1;
        first = busy_inc();
    }
    cube_mutex_unlock(&w->lock);
    busy_wake(first);
}

void cuda_watch_abort_locked(cuda_watch *w)
{
    abort_now(w);
}

static cube_error *event_get(cuda_watch *w, CUevent *out) CUBE_REQUIRES(w->lock)
{
    if (w->spare_count) {
        *out = w->spare[--w->spare_count];
        return NULL;
    }
    CUresult r = w->s->api->cuEventCreate(out, CU_EVENT_DISABLE_TIMING);
    return r ? cuda_fail(w->s, r, CUBE_ERR_INTERNAL, "cuEventCreate") : NULL;
}

static void event_put(cuda_watch *w, CUevent ev) CUBE_REQUIRES(w->lock)
{
    if (!ev)
        return;
    CUevent *room =
        cube_grow(w->spare, w->spare_count, &w->spare_cap, sizeof *room, 8);
    if (!room) {
        w->s->api->cuEventDestroy(ev);
        return;
    }
    w->spare = room;
    w->spare[w->spare_count++] = ev;
}

/* Drops call i (its events back to the spares). */
static void call_remove(cuda_watch *w, size_t i) CUBE_REQUIRES(w->lock)
{
    event_put(w, w->calls[i].start);
    event_put(w, w->calls[i].done);
    cube_error_free(w->calls[i].why);
    memmove(&w->calls[i], &w->calls[i + 1],
            (w->count - i - 1) * sizeof *w->calls);
    w->count--;
}

cube_error *cuda_watch_begin(cuda_watch *w, CUstream cu, uint64_t *ticket)
{
    *ticket = 0;
    cube_mutex_lock(&w->lock);
    cube_error *err = NULL;
    watch_call *room = cube_grow(w->calls, w->count, &w->cap, sizeof *room, 16);
    if (!room)
        err = cube_error_new(CUBE_ERR_OUT_OF_MEMORY, "NCCL watchdog");
    else
        w->calls = room;
    watch_call c;
    memset(&c, 0, sizeof c);
    if (!err)
        err = event_get(w, &c.start);
    if (!err)
        err = event_get(w, &c.done);
    if (!err) {
        CUresult r = w->s->api->cuEventRecord(c.start, cu);
        if (r != CUDA_SUCCESS)
            err = cuda_fail(w->s, r, CUBE_ERR_INTERNAL, "cuEventRecord");
    }
    if (err) {
        event_put(w, c.start);
        event_put(w, c.done);
        cube_mutex_unlock(&w->lock);
        return err;
    }
    c.ticket = ++w->next_ticket;
    c.state = CALL_ARMING;
    w->calls[w->count++] = c;
    *ticket = c.ticket;
    cube_mutex_unlock(&w->lock);
    return NULL;
}

static watch_call *find(cuda_watch *w, uint64_t ticket, size_t *at)
    CUBE_REQUIRES(w->lock)
{
    for (size_t i = 0; i < w->count; i++)
        if (w->calls[i].ticket == ticket) {
            *at = i;
            return &w->calls[i];
        }
    return NULL;
}

cube_error *cuda_watch_end(cuda_watch *w, CUstream cu, uint64_t ticket)
{
    cube_mutex_lock(&w->lock);
    size_t at = 0;
    watch_call *c = find(w, ticket, &at);
    cube_error *err = NULL;
    int first = 0;
    if (c && c->state == CALL_ARMING) {
        CUresult r = w->s->api->cuEventRecord(c->done, cu);
        if (r != CUDA_SUCCESS) {
            err = cuda_fail(w->s, r, CUBE_ERR_INTERNAL, "cuEventRecord");
            call_remove(w, at);
        } else {
            first = busy_inc();
            c->state = CALL_RUNNING;
        }
    }
    cube_mutex_unlock(&w->lock);
    busy_wake(first);
    return err;
}

void cuda_watch_cancel(cuda_watch *w, uint64_t ticket)
{
    cube_mutex_lock(&w->lock);
    size_t at = 0;
    watch_call *c = find(w, ticket, &at);
    int running = c && c->state == CALL_RUNNING;
    if (c)
        call_remove(w, at);
    cube_mutex_unlock(&w->lock);
    if (running)
        busy_sub(1);
}

cube_error *cuda_watch_poll(cuda_watch *w, uint64_t ticket, int *done)
{
    *done = 0;
    cube_mutex_lock(&w->lock);
    size_t at = 0;
    watch_call *c = find(w, ticket, &at);
    cube_error *err = NULL;
    if (!c) {
        *done = 1; /* forgotten: it ended before */
    } else if (c->state == CALL_FAILED) {
        *done = 1;
        err = c->why;
        c->why = NULL;
        call_remove(w, at);
    } else if (c->state == CALL_RUNNING) {
        /* The watchdog may not have looked yet: a finished call is seen
         * here at once. */
        cube_error *enter = cuda_enter(w->s);
        int entered = enter == NULL;
        cube_error_ignore(enter, "the call is left to the watchdog's round");
        if (entered && w->s->api->cuEventQuery(c->done) == CUDA_SUCCESS) {
            *done = 1;
            call_remove(w, at);
            cube_mutex_unlock(&w->lock);
            busy_sub(1);
            return NULL;
        }
    } else if (c->state == CALL_DONE) {
        *done = 1;
        call_remove(w, at);
    }
    cube_mutex_unlock(&w->lock);
    return err;
}
