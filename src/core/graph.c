/* Graphs. The client records every captured dispatch with the
 * allocations it reads and writes (for pins and the failure store). A
 * backend with begin_capture records a hardware graph at the same time
 * (CUDA stream capture) and replays that; otherwise a replay hands the
 * recorded dispatches to the backend again without the launch path. The
 * graph pins every allocation it names until it is destroyed.
 *
 * A capture also records collectives of communicators in one process
 * (comm.c records them once every rank's call agreed). A software replay
 * re-issues each through the rendezvous, as a call: it meets the peers'
 * replays, and once a replay fails, its remaining collectives are posted
 * as refusals so that the peers answer the error instead of waiting. A
 * hardware graph holds the backend's captured call (NCCL's kernels); its
 * replay meets the peers' at each collective first and launches only
 * when every one agreed, so no rank's device work waits for a peer's
 * replay that was refused.
 *
 * Collectives of communicators between processes are recorded too (the
 * backend's engine checked that every rank captures them, or captured
 * its own part). A software replay issues each as a call; a hardware
 * replay cannot meet peers in other processes, so the backend follows
 * its device work as it follows a call (its watchdog aborts the
 * communicator when the replay's work does not end within the timeout
 * after it started) and the graph's outputs carry that failure. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "base/grow.h"
#include "core/client_internal.h"
#include "core/trace.h"
#include "cubert/comm.h"

typedef enum entry_kind { ENTRY_LAUNCH, ENTRY_COLLECTIVE } entry_kind;

typedef struct graph_entry {
    entry_kind kind;
    cube_dispatch dispatch;
    cube_binding count_binding; /* dispatch.count_buffer points here */
    /* ENTRY_COLLECTIVE: the rank's call (its communicator held until the
     * graph goes) */
    core_recorded_call coll;
} graph_entry;

/* A set of allocations, each named once, in the order they were added
 * (replays walk them in that order). A capture may name thousands, so
 * membership goes through an open-addressing table of the same pointers,
 * at most half full. */
typedef struct alloc_set {
    core_alloc **items;
    size_t count, cap;
    core_alloc **slots; /* NULL: empty; nslots a power of two, or 0 */
    size_t nslots;
} alloc_set;

struct core_graph {
    cube_graph_id id;
    uint64_t hardware;            /* the backend's graph, or 0 */
    core_stream *hardware_stream; /* where it was captured */
    uint32_t refs; /* the registry's, plus one per replay running; under
                      graphs_lock */
    graph_entry *entries;
    size_t count, cap;
    alloc_set pinned; /* every allocation named: one pin each */
    alloc_set reads;  /* inputs, checked before a replay */
    alloc_set writes; /* OUT and INOUT: marked when a replay fails */
    alloc_set clears; /* OUT: trusted again when a replay lands */
    /* OUT of launches with a dynamic count: trusted again when a replay
     * lands and every such launch ran (a zero count rewrites nothing). */
    alloc_set dynamic_clears;
    size_t collectives; /* entries of ENTRY_COLLECTIVE */
    /* The backend captured them (a hardware graph runs them); set by the
     * capture's first collective. */
    int hardware_collectives;
    core_graph *next;
};

static atomic_uint_fast64_t next_graph_id = 1;

/* The slot of `a` in a table of `nslots` (a power of two): where it is,
 * or the empty one where it would go. */
static size_t set_slot(core_alloc *const *slots, size_t nslots,
                       const core_alloc *a)
{
    uint64_t h = (uint64_t)(uintptr_t)a * 0x9E3779B97F4A7C15ull;
    size_t i = (size_t)(h ^ (h >> 32)) & (nslots - 1);
    while (slots[i] && slots[i] != a)
        i = (i + 1) & (nslots - 1);
    return i;
}

static int set_has(const alloc_set *s, const core_alloc *a)
{
    return s->nslots && s->slots[set_slot(s->slots, s->nslots, a)] == a;
}

/* Makes room for one more item, in the list and in the table (kept at
 * most half full). -1, the set unchanged, when memory runs out. */
static int set_reserve(alloc_set *s)
{
    core_alloc **grown =
        cube_grow(s->items, s->count, &s->cap, sizeof(core_alloc *), 8);
    if (!grown)
        return -1;
    s->items = grown;
    if ((s->count + 1) * 2 <= s->nslots)
        return 0;
    size_t nslots = s->nslots ? s->nslots * 2 : 16;
    core_alloc **slots = calloc(nslots, sizeof(core_alloc *));
    if (!slots)
        return -1;
    for (size_t i = 0; i < s->count; i++)
        slots[set_slot(slots, nslots, s->items[i])] = s->items[i];
    free(s->slots);
    s->slots = slots;
    s->nslots = nslots;
    return 0;
}

/* 1: `a` added; 0: it was there already; -1: out of memory, the set
 * unchanged. */
static int set_add(alloc_set *s, core_alloc *a)
{
    if (set_has(s, a))
        return 0;
    if (set_reserve(s) != 0)
        return -1;
    s->slots[set_slot(s->slots, s->nslots, a)] = a;
    s->items[s->count++] = a;
    return 1;
}

static void set_free(alloc_set *s)
{
    free(s->items);
    free(s->slots);
}

static void graph_free(cube_client *c, core_graph *g)
{
    /* The backend waits for replays still running before its graph goes;
     * only then may the buffers be unpinned. */
    if (g->hardware)
        c->vt->graph_destroy(c->server, &g->hardware_stream->base, g->hardware);
    for (size_t i = 0; i < g->pinned.count; i++)
        core_alloc_unpin(c, g->pinned.items[i]);
    for (size_t i = 0; i < g->count; i++)
        if (g->entries[i].kind == ENTRY_COLLECTIVE)
            core_comm_release(g->entries[i].coll.comm, g->hardware_collectives);
    set_free(&g->pinned);
    set_free(&g->reads);
    set_free(&g->writes);
    set_free(&g->clears);
    set_free(&g->dynamic_clears);
    free(g->entries);
    free(g);
}

void core_graph_abort(cube_client *c, core_graph *g)
{
    if (g)
        graph_free(c, g);
}

/* Pins `a` into the graph (once). */
static cube_error *pin(cube_client *c, core_graph *g, core_alloc *a)
{
    int added = set_add(&g->pinned, a);
    if (added < 0)
        return cube_error_new(CUBE_ERR_OUT_OF_MEMORY, "graph capture");
    if (added)
        core_alloc_pin(c, a);
    return NULL;
}

/* Makes room for one more entry and files the allocations it reads,
 * writes and fully rewrites (`dynamic`: only when it ran). */
static cube_error *note(cube_client *c, core_graph *g, core_alloc *const *read,
                        size_t nread, core_alloc *const *written,
                        size_t nwritten, core_alloc *const *cleared,
                        size_t ncleared, int dynamic)
{
    graph_entry *grown =
        cube_grow(g->entries, g->count, &g->cap, sizeof *grown, 16);
    if (!grown)
        return cube_error_new(CUBE_ERR_OUT_OF_MEMORY, "graph capture");
    g->entries = grown;
    cube_error *err = NULL;
    for (size_t i = 0; i < nread && !err; i++)
        err = pin(c, g, read[i]);
    for (size_t i = 0; i < nwritten && !err; i++)
        err = pin(c, g, written[i]);
    /* An input is what the graph reads before it rewrites it: a buffer an
     * earlier recorded launch fully wrote (CUBE_OUT) holds the graph's own
     * result by then, whatever the failure store said before the replay. */
    for (size_t i = 0; i < nread && !err; i++)
        if (!set_has(&g->clears, read[i]) && set_add(&g->reads, read[i]) < 0)
            err = cube_error_new(CUBE_ERR_OUT_OF_MEMORY, "graph capture");
    for (size_t i = 0; i < nwritten && !err; i++)
        if (set_add(&g->writes, written[i]) < 0)
            err = cube_error_new(CUBE_ERR_OUT_OF_MEMORY, "graph capture");
    /* A dynamic count may name zero cubes at a replay, which then
     * rewrites nothing: its outputs are not the graph's own. */
    alloc_set *clears = dynamic ? &g->dynamic_clears : &g->clears;
    for (size_t i = 0; i < ncleared && !err; i++)
        if (set_add(clears, cleared[i]) < 0)
            err = cube_error_new(CUBE_ERR_OUT_OF_MEMORY, "graph capture");
    return err;
}

cube_error *core_graph_record(cube_client *c, core_stream *s,
                              const cube_dispatch *d, core_alloc *const *read,
                              size_t nread, core_alloc *const *written,
                              size_t nwritten, core_alloc *const *cleared,
                              size_t ncleared)
{
    core_graph *g = s->capture;
    cube_error *err = note(c, g, read, nread, written, nwritten, cleared,
                           ncleared, d->count_buffer != NULL);
    if (err)
        return err;
    graph_entry *e = &g->entries[g->count++];
    memset(e, 0, sizeof *e);
    e->kind = ENTRY_LAUNCH;
    e->dispatch = *d;
    e->dispatch.ran_nothing = NULL; /* the launch's: set at each replay */
    if (d->count_buffer) {
        e->count_binding = *d->count_buffer;
        e->dispatch.count_buffer = &e->count_binding;
    }
    return NULL;
}

cube_error *core_graph_record_collective(cube_client *c, core_stream *s,
                                         cube_comm *comm,
                                         const cube_collective *call,
                                         core_alloc *src, core_alloc *dst,
                                         int dst_whole, int hardware,
                                         uint64_t group)
{
    core_graph *g = s->capture;
    /* Like a launch: the source read, the destination written, and
     * trusted again when a replay lands if the call rewrites all of it. */
    cube_error *err = note(c, g, &src, src ? 1 : 0, &dst, dst ? 1 : 0, &dst,
                           dst && dst_whole ? 1 : 0, 0);
    if (err)
        return err;
    graph_entry *e = &g->entries[g->count++];
    memset(e, 0, sizeof *e);
    e->kind = ENTRY_COLLECTIVE;
    e->coll.comm = comm;
    e->coll.call = *call;
    e->coll.dst = dst;
    e->coll.group = group;
    core_comm_hold(comm, hardware);
    g->hardware_collectives = hardware;
    g->collectives++;
    return NULL;
}

static cube_error *graph_prepare_call(cube_client *c)
{
    CORE_CHECK_CLIENT(c, "cube_graph_prepare");
    core_stream *s = NULL;
    cube_error *err = core_stream_enter_uncaptured(c, "cube_graph_prepare", &s);
    if (err)
        return err;
    if (c->vt->graph_prepare)
        err = c->vt->graph_prepare(c->server, &s->base);
    if (!err) {
        /* From here the stream allocates from its persistent pool, so the
         * warm-up leaves there what the capture will reuse. */
        s->prepared = 1;
        err = core_stream_sync_persistent(c, s);
        if (err)
            s->prepared = 0;
    }
    core_stream_unlock(s);
    return err;
}

cube_error *cube_graph_prepare(cube_client *c)
{
    CORE_CALL(c, "cube_graph_prepare", graph_prepare_call(c));
}

static cube_error *graph_begin_call(cube_client *c)
{
    CORE_CHECK_CLIENT(c, "cube_graph_begin");
    core_stream *s = NULL;
    cube_error *err = core_stream_enter(c, &s);
    if (err)
        return err;
    if (s->capture)
        err = cube_error_new(CUBE_ERR_GRAPH_STATE,
                             "cube_graph_begin: stream 0x%016llx is already "
                             "capturing; end that capture first",
                             (unsigned long long)s->base.id);
    else if (!s->prepared)
        err = cube_error_new(CUBE_ERR_GRAPH_STATE,
                             "cube_graph_begin: stream 0x%016llx was not "
                             "prepared; call cube_graph_prepare (and warm "
                             "up) first",
                             (unsigned long long)s->base.id);
    if (!err) {
        s->capture = calloc(1, sizeof *s->capture);
        if (!s->capture)
            err = cube_error_new(CUBE_ERR_OUT_OF_MEMORY, "cube_graph_begin");
    }
    if (!err && c->vt->begin_capture) {
        err = c->vt->begin_capture(c->server, &s->base);
        if (err) {
            free(s->capture);
            s->capture = NULL;
        }
    }
    if (!err)
        s->capture_client = c;
    core_stream_unlock(s);
    return err;
}

cube_error *cube_graph_begin(cube_client *c)
{
    CORE_CALL(c, "cube_graph_begin", graph_begin_call(c));
}

static cube_error *graph_end_call(cube_client *c, cube_graph_id *out)
{
    if (!c || !out)
        return cube_error_null_argument("cube_graph_end", c ? "out" : "client");
    *out = 0;
    core_stream *s = NULL;
    cube_error *err = core_stream_enter(c, &s);
    if (err)
        return err;
    /* Another client's capture on a shared stream is not this one's to
     * end. */
    core_graph *g = s->capture_client == c ? s->capture : NULL;
    cube_error *hw_err = NULL;
    if (g) {
        /* A refused end changes nothing; a capture that ends disarms. */
        s->capture = NULL;
        s->capture_client = NULL;
        s->prepared = 0;
        if (c->vt->end_capture) {
            hw_err = c->vt->end_capture(c->server, &s->base, &g->hardware);
            g->hardware_stream = s;
        }
        cube_error *mode = core_stream_sync_persistent(c, s);
        if (mode) {
            cube_log_write(CUBE_LOG_WARN, "memory",
                           "cube_graph_end: could not leave persistent "
                           "allocation: %s",
                           cube_error_message(mode));
            cube_error_free(mode);
        }
    }
    core_stream_unlock(s);
    if (!g)
        return cube_error_new(CUBE_ERR_GRAPH_STATE,
                              "cube_graph_end: the calling stream is not "
                              "capturing");
    if (hw_err) {
        /* The capture is over either way; nothing was run. */
        g->hardware = 0;
        graph_free(c, g);
        return cube_error_prefix(hw_err, "cube_graph_end");
    }
    g->id = atomic_fetch_add(&next_graph_id, 1);
    g->refs = 1;
    cube_mutex_lock(&c->graphs_lock);
    g->next = c->graphs;
    c->graphs = g;
    cube_mutex_unlock(&c->graphs_lock);
    cube_log_write(CUBE_LOG_DEBUG, "launch",
                   "graph %llu: %zu launches, %zu buffers pinned",
                   (unsigned long long)g->id, g->count, g->pinned.count);
    *out = g->id;
    return NULL;
}

cube_error *cube_graph_end(cube_client *c, cube_graph_id *out)
{
    CORE_CALL(c, "cube_graph_end", graph_end_call(c, out));
}

/* The live graph `id`, with a reference taken; NULL when there is none. */
static core_graph *acquire(cube_client *c, cube_graph_id id)
{
    cube_mutex_lock(&c->graphs_lock);
    core_graph *g = c->graphs;
    while (g && g->id != id)
        g = g->next;
    if (g)
        g->refs++;
    cube_mutex_unlock(&c->graphs_lock);
    return g;
}

static void release(cube_client *c, core_graph *g)
{
    cube_mutex_lock(&c->graphs_lock);
    int last = --g->refs == 0;
    cube_mutex_unlock(&c->graphs_lock);
    if (last)
        graph_free(c, g);
}

/* CUBE_ERR_NOT_FOUND for an id that names no live graph. */
static cube_error *not_found(const char *fn, cube_graph_id id)
{
    return cube_error_new(CUBE_ERR_NOT_FOUND,
                          "%s: graph %llu does not exist (never ended, or "
                          "destroyed)",
                          fn, (unsigned long long)id);
}

/* The end of the run of entries from collective `i` that were recorded
 * as one group (just i when it was alone): they replay together. */
static size_t run_end(const core_graph *g, size_t i)
{
    size_t j = i + 1;
    uint64_t tag = g->entries[i].coll.group;
    while (tag && j < g->count && g->entries[j].kind == ENTRY_COLLECTIVE &&
           g->entries[j].coll.group == tag)
        j++;
    return j;
}

/* Meets the peers at the collectives of entries [i, j), one run. */
static cube_error *replay_run(const core_graph *g, size_t i, size_t j,
                              cube_error *refusal, int agree_only)
{
    return core_comm_replay_calls(&g->entries[i].coll, j - i,
                                  sizeof(graph_entry), refusal, agree_only);
}

/* Posts the collectives from entry `from` on as refusals of `err`, run by
 * run, so that the peers answer it rather than wait. */
static void refuse_from(const core_graph *g, size_t from, const cube_error *err,
                        int agree_only)
{
    for (size_t i = from; i < g->count;) {
        if (g->entries[i].kind != ENTRY_COLLECTIVE) {
            i++;
            continue;
        }
        size_t j = run_end(g, i);
        cube_error_ignore(
            replay_run(g, i, j, cube_error_clone(err), agree_only),
            "the peers are told; the replay failed already");
        i = j;
    }
}

/* A hardware graph's collectives, in order: each meets the peers'
 * replays without issuing. On a refusal the ones after it are posted as
 * refusals too, so that the peers answer it rather than wait; *reached
 * is the entries judged. */
static cube_error *agree_all(core_graph *g, size_t *reached)
{
    cube_error *err = NULL;
    size_t i = 0;
    while (i < g->count && !err) {
        if (g->entries[i].kind != ENTRY_COLLECTIVE) {
            i++;
            continue;
        }
        size_t j = run_end(g, i);
        err = replay_run(g, i, j, NULL, 1);
        i = j;
    }
    if (err)
        refuse_from(g, i, err, 1);
    *reached = g->count;
    return err;
}

/* Aborts each communicator the graph's collectives use (once each). */
static void abort_comms(core_graph *g)
{
    for (size_t i = 0; i < g->count; i++) {
        if (g->entries[i].kind != ENTRY_COLLECTIVE)
            continue;
        int seen = 0;
        for (size_t k = 0; k < i && !seen; k++)
            seen = g->entries[k].kind == ENTRY_COLLECTIVE &&
                   g->entries[k].coll.comm == g->entries[i].coll.comm;
        if (!seen)
            cube_error_ignore(cube_comm_abort(g->entries[i].coll.comm),
                              "the replay failed already; the abort only "
                              "releases the peers");
    }
}

/* Launches a hardware graph. The calls between processes it holds are
 * followed on the device as calls are: each communicator's watch starts
 * before the launch and ends after it, so that a peer that never comes
 * makes the backend abort the communicator after the timeout, and the
 * graph's outputs carry the failure. */
static cube_error *launch_hardware(cube_client *c, core_stream *s,
                                   const core_graph *g) CUBE_REQUIRES(s->lock)
{
    size_t remote = 0;
    for (size_t i = 0; i < g->count; i++)
        remote += g->entries[i].kind == ENTRY_COLLECTIVE &&
                  core_comm_remote(g->entries[i].coll.comm);
    if (!remote)
        return c->vt->replay(c->server, &s->base, g->hardware);
    core_replay_watch **w = calloc(remote, sizeof(core_replay_watch *));
    if (!w)
        return cube_error_new(CUBE_ERR_OUT_OF_MEMORY, "cube_graph_replay");
    cube_error *err = NULL;
    size_t n = 0;
    for (size_t i = 0; i < g->count && !err; i++) {
        const graph_entry *e = &g->entries[i];
        if (e->kind != ENTRY_COLLECTIVE || !core_comm_remote(e->coll.comm))
            continue;
        int seen = 0;
        for (size_t k = 0; k < i && !seen; k++)
            seen = g->entries[k].kind == ENTRY_COLLECTIVE &&
                   g->entries[k].coll.comm == e->coll.comm;
        if (!seen)
            err = core_comm_replay_begin(e->coll.comm, s, g->writes.items,
                                         g->writes.count, &w[n++]);
    }
    if (!err)
        err = c->vt->replay(c->server, &s->base, g->hardware);
    for (size_t i = 0; i < n; i++) {
        cube_error *e = core_comm_replay_end(w[i], s, !err);
        if (!err)
            err = e;
        else
            cube_error_ignore(e, "the replay's first error is reported");
    }
    free(w);
    return err;
}

/* Hands recorded entry `i` to the backend again; *next is the entry
 * after it. One with a dynamic count goes as a copy that answers into
 * *ran_nothing (replays of one graph may run on several streams at once:
 * the entry is not written). A collective (with the rest of its group)
 * meets the peers' replays without the stream entered (the wait may be
 * long, and the call enters it itself). */
static cube_error *replay_entry(cube_client *c, core_stream *s,
                                const core_graph *g, size_t i, size_t *next,
                                int *ran_nothing) CUBE_REQUIRES(s->lock)
{
    const graph_entry *e = &g->entries[i];
    *next = i + 1;
    if (e->kind == ENTRY_COLLECTIVE) {
        *next = run_end(g, i);
        core_stream_unlock(s);
        cube_error *err = replay_run(g, i, *next, NULL, 0);
        core_stream_lock(s);
        return err;
    }
    if (!e->dispatch.count_buffer)
        return c->vt->launch(c->server, &s->base, &e->dispatch);
    cube_dispatch d = e->dispatch;
    d.ran_nothing = ran_nothing;
    /* The error is a fresh one, not derived from d. */
    // cppcheck-suppress returnDanglingLifetime
    return c->vt->launch(c->server, &s->base, &d);
}

/* Why a replay on `s` is refused before anything runs: a capturing
 * stream first, whatever the id; then an id that names no graph. A
 * refusal runs nothing and fails nothing. */
static cube_error *replay_refusal(const core_stream *s, const core_graph *g,
                                  cube_graph_id id) CUBE_REQUIRES(s->lock)
{
    if (s->capture)
        return cube_error_new(CUBE_ERR_GRAPH_STATE,
                              "cube_graph_replay: the calling stream is "
                              "capturing; replay after cube_graph_end");
    if (!g)
        return not_found("cube_graph_replay", id);
    return NULL;
}

/* Inputs first: a replay over bytes that cannot be trusted would hand
 * its outputs the same problem. */
static cube_error *check_inputs(cube_client *c, const core_graph *g,
                                cube_graph_id id)
{
    cube_error *err = NULL;
    for (size_t i = 0; i < g->reads.count && !err; i++) {
        cube_error *f = core_failure_get(c, g->reads.items[i]);
        if (f)
            err = cube_error_wrap(f, CUBE_ERR_SEVERAL,
                                  "cube_graph_replay(%llu): an input "
                                  "buffer cannot be trusted",
                                  (unsigned long long)id);
    }
    return err;
}

/* How far a replay came, for what it fails or trusts again after. */
typedef struct replay_progress {
    int ran_nothing; /* a dynamic count of zero cubes, at least one */
    size_t reached;  /* entries handed on, the failing one included */
    int agreed;      /* a hardware graph's collectives met the peers' */
} replay_progress;

/* A hardware graph's replay; the entries it ran (all of them, or none). */
static size_t replay_hardware(cube_client *c, core_stream *s, core_graph *g,
                              replay_progress *pr, cube_error **err)
    CUBE_REQUIRES(s->lock)
{
    if (g->collectives) {
        /* The graph's device work waits for the peers' matching
         * kernels: launch it only once every rank's replay reached
         * each of its collectives, in order. */
        core_stream_unlock(s);
        *err = agree_all(g, &pr->reached);
        pr->agreed = 1;
        core_stream_lock(s);
        if (*err)
            return 0;
    }
    *err = launch_hardware(c, s, g);
    if (*err && g->collectives) {
        /* Every peer agreed and launches its part, which would
         * wait for this rank's forever: abort their
         * communicators so that their work ends (with errors). */
        core_stream_unlock(s);
        abort_comms(g);
        core_stream_lock(s);
    }
    return *err ? 0 : g->count;
}

/* Runs the graph's entries on `s`, hardware or software, and traces the
 * replay. */
static cube_error *replay_entries(cube_client *c, core_stream *s, core_graph *g,
                                  cube_graph_id id, replay_progress *pr)
    CUBE_REQUIRES(s->lock)
{
    cube_error *err = NULL;
    uint64_t t0 = core_trace_on() ? core_clock_ns() : 0;
    size_t done = 0;
    if (g->hardware)
        done = replay_hardware(c, s, g, pr, &err);
    while (!g->hardware && done < g->count && !err) {
        size_t next = done + 1;
        err = replay_entry(c, s, g, done, &next, &pr->ran_nothing);
        done = next; /* the failing entry (or run) counts as reached */
    }
    pr->reached = done;
    /* A replayed collective counts itself, as the call it is; a
     * hardware graph's run as part of it. */
    if (!err)
        s->launches += g->hardware ? g->count : g->count - g->collectives;
    if (t0) {
        char args[64];
        snprintf(args, sizeof args, "{\"graph\":%llu,\"launches\":%zu}",
                 (unsigned long long)id, done);
        core_trace_span("launch", "graph replay", s->base.id, t0,
                        core_clock_ns(), args);
    }
    return err;
}

/* After the replay, outside the stream: a failure marks the graph's
 * outputs; a replay that landed trusts again what it fully rewrote. */
static void replay_settle(cube_client *c, const core_graph *g,
                          const cube_error *err, int failed, int ran_nothing)
{
    if (failed) {
        for (size_t i = 0; i < g->writes.count; i++)
            core_failure_record(c, g->writes.items[i], err);
    } else if (!err) {
        for (size_t i = 0; i < g->clears.count; i++)
            core_failure_clear(c, g->clears.items[i]);
        for (size_t i = 0; i < g->dynamic_clears.count && !ran_nothing; i++)
            core_failure_clear(c, g->dynamic_clears.items[i]);
    }
}

static cube_error *graph_replay_call(cube_client *c, cube_graph_id id)
{
    CORE_CHECK_CLIENT(c, "cube_graph_replay");
    core_stream *s = NULL;
    cube_error *err = core_stream_get(c, &s);
    if (err)
        return err;
    /* Taken outside the stream's lock and given back outside it: the last
     * reference frees the graph, which can wait for the device. */
    core_graph *g = acquire(c, id);
    core_stream_lock(s);
    err = replay_refusal(s, g, id);
    if (err || core_dry_run_active(c)) {
        core_stream_unlock(s);
        if (g)
            release(c, g);
        return err;
    }
    err = check_inputs(c, g, id);
    replay_progress pr = {0, 0, 0};
    if (!err)
        err = replay_entries(c, s, g, id, &pr);
    /* The peers wait for the collectives this replay will not reach: each
     * is posted as a refusal, so every rank answers the error. */
    if (err && g->collectives && !pr.agreed) {
        core_stream_unlock(s);
        refuse_from(g, pr.reached, err, 0);
        core_stream_lock(s);
    }
    /* A refusal from the backend ran nothing and failed nothing (a
     * collective's GRAPH_STATE, a peer capturing, came after the launches
     * before it ran). */
    int failed =
        err && (cube_error_code(err) != CUBE_ERR_GRAPH_STATE || g->collectives);
    if (failed)
        core_stream_note_failure(s, err);
    core_stream_unlock(s);
    core_fault_note(c, err);
    replay_settle(c, g, err, failed, pr.ran_nothing);
    release(c, g);
    return err;
}

cube_error *cube_graph_replay(cube_client *c, cube_graph_id id)
{
    CORE_CALL(c, "cube_graph_replay", graph_replay_call(c, id));
}

static cube_error *graph_destroy_call(cube_client *c, cube_graph_id id)
{
    if (!c)
        return cube_error_null_argument("cube_graph_destroy", "client");
    cube_mutex_lock(&c->graphs_lock);
    core_graph **p = &c->graphs;
    while (*p && (*p)->id != id)
        p = &(*p)->next;
    core_graph *g = *p;
    int last = 0;
    if (g) {
        *p = g->next;
        /* Replays in progress hold references: the last one frees it. */
        last = --g->refs == 0;
    }
    cube_mutex_unlock(&c->graphs_lock);
    if (!g)
        return not_found("cube_graph_destroy", id);
    if (last)
        graph_free(c, g);
    return NULL;
}

cube_error *cube_graph_destroy(cube_client *c, cube_graph_id id)
{
    CORE_CALL(c, "cube_graph_destroy", graph_destroy_call(c, id));
}

void core_graphs_destroy(cube_client *c)
{
    core_graph *g = c->graphs;
    c->graphs = NULL;
    while (g) {
        core_graph *next = g->next;
        graph_free(c, g);
        g = next;
    }
}
