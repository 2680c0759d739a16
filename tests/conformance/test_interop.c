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

static int host_backend(void)
{
    return strcmp(conf.props.backend, "cuda") != 0;
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
                        CUBE_ERR_INVALID_ARGUMENT, "not memory CUDA knows");
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
