/* The CUDA communicator watchdog on one GPU, through the fake NCCL
 * (tests/gpu/fake_nccl.c, loaded with CUBERT_NCCL_LIBRARY): rank 0 of a
 * two-rank communicator between processes whose peer never comes.
 *
 *   a. an all-reduce that completes: dst holds src, no failure;
 *   b. three broadcasts in a row, each spinning $CUBERT_FAKE_NCCL_SPIN_MS
 *      on the device: the last starts past the timeout after it was
 *      enqueued, yet none times out (the timeout counts from a call's
 *      start on the device);
 *   c. a receive no one sends to: enqueued without error, then the read of
 *      its destination answers CUBE_ERR_TIMEOUT (or CUBE_ERR_SEVERAL whose
 *      first cause is) about the timeout after the receive, never a hang;
 *      the destination carries the failure;
 *   d. then the communicator answers CUBE_ERR_ABORTED, the client works
 *      on;
 *   e. graphs, on a second communicator: a captured broadcast replayed
 *      twice in a row (each replay timed from its own start: neither times
 *      out); a captured receive no one sends to: its replay's output
 *      answers CUBE_ERR_TIMEOUT, then every graph of the communicator
 *      answers CUBE_ERR_ABORTED without launching; the communicator
 *      destroyed before its graphs waits for them;
 *   f. destroying the communicators and closing the client return.
 *
 * Every wait is bounded: a wait that would not end prints "FAILED: hang"
 * and exits 1. Exit 0: every check passed; 77: skipped (no CUDA device,
 * CUBERT_NCCL_LIBRARY does not name the fake, or NCCL cannot be loaded).
 *
 * `comm_watchdog --load` only checks that cubert loads the fake (every
 * entry point it resolves is there) and takes an id from it: no GPU
 * needed, so it runs everywhere the CUDA backend is built.
 */
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cubert/cubert.h"

#define TIMEOUT_MS 1500u
#define N 4096

#define CHECK_WHO() fprintf(stderr, "comm_watchdog: ")
#include "program_checks.h"

/* Where the run is, on stderr: a run that stops shows where. */
static void phase(const char *what)
{
    fprintf(stderr, "comm_watchdog: %s\n", what);
    fflush(stderr);
}

static cube_handle make(cube_client *c, const float *v)
{
    cube_handle h = {0};
    ok(cube_create(c, v, N * sizeof(float), &h), "create");
    return h;
}

static void on_alarm(int sig)
{
    (void)sig;
    static const char text[] = "comm_watchdog: FAILED: hang in destroy\n";
    ssize_t w = write(2, text, sizeof text - 1);
    (void)w;
    _exit(1);
}

/* The fake's path ends in its library name; anything else is not it. */
static int nccl_is_fake(void)
{
    const char *lib = getenv("CUBERT_NCCL_LIBRARY");
    return lib && strstr(lib, "fake_nccl") != NULL;
}

/* $CUBERT_FAKE_NCCL_SPIN_MS as the fake reads it (default 1000). */
static uint64_t spin_ms(void)
{
    const char *text = getenv("CUBERT_FAKE_NCCL_SPIN_MS");
    return text && *text ? strtoull(text, NULL, 10) : 1000;
}

/* cubert's NCCL loader takes the fake: every entry point resolved. */
static int load_only(void)
{
    cube_comm_id id;
    cube_error *err = cube_comm_id_new("cuda", &id);
    if (err) {
        fprintf(stderr, "comm_watchdog: FAILED: the fake NCCL: %s\n",
                cube_error_message(err));
        cube_error_free(err);
        return 1;
    }
    phase("the fake NCCL loads");
    return 0;
}

int main(int argc, char **argv)
{
    if (!nccl_is_fake()) {
        phase("skipped: CUBERT_NCCL_LIBRARY does not name the fake NCCL");
        return 77;
    }
    if (argc > 1 && strcmp(argv[1], "--load") == 0)
        return load_only();
    uint32_t devices = 0;
    cube_error *err = cube_device_count("cuda", &devices);
    if (err || devices == 0) {
        fprintf(stderr, "comm_watchdog: skipped: no CUDA device%s%s\n",
                err ? ": " : "", err ? cube_error_message(err) : "");
        cube_error_free(err);
        return 77;
    }
    cube_comm_id id;
    err = cube_comm_id_new("cuda", &id);
    if (cube_error_code(err) == CUBE_ERR_UNAVAILABLE) {
        fprintf(stderr, "comm_watchdog: skipped: %s\n",
                cube_error_message(err));
        cube_error_free(err);
        return 77;
    }
    ok(err, "cube_comm_id_new");
    uint64_t spin = spin_ms();
    /* Each broadcast ends within the timeout, two of them do not. */
    if (spin >= TIMEOUT_MS || 2 * spin <= TIMEOUT_MS) {
        fprintf(stderr,
                "comm_watchdog: CUBERT_FAKE_NCCL_SPIN_MS=%llu must lie "
                "between %u/2 and %u ms\n",
                (unsigned long long)spin, TIMEOUT_MS, TIMEOUT_MS);
        return 1;
    }

    cube_client *c = NULL;
    ok(cube_client_open("cuda:0", NULL, &c), "open cuda:0");
    if (!c)
        return 1;
    cube_comm_options co = cube_comm_options_default();
    co.timeout_ms = TIMEOUT_MS;
    cube_comm *comm = NULL;
    err = cube_comm_init_rank(c, &id, 2, 0, &co, &comm);
    if (cube_error_code(err) == CUBE_ERR_UNAVAILABLE) {
        fprintf(stderr, "comm_watchdog: skipped: %s\n",
                cube_error_message(err));
        cube_error_free(err);
        cube_client_close(c);
        return 77;
    }
    ok(err, "cube_comm_init_rank");
    if (!comm)
        return 1;
    phase("communicator made (rank 0 of 2, timeout 1500 ms)");

    static float mine[N], zeros[N], got[N];
    for (int i = 0; i < N; i++)
        mine[i] = (float)(i % 997) + 0.5f;
    cube_handle src = make(c, mine);
    cube_handle dst = make(c, zeros);

    /* a. a call that completes */
    phase("a. an all-reduce that completes");
    ok(cube_all_reduce(comm, src, dst, N, CUBE_DTYPE_F32, CUBE_REDUCE_SUM),
       "all_reduce");
    ok(read_bounded(c, dst, got, sizeof got, TIMEOUT_MS + 15000),
       "read after all_reduce");
    CHECK(memcmp(got, mine, sizeof got) == 0, "all_reduce: dst != src");
    ok(cube_check(c, &dst, 1), "dst after all_reduce");

    /* b. calls queued behind others, timed from their own start */
    phase("b. three broadcasts in a row, each spinning on the device");
    cube_handle bdst = make(c, zeros);
    uint64_t t0 = now_ms();
    for (int i = 0; i < 3; i++)
        ok(cube_broadcast(comm, src, bdst, N, CUBE_DTYPE_F32, 0), "broadcast");
    memset(got, 0, sizeof got);
    ok(read_bounded(c, bdst, got, sizeof got, 3 * spin + 15000),
       "read after broadcasts");
    uint64_t took = now_ms() - t0;
    CHECK(memcmp(got, mine, sizeof got) == 0, "broadcast: dst != src");
    /* The fake spun three times in a row: the last started ~2 spins after
     * it was enqueued, past the timeout. */
    CHECK(took >= 3 * spin - spin / 4,
          "three broadcasts took %llu ms, fewer than 3 x %llu: did the fake "
          "spin?",
          (unsigned long long)took, (unsigned long long)spin);
    ok(cube_check(c, &bdst, 1), "dst after broadcasts");
    fprintf(stderr, "comm_watchdog: broadcasts took %llu ms\n",
            (unsigned long long)took);

    /* c. a receive whose sender never comes */
    phase("c. an unmatched receive");
    cube_handle rdst = make(c, zeros);
    t0 = now_ms();
    err = cube_recv(comm, rdst, N, CUBE_DTYPE_F32, 1);
    CHECK(!err, "recv: expected success (enqueued), got %d (%s)",
          (int)cube_error_code(err), err ? cube_error_message(err) : "");
    cube_error_free(err);
    err = read_bounded(c, rdst, got, sizeof got, TIMEOUT_MS + 15000);
    took = now_ms() - t0;
    CHECK(code_or_cause(err) == CUBE_ERR_TIMEOUT,
          "read after the receive: expected CUBE_ERR_TIMEOUT, got %d (%s)",
          (int)cube_error_code(err), err ? cube_error_message(err) : "success");
    cube_error_free(err);
    CHECK(took >= 1000 && took < 15000,
          "the receive failed %llu ms after it was issued (expected about "
          "%u)",
          (unsigned long long)took, TIMEOUT_MS);
    fprintf(stderr, "comm_watchdog: the receive failed after %llu ms\n",
            (unsigned long long)took);
    expect(cube_check(c, &rdst, 1), CUBE_ERR_SEVERAL,
           "the receive's destination carries the failure");

    /* d. the communicator is aborted, the client goes on */
    phase("d. after the timeout");
    cube_handle adst = make(c, zeros);
    expect(cube_all_reduce(comm, src, adst, N, CUBE_DTYPE_F32, CUBE_REDUCE_SUM),
           CUBE_ERR_ABORTED, "a collective after the timeout");
    cube_handle again = make(c, mine);
    memset(got, 0, sizeof got);
    ok(read_bounded(c, again, got, sizeof got, 15000), "read of a new buffer");
    CHECK(memcmp(got, mine, sizeof got) == 0, "the client after the timeout");
    ok(cube_sync(c, NULL, 0), "cube_sync after the timeout");

    /* e. graphs of a communicator between processes */
    phase("e. graphs: a broadcast replayed twice, then a receive");
    cube_comm_id id2;
    ok(cube_comm_id_new("cuda", &id2), "cube_comm_id_new");
    cube_comm *comm2 = NULL;
    ok(cube_comm_init_rank(c, &id2, 2, 0, &co, &comm2), "second communicator");
    cube_handle gdst = make(c, zeros);
    cube_graph_id gb = 0, gr = 0;
    ok(cube_graph_prepare(c), "graph prepare");
    ok(cube_graph_begin(c), "graph begin");
    ok(cube_broadcast(comm2, src, gdst, N, CUBE_DTYPE_F32, 0),
       "captured broadcast");
    ok(cube_graph_end(c, &gb), "graph end");
    t0 = now_ms();
    ok(cube_graph_replay(c, gb), "replay 1");
    ok(cube_graph_replay(c, gb), "replay 2");
    memset(got, 0, sizeof got);
    ok(read_bounded(c, gdst, got, sizeof got, 2 * spin + 15000),
       "read after the replays");
    took = now_ms() - t0;
    CHECK(memcmp(got, mine, sizeof got) == 0, "replayed broadcast: dst != src");
    CHECK(took >= 2 * spin - spin / 4,
          "two replays took %llu ms, fewer than 2 x %llu: did they run?",
          (unsigned long long)took, (unsigned long long)spin);
    ok(cube_check(c, &gdst, 1), "dst after the replays");
    fprintf(stderr, "comm_watchdog: two replays took %llu ms\n",
            (unsigned long long)took);
    ok(cube_graph_prepare(c), "graph prepare");
    ok(cube_graph_begin(c), "graph begin");
    ok(cube_recv(comm2, gdst, N, CUBE_DTYPE_F32, 1), "captured receive");
    ok(cube_graph_end(c, &gr), "graph end");
    t0 = now_ms();
    ok(cube_graph_replay(c, gr), "replay of the receive (enqueued)");
    err = read_bounded(c, gdst, got, sizeof got, TIMEOUT_MS + 15000);
    took = now_ms() - t0;
    CHECK(code_or_cause(err) == CUBE_ERR_TIMEOUT,
          "read after the replayed receive: expected CUBE_ERR_TIMEOUT, got "
          "%d (%s)",
          (int)cube_error_code(err), err ? cube_error_message(err) : "success");
    CHECK(err && strstr(cube_error_message(cube_error_cause_count(err)
                                               ? cube_error_cause(err, 0)
                                               : err),
                        "cube_graph_replay"),
          "the failure names the replay: %s",
          err ? cube_error_message(err) : "success");
    cube_error_free(err);
    CHECK(took >= 1000 && took < 15000,
          "the replay failed %llu ms after it was issued (expected about %u)",
          (unsigned long long)took, TIMEOUT_MS);
    fprintf(stderr,
            "comm_watchdog: the replayed receive failed after %llu ms\n",
            (unsigned long long)took);
    expect(cube_graph_replay(c, gb), CUBE_ERR_ABORTED,
           "a replay after the abort");
    expect(cube_graph_replay(c, gr), CUBE_ERR_ABORTED,
           "a replay after the abort");
    ok(cube_sync(c, NULL, 0), "cube_sync after the aborted replays");
    /* The graphs hold the rank: destroyed first, it goes with them. */
    cube_comm_destroy(comm2);
    expect(cube_graph_replay(c, gb), CUBE_ERR_NOT_FOUND,
           "a replay after the destroy");
    ok(cube_graph_destroy(c, gb), "graph destroy");
    ok(cube_graph_destroy(c, gr), "graph destroy");

    phase("f. destroy and close");
    signal(SIGALRM, on_alarm);
    alarm(10);
    cube_comm_destroy(comm);
    cube_client_close(c);
    alarm(0);
    if (failures) {
        fprintf(stderr, "comm_watchdog: %d check(s) failed\n", failures);
        return 1;
    }
    phase("passed");
    return 0;
}
