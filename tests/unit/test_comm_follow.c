/* The core's following of collectives between processes (core/comm.c): a
 * backend whose part of a call finishes on the device later hands out a
 * ticket (cube_collective_set.ticket); the core keeps the call's
 * destination pinned and asks the backend how the call ended
 * (collective_poll) at the rank's next call, before a read's claim check,
 * after a read's wait, in cube_sync and cube_check, recording a failure on
 * the destination; a destroy waits for calls still running, then marks
 * their destinations.
 *
 * The backend here is the null backend with its communication slots
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
} engine;

static engine eng;
static cube_server_vtable scripted;

static cube_error *e_init_rank(cube_server *server, const unsigned char *id,
                               uint32_t nranks, uint32_t rank,
                               uint64_t timeout_ms, void **impl)
{
    (void)server, (void)id, (void)nranks, (void)rank, (void)timeout_ms;
    memset(&eng, 0, sizeof eng);
    *impl = &eng;
    return NULL;
}

static void e_destroy(cube_server *server, void *impl)
{
    (void)server;
    ((engine *)impl)->destroyed++;
}

static cube_error *e_collective(cube_server *server, cube_server_stream *stream,
                                void *impl, const cube_collective_set *set)
{
    (void)server, (void)stream;
    engine *e = impl;
    assert_true(set->remote);
    if (set->refused || set->failed)
        return NULL;
    e->issued++;
    assert_non_null(set->ticket);
    assert_true(e->next + 1 < TICKETS);
    *set->ticket = ++e->next;
    e->outcome[e->next] = RUNNING;
    return NULL;
}

static cube_error *e_poll(cube_server *server, void *impl, uint64_t ticket,
                          int *done)
{
    (void)server;
    engine *e = impl;
    e->polls++;
    assert_true(ticket > 0 && ticket <= e->next);
    *done = e->outcome[ticket] != RUNNING;
    return e->outcome[ticket] == FAILED
               ? cube_error_new(CUBE_ERR_TIMEOUT,
                                "ran on the device past the timeout")
               : NULL;
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

static int setup(void **state)
{
    static fixture f;
    memset(&f, 0, sizeof f);
    cube_client_options o = cube_client_options_default();
    assert_null(cube_client_open("null", &o, &f.c));
    scripted = *f.c->vt;
    scripted.comm_init_rank = e_init_rank;
    scripted.comm_destroy = e_destroy;
    scripted.collective = e_collective;
    scripted.collective_poll = e_poll;
    f.c->vt = &scripted;
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
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
