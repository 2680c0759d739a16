/* The list of live buffers (cube_memory_snapshot, cubert/memory.h): each
 * buffer once, with its first handle, size, stream, pool and label;
 * slices not listed again; released buffers gone; wrapped memory and
 * buffers made in a dry run marked; a cap below the count; bad input.
 *
 * Each test works on a stream of its own, so the stream scope lists only
 * what the test made (the suite keeps a sentinel on the main stream).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "conformance.h"

static cube_stream_id s_last_stream = 0x534E415000000000ull;
static cube_stream_id s_home;

static void s_enter(void)
{
    s_home = cube_stream_current(conf.client);
    CONF_OK(cube_stream_use(conf.client, ++s_last_stream));
}

static void s_leave(void)
{
    CONF_OK(cube_sync(conf.client, NULL, 0));
    /* Ids with the top bit set are threads' own streams: 0 goes back. */
    CONF_OK(cube_stream_use(conf.client, s_home >> 63 ? 0 : s_home));
}

/* The calling stream's list, `cap` entries at most; returns the count. */
static size_t s_snap(cube_memory_scope scope, cube_buffer_info *out, size_t cap)
{
    for (size_t i = 0; i < cap; i++) {
        memset(&out[i], 0xAB, sizeof out[i]);
        out[i].struct_size = sizeof out[i];
    }
    size_t count = 12345;
    CONF_OK(cube_memory_snapshot(conf.client, scope, out, cap, &count));
    return count;
}

static const cube_buffer_info *s_find(const cube_buffer_info *list, size_t n,
                                      cube_handle h)
{
    const cube_buffer_info *found = NULL;
    for (size_t i = 0; i < n; i++)
        if (list[i].handle.bits == h.bits) {
            assert_null(found); /* listed once */
            found = &list[i];
        }
    return found;
}

CONF_TEST(snapshot_lists_each_buffer_once_with_size_pool_and_label)
{
    s_enter();
    cube_buffer_info list[8];
    assert_int_equal(s_snap(CUBE_MEMORY_STREAM, list, 8), 0);
    size_t count = 99;
    CONF_OK(
        cube_memory_snapshot(conf.client, CUBE_MEMORY_STREAM, NULL, 0, &count));
    assert_int_equal(count, 0);

    cube_handle a = conf_empty(1000);
    cube_handle b = conf_empty(3 << 20);
    CONF_OK(cube_handle_set_label(conf.client, a, "weights"));
    /* Two slices of a: still one entry. */
    cube_handle s1 = conf_slice(a, 0, 1000);
    cube_handle s2 = conf_slice(a, 256, 128);

    CONF_OK(
        cube_memory_snapshot(conf.client, CUBE_MEMORY_STREAM, NULL, 0, &count));
    assert_int_equal(count, 2);
    assert_int_equal(s_snap(CUBE_MEMORY_STREAM, list, 8), 2);
    const cube_buffer_info *ia = s_find(list, 2, a);
    const cube_buffer_info *ib = s_find(list, 2, b);
    assert_non_null(ia);
    assert_non_null(ib);
    assert_int_equal(ia->struct_size, sizeof *ia);
    assert_int_equal(ia->size, 1000);
    assert_int_equal(ib->size, 3 << 20);
    assert_string_equal(ia->label, "weights");
    assert_string_equal(ib->label, "");
    assert_int_equal(ia->flags, 0);
    assert_int_equal(ib->flags, 0);
    assert_true(ia->stream == cube_stream_current(conf.client));
    assert_true(ib->stream == ia->stream);

    /* The pool: a position of the stream's report, of the kind the
     * report gives it, and one that holds the buffer's size. */
    cube_memory_report r;
    CONF_OK(cube_memory_report_get(conf.client, &r));
    const cube_buffer_info *both[2] = {ia, ib};
    for (int i = 0; i < 2; i++) {
        const cube_buffer_info *x = both[i];
        assert_true(x->pool < r.count);
        const cube_pool_report *p = &r.pools[x->pool];
        assert_int_equal(x->pool_kind, p->config.kind);
        assert_true(p->buffers >= 1);
        if (p->config.kind != CUBE_POOL_PERSISTENT)
            assert_true(x->size >= p->config.min_size &&
                        x->size <= p->config.max_size);
    }

    /* The first handle released, the slices keep the buffer: listed under
     * the first handle's bits still. */
    conf_release(a);
    assert_int_equal(s_snap(CUBE_MEMORY_STREAM, list, 8), 2);
    ia = s_find(list, 2, a);
    assert_non_null(ia);
    assert_int_equal(ia->size, 1000);
    assert_string_equal(ia->label, "weights");
    assert_null(s_find(list, 2, s1));
    assert_null(s_find(list, 2, s2));

    /* Released whole: gone. */
    conf_release(s1);
    conf_release(s2);
    assert_int_equal(s_snap(CUBE_MEMORY_STREAM, list, 8), 1);
    assert_non_null(s_find(list, 1, b));

    /* The device scope: this client's buffers on every stream, the
     * suite's sentinel on the main stream among them. */
    size_t all = s_snap(CUBE_MEMORY_DEVICE, list, 8);
    assert_true(all >= 2);
    assert_non_null(s_find(list, all < 8 ? all : 8, b));
    int other_stream = 0;
    for (size_t i = 0; i < all && i < 8; i++)
        other_stream |= list[i].stream != cube_stream_current(conf.client);
    assert_true(other_stream);

    /* Another client's buffers are its own. */
    cube_client *other = NULL;
    CONF_OK(cube_client_open(conf.backend, NULL, &other));
    cube_handle o;
    CONF_OK(cube_empty(other, 64, &o));
    CONF_OK(cube_memory_snapshot(other, CUBE_MEMORY_DEVICE, NULL, 0, &count));
    assert_int_equal(count, 1);
    assert_int_equal(s_snap(CUBE_MEMORY_DEVICE, list, 8), all);
    CONF_OK(cube_handle_release(other, o));
    cube_client_close(other);

    conf_release(b);
    assert_int_equal(s_snap(CUBE_MEMORY_STREAM, list, 8), 0);
    s_leave();
}

CONF_TEST(snapshot_fills_at_most_cap_and_counts_all)
{
    s_enter();
    cube_handle h[3];
    for (int i = 0; i < 3; i++)
        h[i] = conf_empty(64u << i);
    cube_buffer_info list[3];
    memset(list, 0x5A, sizeof list);
    list[0].struct_size = sizeof list[0];
    size_t count = 0;
    CONF_OK(
        cube_memory_snapshot(conf.client, CUBE_MEMORY_STREAM, list, 2, &count));
    assert_int_equal(count, 3);
    for (int i = 0; i < 2; i++) {
        assert_int_equal(list[i].struct_size, sizeof list[i]);
        assert_true(list[i].size == 64 || list[i].size == 128 ||
                    list[i].size == 256);
    }
    assert_true(list[0].handle.bits != list[1].handle.bits);
    /* The third element was not touched. */
    unsigned char untouched[sizeof list[2]];
    memset(untouched, 0x5A, sizeof untouched);
    assert_memory_equal(&list[2], untouched, sizeof untouched);

    /* A caller built against a larger struct: its stride, the fields known
     * here filled, the rest untouched. */
    struct {
        cube_buffer_info i;
        uint64_t later;
    } big[3];
    memset(big, 0, sizeof big);
    big[0].i.struct_size = sizeof big[0];
    for (int i = 0; i < 3; i++)
        big[i].later = 77;
    CONF_OK(cube_memory_snapshot(conf.client, CUBE_MEMORY_STREAM, &big[0].i, 3,
                                 &count));
    assert_int_equal(count, 3);
    uint64_t sizes = 0;
    for (int i = 0; i < 3; i++) {
        assert_int_equal(big[i].i.struct_size, sizeof(cube_buffer_info));
        assert_int_equal(big[i].later, 77);
        sizes += big[i].i.size;
    }
    assert_int_equal(sizes, 64 + 128 + 256);

    /* A caller built against the first version: only its bytes. */
    unsigned char v1[2][CUBE_BUFFER_INFO_V1_SIZE];
    memset(v1, 0, sizeof v1);
    ((cube_buffer_info *)(void *)v1[0])->struct_size = CUBE_BUFFER_INFO_V1_SIZE;
    CONF_OK(cube_memory_snapshot(conf.client, CUBE_MEMORY_STREAM,
                                 (cube_buffer_info *)(void *)v1[0], 2, &count));
    assert_int_equal(count, 3);
    for (int i = 0; i < 3; i++)
        conf_release(h[i]);
    s_leave();
}

CONF_TEST(snapshot_marks_wrapped_and_dry_run_buffers)
{
    s_enter();
    /* Memory of this device that cubert did not hand out as this buffer:
     * another buffer's, wrapped. */
    cube_handle h = conf_empty(4096);
    CONF_OK(cube_sync(conf.client, &h, 1));
    cube_native_buffer nb;
    CONF_OK(cube_native_buffer_get(conf.client, h, &nb));
    cube_handle w;
    cube_error *err =
        cube_wrap_memory(conf.client, nb.address, 1024, NULL, NULL, &w);
    /* Every backend so far wraps memory; one that cannot skips that part,
     * unless its buffers are host memory, which wraps (interop.h). */
    if (err && cube_error_code(err) == CUBE_ERR_UNSUPPORTED &&
        !(conf.props.features & CUBE_FEATURE_HOST_MEMORY)) {
        cube_error_free(err);
        w.bits = 0;
    } else {
        CONF_OK(err);
    }
    CONF_OK(cube_dry_run_begin(conf.client));
    cube_handle d = conf_empty(512);
    CONF_OK(cube_dry_run_end(conf.client));

    cube_buffer_info list[4];
    size_t n = s_snap(CUBE_MEMORY_STREAM, list, 4);
    assert_int_equal(n, w.bits ? 3 : 2);
    const cube_buffer_info *ih = s_find(list, n, h);
    assert_non_null(ih);
    assert_int_equal(ih->flags, 0);
    assert_true(ih->pool != CUBE_BUFFER_NO_POOL);
    if (w.bits) {
        const cube_buffer_info *iw = s_find(list, n, w);
        assert_non_null(iw);
        assert_int_equal(iw->flags, CUBE_BUFFER_FOREIGN);
        assert_int_equal(iw->pool, CUBE_BUFFER_NO_POOL);
        assert_int_equal(iw->size, 1024);
    }
    const cube_buffer_info *id = s_find(list, n, d);
    assert_non_null(id);
    assert_int_equal(id->flags, CUBE_BUFFER_DEFERRED);
    assert_int_equal(id->pool, CUBE_BUFFER_NO_POOL);
    assert_int_equal(id->size, 512);

    /* Its first write backs it: in a pool from then on. */
    unsigned char bytes[512] = {1};
    CONF_WRITE_OK(d, bytes, sizeof bytes);
    n = s_snap(CUBE_MEMORY_STREAM, list, 4);
    id = s_find(list, n, d);
    assert_non_null(id);
    assert_int_equal(id->flags, 0);
    assert_true(id->pool != CUBE_BUFFER_NO_POOL);

    conf_release(d);
    if (w.bits)
        conf_release(w);
    conf_release(h);
    assert_int_equal(s_snap(CUBE_MEMORY_STREAM, list, 4), 0);
    s_leave();
}

CONF_TEST(snapshot_refuses_bad_input_and_the_client_still_answers)
{
    cube_buffer_info list[2];
    memset(list, 0, sizeof list);
    list[0].struct_size = sizeof list[0];
    size_t count = 7;
    CONF_EXPECT(cube_memory_snapshot(NULL, CUBE_MEMORY_STREAM, list, 2, &count),
                CUBE_ERR_INVALID_ARGUMENT);
    assert_int_equal(count, 0);
    CONF_EXPECT(
        cube_memory_snapshot(conf.client, CUBE_MEMORY_STREAM, list, 2, NULL),
        CUBE_ERR_INVALID_ARGUMENT);
    CONF_EXPECT_MSG(
        cube_memory_snapshot(conf.client, CUBE_MEMORY_STREAM, NULL, 2, &count),
        CUBE_ERR_INVALID_ARGUMENT, "out is NULL");
    list[0].struct_size = 8;
    CONF_EXPECT_MSG(
        cube_memory_snapshot(conf.client, CUBE_MEMORY_STREAM, list, 2, &count),
        CUBE_ERR_INVALID_ARGUMENT, "struct_size");
    list[0].struct_size = sizeof list[0];
    CONF_EXPECT(cube_memory_snapshot(conf.client, (cube_memory_scope)7, list, 2,
                                     &count),
                CUBE_ERR_INVALID_ARGUMENT);
    /* A small struct_size with cap 0 is not looked at. */
    list[0].struct_size = 0;
    CONF_OK(
        cube_memory_snapshot(conf.client, CUBE_MEMORY_DEVICE, list, 0, &count));
    assert_true(count >= 1); /* the suite's sentinel */
    list[0].struct_size = sizeof list[0];
    CONF_OK(
        cube_memory_snapshot(conf.client, CUBE_MEMORY_DEVICE, list, 2, &count));
    assert_true(count >= 1);
}
