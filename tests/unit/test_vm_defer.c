/* Deferred unmaps (src/backends/common/vm_defer.c), driven by a fake
 * storage: markers are numbered, a marker is done once the fake "device"
 * has reached it, and every unmap is recorded per page. Checked: deferred
 * pages are not unmapped before their marker completes and are after; a
 * wait (the out-of-memory path, a range released) unmaps them without
 * the device having reached them; a deferred page mapped again is taken
 * back, never unmapped behind the new use, and counted once; pages a map
 * in progress keeps stay deferred; batches without a marker (a capture
 * ran) get one later; markers go back once done. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <string.h>

#include "backends/common/vm_defer.h"

#define PAGES 130 /* over two words of the bitmap */

typedef struct fake {
    uintptr_t reached; /* markers <= this are done */
    uintptr_t next;    /* the next marker recorded */
    int waits, puts, queries;
    int unmapped[PAGES]; /* times each page was unmapped */
} fake;

static int fake_done(void *self, void *marker, int wait)
{
    fake *f = self;
    f->queries++;
    if (wait) {
        f->waits++;
        return 1;
    }
    return marker && (uintptr_t)marker <= f->reached;
}

static void fake_put(void *self, void *marker)
{
    fake *f = self;
    assert_non_null(marker);
    assert_ptr_not_equal(marker, vm_defer_done);
    f->puts++;
}

static void fake_unmap(void *self, uint64_t first, uint64_t count)
{
    fake *f = self;
    assert_true(count > 0);
    assert_true(first + count <= PAGES);
    for (uint64_t i = first; i < first + count; i++)
        f->unmapped[i]++;
}

static void *fake_record(void *self)
{
    fake *f = self;
    return (void *)++f->next;
}

static vm_defer_ops ops_of(fake *f)
{
    vm_defer_ops o = {f, fake_done, fake_put, fake_unmap};
    return o;
}

static void test_not_before_marker_then_after(void **state)
{
    (void)state;
    fake f = {0};
    vm_defer_ops o = ops_of(&f);
    vm_defer d;
    assert_null(vm_defer_init(&d, PAGES));
    assert_null(vm_defer_add(&d, 60, 10, fake_record(&f))); /* marker 1 */
    assert_null(vm_defer_add(&d, 100, 5, fake_record(&f))); /* marker 2 */
    assert_int_equal(d.count, 15);
    assert_true(vm_defer_is(&d, 63) && vm_defer_is(&d, 104));
    assert_false(vm_defer_is(&d, 70));
    /* The device has reached neither marker: nothing unmapped. */
    assert_int_equal(vm_defer_reap(&d, &o, 0, 0, 0), 0);
    for (int i = 0; i < PAGES; i++)
        assert_int_equal(f.unmapped[i], 0);
    assert_int_equal(d.batch_count, 2);
    /* Marker 1 done: its pages only, the reap stopping at marker 2. */
    f.reached = 1;
    f.queries = 0;
    assert_int_equal(vm_defer_reap(&d, &o, 0, 0, 0), 10);
    assert_int_equal(f.queries, 2);
    for (int i = 0; i < PAGES; i++)
        assert_int_equal(f.unmapped[i], i >= 60 && i < 70);
    assert_int_equal(d.count, 5);
    assert_int_equal(d.batch_count, 1);
    assert_int_equal(f.puts, 1);
    f.reached = 2;
    assert_int_equal(vm_defer_reap(&d, &o, 0, 0, 0), 5);
    assert_int_equal(f.unmapped[104], 1);
    assert_int_equal(d.count, 0);
    assert_int_equal(d.batch_count, 0);
    assert_int_equal(f.puts, 2);
    assert_int_equal(f.waits, 0);
    vm_defer_fini(&d);
}

static void test_wait_unmaps_now(void **state)
{
    (void)state;
    fake f = {0};
    vm_defer_ops o = ops_of(&f);
    vm_defer d;
    assert_null(vm_defer_init(&d, PAGES));
    assert_null(vm_defer_add(&d, 0, 3, fake_record(&f)));
    assert_null(vm_defer_add(&d, 3, 2, NULL)); /* a capture ran */
    assert_int_equal(vm_defer_reap(&d, &o, 0, 0, 0), 0);
    /* Out of memory: waits for each batch, marker or not. */
    assert_int_equal(vm_defer_reap(&d, &o, 1, 0, 0), 5);
    assert_int_equal(f.waits, 2);
    assert_int_equal(f.puts, 1); /* no marker to give back for the second */
    for (int i = 0; i < 5; i++)
        assert_int_equal(f.unmapped[i], 1);
    assert_int_equal(d.count, 0);
    assert_int_equal(d.batch_count, 0);
    vm_defer_fini(&d);
}

static void test_marked_after_capture(void **state)
{
    (void)state;
    fake f = {0};
    vm_defer_ops o = ops_of(&f);
    vm_defer d;
    assert_null(vm_defer_init(&d, PAGES));
    assert_null(vm_defer_add(&d, 10, 2, NULL));
    f.reached = 100;
    /* No marker: not done without a wait, whatever the device reached. */
    assert_int_equal(vm_defer_reap(&d, &o, 0, 0, 0), 0);
    vm_defer_mark(&d, fake_record, &f);
    assert_ptr_equal(d.batches[0].marker, (void *)1);
    assert_int_equal(vm_defer_reap(&d, &o, 0, 0, 0), 2);
    assert_int_equal(f.unmapped[10] + f.unmapped[11], 2);
    vm_defer_fini(&d);
}

static void test_taken_back_is_reused_and_never_unmapped_early(void **state)
{
    (void)state;
    fake f = {0};
    vm_defer_ops o = ops_of(&f);
    vm_defer d;
    assert_null(vm_defer_init(&d, PAGES));
    assert_null(vm_defer_add(&d, 20, 8, fake_record(&f))); /* marker 1 */
    /* A map of pages 24..31: 24..27 were deferred, taken back as they
     * are (the storage maps only 28..31). */
    assert_int_equal(vm_defer_take(&d, 24, 8), 4);
    assert_int_equal(d.count, 4);
    assert_false(vm_defer_is(&d, 24));
    /* Taken back again: nothing more. */
    assert_int_equal(vm_defer_take(&d, 24, 8), 0);
    /* The new use ends; 24..25 deferred again behind marker 2. */
    assert_null(vm_defer_add(&d, 24, 2, fake_record(&f)));
    assert_int_equal(d.count, 6);
    /* Marker 1 done: 20..23 go; 24..25 belong to marker 2 and stay;
     * 26..27, taken back and still in use, stay mapped. */
    f.reached = 1;
    assert_int_equal(vm_defer_reap(&d, &o, 0, 0, 0), 4);
    for (int i = 20; i < 32; i++)
        assert_int_equal(f.unmapped[i], i < 24);
    assert_true(vm_defer_is(&d, 24) && vm_defer_is(&d, 25));
    assert_int_equal(d.count, 2);
    f.reached = 2;
    assert_int_equal(vm_defer_reap(&d, &o, 0, 0, 0), 2);
    for (int i = 20; i < 32; i++)
        assert_int_equal(f.unmapped[i], i < 26);
    assert_int_equal(d.count, 0);
    vm_defer_fini(&d);
}

static void test_kept_pages_stay_for_the_map_in_progress(void **state)
{
    (void)state;
    fake f = {0};
    vm_defer_ops o = ops_of(&f);
    vm_defer d;
    assert_null(vm_defer_init(&d, PAGES));
    assert_null(vm_defer_add(&d, 40, 10, fake_record(&f)));
    /* Out of memory while mapping 45..59: the rest goes, 45..49 stay. */
    assert_int_equal(vm_defer_reap(&d, &o, 1, 45, 15), 5);
    for (int i = 40; i < 50; i++)
        assert_int_equal(f.unmapped[i], i < 45);
    assert_int_equal(d.count, 5);
    assert_int_equal(f.puts, 1);
    /* The map failed: the kept pages are done with and go at the next
     * reap, without another query. */
    f.queries = 0;
    assert_int_equal(vm_defer_reap(&d, &o, 0, 0, 0), 5);
    assert_int_equal(f.queries, 0);
    assert_int_equal(d.count, 0);
    assert_int_equal(d.batch_count, 0);
    /* Had the map succeeded, they would have been taken back. */
    assert_null(vm_defer_add(&d, 40, 10, fake_record(&f)));
    assert_int_equal(vm_defer_reap(&d, &o, 1, 45, 15), 5);
    assert_int_equal(vm_defer_take(&d, 45, 15), 5);
    assert_int_equal(vm_defer_reap(&d, &o, 0, 0, 0), 0);
    assert_int_equal(d.batch_count, 0);
    for (int i = 45; i < 50; i++)
        assert_int_equal(f.unmapped[i], 1);
    vm_defer_fini(&d);
}

static void test_many_batches_and_bad_range(void **state)
{
    (void)state;
    fake f = {0};
    vm_defer_ops o = ops_of(&f);
    vm_defer d;
    assert_null(vm_defer_init(&d, PAGES));
    for (int i = 0; i < PAGES; i++)
        assert_null(vm_defer_add(&d, (uint64_t)i, 1, fake_record(&f)));
    assert_int_equal(d.count, PAGES);
    f.reached = PAGES / 2;
    assert_int_equal(vm_defer_reap(&d, &o, 0, 0, 0), PAGES / 2);
    assert_int_equal(d.batch_count, PAGES - PAGES / 2);
    assert_int_equal(vm_defer_reap(&d, &o, 1, 0, 0), PAGES - PAGES / 2);
    for (int i = 0; i < PAGES; i++)
        assert_int_equal(f.unmapped[i], 1);
    assert_int_equal(f.puts, PAGES);
    cube_error *err = vm_defer_add(&d, PAGES - 1, 2, NULL);
    assert_non_null(err);
    assert_int_equal(cube_error_code(err), CUBE_ERR_INTERNAL);
    cube_error_free(err);
    assert_int_equal(d.batch_count, 0);
    vm_defer_fini(&d);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_not_before_marker_then_after),
        cmocka_unit_test(test_wait_unmaps_now),
        cmocka_unit_test(test_marked_after_capture),
        cmocka_unit_test(test_taken_back_is_reused_and_never_unmapped_early),
        cmocka_unit_test(test_kept_pages_stay_for_the_map_in_progress),
        cmocka_unit_test(test_many_batches_and_bad_range),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
