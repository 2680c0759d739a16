/* Unit tests of the size-class memory manager, including a randomized
 * model check: no two live blocks overlap, every address is aligned, usage
 * equals the model's, and cleanup never frees a live block. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdlib.h>
#include <string.h>

#include "cubert/backend/errors.h"
#include "memory/memory_manager.h"

typedef struct fake_storage {
    uint64_t allocs, frees, live_bytes, limit;
    int fail_next;
} fake_storage;

static cube_error *fake_alloc(void *self, uint64_t size, uint64_t align,
                              uint64_t *address)
{
    fake_storage *s = self;
    if (s->fail_next > 0) {
        s->fail_next--;
        return cube_error_new(CUBE_ERR_OUT_OF_MEMORY, "injected");
    }
    if (s->limit && s->live_bytes + size > s->limit)
        return cube_error_new(CUBE_ERR_OUT_OF_MEMORY, "over limit");
    void *p = aligned_alloc(align, (size + align - 1) & ~(align - 1));
    if (!p)
        return cube_error_new(CUBE_ERR_OUT_OF_MEMORY, "host");
    s->allocs++;
    s->live_bytes += size;
    *address = (uint64_t)(uintptr_t)p;
    return NULL;
}

static void fake_free(void *self, uint64_t address, uint64_t size)
{
    fake_storage *s = self;
    s->frees++;
    s->live_bytes -= size;
    free((void *)(uintptr_t)address);
}

static mem_manager *make(fake_storage *s, uint64_t max)
{
    mem_storage_ops ops = {s, fake_alloc, fake_free};
    mem_manager *m = NULL;
    cube_error *err = mem_manager_create(&ops, 64, max, &m);
    assert_null(err);
    return m;
}

static void test_class_sizes_bound_padding(void **state)
{
    (void)state;
    for (uint64_t size = 1; size < (1u << 22); size = size * 3 / 2 + 1) {
        uint64_t cs = mem_class_size(size, 64);
        assert_true(cs >= size);
        assert_int_equal(cs % 64, 0);
        /* At most 25% padding past the alignment granule. */
        if (size > 256)
            assert_true(cs - size <= size / 4 + 64);
    }
}

static void test_same_size_reuses_freed_block(void **state)
{
    (void)state;
    fake_storage s = {0};
    mem_manager *m = make(&s, 1ull << 40);
    cube_storage a, b;
    assert_null(mem_alloc(m, 1000, &a));
    uint64_t first = a.address;
    mem_free(m, &a);
    assert_null(mem_alloc(m, 1000, &b));
    assert_int_equal(b.address, first);
    assert_int_equal(s.allocs, 1);
    mem_free(m, &b);
    mem_manager_destroy(m);
    assert_int_equal(s.live_bytes, 0);
}

static void test_usage_and_cleanup(void **state)
{
    (void)state;
    fake_storage s = {0};
    mem_manager *m = make(&s, 1ull << 40);
    cube_storage a, b;
    assert_null(mem_alloc(m, 100, &a));
    assert_null(mem_alloc(m, 5000, &b));
    cube_memory_usage u;
    mem_usage(m, &u);
    assert_int_equal(u.buffers, 2);
    assert_int_equal(u.bytes_in_use, 5100);
    assert_true(u.bytes_reserved >= 5100);
    assert_int_equal(u.bytes_padding, u.bytes_reserved - u.bytes_in_use);
    mem_free(m, &b);
    mem_cleanup(m);
    mem_usage(m, &u);
    assert_int_equal(u.buffers, 1);
    assert_int_equal(u.bytes_in_use, 100);
    /* The live block survived cleanup and is still writable. */
    memset((void *)(uintptr_t)a.address, 0xAB, 100);
    mem_free(m, &a);
    mem_manager_destroy(m);
    assert_int_equal(s.live_bytes, 0);
}

static void test_errors(void **state)
{
    (void)state;
    fake_storage s = {0};
    mem_manager *m = make(&s, 1 << 20);
    cube_storage a;
    cube_error *err = mem_alloc(m, 0, &a);
    assert_int_equal(cube_error_code(err), CUBE_ERR_INVALID_ARGUMENT);
    cube_error_free(err);
    err = mem_alloc(m, (1 << 20) + 1, &a);
    assert_int_equal(cube_error_code(err), CUBE_ERR_BUFFER_TOO_BIG);
    cube_error_free(err);
    err = mem_alloc(m, UINT64_MAX, &a);
    assert_int_equal(cube_error_code(err), CUBE_ERR_BUFFER_TOO_BIG);
    cube_error_free(err);
    mem_storage_ops bad = {NULL, NULL, NULL};
    mem_manager *m2 = NULL;
    err = mem_manager_create(&bad, 64, 1, &m2);
    assert_int_equal(cube_error_code(err), CUBE_ERR_INVALID_ARGUMENT);
    cube_error_free(err);
    mem_storage_ops ops = {&s, fake_alloc, fake_free};
    err = mem_manager_create(&ops, 48, 1, &m2);
    assert_int_equal(cube_error_code(err), CUBE_ERR_INVALID_ARGUMENT);
    cube_error_free(err);
    mem_manager_destroy(m);
}

static void test_out_of_memory_reclaims_then_retries(void **state)
{
    (void)state;
    fake_storage s = {0};
    mem_manager *m = make(&s, 1ull << 40);
    cube_storage a, b;
    assert_null(mem_alloc(m, 4096, &a));
    mem_free(m, &a); /* cached */
    s.fail_next = 1; /* the storage refuses once */
    assert_null(mem_alloc(m, 100000, &b));
    cube_memory_usage u;
    mem_usage(m, &u);
    /* The cached block was returned to make room. */
    assert_int_equal(u.bytes_reserved, u.bytes_in_use + u.bytes_padding);
    mem_free(m, &b);
    s.fail_next = 2; /* refuses twice: nothing left to reclaim */
    mem_cleanup(m);
    cube_error *err = mem_alloc(m, 100000, &b);
    assert_int_equal(cube_error_code(err), CUBE_ERR_OUT_OF_MEMORY);
    cube_error_free(err);
    mem_manager_destroy(m);
}

typedef struct live {
    cube_storage st;
    uint64_t size;
} live;

static void test_randomized_model(void **state)
{
    (void)state;
    fake_storage s = {0};
    mem_manager *m = make(&s, 1ull << 40);
    enum { MAX_LIVE = 256, STEPS = 20000 };
    live lv[MAX_LIVE];
    int n = 0;
    uint64_t model_bytes = 0;
    srand(12345);
    for (int step = 0; step < STEPS; step++) {
        int op = rand() % 10;
        if (op < 5 && n < MAX_LIVE) {
            uint64_t size =
                (uint64_t)(rand() % 3 == 0 ? rand() % 200000 : rand() % 2000) +
                1;
            assert_null(mem_alloc(m, size, &lv[n].st));
            lv[n].size = size;
            assert_int_equal(lv[n].st.address % 64, 0);
            /* Stamp it so overlap would show as corruption. */
            memset((void *)(uintptr_t)lv[n].st.address, n & 0xFF,
                   size < 64 ? size : 64);
            model_bytes += size;
            n++;
        } else if (op < 9 && n > 0) {
            int k = rand() % n;
            unsigned char *p = (unsigned char *)(uintptr_t)lv[k].st.address;
            assert_int_equal(p[0], (unsigned char)(k & 0xFF));
            mem_free(m, &lv[k].st);
            model_bytes -= lv[k].size;
            lv[k] = lv[--n];
            if (k < n) /* restamp the moved entry with its new index */
                memset((void *)(uintptr_t)lv[k].st.address, k & 0xFF,
                       lv[k].size < 64 ? lv[k].size : 64);
        } else {
            mem_cleanup(m);
        }
        cube_memory_usage u;
        mem_usage(m, &u);
        assert_int_equal(u.buffers, (uint64_t)n);
        assert_int_equal(u.bytes_in_use, model_bytes);
        assert_true(u.bytes_reserved >= u.bytes_in_use + u.bytes_padding);
    }
    /* No two live blocks overlap. */
    for (int i = 0; i < n; i++)
        for (int j = i + 1; j < n; j++) {
            uint64_t a0 = lv[i].st.address, a1 = a0 + lv[i].size;
            uint64_t b0 = lv[j].st.address, b1 = b0 + lv[j].size;
            assert_true(a1 <= b0 || b1 <= a0);
        }
    for (int i = 0; i < n; i++)
        mem_free(m, &lv[i].st);
    mem_manager_destroy(m);
    assert_int_equal(s.live_bytes, 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_class_sizes_bound_padding),
        cmocka_unit_test(test_same_size_reuses_freed_block),
        cmocka_unit_test(test_usage_and_cleanup),
        cmocka_unit_test(test_errors),
        cmocka_unit_test(test_out_of_memory_reclaims_then_retries),
        cmocka_unit_test(test_randomized_model),
    };
    return cmocka_run_group_tests_name("memory_manager", tests, NULL, NULL);
}
