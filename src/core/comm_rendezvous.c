/* The rendezvous of the ranks' calls of a communicator in this process,
 * and its timeout.
 *
 * Every call of a rank is matched to the calls of the other ranks by a
 * sequence number (per rank for collectives, per ordered pair of ranks
 * for send and receive). The calls of one collective meet in a
 * `comm_call` record of the communicator's group: each rank posts its
 * arguments there, and the last to arrive judges them (a refused call, a
 * mismatch, a failed source) once for all. Only then does any rank hand
 * its part to the backend, so a wrong call moves no byte and leaves the
 * backend's communicator as it was. A rank that waits longer than the
 * timeout cancels the record: every rank of it, also one that comes
 * later, answers CUBE_ERR_TIMEOUT. A send to the calling rank and its
 * receive, both this thread's, are paired and judged here at once.
 */
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/comm_internal.h"

static const char *dtype_name(uint32_t dtype)
{
    static const char *const names[] = {"?",    "i8",  "u8",  "i32",
                                        "u32",  "i64", "u64", "f16",
                                        "bf16", "f32", "f64"};
    return dtype <= CUBE_DTYPE_F64 ? names[dtype] : "?";
}

/* Frees what a record holds besides itself. */
static void call_clear(comm_call *k)
{
    for (uint32_t i = 0; i < k->expected; i++) {
        cube_error_free(k->refused[i]);
        cube_error_free(k->failed[i]);
    }
    cube_error_free(k->verdict);
}

void comm_call_free(comm_call *k)
{
    call_clear(k);
    free(k);
}

/* A zeroed record of a collective (or of a send and its receive), not yet
 * in the group's list. NULL for want of memory. */
static comm_call *call_alloc(comm_group *g, int p2p) CUBE_REQUIRES(g->lock)
{
    uint32_t expected = p2p ? 2 : g->n;
    /* One block: the record, then its per-call arrays. */
    size_t size = sizeof(comm_call) + expected * (sizeof(cube_collective) +
                                                  2 * sizeof(cube_error *) + 1);
    comm_call *k = g->spare[p2p];
    if (k)
        g->spare[p2p] = NULL;
    else if (!(k = aligned_alloc(64, (size + 63) & ~(size_t)63)))
        return NULL;
    memset(k, 0, size);
    k->calls = (cube_collective *)(k + 1);
    k->refused = (cube_error **)(k->calls + expected);
    k->failed = k->refused + expected;
    k->capturing = (unsigned char *)(k->failed + expected);
    k->p2p = p2p;
    k->expected = expected;
    return k;
}

/* The record of call `seq` (p2p: from `from` to `to`), made when this
 * rank is the first to come. NULL for want of memory. */
static comm_call *call_find(comm_group *g, int p2p, uint32_t from, uint32_t to,
                            uint64_t seq) CUBE_REQUIRES(g->lock)
{
    for (comm_call *k = g->calls; k; k = k->next)
        if (k->seq == seq && k->p2p == p2p &&
            (!p2p || (k->from == from && k->to == to)))
            return k;
    comm_call *k = call_alloc(g, p2p);
    if (!k)
        return NULL;
    k->seq = seq;
    k->from = from;
    k->to = to;
    k->next = g->calls;
    g->calls = k;
    return k;
}

static void call_unlink(comm_group *g, comm_call *k) CUBE_REQUIRES(g->lock)
{
    for (comm_call **p = &g->calls; *p; p = &(*p)->next)
        if (*p == k) {
            *p = k->next;
            return;
        }
}

static void describe(const cube_collective *c, char *buf, size_t cap)
{
    int n = snprintf(buf, cap, "%s of %llu %s", comm_kind_name(c->kind),
                     (unsigned long long)c->count, dtype_name(c->dtype));
    if (n < 0 || (size_t)n >= cap)
        return;
    if (comm_is_reduction(c->kind))
        n += snprintf(buf + n, cap - (size_t)n, " (op %u)", c->op);
    if (comm_has_root(c->kind) && n >= 0 && (size_t)n < cap)
        snprintf(buf + n, cap - (size_t)n, " from root %u", c->root);
}

/* Whether two calls of one collective agree. */
static int agree(const cube_collective *a, const cube_collective *b, int p2p)
{
    if (p2p)
        return a->count == b->count && a->dtype == b->dtype;
    return a->kind == b->kind && a->count == b->count && a->dtype == b->dtype &&
           (!comm_is_reduction(a->kind) || a->op == b->op) &&
           (!comm_has_root(a->kind) || a->root == b->root);
}

/* Adds call `c`'s failed source to the verdict `several` (made first). */
cube_error *comm_add_failed_source(cube_error *several,
                                   const cube_collective *c,
                                   const cube_error *failed)
{
    if (!several)
        several = cube_error_new(CUBE_ERR_SEVERAL,
                                 "%s: a source buffer cannot be trusted (the "
                                 "work that should have written it failed), "
                                 "so no rank runs it",
                                 comm_kind_name(c->kind));
    cube_error_add_cause(several,
                         cube_error_prefix(cube_error_clone(failed),
                                           "rank %u's source", c->rank));
    return several;
}

/* Decides, once every call arrived, why none of them may run (or NULL). */
static cube_error *judge(const comm_call *k)
{
    /* A capture records the call and the others would run it: the graphs
     * and the buffers would part ways, so no rank does either. */
    for (uint32_t i = 1; i < k->expected; i++)
        if (k->capturing[i] != k->capturing[0]) {
            uint32_t in = k->capturing[0] ? 0 : i,
                     out = k->capturing[0] ? i : 0;
            return cube_error_new(CUBE_ERR_GRAPH_STATE,
                                  "%s: rank %u's stream is capturing a graph "
                                  "and rank %u's is not; every rank captures "
                                  "a collective or none does, so no rank "
                                  "runs or records it",
                                  comm_kind_name(k->calls[0].kind),
                                  k->calls[in].rank, k->calls[out].rank);
        }
    for (uint32_t i = 0; i < k->expected; i++)
        if (k->refused[i])
            return cube_error_wrap(
                cube_error_clone(k->refused[i]), CUBE_ERR_INVALID_ARGUMENT,
                "rank %u's %s was refused, so no rank runs it",
                k->calls[i].rank, comm_kind_name(k->calls[i].kind));
    for (uint32_t i = 1; i < k->expected; i++) {
        if (!agree(&k->calls[0], &k->calls[i], k->p2p)) {
            char a[160], b[160];
            describe(&k->calls[0], a, sizeof a);
            describe(&k->calls[i], b, sizeof b);
            return cube_error_new(CUBE_ERR_INVALID_ARGUMENT,
                                  "the ranks' calls differ: rank %u made %s, "
                                  "rank %u %s; no rank runs it",
                                  k->calls[0].rank, a, k->calls[i].rank, b);
        }
    }
    cube_error *several = NULL;
    for (uint32_t i = 0; i < k->expected; i++)
        if (k->failed[i])
            several =
                comm_add_failed_source(several, &k->calls[i], k->failed[i]);
    return several;
}

/* Posts this thread's call; p->call is set (NULL with p->local set when
 * memory ran out or the communicator is aborted). */
void comm_post(pending *p, const cube_collective *mine, cube_error *failure)
{
    comm_group *g = p->comm->group;
    uint32_t r = p->comm->rank, n = g->n;
    cube_mutex_lock(&g->lock);
    if (g->aborted) {
        cube_mutex_unlock(&g->lock);
        cube_error_free(failure);
        cube_error_free(p->local);
        p->local = comm_aborted_error(mine->kind);
        return;
    }
    int p2p = comm_is_p2p(mine->kind);
    if (p2p && (mine->peer >= n || mine->peer == r)) {
        /* No pair of ranks to post to (a peer out of range, or this rank
         * outside a group), so no peer waits for it: the refusal
         * (p->local) is this rank's alone. */
        cube_mutex_unlock(&g->lock);
        cube_error_free(failure);
        return;
    }
    uint32_t from = 0, to = 0;
    uint64_t seq;
    if (!p2p) {
        seq = g->seq[r]++;
        p->index = r;
    } else if (mine->kind == CUBE_COLLECTIVE_SEND) {
        from = r;
        to = mine->peer;
        seq = g->send_seq[(size_t)from * n + to]++;
        p->index = 0;
    } else {
        from = mine->peer;
        to = r;
        seq = g->recv_seq[(size_t)from * n + to]++;
        p->index = 1;
    }
    comm_call *k = call_find(g, p2p, from, to, seq);
    if (!k) {
        cube_mutex_unlock(&g->lock);
        cube_error_free(failure);
        cube_error_free(p->local);
        p->local = cube_error_new(CUBE_ERR_OUT_OF_MEMORY, "%s",
                                  comm_kind_name(mine->kind));
        return;
    }
    k->calls[p->index] = *mine;
    k->refused[p->index] = p->local ? cube_error_clone(p->local) : NULL;
    k->failed[p->index] = failure;
    k->capturing[p->index] = (unsigned char)p->capturing;
    if (++k->arrived == k->expected && !k->cancelled) {
        k->verdict = judge(k);
        k->ready = 1;
        p->judged = 1;
        /* Alone (one rank), no one waits for this record. */
        if (k->expected > 1)
            pthread_cond_broadcast(&g->changed);
    }
    p->call = k;
    cube_mutex_unlock(&g->lock);
}

/* The ranks of one collective usually arrive within microseconds of each
 * other, while a sleep on the condition costs tens of them to wake from:
 * before sleeping, a waiter yields the processor a while (about 20 µs),
 * dropping the lock between looks. */
#define SPIN_ROUNDS 200
static void spin_until(comm_group *g, const int *flag) CUBE_REQUIRES(g->lock)
{
    for (int i = 0; i < SPIN_ROUNDS && !*flag && !g->aborted; i++) {
        cube_mutex_unlock(&g->lock);
        sched_yield();
        cube_mutex_lock(&g->lock);
    }
}

static void spin_until_count(comm_group *g, const uint32_t *count,
                             uint32_t want) CUBE_REQUIRES(g->lock)
{
    for (int i = 0; i < SPIN_ROUNDS && *count < want && !g->aborted; i++) {
        cube_mutex_unlock(&g->lock);
        sched_yield();
        cube_mutex_lock(&g->lock);
    }
}

/* Whether a call of `k` that has not arrived can no longer come: its
 * rank's communicator was destroyed. */
static int missing_gone(const comm_group *g, const comm_call *k)
    CUBE_REQUIRES(g->lock)
{
    for (uint32_t i = 0; i < k->expected; i++) {
        uint32_t rank = k->p2p ? (i == 0 ? k->from : k->to) : i;
        if (!k->calls[i].nranks && g->gone[rank])
            return 1;
    }
    return 0;
}

/* Waits until p's call is judged, cancelled or aborted: NULL when this
 * rank may run its part, else what to answer. */
cube_error *comm_await(pending *p)
{
    comm_group *g = p->comm->group;
    comm_call *k = p->call;
    if (p->judged)
        /* This thread wrote the verdict; no one changes it until every
         * rank left the record. */
        return k->verdict ? cube_error_clone(k->verdict) : NULL;
    cube_mutex_lock(&g->lock);
    spin_until(g, &k->ready);
    /* The timeout runs from here: a call whose peers are already there
     * never reads the clock. */
    if (!k->ready && !k->cancelled && !g->aborted)
        p->deadline_ns = cube_clock_ns() + g->timeout_ns;
    while (!k->ready && !k->cancelled && !g->aborted) {
        if (cube_clock_ns() >= p->deadline_ns || missing_gone(g, k)) {
            /* Every rank of it answers the same from now on. */
            k->cancelled = 1;
            pthread_cond_broadcast(&g->changed);
            break;
        }
        struct timespec until = {(time_t)(p->deadline_ns / 1000000000ull),
                                 (long)(p->deadline_ns % 1000000000ull)};
        cube_cond_timedwait(&g->changed, &g->lock, &until);
    }
    cube_error *err = NULL;
    const char *what = comm_kind_name(k->calls[p->index].kind);
    if (g->aborted && !k->ready)
        err = comm_aborted_error(k->calls[p->index].kind);
    else if (k->cancelled)
        err = cube_error_new(
            CUBE_ERR_TIMEOUT,
            "%s: %u of %u ranks' calls arrived within the communicator's "
            "timeout of %llu ms (a rank that never made its call, or a send "
            "without its receive); nothing moved",
            what, k->arrived, k->expected,
            (unsigned long long)(g->timeout_ns / 1000000ull));
    else if (k->verdict)
        err = cube_error_clone(k->verdict);
    cube_mutex_unlock(&g->lock);
    return err;
}

/* This rank's part is issued (or will never be). */
static void mark_issued_locked(comm_group *g, comm_call *k)
    CUBE_REQUIRES(g->lock)
{
    k->issued++;
    if (k->expected > 1)
        pthread_cond_broadcast(&g->changed);
}

void comm_mark_issued(pending *p)
{
    comm_group *g = p->comm->group;
    cube_mutex_lock(&g->lock);
    mark_issued_locked(g, p->call);
    cube_mutex_unlock(&g->lock);
}

/* This rank is done with p's call. When the ranks run it, the others may
 * still be writing this rank's destination (a host backend's ranks share
 * the work): wait until every part was issued before the pins go. The
 * last rank to leave frees the record. */
void comm_leave(pending *p, int mark)
{
    comm_group *g = p->comm->group;
    comm_call *k = p->call;
    cube_mutex_lock(&g->lock);
    if (mark)
        mark_issued_locked(g, k);
    if (k->ready && !k->verdict)
        spin_until_count(g, &k->issued, k->expected);
    while (k->ready && !k->verdict && k->issued < k->expected && !g->aborted)
        cube_cond_wait(&g->changed, &g->lock);
    if (++k->left == k->expected) {
        call_unlink(g, k);
        call_clear(k);
        if (!g->spare[k->p2p])
            g->spare[k->p2p] = k;
        else
            free(k);
    }
    cube_mutex_unlock(&g->lock);
}

/* --- a rank's sends to itself --- */

/* Whether the send's source and the receive's destination of a pair
 * overlap other than as the same range (a copy over itself). */
static int pair_overlaps(const cube_collective *send,
                         const cube_collective *recv, uint64_t bytes)
{
    if (send->src.storage != recv->dst.storage)
        return 0;
    uint64_t s = send->src.offset, d = recv->dst.offset;
    return s != d && s < d + bytes && d < s + bytes;
}

/* Makes the record of a send to the calling rank and its receive, judged
 * at once as the rendezvous would judge a pair of ranks' (a refusal,
 * calls that differ, a failed source). Both calls are this thread's, so
 * nothing waits for it; it is freed as a posted record is (comm_leave). */
static void pair_up(pending *send, pending *recv)
{
    comm_group *g = send->comm->group;
    pending *pair[2] = {send, recv};
    cube_mutex_lock(&g->lock);
    int aborted = g->aborted;
    comm_call *k = aborted ? NULL : call_alloc(g, 1);
    cube_mutex_unlock(&g->lock);
    if (!k) {
        for (int i = 0; i < 2; i++) {
            cube_error_free(pair[i]->local);
            pair[i]->local =
                aborted ? comm_aborted_error(pair[i]->mine.kind)
                        : cube_error_new(CUBE_ERR_OUT_OF_MEMORY, "%s",
                                         comm_kind_name(pair[i]->mine.kind));
        }
        return;
    }
    k->from = k->to = send->comm->rank;
    for (uint32_t i = 0; i < 2; i++) {
        pending *p = pair[i];
        k->calls[i] = p->mine;
        k->refused[i] = p->local ? cube_error_clone(p->local) : NULL;
        k->failed[i] = p->failure; /* the record's now */
        p->failure = NULL;
        k->capturing[i] = (unsigned char)p->capturing;
        p->call = k;
        p->index = i;
        p->judged = 1;
    }
    k->arrived = 2;
    k->verdict = judge(k);
    uint64_t bytes =
        send->mine.count * cube_dtype_size((cube_dtype)send->mine.dtype);
    if (!k->verdict && pair_overlaps(&k->calls[0], &k->calls[1], bytes))
        k->verdict = cube_error_new(
            CUBE_ERR_INVALID_ARGUMENT,
            "cube_send to rank %u itself: the source and the receive's "
            "destination overlap other than as the same range",
            send->comm->rank);
    k->ready = 1;
}

/* Pairs the sends in a[0..n) whose peer is their own rank with the
 * receives from it, in order per communicator (the n-th send with the
 * n-th receive, as between two ranks). A call left without a partner can
 * never be matched (only this thread makes that rank's calls), so it is
 * refused now instead of timing out. */
void comm_pair_self(pending *a, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        if (!a[i].self || a[i].call || a[i].mine.kind != CUBE_COLLECTIVE_SEND)
            continue;
        for (size_t j = 0; j < n; j++)
            if (a[j].self && !a[j].call && a[j].comm == a[i].comm &&
                a[j].mine.kind == CUBE_COLLECTIVE_RECV) {
                pair_up(&a[i], &a[j]);
                break;
            }
    }
    for (size_t i = 0; i < n; i++) {
        if (!a[i].self || a[i].call || a[i].local)
            continue;
        int send = a[i].mine.kind == CUBE_COLLECTIVE_SEND;
        a[i].local = cube_error_new(
            CUBE_ERR_INVALID_ARGUMENT,
            "%s: rank %u %s itself, and its group has no %s to pair with "
            "it (a send to the calling rank and its receive are made in one "
            "group)",
            comm_kind_name(a[i].mine.kind), a[i].comm->rank,
            send ? "sends to" : "receives from", send ? "receive" : "send");
    }
}
