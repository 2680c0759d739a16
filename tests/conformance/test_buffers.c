/* Buffers: creation, round trips, slices, reference counts, handle checks,
 * and argument checks on every entry point. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "conformance.h"

CONF_TEST(buffer_create_read_round_trip_many_sizes)
{
    static const uint64_t sizes[] = {
        1, 2, 3, 7, 63, 64, 65, 127, 1000, 4095, 4097, 65537, 100003, 1u << 20};
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        uint64_t n = sizes[i];
        unsigned char *in = malloc(n), *out = malloc(n);
        assert_non_null(in);
        assert_non_null(out);
        conf_pattern(in, n, (uint32_t)i + 1);
        memset(out, 0, n);
        cube_handle h = conf_create(in, n);
        CONF_READ_OK(h, out, n);
        assert_memory_equal(in, out, n);
        conf_release(h);
        free(in);
        free(out);
    }
}

CONF_TEST(buffer_empty_write_read_round_trip)
{
    static const uint64_t sizes[] = {1, 5, 64, 333, 8192, 1u << 20};
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        uint64_t n = sizes[i];
        unsigned char *in = malloc(n), *out = malloc(n);
        assert_non_null(in);
        assert_non_null(out);
        cube_handle h = conf_empty(n);
        conf_pattern(in, n, 100 + (uint32_t)i);
        CONF_WRITE_OK(h, in, n);
        CONF_READ_OK(h, out, n);
        assert_memory_equal(in, out, n);
        /* A second write replaces the bytes. */
        conf_pattern(in, n, 200 + (uint32_t)i);
        CONF_WRITE_OK(h, in, n);
        CONF_READ_OK(h, out, n);
        assert_memory_equal(in, out, n);
        conf_release(h);
        free(in);
        free(out);
    }
    /* Two buffers never alias. */
    unsigned char a[256], b[256], ra[256], rb[256];
    memset(a, 1, sizeof a);
    memset(b, 2, sizeof b);
    cube_handle ha = conf_create(a, sizeof a), hb = conf_create(b, sizeof b);
    memset(a, 3, sizeof a);
    CONF_WRITE_OK(ha, a, sizeof a);
    CONF_READ_OK(ha, ra, sizeof ra);
    CONF_READ_OK(hb, rb, sizeof rb);
    assert_memory_equal(ra, a, sizeof a);
    assert_memory_equal(rb, b, sizeof b);
    conf_release(ha);
    conf_release(hb);
}

CONF_TEST(buffer_handle_size_reports_the_range)
{
    cube_handle h = conf_empty(1000);
    uint64_t size = 0;
    CONF_OK(cube_handle_size(conf.client, h, &size));
    assert_int_equal(size, 1000);
    cube_handle s = conf_slice(h, 100, 17);
    CONF_OK(cube_handle_size(conf.client, s, &size));
    assert_int_equal(size, 17);
    conf_release(s);
    conf_release(h);
}

/* A label names the buffer, shared by its slices; it is copied, cleared
 * by NULL or "", and a bad one is refused with the old label kept. */
CONF_TEST(buffer_label_set_read_clear_and_refuse)
{
    cube_handle h = conf_empty(256);
    cube_handle s = conf_slice(h, 16, 32);
    char got[CUBE_LABEL_MAX + 1] = "x";
    CONF_OK(cube_handle_label(conf.client, h, got, sizeof got));
    assert_string_equal(got, "");
    char name[16] = "weights";
    CONF_OK(cube_handle_set_label(conf.client, h, name));
    name[0] = 'W'; /* copied: the caller's string may change */
    CONF_OK(cube_handle_label(conf.client, s, got, sizeof got));
    assert_string_equal(got, "weights");
    /* Too short for the label and its NUL. */
    CONF_EXPECT(cube_handle_label(conf.client, h, got, 7),
                CUBE_ERR_INVALID_ARGUMENT);
    CONF_EXPECT(cube_handle_label(conf.client, h, NULL, 8),
                CUBE_ERR_INVALID_ARGUMENT);
    CONF_EXPECT(cube_handle_label(NULL, h, got, sizeof got),
                CUBE_ERR_INVALID_ARGUMENT);
    /* Refused, not truncated: the old label stays. */
    char longest[CUBE_LABEL_MAX + 2];
    memset(longest, 'a', sizeof longest - 1);
    longest[CUBE_LABEL_MAX + 1] = 0;
    CONF_EXPECT(cube_handle_set_label(conf.client, h, longest),
                CUBE_ERR_INVALID_ARGUMENT);
    CONF_EXPECT(cube_handle_set_label(conf.client, h, "a\"b"),
                CUBE_ERR_INVALID_ARGUMENT);
    CONF_EXPECT(cube_handle_set_label(conf.client, h, "tab\there"),
                CUBE_ERR_INVALID_ARGUMENT);
    CONF_EXPECT(cube_handle_set_label(NULL, h, "x"), CUBE_ERR_INVALID_ARGUMENT);
    CONF_OK(cube_handle_label(conf.client, h, got, sizeof got));
    assert_string_equal(got, "weights");
    longest[CUBE_LABEL_MAX] = 0; /* exactly the longest allowed */
    CONF_OK(cube_handle_set_label(conf.client, s, longest));
    CONF_OK(cube_handle_label(conf.client, h, got, sizeof got));
    assert_string_equal(got, longest);
    CONF_OK(cube_handle_set_label(conf.client, h, ""));
    CONF_OK(cube_handle_label(conf.client, h, got, sizeof got));
    assert_string_equal(got, "");
    CONF_OK(cube_handle_set_label(conf.client, h, "again"));
    CONF_OK(cube_handle_set_label(conf.client, h, NULL));
    CONF_OK(cube_handle_label(conf.client, h, got, sizeof got));
    assert_string_equal(got, "");
    CONF_OK(cube_handle_set_label(conf.client, h, "kept to the end"));
    conf_release(s);
    conf_release(h);
    /* A released handle is stale; the client stays usable. */
    CONF_EXPECT(cube_handle_set_label(conf.client, h, "late"),
                CUBE_ERR_NOT_FOUND);
    CONF_EXPECT(cube_handle_label(conf.client, h, got, sizeof got),
                CUBE_ERR_NOT_FOUND);
    /* Another client's handle is refused. */
    cube_client *other = NULL;
    CONF_OK(cube_client_open(conf.backend, NULL, &other));
    cube_handle theirs = {0};
    CONF_OK(cube_empty(other, 64, &theirs));
    CONF_EXPECT_MSG(cube_handle_set_label(conf.client, theirs, "mine"),
                    CUBE_ERR_NOT_FOUND, "another client");
    CONF_OK(cube_handle_release(other, theirs));
    cube_client_close(other);
    cube_handle again = conf_empty(64);
    CONF_OK(cube_handle_label(conf.client, again, got, sizeof got));
    assert_string_equal(got, ""); /* a recycled record starts unlabelled */
    conf_release(again);
}

CONF_TEST(buffer_slice_write_changes_only_its_range)
{
    enum { N = 256, OFF = 64, LEN = 33 };
    unsigned char base[N], got[N], patch[LEN];
    conf_pattern(base, N, 7);
    memset(patch, 0xAA, LEN);
    cube_handle h = conf_create(base, N);
    cube_handle s = conf_slice(h, OFF, LEN);
    CONF_WRITE_OK(s, patch, LEN);
    CONF_READ_OK(h, got, N);
    memcpy(base + OFF, patch, LEN);
    assert_memory_equal(got, base, N);
    /* A partial write through the slice: only its own first bytes. */
    unsigned char two[2] = {0x11, 0x22};
    cube_copy_desc d = cube_copy_desc_contiguous(s, 2, 1);
    const void *src[1] = {two};
    uint64_t sz[1] = {2};
    CONF_OK(cube_write(conf.client, &d, src, sz, 1));
    CONF_READ_OK(h, got, N);
    memcpy(base + OFF, two, 2);
    assert_memory_equal(got, base, N);
    conf_release(s);
    conf_release(h);
}

CONF_TEST(buffer_slice_read_returns_its_range)
{
    enum { N = 1000 };
    unsigned char base[N];
    conf_pattern(base, N, 8);
    cube_handle h = conf_create(base, N);
    static const uint64_t ranges[][2] = {
        {0, 1}, {0, N}, {999, 1}, {3, 500}, {511, 489}};
    for (size_t i = 0; i < sizeof ranges / sizeof ranges[0]; i++) {
        uint64_t off = ranges[i][0], len = ranges[i][1];
        cube_handle s = conf_slice(h, off, len);
        unsigned char got[N];
        memset(got, 0, sizeof got);
        CONF_READ_OK(s, got, len);
        assert_memory_equal(got, base + off, len);
        /* A descriptor larger than the slice is refused even though the
         * buffer has the bytes. */
        if (off + len < N) {
            cube_copy_desc d = cube_copy_desc_contiguous(s, len + 1, 1);
            void *dst[1] = {got};
            uint64_t sz[1] = {len + 1};
            CONF_EXPECT(cube_read(conf.client, &d, dst, sz, 1),
                        CUBE_ERR_INVALID_ARGUMENT);
        }
        conf_release(s);
    }
    conf_release(h);
}

CONF_TEST(buffer_slice_of_slice_composes_offsets)
{
    enum { N = 512 };
    unsigned char base[N], got[64];
    conf_pattern(base, N, 9);
    cube_handle h = conf_create(base, N);
    cube_handle s1 = conf_slice(h, 100, 300);
    cube_handle s2 = conf_slice(s1, 50, 64); /* bytes [150, 214) */
    CONF_READ_OK(s2, got, 64);
    assert_memory_equal(got, base + 150, 64);
    /* A slice of a slice may not reach past the outer slice. */
    cube_handle bad = {0};
    CONF_EXPECT(cube_handle_slice(conf.client, s1, 250, 51, &bad),
                CUBE_ERR_INVALID_ARGUMENT);
    assert_true(bad.bits == 0);
    conf_release(s2);
    conf_release(s1);
    conf_release(h);
}

CONF_TEST(buffer_slice_out_of_range_is_invalid_argument)
{
    cube_handle h = conf_empty(128);
    static const uint64_t bad[][2] = {
        {0, 0},   {0, 129},        {128, 1},        {127, 2},
        {129, 0}, {UINT64_MAX, 1}, {1, UINT64_MAX}, {64, UINT64_MAX - 63}};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        cube_handle s = {0xDEAD};
        CONF_EXPECT(cube_handle_slice(conf.client, h, bad[i][0], bad[i][1], &s),
                    CUBE_ERR_INVALID_ARGUMENT);
        assert_true(s.bits == 0);
    }
    conf_release(h);
}

CONF_TEST(buffer_slice_keeps_buffer_alive_after_parent_release)
{
    unsigned char base[200], got[50];
    conf_pattern(base, sizeof base, 10);
    cube_handle h = conf_create(base, sizeof base);
    cube_handle s = conf_slice(h, 120, 50);
    conf_release(h);
    CONF_EXPECT(conf_read(h, got, 50), CUBE_ERR_NOT_FOUND);
    CONF_READ_OK(s, got, 50);
    assert_memory_equal(got, base + 120, 50);
    conf_release(s);
}

CONF_TEST(buffer_retained_twice_needs_three_releases)
{
    unsigned char in[64], out[64];
    conf_pattern(in, sizeof in, 11);
    cube_handle h = conf_create(in, sizeof in);
    CONF_OK(cube_handle_retain(conf.client, h));
    CONF_OK(cube_handle_retain(conf.client, h));
    conf_release(h);
    CONF_READ_OK(h, out, sizeof out);
    conf_release(h);
    CONF_READ_OK(h, out, sizeof out);
    assert_memory_equal(in, out, sizeof in);
    conf_release(h);
    CONF_EXPECT(cube_handle_release(conf.client, h), CUBE_ERR_NOT_FOUND);
    CONF_EXPECT(cube_handle_retain(conf.client, h), CUBE_ERR_NOT_FOUND);
}

/* Every call that takes a handle refuses `h` with NOT_FOUND. */
static void expect_not_found_everywhere(cube_handle h)
{
    cube_client *c = conf.client;
    unsigned char buf[16];
    memset(buf, 0x77, sizeof buf);
    CONF_EXPECT(conf_read(h, buf, sizeof buf), CUBE_ERR_NOT_FOUND);
    for (size_t i = 0; i < sizeof buf; i++)
        assert_int_equal(buf[i], 0x77);
    CONF_EXPECT(conf_write(h, buf, sizeof buf), CUBE_ERR_NOT_FOUND);
    cube_future *f = (cube_future *)buf;
    cube_copy_desc d = cube_copy_desc_contiguous(h, sizeof buf, 1);
    void *dst[1] = {buf};
    uint64_t sz[1] = {sizeof buf};
    CONF_EXPECT(cube_read_async(c, &d, dst, sz, 1, &f), CUBE_ERR_NOT_FOUND);
    assert_null(f);
    CONF_EXPECT(cube_handle_retain(c, h), CUBE_ERR_NOT_FOUND);
    CONF_EXPECT(cube_handle_release(c, h), CUBE_ERR_NOT_FOUND);
    cube_handle s = {0xDEAD};
    CONF_EXPECT(cube_handle_slice(c, h, 0, 1, &s), CUBE_ERR_NOT_FOUND);
    assert_true(s.bits == 0);
    uint64_t size = 12345;
    CONF_EXPECT(cube_handle_size(c, h, &size), CUBE_ERR_NOT_FOUND);
    CONF_EXPECT(cube_check(c, &h, 1), CUBE_ERR_NOT_FOUND);
    CONF_EXPECT(cube_sync(c, &h, 1), CUBE_ERR_NOT_FOUND);
    /* As a launch argument and as a dynamic count: refused, and nothing
     * recorded on the other (valid) argument. */
    float ones[64];
    for (int i = 0; i < 64; i++)
        ones[i] = 1.0f;
    cube_handle y = conf_create(ones, sizeof ones);
    cube_arg args[3] = {cube_arg_buffer(h), cube_arg_buffer(y),
                        cube_arg_f32(2.0f)};
    CONF_EXPECT(conf_launch(conf.k.scale, cube_count_static(1, 1, 1), args, 3,
                            CUBE_LAUNCH_EXECUTE),
                CUBE_ERR_NOT_FOUND);
    args[0] = cube_arg_buffer(y);
    args[1] = cube_arg_buffer(h);
    CONF_EXPECT(conf_launch(conf.k.scale, cube_count_static(1, 1, 1), args, 3,
                            CUBE_LAUNCH_EXECUTE),
                CUBE_ERR_NOT_FOUND);
    cube_arg one = cube_arg_buffer(y);
    /* (A zero handle as the count means a static count of zero.) */
    CONF_EXPECT(conf_launch(conf.k.count_probe, cube_count_dynamic(h), &one, 1,
                            CUBE_LAUNCH_EXECUTE),
                h.bits ? CUBE_ERR_NOT_FOUND : CUBE_ERR_INVALID_ARGUMENT);
    float got[64];
    CONF_READ_OK(y, got, sizeof got);
    assert_memory_equal(got, ones, sizeof ones);
    conf_release(y);
}

CONF_TEST(buffer_released_handle_is_not_found_everywhere)
{
    cube_handle h = conf_empty(64);
    cube_handle s = conf_slice(h, 0, 16);
    conf_release(s);
    conf_release(h);
    expect_not_found_everywhere(h);
    expect_not_found_everywhere(s);
    /* A new buffer, which may reuse the slot, does not revive the old
     * handle. */
    cube_handle fresh = conf_empty(64);
    assert_true(fresh.bits != h.bits);
    expect_not_found_everywhere(h);
    conf_release(fresh);
}

CONF_TEST(buffer_handle_of_another_client_is_not_found)
{
    cube_client *other = NULL;
    CONF_OK(cube_client_open(conf.backend, NULL, &other));
    unsigned char in[16], out[16];
    conf_pattern(in, sizeof in, 12);
    cube_handle foreign;
    CONF_OK(cube_create(other, in, sizeof in, &foreign));
    expect_not_found_everywhere(foreign);
    /* ... and ours on the other client. */
    cube_handle mine = conf_create(in, sizeof in);
    CONF_EXPECT(cube_handle_release(other, mine), CUBE_ERR_NOT_FOUND);
    CONF_EXPECT(cube_handle_retain(other, mine), CUBE_ERR_NOT_FOUND);
    cube_copy_desc d = cube_copy_desc_contiguous(mine, sizeof out, 1);
    void *dst[1] = {out};
    uint64_t sz[1] = {sizeof out};
    CONF_EXPECT(cube_read(other, &d, dst, sz, 1), CUBE_ERR_NOT_FOUND);
    /* Both still fine on their own clients. */
    CONF_READ_OK(mine, out, sizeof out);
    assert_memory_equal(in, out, sizeof in);
    d = cube_copy_desc_contiguous(foreign, sizeof out, 1);
    CONF_OK(cube_read(other, &d, dst, sz, 1));
    assert_memory_equal(in, out, sizeof in);
    conf_release(mine);
    CONF_OK(cube_handle_release(other, foreign));
    cube_client_close(other);
}

/* Whether `c` refuses handle `h` of another client with NOT_FOUND on every
 * entry point that takes one; prints what it accepted. */
static int refuses_foreign(cube_client *c, cube_handle h, const char *whose,
                           int round)
{
    unsigned char out[16];
    memset(out, 0, sizeof out);
    cube_copy_desc d = cube_copy_desc_contiguous(h, sizeof out, 1);
    void *dst[1] = {out};
    uint64_t sz[1] = {sizeof out};
    uint64_t size = 0;
    cube_handle slice = {0};
    cube_error *errs[] = {cube_handle_retain(c, h),
                          cube_handle_size(c, h, &size),
                          cube_handle_slice(c, h, 0, 1, &slice),
                          cube_read(c, &d, dst, sz, 1),
                          cube_write(c, &d, (const void *const *)dst, sz, 1),
                          cube_check(c, &h, 1),
                          cube_handle_release(c, h)};
    static const char *const what[] = {"retain", "size",  "slice",  "read",
                                       "write",  "check", "release"};
    int ok = 1;
    for (size_t i = 0; i < sizeof errs / sizeof errs[0]; i++) {
        if (cube_error_code(errs[i]) != CUBE_ERR_NOT_FOUND) {
            print_error("client %d opened after the %s one accepted its "
                        "handle 0x%016llx in %s (%s)\n",
                        round, whose, (unsigned long long)h.bits, what[i],
                        errs[i] ? cube_error_message(errs[i]) : "success");
            ok = 0;
        }
        cube_error_free(errs[i]);
    }
    return ok;
}

/* Far more clients than a handle has bits to tell apart by a counter:
 * a handle of an open client and one of a closed client are refused by
 * every client opened after them, and neither the refusals nor the
 * other clients touch any buffer. */
CONF_TEST(buffer_handle_stays_foreign_to_thousands_of_later_clients)
{
    enum { LATER = 4200, BYTES = 16 };
    /* Every client shares the device the suite holds open: opening one
     * is cheap. */
    cube_client_options o = cube_client_options_default();
    unsigned char first_in[BYTES], in[BYTES], out[BYTES];
    conf_pattern(first_in, sizeof first_in, 4242);

    cube_client *first = NULL, *gone = NULL;
    CONF_OK(cube_client_open(conf.backend, &o, &first));
    cube_handle kept, closed;
    CONF_OK(cube_create(first, first_in, BYTES, &kept));
    CONF_OK(cube_client_open(conf.backend, &o, &gone));
    CONF_OK(cube_create(gone, first_in, BYTES, &closed));
    cube_client_close(gone);

    int ok = 1;
    for (int round = 0; round < LATER && ok; round++) {
        cube_client *c = NULL;
        CONF_OK(cube_client_open(conf.backend, &o, &c));
        /* The client's own first buffers: the slots a handle of the first
         * client names. */
        cube_handle own[2];
        conf_pattern(in, sizeof in, (uint32_t)round);
        CONF_OK(cube_create(c, in, BYTES, &own[0]));
        CONF_OK(cube_create(c, in, BYTES, &own[1]));
        ok = refuses_foreign(c, kept, "kept", round) &&
             refuses_foreign(c, closed, "closed", round);
        for (int k = 0; k < 2; k++) {
            cube_copy_desc d = cube_copy_desc_contiguous(own[k], BYTES, 1);
            void *dst[1] = {out};
            uint64_t sz[1] = {BYTES};
            memset(out, 0, sizeof out);
            CONF_OK(cube_read(c, &d, dst, sz, 1));
            if (memcmp(in, out, BYTES) != 0) {
                print_error("client %d: its own buffer changed\n", round);
                ok = 0;
            }
            CONF_OK(cube_handle_release(c, own[k]));
        }
        cube_client_close(c);
    }
    assert_true(ok);

    cube_copy_desc d = cube_copy_desc_contiguous(kept, BYTES, 1);
    void *dst[1] = {out};
    uint64_t sz[1] = {BYTES};
    CONF_OK(cube_read(first, &d, dst, sz, 1));
    assert_memory_equal(first_in, out, BYTES);
    CONF_OK(cube_handle_release(first, kept));
    cube_client_close(first);
}

CONF_TEST(buffer_zero_handle_is_not_found)
{
    cube_handle zero = {0};
    expect_not_found_everywhere(zero);
    cube_handle junk = {0x0123456789ABCDEFull};
    expect_not_found_everywhere(junk);
}

CONF_TEST(buffer_size_zero_is_invalid_argument)
{
    cube_handle h = {0xDEAD};
    CONF_EXPECT_MSG(cube_empty(conf.client, 0, &h), CUBE_ERR_INVALID_ARGUMENT,
                    "size");
    assert_true(h.bits == 0);
    unsigned char byte = 1;
    h.bits = 0xDEAD;
    CONF_EXPECT(cube_create(conf.client, &byte, 0, &h),
                CUBE_ERR_INVALID_ARGUMENT);
    assert_true(h.bits == 0);
}

CONF_TEST(buffer_size_near_uint64_max_is_buffer_too_big)
{
    static const uint64_t sizes[] = {UINT64_MAX, UINT64_MAX - 1,
                                     UINT64_MAX - 4095, UINT64_MAX / 2 + 1,
                                     (uint64_t)1 << 62};
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        cube_handle h = {0xDEAD};
        cube_error *err = cube_empty(conf.client, sizes[i], &h);
        if (cube_error_code(err) != CUBE_ERR_BUFFER_TOO_BIG)
            print_error("size %llu\n", (unsigned long long)sizes[i]);
        CONF_EXPECT(err, CUBE_ERR_BUFFER_TOO_BIG);
        assert_true(h.bits == 0);
    }
    if (conf.props.max_buffer_size < UINT64_MAX) {
        cube_handle h = {0};
        CONF_EXPECT(cube_empty(conf.client, conf.props.max_buffer_size + 1, &h),
                    CUBE_ERR_BUFFER_TOO_BIG);
    }
    /* A huge cube_create is refused before the source is touched. */
    unsigned char byte = 0;
    cube_handle h = {0};
    CONF_EXPECT(cube_create(conf.client, &byte, UINT64_MAX, &h),
                CUBE_ERR_BUFFER_TOO_BIG);
}

/* Every entry point with a NULL pointer: INVALID_ARGUMENT, and the message
 * names the argument. */
CONF_TEST(api_null_pointers_are_invalid_argument_naming_the_argument)
{
    cube_client *c = conf.client;
    cube_handle h = conf_empty(16);
    unsigned char buf[16] = {0};
    cube_handle out;
    uint64_t size;
    cube_properties props;
    cube_memory_usage usage;
    size_t count;
    int misses = 0; /* messages that do not name their argument */

    /* clients */
    CONF_EXPECT_NAMED(cube_client_properties(NULL, &props),
                      CUBE_ERR_INVALID_ARGUMENT, "client", &misses);
    CONF_EXPECT_NAMED(cube_client_properties(c, NULL),
                      CUBE_ERR_INVALID_ARGUMENT, "out", &misses);
    CONF_EXPECT_NAMED(cube_stream_use(NULL, 1), CUBE_ERR_INVALID_ARGUMENT,
                      "client", &misses);
    CONF_EXPECT_NAMED(cube_stream_ids(NULL, NULL, 0, &count),
                      CUBE_ERR_INVALID_ARGUMENT, "client", &misses);
    CONF_EXPECT_NAMED(cube_stream_ids(c, NULL, 0, NULL),
                      CUBE_ERR_INVALID_ARGUMENT, "count", &misses);
    CONF_EXPECT_NAMED(cube_stream_ids(c, NULL, 4, &count),
                      CUBE_ERR_INVALID_ARGUMENT, "ids", &misses);
    CONF_EXPECT_NAMED(cube_check(NULL, &h, 1), CUBE_ERR_INVALID_ARGUMENT,
                      "client", &misses);
    CONF_EXPECT_NAMED(cube_check(c, NULL, 1), CUBE_ERR_INVALID_ARGUMENT,
                      "handles", &misses);
    CONF_EXPECT_NAMED(cube_sync(NULL, NULL, 0), CUBE_ERR_INVALID_ARGUMENT,
                      "client", &misses);
    CONF_EXPECT_NAMED(cube_sync(c, NULL, 1), CUBE_ERR_INVALID_ARGUMENT,
                      "handles", &misses);
    CONF_EXPECT_NAMED(cube_flush(NULL), CUBE_ERR_INVALID_ARGUMENT, "client",
                      &misses);
    CONF_EXPECT_NAMED(cube_memory_usage_get(NULL, &usage),
                      CUBE_ERR_INVALID_ARGUMENT, "client", &misses);
    CONF_EXPECT_NAMED(cube_memory_usage_get(c, NULL), CUBE_ERR_INVALID_ARGUMENT,
                      "out", &misses);
    CONF_EXPECT_NAMED(cube_memory_cleanup(NULL), CUBE_ERR_INVALID_ARGUMENT,
                      "client", &misses);

    /* handles */
    CONF_EXPECT_NAMED(cube_empty(NULL, 16, &out), CUBE_ERR_INVALID_ARGUMENT,
                      "client", &misses);
    CONF_EXPECT_NAMED(cube_empty(c, 16, NULL), CUBE_ERR_INVALID_ARGUMENT, "out",
                      &misses);
    CONF_EXPECT_NAMED(cube_create(NULL, buf, 16, &out),
                      CUBE_ERR_INVALID_ARGUMENT, "client", &misses);
    CONF_EXPECT_NAMED(cube_create(c, NULL, 16, &out), CUBE_ERR_INVALID_ARGUMENT,
                      "bytes", &misses);
    CONF_EXPECT_NAMED(cube_create(c, buf, 16, NULL), CUBE_ERR_INVALID_ARGUMENT,
                      "out", &misses);
    CONF_EXPECT_NAMED(cube_handle_retain(NULL, h), CUBE_ERR_INVALID_ARGUMENT,
                      "client", &misses);
    CONF_EXPECT_NAMED(cube_handle_release(NULL, h), CUBE_ERR_INVALID_ARGUMENT,
                      "client", &misses);
    CONF_EXPECT_NAMED(cube_handle_slice(NULL, h, 0, 1, &out),
                      CUBE_ERR_INVALID_ARGUMENT, "client", &misses);
    CONF_EXPECT_NAMED(cube_handle_slice(c, h, 0, 1, NULL),
                      CUBE_ERR_INVALID_ARGUMENT, "out", &misses);
    CONF_EXPECT_NAMED(cube_handle_size(NULL, h, &size),
                      CUBE_ERR_INVALID_ARGUMENT, "client", &misses);
    CONF_EXPECT_NAMED(cube_handle_size(c, h, NULL), CUBE_ERR_INVALID_ARGUMENT,
                      "out", &misses);

    /* writes and reads */
    cube_copy_desc d = cube_copy_desc_contiguous(h, sizeof buf, 1);
    const void *src[1] = {buf};
    void *dst[1] = {buf};
    const void *null_src[1] = {NULL};
    void *null_dst[1] = {NULL};
    uint64_t sz[1] = {sizeof buf};
    CONF_EXPECT_NAMED(cube_write(NULL, &d, src, sz, 1),
                      CUBE_ERR_INVALID_ARGUMENT, "client", &misses);
    CONF_EXPECT_NAMED(cube_write(c, NULL, src, sz, 1),
                      CUBE_ERR_INVALID_ARGUMENT, "descs", &misses);
    CONF_EXPECT_NAMED(cube_write(c, &d, NULL, sz, 1), CUBE_ERR_INVALID_ARGUMENT,
                      "sources", &misses);
    CONF_EXPECT_NAMED(cube_write(c, &d, src, NULL, 1),
                      CUBE_ERR_INVALID_ARGUMENT, "source_sizes", &misses);
    CONF_EXPECT(cube_write(c, &d, null_src, sz, 1), CUBE_ERR_INVALID_ARGUMENT);
    CONF_EXPECT(cube_write(c, &d, src, sz, 0), CUBE_ERR_INVALID_ARGUMENT);
    CONF_EXPECT_NAMED(cube_read(NULL, &d, dst, sz, 1),
                      CUBE_ERR_INVALID_ARGUMENT, "client", &misses);
    CONF_EXPECT_NAMED(cube_read(c, NULL, dst, sz, 1), CUBE_ERR_INVALID_ARGUMENT,
                      "descs", &misses);
    CONF_EXPECT_NAMED(cube_read(c, &d, NULL, sz, 1), CUBE_ERR_INVALID_ARGUMENT,
                      "destinations", &misses);
    CONF_EXPECT_NAMED(cube_read(c, &d, dst, NULL, 1), CUBE_ERR_INVALID_ARGUMENT,
                      "destination_sizes", &misses);
    CONF_EXPECT(cube_read(c, &d, null_dst, sz, 1), CUBE_ERR_INVALID_ARGUMENT);
    CONF_EXPECT(cube_read(c, &d, dst, sz, 0), CUBE_ERR_INVALID_ARGUMENT);
    cube_future *f = (cube_future *)buf;
    CONF_EXPECT_NAMED(cube_read_async(c, &d, dst, sz, 1, NULL),
                      CUBE_ERR_INVALID_ARGUMENT, "out", &misses);
    CONF_EXPECT_NAMED(cube_read_async(NULL, &d, dst, sz, 1, &f),
                      CUBE_ERR_INVALID_ARGUMENT, "client", &misses);
    assert_null(f);
    CONF_EXPECT_NAMED(cube_future_wait(NULL), CUBE_ERR_INVALID_ARGUMENT,
                      "future", &misses);
    assert_int_equal(cube_future_ready(NULL), 0);
    cube_future_free(NULL);

    /* staging */
    void *stage[1] = {NULL};
    uint64_t stage_size[1] = {64};
    CONF_EXPECT_NAMED(cube_staging(NULL, stage_size, 1, stage),
                      CUBE_ERR_INVALID_ARGUMENT, "client", &misses);
    CONF_EXPECT_NAMED(cube_staging(c, NULL, 1, stage),
                      CUBE_ERR_INVALID_ARGUMENT, "sizes", &misses);
    CONF_EXPECT_NAMED(cube_staging(c, stage_size, 1, NULL),
                      CUBE_ERR_INVALID_ARGUMENT, "out", &misses);
    CONF_EXPECT_NAMED(cube_staging_free(NULL, buf), CUBE_ERR_INVALID_ARGUMENT,
                      "client", &misses);

    /* kernels and launches */
    cube_kernel *k = (cube_kernel *)buf;
    cube_kernel_desc kd = {"ok_name", "int x;", {1, 1, 1}};
    CONF_EXPECT_NAMED(cube_kernel_create(NULL, &k), CUBE_ERR_INVALID_ARGUMENT,
                      "desc", &misses);
    assert_null(k);
    CONF_EXPECT_NAMED(cube_kernel_create(&kd, NULL), CUBE_ERR_INVALID_ARGUMENT,
                      "out", &misses);
    kd.name = NULL;
    CONF_EXPECT_NAMED(cube_kernel_create(&kd, &k), CUBE_ERR_INVALID_ARGUMENT,
                      "name", &misses);
    kd.name = "ok_name";
    kd.source = NULL;
    CONF_EXPECT_NAMED(cube_kernel_create(&kd, &k), CUBE_ERR_INVALID_ARGUMENT,
                      "source", &misses);
    cube_raw_param rparam = {CUBE_RAW_BUFFER_OUT, 4};
    cube_raw_kernel_desc rd;
    memset(&rd, 0, sizeof rd);
    rd.name = "ok_name";
    rd.format = CUBE_KERNEL_C_SOURCE;
    rd.source = "int x;";
    rd.params = &rparam;
    rd.nparams = 1;
    k = (cube_kernel *)buf;
    CONF_EXPECT_NAMED(cube_kernel_create_raw(NULL, &k),
                      CUBE_ERR_INVALID_ARGUMENT, "desc", &misses);
    assert_null(k);
    CONF_EXPECT_NAMED(cube_kernel_create_raw(&rd, NULL),
                      CUBE_ERR_INVALID_ARGUMENT, "out", &misses);
    rd.name = NULL;
    CONF_EXPECT_NAMED(cube_kernel_create_raw(&rd, &k),
                      CUBE_ERR_INVALID_ARGUMENT, "name", &misses);
    rd.name = "ok_name";
    rd.source = NULL;
    CONF_EXPECT_NAMED(cube_kernel_create_raw(&rd, &k),
                      CUBE_ERR_INVALID_ARGUMENT, "source", &misses);
    rd.source = "int x;";
    rd.params = NULL;
    CONF_EXPECT_NAMED(cube_kernel_create_raw(&rd, &k),
                      CUBE_ERR_INVALID_ARGUMENT, "params", &misses);
    cube_arg a = cube_arg_buffer(h);
    CONF_EXPECT_NAMED(cube_launch(NULL, conf.k.count_probe,
                                  cube_count_static(1, 1, 1), &a, 1, 0),
                      CUBE_ERR_INVALID_ARGUMENT, "client", &misses);
    CONF_EXPECT_NAMED(
        cube_launch(c, NULL, cube_count_static(1, 1, 1), &a, 1, 0),
        CUBE_ERR_INVALID_ARGUMENT, "kernel", &misses);
    CONF_EXPECT_NAMED(cube_launch(c, conf.k.count_probe,
                                  cube_count_static(1, 1, 1), NULL, 1, 0),
                      CUBE_ERR_INVALID_ARGUMENT, "args", &misses);
    /* None of this touched h. */
    CONF_OK(cube_check(c, &h, 1));
    conf_release(h);
    if (misses)
        fail_msg("%d INVALID_ARGUMENT messages do not name their argument",
                 misses);
}

CONF_TEST(buffer_whole_read_and_write_check_their_arguments)
{
    unsigned char in[300], out[300];
    conf_pattern(in, sizeof in, 77);
    cube_handle h = conf_empty(sizeof in);
    CONF_OK(cube_write_all(conf.client, h, in, sizeof in));
    memset(out, 0, sizeof out);
    CONF_OK(cube_read_all(conf.client, h, out, sizeof out));
    assert_memory_equal(in, out, sizeof in);
    /* A slice is its range. */
    cube_handle s;
    CONF_OK(cube_handle_slice(conf.client, h, 100, 50, &s));
    CONF_OK(cube_read_all(conf.client, s, out, 50));
    assert_memory_equal(in + 100, out, 50);
    /* Sizes other than the range's, NULLs, released handles: refused,
     * nothing written. */
    CONF_EXPECT_MSG(cube_write_all(conf.client, h, in, 299),
                    CUBE_ERR_INVALID_ARGUMENT, "holds 300");
    CONF_EXPECT_MSG(cube_read_all(conf.client, h, out, 301),
                    CUBE_ERR_INVALID_ARGUMENT, "holds 300");
    CONF_EXPECT(cube_write_all(NULL, h, in, sizeof in),
                CUBE_ERR_INVALID_ARGUMENT);
    CONF_EXPECT(cube_read_all(conf.client, h, NULL, sizeof out),
                CUBE_ERR_INVALID_ARGUMENT);
    CONF_EXPECT(cube_write_all(conf.client, h, NULL, sizeof in),
                CUBE_ERR_INVALID_ARGUMENT);
    cube_handle gone = conf_empty(16);
    conf_release(gone);
    CONF_EXPECT(cube_read_all(conf.client, gone, out, 16), CUBE_ERR_NOT_FOUND);
    cube_handle zero = {0};
    CONF_EXPECT(cube_write_all(conf.client, zero, in, 16), CUBE_ERR_NOT_FOUND);
    memset(out, 0, sizeof out);
    CONF_OK(cube_read_all(conf.client, h, out, sizeof out));
    assert_memory_equal(in, out, sizeof in);
    conf_release(s);
    conf_release(h);
}
