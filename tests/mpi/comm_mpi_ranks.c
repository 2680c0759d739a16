/* One rank of a communicator between processes, run as every process of
 * a job: `mpirun -n N comm_mpi_ranks DIR` on the CPU backend, or
 * `CUBERT_TEST_RANK=r CUBERT_TEST_RANKS=N comm_mpi_ranks DIR cuda` once per
 * rank (rank r on GPU r modulo the GPUs there are). Rank 0 makes the id
 * and writes it to DIR/id (as a launcher would hand it over), the others
 * read it; then every collective is checked against a host reference.
 * Then the failure paths: on the CPU those MPI lets the ranks tell each
 * other about (a call one rank refuses, calls that differ, a source that
 * carries a failure: every rank's error); on CUDA, where NCCL cannot tell
 * the peers, a receive no rank sends to times out with an error, the
 * communicator is aborted, and the client goes on working. Every rank
 * also sends to itself in a group, and captures an all-reduce in a graph
 * and replays it (on the CPU also
 * a capture only one rank makes, and a replay one rank refuses). Exit 0
 * when every check passed on this rank, 77 when the backend cannot make
 * such communicators here (no MPI, no NCCL, no GPU). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cubert/cubert.h"

static int rank_, size_;
static const char *backend_ = "cpu";
#define CHECK_WHO() fprintf(stderr, "rank %d: ", rank_)
#include "program_checks.h"

static cube_handle make(cube_client *c, const float *v, uint64_t n)
{
    cube_handle h = {0};
    ok(cube_create(c, v, n * 4, &h), "create");
    return h;
}

static void read_back(cube_client *c, cube_handle h, float *out, uint64_t n)
{
    cube_copy_desc d = cube_copy_desc_contiguous(h, n * 4, 4);
    void *dst[1] = {out};
    uint64_t size[1] = {n * 4};
    ok(cube_read(c, &d, dst, size, 1), "read");
}

/* Where the run is, on stderr: a run that stops shows where. */
static void phase(const char *what)
{
    fprintf(stderr, "rank %d: %s\n", rank_, what);
    fflush(stderr);
}

/* Rank 0 writes the id; the others wait for it (at most 60 s). */
static int share_id(const char *dir, cube_comm_id *id)
{
    char path[1024], text[CUBE_COMM_ID_TEXT];
    snprintf(path, sizeof path, "%s/id", dir);
    if (rank_ == 0) {
        char tmp[1100];
        cube_error *err = cube_comm_id_new(backend_, id);
        if (err) {
            fprintf(stderr, "rank 0: %s\n", cube_error_message(err));
            cube_error_free(err);
            return -1;
        }
        ok(cube_comm_id_format(id, text, sizeof text), "format");
        snprintf(tmp, sizeof tmp, "%s.tmp", path);
        FILE *f = fopen(tmp, "w");
        if (!f || fprintf(f, "%s\n", text) < 0 || fclose(f) != 0 ||
            rename(tmp, path) != 0)
            return -1;
        return 0;
    }
    for (int tries = 0; tries < 6000; tries++) {
        FILE *f = fopen(path, "r");
        if (f) {
            char *got = fgets(text, sizeof text, f);
            fclose(f);
            if (got) {
                ok(cube_comm_id_parse(text, id), "parse");
                return 0;
            }
        }
        struct timespec pause = {0, 10 * 1000 * 1000};
        nanosleep(&pause, NULL);
    }
    return -1;
}

int main(int argc, char **argv)
{
    const char *r = getenv("OMPI_COMM_WORLD_RANK");
    const char *s = getenv("OMPI_COMM_WORLD_SIZE");
    if (!r || !s) {
        r = getenv("CUBERT_TEST_RANK");
        s = getenv("CUBERT_TEST_RANKS");
    }
    if (argc < 2 || !r || !s) {
        fprintf(stderr, "usage: mpirun -n N comm_mpi_ranks DIR, or "
                        "CUBERT_TEST_RANK=r CUBERT_TEST_RANKS=N "
                        "comm_mpi_ranks DIR cuda\n");
        return 2;
    }
    if (argc > 2)
        backend_ = argv[2];
    rank_ = atoi(r);
    size_ = atoi(s);
    int cpu = strcmp(backend_, "cpu") == 0;
    uint32_t devices = 0;
    cube_error *cerr = cube_device_count(backend_, &devices);
    /* NCCL puts one rank on a GPU: CUDA needs as many as there are ranks. */
    if (cerr || devices == 0 || (!cpu && devices < (uint32_t)size_)) {
        fprintf(stderr, "rank %d: skipped: %u %s devices for %d ranks\n", rank_,
                devices, backend_, size_);
        cube_error_free(cerr);
        return 77;
    }
    char device[64];
    snprintf(device, sizeof device, "%s:%u", backend_,
             cpu ? 0u : (uint32_t)rank_ % devices);
    cube_client *c = NULL;
    cube_client_options o = cube_client_options_default();
    o.cpu_threads = 1;
    ok(cube_client_open(device, &o, &c), "open");
    cube_comm_id id;
    if (!c || share_id(argv[1], &id) != 0) {
        fprintf(stderr, "rank %d: no id\n", rank_);
        return 1;
    }
    cube_comm *comm = NULL;
    cube_comm_options co = cube_comm_options_default();
    /* Long enough for the slowest rank to arrive; on CUDA also how long
     * the unmatched receive below waits. */
    co.timeout_ms = cpu ? 60000 : 15000;
    cube_error *err = cube_comm_init_rank(c, &id, (uint32_t)size_,
                                          (uint32_t)rank_, &co, &comm);
    if (err && cube_error_code(err) == CUBE_ERR_UNAVAILABLE) {
        fprintf(stderr, "rank %d: skipped: %s\n", rank_,
                cube_error_message(err));
        cube_error_free(err);
        cube_client_close(c);
        return 77;
    }
    ok(err, "cube_comm_init_rank");
    if (!comm)
        return 1;
    phase("communicator made");
    CHECK(cube_comm_rank(comm) == (uint32_t)rank_, "rank");
    CHECK(cube_comm_size(comm) == (uint32_t)size_, "size");

    enum { N = 1000 };
    float *mine = malloc(N * size_ * sizeof(float));
    float *got = malloc(N * size_ * sizeof(float));
    for (int i = 0; i < N * size_; i++)
        mine[i] = (float)(rank_ * 1000 + i % 997);
    cube_handle src = make(c, mine, (uint64_t)N * size_);
    cube_handle dst = make(c, mine, (uint64_t)N * size_);

    /* all-reduce: sum, max, average (sizes whose average is exact) */
    ok(cube_all_reduce(comm, src, dst, N, CUBE_DTYPE_F32, CUBE_REDUCE_SUM),
       "all_reduce sum");
    read_back(c, dst, got, N);
    for (int i = 0; i < N; i++) {
        float want = 0;
        for (int q = 0; q < size_; q++)
            want += (float)(q * 1000 + i % 997);
        CHECK(got[i] == want, "sum[%d] %g != %g", i, got[i], want);
    }
    ok(cube_all_reduce(comm, src, dst, N, CUBE_DTYPE_F32, CUBE_REDUCE_MAX),
       "all_reduce max");
    read_back(c, dst, got, N);
    for (int i = 0; i < N; i++)
        CHECK(got[i] == (float)((size_ - 1) * 1000 + i % 997), "max[%d]", i);
    /* halves, reduced through float: 1.0 + 2.0 * rank in bf16 */
    uint16_t hv[8], hout[8];
    for (int i = 0; i < 8; i++)
        hv[i] = (uint16_t)(rank_ == 0 ? 0x3f80 : 0x4000); /* 1.0, 2.0 */
    cube_handle hs = {0};
    ok(cube_create(c, hv, sizeof hv, &hs), "create halves");
    ok(cube_all_reduce(comm, hs, hs, 8, CUBE_DTYPE_BF16, CUBE_REDUCE_SUM),
       "all_reduce bf16 in place");
    cube_copy_desc hd = cube_copy_desc_contiguous(hs, sizeof hout, 2);
    void *hdst[1] = {hout};
    uint64_t hsize[1] = {sizeof hout};
    ok(cube_read(c, &hd, hdst, hsize, 1), "read halves");
    /* 1 + 2 (size_ - 1), exact in bf16 for a few ranks */
    float hwant = 1.0f + 2.0f * (float)(size_ - 1);
    uint32_t bits;
    memcpy(&bits, &hwant, 4);
    CHECK(hout[0] == (uint16_t)(bits >> 16), "bf16 sum %#x != %#x", hout[0],
          bits >> 16);

    /* broadcast from the last rank, reduce to rank 0 */
    ok(cube_broadcast(comm, src, dst, N, CUBE_DTYPE_F32, (uint32_t)size_ - 1),
       "broadcast");
    read_back(c, dst, got, N);
    for (int i = 0; i < N; i++)
        CHECK(got[i] == (float)((size_ - 1) * 1000 + i % 997), "bcast[%d]", i);
    cube_handle none = {0};
    ok(cube_reduce(comm, src, rank_ == 0 ? dst : none, N, CUBE_DTYPE_F32,
                   CUBE_REDUCE_MIN, 0),
       "reduce");
    if (rank_ == 0) {
        read_back(c, dst, got, N);
        for (int i = 0; i < N; i++)
            CHECK(got[i] == (float)(i % 997), "reduce[%d]", i);
    }
    /* all-gather, reduce-scatter */
    ok(cube_all_gather(comm, src, dst, N, CUBE_DTYPE_F32), "all_gather");
    read_back(c, dst, got, (uint64_t)N * size_);
    for (int q = 0; q < size_; q++)
        for (int i = 0; i < N; i++)
            CHECK(got[q * N + i] == (float)(q * 1000 + i % 997),
                  "gather[%d][%d]", q, i);
    ok(cube_reduce_scatter(comm, src, dst, N, CUBE_DTYPE_F32, CUBE_REDUCE_SUM),
       "reduce_scatter");
    read_back(c, dst, got, N);
    for (int i = 0; i < N; i++) {
        float want = 0;
        for (int q = 0; q < size_; q++)
            want += (float)(q * 1000 + (rank_ * N + i) % 997);
        CHECK(got[i] == want, "scatter[%d] %g != %g", i, got[i], want);
    }
    phase("collectives checked");
    /* a ring of sends */
    if (size_ > 1) {
        uint32_t next = (uint32_t)(rank_ + 1) % size_,
                 prev = (uint32_t)(rank_ + size_ - 1) % size_;
        if (rank_ % 2 == 0) {
            ok(cube_send(comm, src, N, CUBE_DTYPE_F32, next), "send");
            ok(cube_recv(comm, dst, N, CUBE_DTYPE_F32, prev), "recv");
        } else {
            ok(cube_recv(comm, dst, N, CUBE_DTYPE_F32, prev), "recv");
            ok(cube_send(comm, src, N, CUBE_DTYPE_F32, next), "send");
        }
        read_back(c, dst, got, N);
        for (int i = 0; i < N; i++)
            CHECK(got[i] == (float)(prev * 1000 + i % 997), "recv[%d]", i);
    }
    /* A send to itself and its receive in one group: the pair runs in
     * this process. */
    {
        float zero[N];
        memset(zero, 0, sizeof zero);
        cube_handle back = make(c, zero, N);
        ok(cube_group_begin(), "group begin");
        ok(cube_send(comm, src, N, CUBE_DTYPE_F32, (uint32_t)rank_),
           "send to itself");
        ok(cube_recv(comm, back, N, CUBE_DTYPE_F32, (uint32_t)rank_),
           "receive from itself");
        ok(cube_group_end(), "group end");
        read_back(c, back, got, N);
        for (int i = 0; i < N; i++)
            CHECK(got[i] == mine[i], "self[%d] %g != %g", i, got[i], mine[i]);
        /* a lone one is refused at once, on this rank alone */
        ok(cube_group_begin(), "group begin");
        ok(cube_send(comm, src, N, CUBE_DTYPE_F32, (uint32_t)rank_),
           "send to itself");
        expect(cube_group_end(), CUBE_ERR_INVALID_ARGUMENT,
               "a send to itself without its receive");
        ok(cube_handle_release(c, back), "release");
        phase("sends to itself checked");
    }
    /* Graphs: every rank captures an all-reduce; each replay reduces
     * what the source holds then. */
    {
        float *gv = malloc(N * sizeof(float));
        for (int i = 0; i < N; i++)
            gv[i] = (float)rank_;
        cube_handle gs = make(c, gv, N), gd = make(c, gv, N);
        ok(cube_graph_prepare(c), "graph prepare");
        ok(cube_all_reduce(comm, gs, gd, N, CUBE_DTYPE_F32, CUBE_REDUCE_SUM),
           "warm-up all_reduce");
        ok(cube_graph_begin(c), "graph begin");
        ok(cube_all_reduce(comm, gs, gd, N, CUBE_DTYPE_F32, CUBE_REDUCE_SUM),
           "captured all_reduce");
        cube_graph_id gid = 0;
        ok(cube_graph_end(c, &gid), "graph end");
        for (int round = 1; round <= 3; round++) {
            for (int i = 0; i < N; i++)
                gv[i] = (float)(round * 100 + rank_ + i % 7);
            ok(cube_write_all(c, gs, gv, N * sizeof(float)), "write source");
            ok(cube_graph_replay(c, gid), "replay");
            read_back(c, gd, got, N);
            for (int i = 0; i < N; i++) {
                float want = 0;
                for (int q = 0; q < size_; q++)
                    want += (float)(round * 100 + q + i % 7);
                CHECK(got[i] == want, "replay %d [%d] %g != %g", round, i,
                      got[i], want);
            }
        }
        phase("graph replays checked");
        if (size_ > 1 && cpu) {
            /* Rank 0 captures, the others call: every rank refuses, and
             * nothing moved or was recorded. */
            if (rank_ == 0) {
                ok(cube_graph_prepare(c), "graph prepare");
                ok(cube_graph_begin(c), "graph begin");
            }
            expect(cube_all_reduce(comm, gs, gd, N, CUBE_DTYPE_F32,
                                   CUBE_REDUCE_SUM),
                   CUBE_ERR_GRAPH_STATE, "a capture on one rank only");
            if (rank_ == 0) {
                cube_graph_id empty = 0;
                ok(cube_graph_end(c, &empty), "graph end");
                ok(cube_graph_destroy(c, empty), "graph destroy");
            }
            ok(cube_check(c, &gd, 1), "dst untouched by the refusal");
            /* Rank 1's input fails: its replay is refused, the others'
             * answer the refusal, and every rank's output carries it. */
            if (rank_ == 1) {
                cube_kernel_desc kd = {"broken_g",
                                       "CUBE_KERNEL(broken_g, CUBE_OUT(float, "
                                       "y)) { this does not compile }",
                                       {1, 1, 1}};
                cube_kernel *k = NULL;
                ok(cube_kernel_create(&kd, &k), "kernel");
                cube_arg a = cube_arg_buffer(gs);
                expect(cube_launch(c, k, cube_count_static(1, 1, 1), &a, 1, 0),
                       CUBE_ERR_COMPILE, "broken kernel");
                cube_kernel_release(k);
            }
            expect(cube_graph_replay(c, gid),
                   rank_ == 1 ? CUBE_ERR_SEVERAL : CUBE_ERR_INVALID_ARGUMENT,
                   "a replay one rank refuses");
            cube_error *ferr = cube_check(c, &gd, 1);
            CHECK(ferr != NULL, "the output of a refused replay is trusted");
            cube_error_free(ferr);
            /* and the graph runs again once the input is rewritten */
            ok(cube_write_all(c, gs, gv, N * sizeof(float)), "rewrite");
            ok(cube_graph_replay(c, gid), "replay after the refusal");
            ok(cube_check(c, &gd, 1), "a landed replay trusts its output");
        }
        ok(cube_graph_destroy(c, gid), "graph destroy");
        ok(cube_handle_release(c, gs), "release");
        ok(cube_handle_release(c, gd), "release");
        free(gv);
    }
    if (size_ > 1 && !cpu) {
        /* A receive on the last rank that no rank sends to: an error
         * within the communicator's timeout, never a hang; the
         * communicator is aborted (NCCL cannot recover it) and the client
         * works on. */
        if (rank_ == size_ - 1) {
            phase("an unmatched receive");
            cube_error *rerr = cube_recv(comm, dst, N, CUBE_DTYPE_F32, 0);
            if (!rerr)
                rerr = read_bounded(c, dst, got, N * sizeof(float),
                                    co.timeout_ms + 10000);
            cube_code code = code_or_cause(rerr);
            CHECK(code == CUBE_ERR_TIMEOUT || code == CUBE_ERR_ABORTED,
                  "unmatched receive: expected a timeout, got %d (%s)",
                  (int)cube_error_code(rerr),
                  rerr ? cube_error_message(rerr) : "success");
            cube_error_free(rerr);
            expect(cube_all_reduce(comm, src, dst, N, CUBE_DTYPE_F32,
                                   CUBE_REDUCE_SUM),
                   CUBE_ERR_ABORTED, "a call after the timeout");
        }
        cube_handle again = make(c, mine, N);
        read_back(c, again, got, N);
        CHECK(got[5] == mine[5], "the client after the timeout");
        ok(cube_handle_release(c, again), "release");
    }
    if (size_ > 1 && cpu) {
        /* calls that differ: every rank refuses, nothing recorded */
        expect(cube_all_reduce(comm, src, dst, rank_ == 1 ? N / 2 : N,
                               CUBE_DTYPE_F32, CUBE_REDUCE_SUM),
               CUBE_ERR_INVALID_ARGUMENT, "counts that differ");
        ok(cube_check(c, &dst, 1), "dst untouched by the refusal");
        /* a call rank 1 refuses (a released handle) */
        cube_handle gone = make(c, mine, 4);
        ok(cube_handle_release(c, gone), "release");
        expect(cube_all_reduce(comm, rank_ == 1 ? gone : src, dst, N,
                               CUBE_DTYPE_F32, CUBE_REDUCE_SUM),
               rank_ == 1 ? CUBE_ERR_NOT_FOUND : CUBE_ERR_INVALID_ARGUMENT,
               "a refused call");
        /* a source that carries a failure on rank 0: every rank refuses
         * and every destination carries it */
        cube_kernel_desc kd = {"broken",
                               "CUBE_KERNEL(broken, CUBE_OUT(float, y)) { "
                               "this does not compile }",
                               {1, 1, 1}};
        cube_kernel *k = NULL;
        ok(cube_kernel_create(&kd, &k), "kernel");
        if (rank_ == 0) {
            cube_arg a = cube_arg_buffer(src);
            expect(cube_launch(c, k, cube_count_static(1, 1, 1), &a, 1, 0),
                   CUBE_ERR_COMPILE, "broken kernel");
        }
        cube_kernel_release(k);
        expect(
            cube_all_reduce(comm, src, dst, N, CUBE_DTYPE_F32, CUBE_REDUCE_SUM),
            CUBE_ERR_SEVERAL, "a failed source");
        expect(cube_check(c, &dst, 1), CUBE_ERR_SEVERAL,
               "the destination carries it");
        /* and the communicator goes on */
        ok(cube_handle_release(c, src), "release");
        src = make(c, mine, (uint64_t)N * size_);
        ok(cube_all_reduce(comm, src, dst, (uint64_t)N * size_, CUBE_DTYPE_F32,
                           CUBE_REDUCE_SUM),
           "all_reduce after the failures");
        ok(cube_check(c, &dst, 1), "a full write clears it");
    }
    phase("checks done");
    ok(cube_handle_release(c, hs), "release");
    ok(cube_handle_release(c, src), "release");
    ok(cube_handle_release(c, dst), "release");
    /* On CUDA a peer may have left work that never completes (the
     * unmatched receive): abort rather than wait for it. */
    if (!cpu)
        cube_error_free(cube_comm_abort(comm));
    cube_comm_destroy(comm);
    cube_client_close(c);
    free(mine);
    free(got);
    if (!failures)
        printf("rank %d of %d: every check passed\n", rank_, size_);
    return failures ? 1 : 0;
}
