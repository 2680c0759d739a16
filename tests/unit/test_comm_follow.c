/* The core's following of collectives between processes (core/comm.c): a
 * backend whose part of a call finishes on the device later hands out a
 * ticket (cube_collective_set.ticket); the core keeps the call's
 * destination pinned and asks the backend how the call ended
 * (the poll slot) at the rank's next call, before a read's claim check,
 * after a read's wait, in cube_sync and cube_check, recording a failure on
 * the destination; a destroy waits for calls still running, then marks
 * their destinations.
 *
 * Graphs: such a call made on a capturing stream is checked by the
 * engine (every rank captures) and recorded; a software replay issues it
 * as a call, followed the same way and marking its destination; a
 * hardware replay (scripted begin_capture/replay here) is bracketed by
 * the replay_begin/end slots and followed as one call whose failure marks
 * every buffer the graph writes.
 *
 * The backend here is the null backend with its communicator table
 * replaced by a scripted engine: each ticket's outcome (running,
 * finished, failed) is set by the test. On CUDA the same contract is
 * checked through NCCL's watchdog with a fake NCCL (tests/gpu). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <string.h>
#include <time.h>

#include "core/client_internal.h"
#include "cubert/comm.h"
#include "cubert/cubert.h"

enum { RUNNING = 0, FINISHED = 1, FAILED = 2 };
#define TICKETS 64

/* The scripted engine of the one rank. */
typedef struct engine {
    uint64_t next;
    int outcome[TICKETS];
    unsigned polls, issued, destroyed;
    unsigned captured, refusals; /* calls checked in a capture; refused */
    int peer_not_capturing;      /* a capture answers GRAPH_STATE */
    int aborted;                 /* replay_begin answers ABORTED */
    unsigned replays, replay_begins, replay_ends, replay_cancels;
} engine;

/* The rank as the core holds it: the engine behind the base. */
typedef struct scripted_rank {
    cube_backend_comm base;
    engine *e;
} scripted_rank;

static engine eng;
static scripted_rank eng_rank;
static cube_server_vtable scripted;
static cube_comm_vtable scripted_comm;

static engine *engine_of(cube_backend_comm *comm)
{
    assert_ptr_equal(comm, &eng_rank.base);
    return ((scripted_rank *)comm)->e;
}

static cube_error *e_init_rank(cube_server *server, const unsigned char *id,
                               uint32_t nranks, uint32_t rank,
                               uint64_t timeout_ms, cube_backend_comm **out)
{
    (void)server, (void)id, (void)nranks, (void)rank, (void)timeout_ms;
    memset(&eng, 0, sizeof eng);
    eng_rank.base.vt = &scripted_comm;
    eng_rank.e = &eng;
    *out = &eng_rank.base;
    return NULL;
}

static void e_destroy(cube_server *server, cube_backend_comm *comm)
{
    (void)server;
    engine_of(comm)->destroyed++;
}

static cube_error *e_collective(cube_server *server, cube_server_stream *stream,
                                cube_backend_comm *comm,
                                const cube_collective_set *set)
{
    (void)server, (void)stream;
    engine *e = engine_of(comm);
    assert_true(set->remote);
    if (set->refused || set->failed) {
        e->refusals++;
        return NULL;
    }
    if (set->capturing) {
        assert_null(set->ticket); /* a capture runs nothing to follow */
        if (e->peer_not_capturing)
            return cube_error_new(CUBE_ERR_GRAPH_STATE,
                                  "another rank does not capture");
        e->captured++;
        return NULL;
    }
    e->issued++;
    assert_non_null(set->ticket);
    assert_true(e->next + 1 < TICKETS);
    *set->ticket = ++e->next;
    e->outcome[e->next] = RUNNING;
    return NULL;
}

static cube_error *e_poll(cube_server *server, cube_backend_comm *comm,
                          uint64_t ticket, int *done)
{
    (void)server;
    engine *e = engine_of(comm);
    e->polls++;
    assert_true(ticket > 0 && ticket <= e->next);
    *done = e->outcome[ticket] != RUNNING;
    return e->outcome[ticket] == FAILED
               ? cube_error_new(CUBE_ERR_TIMEOUT,
                                "ran on the device past the timeout")
               : NULL;
}

/* A hardware graph, as a backend with stream capture keeps one: only
 * its replays are counted. */
static cube_error *h_begin_capture(cube_server *server,
                                   cube_server_stream *stream)
{
    (void)server, (void)stream;
    return NULL;
}

static cube_error *h_end_capture(cube_server *server,
                                 cube_server_stream *stream, uint64_t *graph)
{
    (void)server, (void)stream;
    *graph = 1;
    return NULL;
}

static cube_error *h_replay(cube_server *server, cube_server_stream *stream,
                            uint64_t graph)
{
    (void)server, (void)stream;
    assert_int_equal(graph, 1);
    eng.replays++;
    return NULL;
}

static void h_graph_destroy(cube_server *server, cube_server_stream *stream,
                            uint64_t graph)
{
    (void)server, (void)stream, (void)graph;
}

static cube_error *h_replay_begin(cube_server *server,
                                  cube_server_stream *stream,
                                  cube_backend_comm *comm, uint64_t *ticket)
{
    (void)server, (void)stream;
    engine *e = engine_of(comm);
    if (e->aborted)
        return cube_error_new(CUBE_ERR_ABORTED, "aborted");
    e->replay_begins++;
    assert_true(e->next + 1 < TICKETS);
    *ticket = ++e->next;
    e->outcome[e->next] = RUNNING;
    return NULL;
}

static cube_error *h_replay_end(cube_server *server, cube_server_stream *stream,
                                cube_backend_comm *comm, uint64_t ticket,
                                int launched)
{
    (void)server, (void)stream;
    engine *e = engine_of(comm);
    assert_int_equal(ticket, e->next);
    if (launched)
        e->replay_ends++;
    else {
        e->replay_cancels++;
        e->outcome[ticket] = FINISHED;
    }
    return NULL;
}

typedef struct fixture {
    cube_client *c;
    cube_comm *comm;
    cube_handle src, dst;
} fixture;

static cube_handle make(cube_client *c, float value)
{
    float host[64];
    for (int i = 0; i < 64; i++)
        host[i] = value;
    cube_handle h = {0};
    assert_null(cube_create(c, host, sizeof host, &h));
    return h;
}

static int open_rank(void **state, int hardware_graphs)
{
    static fixture f;
    memset(&f, 0, sizeof f);
    cube_client_options o = cube_client_options_default();
    assert_null(cube_client_open("null", &o, &f.c));
    scripted = *f.c->vt;
    memset(&scripted_comm, 0, sizeof scripted_comm);
    scripted_comm.init_rank = e_init_rank;
    scripted_comm.destroy = e_destroy;
    scripted_comm.collective = e_collective;
    scripted_comm.poll = e_poll;
    if (hardware_graphs) {
        scripted.begin_capture = h_begin_capture;
        scripted.end_capture = h_end_capture;
        scripted.replay = h_replay;
        scripted.graph_destroy = h_graph_destroy;
        scripted_comm.replay_begin = h_replay_begin;
        scripted_comm.replay_end = h_replay_end;
    }
    f.c->vt = &scripted;
    f.c->comm = &scripted_comm;
    /* An id as cube_comm_id_new makes them: magic, backend, payload. */
    cube_comm_id id;
    memset(&id, 0, sizeof id);
    memcpy(id.bytes, "CBC1", 4);
    memcpy(id.bytes + 4, "null", 4);
    cube_comm_options co = cube_comm_options_default();
    co.timeout_ms = 20;
    assert_null(cube_comm_init_rank(f.c, &id, 2, 0, &co, &f.comm));
    f.src = make(f.c, 1.0f);
    f.dst = make(f.c, 2.0f);
    *state = &f;
    return 0;
}

static int setup(void **state)
{
    return open_rank(state, 0);
}

static int setup_hardware(void **state)
{
    return open_rank(state, 1);
}

static int teardown(void **state)
{
    fixture *f = *state;
    if (f->comm) {
        /* Nothing may be left running: a destroy would wait for it. */
        for (uint64_t t = 1; t <= eng.next; t++)
            if (eng.outcome[t] == RUNNING)
                eng.outcome[t] = FINISHED;
        cube_comm_destroy(f->comm);
    }
    assert_null(cube_handle_release(f->c, f->src));
    assert_null(cube_handle_release(f->c, f->dst));
    assert_int_equal(atomic_load(&f->c->comm_inflight), 0);
    cube_client_close(f->c);
    return 0;
}

static cube_error *reduce(fixture *f)
{
    return cube_all_reduce(f->comm, f->src, f->dst, 64, CUBE_DTYPE_F32,
                           CUBE_REDUCE_SUM);
}

/* err is CUBE_ERR_SEVERAL whose first cause is `code`, naming `needle`. */
static void expect_cause(cube_error *err, cube_code code, const char *needle)
{
    assert_non_null(err);
    assert_int_equal(cube_error_code(err), CUBE_ERR_SEVERAL);
    assert_true(cube_error_cause_count(err) >= 1);
    const cube_error *cause = cube_error_cause(err, 0);
    assert_int_equal(cube_error_code(cause), code);
    if (!strstr(cube_error_message(cause), needle))
        fail_msg("'%s' does not name '%s'", cube_error_message(cause), needle);
    cube_error_free(err);
}

/* A call still running is not a failure; once the backend says it failed,
 * its destination carries it (check, read, sync), named by the call. */
static void test_a_failed_call_marks_its_destination(void **state)
{
    fixture *f = *state;
    assert_null(reduce(f));
    assert_int_equal(eng.next, 1);
    assert_int_equal(atomic_load(&f->c->comm_inflight), 1);
    assert_null(cube_check(f->c, &f->dst, 1));
    eng.outcome[1] = FAILED;
    expect_cause(cube_check(f->c, &f->dst, 1), CUBE_ERR_TIMEOUT,
                 "cube_all_reduce");
    assert_int_equal(atomic_load(&f->c->comm_inflight), 0);
    float got[64];
    expect_cause(cube_read_all(f->c, f->dst, got, sizeof got), CUBE_ERR_TIMEOUT,
                 "past the timeout");
    expect_cause(cube_sync(f->c, &f->dst, 1), CUBE_ERR_TIMEOUT, "timeout");
    /* The source is not the call's to spoil. */
    assert_null(cube_check(f->c, &f->src, 1));
    /* A full write trusts it again. */
    float host[64] = {0};
    assert_null(cube_write_all(f->c, f->dst, host, sizeof host));
    assert_null(cube_check(f->c, &f->dst, 1));
}

/* A read learns of a failure the backend reported since the last look,
 * before it copies a byte. */
static void test_a_read_asks_first(void **state)
{
    fixture *f = *state;
    assert_null(reduce(f));
    eng.outcome[1] = FAILED;
    unsigned polls = eng.polls;
    float got[64];
    memset(got, 0x5a, sizeof got);
    expect_cause(cube_read_all(f->c, f->dst, got, sizeof got), CUBE_ERR_TIMEOUT,
                 "cube_all_reduce");
    assert_true(eng.polls > polls);
    for (int i = 0; i < 64; i++)
        assert_true(got[i] != 2.0f); /* refused: nothing copied */
}

/* A call that finished is dropped (its pin with it); the rank's next
 * call settles the earlier ones first, and, rewriting the whole
 * destination, trusts it again (as a launch would). */
static void test_finished_calls_are_dropped_at_the_next_call(void **state)
{
    fixture *f = *state;
    cube_handle other = make(f->c, 3.0f);
    assert_null(reduce(f));
    assert_null(cube_all_reduce(f->comm, f->src, other, 64, CUBE_DTYPE_F32,
                                CUBE_REDUCE_SUM));
    assert_int_equal(atomic_load(&f->c->comm_inflight), 2);
    eng.outcome[1] = FINISHED;
    eng.outcome[2] = FAILED;
    unsigned polls = eng.polls;
    assert_null(reduce(f)); /* settles 1 and 2, then runs */
    assert_true(eng.polls >= polls + 2);
    assert_int_equal(atomic_load(&f->c->comm_inflight), 1);
    expect_cause(cube_check(f->c, &other, 1), CUBE_ERR_TIMEOUT,
                 "cube_all_reduce");
    assert_null(cube_check(f->c, &f->dst, 1));
    eng.outcome[3] = FINISHED;
    assert_null(cube_sync(f->c, NULL, 0));
    assert_int_equal(atomic_load(&f->c->comm_inflight), 0);
    assert_null(cube_handle_release(f->c, other));
}

/* The destination's handle released while the call runs: the call's pin
 * keeps the buffer until the call ended (ASan checks the rest). */
static void test_a_released_destination_stays_pinned(void **state)
{
    fixture *f = *state;
    cube_handle other = make(f->c, 3.0f);
    assert_int_equal(
        cube_error_code(cube_all_reduce(f->comm, f->src, other, 64,
                                        CUBE_DTYPE_F32, CUBE_REDUCE_SUM)),
        CUBE_OK);
    assert_null(cube_handle_release(f->c, other));
    eng.outcome[1] = FAILED;
    assert_null(cube_check(f->c, &f->src, 1)); /* reaps: unpins, frees */
    assert_int_equal(atomic_load(&f->c->comm_inflight), 0);
}

/* A destroy waits for calls still running (at most about twice the
 * timeout), then marks what never ended and lets the rank go. */
static void test_destroy_marks_what_never_ended(void **state)
{
    fixture *f = *state;
    assert_null(reduce(f));
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    cube_comm_destroy(f->comm);
    f->comm = NULL;
    clock_gettime(CLOCK_MONOTONIC, &t1);
    double s = (double)(t1.tv_sec - t0.tv_sec) +
               (double)(t1.tv_nsec - t0.tv_nsec) / 1e9;
    assert_true(s >= 0.04); /* it waited */
    assert_int_equal(eng.destroyed, 1);
    expect_cause(cube_check(f->c, &f->dst, 1), CUBE_ERR_ABORTED,
                 "destroyed before the call finished");
}

/* A source that carries a failure refuses the call on this rank; nothing
 * is followed. */
static void test_a_refused_call_is_not_followed(void **state)
{
    fixture *f = *state;
    assert_null(reduce(f));
    eng.outcome[1] = FAILED;
    expect_cause(cube_check(f->c, &f->dst, 1), CUBE_ERR_TIMEOUT,
                 "cube_all_reduce");
    /* dst now carries a failure: as a source it refuses the next call */
    cube_error *err = cube_all_reduce(f->comm, f->dst, f->src, 64,
                                      CUBE_DTYPE_F32, CUBE_REDUCE_SUM);
    assert_int_equal(cube_error_code(err), CUBE_ERR_SEVERAL);
    cube_error_free(err);
    assert_int_equal(eng.issued, 1);
    assert_int_equal(atomic_load(&f->c->comm_inflight), 0);
}

/* Captures the rank's all-reduce of src into dst in a graph. */
static cube_graph_id capture_reduce(fixture *f)
{
    assert_null(cube_graph_prepare(f->c));
    assert_null(cube_graph_begin(f->c));
    assert_null(reduce(f));
    cube_graph_id id = 0;
    assert_null(cube_graph_end(f->c, &id));
    return id;
}

/* A software graph: the capture only checks with the engine (nothing
 * runs or is followed); each replay issues the call, followed like a
 * call, its failure marking the destination. */
static void test_a_software_replay_is_followed(void **state)
{
    fixture *f = *state;
    cube_graph_id id = capture_reduce(f);
    assert_int_equal(eng.captured, 1);
    assert_int_equal(eng.issued, 0);
    assert_int_equal(atomic_load(&f->c->comm_inflight), 0);
    assert_null(cube_graph_replay(f->c, id));
    assert_null(cube_graph_replay(f->c, id));
    assert_int_equal(eng.issued, 2);
    assert_int_equal(atomic_load(&f->c->comm_inflight), 2);
    eng.outcome[1] = FINISHED;
    eng.outcome[2] = FAILED;
    expect_cause(cube_check(f->c, &f->dst, 1), CUBE_ERR_TIMEOUT,
                 "cube_all_reduce");
    assert_int_equal(atomic_load(&f->c->comm_inflight), 0);
    /* A replay over an input that failed since is refused, and the
     * engine told (the peers answer an error rather than wait). */
    cube_handle other = make(f->c, 3.0f);
    assert_null(cube_all_reduce(f->comm, other, f->src, 64, CUBE_DTYPE_F32,
                                CUBE_REDUCE_SUM));
    eng.outcome[3] = FAILED;
    expect_cause(cube_check(f->c, &f->src, 1), CUBE_ERR_TIMEOUT,
                 "cube_all_reduce");
    unsigned refusals = eng.refusals;
    cube_error *err = cube_graph_replay(f->c, id);
    assert_int_equal(cube_error_code(err), CUBE_ERR_SEVERAL);
    cube_error_free(err);
    assert_int_equal(eng.refusals, refusals + 1);
    assert_int_equal(eng.issued, 3);
    assert_null(cube_handle_release(f->c, other));
    assert_null(cube_graph_destroy(f->c, id));
}

/* The engine says a peer does not capture: the call answers
 * CUBE_ERR_GRAPH_STATE, nothing is recorded, and the buffers keep their
 * trust. */
static void test_a_capture_some_ranks_do_not_make_is_refused(void **state)
{
    fixture *f = *state;
    eng.peer_not_capturing = 1;
    assert_null(cube_graph_prepare(f->c));
    assert_null(cube_graph_begin(f->c));
    cube_error *err = reduce(f);
    assert_int_equal(cube_error_code(err), CUBE_ERR_GRAPH_STATE);
    cube_error_free(err);
    cube_graph_id id = 0;
    assert_null(cube_graph_end(f->c, &id));
    assert_null(cube_graph_replay(f->c, id));
    assert_int_equal(eng.issued, 0);
    assert_null(cube_check(f->c, &f->dst, 1));
    assert_null(cube_graph_destroy(f->c, id));
}

/* A hardware graph: the backend captured its part; each replay is
 * bracketed by replay_begin/end and followed as one call, whose
 * failure marks what the graph writes. */
static void test_a_hardware_replay_is_followed(void **state)
{
    fixture *f = *state;
    cube_graph_id id = capture_reduce(f);
    assert_int_equal(eng.captured, 1);
    assert_null(cube_graph_replay(f->c, id));
    assert_int_equal(eng.replays, 1);
    assert_int_equal(eng.replay_begins, 1);
    assert_int_equal(eng.replay_ends, 1);
    assert_int_equal(eng.issued, 0); /* the graph runs it */
    assert_int_equal(atomic_load(&f->c->comm_inflight), 1);
    assert_null(cube_check(f->c, &f->dst, 1));
    eng.outcome[1] = FAILED;
    expect_cause(cube_check(f->c, &f->dst, 1), CUBE_ERR_TIMEOUT,
                 "cube_graph_replay");
    assert_null(cube_check(f->c, &f->src, 1));
    /* A replay that lands later trusts the output again. */
    assert_null(cube_graph_replay(f->c, id));
    eng.outcome[2] = FINISHED;
    assert_null(cube_sync(f->c, NULL, 0));
    assert_null(cube_check(f->c, &f->dst, 1));
    /* An aborted communicator: the graph is not launched. */
    eng.aborted = 1;
    cube_error *err = cube_graph_replay(f->c, id);
    assert_int_equal(cube_error_code(err), CUBE_ERR_ABORTED);
    cube_error_free(err);
    assert_int_equal(eng.replays, 2);
    expect_cause(cube_check(f->c, &f->dst, 1), CUBE_ERR_ABORTED, "aborted");
    eng.aborted = 0;
    assert_null(cube_graph_destroy(f->c, id));
    assert_int_equal(atomic_load(&f->c->comm_inflight), 0);
}

/* The graph holds the rank: a destroy before the graph's waits for the
 * graph to go before the engine's rank goes, and replays in between
 * answer CUBE_ERR_NOT_FOUND without launching. */
static void test_a_hardware_graph_holds_its_rank(void **state)
{
    fixture *f = *state;
    cube_graph_id id = capture_reduce(f);
    assert_null(cube_graph_replay(f->c, id));
    eng.outcome[1] = FINISHED;
    cube_comm_destroy(f->comm);
    f->comm = NULL;
    assert_int_equal(eng.destroyed, 0);
    cube_error *err = cube_graph_replay(f->c, id);
    assert_int_equal(cube_error_code(err), CUBE_ERR_NOT_FOUND);
    cube_error_free(err);
    assert_int_equal(eng.replays, 1);
    assert_null(cube_graph_destroy(f->c, id));
    assert_int_equal(eng.destroyed, 1);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(
            test_a_failed_call_marks_its_destination, setup, teardown),
        cmocka_unit_test_setup_teardown(test_a_read_asks_first, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(
            test_finished_calls_are_dropped_at_the_next_call, setup, teardown),
        cmocka_unit_test_setup_teardown(
            test_a_released_destination_stays_pinned, setup, teardown),
        cmocka_unit_test_setup_teardown(test_destroy_marks_what_never_ended,
                                        setup, teardown),
        cmocka_unit_test_setup_teardown(test_a_refused_call_is_not_followed,
                                        setup, teardown),
        cmocka_unit_test_setup_teardown(test_a_software_replay_is_followed,
                                        setup, teardown),
        cmocka_unit_test_setup_teardown(
            test_a_capture_some_ranks_do_not_make_is_refused, setup, teardown),
        cmocka_unit_test_setup_teardown(test_a_hardware_replay_is_followed,
                                        setup_hardware, teardown),
        cmocka_unit_test_setup_teardown(test_a_hardware_graph_holds_its_rank,
                                        setup_hardware, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
