/* Copy descriptors (strided reads and writes), asynchronous reads and
 * staging buffers. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "conformance.h"

/* A row-major M x N matrix of uint32 r * 1000 + c. */
enum { M = 13, N = 17 };

static void matrix(uint32_t m[M][N])
{
    for (uint32_t r = 0; r < M; r++)
        for (uint32_t c = 0; c < N; c++)
            m[r][c] = r * 1000u + c;
}

/* The reference for a descriptor: gathers the elements a (rank, shape,
 * strides in elements, elem size) view of `base` names, in shape order,
 * into `out`, or scatters `out` into `base` when `scatter`. */
static void ref_copy(unsigned char *base, uint32_t rank, const uint64_t *shape,
                     const uint64_t *strides, uint32_t es, unsigned char *out,
                     int scatter)
{
    uint64_t idx[CUBE_MAX_RANK] = {0};
    for (;;) {
        uint64_t off = 0;
        for (uint32_t k = 0; k < rank; k++)
            off += idx[k] * strides[k];
        if (scatter)
            memcpy(base + off * es, out, es);
        else
            memcpy(out, base + off * es, es);
        out += es;
        int k = (int)rank - 1;
        while (k >= 0 && ++idx[k] == shape[k])
            idx[k--] = 0;
        if (k < 0)
            return;
    }
}

static cube_copy_desc desc(cube_handle h, uint32_t rank, const uint64_t *shape,
                           const uint64_t *strides, uint32_t es)
{
    cube_copy_desc d;
    memset(&d, 0, sizeof d);
    d.handle = h;
    d.rank = rank;
    for (uint32_t k = 0; k < rank && k < CUBE_MAX_RANK; k++) {
        d.shape[k] = shape[k];
        d.strides[k] = strides ? strides[k] : 0;
    }
    d.elem_size = es;
    return d;
}

static cube_error *read1(const cube_copy_desc *d, void *dst, uint64_t size)
{
    void *dsts[1] = {dst};
    uint64_t sizes[1] = {size};
    return cube_read(conf.client, d, dsts, sizes, 1);
}

static cube_error *write1(const cube_copy_desc *d, const void *src,
                          uint64_t size)
{
    const void *srcs[1] = {src};
    uint64_t sizes[1] = {size};
    return cube_write(conf.client, d, srcs, sizes, 1);
}

CONF_TEST(copy_rank2_column_read_matches_reference)
{
    uint32_t m[M][N];
    matrix(m);
    cube_handle h = conf_create(m, sizeof m);
    for (uint32_t j = 0; j < N; j += 4) {
        cube_handle col = conf_slice(h, j * 4u, sizeof m - j * 4u);
        /* Rank 1, stride N. */
        uint64_t shape1[1] = {M}, stride1[1] = {N};
        uint32_t got[M], want[M];
        for (uint32_t r = 0; r < M; r++)
            want[r] = m[r][j];
        memset(got, 0, sizeof got);
        cube_copy_desc d = desc(col, 1, shape1, stride1, 4);
        CONF_OK(read1(&d, got, sizeof got));
        assert_memory_equal(got, want, sizeof want);
        /* Rank 2: M rows of one element. */
        uint64_t shape2[2] = {M, 1}, stride2[2] = {N, 1};
        memset(got, 0, sizeof got);
        d = desc(col, 2, shape2, stride2, 4);
        CONF_OK(read1(&d, got, sizeof got));
        assert_memory_equal(got, want, sizeof want);
        conf_release(col);
    }
    conf_release(h);
}

CONF_TEST(copy_rank2_column_write_changes_only_the_column)
{
    uint32_t m[M][N], got[M][N], col_vals[M];
    matrix(m);
    cube_handle h = conf_create(m, sizeof m);
    const uint32_t j = 6;
    cube_handle col = conf_slice(h, j * 4u, sizeof m - j * 4u);
    for (uint32_t r = 0; r < M; r++) {
        col_vals[r] = 0xC0000000u + r;
        m[r][j] = col_vals[r];
    }
    uint64_t shape[2] = {M, 1}, strides[2] = {N, 1};
    cube_copy_desc d = desc(col, 2, shape, strides, 4);
    CONF_OK(write1(&d, col_vals, sizeof col_vals));
    CONF_READ_OK(h, got, sizeof got);
    assert_memory_equal(got, m, sizeof m);
    conf_release(col);
    conf_release(h);
}

CONF_TEST(copy_rank2_subblock_read_matches_reference)
{
    uint32_t m[M][N];
    matrix(m);
    cube_handle h = conf_create(m, sizeof m);
    static const uint32_t blocks[][4] = {{0, 0, M, N},
                                         {3, 4, 5, 6},
                                         {M - 1, N - 1, 1, 1},
                                         {2, 0, 7, N},
                                         {0, 9, M, 8}};
    for (size_t b = 0; b < sizeof blocks / sizeof blocks[0]; b++) {
        uint32_t r0 = blocks[b][0], c0 = blocks[b][1];
        uint32_t bh = blocks[b][2], bw = blocks[b][3];
        uint64_t off = ((uint64_t)r0 * N + c0) * 4;
        cube_handle s = conf_slice(h, off, sizeof m - off);
        uint64_t shape[2] = {bh, bw}, strides[2] = {N, 1};
        uint32_t *got = calloc((size_t)bh * bw, 4);
        uint32_t *want = calloc((size_t)bh * bw, 4);
        assert_non_null(got);
        assert_non_null(want);
        for (uint32_t r = 0; r < bh; r++)
            for (uint32_t c = 0; c < bw; c++)
                want[r * bw + c] = m[r0 + r][c0 + c];
        cube_copy_desc d = desc(s, 2, shape, strides, 4);
        CONF_OK(read1(&d, got, (uint64_t)bh * bw * 4));
        assert_memory_equal(got, want, (size_t)bh * bw * 4);
        free(got);
        free(want);
        conf_release(s);
    }
    conf_release(h);
}

CONF_TEST(copy_rank2_subblock_write_changes_only_the_block)
{
    uint32_t m[M][N], got[M][N];
    matrix(m);
    cube_handle h = conf_create(m, sizeof m);
    const uint32_t r0 = 4, c0 = 3, bh = 6, bw = 9;
    uint32_t block[6][9];
    for (uint32_t r = 0; r < bh; r++)
        for (uint32_t c = 0; c < bw; c++) {
            block[r][c] = 0xB0000000u + r * 16 + c;
            m[r0 + r][c0 + c] = block[r][c];
        }
    uint64_t off = ((uint64_t)r0 * N + c0) * 4;
    cube_handle s = conf_slice(h, off, sizeof m - off);
    uint64_t shape[2] = {bh, bw}, strides[2] = {N, 1};
    cube_copy_desc d = desc(s, 2, shape, strides, 4);
    CONF_OK(write1(&d, block, sizeof block));
    CONF_READ_OK(h, got, sizeof got);
    assert_memory_equal(got, m, sizeof m);
    conf_release(s);
    conf_release(h);
}

CONF_TEST(copy_transposing_strides_read_matches_reference)
{
    uint32_t m[M][N], got[N][M], want[N][M];
    matrix(m);
    for (uint32_t r = 0; r < M; r++)
        for (uint32_t c = 0; c < N; c++)
            want[c][r] = m[r][c];
    cube_handle h = conf_create(m, sizeof m);
    uint64_t shape[2] = {N, M}, strides[2] = {1, N};
    cube_copy_desc d = desc(h, 2, shape, strides, 4);
    memset(got, 0, sizeof got);
    CONF_OK(read1(&d, got, sizeof got));
    assert_memory_equal(got, want, sizeof want);
    /* And back: writing the transpose through the same view restores m. */
    uint32_t zero[M][N], back[M][N];
    memset(zero, 0, sizeof zero);
    CONF_WRITE_OK(h, zero, sizeof zero);
    CONF_OK(write1(&d, want, sizeof want));
    CONF_READ_OK(h, back, sizeof back);
    assert_memory_equal(back, m, sizeof m);
    conf_release(h);
}

CONF_TEST(copy_zero_strides_mean_contiguous_row_major)
{
    uint32_t m[M][N], got[M][N];
    matrix(m);
    cube_handle h = conf_create(m, sizeof m);
    uint64_t shape2[2] = {M, N};
    cube_copy_desc d = desc(h, 2, shape2, NULL, 4);
    memset(got, 0, sizeof got);
    CONF_OK(read1(&d, got, sizeof got));
    assert_memory_equal(got, m, sizeof m);
    uint64_t shape3[3] = {M, N, 4};
    d = desc(h, 3, shape3, NULL, 1);
    memset(got, 0, sizeof got);
    CONF_OK(read1(&d, got, sizeof got));
    assert_memory_equal(got, m, sizeof m);
    /* The helper: rank 1 over the bytes. */
    d = cube_copy_desc_contiguous(h, sizeof m, 4);
    assert_int_equal(d.rank, 1);
    assert_int_equal(d.shape[0], M * N);
    assert_int_equal(d.elem_size, 4);
    memset(got, 0, sizeof got);
    CONF_OK(read1(&d, got, sizeof got));
    assert_memory_equal(got, m, sizeof m);
    conf_release(h);
}

CONF_TEST(copy_rank8_and_wide_elements_round_trip)
{
    /* Rank 8: every other byte of a 512-byte buffer. */
    unsigned char base[512], got[256], want[256];
    conf_pattern(base, sizeof base, 21);
    cube_handle h = conf_create(base, sizeof base);
    uint64_t shape[8], strides[8];
    for (int k = 0; k < 8; k++) {
        shape[k] = 2;
        strides[k] = (uint64_t)1 << (8 - k); /* 256, 128, ..., 2 */
    }
    cube_copy_desc d = desc(h, 8, shape, strides, 1);
    ref_copy(base, 8, shape, strides, 1, want, 0);
    CONF_OK(read1(&d, got, sizeof got));
    assert_memory_equal(got, want, sizeof want);
    /* Write through it, check against the reference scatter. */
    unsigned char vals[256];
    conf_pattern(vals, sizeof vals, 22);
    CONF_OK(write1(&d, vals, sizeof vals));
    ref_copy(base, 8, shape, strides, 1, vals, 1);
    unsigned char all[512];
    CONF_READ_OK(h, all, sizeof all);
    assert_memory_equal(all, base, sizeof base);
    conf_release(h);

    /* Elements of 3, 16 and 64 bytes with strides. */
    static const uint32_t sizes[] = {3, 16, 64};
    for (size_t i = 0; i < 3; i++) {
        uint32_t es = sizes[i];
        enum { COUNT = 40 };
        unsigned char *buf = malloc((size_t)COUNT * es);
        unsigned char *g = malloc((size_t)COUNT * es);
        unsigned char *w = malloc((size_t)COUNT * es);
        assert_non_null(buf);
        assert_non_null(g);
        assert_non_null(w);
        conf_pattern(buf, (size_t)COUNT * es, 30 + (uint32_t)i);
        cube_handle b = conf_create(buf, (uint64_t)COUNT * es);
        uint64_t sh[2] = {5, 3}, st[2] = {8, 2}; /* 15 elements */
        cube_copy_desc e = desc(b, 2, sh, st, es);
        ref_copy(buf, 2, sh, st, es, w, 0);
        CONF_OK(read1(&e, g, 15ull * es));
        assert_memory_equal(g, w, 15ull * es);
        conf_release(b);
        free(buf);
        free(g);
        free(w);
    }
}

CONF_TEST(copy_batch_read_and_write_of_several_descriptors)
{
    unsigned char a[100], b[300], ra[100], rb_lo[150], rb_hi[150];
    conf_pattern(a, sizeof a, 40);
    conf_pattern(b, sizeof b, 41);
    cube_handle ha = conf_empty(sizeof a), hb = conf_empty(sizeof b);
    cube_handle lo = conf_slice(hb, 0, 150), hi = conf_slice(hb, 150, 150);
    cube_copy_desc d[3] = {cube_copy_desc_contiguous(ha, 100, 1),
                           cube_copy_desc_contiguous(lo, 150, 1),
                           cube_copy_desc_contiguous(hi, 150, 1)};
    const void *src[3] = {a, b, b + 150};
    uint64_t sz[3] = {100, 150, 150};
    CONF_OK(cube_write(conf.client, d, src, sz, 3));
    void *dst[3] = {ra, rb_lo, rb_hi};
    CONF_OK(cube_read(conf.client, d, dst, sz, 3));
    assert_memory_equal(ra, a, 100);
    assert_memory_equal(rb_lo, b, 150);
    assert_memory_equal(rb_hi, b + 150, 150);
    /* The same buffer named twice in one read. */
    cube_copy_desc twice[2] = {cube_copy_desc_contiguous(ha, 100, 1),
                               cube_copy_desc_contiguous(ha, 100, 1)};
    unsigned char r1[100], r2[100];
    void *dst2[2] = {r1, r2};
    uint64_t sz2[2] = {100, 100};
    CONF_OK(cube_read(conf.client, twice, dst2, sz2, 2));
    assert_memory_equal(r1, a, 100);
    assert_memory_equal(r2, a, 100);
    conf_release(lo);
    conf_release(hi);
    conf_release(ha);
    conf_release(hb);
}

CONF_TEST(copy_descriptor_past_end_is_invalid_and_changes_nothing)
{
    uint32_t m[M][N], got[M][N];
    matrix(m);
    cube_handle h = conf_create(m, sizeof m);
    uint32_t *junk = malloc(sizeof m * 2);
    assert_non_null(junk);
    memset(junk, 0xEE, sizeof m * 2);
    /* Rows one element too far apart: the last row runs past the end. */
    uint64_t shape[2] = {M, N}, strides[2] = {N + 1, 1};
    cube_copy_desc d = desc(h, 2, shape, strides, 4);
    CONF_EXPECT(write1(&d, junk, sizeof m), CUBE_ERR_INVALID_ARGUMENT);
    CONF_READ_OK(h, got, sizeof got);
    assert_memory_equal(got, m, sizeof m);
    /* One byte too many, contiguous. */
    cube_copy_desc c1 = cube_copy_desc_contiguous(h, sizeof m + 1, 1);
    CONF_EXPECT(write1(&c1, junk, sizeof m + 1), CUBE_ERR_INVALID_ARGUMENT);
    CONF_READ_OK(h, got, sizeof got);
    assert_memory_equal(got, m, sizeof m);
    /* Reads past the end leave the destination alone. */
    unsigned char *dst = malloc(sizeof m + 1);
    assert_non_null(dst);
    memset(dst, 0xCD, sizeof m + 1);
    CONF_EXPECT(read1(&d, dst, sizeof m), CUBE_ERR_INVALID_ARGUMENT);
    CONF_EXPECT(read1(&c1, dst, sizeof m + 1), CUBE_ERR_INVALID_ARGUMENT);
    for (size_t i = 0; i < sizeof m + 1; i++)
        assert_int_equal(dst[i], 0xCD);
    /* A stride that reaches far past the end. */
    uint64_t sh1[1] = {2}, st1[1] = {(uint64_t)1 << 40};
    cube_copy_desc far = desc(h, 1, sh1, st1, 4);
    CONF_EXPECT(write1(&far, junk, 8), CUBE_ERR_INVALID_ARGUMENT);
    CONF_READ_OK(h, got, sizeof got);
    assert_memory_equal(got, m, sizeof m);
    free(dst);
    free(junk);
    conf_release(h);
}

CONF_TEST(copy_host_size_mismatch_is_invalid_and_changes_nothing)
{
    uint32_t m[M][N], got[M][N];
    matrix(m);
    cube_handle h = conf_create(m, sizeof m);
    uint32_t junk[M][N + 1];
    memset(junk, 0xEE, sizeof junk);
    cube_copy_desc d = cube_copy_desc_contiguous(h, sizeof m, 4);
    CONF_EXPECT(write1(&d, junk, sizeof m - 1), CUBE_ERR_INVALID_ARGUMENT);
    CONF_EXPECT(write1(&d, junk, sizeof m + 4), CUBE_ERR_INVALID_ARGUMENT);
    CONF_EXPECT(write1(&d, junk, 0), CUBE_ERR_INVALID_ARGUMENT);
    CONF_READ_OK(h, got, sizeof got);
    assert_memory_equal(got, m, sizeof m);
    memset(junk, 0xCD, sizeof junk);
    CONF_EXPECT(read1(&d, junk, sizeof m - 1), CUBE_ERR_INVALID_ARGUMENT);
    CONF_EXPECT(read1(&d, junk, sizeof m + 4), CUBE_ERR_INVALID_ARGUMENT);
    const unsigned char *p = (const unsigned char *)junk;
    for (size_t i = 0; i < sizeof junk; i++)
        assert_int_equal(p[i], 0xCD);
    conf_release(h);
}

CONF_TEST(copy_rank_0_and_9_are_invalid_argument)
{
    unsigned char buf[64];
    memset(buf, 1, sizeof buf);
    cube_handle h = conf_create(buf, sizeof buf);
    cube_copy_desc d = cube_copy_desc_contiguous(h, sizeof buf, 1);
    d.rank = 0;
    CONF_EXPECT_MSG(write1(&d, buf, sizeof buf), CUBE_ERR_INVALID_ARGUMENT,
                    "rank");
    CONF_EXPECT_MSG(read1(&d, buf, sizeof buf), CUBE_ERR_INVALID_ARGUMENT,
                    "rank");
    d.rank = CUBE_MAX_RANK + 1;
    CONF_EXPECT_MSG(write1(&d, buf, sizeof buf), CUBE_ERR_INVALID_ARGUMENT,
                    "rank");
    CONF_EXPECT_MSG(read1(&d, buf, sizeof buf), CUBE_ERR_INVALID_ARGUMENT,
                    "rank");
    d.rank = UINT32_MAX;
    CONF_EXPECT(read1(&d, buf, sizeof buf), CUBE_ERR_INVALID_ARGUMENT);
    conf_release(h);
}

CONF_TEST(copy_elem_size_0_and_65_are_invalid_argument)
{
    unsigned char buf[130];
    memset(buf, 1, sizeof buf);
    cube_handle h = conf_create(buf, sizeof buf);
    cube_copy_desc d = cube_copy_desc_contiguous(h, 2, 1);
    d.elem_size = 0;
    CONF_EXPECT_MSG(write1(&d, buf, 0), CUBE_ERR_INVALID_ARGUMENT, "elem_size");
    CONF_EXPECT_MSG(read1(&d, buf, 2), CUBE_ERR_INVALID_ARGUMENT, "elem_size");
    d.elem_size = 65;
    CONF_EXPECT_MSG(write1(&d, buf, 130), CUBE_ERR_INVALID_ARGUMENT,
                    "elem_size");
    CONF_EXPECT_MSG(read1(&d, buf, 130), CUBE_ERR_INVALID_ARGUMENT,
                    "elem_size");
    conf_release(h);
}

CONF_TEST(copy_zero_extent_and_zero_stride_are_invalid_argument)
{
    unsigned char buf[64];
    memset(buf, 1, sizeof buf);
    cube_handle h = conf_create(buf, sizeof buf);
    uint64_t shape[2] = {4, 0};
    cube_copy_desc d = desc(h, 2, shape, NULL, 1);
    CONF_EXPECT_MSG(write1(&d, buf, 0), CUBE_ERR_INVALID_ARGUMENT, "shape");
    CONF_EXPECT_MSG(read1(&d, buf, 0), CUBE_ERR_INVALID_ARGUMENT, "shape");
    shape[0] = 0;
    shape[1] = 4;
    d = desc(h, 2, shape, NULL, 1);
    CONF_EXPECT(write1(&d, buf, 0), CUBE_ERR_INVALID_ARGUMENT);
    /* Two elements written to one place: refused, not raced. */
    uint64_t sh[2] = {4, 4}, st[2] = {0, 1};
    d = desc(h, 2, sh, st, 1);
    unsigned char src[16];
    memset(src, 9, sizeof src);
    CONF_EXPECT(write1(&d, src, sizeof src), CUBE_ERR_INVALID_ARGUMENT);
    unsigned char got[64];
    CONF_READ_OK(h, got, sizeof got);
    assert_memory_equal(got, buf, sizeof buf);
    conf_release(h);
}

CONF_TEST(copy_overflowing_shape_is_invalid_argument)
{
    unsigned char buf[64];
    memset(buf, 1, sizeof buf);
    cube_handle h = conf_create(buf, sizeof buf);
    uint64_t shape[3] = {(uint64_t)1 << 40, (uint64_t)1 << 40, 1};
    cube_copy_desc d = desc(h, 2, shape, NULL, 1);
    CONF_EXPECT(write1(&d, buf, sizeof buf), CUBE_ERR_INVALID_ARGUMENT);
    CONF_EXPECT(read1(&d, buf, sizeof buf), CUBE_ERR_INVALID_ARGUMENT);
    uint64_t one[1] = {UINT64_MAX};
    d = desc(h, 1, one, NULL, 2); /* bytes overflow */
    CONF_EXPECT(write1(&d, buf, sizeof buf), CUBE_ERR_INVALID_ARGUMENT);
    uint64_t sh[1] = {3}, st[1] = {(uint64_t)1 << 63}; /* reach overflows */
    d = desc(h, 1, sh, st, 1);
    CONF_EXPECT(read1(&d, buf, 3), CUBE_ERR_INVALID_ARGUMENT);
    uint64_t sh2[1] = {2}, st2[1] = {(uint64_t)1 << 62}; /* x elem overflows */
    d = desc(h, 1, sh2, st2, 8);
    CONF_EXPECT(read1(&d, buf, 16), CUBE_ERR_INVALID_ARGUMENT);
    unsigned char got[64];
    CONF_READ_OK(h, got, sizeof got);
    assert_memory_equal(got, buf, sizeof buf);
    conf_release(h);
}

CONF_TEST(copy_batch_with_one_bad_descriptor_writes_nothing)
{
    unsigned char a[64], b[64], junk[128], got[64];
    conf_pattern(a, sizeof a, 50);
    conf_pattern(b, sizeof b, 51);
    memset(junk, 0xEE, sizeof junk);
    cube_handle ha = conf_create(a, sizeof a), hb = conf_create(b, sizeof b);
    cube_copy_desc d[2] = {cube_copy_desc_contiguous(ha, 64, 1),
                           cube_copy_desc_contiguous(hb, 65, 1)};
    const void *src[2] = {junk, junk};
    uint64_t sz[2] = {64, 65};
    CONF_EXPECT(cube_write(conf.client, d, src, sz, 2),
                CUBE_ERR_INVALID_ARGUMENT);
    CONF_READ_OK(ha, got, sizeof got);
    assert_memory_equal(got, a, sizeof a);
    CONF_READ_OK(hb, got, sizeof got);
    assert_memory_equal(got, b, sizeof b);
    /* The bad one first, or a released handle second: the same. */
    cube_copy_desc e[2] = {cube_copy_desc_contiguous(hb, 65, 1),
                           cube_copy_desc_contiguous(ha, 64, 1)};
    const void *src2[2] = {junk, junk};
    uint64_t sz2[2] = {65, 64};
    CONF_EXPECT(cube_write(conf.client, e, src2, sz2, 2),
                CUBE_ERR_INVALID_ARGUMENT);
    cube_handle gone = conf_empty(64);
    conf_release(gone);
    cube_copy_desc f[2] = {cube_copy_desc_contiguous(ha, 64, 1),
                           cube_copy_desc_contiguous(gone, 64, 1)};
    uint64_t sz3[2] = {64, 64};
    CONF_EXPECT(cube_write(conf.client, f, src, sz3, 2), CUBE_ERR_NOT_FOUND);
    CONF_READ_OK(ha, got, sizeof got);
    assert_memory_equal(got, a, sizeof a);
    /* Reads: a bad second descriptor leaves the first destination alone. */
    unsigned char d1[64], d2[65];
    memset(d1, 0xCD, sizeof d1);
    memset(d2, 0xCD, sizeof d2);
    void *dst[2] = {d1, d2};
    CONF_EXPECT(cube_read(conf.client, d, dst, sz, 2),
                CUBE_ERR_INVALID_ARGUMENT);
    for (size_t i = 0; i < sizeof d1; i++)
        assert_int_equal(d1[i], 0xCD);
    conf_release(ha);
    conf_release(hb);
}

/* --- asynchronous reads --- */

CONF_TEST(read_async_wait_returns_data_and_future_becomes_ready)
{
    unsigned char in[5000], out[5000];
    conf_pattern(in, sizeof in, 60);
    memset(out, 0, sizeof out);
    cube_handle h = conf_create(in, sizeof in);
    cube_copy_desc d = cube_copy_desc_contiguous(h, sizeof out, 1);
    void *dst[1] = {out};
    uint64_t sz[1] = {sizeof out};
    cube_future *f = NULL;
    CONF_OK(cube_read_async(conf.client, &d, dst, sz, 1, &f));
    assert_non_null(f);
    CONF_OK(cube_future_wait(f));
    assert_int_equal(cube_future_ready(f), 1);
    assert_memory_equal(in, out, sizeof in);
    cube_future_free(f);
    conf_release(h);
}

CONF_TEST(read_async_waiting_twice_returns_null_the_second_time)
{
    unsigned char in[64], out[64];
    conf_pattern(in, sizeof in, 61);
    cube_handle h = conf_create(in, sizeof in);
    cube_copy_desc d = cube_copy_desc_contiguous(h, sizeof out, 1);
    void *dst[1] = {out};
    uint64_t sz[1] = {sizeof out};
    cube_future *f = NULL;
    CONF_OK(cube_read_async(conf.client, &d, dst, sz, 1, &f));
    CONF_OK(cube_future_wait(f));
    assert_null(cube_future_wait(f));
    assert_int_equal(cube_future_ready(f), 1);
    assert_memory_equal(in, out, sizeof in);
    cube_future_free(f);

    /* The same for a failed read: the error once, then NULL. */
    conf_mark_failed(h);
    CONF_OK(cube_read_async(conf.client, &d, dst, sz, 1, &f));
    CONF_EXPECT(cube_future_wait(f), CUBE_ERR_SEVERAL);
    assert_null(cube_future_wait(f));
    cube_future_free(f);
    conf_release(h);
}

CONF_TEST(read_async_freeing_unwaited_future_is_safe)
{
    unsigned char in[4096], out[4096];
    conf_pattern(in, sizeof in, 62);
    cube_handle h = conf_create(in, sizeof in);
    cube_copy_desc d = cube_copy_desc_contiguous(h, sizeof out, 1);
    void *dst[1] = {out};
    uint64_t sz[1] = {sizeof out};
    for (int i = 0; i < 8; i++) {
        memset(out, 0, sizeof out);
        cube_future *f = NULL;
        CONF_OK(cube_read_async(conf.client, &d, dst, sz, 1, &f));
        cube_future_free(f); /* waits first */
        assert_memory_equal(in, out, sizeof in);
    }
    /* A failed read's future freed unwaited: its error is freed too. */
    conf_mark_failed(h);
    cube_future *f = NULL;
    CONF_OK(cube_read_async(conf.client, &d, dst, sz, 1, &f));
    cube_future_free(f);
    conf_release(h);
}

CONF_TEST(read_async_argument_error_returns_no_future)
{
    unsigned char out[64];
    cube_handle h = conf_empty(32);
    cube_copy_desc d = cube_copy_desc_contiguous(h, sizeof out, 1);
    void *dst[1] = {out};
    uint64_t sz[1] = {sizeof out};
    cube_future *f = (cube_future *)out;
    CONF_EXPECT(cube_read_async(conf.client, &d, dst, sz, 1, &f),
                CUBE_ERR_INVALID_ARGUMENT);
    assert_null(f);
    f = (cube_future *)out;
    CONF_EXPECT(cube_read_async(conf.client, &d, dst, sz, 0, &f),
                CUBE_ERR_INVALID_ARGUMENT);
    assert_null(f);
    conf_release(h);
}

CONF_TEST(read_async_of_failed_buffer_reports_at_wait_untouched)
{
    unsigned char out[128];
    cube_handle h = conf_empty(sizeof out);
    conf_mark_failed(h);
    memset(out, 0xCD, sizeof out);
    cube_copy_desc d = cube_copy_desc_contiguous(h, sizeof out, 1);
    void *dst[1] = {out};
    uint64_t sz[1] = {sizeof out};
    cube_future *f = NULL;
    /* Not an argument error: the future is made, the failure comes at
     * wait. */
    CONF_OK(cube_read_async(conf.client, &d, dst, sz, 1, &f));
    assert_non_null(f);
    cube_error *err = cube_future_wait(f);
    CONF_CODE(err, CUBE_ERR_SEVERAL);
    assert_int_equal(cube_error_cause_count(err), 1);
    assert_true(conf_error_has_code(err, conf_mark_code()));
    cube_error_free(err);
    cube_future_free(f);
    for (size_t i = 0; i < sizeof out; i++)
        assert_int_equal(out[i], 0xCD);
    conf_release(h);
}

CONF_TEST_NEEDS(read_async_observes_stream_order, CUBE_FEATURE_KERNELS)
{
    enum { COUNT = 1000 };
    uint32_t first[COUNT], zeros[COUNT], got[COUNT];
    memset(zeros, 0, sizeof zeros);
    cube_handle y = conf_empty(sizeof first);
    cube_arg args[2] = {cube_arg_buffer(y), cube_arg_u32(100)};
    CONF_OK(conf_launch(conf.k.fill,
                        cube_count_static(conf_div_up(COUNT, 32), 1, 1), args,
                        2, CUBE_LAUNCH_EXECUTE));
    /* Read (async), then overwrite: the read sees the launch's values. */
    cube_copy_desc d = cube_copy_desc_contiguous(y, sizeof first, 4);
    void *dst[1] = {first};
    uint64_t sz[1] = {sizeof first};
    cube_future *f = NULL;
    CONF_OK(cube_read_async(conf.client, &d, dst, sz, 1, &f));
    CONF_WRITE_OK(y, zeros, sizeof zeros);
    CONF_OK(cube_future_wait(f));
    cube_future_free(f);
    for (uint32_t i = 0; i < COUNT; i++)
        assert_int_equal(first[i], 100 + i);
    CONF_READ_OK(y, got, sizeof got);
    assert_memory_equal(got, zeros, sizeof zeros);
    conf_release(y);
}

/* --- staging --- */

CONF_TEST(staging_buffers_feed_create_and_write)
{
    uint64_t sizes[3] = {100, 4096, 1};
    void *stage[3] = {NULL, NULL, NULL};
    CONF_OK(cube_staging(conf.client, sizes, 3, stage));
    for (int i = 0; i < 3; i++) {
        assert_non_null(stage[i]);
        assert_int_equal((uintptr_t)stage[i] % 16, 0);
        for (int j = 0; j < i; j++)
            assert_ptr_not_equal(stage[i], stage[j]);
        memset(stage[i], 0, sizes[i]); /* every byte is usable */
    }
    conf_pattern(stage[0], 100, 70);
    conf_pattern(stage[1], 4096, 71);
    unsigned char want0[100], want1[4096], got[4096];
    memcpy(want0, stage[0], 100);
    memcpy(want1, stage[1], 4096);
    cube_handle a = conf_create(stage[0], 100);
    cube_handle b = conf_empty(4096);
    CONF_WRITE_OK(b, stage[1], 4096);
    /* The host memory may be reused once the calls return. */
    memset(stage[0], 0xEE, 100);
    memset(stage[1], 0xEE, 4096);
    CONF_READ_OK(a, got, 100);
    assert_memory_equal(got, want0, 100);
    CONF_READ_OK(b, got, 4096);
    assert_memory_equal(got, want1, 4096);
    /* A staging buffer is also a fine read destination. */
    CONF_READ_OK(b, stage[1], 4096);
    assert_memory_equal(stage[1], want1, 4096);
    for (int i = 0; i < 3; i++)
        CONF_OK(cube_staging_free(conf.client, stage[i]));
    /* Freed twice: no longer a staging buffer of this client. */
    CONF_EXPECT(cube_staging_free(conf.client, stage[0]), CUBE_ERR_NOT_FOUND);
    conf_release(a);
    conf_release(b);
}

CONF_TEST(staging_free_of_foreign_pointer_is_not_found)
{
    void *heap = malloc(64);
    assert_non_null(heap);
    unsigned char stack[16];
    CONF_EXPECT(cube_staging_free(conf.client, heap), CUBE_ERR_NOT_FOUND);
    CONF_EXPECT(cube_staging_free(conf.client, stack), CUBE_ERR_NOT_FOUND);
    free(heap);
    CONF_OK(cube_staging_free(conf.client, NULL)); /* a no-op */
    uint64_t size[1] = {256};
    void *mine[1] = {NULL};
    CONF_OK(cube_staging(conf.client, size, 1, mine));
    /* A pointer inside a staging buffer is not one. */
    CONF_EXPECT(cube_staging_free(conf.client, (unsigned char *)mine[0] + 1),
                CUBE_ERR_NOT_FOUND);
    /* Another client's staging buffer. */
    cube_client *other = NULL;
    CONF_OK(cube_client_open(conf.backend, NULL, &other));
    void *theirs[1] = {NULL};
    CONF_OK(cube_staging(other, size, 1, theirs));
    CONF_EXPECT(cube_staging_free(conf.client, theirs[0]), CUBE_ERR_NOT_FOUND);
    CONF_EXPECT(cube_staging_free(other, mine[0]), CUBE_ERR_NOT_FOUND);
    CONF_OK(cube_staging_free(other, theirs[0]));
    CONF_OK(cube_staging_free(conf.client, mine[0]));
    /* One left unfreed is freed with its client (ASan checks). */
    CONF_OK(cube_staging(other, size, 1, theirs));
    cube_client_close(other);
}

CONF_TEST(staging_zero_sizes_and_counts_are_invalid_argument)
{
    uint64_t sizes[2] = {64, 0};
    void *out[2] = {(void *)sizes, (void *)sizes};
    CONF_EXPECT_MSG(cube_staging(conf.client, sizes, 2, out),
                    CUBE_ERR_INVALID_ARGUMENT, "size");
    /* Nothing was allocated (ASan would see a leak otherwise). */
    assert_null(out[1]);
    CONF_EXPECT(cube_staging(conf.client, sizes, 0, out),
                CUBE_ERR_INVALID_ARGUMENT);
    uint64_t huge[1] = {UINT64_MAX};
    void *h[1] = {NULL};
    cube_error *err = cube_staging(conf.client, huge, 1, h);
    assert_non_null(err);
    assert_true(cube_error_code(err) == CUBE_ERR_OUT_OF_MEMORY ||
                cube_error_code(err) == CUBE_ERR_BUFFER_TOO_BIG);
    cube_error_free(err);
    assert_null(h[0]);
}
