/* Sharing memory and streams (cubert/interop.h): native addresses and
 * streams, memory cubert did not allocate wrapped as buffers (released
 * once, also when the client closes first; the failure store applies),
 * and foreign writes made known. The memory to wrap is another client's
 * buffer seen through its native address, which every backend has. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "conformance.h"

/* Buffers in host memory (CUBE_FEATURE_HOST_MEMORY): the host may
 * dereference their addresses, and (interop.h) work is done when its call
 * returns, so there is no native stream. */
static int host_backend(void)
{
    return (conf.props.features & CUBE_FEATURE_HOST_MEMORY) != 0;
}

CONF_TEST(interop_native_buffer_and_stream)
{
    unsigned char in[256];
    conf_pattern(in, sizeof in, 5);
    cube_handle h = conf_create(in, sizeof in);
    cube_native_buffer nb;
    CONF_OK(cube_native_buffer_get(conf.client, h, &nb));
    assert_true(nb.address != 0);
    assert_int_equal(nb.size, sizeof in);
    assert_int_equal(nb.address % conf.props.memory_alignment, 0);
    assert_int_equal(nb.host_accessible, host_backend());
    if (nb.host_accessible) {
        CONF_OK(cube_sync(conf.client, &h, 1));
        assert_memory_equal((const void *)(uintptr_t)nb.address, in, sizeof in);
    }
    /* A slice's address is its buffer's plus the offset. */
    cube_handle s = conf_slice(h, 40, 100);
    cube_native_buffer ns;
    CONF_OK(cube_native_buffer_get(conf.client, s, &ns));
    assert_int_equal(ns.address, nb.address + 40);
    assert_int_equal(ns.size, 100);
    conf_release(s);

    void *stream = (void *)&nb, *again = NULL;
    CONF_OK(cube_native_stream(conf.client, &stream));
    CONF_OK(cube_native_stream(conf.client, &again));
    assert_ptr_equal(stream, again);
    if (host_backend())
        assert_null(stream);
    else
        assert_non_null(stream);

    CONF_EXPECT(cube_native_buffer_get(NULL, h, &nb),
                CUBE_ERR_INVALID_ARGUMENT);
    CONF_EXPECT(cube_native_buffer_get(conf.client, h, NULL),
                CUBE_ERR_INVALID_ARGUMENT);
    CONF_EXPECT(cube_native_stream(conf.client, NULL),
                CUBE_ERR_INVALID_ARGUMENT);
    CONF_EXPECT(cube_native_stream(NULL, &stream), CUBE_ERR_INVALID_ARGUMENT);
    conf_release(h);
    CONF_EXPECT(cube_native_buffer_get(conf.client, h, &nb),
                CUBE_ERR_NOT_FOUND);
    CONF_EXPECT(cube_native_written(conf.client, h), CUBE_ERR_NOT_FOUND);
}

/* The owner of wrapped memory: another client's buffer, released when
 * the wrapper lets it go. */
typedef struct owner {
    cube_client *client;
    cube_handle handle;
    int releases;
} owner;

static void release_owner(void *user)
{
    owner *o = user;
    o->releases++;
    cube_error_free(cube_handle_release(o->client, o->handle));
}

static owner *make_owner(cube_client *c, const void *bytes, uint64_t size,
                         cube_native_buffer *nb)
{
    owner *o = calloc(1, sizeof *o);
    assert_non_null(o);
    o->client = c;
    CONF_OK(cube_create(c, bytes, size, &o->handle));
    CONF_OK(cube_sync(c, &o->handle, 1));
    CONF_OK(cube_native_buffer_get(c, o->handle, nb));
    return o;
}

CONF_TEST(interop_wrapped_memory_is_shared_released_once_and_failable)
{
    cube_client *other = NULL;
    CONF_OK(cube_client_open(conf.backend, NULL, &other));
    unsigned char in[512], out[512];
    conf_pattern(in, sizeof in, 9);
    cube_native_buffer nb;
    owner *o = make_owner(other, in, sizeof in, &nb);

    cube_memory_usage before, after;
    CONF_OK(cube_memory_usage_get(conf.client, &before));
    cube_handle w;
    CONF_OK(cube_wrap_memory(conf.client, nb.address, nb.size, release_owner, o,
                             &w));
    CONF_OK(cube_memory_usage_get(conf.client, &after));
    assert_int_equal(after.foreign_buffers, before.foreign_buffers + 1);
    assert_int_equal(after.foreign_bytes, before.foreign_bytes + sizeof in);
    assert_int_equal(after.bytes_in_use, before.bytes_in_use);

    /* The same bytes, no copy: read through the wrapper, write through it
     * and read back through the owner. */
    CONF_READ_OK(w, out, sizeof out);
    assert_memory_equal(in, out, sizeof in);
    conf_pattern(in, sizeof in, 10);
    CONF_WRITE_OK(w, in, sizeof in);
    CONF_OK(cube_sync(conf.client, &w, 1));
    cube_copy_desc d = cube_copy_desc_contiguous(o->handle, sizeof out, 1);
    void *dst[1] = {out};
    uint64_t size[1] = {sizeof out};
    CONF_OK(cube_read(other, &d, dst, size, 1));
    assert_memory_equal(in, out, sizeof in);

    /* The failure store applies; a full write clears it. */
    conf_mark_failed(w);
    CONF_EXPECT_REFUSED(w, sizeof out, conf_mark_code());
    CONF_WRITE_OK(w, in, sizeof in);
    CONF_OK(cube_check(conf.client, &w, 1));

    /* Cleanup never frees it; a slice keeps it alive. */
    CONF_OK(cube_memory_cleanup(conf.client));
    cube_handle s = conf_slice(w, 16, 64);
    conf_release(w);
    assert_int_equal(o->releases, 0);
    CONF_READ_OK(s, out, 64);
    assert_memory_equal(in + 16, out, 64);
    conf_release(s);
    assert_int_equal(o->releases, 1);
    CONF_OK(cube_memory_usage_get(conf.client, &after));
    assert_int_equal(after.foreign_buffers, before.foreign_buffers);
    free(o);

    /* A client closed first still releases it, once. */
    cube_client *brief = NULL;
    CONF_OK(cube_client_open(conf.backend, NULL, &brief));
    o = make_owner(other, in, sizeof in, &nb);
    CONF_OK(cube_wrap_memory(brief, nb.address, nb.size, release_owner, o, &w));
    cube_client_close(brief);
    assert_int_equal(o->releases, 1);
    free(o);
    cube_client_close(other);
}

CONF_TEST(interop_wrap_refuses_bad_memory_and_takes_nothing)
{
    cube_handle w = {12345};
    int calls = 0;
    CONF_EXPECT(cube_wrap_memory(NULL, 4096, 64, NULL, NULL, &w),
                CUBE_ERR_INVALID_ARGUMENT);
    CONF_EXPECT(cube_wrap_memory(conf.client, 4096, 64, NULL, NULL, NULL),
                CUBE_ERR_INVALID_ARGUMENT);
    CONF_EXPECT_MSG(cube_wrap_memory(conf.client, 0, 64, NULL, NULL, &w),
                    CUBE_ERR_INVALID_ARGUMENT, "address is 0");
    assert_int_equal(w.bits, 0);
    CONF_EXPECT_MSG(cube_wrap_memory(conf.client, 4096, 0, NULL, NULL, &w),
                    CUBE_ERR_INVALID_ARGUMENT, "size is 0");
    CONF_EXPECT_MSG(cube_wrap_memory(conf.client, 4097, 64, NULL, NULL, &w),
                    CUBE_ERR_INVALID_ARGUMENT, "multiple of 16");
    CONF_EXPECT_MSG(
        cube_wrap_memory(conf.client, UINT64_MAX - 15, 64, NULL, NULL, &w),
        CUBE_ERR_INVALID_ARGUMENT, "past the end");
    if (!host_backend()) {
        /* Host memory is not the GPU's; nor is a range past its
         * allocation. */
        unsigned char *host = aligned_alloc(64, 4096);
        assert_non_null(host);
        CONF_EXPECT_MSG(cube_wrap_memory(conf.client, (uint64_t)(uintptr_t)host,
                                         4096, NULL, NULL, &w),
                        CUBE_ERR_INVALID_ARGUMENT, "not memory");
        free(host);
        unsigned char in[256];
        conf_pattern(in, sizeof in, 1);
        cube_handle h = conf_create(in, sizeof in);
        cube_native_buffer nb;
        CONF_OK(cube_native_buffer_get(conf.client, h, &nb));
        CONF_EXPECT_MSG(cube_wrap_memory(conf.client, nb.address,
                                         (uint64_t)1 << 40, NULL, NULL, &w),
                        CUBE_ERR_INVALID_ARGUMENT, "past the end");
        conf_release(h);
    }
    assert_int_equal(calls, 0);
    assert_int_equal(w.bits, 0);
}

CONF_TEST(interop_native_written_orders_and_clears_failures)
{
    unsigned char in[128], out[128];
    conf_pattern(in, sizeof in, 3);
    cube_handle h = conf_create(in, sizeof in);
    conf_mark_failed(h);
    CONF_EXPECT_REFUSED(h, sizeof out, conf_mark_code());
    cube_native_buffer nb;
    CONF_OK(cube_native_buffer_get(conf.client, h, &nb));
    if (nb.host_accessible) {
        /* Foreign code writes the bytes itself, then says so. */
        memset((void *)(uintptr_t)nb.address, 0x5A, sizeof in);
        CONF_OK(cube_native_written(conf.client, h));
        CONF_READ_OK(h, out, sizeof out);
        for (size_t i = 0; i < sizeof out; i++)
            assert_int_equal(out[i], 0x5A);
    } else {
        /* Nothing foreign ran here; the call still counts as the
         * buffer's full write. */
        CONF_OK(cube_native_written(conf.client, h));
        CONF_OK(cube_check(conf.client, &h, 1));
    }
    /* A slice's foreign write is partial: a failure stays. */
    conf_mark_failed(h);
    cube_handle s = conf_slice(h, 0, 64);
    CONF_OK(cube_native_written(conf.client, s));
    CONF_EXPECT(cube_check(conf.client, &h, 1), CUBE_ERR_SEVERAL);
    conf_release(s);
    CONF_EXPECT(cube_native_written(NULL, h), CUBE_ERR_INVALID_ARGUMENT);
    conf_release(h);
}

/* A wait for a foreign stream orders this thread's later work after the
 * work on it. The foreign stream is another cubert stream's native queue,
 * and the buffer read after the wait is a wrapped alias of the buffer it
 * writes: cubert sees no link between the two, so only the wait orders
 * the read after the late write of a long `spin`. */
CONF_TEST(interop_native_wait_orders_after_a_foreign_stream)
{
    const cube_stream_id other = 0x1A7E000000000001ull;
    CONF_EXPECT(cube_native_wait(NULL, NULL), CUBE_ERR_INVALID_ARGUMENT);
    CONF_OK(cube_native_wait(conf.client, NULL));
    if (conf.props.features & CUBE_FEATURE_GRAPHS) {
        /* A capture cannot wait for work outside it, on any backend; a
         * bad argument is still the first error. */
        cube_graph_id g = 0;
        CONF_OK(cube_graph_prepare(conf.client));
        CONF_OK(cube_graph_begin(conf.client));
        CONF_EXPECT(cube_native_wait(conf.client, NULL), CUBE_ERR_GRAPH_STATE);
        if (host_backend())
            CONF_EXPECT(cube_native_wait(conf.client, &conf),
                        CUBE_ERR_INVALID_ARGUMENT);
        CONF_OK(cube_graph_end(conf.client, &g));
        CONF_OK(cube_graph_destroy(conf.client, g));
    }
    if (host_backend()) {
        /* No native streams: NULL is the only stream there is. */
        CONF_EXPECT_MSG(cube_native_wait(conf.client, &conf),
                        CUBE_ERR_INVALID_ARGUMENT, "no native streams");
        return;
    }
    if (conf_backend_note("cuda_default_streams")) {
        CONF_OK(cube_native_wait(conf.client, CUBE_NATIVE_STREAM_LEGACY));
        CONF_OK(cube_native_wait(conf.client, CUBE_NATIVE_STREAM_PER_THREAD));
    } else {
        CONF_EXPECT(cube_native_wait(conf.client, CUBE_NATIVE_STREAM_LEGACY),
                    CUBE_ERR_INVALID_ARGUMENT);
    }

    const uint32_t n = 1u << 20, iters = 16384;
    const uint64_t bytes = (uint64_t)n * 4;
    uint32_t *x0 = conf_host_u32(n), *got = conf_host_u32(n),
             *want = conf_host_u32(n), *zero = conf_host_u32(n);
    conf_pattern(x0, bytes, 0x3C);
    memset(zero, 0, bytes);
    cube_handle x = conf_create(x0, bytes);
    cube_handle y = conf_create(zero, bytes);
    CONF_OK(cube_sync(conf.client, &y, 1));
    cube_native_buffer nb;
    CONF_OK(cube_native_buffer_get(conf.client, y, &nb));
    cube_handle alias;
    CONF_OK(
        cube_wrap_memory(conf.client, nb.address, nb.size, NULL, NULL, &alias));

    CONF_OK(cube_stream_use(conf.client, other));
    void *foreign = NULL;
    CONF_OK(cube_native_stream(conf.client, &foreign));
    cube_arg args[3] = {cube_arg_buffer(x), cube_arg_buffer(y),
                        cube_arg_u32(iters)};
    CONF_OK(conf_launch(conf.k.spin, cube_count_static(n / 256, 1, 1), args, 3,
                        CUBE_LAUNCH_EXECUTE));
    CONF_OK(cube_stream_use(conf.client, 0));

    CONF_OK(cube_native_wait(conf.client, foreign));
    CONF_READ_OK(alias, got, bytes);
    conf_spin_model(x0, want, n, iters);
    for (uint32_t i = 0; i < n; i++)
        if (got[i] != want[i])
            fail_msg("element %u read %u, the spin wrote %u: the read did "
                     "not wait for the foreign stream",
                     i, got[i], want[i]);
    conf_release(alias);
    conf_release(x);
    conf_release(y);
    free(x0);
    free(got);
    free(want);
    free(zero);
}

/* ----------------------------------------------------------- DLPack */

static int deleted;

static void count_delete(cube_dl_managed_versioned *self)
{
    (void)self;
    deleted++;
}

static void count_delete_legacy(cube_dl_managed *self)
{
    (void)self;
    deleted++;
}

/* `v` is refused by both imports, versioned and legacy (the same tensor),
 * with CUBE_ERR_INVALID_ARGUMENT naming `needle`, and stays the caller's:
 * no deleter runs, no handle comes back. */
static void expect_import_refused(cube_dl_managed_versioned *v,
                                  const char *needle)
{
    int before = deleted;
    cube_handle out = {7};
    CONF_EXPECT_MSG(cube_dlpack_import(conf.client, v, &out),
                    CUBE_ERR_INVALID_ARGUMENT, needle);
    assert_int_equal(out.bits, 0);
    cube_dl_managed legacy;
    memset(&legacy, 0, sizeof legacy);
    legacy.dl_tensor = v->dl_tensor;
    legacy.deleter = count_delete_legacy;
    out.bits = 7;
    CONF_EXPECT_MSG(cube_dlpack_import_legacy(conf.client, &legacy, &out),
                    CUBE_ERR_INVALID_ARGUMENT, needle);
    assert_int_equal(out.bits, 0);
    assert_int_equal(deleted, before);
}

CONF_TEST(interop_dlpack_export_and_import_round_trip)
{
    float in[24], out[24];
    for (int i = 0; i < 24; i++)
        in[i] = (float)i * 0.5f;
    cube_handle h = conf_create(in, sizeof in);
    int64_t shape[3] = {2, 3, 4};
    cube_dl_dtype f32 = {CUBE_DL_FLOAT, 32, 1};
    cube_dl_managed_versioned *t = NULL;
    CONF_OK(cube_dlpack_export(conf.client, h, f32, 3, shape, NULL, NULL, &t));
    assert_non_null(t);
    assert_int_equal(t->version.major, 1);
    assert_int_equal(t->dl_tensor.ndim, 3);
    assert_int_equal(t->dl_tensor.shape[1], 3);
    assert_int_equal(t->dl_tensor.strides[0], 12);
    assert_int_equal(t->dl_tensor.strides[2], 1);
    assert_int_equal(t->dl_tensor.dtype.bits, 32);
    assert_int_equal(t->dl_tensor.device.device_type,
                     host_backend() ? CUBE_DL_CPU : CUBE_DL_CUDA);
    cube_native_buffer nb;
    CONF_OK(cube_native_buffer_get(conf.client, h, &nb));
    assert_int_equal((uint64_t)(uintptr_t)t->dl_tensor.data +
                         t->dl_tensor.byte_offset,
                     nb.address);
    /* The tensor keeps the buffer alive after the handle goes. */
    conf_release(h);
    /* Taken in by another client of the device: the same bytes. */
    cube_client *other = NULL;
    CONF_OK(cube_client_open(conf.backend, NULL, &other));
    cube_handle in_other;
    CONF_OK(cube_dlpack_import(other, t, &in_other));
    cube_copy_desc d = cube_copy_desc_contiguous(in_other, sizeof out, 4);
    void *dst[1] = {out};
    uint64_t size[1] = {sizeof out};
    CONF_OK(cube_read(other, &d, dst, size, 1));
    assert_memory_equal(in, out, sizeof in);
    /* The last reference calls the tensor's deleter, which gives back the
     * export's own reference (ASan's leak check is the judge). */
    CONF_OK(cube_handle_release(other, in_other));
    cube_client_close(other);

    /* A view with strides (the transpose of a 4 x 6 matrix), exported
     * without a wait. */
    h = conf_create(in, sizeof in);
    int64_t tshape[2] = {6, 4}, tstrides[2] = {1, 6};
    CONF_OK(cube_dlpack_export(conf.client, h, f32, 2, tshape, tstrides,
                               CUBE_DLPACK_NO_SYNC, &t));
    assert_int_equal(t->dl_tensor.strides[1], 6);
    t->deleter(t);
    /* A consumer's own native stream (CUDA), or the host's wait. */
    void *stream = NULL;
    CONF_OK(cube_native_stream(conf.client, &stream));
    CONF_OK(cube_dlpack_export(conf.client, h, f32, 1, (int64_t[]){24}, NULL,
                               stream, &t));
    t->deleter(t);
    conf_release(h);
}

CONF_TEST(interop_dlpack_refuses_bad_tensors_and_keeps_them_the_callers)
{
    float in[16] = {0};
    cube_handle h = conf_create(in, sizeof in);
    cube_dl_dtype f32 = {CUBE_DL_FLOAT, 32, 1};
    cube_dl_managed_versioned *t = (cube_dl_managed_versioned *)&in;
    int64_t shape[2] = {4, 4};
    CONF_EXPECT(cube_dlpack_export(NULL, h, f32, 2, shape, NULL, NULL, &t),
                CUBE_ERR_INVALID_ARGUMENT);
    CONF_EXPECT(
        cube_dlpack_export(conf.client, h, f32, 2, shape, NULL, NULL, NULL),
        CUBE_ERR_INVALID_ARGUMENT);
    CONF_EXPECT_MSG(
        cube_dlpack_export(conf.client, h, f32, 9, shape, NULL, NULL, &t),
        CUBE_ERR_INVALID_ARGUMENT, "ndim");
    assert_null(t);
    CONF_EXPECT(
        cube_dlpack_export(conf.client, h, f32, 2, NULL, NULL, NULL, &t),
        CUBE_ERR_INVALID_ARGUMENT);
    cube_dl_dtype odd = {CUBE_DL_FLOAT, 24, 1}, wide = {CUBE_DL_INT, 32, 4};
    CONF_EXPECT_MSG(
        cube_dlpack_export(conf.client, h, odd, 2, shape, NULL, NULL, &t),
        CUBE_ERR_INVALID_ARGUMENT, "dtype");
    CONF_EXPECT(
        cube_dlpack_export(conf.client, h, wide, 2, shape, NULL, NULL, &t),
        CUBE_ERR_INVALID_ARGUMENT);
    int64_t big[2] = {4, 5};
    CONF_EXPECT_MSG(
        cube_dlpack_export(conf.client, h, f32, 2, big, NULL, NULL, &t),
        CUBE_ERR_INVALID_ARGUMENT, "span");
    int64_t neg[2] = {4, -1};
    CONF_EXPECT(
        cube_dlpack_export(conf.client, h, f32, 2, shape, neg, NULL, &t),
        CUBE_ERR_INVALID_ARGUMENT);
    /* A failed buffer is refused, as a read would be. */
    cube_handle f = conf_create(in, sizeof in);
    conf_mark_failed(f);
    CONF_EXPECT(
        cube_dlpack_export(conf.client, f, f32, 2, shape, NULL, NULL, &t),
        CUBE_ERR_SEVERAL);
    assert_null(t);
    conf_release(f);

    /* Imports: refused ones stay the caller's (no deleter call). */
    cube_native_buffer nb;
    CONF_OK(cube_native_buffer_get(conf.client, h, &nb));
    cube_dl_managed_versioned v;
    memset(&v, 0, sizeof v);
    v.version.major = 1;
    v.deleter = count_delete;
    v.dl_tensor.data = (void *)(uintptr_t)nb.address;
    v.dl_tensor.device.device_type =
        host_backend() ? CUBE_DL_CPU : CUBE_DL_CUDA;
    v.dl_tensor.device.device_id = 0;
    v.dl_tensor.ndim = 2;
    v.dl_tensor.dtype = f32;
    v.dl_tensor.shape = shape;
    cube_handle out = {7};
    deleted = 0;
    CONF_EXPECT(cube_dlpack_import(NULL, &v, &out), CUBE_ERR_INVALID_ARGUMENT);
    CONF_EXPECT(cube_dlpack_import(conf.client, NULL, &out),
                CUBE_ERR_INVALID_ARGUMENT);
    v.version.major = 2;
    CONF_EXPECT_MSG(cube_dlpack_import(conf.client, &v, &out),
                    CUBE_ERR_INVALID_ARGUMENT, "1.x");
    v.version.major = 1;
    v.flags = CUBE_DL_FLAG_READ_ONLY;
    CONF_EXPECT(cube_dlpack_import(conf.client, &v, &out),
                CUBE_ERR_UNSUPPORTED);
    v.flags = 0;
    v.dl_tensor.device.device_type =
        host_backend() ? CUBE_DL_CUDA : CUBE_DL_CPU;
    CONF_EXPECT_MSG(cube_dlpack_import(conf.client, &v, &out),
                    CUBE_ERR_INVALID_ARGUMENT, "device type");
    v.dl_tensor.device.device_type =
        host_backend() ? CUBE_DL_CPU : CUBE_DL_CUDA;
    int64_t empty[2] = {4, 0};
    v.dl_tensor.shape = empty;
    CONF_EXPECT_MSG(cube_dlpack_import(conf.client, &v, &out),
                    CUBE_ERR_INVALID_ARGUMENT, "no element");
    v.dl_tensor.shape = shape;
    v.dl_tensor.byte_offset = 4; /* misaligned */
    CONF_EXPECT_MSG(cube_dlpack_import(conf.client, &v, &out),
                    CUBE_ERR_INVALID_ARGUMENT, "multiple of 16");
    /* A byte_offset that wraps data + byte_offset past 2^64 would start
     * the buffer 16 bytes before data (still aligned, and memory of the
     * device): refused. So is a start near the top whose extent wraps. */
    v.dl_tensor.byte_offset = (uint64_t)0 - 16u;
    expect_import_refused(&v, "byte_offset");
    v.dl_tensor.byte_offset = (uint64_t)0 - 32u - nb.address;
    expect_import_refused(&v, "address space");
    v.dl_tensor.byte_offset = 0;
    /* Extents and strides whose span overflows 64 bits. */
    int64_t huge[2] = {INT64_C(1) << 40, INT64_C(1) << 40};
    v.dl_tensor.shape = huge;
    expect_import_refused(&v, "spans more than fits");
    int64_t far[2] = {INT64_MAX, 1}, two[2] = {3, 4};
    v.dl_tensor.shape = two;
    v.dl_tensor.strides = far;
    expect_import_refused(&v, "spans more than fits");
    int64_t one[1] = {2}, top[1] = {INT64_C(1) << 62};
    v.dl_tensor.ndim = 1;
    v.dl_tensor.shape = one;
    v.dl_tensor.strides = top; /* the last element fits; its bytes do not */
    expect_import_refused(&v, "spans more than fits");
    v.dl_tensor.ndim = 2;
    v.dl_tensor.shape = shape;
    v.dl_tensor.strides = NULL;
    assert_int_equal(deleted, 0);
    /* The client is as it was: the buffer reads back. */
    float back[16];
    cube_copy_desc whole = cube_copy_desc_contiguous(h, sizeof back, 4);
    void *dst[1] = {back};
    uint64_t size[1] = {sizeof back};
    CONF_OK(cube_read(conf.client, &whole, dst, size, 1));
    assert_memory_equal(back, in, sizeof back);
    assert_int_equal(out.bits, 0);
    /* A good one, versioned and legacy: the deleter runs at the last
     * reference, once. */
    CONF_OK(cube_dlpack_import(conf.client, &v, &out));
    assert_int_equal(deleted, 0);
    conf_release(out);
    assert_int_equal(deleted, 1);
    cube_dl_managed legacy;
    memset(&legacy, 0, sizeof legacy);
    legacy.dl_tensor = v.dl_tensor;
    legacy.deleter = count_delete_legacy;
    CONF_OK(cube_dlpack_import_legacy(conf.client, &legacy, &out));
    conf_release(out);
    assert_int_equal(deleted, 2);
    conf_release(h);
}
