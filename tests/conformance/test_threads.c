/* Threads sharing one client, streams, and memory statistics. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "conformance.h"

/* --- four threads, one client --- */

enum { THREADS = 4, ROUNDS = 200 };

typedef struct worker {
    int id;
    cube_stream_id stream;
    int failures;
    char first[512];
} worker;

/* cmocka's asserts must stay on the main thread: workers record. */
static void worker_fail(worker *w, int round, const char *what, cube_error *err)
{
    if (w->failures++ == 0) {
        char *text = err ? cube_error_format(err) : NULL;
        snprintf(w->first, sizeof w->first, "thread %d round %d: %s%s%s", w->id,
                 round, what, text ? ": " : "", text ? text : "");
        free(text);
    }
    cube_error_free(err);
}

static void *worker_main(void *arg)
{
    worker *w = arg;
    cube_client *c = conf.client;
    w->stream = cube_stream_current(c);
    float *x = malloc(3000 * sizeof *x), *y = malloc(3000 * sizeof *y);
    if (!x || !y) {
        w->failures++;
        free(x);
        free(y);
        return NULL;
    }
    const float a = (float)(w->id + 1);
    for (int r = 0; r < ROUNDS && w->failures < 5; r++) {
        uint32_t n = 1 + (uint32_t)(w->id * 7919 + r * 131) % 3000;
        for (uint32_t i = 0; i < n; i++)
            x[i] = (float)((i + (uint32_t)r) % 512);
        cube_handle hx, hy;
        cube_error *err = cube_create(c, x, n * 4ull, &hx);
        if (err) {
            worker_fail(w, r, "cube_create", err);
            continue;
        }
        err = cube_empty(c, n * 4ull, &hy);
        if (err) {
            worker_fail(w, r, "cube_empty", err);
            cube_error_free(cube_handle_release(c, hx));
            continue;
        }
        cube_arg args[3] = {cube_arg_buffer(hx), cube_arg_buffer(hy),
                            cube_arg_f32(a)};
        err = cube_launch(c, conf.k.scale,
                          cube_count_static(conf_div_up(n, 64), 1, 1), args, 3,
                          CUBE_LAUNCH_EXECUTE);
        if (err)
            worker_fail(w, r, "cube_launch", err);
        cube_copy_desc d = cube_copy_desc_contiguous(hy, n * 4ull, 4);
        void *dst[1] = {y};
        uint64_t sz[1] = {n * 4ull};
        memset(y, 0, n * 4ull);
        err = cube_read(c, &d, dst, sz, 1);
        if (err) {
            worker_fail(w, r, "cube_read", err);
        } else {
            for (uint32_t i = 0; i < n; i++)
                if (y[i] != a * x[i]) {
                    worker_fail(w, r, "wrong result", NULL);
                    break;
                }
        }
        err = cube_handle_release(c, hx);
        if (err)
            worker_fail(w, r, "release x", err);
        err = cube_handle_release(c, hy);
        if (err)
            worker_fail(w, r, "release y", err);
    }
    free(x);
    free(y);
    return NULL;
}

static int contains(const cube_stream_id *ids, size_t n, cube_stream_id id)
{
    for (size_t i = 0; i < n; i++)
        if (ids[i] == id)
            return 1;
    return 0;
}

/* All initialized streams of the client; caller frees. */
static cube_stream_id *all_streams(size_t *n)
{
    size_t count = 0;
    CONF_OK(cube_stream_ids(conf.client, NULL, 0, &count));
    assert_true(count >= 1);
    cube_stream_id *ids = calloc(count + 4, sizeof *ids);
    assert_non_null(ids);
    size_t again = 0;
    CONF_OK(cube_stream_ids(conf.client, ids, count + 4, &again));
    assert_true(again >= count);
    if (again > count + 4)
        again = count + 4;
    *n = again;
    return ids;
}

CONF_TEST_NEEDS(threads_four_share_one_client_for_200_rounds,
                CUBE_FEATURE_KERNELS)
{
    /* Compile before the threads start, so they measure sharing, not the
     * compiler. */
    cube_handle warm = conf_empty(256);
    cube_arg args[3] = {cube_arg_buffer(warm), cube_arg_buffer(warm),
                        cube_arg_f32(1)};
    CONF_OK(conf_launch(conf.k.scale, cube_count_static(1, 1, 1), args, 3,
                        CUBE_LAUNCH_SKIP));
    conf_release(warm);

    worker w[THREADS];
    pthread_t t[THREADS];
    memset(w, 0, sizeof w);
    for (int i = 0; i < THREADS; i++) {
        w[i].id = i;
        assert_int_equal(pthread_create(&t[i], NULL, worker_main, &w[i]), 0);
    }
    for (int i = 0; i < THREADS; i++)
        assert_int_equal(pthread_join(t[i], NULL), 0);
    int failures = 0;
    for (int i = 0; i < THREADS; i++) {
        if (w[i].failures)
            print_error("%s (%d failures)\n", w[i].first, w[i].failures);
        failures += w[i].failures;
    }
    assert_int_equal(failures, 0);
    /* Each thread had its own stream, and the client lists them all. */
    size_t n;
    cube_stream_id *ids = all_streams(&n);
    for (int i = 0; i < THREADS; i++) {
        assert_true(w[i].stream != 0);
        assert_true(w[i].stream != cube_stream_current(conf.client));
        for (int j = 0; j < i; j++)
            assert_true(w[i].stream != w[j].stream);
        assert_true(contains(ids, n, w[i].stream));
    }
    free(ids);
}

CONF_TEST(stream_ids_lists_every_stream_used)
{
    const cube_stream_id extra = 0x7EA0000000000001ull;
    cube_handle h = conf_empty(64);
    CONF_OK(cube_stream_use(conf.client, extra));
    unsigned char buf[64] = {0};
    CONF_WRITE_OK(h, buf, sizeof buf);
    CONF_OK(cube_stream_use(conf.client, 0));
    size_t n;
    cube_stream_id *ids = all_streams(&n);
    assert_true(contains(ids, n, cube_stream_current(conf.client)));
    assert_true(contains(ids, n, extra));
    for (size_t i = 0; i < n; i++)
        for (size_t j = 0; j < i; j++)
            assert_true(ids[i] != ids[j]);
    free(ids);
    /* A smaller capacity copies fewer but still counts all. */
    size_t count = 0;
    cube_stream_id one[1] = {0};
    CONF_OK(cube_stream_ids(conf.client, one, 1, &count));
    assert_true(count >= 2);
    assert_true(one[0] != 0);
    conf_release(h);
}

CONF_TEST_NEEDS(stream_use_switches_and_restores_the_stream,
                CUBE_FEATURE_KERNELS)
{
    cube_stream_id own = cube_stream_current(conf.client);
    assert_true(own != 0);
    const cube_stream_id s1 = 0x7EA0000000000002ull, s2 = 0x7EA0000000000003ull;
    CONF_OK(cube_stream_use(conf.client, s1));
    assert_true(cube_stream_current(conf.client) == s1);
    /* Work on s1. */
    enum { COUNT = 500 };
    uint32_t got[COUNT];
    cube_handle y = conf_empty(sizeof got);
    cube_arg args[2] = {cube_arg_buffer(y), cube_arg_u32(11)};
    CONF_OK(conf_launch(conf.k.fill,
                        cube_count_static(conf_div_up(COUNT, 32), 1, 1), args,
                        2, CUBE_LAUNCH_EXECUTE));
    CONF_READ_OK(y, got, sizeof got);
    for (uint32_t i = 0; i < COUNT; i++)
        assert_int_equal(got[i], 11 + i);
    CONF_OK(cube_sync(conf.client, NULL, 0));
    /* Switch to s2 directly, then back to the own stream. */
    CONF_OK(cube_stream_use(conf.client, s2));
    assert_true(cube_stream_current(conf.client) == s2);
    CONF_OK(cube_flush(conf.client));
    CONF_OK(cube_stream_use(conf.client, 0));
    assert_true(cube_stream_current(conf.client) == own);
    CONF_OK(cube_stream_use(conf.client, 0)); /* idempotent */
    assert_true(cube_stream_current(conf.client) == own);
    /* The choice is per client: another client is not affected. */
    cube_client *other = NULL;
    CONF_OK(cube_client_open(conf.backend, NULL, &other));
    CONF_OK(cube_stream_use(conf.client, s1));
    assert_true(cube_stream_current(other) != s1);
    CONF_OK(cube_stream_use(conf.client, 0));
    cube_client_close(other);
    conf_release(y);
}

/* --- stream choices outlive no client --- */

enum { USE_CLIENTS = 8, USE_ROUNDS = 3 };

typedef struct use_result {
    int failures;
    char first[512];
} use_result;

static void use_fail(use_result *r, const char *what, cube_error *err)
{
    if (r->failures++ == 0)
        snprintf(r->first, sizeof r->first, "%s: %s", what,
                 err ? cube_error_message(err) : "unexpected success");
    cube_error_free(err);
}

/* Runs on a thread of its own, whose stream choices start empty. */
static void *use_on_closed_clients(void *arg)
{
    use_result *r = arg;
    const cube_stream_id id = 0x7EA0000000000010ull;
    cube_client *c[USE_CLIENTS + 1] = {NULL};
    /* Round after round the thread names a stream on 8 clients, which
     * then close: each round has the whole limit again. */
    for (int round = 0; round < USE_ROUNDS && !r->failures; round++) {
        for (int i = 0; i < USE_CLIENTS; i++) {
            cube_error *err = cube_client_open(conf.backend, NULL, &c[i]);
            if (err) {
                use_fail(r, "cube_client_open", err);
                break;
            }
            err = cube_stream_use(c[i], id + (cube_stream_id)i);
            if (err) {
                char what[96];
                snprintf(what, sizeof what,
                         "round %d, cube_stream_use on client %d", round, i);
                use_fail(r, what, err);
            } else if (cube_stream_current(c[i]) != id + (cube_stream_id)i) {
                use_fail(r, "cube_stream_current after cube_stream_use", NULL);
            }
        }
        if (round == USE_ROUNDS - 1 && !r->failures) {
            /* Eight open clients still fill the thread's choices... */
            cube_error *err = cube_client_open(conf.backend, NULL, &c[8]);
            if (err) {
                use_fail(r, "cube_client_open (ninth)", err);
            } else {
                err = cube_stream_use(c[8], id + 8);
                if (cube_error_code(err) != CUBE_ERR_RESOURCE_LIMIT)
                    use_fail(r, "the ninth open client's cube_stream_use", err);
                else
                    cube_error_free(err);
                /* ...until one is restored. */
                err = cube_stream_use(c[0], 0);
                if (!err)
                    err = cube_stream_use(c[8], id + 8);
                if (err)
                    use_fail(r, "cube_stream_use after restoring one", err);
                cube_client_close(c[8]);
            }
        }
        for (int i = 0; i < USE_CLIENTS; i++) {
            cube_client_close(c[i]);
            c[i] = NULL;
        }
    }
    /* A client opened later starts on the thread's own stream. */
    cube_client *fresh = NULL;
    cube_error *err = cube_client_open(conf.backend, NULL, &fresh);
    if (err) {
        use_fail(r, "cube_client_open (fresh)", err);
    } else {
        cube_stream_id own = cube_stream_current(fresh);
        if (own == 0 || (own >> 63) == 0)
            use_fail(r, "a fresh client's current stream is not the own one",
                     NULL);
        cube_client_close(fresh);
    }
    return NULL;
}

CONF_TEST(stream_use_choices_on_closed_clients_are_given_back)
{
    use_result r;
    memset(&r, 0, sizeof r);
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, use_on_closed_clients, &r), 0);
    pthread_join(t, NULL);
    if (r.failures)
        print_error("%d failure(s); the first: %s\n", r.failures, r.first);
    assert_int_equal(r.failures, 0);
}

typedef struct stream_peer {
    cube_handle y;
    int ok;
    char msg[512];
} stream_peer;

/* Reads the buffer from another thread (and so another stream). */
static void *peer_read(void *arg)
{
    stream_peer *p = arg;
    uint32_t got[256];
    cube_copy_desc d = cube_copy_desc_contiguous(p->y, sizeof got, 4);
    void *dst[1] = {got};
    uint64_t sz[1] = {sizeof got};
    cube_error *err = cube_read(conf.client, &d, dst, sz, 1);
    if (err) {
        char *text = cube_error_format(err);
        snprintf(p->msg, sizeof p->msg, "%s", text ? text : "?");
        free(text);
        cube_error_free(err);
        return NULL;
    }
    p->ok = 1;
    for (uint32_t i = 0; i < 256; i++)
        if (got[i] != 1000 + i) {
            snprintf(p->msg, sizeof p->msg, "y[%u] = %u", i, got[i]);
            p->ok = 0;
            break;
        }
    return NULL;
}

CONF_TEST_NEEDS(stream_work_written_on_one_stream_is_read_on_another,
                CUBE_FEATURE_KERNELS)
{
    const cube_stream_id sa = 0x7EA0000000000004ull, sb = 0x7EA0000000000005ull;
    uint32_t got[256];
    cube_handle y = conf_empty(sizeof got);
    /* Launch on A, read on B with no barrier: B waits for A's last write
     * of y. */
    CONF_OK(cube_stream_use(conf.client, sa));
    cube_arg args[2] = {cube_arg_buffer(y), cube_arg_u32(1000)};
    CONF_OK(conf_launch(conf.k.fill, cube_count_static(8, 1, 1), args, 2,
                        CUBE_LAUNCH_EXECUTE));
    CONF_OK(cube_stream_use(conf.client, sb));
    /* sync on B answers for y: it waits for y's last writer on A. */
    CONF_OK(cube_sync(conf.client, &y, 1));
    CONF_OK(cube_check(conf.client, &y, 1));
    CONF_READ_OK(y, got, sizeof got);
    for (uint32_t i = 0; i < 256; i++)
        assert_int_equal(got[i], 1000 + i);
    /* Written on B, launched on A reading it. */
    uint32_t v[256];
    for (uint32_t i = 0; i < 256; i++)
        v[i] = 0;
    cube_handle cnt_store = conf_create((uint32_t[3]){8, 1, 1}, 12);
    CONF_WRITE_OK(y, v, sizeof v);
    CONF_OK(cube_stream_use(conf.client, sa));
    cube_arg probe = cube_arg_buffer(y);
    CONF_OK(conf_launch(conf.k.count_probe, cube_count_dynamic(cnt_store),
                        &probe, 1, CUBE_LAUNCH_EXECUTE));
    CONF_OK(cube_stream_use(conf.client, 0));
    CONF_READ_OK(y, got, sizeof got);
    for (uint32_t i = 0; i < 256; i++)
        assert_int_equal(got[i], 8000 + i / 32);
    /* And from another thread, whose own stream is different again. */
    CONF_OK(cube_stream_use(conf.client, sa));
    CONF_OK(conf_launch(conf.k.fill, cube_count_static(8, 1, 1), args, 2,
                        CUBE_LAUNCH_EXECUTE));
    CONF_OK(cube_stream_use(conf.client, 0));
    stream_peer p;
    memset(&p, 0, sizeof p);
    p.y = y;
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, peer_read, &p), 0);
    assert_int_equal(pthread_join(t, NULL), 0);
    if (!p.ok)
        fail_msg("read on another thread: %s", p.msg);
    conf_release(cnt_store);
    conf_release(y);
}

/* --- memory statistics --- */

static cube_memory_usage usage_now(void)
{
    cube_memory_usage u;
    memset(&u, 0xAB, sizeof u);
    CONF_OK(cube_sync(conf.client, NULL, 0));
    CONF_OK(cube_memory_usage_get(conf.client, &u));
    assert_true(u.bytes_reserved >= u.bytes_in_use);
    assert_true(u.bytes_reserved >= u.bytes_in_use + u.bytes_padding);
    return u;
}

CONF_TEST(memory_usage_grows_and_shrinks_with_buffers)
{
    enum { K = 8, SIZE = 1000 };
    cube_memory_usage u0 = usage_now();
    cube_handle h[K];
    for (int i = 0; i < K; i++)
        h[i] = conf_empty(SIZE);
    cube_memory_usage u1 = usage_now();
    assert_int_equal(u1.buffers, u0.buffers + K);
    assert_int_equal(u1.bytes_in_use, u0.bytes_in_use + K * SIZE);
    assert_true(u1.bytes_reserved >= u0.bytes_in_use + K * SIZE);
    /* Slices and extra references are not new buffers. */
    cube_handle s = conf_slice(h[0], 10, 10);
    CONF_OK(cube_handle_retain(conf.client, h[1]));
    cube_memory_usage u2 = usage_now();
    assert_int_equal(u2.buffers, u1.buffers);
    assert_int_equal(u2.bytes_in_use, u1.bytes_in_use);
    conf_release(h[1]);
    for (int i = 0; i < K; i++)
        conf_release(h[i]);
    /* h[0] lives on through its slice. */
    cube_memory_usage u3 = usage_now();
    assert_int_equal(u3.buffers, u0.buffers + 1);
    assert_int_equal(u3.bytes_in_use, u0.bytes_in_use + SIZE);
    conf_release(s);
    cube_memory_usage u4 = usage_now();
    assert_int_equal(u4.buffers, u0.buffers);
    assert_int_equal(u4.bytes_in_use, u0.bytes_in_use);
    /* A large one. */
    cube_handle big = conf_empty(8u << 20);
    cube_memory_usage u5 = usage_now();
    assert_int_equal(u5.buffers, u0.buffers + 1);
    assert_int_equal(u5.bytes_in_use, u0.bytes_in_use + (8u << 20));
    conf_release(big);
    cube_memory_usage u6 = usage_now();
    assert_int_equal(u6.bytes_in_use, u0.bytes_in_use);
}

CONF_TEST(memory_cleanup_keeps_live_buffers_readable)
{
    enum { K = 16 };
    unsigned char keep[3000], got[3000];
    conf_pattern(keep, sizeof keep, 99);
    cube_handle live = conf_create(keep, sizeof keep);
    cube_handle tmp[K];
    for (int i = 0; i < K; i++)
        tmp[i] = conf_empty(4096 * (uint64_t)(i + 1));
    for (int i = 0; i < K; i++)
        conf_release(tmp[i]);
    cube_memory_usage before = usage_now();
    CONF_OK(cube_memory_cleanup(conf.client));
    cube_memory_usage after = usage_now();
    assert_int_equal(after.buffers, before.buffers);
    assert_int_equal(after.bytes_in_use, before.bytes_in_use);
    assert_true(after.bytes_reserved <= before.bytes_reserved);
    CONF_READ_OK(live, got, sizeof got);
    assert_memory_equal(got, keep, sizeof keep);
    /* And the sentinel too (checked again by the teardown). */
    unsigned char s[CONF_SENTINEL_BYTES];
    CONF_READ_OK(conf.sentinel, s, sizeof s);
    assert_memory_equal(s, conf.sentinel_bytes, sizeof s);
    /* Allocation works after cleanup; twice in a row is fine. */
    CONF_OK(cube_memory_cleanup(conf.client));
    cube_handle again = conf_create(keep, sizeof keep);
    CONF_READ_OK(again, got, sizeof got);
    assert_memory_equal(got, keep, sizeof keep);
    conf_release(again);
    conf_release(live);
}
