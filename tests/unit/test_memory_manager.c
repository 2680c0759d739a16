/* Unit tests of the pooled memory manager: sliced, exclusive, persistent
 * and large-tail placement, routing and spill-over, caps, out-of-memory
 * retry, timed release, installing layouts, validation messages, presets,
 * reports and bad input. A fake storage counts, caps and refuses. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cubert/backend/errors.h"
#include "cubert/log.h"
#include "memory/mem_internal.h"
#include "memory/memory_manager.h"

#define KIB (1ull << 10)
#define MIB (1ull << 20)
#define GIB (1ull << 30)

/* --- a fake storage --- */

typedef struct fake_storage {
    int backed;            /* host memory behind each address */
    uint64_t next_address; /* unbacked: the next address handed out */
    uint64_t allocs, frees, live_bytes;
    uint64_t limit;      /* most live bytes; 0: no limit */
    int fail_next;       /* refuse this many requests */
    cube_code fail_code; /* with this code (0: CUBE_ERR_OUT_OF_MEMORY) */
    uint64_t refused;
} fake_storage;

static cube_error *fake_alloc(void *self, uint64_t size, uint64_t align,
                              uint64_t *address)
{
    fake_storage *s = self;
    if (s->fail_next > 0) {
        s->fail_next--;
        s->refused++;
        return cube_error_new(s->fail_code ? s->fail_code
                                           : CUBE_ERR_OUT_OF_MEMORY,
                              "injected failure");
    }
    if (s->limit && s->live_bytes + size > s->limit) {
        s->refused++;
        return cube_error_new(CUBE_ERR_OUT_OF_MEMORY, "over the limit");
    }
    uint64_t rounded = (size + align - 1) & ~(align - 1);
    if (s->backed) {
        void *p = aligned_alloc(align, rounded);
        if (!p)
            return cube_error_new(CUBE_ERR_OUT_OF_MEMORY, "host");
        *address = (uint64_t)(uintptr_t)p;
    } else {
        if (!s->next_address)
            s->next_address = 1ull << 44;
        s->next_address = (s->next_address + align - 1) & ~(align - 1);
        *address = s->next_address;
        s->next_address += rounded + align;
    }
    s->allocs++;
    s->live_bytes += size;
    return NULL;
}

static void fake_free(void *self, uint64_t address, uint64_t size)
{
    fake_storage *s = self;
    s->frees++;
    s->live_bytes -= size;
    if (s->backed)
        free((void *)(uintptr_t)address);
}

/* The storage refuses its next `n` requests. */
static void refuse_next(fake_storage *s, int n)
{
    s->fail_next = n;
}

static mem_manager *make(fake_storage *s, uint64_t align, uint64_t memory,
                         const cube_memory_layout *layout)
{
    mem_storage_ops ops = {s, fake_alloc, fake_free};
    mem_device dev = {align, memory};
    mem_manager *m = NULL;
    cube_error *err = mem_manager_create(&ops, &dev, layout, &m);
    if (err)
        fail_msg("create: %s", cube_error_message(err));
    return m;
}

static void add_pool(cube_memory_layout *l, cube_pool_kind kind, uint64_t page,
                     uint64_t min, uint64_t max, uint64_t cap)
{
    cube_pool_config *c = &l->pools[l->count++];
    memset(c, 0, sizeof *c);
    c->kind = kind;
    c->page_size = page;
    c->min_size = min;
    c->max_size = max;
    c->cap = cap;
}

static cube_memory_layout one_pool(cube_pool_kind kind, uint64_t page,
                                   uint64_t cap)
{
    cube_memory_layout l;
    memset(&l, 0, sizeof l);
    add_pool(&l, kind, page, 1, page, cap);
    return l;
}

/* Asserts `err` has `code` and its text holds `part` (NULL: any), then
 * frees it. */
static void expect_error(cube_error *err, cube_code code, const char *part)
{
    assert_non_null(err);
    char *text = cube_error_format(err);
    if (cube_error_code(err) != code || (part && !strstr(text, part)))
        fail_msg("expected code %d with \"%s\", got: %s", (int)code,
                 part ? part : "", text);
    free(text);
    cube_error_free(err);
}

static cube_storage take(mem_manager *m, uint64_t size)
{
    cube_storage st;
    cube_error *err = mem_alloc(m, size, &st);
    if (err)
        fail_msg("alloc %llu: %s", (unsigned long long)size,
                 cube_error_message(err));
    assert_int_equal(st.size, size);
    return st;
}

static cube_memory_usage usage_of(mem_manager *m)
{
    cube_memory_usage u;
    mem_usage(m, &u);
    return u;
}

static cube_memory_stats stats_of(mem_manager *m)
{
    cube_memory_stats st;
    memset(&st, 0, sizeof st);
    mem_stats_get(m, &st);
    return st;
}

static cube_memory_report report_of(mem_manager *m)
{
    cube_memory_report r;
    mem_report(m, &r);
    return r;
}

/* Report totals equal usage, and usage equals what the storage holds. */
static void check_totals(mem_manager *m, const fake_storage *s)
{
    cube_memory_report r = report_of(m);
    uint64_t buffers = 0, in_use = 0, reserved = 0;
    for (uint32_t i = 0; i < r.count; i++) {
        buffers += r.pools[i].buffers;
        in_use += r.pools[i].bytes_in_use;
        reserved += r.pools[i].bytes_reserved;
        assert_true(r.pools[i].pages_peak >= r.pools[i].pages);
        assert_true(r.pools[i].buffers_peak >= r.pools[i].buffers);
        assert_true(r.pools[i].bytes_in_use_peak >= r.pools[i].bytes_in_use);
        assert_true(r.pools[i].bytes_reserved_peak >=
                    r.pools[i].bytes_reserved);
    }
    cube_memory_usage u = usage_of(m);
    assert_int_equal(buffers, u.buffers);
    assert_int_equal(in_use, u.bytes_in_use);
    assert_int_equal(reserved, u.bytes_reserved);
    assert_memory_equal(&u, &r.usage, sizeof u);
    assert_true(u.bytes_reserved >= u.bytes_in_use + u.bytes_padding);
    if (s)
        assert_int_equal(u.bytes_reserved, s->live_bytes);
    /* The manager's own sums agree with the pools', and its storage
     * counters with what the storage saw. */
    cube_memory_stats st = stats_of(m);
    assert_int_equal(st.buffers, u.buffers);
    assert_int_equal(st.allocated_bytes, u.bytes_in_use);
    assert_int_equal(st.reserved_bytes, u.bytes_reserved);
    assert_int_equal(st.free_bytes,
                     u.bytes_reserved - u.bytes_in_use - u.bytes_padding);
    assert_true(st.allocated_bytes_peak >= st.allocated_bytes);
    assert_true(st.reserved_bytes_peak >= st.reserved_bytes);
    assert_true(st.free_bytes_peak >= st.free_bytes);
    assert_int_equal(st.pool_hits + st.pool_misses, st.allocations);
    assert_int_equal(st.allocations - st.releases, st.buffers);
    if (s) {
        assert_int_equal(st.device_allocations, s->allocs);
        assert_int_equal(st.device_frees, s->frees);
    }
}

/* The counters of a known sequence, the OOM path included. */
static void test_counters_follow_a_known_sequence(void **state)
{
    (void)state;
    fake_storage s = {0};
    s.limit = 8192;
    cube_memory_layout l;
    memset(&l, 0, sizeof l);
    add_pool(&l, CUBE_POOL_SLICED, 4096, 1, 4096, 0);
    mem_manager *m = make(&s, 64, 128 * MIB, &l);
    cube_memory_stats st = stats_of(m);
    assert_int_equal(st.allocations + st.device_allocations + st.oom_events, 0);
    /* Two pages taken (two misses), then both cached. */
    cube_storage a = take(m, 4096), b = take(m, 4096);
    mem_free(m, &a);
    mem_free(m, &b);
    st = stats_of(m);
    assert_int_equal(st.allocations, 2);
    assert_int_equal(st.pool_misses, 2);
    assert_int_equal(st.pool_hits, 0);
    assert_int_equal(st.releases, 2);
    assert_int_equal(st.device_allocations, 2);
    assert_int_equal(st.device_frees, 0);
    assert_int_equal(st.allocated_bytes, 0);
    assert_int_equal(st.allocated_bytes_peak, 8192);
    assert_int_equal(st.reserved_bytes, 8192);
    assert_int_equal(st.free_bytes, 8192);
    assert_int_equal(st.free_bytes_peak, 8192);
    assert_int_equal(st.buffers_peak, 2);
    /* The tail's 8192 bytes: refused, the two cached pages go back, the
     * retry succeeds. */
    cube_storage big = take(m, 8192);
    st = stats_of(m);
    assert_int_equal(st.oom_retries, 1);
    assert_int_equal(st.oom_events, 0);
    assert_int_equal(st.device_frees, 2);
    assert_int_equal(st.device_allocations, 3);
    assert_int_equal(st.pool_misses, 3);
    check_totals(m, &s);
    /* Nothing cached: refused with nothing to release, no retry. */
    cube_storage x;
    expect_error(mem_alloc(m, 100, &x), CUBE_ERR_OUT_OF_MEMORY, NULL);
    st = stats_of(m);
    assert_int_equal(st.oom_events, 1);
    assert_int_equal(st.oom_retries, 1);
    assert_int_equal(st.allocations, 3);
    mem_free(m, &big);
    /* A page, cached, then one injected refusal: released and retried. */
    a = take(m, 100);
    mem_free(m, &a);
    refuse_next(&s, 1);
    big = take(m, 5000);
    mem_free(m, &big);
    /* A new page (a miss), then a request it serves again (a hit). */
    a = take(m, 100);
    mem_free(m, &a);
    a = take(m, 200);
    mem_free(m, &a);
    st = stats_of(m);
    assert_int_equal(st.allocations, 7);
    assert_int_equal(st.releases, 7);
    assert_int_equal(st.pool_hits, 1);
    assert_int_equal(st.pool_misses, 6);
    assert_int_equal(st.device_allocations, 6);
    assert_int_equal(st.device_frees, 5);
    assert_int_equal(st.oom_events, 1);
    assert_int_equal(st.oom_retries, 2);
    assert_int_equal(st.reserved_bytes, 4096);
    assert_int_equal(st.reserved_bytes_peak, 8192);
    assert_int_equal(st.free_bytes, 4096);
    check_totals(m, &s);
    /* Peaks come down to the current values; counters stay. */
    mem_reset_peaks(m);
    st = stats_of(m);
    assert_int_equal(st.allocated_bytes_peak, 0);
    assert_int_equal(st.reserved_bytes_peak, 4096);
    assert_int_equal(st.free_bytes_peak, 4096);
    assert_int_equal(st.buffers_peak, 0);
    assert_int_equal(st.allocations, 7);
    mem_manager_destroy(m);
}

/* --- sliced pools --- */

static void test_two_slices_share_a_page(void **state)
{
    (void)state;
    fake_storage s = {0};
    cube_memory_layout l = one_pool(CUBE_POOL_SLICED, 2048, 0);
    mem_manager *m = make(&s, 32, 128 * MIB, &l);
    cube_storage a = take(m, 512), b = take(m, 512);
    assert_int_equal(s.allocs, 1);
    cube_memory_usage u = usage_of(m);
    assert_int_equal(u.buffers, 2);
    assert_int_equal(u.bytes_in_use, 1024);
    assert_int_equal(u.bytes_reserved, 2048);
    assert_true(a.address + 512 <= b.address || b.address + 512 <= a.address);
    check_totals(m, &s);
    mem_free(m, &a);
    mem_free(m, &b);
    assert_null(a.cookie);
    mem_manager_destroy(m);
    assert_int_equal(s.live_bytes, 0);
}

static void test_new_page_when_the_first_is_full(void **state)
{
    (void)state;
    fake_storage s = {0};
    cube_memory_layout l = one_pool(CUBE_POOL_SLICED, 1024, 0);
    mem_manager *m = make(&s, 32, 128 * MIB, &l);
    cube_storage a = take(m, 768), b = take(m, 768);
    assert_int_equal(s.allocs, 2);
    assert_int_equal(usage_of(m).bytes_in_use, 1536);
    assert_int_equal(usage_of(m).bytes_reserved, 2048);
    mem_free(m, &a);
    mem_free(m, &b);
    mem_manager_destroy(m);
}

static void test_padding_is_counted(void **state)
{
    (void)state;
    fake_storage s = {0};
    cube_memory_layout l = one_pool(CUBE_POOL_SLICED, 512, 0);
    mem_manager *m = make(&s, 64, 128 * MIB, &l);
    cube_storage a = take(m, 40), b = take(m, 40);
    assert_int_equal(a.address % 64, 0);
    assert_int_equal(b.address % 64, 0);
    cube_memory_usage u = usage_of(m);
    assert_int_equal(u.bytes_in_use, 80);
    assert_int_equal(u.bytes_padding, 48);
    assert_int_equal(u.bytes_reserved, 512);
    mem_free(m, &a);
    mem_free(m, &b);
    u = usage_of(m);
    assert_int_equal(u.bytes_padding, 0);
    assert_int_equal(u.bytes_in_use, 0);
    mem_manager_destroy(m);
}

static void test_same_size_reuses_the_freed_slot(void **state)
{
    (void)state;
    fake_storage s = {0};
    cube_memory_layout l = one_pool(CUBE_POOL_SLICED, 64 * KIB, 0);
    mem_manager *m = make(&s, 512, 128 * MIB, &l);
    /* Padded sizes: 1000 occupies 1024 bytes. */
    cube_storage a = take(m, 1000), b = take(m, 1000);
    uint64_t first = a.address;
    mem_free(m, &a);
    cube_storage c = take(m, 1000);
    assert_int_equal(c.address, first);
    /* Churn: free and take again, alternating sizes of the same extent. */
    for (int i = 0; i < 200; i++) {
        mem_free(m, &c);
        c = take(m, (i % 2) ? 1000 : 513);
        assert_int_equal(c.address, first);
    }
    assert_int_equal(s.allocs, 1);
    mem_free(m, &b);
    mem_free(m, &c);
    check_totals(m, &s);
    mem_manager_destroy(m);
}

static void test_no_padding_leak(void **state)
{
    (void)state;
    /* A reused padded slot that gets split must keep every byte: after
     * freeing everything the page is one free slice again and a cleanup
     * gives it back. */
    fake_storage s = {0};
    cube_memory_layout l = one_pool(CUBE_POOL_SLICED, 1024, 0);
    mem_manager *m = make(&s, 32, 128 * MIB, &l);
    cube_storage a = take(m, 40), b = take(m, 100);
    mem_free(m, &a);
    cube_storage c = take(m, 8);
    mem_free(m, &b);
    mem_free(m, &c);
    cube_storage whole = take(m, 1024); /* the whole page fits again */
    assert_int_equal(s.allocs, 1);
    mem_free(m, &whole);
    mem_cleanup(m);
    assert_int_equal(usage_of(m).bytes_reserved, 0);
    assert_int_equal(s.live_bytes, 0);
    mem_manager_destroy(m);
}

static void test_free_neighbours_merge(void **state)
{
    (void)state;
    fake_storage s = {0};
    cube_memory_layout l = one_pool(CUBE_POOL_SLICED, 4096, 0);
    mem_manager *m = make(&s, 64, 128 * MIB, &l);
    cube_storage q[4];
    for (int i = 0; i < 4; i++)
        q[i] = take(m, 1024);
    assert_int_equal(s.allocs, 1);
    uint64_t lowest = q[1].address < q[2].address ? q[1].address : q[2].address;
    mem_free(m, &q[1]);
    mem_free(m, &q[2]);
    cube_storage both = take(m, 2048);
    assert_int_equal(s.allocs, 1);
    assert_int_equal(both.address, lowest);
    /* Free in the other order too: the outer two and the middle merge. */
    mem_free(m, &both);
    mem_free(m, &q[0]);
    mem_free(m, &q[3]);
    cube_storage page = take(m, 4096);
    assert_int_equal(s.allocs, 1);
    mem_free(m, &page);
    check_totals(m, &s);
    mem_manager_destroy(m);
}

static void test_first_pool_holding_the_size_serves_it(void **state)
{
    (void)state;
    fake_storage s = {0};
    cube_memory_layout l;
    memset(&l, 0, sizeof l);
    for (uint64_t units = 100; units <= 400; units += 100)
        add_pool(&l, CUBE_POOL_SLICED, units * 64, 1, units * 64, 0);
    mem_manager *m = make(&s, 64, 128 * MIB, &l);
    cube_storage q[4];
    for (int i = 0; i < 4; i++)
        q[i] = take(m, (uint64_t)(50 + 100 * i) * 64);
    cube_memory_report r = report_of(m);
    assert_int_equal(r.count, 6);
    for (int i = 0; i < 4; i++)
        assert_int_equal(r.pools[i].pages, 1);
    assert_int_equal(r.usage.bytes_in_use, 800 * 64);
    assert_int_equal(r.usage.bytes_reserved, 1000 * 64);
    for (int i = 0; i < 4; i++)
        mem_free(m, &q[i]);
    mem_manager_destroy(m);
}

/* --- sliced pools of request-sized pages --- */

/* On a device of 4 GiB the page limit is 256 MiB: a sliced pool with
 * larger pages sizes each new page to its request, rounded up to 2 MiB,
 * at least 64 MiB and at most page_size; a pool with pages up to the
 * limit keeps whole pages. */
static void test_large_sliced_pages_fit_the_request(void **state)
{
    (void)state;
    fake_storage s = {0};
    cube_memory_layout l;
    memset(&l, 0, sizeof l);
    add_pool(&l, CUBE_POOL_SLICED, 256 * MIB, 1, 4 * MIB, 0);
    add_pool(&l, CUBE_POOL_SLICED, GIB, 4 * MIB + 1, GIB, 0);
    mem_manager *m = make(&s, 64, 4 * GIB, &l);
    /* Pages up to the limit are whole. */
    cube_storage small = take(m, MIB);
    assert_int_equal(s.live_bytes, 256 * MIB);
    /* A small request: a page of a quarter of the limit. */
    cube_storage a = take(m, 10 * MIB);
    assert_int_equal(s.allocs, 2);
    assert_int_equal(s.live_bytes, 320 * MIB);
    /* A large one: the request rounded up to 2 MiB. */
    uint64_t big = 300 * MIB + 5;
    cube_storage b = take(m, big);
    assert_int_equal(s.allocs, 3);
    assert_int_equal(s.live_bytes, 622 * MIB);
    assert_int_equal(usage_of(m).bytes_padding, 64 - 5);
    /* The rest of a page serves later requests. */
    cube_storage c = take(m, 40 * MIB);
    assert_int_equal(s.allocs, 3);
    assert_int_equal(c.address, a.address + 10 * MIB);
    check_totals(m, &s);
    /* A freed large page is split by smaller requests... */
    mem_free(m, &b);
    cube_storage d = take(m, 150 * MIB), e = take(m, 150 * MIB);
    assert_int_equal(s.allocs, 3);
    assert_int_equal(d.address, b.address);
    assert_int_equal(e.address, b.address + 150 * MIB);
    check_totals(m, &s);
    /* ... and merges back whole when they are freed. */
    mem_free(m, &e);
    mem_free(m, &d);
    b = take(m, 302 * MIB);
    assert_int_equal(s.allocs, 3);
    assert_int_equal(b.address, d.address);
    /* A request of page_size gets a page of page_size, the largest. */
    cube_storage whole = take(m, GIB);
    assert_int_equal(s.allocs, 4);
    assert_int_equal(s.live_bytes, 622 * MIB + GIB);
    cube_memory_report r = report_of(m);
    assert_int_equal(r.pools[1].pages, 3);
    assert_int_equal(r.pools[1].bytes_reserved, 366 * MIB + GIB);
    assert_int_equal(r.pools[1].largest_buffer, GIB);
    check_totals(m, &s);
    /* Nothing live in them: a cleanup gives every page back. */
    mem_free(m, &whole);
    mem_free(m, &a);
    mem_free(m, &b);
    mem_free(m, &c);
    mem_cleanup(m);
    assert_int_equal(s.live_bytes, 256 * MIB);
    mem_free(m, &small);
    mem_cleanup(m);
    assert_int_equal(s.live_bytes, 0);
    check_totals(m, &s);
    mem_manager_destroy(m);
}

static void test_large_sliced_pages_under_a_cap(void **state)
{
    (void)state;
    fake_storage s = {0};
    cube_memory_layout l = one_pool(CUBE_POOL_SLICED, GIB, GIB);
    mem_manager *m = make(&s, 64, 4 * GIB, &l);
    cube_storage a = take(m, 800 * MIB), b = take(m, 180 * MIB);
    assert_int_equal(s.live_bytes, 980 * MIB);
    /* 44 MiB left under the cap: not the 64 MiB a small request's page
     * would have, so a page of just the request. */
    cube_storage c = take(m, 10 * MIB);
    assert_int_equal(s.allocs, 3);
    assert_int_equal(s.live_bytes, 990 * MIB);
    cube_storage x;
    expect_error(mem_alloc(m, 40 * MIB, &x), CUBE_ERR_POOL_CAPACITY_EXCEEDED,
                 "cap of 1073741824");
    /* A free page serves what it holds. */
    mem_free(m, &b);
    b = take(m, 60 * MIB);
    x = take(m, 40 * MIB);
    assert_int_equal(s.allocs, 3);
    mem_free(m, &b);
    mem_free(m, &x);
    mem_cleanup(m);
    assert_int_equal(s.live_bytes, 810 * MIB);
    b = take(m, 200 * MIB);
    assert_int_equal(s.live_bytes, 1010 * MIB);
    check_totals(m, &s);
    mem_free(m, &a);
    mem_free(m, &b);
    mem_free(m, &c);
    mem_manager_destroy(m);
    assert_int_equal(s.live_bytes, 0);
}

static void test_large_page_shrinks_when_storage_refuses(void **state)
{
    (void)state;
    fake_storage s = {0};
    s.limit = 100 * MIB;
    cube_memory_layout l = one_pool(CUBE_POOL_SLICED, GIB, 0);
    mem_manager *m = make(&s, 64, 4 * GIB, &l);
    cube_storage a = take(m, 70 * MIB);
    /* A page of 64 MiB does not fit beside it; one of 10 MiB does. */
    cube_storage b = take(m, 10 * MIB);
    assert_int_equal(s.refused, 1);
    assert_int_equal(s.live_bytes, 80 * MIB);
    check_totals(m, &s);
    /* Nor does 40 MiB, whatever the page: out of memory, nothing held. */
    cube_storage x;
    expect_error(mem_alloc(m, 40 * MIB, &x), CUBE_ERR_OUT_OF_MEMORY, NULL);
    assert_int_equal(usage_of(m).buffers, 2);
    /* With b's page unused, the out-of-memory release gives it back and
     * the retry fits. */
    mem_free(m, &b);
    x = take(m, 30 * MIB);
    assert_int_equal(s.live_bytes, 100 * MIB);
    assert_int_equal(report_of(m).pools[0].pages, 2);
    check_totals(m, &s);
    mem_free(m, &a);
    mem_free(m, &x);
    mem_manager_destroy(m);
    assert_int_equal(s.live_bytes, 0);
}

/* A training-like loop through the default preset: large buffers whose
 * sizes follow a sequence length that changes from one iteration to the
 * next. Pages held for one length serve the others: once the longest
 * length has run, no length needs new storage, and the storage holds
 * little more than the most ever live (each new longest length adds a
 * page for its largest buffer while the pages of the shorter ones are in
 * use; with exclusive pages per size it held three times the most
 * live). */
static void test_varying_large_sizes_reuse_pages(void **state)
{
    (void)state;
    fake_storage s = {0};
    mem_manager *m = make(&s, 512, 80 * GIB, NULL);
    static const uint64_t weights[] = {48 * MIB, 16 * MIB, 16 * MIB, 12 * MIB,
                                       4 * MIB,  64 * MIB, 500 * KIB};
    enum { W = sizeof weights / sizeof weights[0], LAYERS = 8, PER = 4 };
    static const uint64_t lengths[] = {512, 640,  1024, 768, 896,
                                       512, 1024, 640,  768, 512};
    enum { ITERS = sizeof lengths / sizeof lengths[0] };
    cube_storage w[W], act[LAYERS * PER + 2];
    uint64_t live = 0, live_peak = 0, held_peak = 0;
    uint64_t allocs_after_longest = 0, held_after_longest = 0;
    for (int i = 0; i < W; i++) {
        w[i] = take(m, weights[i]);
        live += weights[i];
    }
    for (int it = 0; it < ITERS; it++) {
        uint64_t len = lengths[it];
        uint64_t sizes[PER] = {len * 32 * KIB, len * 8 * KIB + 512,
                               len * 24 * KIB, len * 2 * KIB};
        size_t n = 0;
        for (int layer = 0; layer < LAYERS; layer++) {
            for (int k = 0; k < PER; k++) {
                act[n++] = take(m, sizes[k]);
                live += sizes[k];
            }
            /* A temporary between layers. */
            cube_storage t = take(m, len * 16 * KIB);
            if (live + len * 16 * KIB > live_peak)
                live_peak = live + len * 16 * KIB;
            mem_free(m, &t);
        }
        /* The head: logits, then their fp32 copy. */
        act[n++] = take(m, len * 250 * KIB);
        act[n++] = take(m, len * 500 * KIB);
        live += len * 750 * KIB;
        if (live > live_peak)
            live_peak = live;
        if (s.live_bytes > held_peak)
            held_peak = s.live_bytes;
        check_totals(m, &s);
        while (n > 0) {
            n--;
            live -= act[n].size;
            mem_free(m, &act[n]);
        }
        if (it == 2) {
            allocs_after_longest = s.allocs;
            held_after_longest = s.live_bytes;
        }
    }
    if (held_peak * 100 > live_peak * 120)
        fail_msg("the storage held %llu bytes for at most %llu live",
                 (unsigned long long)held_peak, (unsigned long long)live_peak);
    assert_int_equal(s.allocs, allocs_after_longest);
    assert_int_equal(s.live_bytes, held_after_longest);
    for (int i = 0; i < W; i++)
        mem_free(m, &w[i]);
    check_totals(m, &s);
    mem_manager_destroy(m);
    assert_int_equal(s.live_bytes, 0);
}

/* --- caps and spill-over --- */

static void test_capped_pool_spills_to_the_next(void **state)
{
    (void)state;
    fake_storage s = {0};
    cube_memory_layout l;
    memset(&l, 0, sizeof l);
    add_pool(&l, CUBE_POOL_SLICED, 1024, 1, 1024, 1024);
    add_pool(&l, CUBE_POOL_SLICED, 1024, 1, 1024, 0);
    mem_manager *m = make(&s, 32, 128 * MIB, &l);
    cube_storage a = take(m, 1024), b = take(m, 1024);
    cube_memory_report r = report_of(m);
    assert_int_equal(r.usage.bytes_reserved, 2048);
    assert_int_equal(r.pools[0].pages_peak, 1);
    assert_int_equal(r.pools[1].pages_peak, 1);
    /* A freed slot in the first pool is preferred again. */
    uint64_t in_first = a.address;
    mem_free(m, &a);
    a = take(m, 512);
    assert_int_equal(a.address, in_first);
    mem_free(m, &a);
    mem_free(m, &b);
    mem_manager_destroy(m);
}

static void test_capacity_exceeded(void **state)
{
    (void)state;
    fake_storage s = {0};
    cube_memory_layout l = one_pool(CUBE_POOL_SLICED, 1024, 2048);
    mem_manager *m = make(&s, 32, 128 * MIB, &l);
    cube_storage a = take(m, 1024), b = take(m, 1024), c;
    cube_error *err = mem_alloc(m, 1000, &c);
    assert_int_equal(cube_error_code(err), CUBE_ERR_POOL_CAPACITY_EXCEEDED);
    const char *msg = cube_error_message(err);
    assert_non_null(strstr(msg, "1000 bytes"));
    assert_non_null(strstr(msg, "cap of 2048"));
    assert_non_null(strstr(msg, "2048 bytes in use"));
    cube_error_free(err);
    assert_int_equal(usage_of(m).bytes_reserved, 2048);
    /* Freed memory is reused under the cap. */
    mem_free(m, &a);
    c = take(m, 1024);
    assert_int_equal(usage_of(m).bytes_reserved, 2048);
    mem_free(m, &b);
    mem_free(m, &c);
    mem_cleanup(m);
    assert_int_equal(usage_of(m).bytes_reserved, 0);
    a = take(m, 1024);
    b = take(m, 1024);
    expect_error(mem_alloc(m, 1024, &c), CUBE_ERR_POOL_CAPACITY_EXCEEDED, NULL);
    mem_free(m, &a);
    mem_free(m, &b);
    mem_manager_destroy(m);
}

static void test_capped_pool_keeps_to_its_range(void **state)
{
    (void)state;
    fake_storage s = {0};
    cube_memory_layout l;
    memset(&l, 0, sizeof l);
    add_pool(&l, CUBE_POOL_SLICED, MIB, 1, 64 * KIB, 2 * MIB);
    add_pool(&l, CUBE_POOL_SLICED, 16 * MIB, 1, 16 * MIB, 32 * MIB);
    mem_manager *m = make(&s, 32, 128 * MIB, &l);
    cube_storage q[5];
    for (int i = 0; i < 4; i++)
        q[i] = take(m, MIB);
    assert_int_equal(usage_of(m).bytes_reserved, 16 * MIB);
    q[4] = take(m, 4 * KIB);
    assert_int_equal(usage_of(m).bytes_reserved, 17 * MIB);
    for (int i = 0; i < 5; i++)
        mem_free(m, &q[i]);
    mem_manager_destroy(m);
}

/* --- the large tail and sizes --- */

static void test_large_tail_reserves_the_rounded_size(void **state)
{
    (void)state;
    fake_storage s = {0};
    cube_memory_layout l;
    memset(&l, 0, sizeof l);
    add_pool(&l, CUBE_POOL_SLICED, 4096, 1, 1024, 0);
    mem_manager *m = make(&s, 64, 128 * MIB, &l);
    uint64_t size = MIB + 17, rounded = MIB + 64;
    cube_storage a = take(m, size);
    assert_int_equal(a.address % 64, 0);
    assert_int_equal(s.live_bytes, rounded);
    cube_memory_report r = report_of(m);
    assert_int_equal(r.count, 3);
    const cube_pool_report *tail = &r.pools[1];
    assert_int_equal(tail->config.kind, CUBE_POOL_EXCLUSIVE);
    assert_int_equal(tail->config.page_size, 0);
    assert_int_equal(tail->config.min_size, 1025);
    assert_int_equal(tail->bytes_reserved, rounded);
    assert_int_equal(tail->bytes_in_use, size);
    assert_int_equal(tail->buffers, 1);
    assert_int_equal(tail->largest_buffer, size);
    assert_int_equal(r.usage.bytes_padding, rounded - size);
    assert_int_equal(r.pools[2].config.kind, CUBE_POOL_PERSISTENT);
    check_totals(m, &s);
    /* Tail blocks go straight back. */
    mem_free(m, &a);
    assert_int_equal(s.live_bytes, 0);
    mem_manager_destroy(m);
}

static void test_only_sizes_above_the_device_are_too_big(void **state)
{
    (void)state;
    fake_storage s = {0};
    uint64_t memory = 16 * GIB;
    mem_manager *m = make(&s, 512, memory, NULL);
    cube_storage half = take(m, memory / 2);
    mem_free(m, &half);
    cube_storage most = take(m, memory / 4 * 3 + 1);
    mem_free(m, &most);
    cube_storage all = take(m, memory);
    mem_free(m, &all);
    cube_storage x;
    expect_error(mem_alloc(m, memory + 1, &x), CUBE_ERR_BUFFER_TOO_BIG, NULL);
    expect_error(mem_alloc(m, UINT64_MAX, &x), CUBE_ERR_BUFFER_TOO_BIG, NULL);
    expect_error(mem_alloc(m, UINT64_MAX - 511, &x), CUBE_ERR_BUFFER_TOO_BIG,
                 NULL);
    expect_error(mem_alloc(m, 0, &x), CUBE_ERR_INVALID_ARGUMENT, "0 bytes");
    assert_int_equal(usage_of(m).buffers, 0);
    mem_manager_destroy(m);
    assert_int_equal(s.live_bytes, 0);

    /* A device as large as the address space: sizes near UINT64_MAX. */
    fake_storage huge = {0};
    huge.limit = 1ull << 40;
    cube_memory_layout l = one_pool(CUBE_POOL_SLICED, 4096, 0);
    m = make(&huge, 4096, UINT64_MAX & ~4095ull, &l);
    expect_error(mem_alloc(m, UINT64_MAX, &x), CUBE_ERR_BUFFER_TOO_BIG, NULL);
    expect_error(mem_alloc(m, UINT64_MAX - 4096, &x), CUBE_ERR_OUT_OF_MEMORY,
                 NULL);
    assert_int_equal(usage_of(m).bytes_reserved, 0);
    mem_manager_destroy(m);
}

/* --- out of memory --- */

static void test_out_of_memory_releases_then_retries(void **state)
{
    (void)state;
    fake_storage s = {0};
    s.limit = 8192;
    cube_memory_layout l;
    memset(&l, 0, sizeof l);
    add_pool(&l, CUBE_POOL_SLICED, 4096, 1, 4096, 0);
    mem_manager *m = make(&s, 64, 128 * MIB, &l);
    cube_storage a = take(m, 4096), b = take(m, 4096);
    mem_free(m, &a);
    mem_free(m, &b);
    assert_int_equal(usage_of(m).bytes_reserved, 8192);
    /* The tail needs 8192 bytes: the storage refuses, the cached pages go
     * back, the retry succeeds. */
    cube_storage big = take(m, 8192);
    assert_int_equal(s.refused, 1);
    assert_int_equal(usage_of(m).bytes_reserved, 8192);
    check_totals(m, &s);
    /* Nothing cached: the refusal is final. */
    cube_storage x;
    expect_error(mem_alloc(m, 100, &x), CUBE_ERR_OUT_OF_MEMORY, "4096");
    assert_int_equal(usage_of(m).buffers, 1);
    mem_free(m, &big);
    /* One injected refusal with a page cached: released, then retried. */
    a = take(m, 100);
    mem_free(m, &a);
    refuse_next(&s, 1);
    big = take(m, 5000);
    assert_int_equal(usage_of(m).bytes_reserved, 5056);
    mem_free(m, &big);
    /* Two refusals: the error stands and nothing is left cached. */
    a = take(m, 100);
    mem_free(m, &a);
    refuse_next(&s, 2);
    expect_error(mem_alloc(m, 5000, &x), CUBE_ERR_OUT_OF_MEMORY, "injected");
    assert_int_equal(usage_of(m).bytes_reserved, 0);
    check_totals(m, &s);
    mem_manager_destroy(m);
}

/* A storage that answers a device fault (a broken CUDA context) is not
 * short of memory: the fault comes back as it is, without releasing
 * anything or asking again, from every kind of pool. */
static void test_device_fault_is_not_out_of_memory(void **state)
{
    (void)state;
    static const cube_pool_kind kinds[] = {CUBE_POOL_SLICED,
                                           CUBE_POOL_EXCLUSIVE};
    for (size_t k = 0; k < 2; k++) {
        fake_storage s = {0};
        s.fail_code = CUBE_ERR_DEVICE_FAULT;
        cube_memory_layout l = one_pool(kinds[k], 4096, 0);
        mem_manager *m = make(&s, 64, 128 * MIB, &l);
        /* The one page is in use: the next needs the storage, as does a
         * tail. */
        cube_storage held = take(m, 4000);
        cube_storage x;
        refuse_next(&s, 1);
        expect_error(mem_alloc(m, 4000, &x), CUBE_ERR_DEVICE_FAULT, "injected");
        assert_int_equal(s.refused, 1);
        refuse_next(&s, 1);
        expect_error(mem_alloc(m, 64 * KIB, &x), CUBE_ERR_DEVICE_FAULT,
                     "injected");
        assert_int_equal(s.refused, 2);
        mem_free(m, &held);
        check_totals(m, &s);
        mem_manager_destroy(m);
    }
}

/* --- exclusive pools --- */

static void test_exclusive_pages(void **state)
{
    (void)state;
    fake_storage s = {0};
    cube_memory_layout l = one_pool(CUBE_POOL_EXCLUSIVE, 512, 0);
    mem_manager *m = make(&s, 32, 128 * MIB, &l);
    cube_storage a = take(m, 100);
    cube_memory_usage first = usage_of(m);
    assert_int_equal(first.bytes_in_use, 100);
    assert_true(first.bytes_reserved >= 100 && first.bytes_reserved <= 512);
    uint64_t address = a.address;
    mem_free(m, &a);
    a = take(m, 100);
    assert_int_equal(a.address, address);
    cube_memory_usage again = usage_of(m);
    assert_memory_equal(&first, &again, sizeof first);
    cube_storage b = take(m, 100);
    assert_int_equal(s.allocs, 2);
    mem_free(m, &a);
    mem_free(m, &b);
    mem_manager_destroy(m);

    /* One buffer per page; a page much larger than the request is not
     * taken for it. */
    memset(&s, 0, sizeof s);
    l = one_pool(CUBE_POOL_EXCLUSIVE, MIB, 0);
    m = make(&s, 64, 128 * MIB, &l);
    a = take(m, 768);
    b = take(m, 768);
    assert_int_equal(s.allocs, 2);
    assert_int_equal(usage_of(m).bytes_reserved, 1536);
    cube_storage big = take(m, 64 * KIB);
    mem_free(m, &big);
    cube_storage small = take(m, 1000);
    assert_int_equal(s.allocs, 4);
    assert_int_equal(usage_of(m).bytes_padding, 24);
    /* A request a little smaller than a free page reuses it. */
    cube_storage near = take(m, 60 * KIB);
    assert_int_equal(s.allocs, 4);
    assert_int_equal(usage_of(m).bytes_padding, 24 + 4 * KIB);
    check_totals(m, &s);
    mem_free(m, &a);
    mem_free(m, &b);
    mem_free(m, &small);
    mem_free(m, &near);
    mem_manager_destroy(m);
}

static void test_capped_exclusive_pool_uses_its_free_pages(void **state)
{
    (void)state;
    fake_storage s = {0};
    cube_memory_layout l = one_pool(CUBE_POOL_EXCLUSIVE, 4096, 4096);
    mem_manager *m = make(&s, 64, 128 * MIB, &l);
    cube_storage a = take(m, 4096);
    mem_free(m, &a);
    /* No room for a new page: the large free page serves. */
    cube_storage b = take(m, 100);
    assert_int_equal(b.address, a.address);
    mem_free(m, &b);
    mem_cleanup(m);
    b = take(m, 2048);
    cube_storage c = take(m, 2048);
    cube_storage d;
    expect_error(mem_alloc(m, 64, &d), CUBE_ERR_POOL_CAPACITY_EXCEEDED, "64");
    /* A larger page fits once the free small ones are given back. */
    mem_free(m, &b);
    mem_free(m, &c);
    a = take(m, 3000);
    assert_int_equal(report_of(m).pools[0].pages, 1);
    cube_storage e = take(m, 1000);
    assert_int_equal(usage_of(m).bytes_reserved, 3008 + 1024);
    check_totals(m, &s);
    mem_free(m, &a);
    mem_free(m, &e);
    mem_manager_destroy(m);
}

static void sleep_ms(long ms)
{
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0) {
    }
}

static void test_exclusive_pages_released_after_a_while(void **state)
{
    (void)state;
    fake_storage s = {0};
    cube_memory_layout l;
    memset(&l, 0, sizeof l);
    add_pool(&l, CUBE_POOL_SLICED, 4096, 1, 256, 0);
    add_pool(&l, CUBE_POOL_EXCLUSIVE, MIB, 257, MIB, 0);
    add_pool(&l, CUBE_POOL_EXCLUSIVE, 2 * MIB, MIB + 1, 2 * MIB, 0);
    l.pools[1].release_after_ms = 1;
    mem_manager *m = make(&s, 64, 128 * MIB, &l);
    cube_storage a = take(m, 10000), b = take(m, 2 * MIB);
    mem_free(m, &a);
    mem_free(m, &b);
    assert_int_equal(report_of(m).pools[1].pages, 1);
    sleep_ms(5);
    /* Any request looks at the clock: a sliced one here. */
    cube_storage c = take(m, 100);
    cube_memory_report r = report_of(m);
    assert_int_equal(r.pools[1].pages, 0);
    assert_int_equal(r.pools[1].pages_peak, 1);
    /* release_after_ms 0: kept until cleanup. */
    assert_int_equal(r.pools[2].pages, 1);
    /* A free looks too. */
    a = take(m, 10000);
    mem_free(m, &a);
    assert_int_equal(report_of(m).pools[1].pages, 1);
    sleep_ms(5);
    mem_free(m, &c);
    assert_int_equal(report_of(m).pools[1].pages, 0);
    mem_cleanup(m);
    assert_int_equal(report_of(m).pools[2].pages, 0);
    check_totals(m, &s);
    assert_int_equal(s.live_bytes, 0);
    mem_manager_destroy(m);
}

static void test_cleanup_keeps_live_blocks(void **state)
{
    (void)state;
    fake_storage s = {0};
    s.backed = 1;
    cube_memory_layout l = one_pool(CUBE_POOL_EXCLUSIVE, 1024, 0);
    mem_manager *m = make(&s, 64, 128 * MIB, &l);
    cube_storage a = take(m, 1024), b = take(m, 1024), c = take(m, 1024);
    memset((void *)(uintptr_t)b.address, 0x5a, 1024);
    mem_free(m, &a);
    mem_free(m, &c);
    mem_cleanup(m);
    assert_int_equal(usage_of(m).bytes_reserved, 1024);
    const unsigned char *p = (const unsigned char *)(uintptr_t)b.address;
    assert_int_equal(p[0], 0x5a);
    assert_int_equal(p[1023], 0x5a);
    mem_free(m, &b);
    mem_manager_destroy(m);
    assert_int_equal(s.live_bytes, 0);
}

/* --- the persistent pool --- */

static void test_persistent_exact_size_reuse(void **state)
{
    (void)state;
    fake_storage s = {0};
    cube_memory_layout l = one_pool(CUBE_POOL_SLICED, 4096, 0);
    mem_manager *m = make(&s, 64, 128 * MIB, &l);
    mem_set_persistent(m, 1);
    cube_storage a = take(m, 1024);
    cube_memory_report r = report_of(m);
    const cube_pool_report *per = &r.pools[2];
    assert_int_equal(per->config.kind, CUBE_POOL_PERSISTENT);
    assert_int_equal(per->bytes_in_use, 1024);
    assert_int_equal(r.pools[0].pages_peak, 0);
    /* Live: not reused. */
    cube_storage b = take(m, 1024);
    assert_int_equal(s.allocs, 2);
    r = report_of(m);
    assert_int_equal(r.pools[2].bytes_in_use, 2048);
    assert_int_equal(r.pools[2].bytes_reserved, 2048);
    uint64_t freed = a.address;
    mem_free(m, &a);
    /* Another rounded size gets its own block. */
    cube_storage c = take(m, 1100);
    assert_int_equal(s.allocs, 3);
    /* The same rounded size reuses it. */
    a = take(m, 1000);
    assert_int_equal(a.address, freed);
    assert_int_equal(s.allocs, 3);
    r = report_of(m);
    assert_int_equal(r.pools[2].buffers, 3);
    assert_int_equal(r.pools[2].pages, 3);
    check_totals(m, &s);
    /* Cleanup gives back only the free ones. */
    mem_free(m, &c);
    mem_cleanup(m);
    r = report_of(m);
    assert_int_equal(r.pools[2].pages, 2);
    assert_int_equal(r.pools[2].bytes_reserved, 2048);
    c = take(m, 1100);
    assert_int_equal(s.allocs, 4);
    /* Back to routing by size. */
    mem_set_persistent(m, 0);
    cube_storage d = take(m, 1024);
    r = report_of(m);
    assert_int_equal(r.pools[0].buffers, 1);
    assert_int_equal(r.pools[2].buffers, 3);
    mem_free(m, &a);
    mem_free(m, &b);
    mem_free(m, &c);
    mem_free(m, &d);
    mem_cleanup(m);
    assert_int_equal(s.live_bytes, 0);
    check_totals(m, &s);
    mem_manager_destroy(m);
}

/* --- installing layouts --- */

static void test_install(void **state)
{
    (void)state;
    fake_storage s = {0};
    cube_memory_layout small = one_pool(CUBE_POOL_SLICED, MIB, 2 * MIB);
    mem_manager *m = make(&s, 64, 128 * MIB, &small);
    cube_storage a = take(m, MIB);
    cube_memory_layout big = one_pool(CUBE_POOL_SLICED, 4 * MIB, 0);
    expect_error(mem_install(m, &big), CUBE_ERR_POOLS_IN_USE, "1 buffers");
    /* The old layout stays: 2 MiB goes to the tail, not to a 4 MiB pool. */
    cube_memory_report r = report_of(m);
    assert_int_equal(r.pools[0].config.page_size, MIB);
    cube_storage b = take(m, 2 * MIB);
    r = report_of(m);
    assert_int_equal(r.pools[1].buffers, 1);
    mem_free(m, &b);
    /* A live persistent block blocks it too. */
    mem_free(m, &a);
    mem_set_persistent(m, 1);
    a = take(m, 100);
    mem_set_persistent(m, 0);
    expect_error(mem_install(m, &big), CUBE_ERR_POOLS_IN_USE, NULL);
    mem_free(m, &a);
    /* An invalid layout changes nothing. */
    cube_memory_layout broken = big;
    broken.pools[0].page_size = 1000;
    expect_error(mem_install(m, &broken), CUBE_ERR_INVALID_ARGUMENT,
                 "page_size");
    assert_int_equal(report_of(m).pools[0].config.page_size, MIB);
    /* Nothing live: everything held goes back, the new pools come. */
    assert_true(s.live_bytes > 0);
    assert_null(mem_install(m, &big));
    assert_int_equal(s.live_bytes, 0);
    b = take(m, 2 * MIB);
    r = report_of(m);
    assert_int_equal(r.count, 3);
    assert_int_equal(r.pools[0].config.page_size, 4 * MIB);
    assert_int_equal(r.pools[0].buffers, 1);
    assert_int_equal(r.pools[0].pages_peak, 1);
    assert_int_equal(r.pools[1].config.min_size, 4 * MIB + 1);
    check_totals(m, &s);
    mem_free(m, &b);
    mem_manager_destroy(m);
}

static void test_measured_plan_cycle(void **state)
{
    (void)state;
    fake_storage s = {0};
    cube_memory_layout grow = one_pool(CUBE_POOL_SLICED, MIB, 0);
    mem_manager *m = make(&s, 64, 128 * MIB, &grow);
    for (int pass = 0; pass < 2; pass++) {
        cube_storage a = take(m, 600 * KIB), b = take(m, 600 * KIB);
        mem_free(m, &a);
        cube_storage c = take(m, 900 * KIB);
        mem_free(m, &b);
        mem_free(m, &c);
        cube_memory_report r = report_of(m);
        assert_int_equal(r.pools[0].largest_buffer, 900 * KIB);
        assert_int_equal(r.pools[0].pages_peak, 2);
        if (pass == 0) {
            mem_cleanup(m);
            cube_memory_layout plan = one_pool(CUBE_POOL_SLICED, MIB, 2 * MIB);
            assert_null(mem_install(m, &plan));
        }
    }
    mem_manager_destroy(m);
}

/* --- layouts: validation and presets --- */

static void test_every_mistake_has_its_message(void **state)
{
    (void)state;
    mem_device dev = {64, 64 * MIB};
    cube_memory_layout good;
    memset(&good, 0, sizeof good);
    add_pool(&good, CUBE_POOL_SLICED, 4096, 1, 1024, 0);
    add_pool(&good, CUBE_POOL_EXCLUSIVE, MIB, 1025, MIB, 4 * MIB);
    assert_null(mem_layout_validate(&good, &dev));

    cube_memory_layout l = good;
    l.count = 0;
    expect_error(mem_layout_validate(&l, &dev), CUBE_ERR_INVALID_ARGUMENT,
                 "no pools");
    l.count = CUBE_MAX_POOLS + 1;
    expect_error(mem_layout_validate(&l, &dev), CUBE_ERR_INVALID_ARGUMENT,
                 "count 17");
    static const struct {
        const char *part;
        int what;
    } cases[] = {
        {"pool 1: kind is CUBE_POOL_PERSISTENT", 0},
        {"pool 1: kind 7", 1},
        {"pool 1: page_size is 0", 2},
        {"pool 1: page_size 1000 is not a multiple of the alignment 64", 3},
        {"pool 1: min_size 2000000 is above max_size 1048576", 4},
        {"pool 1: max_size 2097152 is above page_size 1048576", 5},
        {"pool 1: cap 4096 is below one page", 6},
        {"pool 1: min_size..max_size (1..512)", 7},
        {"pool 1: page_size 134217728 is larger than the device", 8},
        {"pool 1: max_size is 0", 9},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        l = good;
        cube_pool_config *c = &l.pools[1];
        switch (cases[i].what) {
        case 0: c->kind = CUBE_POOL_PERSISTENT; break;
        case 1: c->kind = (cube_pool_kind)7; break;
        case 2: c->page_size = 0; break;
        case 3: c->page_size = 1000; break;
        case 4: c->min_size = 2000000; break;
        case 5: c->max_size = 2 * MIB; break;
        case 6: c->cap = 4096; break;
        case 7:
            c->min_size = 1;
            c->max_size = 512;
            break;
        case 8:
            c->cap = 0;
            c->page_size = 128 * MIB;
            c->max_size = 64 * MIB;
            break;
        default:
            c->min_size = 0;
            c->max_size = 0;
            break;
        }
        expect_error(mem_layout_validate(&l, &dev), CUBE_ERR_INVALID_ARGUMENT,
                     cases[i].part);
    }
    /* A capped pool spills over, so it hides nothing behind it. */
    l = good;
    l.pools[0].cap = 8192;
    l.pools[1] = l.pools[0];
    l.pools[1].cap = 0;
    assert_null(mem_layout_validate(&l, &dev));
    /* Two pools together hide a third. */
    l = good;
    l.pools[1].cap = 0;
    add_pool(&l, CUBE_POOL_SLICED, MIB, 500, 2000, 0);
    expect_error(mem_layout_validate(&l, &dev), CUBE_ERR_INVALID_ARGUMENT,
                 "pool 2: min_size..max_size (500..2000)");
    /* The device itself. */
    mem_device odd = {48, 64 * MIB};
    expect_error(mem_layout_validate(&good, &odd), CUBE_ERR_INVALID_ARGUMENT,
                 "alignment 48");
    expect_error(mem_layout_validate(NULL, &dev), CUBE_ERR_INVALID_ARGUMENT,
                 NULL);
    expect_error(mem_layout_validate(&good, NULL), CUBE_ERR_INVALID_ARGUMENT,
                 NULL);
}

static void check_preset(cube_layout_preset preset, uint64_t align,
                         uint64_t memory)
{
    mem_device dev = {align, memory};
    cube_memory_layout l;
    cube_error *err = mem_layout_preset(preset, &dev, &l);
    if (err)
        fail_msg("preset: %s", cube_error_message(err));
    err = mem_layout_validate(&l, &dev);
    if (err)
        fail_msg("preset for %llu bytes, alignment %llu: %s",
                 (unsigned long long)memory, (unsigned long long)align,
                 cube_error_message(err));
    /* Contiguous ranges from 1, no page above an eighth of the device
     * for sliced pools. */
    uint64_t next = 1;
    for (uint32_t i = 0; i < l.count; i++) {
        assert_int_equal(l.pools[i].min_size, next);
        next = l.pools[i].max_size + 1;
        if (l.pools[i].kind == CUBE_POOL_SLICED && memory >= 8 * align)
            assert_true(l.pools[i].page_size <= memory / 8);
        if (preset == CUBE_PRESET_EXCLUSIVE)
            assert_int_equal(l.pools[i].kind, CUBE_POOL_EXCLUSIVE);
    }
    /* A manager takes it, and every size class can be served. */
    fake_storage s = {0};
    mem_manager *m = make(&s, align, memory, &l);
    uint64_t sizes[] = {1,          1000,       100 * KIB, 3 * MIB,
                        memory / 4, memory / 2, memory};
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        if (sizes[i] == 0 || sizes[i] > memory)
            continue;
        cube_storage st = take(m, sizes[i]);
        assert_int_equal(st.address % align, 0);
        mem_free(m, &st);
    }
    check_totals(m, &s);
    mem_manager_destroy(m);
}

static void test_presets_validate(void **state)
{
    (void)state;
    uint64_t memories[] = {64 * MIB, 96 * MIB,        3 * GIB, 16 * GIB,
                           80 * GIB, 141000000000ull, MIB,     4096};
    uint64_t aligns[] = {8, 64, 512, 4096};
    for (size_t i = 0; i < sizeof memories / sizeof memories[0]; i++) {
        for (size_t j = 0; j < sizeof aligns / sizeof aligns[0]; j++) {
            check_preset(CUBE_PRESET_SUBSLICES, aligns[j], memories[i]);
            check_preset(CUBE_PRESET_EXCLUSIVE, aligns[j], memories[i]);
        }
    }
    /* The derivation, spelled out for 64 MiB, 96 MiB and 141 GB. */
    mem_device small = {64, 64 * MIB};
    cube_memory_layout l;
    assert_null(mem_layout_preset(CUBE_PRESET_SUBSLICES, &small, &l));
    assert_int_equal(l.count, 3);
    assert_int_equal(l.pools[0].page_size, 2 * MIB);
    assert_int_equal(l.pools[0].max_size, 128 * KIB);
    assert_int_equal(l.pools[1].page_size, 8 * MIB);
    assert_int_equal(l.pools[1].max_size, 512 * KIB);
    assert_int_equal(l.pools[2].kind, CUBE_POOL_EXCLUSIVE);
    assert_int_equal(l.pools[2].max_size, 16 * MIB);
    /* An eighth of 96 MiB is above its page limit (8 MiB): request-sized
     * pages up to 12 MiB after the fixed ones. */
    mem_device odd = {64, 96 * MIB};
    assert_null(mem_layout_preset(CUBE_PRESET_SUBSLICES, &odd, &l));
    assert_int_equal(l.count, 4);
    assert_int_equal(l.pools[1].page_size, 8 * MIB);
    assert_int_equal(l.pools[2].kind, CUBE_POOL_SLICED);
    assert_int_equal(l.pools[2].min_size, 512 * KIB + 1);
    assert_int_equal(l.pools[2].page_size, 12 * MIB);
    assert_int_equal(l.pools[2].max_size, 12 * MIB);
    assert_int_equal(l.pools[3].min_size, 12 * MIB + 1);
    assert_int_equal(l.pools[3].max_size, 24 * MIB);
    mem_device h200 = {512, 141000000000ull};
    assert_null(mem_layout_preset(CUBE_PRESET_SUBSLICES, &h200, &l));
    assert_int_equal(l.count, 4);
    assert_int_equal(l.pools[1].page_size, 16 * MIB);
    assert_int_equal(l.pools[1].max_size, MIB);
    /* Request-sized pages of at least 64 MiB, up to 2 GiB. */
    assert_int_equal(l.pools[2].kind, CUBE_POOL_SLICED);
    assert_int_equal(l.pools[2].min_size, MIB + 1);
    assert_int_equal(l.pools[2].page_size, 2 * GIB);
    assert_int_equal(l.pools[2].max_size, 2 * GIB);
    assert_int_equal(l.pools[3].kind, CUBE_POOL_EXCLUSIVE);
    assert_int_equal(l.pools[3].max_size, 141000000000ull / 4 / 512 * 512);

    expect_error(mem_layout_preset((cube_layout_preset)9, &small, &l),
                 CUBE_ERR_INVALID_ARGUMENT, "preset 9");
    expect_error(mem_layout_preset(CUBE_PRESET_SUBSLICES, &small, NULL),
                 CUBE_ERR_INVALID_ARGUMENT, NULL);
    mem_device zero = {64, 0};
    expect_error(mem_layout_preset(CUBE_PRESET_SUBSLICES, &zero, &l),
                 CUBE_ERR_INVALID_ARGUMENT, "memory size 0");
}

/* --- reports --- */

static void test_report_agrees_and_peaks_reset(void **state)
{
    (void)state;
    fake_storage s = {0};
    mem_manager *m = make(&s, 256, 64 * MIB, NULL);
    cube_memory_report r = report_of(m);
    assert_int_equal(r.count, 5); /* 2 sliced, 1 exclusive, tail, persistent */
    uint64_t sizes[] = {1, 300, 5000, 200 * KIB, 2 * MIB, 20 * MIB};
    cube_storage q[6];
    for (int i = 0; i < 6; i++)
        q[i] = take(m, sizes[i]);
    mem_set_persistent(m, 1);
    cube_storage p = take(m, 777);
    mem_set_persistent(m, 0);
    check_totals(m, &s);
    r = report_of(m);
    assert_int_equal(r.usage.buffers, 7);
    assert_int_equal(r.pools[0].buffers, 3);
    assert_int_equal(r.pools[1].buffers, 1);
    assert_int_equal(r.pools[2].buffers, 1);
    assert_int_equal(r.pools[3].buffers, 1);
    assert_int_equal(r.pools[4].buffers, 1);
    assert_int_equal(r.pools[0].largest_buffer, 5000);
    for (int i = 0; i < 6; i++)
        mem_free(m, &q[i]);
    r = report_of(m);
    assert_int_equal(r.pools[0].buffers_peak, 3);
    assert_int_equal(r.pools[0].bytes_in_use_peak, 5301);
    mem_reset_peaks(m);
    r = report_of(m);
    for (uint32_t i = 0; i < r.count; i++) {
        assert_int_equal(r.pools[i].pages_peak, r.pools[i].pages);
        assert_int_equal(r.pools[i].buffers_peak, r.pools[i].buffers);
        assert_int_equal(r.pools[i].bytes_in_use_peak, r.pools[i].bytes_in_use);
        assert_int_equal(r.pools[i].bytes_reserved_peak,
                         r.pools[i].bytes_reserved);
    }
    assert_int_equal(r.pools[0].largest_buffer, 5000);
    mem_free(m, &p);
    check_totals(m, &s);
    mem_manager_destroy(m);
}

static void test_allocate_release_allocate(void **state)
{
    (void)state;
    for (int preset = 0; preset < 2; preset++) {
        fake_storage s = {0};
        mem_device dev = {32, 128 * MIB};
        cube_memory_layout l;
        assert_null(mem_layout_preset((cube_layout_preset)preset, &dev, &l));
        mem_manager *m = make(&s, 32, 128 * MIB, &l);
        cube_storage q[5];
        for (int i = 0; i < 5; i++)
            q[i] = take(m, 1000 * (uint64_t)(i + 1));
        cube_memory_usage before = usage_of(m);
        for (int i = 0; i < 5; i++)
            mem_free(m, &q[i]);
        for (int i = 0; i < 5; i++)
            q[i] = take(m, 1000 * (uint64_t)(i + 1));
        cube_memory_usage after = usage_of(m);
        assert_int_equal(after.buffers, before.buffers);
        assert_int_equal(after.bytes_in_use, before.bytes_in_use);
        if (preset == CUBE_PRESET_EXCLUSIVE)
            assert_int_equal(after.bytes_reserved, before.bytes_reserved);
        else
            assert_true(after.bytes_reserved <= before.bytes_reserved);
        for (int i = 0; i < 5; i++)
            mem_free(m, &q[i]);
        mem_manager_destroy(m);
    }
}

static void test_fragmentation_resistance(void **state)
{
    (void)state;
    fake_storage s = {0};
    mem_manager *m = make(&s, 32, 128 * MIB, NULL);
    uint64_t sizes[] = {50, 1000, 100, 5000, 200, 10000, 300};
    cube_storage q[7];
    for (int i = 0; i < 7; i++)
        q[i] = take(m, sizes[i]);
    uint64_t before = usage_of(m).bytes_reserved;
    for (int i = 0; i < 7; i += 2)
        mem_free(m, &q[i]);
    cube_storage again[3];
    for (int i = 0; i < 3; i++)
        again[i] = take(m, sizes[i]);
    assert_true(usage_of(m).bytes_reserved * 10 <= before * 11);
    for (int i = 1; i < 7; i += 2)
        mem_free(m, &q[i]);
    for (int i = 0; i < 3; i++)
        mem_free(m, &again[i]);
    check_totals(m, &s);
    mem_manager_destroy(m);
}

/* --- bad input --- */

/* A storage that notes, at each free, whether the manager's lock is held
 * (a device free may block; other threads must not wait behind it). */
typedef struct probing_storage {
    fake_storage inner;
    mem_manager *m;
    uint64_t frees_locked, frees_unlocked;
} probing_storage;

static cube_error *probing_alloc(void *self, uint64_t size, uint64_t align,
                                 uint64_t *address)
{
    return fake_alloc(&((probing_storage *)self)->inner, size, align, address);
}

static void probing_free(void *self, uint64_t address, uint64_t size)
{
    probing_storage *p = self;
    if (p->m && cube_mutex_trylock(&p->m->lock)) {
        cube_mutex_unlock(&p->m->lock);
        p->frees_unlocked++;
    } else {
        p->frees_locked++;
    }
    fake_free(&p->inner, address, size);
}

static void test_storage_is_freed_outside_the_lock(void **state)
{
    (void)state;
    probing_storage p;
    memset(&p, 0, sizeof p);
    mem_storage_ops ops = {&p, probing_alloc, probing_free};
    mem_device dev = {256, 64 * GIB};
    cube_memory_layout l = one_pool(CUBE_POOL_SLICED, 4 * MIB, 0);
    assert_null(mem_manager_create(&ops, &dev, &l, &p.m));
    /* The large tail frees at release; a sliced page at cleanup; every
     * page at an install and at destroy. */
    cube_storage big = take(p.m, 64 * MIB);
    mem_free(p.m, &big);
    cube_storage small = take(p.m, 1024);
    mem_free(p.m, &small);
    mem_cleanup(p.m);
    small = take(p.m, 1024);
    mem_free(p.m, &small);
    cube_memory_layout other = one_pool(CUBE_POOL_SLICED, 8 * MIB, 0);
    assert_null(mem_install(p.m, &other));
    small = take(p.m, 1024);
    mem_manager *m = p.m;
    mem_manager_destroy(m);
    assert_int_equal(p.frees_locked, 0);
    assert_true(p.frees_unlocked >= 4);
    assert_int_equal(p.inner.allocs, p.inner.frees);
    assert_int_equal(p.inner.live_bytes, 0);
}

/* Out of memory: what the manager releases must reach the storage before
 * it asks again, even though frees normally wait for the unlock. */
static void test_retry_after_release_sees_the_freed_storage(void **state)
{
    (void)state;
    fake_storage s;
    memset(&s, 0, sizeof s);
    s.limit = 16 * MIB;
    cube_memory_layout l = one_pool(CUBE_POOL_SLICED, 8 * MIB, 0);
    mem_manager *m = make(&s, 256, 64 * GIB, &l);
    cube_storage a = take(m, 1024), b = take(m, 8 * MIB);
    mem_free(m, &a);
    mem_free(m, &b);
    /* Both pages are held unused; a 12 MiB request needs them gone. */
    cube_storage c = take(m, 12 * MIB);
    mem_free(m, &c);
    mem_manager_destroy(m);
    assert_int_equal(s.allocs, s.frees);
}

/* The slice freed last comes back for a request of its extent without a
 * search (same address), is merged as any free slice for anything else,
 * and never hides a page from a cleanup. */
static void test_hot_slice_reuse_and_merge(void **state)
{
    (void)state;
    fake_storage s;
    memset(&s, 0, sizeof s);
    cube_memory_layout l = one_pool(CUBE_POOL_SLICED, 4 * MIB, 0);
    mem_manager *m = make(&s, 256, 64 * GIB, &l);
    cube_storage a = take(m, 1000), b = take(m, 3000);
    uint64_t at = a.address;
    mem_free(m, &a);
    cube_storage c = take(m, 1000);
    assert_int_equal(c.address, at); /* taken straight back */
    assert_int_equal(usage_of(m).buffers, 2);
    mem_free(m, &c);
    /* A different extent: the hot slice is filed in the bins, where the
     * smallest fitting free slice is found: its place. */
    cube_storage d = take(m, 512);
    assert_int_equal(d.address, at);
    mem_free(m, &d);
    mem_free(m, &b);
    /* Everything free: one cleanup gives the page back, the hot slice
     * included. */
    mem_cleanup(m);
    cube_memory_usage u = usage_of(m);
    assert_int_equal(u.buffers, 0);
    assert_int_equal(u.bytes_reserved, 0);
    assert_int_equal(s.allocs, s.frees);
    /* And again after a refill: frees in any order, then destroy. */
    cube_storage q[6];
    for (int i = 0; i < 6; i++)
        q[i] = take(m, 512 * (uint64_t)(i + 1));
    for (int i = 5; i >= 0; i -= 2)
        mem_free(m, &q[i]);
    for (int i = 0; i < 6; i += 2)
        mem_free(m, &q[i]);
    mem_cleanup(m);
    assert_int_equal(usage_of(m).bytes_reserved, 0);
    mem_manager_destroy(m);
    assert_int_equal(s.allocs, s.frees);
}

static void test_bad_input(void **state)
{
    (void)state;
    fake_storage s = {0};
    mem_storage_ops ops = {&s, fake_alloc, fake_free};
    mem_storage_ops no_free = {&s, fake_alloc, NULL};
    mem_device dev = {64, 64 * MIB};
    mem_manager *m = NULL;
    expect_error(mem_manager_create(&ops, &dev, NULL, NULL),
                 CUBE_ERR_INVALID_ARGUMENT, NULL);
    expect_error(mem_manager_create(NULL, &dev, NULL, &m),
                 CUBE_ERR_INVALID_ARGUMENT, NULL);
    assert_null(m);
    expect_error(mem_manager_create(&no_free, &dev, NULL, &m),
                 CUBE_ERR_INVALID_ARGUMENT, NULL);
    expect_error(mem_manager_create(&ops, NULL, NULL, &m),
                 CUBE_ERR_INVALID_ARGUMENT, NULL);
    mem_device odd = {3, 64 * MIB};
    expect_error(mem_manager_create(&ops, &odd, NULL, &m),
                 CUBE_ERR_INVALID_ARGUMENT, "alignment 3");
    mem_device tiny = {64, 32};
    expect_error(mem_manager_create(&ops, &tiny, NULL, &m),
                 CUBE_ERR_INVALID_ARGUMENT, "below its alignment");
    cube_memory_layout broken = one_pool(CUBE_POOL_SLICED, 100, 0);
    expect_error(mem_manager_create(&ops, &dev, &broken, &m),
                 CUBE_ERR_INVALID_ARGUMENT, "pool 0: page_size 100");
    assert_null(m);

    m = make(&s, 64, 64 * MIB, NULL);
    cube_storage st;
    expect_error(mem_alloc(NULL, 10, &st), CUBE_ERR_INVALID_ARGUMENT, NULL);
    expect_error(mem_alloc(m, 10, NULL), CUBE_ERR_INVALID_ARGUMENT, NULL);
    expect_error(mem_install(NULL, &broken), CUBE_ERR_INVALID_ARGUMENT, NULL);
    expect_error(mem_install(m, NULL), CUBE_ERR_INVALID_ARGUMENT, NULL);
    mem_free(NULL, &st);
    mem_free(m, NULL);
    cube_storage none = {0, 0, NULL, 0};
    mem_free(m, &none);
    mem_usage(NULL, NULL);
    mem_usage(m, NULL);
    mem_report(NULL, NULL);
    mem_reset_peaks(NULL);
    mem_cleanup(NULL);
    mem_set_persistent(NULL, 1);
    mem_manager_destroy(NULL);

    /* A copy of a freed storage is ignored, not freed twice. */
    st = take(m, 100);
    cube_storage copy = st;
    mem_free(m, &st);
    mem_free(m, &copy);
    assert_int_equal(usage_of(m).buffers, 0);
    st = take(m, 100);
    copy.address ^= 64;
    mem_free(m, &copy);
    assert_int_equal(usage_of(m).buffers, 1);
    mem_free(m, &st);
    mem_manager_destroy(m);
    assert_int_equal(s.live_bytes, 0);
}

static void test_destroy_returns_live_blocks(void **state)
{
    (void)state;
    fake_storage s = {0};
    s.backed = 1;
    mem_manager *m = make(&s, 64, 64 * MIB, NULL);
    cube_storage keep[4];
    keep[0] = take(m, 100);
    keep[1] = take(m, 10 * MIB);
    keep[2] = take(m, 40 * MIB);
    mem_set_persistent(m, 1);
    keep[3] = take(m, 100);
    (void)keep;
    mem_manager_destroy(m);
    assert_int_equal(s.live_bytes, 0);
    assert_int_equal(s.allocs, s.frees);
}

/* --- threads and the pool-hit cost --- */

static void *churn(void *arg)
{
    mem_manager *m = arg;
    uint64_t x = (uint64_t)(uintptr_t)&x;
    cube_storage held[16];
    memset(held, 0, sizeof held);
    for (int i = 0; i < 20000; i++) {
        x = x * 6364136223846793005ull + 1442695040888963407ull;
        int slot = (int)((x >> 33) % 16);
        if (held[slot].cookie) {
            mem_free(m, &held[slot]);
        } else {
            uint64_t size = 1 + (x >> 40) % (64 * KIB);
            cube_error *err = mem_alloc(m, size, &held[slot]);
            if (err) {
                cube_error_free(err);
                return (void *)1;
            }
        }
    }
    for (int i = 0; i < 16; i++)
        mem_free(m, &held[i]);
    return NULL;
}

static void test_threads_share_a_manager(void **state)
{
    (void)state;
    fake_storage s = {0};
    mem_manager *m = make(&s, 64, 64 * MIB, NULL);
    pthread_t t[4];
    for (int i = 0; i < 4; i++)
        assert_int_equal(pthread_create(&t[i], NULL, churn, m), 0);
    for (int i = 0; i < 4; i++) {
        void *ret = NULL;
        pthread_join(t[i], &ret);
        assert_null(ret);
    }
    assert_int_equal(usage_of(m).buffers, 0);
    check_totals(m, &s);
    mem_manager_destroy(m);
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void test_pool_hit_cost(void **state)
{
    (void)state;
    fake_storage s = {0};
    mem_manager *m = make(&s, 64, 16 * GIB, NULL);
    /* Some live buffers around, so the free slices are not alone. */
    cube_storage live[256];
    for (int i = 0; i < 256; i++)
        live[i] = take(m, 64 * (uint64_t)(i + 1));
    enum { N = 1000000 };
    double best = 1e9;
    for (int round = 0; round < 3; round++) {
        double t0 = now_s();
        for (int i = 0; i < N; i++) {
            cube_storage st;
            cube_error *err = mem_alloc(m, 4096, &st);
            if (err)
                fail_msg("%s", cube_error_message(err));
            mem_free(m, &st);
        }
        double ns = (now_s() - t0) * 1e9 / N;
        if (ns < best)
            best = ns;
    }
    print_message("    pool-hit alloc+free pair: %.1f ns\n", best);
    for (int i = 0; i < 256; i++)
        mem_free(m, &live[i]);
    mem_manager_destroy(m);
}

int main(void)
{
    /* The warnings these tests provoke on purpose stay quiet. */
    cube_log_set_level(CUBE_LOG_OFF);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_two_slices_share_a_page),
        cmocka_unit_test(test_new_page_when_the_first_is_full),
        cmocka_unit_test(test_padding_is_counted),
        cmocka_unit_test(test_same_size_reuses_the_freed_slot),
        cmocka_unit_test(test_no_padding_leak),
        cmocka_unit_test(test_free_neighbours_merge),
        cmocka_unit_test(test_first_pool_holding_the_size_serves_it),
        cmocka_unit_test(test_large_sliced_pages_fit_the_request),
        cmocka_unit_test(test_large_sliced_pages_under_a_cap),
        cmocka_unit_test(test_large_page_shrinks_when_storage_refuses),
        cmocka_unit_test(test_varying_large_sizes_reuse_pages),
        cmocka_unit_test(test_capped_pool_spills_to_the_next),
        cmocka_unit_test(test_capacity_exceeded),
        cmocka_unit_test(test_capped_pool_keeps_to_its_range),
        cmocka_unit_test(test_large_tail_reserves_the_rounded_size),
        cmocka_unit_test(test_only_sizes_above_the_device_are_too_big),
        cmocka_unit_test(test_out_of_memory_releases_then_retries),
        cmocka_unit_test(test_counters_follow_a_known_sequence),
        cmocka_unit_test(test_device_fault_is_not_out_of_memory),
        cmocka_unit_test(test_exclusive_pages),
        cmocka_unit_test(test_capped_exclusive_pool_uses_its_free_pages),
        cmocka_unit_test(test_exclusive_pages_released_after_a_while),
        cmocka_unit_test(test_cleanup_keeps_live_blocks),
        cmocka_unit_test(test_persistent_exact_size_reuse),
        cmocka_unit_test(test_install),
        cmocka_unit_test(test_measured_plan_cycle),
        cmocka_unit_test(test_every_mistake_has_its_message),
        cmocka_unit_test(test_presets_validate),
        cmocka_unit_test(test_report_agrees_and_peaks_reset),
        cmocka_unit_test(test_allocate_release_allocate),
        cmocka_unit_test(test_fragmentation_resistance),
        cmocka_unit_test(test_storage_is_freed_outside_the_lock),
        cmocka_unit_test(test_retry_after_release_sees_the_freed_storage),
        cmocka_unit_test(test_hot_slice_reuse_and_merge),
        cmocka_unit_test(test_bad_input),
        cmocka_unit_test(test_destroy_returns_live_blocks),
        cmocka_unit_test(test_threads_share_a_manager),
        cmocka_unit_test(test_pool_hit_cost),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
