/* cube_memory_snapshot while other threads allocate, label, slice and
 * release: every entry is whole (its label matches its size), no buffer is
 * listed twice, and a buffer released before a snapshot began is not in
 * it. Run under ThreadSanitizer too (cmake -DCUBE_SANITIZE=thread), where
 * it checks the walk's pins against concurrent releases. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cubert/cubert.h>

#define WORKERS 2
#define ROUNDS 3000
#define LIVE 16

typedef struct shared {
    cube_client *client;
    /* Handles released so far, in order: one log per worker. */
    uint64_t released[WORKERS][ROUNDS];
    atomic_size_t released_count[WORKERS];
    atomic_int failed;
    atomic_int done;
} shared;

typedef struct worker_arg {
    shared *sh;
    int id;
} worker_arg;

static uint64_t size_of_round(int k)
{
    return 64u * (uint64_t)(1 + k % 7);
}

static void *worker(void *p)
{
    worker_arg *w = p;
    shared *sh = w->sh;
    cube_client *c = sh->client;
    cube_handle live[LIVE] = {{0}};
    cube_handle slice[LIVE] = {{0}};
    for (int k = 0; k < ROUNDS && !atomic_load(&sh->failed); k++) {
        int i = k % LIVE;
        if (live[i].bits) {
            /* The first handle goes first; the slice keeps the buffer
             * until it goes too: only then is the buffer released. */
            cube_error *e1 = cube_handle_release(c, live[i]);
            cube_error *e2 =
                slice[i].bits ? cube_handle_release(c, slice[i]) : NULL;
            if (e1 || e2)
                atomic_store(&sh->failed, 1);
            cube_error_free(e1);
            cube_error_free(e2);
            size_t n = atomic_load(&sh->released_count[w->id]);
            sh->released[w->id][n] = live[i].bits;
            atomic_store(&sh->released_count[w->id], n + 1);
            live[i].bits = slice[i].bits = 0;
        }
        uint64_t size = size_of_round(k);
        cube_error *err = cube_empty(c, size, &live[i]);
        if (!err && k % 2 == 0) {
            char label[32];
            snprintf(label, sizeof label, "size-%llu",
                     (unsigned long long)size);
            err = cube_handle_set_label(c, live[i], label);
        }
        if (!err && k % 3 == 0)
            err = cube_handle_slice(c, live[i], 0, 32, &slice[i]);
        if (err) {
            atomic_store(&sh->failed, 1);
            cube_error_free(err);
        }
    }
    for (int i = 0; i < LIVE; i++) {
        cube_error_free(cube_handle_release(c, live[i]));
        if (slice[i].bits)
            cube_error_free(cube_handle_release(c, slice[i]));
    }
    atomic_fetch_add(&sh->done, 1);
    return NULL;
}

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

/* One snapshot, checked. Returns how many it listed. */
static size_t check_snapshot(shared *sh, cube_buffer_info *list, size_t cap,
                             uint64_t *bits)
{
    size_t before[WORKERS];
    for (int w = 0; w < WORKERS; w++)
        before[w] = atomic_load(&sh->released_count[w]);
    list[0].struct_size = sizeof list[0];
    size_t count = 0;
    cube_error *err =
        cube_memory_snapshot(sh->client, CUBE_MEMORY_DEVICE, list, cap, &count);
    assert_null(err);
    size_t n = count < cap ? count : cap;
    for (size_t i = 0; i < n; i++) {
        const cube_buffer_info *b = &list[i];
        assert_int_equal(b->struct_size, sizeof *b);
        assert_true(b->handle.bits != 0);
        assert_true(b->size >= 64 && b->size <= 448 && b->size % 64 == 0);
        assert_int_equal(b->flags, 0);
        assert_true(b->pool != CUBE_BUFFER_NO_POOL);
        if (b->label[0]) {
            char want[32];
            snprintf(want, sizeof want, "size-%llu",
                     (unsigned long long)b->size);
            assert_string_equal(b->label, want);
        }
        bits[i] = b->handle.bits;
    }
    /* Listed once each. */
    qsort(bits, n, sizeof *bits, cmp_u64);
    for (size_t i = 1; i < n; i++)
        assert_true(bits[i] != bits[i - 1]);
    /* None released before the call began. */
    for (int w = 0; w < WORKERS; w++)
        for (size_t r = 0; r < before[w]; r++)
            assert_null(
                bsearch(&sh->released[w][r], bits, n, sizeof *bits, cmp_u64));
    return n;
}

static void snapshots_race_allocations_and_releases(void **state)
{
    (void)state;
    static shared sh;
    memset(&sh, 0, sizeof sh);
    assert_null(cube_client_open("cpu", NULL, &sh.client));
    pthread_t t[WORKERS];
    worker_arg args[WORKERS];
    for (int w = 0; w < WORKERS; w++) {
        args[w].sh = &sh;
        args[w].id = w;
        assert_int_equal(pthread_create(&t[w], NULL, worker, &args[w]), 0);
    }
    enum { CAP = WORKERS * LIVE + 8 };
    cube_buffer_info list[CAP];
    uint64_t bits[CAP];
    size_t snapshots = 0, listed = 0;
    while (atomic_load(&sh.done) < WORKERS) {
        listed += check_snapshot(&sh, list, CAP, bits);
        /* A short array: the count still covers everything. */
        listed += check_snapshot(&sh, list, 3, bits);
        snapshots += 2;
    }
    for (int w = 0; w < WORKERS; w++)
        pthread_join(t[w], NULL);
    assert_false(atomic_load(&sh.failed));
    assert_true(snapshots > 0);
    print_message("%zu snapshots, %zu entries while %d threads allocated\n",
                  snapshots, listed, WORKERS);
    /* Everything released: nothing listed. */
    size_t count = 1;
    assert_null(
        cube_memory_snapshot(sh.client, CUBE_MEMORY_DEVICE, NULL, 0, &count));
    assert_int_equal(count, 0);
    cube_client_close(sh.client);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(snapshots_race_allocations_and_releases),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
