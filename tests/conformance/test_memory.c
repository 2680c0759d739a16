/* Memory pools, layouts, reports and allocation modes (cubert/memory.h),
 * sentence by sentence of the server contract:
 *
 * memory_usage          "Memory usage of the given stream."
 * memory_report         "Structured per-pool report of the given stream's
 *                       main GPU memory: each pool's shape, usage, and
 *                       high-water marks, in allocation-routing order."
 * memory_cleanup        "Ask the server to release memory that it can
 *                       release."
 * allocation_mode       "Update the memory mode of allocation in the
 *                       server."
 * install_memory_pools  "The calling stream's pools are rebuilt in place
 *                       (... a rebuild only happens when nothing is live
 *                       in them), and the layout becomes the one every
 *                       stream created afterwards is built with."
 *                       PoolsInUse "when the calling stream kept its old
 *                       layout because something was still live in its
 *                       pools ... The layout still applies to streams
 *                       created afterwards; retry to rebuild the calling
 *                       stream too." StreamUnavailable: the calling stream
 *                       cannot be resolved. Unsupported "from servers
 *                       without configurable pools".
 *
 * and cubert/memory.h: routing, spill-over, the large tail, caps,
 * validation messages, high-water marks, persistent windows, graphs
 * allocating persistently, the report's text and JSON forms and the
 * strides of data layouts.
 *
 * The suite keeps a live sentinel buffer on the main thread's stream, so
 * every test that installs a layout or needs an empty stream works on a
 * stream of its own (m_enter), and leaves it empty with the default layout
 * installed again, for itself and for streams created later (m_leave).
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <jansson.h>

#include "conformance.h"

/* --- streams of their own, layouts --- */

/* Ids below 2^63 never alias a thread's own stream; each call gives a
 * stream no test used before. */
static cube_stream_id m_last_stream = 0x4D454D0000000000ull;

static cube_stream_id m_new_stream(void)
{
    return ++m_last_stream;
}

/* The device's alignment: every size below is a multiple of it (plus a
 * remainder where the test wants an unaligned request). */
static uint64_t m_a(void)
{
    return conf.props.memory_alignment ? conf.props.memory_alignment : 1;
}

static uint64_t m_round_up(uint64_t v, uint64_t a)
{
    return (v + a - 1) / a * a;
}

/* What "about its own size" allows on top of the size rounded up to the
 * alignment. */
static uint64_t m_slack(void)
{
    return m_a() > 4096 ? m_a() : 4096;
}

static cube_memory_layout m_preset(cube_layout_preset preset)
{
    cube_memory_layout l;
    memset(&l, 0, sizeof l);
    CONF_OK(cube_memory_layout_preset(conf.client, preset, &l));
    return l;
}

/* Whether buffers are host memory (CUBE_FEATURE_HOST_MEMORY): the pools
 * are then built over the host's virtual memory, where every pool kind
 * installs, so CUBE_ERR_UNSUPPORTED is a failure there. */
static int m_host(void)
{
    return (conf.props.features & CUBE_FEATURE_HOST_MEMORY) != 0;
}

/* Installs the default layout (the subslices preset) on the calling
 * stream, which also makes it the layout of streams created from now on.
 * Returns 0 on a backend without configurable pools. */
static int m_install_default(void)
{
    cube_memory_layout l = m_preset(CUBE_PRESET_SUBSLICES);
    cube_error *err = cube_install_memory_pools(conf.client, &l);
    if (err && cube_error_code(err) == CUBE_ERR_UNSUPPORTED && !m_host()) {
        cube_error_free(err);
        return 0;
    }
    CONF_OK(err);
    return 1;
}

/* The stream the test began on: the main thread's own (0), unless an
 * earlier test failed half-way on another. */
static cube_stream_id m_home;

static void m_go_home(void)
{
    CONF_OK(
        cube_stream_use(conf.client, m_home >> 63 ? 0 : m_home)); /* own: 0 */
}

/* Switches the calling thread to a fresh stream with the default layout
 * installed; skips the test on a backend without configurable pools. */
static cube_stream_id m_enter(void)
{
    m_home = cube_stream_current(conf.client);
    cube_stream_id s = m_new_stream();
    CONF_OK(cube_stream_use(conf.client, s));
    if (!m_install_default()) {
        m_go_home();
        skip();
    }
    return s;
}

/* Leaves the current stream (which must hold no live buffer) with the
 * default layout, its unused memory released, and goes back to the stream
 * the test began on. */
static void m_leave(void)
{
    CONF_OK(cube_sync(conf.client, NULL, 0));
    m_install_default();
    CONF_OK(cube_memory_cleanup(conf.client));
    m_go_home();
}

/* Releases and waits, so the memory is back in its pool. */
static void m_release(cube_handle h)
{
    conf_release(h);
    CONF_OK(cube_sync(conf.client, NULL, 0));
}

static cube_pool_config m_pool(cube_pool_kind kind, uint64_t page, uint64_t min,
                               uint64_t max, uint64_t cap)
{
    cube_pool_config p;
    memset(&p, 0, sizeof p);
    p.kind = kind;
    p.page_size = page;
    p.min_size = min;
    p.max_size = max;
    p.cap = cap;
    return p;
}

/* Three pools, A the alignment:
 *   0  sliced,    page  256 A, requests 1 .. 64 A
 *   1  sliced,    page 4096 A, requests 64 A + 1 .. 1024 A
 *   2  exclusive, page 16384 A, requests 1024 A + 1 .. 16384 A
 * and the large tail above 16384 A. */
#define M_MAX0(a) (64 * (a))
#define M_MAX1(a) (1024 * (a))
#define M_MAX2(a) (16384 * (a))

static cube_memory_layout m_layout3(void)
{
    uint64_t a = m_a();
    cube_memory_layout l;
    memset(&l, 0, sizeof l);
    l.count = 3;
    l.pools[0] = m_pool(CUBE_POOL_SLICED, 256 * a, 1, M_MAX0(a), 0);
    l.pools[1] =
        m_pool(CUBE_POOL_SLICED, 4096 * a, M_MAX0(a) + 1, M_MAX1(a), 0);
    l.pools[2] =
        m_pool(CUBE_POOL_EXCLUSIVE, M_MAX2(a), M_MAX1(a) + 1, M_MAX2(a), 0);
    return l;
}

/* Two capped pools, P = 256 A: a sliced pool of pages of P capped at one
 * page, for requests up to P; then an exclusive pool capped at 4 P bytes
 * (one page of 4 P, or smaller pages up to that), for requests up to 4 P
 * (reachable above P); the uncapped tail above 4 P. */
static cube_memory_layout m_layout_capped(void)
{
    uint64_t p = 256 * m_a();
    cube_memory_layout l;
    memset(&l, 0, sizeof l);
    l.count = 2;
    l.pools[0] = m_pool(CUBE_POOL_SLICED, p, 1, p, p);
    l.pools[1] = m_pool(CUBE_POOL_EXCLUSIVE, 4 * p, 1, 4 * p, 4 * p);
    return l;
}

/* --- reports --- */

static cube_memory_report m_report(void)
{
    cube_memory_report r;
    memset(&r, 0xA5, sizeof r);
    CONF_OK(cube_memory_report_get(conf.client, &r));
    assert_in_range(r.count, 2, CUBE_MAX_POOLS + 2);
    return r;
}

static cube_memory_usage m_usage(void)
{
    cube_memory_usage u;
    memset(&u, 0, sizeof u);
    CONF_OK(cube_memory_usage_get(conf.client, &u));
    return u;
}

static const cube_pool_report *m_tail(const cube_memory_report *r)
{
    return &r->pools[r->count - 2];
}

static const cube_pool_report *m_persistent(const cube_memory_report *r)
{
    return &r->pools[r->count - 1];
}

/* Live buffers in every pool but the persistent one. */
static uint64_t m_dynamic_buffers(const cube_memory_report *r)
{
    uint64_t n = 0;
    for (uint32_t i = 0; i + 1 < r->count; i++)
        n += r->pools[i].buffers;
    return n;
}

static int m_same_config(const cube_pool_config *x, const cube_pool_config *y)
{
    return x->kind == y->kind && x->page_size == y->page_size &&
           x->min_size == y->min_size && x->max_size == y->max_size &&
           x->cap == y->cap && x->release_after_ms == y->release_after_ms;
}

static void m_print_config(const char *what, const cube_pool_config *p)
{
    print_error("  %s: kind %d, page %llu, min %llu, max %llu, cap %llu, "
                "release after %u ms\n",
                what, (int)p->kind, (unsigned long long)p->page_size,
                (unsigned long long)p->min_size,
                (unsigned long long)p->max_size, (unsigned long long)p->cap,
                p->release_after_ms);
}

/* The report lists `l`'s pools in order, then the large tail (an exclusive
 * pool with page size 0), then the persistent pool. */
static void m_expect_layout_at(const cube_memory_report *r,
                               const cube_memory_layout *l, const char *file,
                               int line)
{
    if (r->count != l->count + 2) {
        print_error("%s:%d: the report has %u entries; the layout has %u "
                    "pools, so %u were expected (its pools, the large tail, "
                    "the persistent pool)\n",
                    file, line, r->count, l->count, l->count + 2);
        _fail(file, line);
    }
    for (uint32_t i = 0; i < l->count; i++) {
        if (!m_same_config(&r->pools[i].config, &l->pools[i])) {
            print_error("%s:%d: pool %u of the report is not pool %u of the "
                        "layout\n",
                        file, line, i, i);
            m_print_config("report", &r->pools[i].config);
            m_print_config("layout", &l->pools[i]);
            _fail(file, line);
        }
    }
    const cube_pool_report *tail = m_tail(r);
    if (tail->config.kind != CUBE_POOL_EXCLUSIVE ||
        tail->config.page_size != 0) {
        print_error("%s:%d: entry %u is not the large tail\n", file, line,
                    r->count - 2);
        m_print_config("report", &tail->config);
        _fail(file, line);
    }
    if (m_persistent(r)->config.kind != CUBE_POOL_PERSISTENT) {
        print_error("%s:%d: the last entry is not the persistent pool\n", file,
                    line);
        m_print_config("report", &m_persistent(r)->config);
        _fail(file, line);
    }
}
#define M_EXPECT_LAYOUT(r, l) m_expect_layout_at((r), (l), __FILE__, __LINE__)

static void m_expect_usage_equal(const cube_memory_usage *x,
                                 const cube_memory_usage *y)
{
    assert_int_equal(x->buffers, y->buffers);
    assert_int_equal(x->bytes_in_use, y->bytes_in_use);
    assert_int_equal(x->bytes_padding, y->bytes_padding);
    assert_int_equal(x->bytes_reserved, y->bytes_reserved);
}

/* The pools' live buffers, bytes in use and bytes reserved add up to the
 * stream's totals. */
static void m_expect_sums(const cube_memory_report *r)
{
    uint64_t buffers = 0, in_use = 0, reserved = 0;
    for (uint32_t i = 0; i < r->count; i++) {
        buffers += r->pools[i].buffers;
        in_use += r->pools[i].bytes_in_use;
        reserved += r->pools[i].bytes_reserved;
    }
    assert_int_equal(buffers, r->usage.buffers);
    assert_int_equal(in_use, r->usage.bytes_in_use);
    assert_int_equal(reserved, r->usage.bytes_reserved);
    /* What is held covers what live buffers use, padding included. */
    assert_true(r->usage.bytes_reserved >=
                r->usage.bytes_in_use + r->usage.bytes_padding);
}

/* Every high-water mark of every pool equals its current value. */
static void m_expect_peaks_at_current(const cube_memory_report *r)
{
    for (uint32_t i = 0; i < r->count; i++) {
        const cube_pool_report *p = &r->pools[i];
        assert_int_equal(p->pages_peak, p->pages);
        assert_int_equal(p->buffers_peak, p->buffers);
        assert_int_equal(p->bytes_in_use_peak, p->bytes_in_use);
        assert_int_equal(p->bytes_reserved_peak, p->bytes_reserved);
    }
}

/* A buffer of `size` bytes holding a pattern. */
static cube_handle m_filled(uint64_t size, uint32_t seed, unsigned char **keep)
{
    unsigned char *bytes = malloc((size_t)size);
    assert_non_null(bytes);
    conf_pattern(bytes, (size_t)size, seed);
    *keep = bytes;
    return conf_create(bytes, size);
}

/* Reads `h` back, compares it with `keep`, frees `keep`. */
static void m_expect_contents(cube_handle h, unsigned char *keep, uint64_t size)
{
    unsigned char *got = malloc((size_t)size);
    assert_non_null(got);
    cube_error *err = conf_read(h, got, size);
    int same = !err && memcmp(got, keep, (size_t)size) == 0;
    free(got);
    free(keep);
    CONF_OK(err);
    assert_true(same);
}

/* --- messages that name a pool and a field --- */

static int m_names_pool(const char *msg, int pool)
{
    static const char *const forms[] = {"pools[%d]", "pool %d", "pool[%d]",
                                        "pool #%d"};
    char needle[32];
    for (size_t i = 0; i < sizeof forms / sizeof forms[0]; i++) {
        snprintf(needle, sizeof needle, forms[i], pool);
        if (strstr(msg, needle))
            return 1;
    }
    return 0;
}

/* `fields` is a list of names separated by '|'; each may also be written
 * with spaces for underscores ("page_size" or "page size"). */
static int m_names_field(const char *msg, const char *fields)
{
    char name[64];
    const char *p = fields;
    while (*p) {
        size_t n = strcspn(p, "|");
        if (n >= sizeof name)
            n = sizeof name - 1;
        memcpy(name, p, n);
        name[n] = '\0';
        if (strstr(msg, name))
            return 1;
        for (char *c = name; *c; c++)
            if (*c == '_')
                *c = ' ';
        if (strstr(msg, name))
            return 1;
        p += n;
        if (*p == '|')
            p++;
    }
    return 0;
}

/* One mistake in an otherwise valid layout. */
typedef struct m_mistake {
    const char *what;
    cube_memory_layout layout;
    int pool;           /* the pool the message names; -1: none */
    const char *fields; /* the field it names (alternatives with '|') */
} m_mistake;

#define M_MISTAKES_MAX 16

/* Every mistake cube_memory_layout_validate documents, each made alone in
 * a copy of m_layout3(). */
static size_t m_mistakes(m_mistake *out)
{
    uint64_t a = m_a();
    const cube_memory_layout base = m_layout3();
    size_t n = 0;
    m_mistake *m;

#define M_ADD(desc, at, field)                                                 \
    (m = &out[n++], m->what = (desc), m->layout = base, m->pool = (at),        \
     m->fields = (field), &m->layout)

    M_ADD("no pools", -1, "count")->count = 0;
    M_ADD("more pools than CUBE_MAX_POOLS", -1, "count")->count =
        CUBE_MAX_POOLS + 1;
    M_ADD("a persistent pool in the layout", 1, "kind")->pools[1].kind =
        CUBE_POOL_PERSISTENT;
    M_ADD("a kind that is not a cube_pool_kind", 1, "kind")->pools[1].kind =
        (cube_pool_kind)7;
    M_ADD("page_size 0", 0, "page_size")->pools[0].page_size = 0;
    if (a > 1)
        M_ADD("page_size not a multiple of the alignment", 0, "page_size")
            ->pools[0]
            .page_size = 256 * a + 1;
    M_ADD("min_size above max_size", 1, "min_size")->pools[1].min_size =
        2 * M_MAX1(a);
    M_ADD("max_size above the page size", 1, "max_size")->pools[1].max_size =
        8192 * a;
    M_ADD("a cap below one page", 2, "cap")->pools[2].cap = M_MAX2(a) - a;
    cube_memory_layout *l =
        M_ADD("a pool inside the range of the pool before it", 2,
              "min_size|max_size|range|reach");
    l->pools[2].min_size = M_MAX0(a) + 2;
    l->pools[2].max_size = M_MAX1(a);
    l = M_ADD("a pool inside the ranges of the pools before it", 2,
              "min_size|max_size|range|reach");
    l->pools[2].min_size = 32 * a;
    l->pools[2].max_size = 512 * a;
    M_ADD("a page larger than the device", 2, "page_size")->pools[2].page_size =
        m_round_up(conf.props.memory_total + 1, a);
#undef M_ADD
    assert_true(n <= M_MISTAKES_MAX);
    return n;
}

/* --- presets and validation --- */

CONF_TEST(memory_preset_layouts_validate_and_install_on_an_empty_stream)
{
    m_enter();
    uint64_t a = m_a();
    cube_memory_layout sub = m_preset(CUBE_PRESET_SUBSLICES);
    cube_memory_layout exc = m_preset(CUBE_PRESET_EXCLUSIVE);
    /* A preset is a function of the device. */
    cube_memory_layout again = m_preset(CUBE_PRESET_SUBSLICES);
    assert_int_equal(again.count, sub.count);
    for (uint32_t i = 0; i < sub.count; i++)
        assert_true(m_same_config(&again.pools[i], &sub.pools[i]));

    /* The main thread's stream, built before any install, has the default
     * layout: the subslices preset, except on CUDA with virtual memory
     * management, where it is the expandable preset (cuda_memory_preset;
     * a device without it falls back to subslices). */
    CONF_OK(cube_stream_use(conf.client, 0));
    cube_memory_report r = m_report();
    cube_memory_layout start = sub;
    int expandable = 0;
    for (uint32_t i = 0; i < r.count; i++)
        expandable |= r.pools[i].config.kind == CUBE_POOL_EXPANDABLE;
    if (conf_backend_note("default_layout_may_be_expandable") && expandable)
        start = m_preset(CUBE_PRESET_EXPANDABLE);
    else
        assert_false(expandable);
    M_EXPECT_LAYOUT(&r, &start);
    CONF_OK(cube_stream_use(conf.client, m_last_stream));

    const cube_memory_layout *presets[2] = {&sub, &exc};
    for (int k = 0; k < 2; k++) {
        const cube_memory_layout *l = presets[k];
        assert_in_range(l->count, 1, CUBE_MAX_POOLS);
        uint32_t sliced = 0, exclusive = 0, widest = 0;
        for (uint32_t i = 0; i < l->count; i++) {
            const cube_pool_config *p = &l->pools[i];
            assert_true(p->kind == CUBE_POOL_SLICED ||
                        p->kind == CUBE_POOL_EXCLUSIVE);
            sliced += p->kind == CUBE_POOL_SLICED;
            exclusive += p->kind == CUBE_POOL_EXCLUSIVE;
            assert_true(p->page_size > 0 && p->page_size % a == 0);
            assert_true(p->min_size <= p->max_size);
            assert_true(p->max_size <= p->page_size);
            assert_true(p->page_size <= conf.props.memory_total);
            if (p->max_size > l->pools[widest].max_size)
                widest = i;
        }
        if (l == &sub) {
            /* Sliced pools for small and medium buffers, exclusive pages
             * above. */
            assert_true(sliced >= 1);
            assert_true(exclusive >= 1);
            assert_int_equal(l->pools[widest].kind, CUBE_POOL_EXCLUSIVE);
        } else {
            assert_int_equal(sliced, 0);
        }
        CONF_OK(cube_memory_layout_validate(conf.client, l));
        CONF_OK(cube_install_memory_pools(conf.client, l));
        r = m_report();
        M_EXPECT_LAYOUT(&r, l);
        assert_int_equal(r.usage.buffers, 0);
        /* The installed pools serve. */
        cube_handle h = conf_empty(1000);
        r = m_report();
        assert_int_equal(m_dynamic_buffers(&r), 1);
        m_release(h);
    }
    /* Not a preset. */
    cube_memory_layout out;
    CONF_EXPECT_MSG(
        cube_memory_layout_preset(conf.client, (cube_layout_preset)9, &out),
        CUBE_ERR_INVALID_ARGUMENT, "preset");
    m_leave();
}

CONF_TEST(memory_validation_rejects_each_mistake_naming_pool_and_field)
{
    /* The base layout is valid. */
    cube_memory_layout base = m_layout3();
    CONF_OK(cube_memory_layout_validate(conf.client, &base));
    cube_memory_layout capped = m_layout_capped();
    CONF_OK(cube_memory_layout_validate(conf.client, &capped));

    m_mistake mistakes[M_MISTAKES_MAX];
    size_t n = m_mistakes(mistakes);
    int misses = 0;
    for (size_t i = 0; i < n; i++) {
        const m_mistake *m = &mistakes[i];
        cube_error *err = cube_memory_layout_validate(conf.client, &m->layout);
        if (!err) {
            print_error("validate accepted a layout with %s\n", m->what);
            fail();
        }
        if (cube_error_code(err) != CUBE_ERR_INVALID_ARGUMENT) {
            print_error("%s: expected [%s], got [%s]: %s\n", m->what,
                        cube_code_name(CUBE_ERR_INVALID_ARGUMENT),
                        cube_code_name(cube_error_code(err)),
                        cube_error_message(err));
            cube_error_free(err);
            fail();
        }
        const char *msg = cube_error_message(err);
        int named = m_names_field(msg, m->fields) &&
                    (m->pool < 0 || m_names_pool(msg, m->pool));
        if (!named) {
            print_error("%s: the message does not name pool %d (-1: "
                        "none) and field '%s': %s\n",
                        m->what, m->pool, m->fields, msg);
            misses++;
        }
        cube_error_free(err);
    }
    if (misses)
        fail_msg("%d of %zu validation messages do not name the pool and "
                 "field",
                 misses, n);
}

/* --- installing --- */

CONF_TEST(memory_install_with_live_buffers_is_pools_in_use_keeping_old_layout)
{
    m_enter();
    cube_memory_layout def = m_preset(CUBE_PRESET_SUBSLICES);
    cube_memory_layout l = m_layout3();
    unsigned char *keep = NULL;
    cube_handle h = m_filled(777, 17, &keep);
    cube_memory_report before = m_report();
    M_EXPECT_LAYOUT(&before, &def);

    CONF_EXPECT(cube_install_memory_pools(conf.client, &l),
                CUBE_ERR_POOLS_IN_USE);
    /* The stream kept its old pools, and what is in them. */
    cube_memory_report after = m_report();
    M_EXPECT_LAYOUT(&after, &def);
    assert_int_equal(after.usage.buffers, before.usage.buffers);
    assert_int_equal(after.usage.bytes_in_use, before.usage.bytes_in_use);
    for (uint32_t i = 0; i < after.count; i++)
        assert_int_equal(after.pools[i].buffers, before.pools[i].buffers);
    m_expect_contents(h, keep, 777);
    /* Allocation still routes by the old layout: a request above l's
     * widest pool that a default pool holds stays out of the tail. */
    uint64_t size = M_MAX2(m_a()) + 1;
    uint64_t widest = 0;
    for (uint32_t i = 0; i < def.count; i++)
        if (def.pools[i].max_size > widest)
            widest = def.pools[i].max_size;
    if (size <= widest) {
        cube_handle g = conf_empty(size);
        cube_memory_report r = m_report();
        assert_int_equal(m_tail(&r)->buffers, 0);
        m_release(g);
    }
    m_release(h);
    m_leave();
}

CONF_TEST(memory_install_refused_for_live_buffers_applies_to_later_streams)
{
    cube_stream_id s = m_enter();
    cube_memory_layout l = m_layout3();
    cube_handle h = conf_empty(777);
    CONF_EXPECT(cube_install_memory_pools(conf.client, &l),
                CUBE_ERR_POOLS_IN_USE);

    /* A stream created afterwards is built with the new layout. */
    CONF_OK(cube_stream_use(conf.client, m_new_stream()));
    cube_memory_report r = m_report();
    M_EXPECT_LAYOUT(&r, &l);
    /* ... and allocates from it: M_MAX0 + 1 is pool 1's smallest. */
    cube_handle g = conf_empty(M_MAX0(m_a()) + 1);
    r = m_report();
    assert_int_equal(r.pools[1].buffers, 1);
    assert_int_equal(r.pools[1].bytes_in_use, M_MAX0(m_a()) + 1);
    m_release(g);
    CONF_OK(cube_memory_cleanup(conf.client));

    CONF_OK(cube_stream_use(conf.client, s));
    m_release(h);
    m_leave();
}

CONF_TEST(memory_install_retried_after_release_rebuilds_the_calling_stream)
{
    m_enter();
    cube_memory_layout l = m_layout3();
    cube_handle h = conf_empty(777);
    cube_handle s = conf_slice(h, 0, 100);
    CONF_EXPECT(cube_install_memory_pools(conf.client, &l),
                CUBE_ERR_POOLS_IN_USE);
    conf_release(h);
    /* The slice keeps the buffer live. */
    CONF_EXPECT(cube_install_memory_pools(conf.client, &l),
                CUBE_ERR_POOLS_IN_USE);
    m_release(s);
    /* Pages the old pools still hold unused do not block a rebuild. */
    CONF_OK(cube_install_memory_pools(conf.client, &l));
    cube_memory_report r = m_report();
    M_EXPECT_LAYOUT(&r, &l);
    assert_int_equal(r.usage.buffers, 0);
    cube_handle g = conf_empty(100 * m_a());
    r = m_report();
    assert_int_equal(r.pools[1].buffers, 1);
    m_release(g);
    m_leave();
}

CONF_TEST(memory_install_leaves_other_existing_streams_alone)
{
    cube_stream_id s0 = m_enter();
    cube_memory_layout def = m_preset(CUBE_PRESET_SUBSLICES);
    cube_memory_layout l = m_layout3();
    /* s0 exists and has allocated with the default layout. */
    m_release(conf_empty(1000));

    CONF_OK(cube_stream_use(conf.client, m_new_stream()));
    CONF_OK(cube_install_memory_pools(conf.client, &l));
    cube_memory_report r = m_report();
    M_EXPECT_LAYOUT(&r, &l);
    CONF_OK(cube_memory_cleanup(conf.client));

    CONF_OK(cube_stream_use(conf.client, s0));
    r = m_report();
    M_EXPECT_LAYOUT(&r, &def);
    m_leave();
}

/* The install succeeded, so the calling stream's pools are the new layout,
 * whether or not it allocated before: an install made later from another
 * stream does not replace it. */
CONF_TEST(memory_install_before_a_streams_first_allocation_stays_its_layout)
{
    cube_stream_id s = m_enter();
    cube_memory_layout l = m_layout3(), other = m_layout_capped();
    CONF_OK(cube_install_memory_pools(conf.client, &l));
    CONF_OK(cube_stream_use(conf.client, m_new_stream()));
    CONF_OK(cube_install_memory_pools(conf.client, &other));
    CONF_OK(cube_stream_use(conf.client, s));
    cube_memory_report r = m_report();
    M_EXPECT_LAYOUT(&r, &l);
    cube_handle h = conf_empty(M_MAX0(m_a()) + 1);
    r = m_report();
    assert_int_equal(r.pools[1].buffers, 1);
    m_release(h);
    m_leave();
}

CONF_TEST(memory_install_of_a_bad_layout_changes_nothing)
{
    m_enter();
    cube_memory_layout l = m_layout3();
    CONF_OK(cube_install_memory_pools(conf.client, &l));
    m_mistake mistakes[M_MISTAKES_MAX];
    size_t n = m_mistakes(mistakes);

    /* With a buffer live, the bad layout is refused as such (not as pools
     * in use); without, it is refused too. */
    cube_handle h = conf_empty(10 * m_a());
    for (int pass = 0; pass < 2; pass++) {
        for (size_t i = 0; i < n; i++) {
            cube_error *err =
                cube_install_memory_pools(conf.client, &mistakes[i].layout);
            if (cube_error_code(err) != CUBE_ERR_INVALID_ARGUMENT)
                print_error("installing a layout with %s:\n", mistakes[i].what);
            CONF_EXPECT(err, CUBE_ERR_INVALID_ARGUMENT);
            cube_memory_report r = m_report();
            M_EXPECT_LAYOUT(&r, &l);
            assert_int_equal(r.usage.buffers, pass == 0 ? 1 : 0);
        }
        if (pass == 0)
            m_release(h);
    }
    /* Streams created afterwards still get the last good layout. */
    CONF_OK(cube_stream_use(conf.client, m_new_stream()));
    cube_memory_report r = m_report();
    M_EXPECT_LAYOUT(&r, &l);
    m_leave();
}

CONF_TEST(memory_install_is_unsupported_only_without_configurable_pools)
{
    m_home = cube_stream_current(conf.client);
    CONF_OK(cube_stream_use(conf.client, m_new_stream()));
    cube_memory_report before = m_report();
    cube_memory_layout l = m_layout3();
    cube_error *err = cube_install_memory_pools(conf.client, &l);
    if (m_host() || cube_error_code(err) != CUBE_ERR_UNSUPPORTED) {
        /* Pools over host memory are configurable. */
        CONF_OK(err);
        cube_memory_report r = m_report();
        M_EXPECT_LAYOUT(&r, &l);
        m_leave();
        return;
    }
    /* Unsupported is permanent and changes nothing. */
    CONF_CODE(err, CUBE_ERR_UNSUPPORTED);
    cube_error_free(err);
    CONF_EXPECT(cube_install_memory_pools(conf.client, &l),
                CUBE_ERR_UNSUPPORTED);
    cube_memory_report after = m_report();
    assert_int_equal(after.count, before.count);
    for (uint32_t i = 0; i < after.count; i++)
        assert_true(
            m_same_config(&after.pools[i].config, &before.pools[i].config));
    m_go_home();
}

/* A stream named with cube_stream_use is created on first use, so no
 * memory call on it finds it unavailable. */
CONF_TEST(memory_calls_on_a_stream_named_for_the_first_time_succeed)
{
    cube_memory_layout def = m_preset(CUBE_PRESET_SUBSLICES);
    cube_memory_usage u;
    cube_memory_report r;
    m_home = cube_stream_current(conf.client);
    for (int call = 0; call < 7; call++) {
        CONF_OK(cube_stream_use(conf.client, m_new_stream()));
        switch (call) {
        case 0: CONF_OK(cube_install_memory_pools(conf.client, &def)); break;
        case 1: CONF_OK(cube_memory_usage_get(conf.client, &u)); break;
        case 2: CONF_OK(cube_memory_report_get(conf.client, &r)); break;
        case 3: CONF_OK(cube_memory_cleanup(conf.client)); break;
        case 4: CONF_OK(cube_memory_reset_peaks(conf.client)); break;
        case 5:
            CONF_OK(cube_allocation_mode_set(conf.client, CUBE_ALLOC_AUTO));
            break;
        default:
            CONF_OK(cube_persistent_begin(conf.client));
            CONF_OK(cube_persistent_end(conf.client));
            break;
        }
        if (call == 1)
            assert_int_equal(u.buffers, 0);
        if (call == 2)
            assert_int_equal(r.usage.buffers, 0);
    }
    m_go_home();
}

/* --- reports --- */

CONF_TEST(memory_report_lists_pools_in_routing_order_then_tail_then_persistent)
{
    m_enter();
    uint64_t a = m_a();
    cube_memory_layout l = m_layout3();
    l.pools[2].release_after_ms = 60000; /* echoed by the report */
    CONF_OK(cube_install_memory_pools(conf.client, &l));
    cube_memory_report r = m_report();
    M_EXPECT_LAYOUT(&r, &l);

    /* Each request lands in the first pool whose range holds it; the
     * bounds are inclusive. */
    const struct {
        uint64_t size;
        uint32_t pool; /* 3: the tail, 4: persistent */
    } cases[] = {
        {1, 0},
        {M_MAX0(a), 0},
        {M_MAX0(a) + 1, 1},
        {M_MAX1(a), 1},
        {M_MAX1(a) + 1, 2},
        {M_MAX2(a), 2},
        {M_MAX2(a) + 1, 3},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        cube_handle h = conf_empty(cases[i].size);
        r = m_report();
        for (uint32_t p = 0; p < r.count; p++) {
            uint64_t want = p == cases[i].pool ? 1 : 0;
            if (r.pools[p].buffers != want)
                print_error("a request of %llu bytes: entry %u holds %llu "
                            "buffers; expected it in entry %u\n",
                            (unsigned long long)cases[i].size, p,
                            (unsigned long long)r.pools[p].buffers,
                            cases[i].pool);
            assert_int_equal(r.pools[p].buffers, want);
            assert_int_equal(r.pools[p].bytes_in_use, want ? cases[i].size : 0);
        }
        m_release(h);
    }
    m_leave();
}

CONF_TEST(memory_usage_and_report_are_per_stream)
{
    cube_memory_usage main_before = m_usage();
    cube_stream_id s1 = m_enter();
    cube_handle h = conf_empty(5000);
    assert_int_equal(m_usage().buffers, 1);

    CONF_OK(cube_stream_use(conf.client, m_new_stream()));
    assert_int_equal(m_usage().buffers, 0);
    cube_memory_report r = m_report();
    assert_int_equal(r.usage.buffers, 0);
    assert_int_equal(r.usage.bytes_in_use, 0);

    m_go_home();
    cube_memory_usage main_now = m_usage();
    assert_int_equal(main_now.buffers, main_before.buffers);
    assert_int_equal(main_now.bytes_in_use, main_before.bytes_in_use);

    CONF_OK(cube_stream_use(conf.client, s1));
    r = m_report();
    assert_int_equal(r.usage.buffers, 1);
    assert_int_equal(r.usage.bytes_in_use, 5000);
    m_release(h);
    m_leave();
}

CONF_TEST(memory_report_usage_equals_usage_get_and_pools_sum_to_it)
{
    /* The main stream, default layout, the sentinel live. */
    m_home = cube_stream_current(conf.client);
    CONF_OK(cube_stream_use(conf.client, 0));
    cube_memory_report r = m_report();
    cube_memory_usage u = m_usage();
    m_expect_usage_equal(&r.usage, &u);
    assert_true(r.usage.buffers >= 1);
    m_expect_sums(&r);
    m_go_home();

    m_enter();
    uint64_t a = m_a();
    cube_memory_layout l = m_layout3();
    CONF_OK(cube_install_memory_pools(conf.client, &l));
    const uint64_t sizes[] = {
        3,       a + 1,         M_MAX0(a),    M_MAX0(a) + 5,
        300 * a, M_MAX1(a) + 3, M_MAX2(a) + 7};
    enum { N = sizeof sizes / sizeof sizes[0] };
    cube_handle h[N + 1];
    uint64_t total = 0;
    for (size_t i = 0; i < N; i++) {
        h[i] = conf_empty(sizes[i]);
        total += sizes[i];
    }
    CONF_OK(cube_persistent_begin(conf.client));
    h[N] = conf_empty(2 * a + 1);
    CONF_OK(cube_persistent_end(conf.client));
    total += 2 * a + 1;

    r = m_report();
    u = m_usage();
    m_expect_usage_equal(&r.usage, &u);
    assert_int_equal(r.usage.buffers, N + 1);
    assert_int_equal(r.usage.bytes_in_use, total);
    assert_true(r.usage.bytes_reserved >= total);
    m_expect_sums(&r);
    assert_int_equal(m_persistent(&r)->buffers, 1);

    /* Still after releasing half. */
    for (size_t i = 0; i <= N; i += 2)
        m_release(h[i]);
    r = m_report();
    u = m_usage();
    m_expect_usage_equal(&r.usage, &u);
    m_expect_sums(&r);
    for (size_t i = 1; i <= N; i += 2)
        m_release(h[i]);
    r = m_report();
    assert_int_equal(r.usage.buffers, 0);
    m_expect_sums(&r);
    m_leave();
}

CONF_TEST(memory_high_water_marks_rise_stay_after_release_and_reset_to_now)
{
    m_enter();
    uint64_t a = m_a();
    cube_memory_layout l = m_layout3();
    CONF_OK(cube_install_memory_pools(conf.client, &l));
    cube_memory_report r = m_report();
    m_expect_peaks_at_current(&r);

    enum { K = 6 };
    cube_handle h[K];
    for (int i = 0; i < K; i++)
        h[i] = conf_empty(48 * a);
    r = m_report();
    const cube_pool_report full = r.pools[0];
    assert_int_equal(full.buffers, K);
    assert_int_equal(full.bytes_in_use, K * 48 * a);
    assert_true(full.pages >= 2); /* 6 x 48 A do not fit one 256 A page */
    assert_true(full.bytes_reserved >= full.pages * 256 * a);
    /* Everything grew from nothing: the marks are the current values. */
    m_expect_peaks_at_current(&r);

    for (int i = 0; i < K; i++)
        m_release(h[i]);
    r = m_report();
    const cube_pool_report *p = &r.pools[0];
    assert_int_equal(p->buffers, 0);
    assert_int_equal(p->bytes_in_use, 0);
    assert_int_equal(p->buffers_peak, K);
    assert_int_equal(p->bytes_in_use_peak, K * 48 * a);
    assert_int_equal(p->pages_peak, full.pages);
    assert_int_equal(p->bytes_reserved_peak, full.bytes_reserved);

    /* A cleanup lowers what is held, not the marks. */
    CONF_OK(cube_memory_cleanup(conf.client));
    r = m_report();
    assert_int_equal(r.pools[0].pages_peak, full.pages);
    assert_int_equal(r.pools[0].bytes_reserved_peak, full.bytes_reserved);

    CONF_OK(cube_memory_reset_peaks(conf.client));
    r = m_report();
    m_expect_peaks_at_current(&r);

    /* And they rise again from there. */
    cube_handle g = conf_empty(10 * a);
    r = m_report();
    assert_int_equal(r.pools[0].buffers_peak, 1);
    assert_int_equal(r.pools[0].bytes_in_use_peak, 10 * a);
    m_release(g);
    m_leave();
}

CONF_TEST(memory_largest_buffer_is_the_largest_request_each_pool_served)
{
    m_enter();
    uint64_t a = m_a();
    cube_memory_layout l = m_layout3();
    CONF_OK(cube_install_memory_pools(conf.client, &l));
    const uint64_t sizes[] = {2 * a + 3,     40 * a + 5,        10 * a,
                              100 * a + 7,   M_MAX1(a) - 1,     2000 * a,
                              M_MAX2(a) + 9, M_MAX2(a) + 16 * a};
    /* The largest per entry: pool 0, 1, 2, the tail. */
    const uint64_t largest[4] = {40 * a + 5, M_MAX1(a) - 1, 2000 * a,
                                 M_MAX2(a) + 16 * a};
    enum { N = sizeof sizes / sizeof sizes[0] };
    cube_handle h[N + 1];
    for (size_t i = 0; i < N; i++)
        h[i] = conf_empty(sizes[i]);
    CONF_OK(cube_persistent_begin(conf.client));
    h[N] = conf_empty(5 * a + 1);
    CONF_OK(cube_persistent_end(conf.client));
    for (int pass = 0; pass < 2; pass++) {
        cube_memory_report r = m_report();
        for (int i = 0; i < 4; i++)
            assert_int_equal(r.pools[i].largest_buffer, largest[i]);
        assert_int_equal(m_persistent(&r)->largest_buffer, 5 * a + 1);
        /* "Ever": released buffers still count. */
        if (pass == 0)
            for (size_t i = 0; i <= N; i++)
                m_release(h[i]);
    }
    m_leave();
}

CONF_TEST(memory_buffer_above_every_pool_goes_to_the_tail_at_about_its_size)
{
    m_enter();
    uint64_t a = m_a();
    cube_memory_layout l = m_layout3();
    CONF_OK(cube_install_memory_pools(conf.client, &l));
    cube_memory_usage u0 = m_usage();
    uint64_t size = 3 * M_MAX2(a) + 5;
    cube_handle h = conf_empty(size);
    cube_memory_report r = m_report();
    const cube_pool_report *tail = m_tail(&r);
    assert_int_equal(m_dynamic_buffers(&r), 1);
    assert_int_equal(tail->buffers, 1);
    assert_int_equal(tail->bytes_in_use, size);
    uint64_t limit = m_round_up(size, a) + m_slack();
    if (tail->bytes_reserved < size || tail->bytes_reserved > limit)
        fail_msg("a tail buffer of %llu bytes reserves %llu; expected "
                 "%llu .. %llu",
                 (unsigned long long)size,
                 (unsigned long long)tail->bytes_reserved,
                 (unsigned long long)size, (unsigned long long)limit);
    assert_true(r.usage.bytes_reserved - u0.bytes_reserved <= limit);
    assert_true(tail->pages >= 1);
    m_release(h);
    m_leave();
}

CONF_TEST(memory_half_of_device_memory_is_never_buffer_too_big)
{
    m_enter();
    uint64_t size = conf.props.memory_total / 2;
    /* Or the largest buffer, where the device holds less in one (OpenCL's
     * CL_DEVICE_MAX_MEM_ALLOC_SIZE). */
    if (size > conf.props.max_buffer_size)
        size = conf.props.max_buffer_size;
    assert_true(size > 0);
    /* Never touched: on the CPU the host backs pages only when written. */
    cube_handle h = {0};
    cube_error *err = cube_empty(conf.client, size, &h);
    if (err) {
        /* The machine may not have it now; but it is not too big. */
        if (cube_error_code(err) != CUBE_ERR_OUT_OF_MEMORY)
            print_error("cube_empty of half the device (%llu bytes):\n",
                        (unsigned long long)size);
        CONF_EXPECT(err, CUBE_ERR_OUT_OF_MEMORY);
    } else {
        cube_memory_report r = m_report();
        assert_int_equal(r.usage.buffers, 1);
        assert_int_equal(r.usage.bytes_in_use, size);
        m_release(h);
    }
    m_leave();
}

CONF_TEST(memory_buffer_above_device_memory_is_buffer_too_big)
{
    m_enter();
    uint64_t a = m_a();
    const uint64_t sizes[3] = {conf.props.memory_total + 1,
                               conf.props.memory_total + a,
                               2 * conf.props.memory_total};
    for (int layout = 0; layout < 2; layout++) {
        if (layout == 1) {
            cube_memory_layout l = m_layout3();
            CONF_OK(cube_install_memory_pools(conf.client, &l));
        }
        cube_memory_usage u0 = m_usage();
        for (int i = 0; i < 3; i++) {
            cube_handle h = {0};
            CONF_EXPECT(cube_empty(conf.client, sizes[i], &h),
                        CUBE_ERR_BUFFER_TOO_BIG);
        }
        cube_memory_usage u1 = m_usage();
        m_expect_usage_equal(&u1, &u0);
    }
    m_leave();
}

CONF_TEST(memory_padding_is_what_alignment_adds_to_live_buffers)
{
    m_enter();
    uint64_t a = m_a();
    cube_memory_layout l = m_layout3();
    CONF_OK(cube_install_memory_pools(conf.client, &l));
    const uint64_t sizes[3] = {3, 100 * a + 1, M_MAX2(a) + 5};
    cube_handle h[3];
    uint64_t in_use = 0, least = 0;
    for (int i = 0; i < 3; i++) {
        h[i] = conf_empty(sizes[i]);
        in_use += sizes[i];
        least += m_round_up(sizes[i], a) - sizes[i];
    }
    cube_memory_report r = m_report();
    assert_int_equal(r.usage.bytes_in_use, in_use);
    assert_true(r.usage.bytes_padding >= least);
    m_expect_sums(&r);
    /* Padding is counted for live buffers only. */
    for (int i = 0; i < 3; i++)
        m_release(h[i]);
    r = m_report();
    assert_int_equal(r.usage.bytes_in_use, 0);
    assert_int_equal(r.usage.bytes_padding, 0);
    m_leave();
}

CONF_TEST(memory_buffer_released_on_another_stream_returns_to_its_own_pools)
{
    cube_stream_id s1 = m_enter();
    cube_handle h = conf_empty(1000);
    CONF_OK(cube_stream_use(conf.client, m_new_stream()));
    m_release(h);
    assert_int_equal(m_usage().buffers, 0);
    CONF_OK(cube_stream_use(conf.client, s1));
    cube_memory_usage u = m_usage();
    assert_int_equal(u.buffers, 0);
    assert_int_equal(u.bytes_in_use, 0);
    m_leave();
}

/* --- sliced and exclusive pages --- */

CONF_TEST(memory_sliced_pool_merges_neighbouring_free_slices)
{
    m_enter();
    uint64_t a = m_a(), page = 256 * a;
    cube_memory_layout l;
    memset(&l, 0, sizeof l);
    l.count = 1;
    l.pools[0] = m_pool(CUBE_POOL_SLICED, page, 1, page, 0);
    CONF_OK(cube_install_memory_pools(conf.client, &l));
    for (int round = 0; round < 2; round++) {
        cube_handle h[4];
        for (int i = 0; i < 4; i++)
            h[i] = conf_empty(page / 4);
        cube_memory_report r = m_report();
        assert_int_equal(r.pools[0].pages, 1); /* four quarters fill one */
        /* Freed in an order that makes a free slice meet free neighbours
         * on one side, then on both. */
        static const int order[4] = {0, 2, 1, 3};
        for (int i = 0; i < 4; i++)
            m_release(h[order[i]]);
        /* The whole page is one free slice again. */
        cube_handle whole = conf_empty(page);
        r = m_report();
        assert_int_equal(r.pools[0].buffers, 1);
        assert_int_equal(r.pools[0].pages, 1);
        assert_int_equal(r.pools[0].bytes_reserved, page);
        m_release(whole);
        /* Halves: a split page merges back as well. */
        cube_handle half[2] = {conf_empty(page / 2), conf_empty(page / 2)};
        r = m_report();
        assert_int_equal(r.pools[0].pages, 1);
        m_release(half[round]);
        m_release(half[1 - round]);
    }
    m_leave();
}

CONF_TEST(memory_exclusive_pages_unused_for_release_after_ms_are_given_back)
{
    m_enter();
    uint64_t a = m_a();
    enum { AFTER_MS = 200 };
    cube_memory_layout l;
    memset(&l, 0, sizeof l);
    l.count = 2;
    l.pools[0] = m_pool(CUBE_POOL_SLICED, 256 * a, 1, M_MAX0(a), 0);
    l.pools[1] =
        m_pool(CUBE_POOL_EXCLUSIVE, M_MAX1(a), M_MAX0(a) + 1, M_MAX1(a), 0);
    l.pools[1].release_after_ms = AFTER_MS;
    CONF_OK(cube_install_memory_pools(conf.client, &l));
    m_release(conf_empty(500 * a));
    m_release(conf_empty(900 * a));
    /* Just freed: kept for reuse. */
    cube_memory_report r = m_report();
    assert_true(r.pools[1].pages >= 1);
    assert_true(r.pools[1].bytes_reserved >= 500 * a);
    struct timespec ts = {0, 2 * AFTER_MS * 1000000L};
    nanosleep(&ts, NULL);
    /* Unused that long: given back by the time the stream allocates
     * again. */
    m_release(conf_empty(a));
    r = m_report();
    assert_int_equal(r.pools[1].pages, 0);
    assert_int_equal(r.pools[1].bytes_reserved, 0);
    m_leave();
}

/* --- caps and spill-over --- */

CONF_TEST(memory_full_capped_pool_spills_over_to_the_next_pool)
{
    m_enter();
    uint64_t p = 256 * m_a();
    cube_memory_layout l = m_layout_capped();
    CONF_OK(cube_install_memory_pools(conf.client, &l));
    cube_handle x = conf_empty(p);
    cube_memory_report r = m_report();
    assert_int_equal(r.pools[0].buffers, 1);
    assert_int_equal(r.pools[1].buffers, 0);
    /* Pool 0 holds one page, its cap: the next request of its range goes
     * to pool 1. */
    cube_handle y = conf_empty(p);
    r = m_report();
    assert_int_equal(r.pools[0].buffers, 1);
    assert_int_equal(r.pools[1].buffers, 1);
    assert_int_equal(r.pools[0].pages_peak, 1);
    assert_int_equal(r.pools[1].pages_peak, 1);
    assert_int_equal(m_tail(&r)->buffers, 0);
    m_release(x);
    m_release(y);

    /* Also when the page at the cap is only partly used. */
    x = conf_empty(p / 2);
    y = conf_empty(p);
    r = m_report();
    assert_int_equal(r.pools[0].buffers, 1);
    assert_int_equal(r.pools[0].bytes_in_use, p / 2);
    assert_int_equal(r.pools[1].buffers, 1);
    assert_int_equal(r.pools[1].bytes_in_use, p);
    assert_true(r.pools[0].bytes_reserved <= l.pools[0].cap);
    assert_true(r.pools[1].bytes_reserved <= l.pools[1].cap);
    m_release(x);
    m_release(y);
    m_leave();
}

CONF_TEST(memory_every_able_pool_at_its_cap_is_pool_capacity_exceeded)
{
    m_enter();
    uint64_t a = m_a(), p = 256 * a;
    cube_memory_layout l = m_layout_capped();
    CONF_OK(cube_install_memory_pools(conf.client, &l));

    /* Only pool 1 holds 2 P: with it full, 2 P is refused although pool 0
     * is empty, and a request pool 0 holds still succeeds. */
    cube_handle big = conf_empty(4 * p);
    cube_handle h = {0};
    CONF_EXPECT(cube_empty(conf.client, 2 * p, &h),
                CUBE_ERR_POOL_CAPACITY_EXCEEDED);
    cube_handle x = conf_empty(p);
    cube_memory_report r = m_report();
    assert_int_equal(r.pools[0].buffers, 1);
    assert_int_equal(r.pools[1].buffers, 1);

    /* Both pools at their caps: whatever they could hold is refused. */
    const uint64_t refused[3] = {p, a, 4 * p};
    cube_memory_usage u0 = m_usage();
    for (int i = 0; i < 3; i++)
        CONF_EXPECT(cube_empty(conf.client, refused[i], &h),
                    CUBE_ERR_POOL_CAPACITY_EXCEEDED);
    cube_memory_usage u1 = m_usage();
    m_expect_usage_equal(&u1, &u0);
    /* The tail has no cap. */
    cube_handle t = conf_empty(4 * p + 1);
    r = m_report();
    assert_int_equal(m_tail(&r)->buffers, 1);

    /* Room again once a buffer goes. */
    m_release(big);
    cube_handle y = conf_empty(p);
    r = m_report();
    assert_int_equal(r.pools[1].buffers, 1);
    m_release(y);
    m_release(x);
    m_release(t);
    m_leave();
}

/* --- cleanup --- */

CONF_TEST(memory_cleanup_releases_what_nothing_uses_and_never_a_live_buffer)
{
    m_enter();
    uint64_t a = m_a();
    cube_memory_layout l = m_layout3();
    CONF_OK(cube_install_memory_pools(conf.client, &l));

    /* Live: one buffer in each pool, the tail and the persistent pool. */
    const uint64_t live_sizes[5] = {40 * a + 1, 200 * a + 3, 2000 * a,
                                    M_MAX2(a) + 11, 5 * a + 1};
    cube_handle live[5];
    unsigned char *keep[5];
    for (int i = 0; i < 4; i++)
        live[i] = m_filled(live_sizes[i], 100 + (uint32_t)i, &keep[i]);
    CONF_OK(cube_persistent_begin(conf.client));
    live[4] = m_filled(live_sizes[4], 104, &keep[4]);
    cube_handle ptmp = conf_empty(7 * a);
    CONF_OK(cube_persistent_end(conf.client));

    /* Unused: pages of pool 0 and 1 emptied again, an exclusive page, a
     * tail buffer and a persistent buffer, all released. */
    enum { T0 = 20, T1 = 12 };
    cube_handle tmp[T0 + T1 + 2];
    size_t n = 0;
    for (int i = 0; i < T0; i++)
        tmp[n++] = conf_empty(M_MAX0(a));
    for (int i = 0; i < T1; i++)
        tmp[n++] = conf_empty(M_MAX1(a));
    tmp[n++] = conf_empty(3000 * a);
    tmp[n++] = conf_empty(2 * M_MAX2(a));
    for (size_t i = 0; i < n; i++)
        conf_release(tmp[i]);
    conf_release(ptmp);
    CONF_OK(cube_sync(conf.client, NULL, 0));

    cube_memory_report before = m_report();
    assert_true(before.pools[0].pages >= 2);
    assert_true(before.pools[1].pages >= 2);
    CONF_OK(cube_memory_cleanup(conf.client));
    cube_memory_report after = m_report();

    /* Nothing live changed; less is held. */
    assert_int_equal(after.usage.buffers, before.usage.buffers);
    assert_int_equal(after.usage.bytes_in_use, before.usage.bytes_in_use);
    assert_true(after.usage.bytes_reserved < before.usage.bytes_reserved);
    m_expect_sums(&after);
    /* Each sliced pool keeps the one page with a live slice. */
    assert_int_equal(after.pools[0].pages, 1);
    assert_int_equal(after.pools[0].bytes_reserved, l.pools[0].page_size);
    assert_int_equal(after.pools[1].pages, 1);
    assert_int_equal(after.pools[1].bytes_reserved, l.pools[1].page_size);
    /* The exclusive pool keeps the live buffer's page only. */
    assert_true(before.pools[2].pages >= 2);
    assert_int_equal(after.pools[2].pages, 1);
    assert_true(after.pools[2].bytes_reserved >= live_sizes[2]);
    assert_true(after.pools[2].bytes_reserved <= l.pools[2].page_size);
    /* The tail keeps the live buffer only. */
    const cube_pool_report *tail = m_tail(&after);
    assert_int_equal(tail->buffers, 1);
    assert_true(tail->bytes_reserved <=
                m_round_up(live_sizes[3], a) + m_slack());
    /* The persistent pool keeps the live buffer, not the released one. */
    const cube_pool_report *pers = m_persistent(&after);
    assert_int_equal(pers->buffers, 1);
    assert_true(pers->bytes_reserved >= live_sizes[4]);
    assert_true(pers->bytes_reserved < live_sizes[4] + 7 * a);

    /* Twice is fine; every live buffer reads back intact. */
    CONF_OK(cube_memory_cleanup(conf.client));
    for (int i = 0; i < 5; i++) {
        m_expect_contents(live[i], keep[i], live_sizes[i]);
        m_release(live[i]);
    }
    m_leave();
}

static void m_expect_json_u64(json_t *obj, const char *key, uint64_t want);

/* A size the expandable preset's last pool takes, over 1 MiB (its own
 * least size where that is larger). */
static uint64_t m_expandable_least(const cube_memory_layout *l)
{
    uint64_t least = l->pools[l->count - 1].min_size;
    return least > (1ull << 20) ? least : (1ull << 20) + 1;
}

/* The expandable preset: a sliced pool for small sizes, then one pool over
 * a reserved address range whose pages are mapped as buffers need them.
 * A backend whose buffers are host memory (CUBE_FEATURE_HOST_MEMORY) has
 * the virtual memory it needs; a backend without it refuses the layout with
 * CUBE_ERR_UNSUPPORTED and keeps the one it had, and the test is skipped there.
 */
CONF_TEST(
    memory_expandable_pool_maps_what_buffers_use_and_cleanup_unmaps_the_rest)
{
    m_enter();
    cube_memory_layout l = m_preset(CUBE_PRESET_EXPANDABLE);
    CONF_OK(cube_memory_layout_validate(conf.client, &l));
    uint32_t e = l.count - 1;
    assert_int_equal(l.pools[e].kind, CUBE_POOL_EXPANDABLE);
    cube_error *err = cube_install_memory_pools(conf.client, &l);
    if (err && cube_error_code(err) == CUBE_ERR_UNSUPPORTED) {
        if (m_host())
            CONF_OK(err); /* fails, printing it */
        cube_error_free(err);
        cube_memory_layout def = m_preset(CUBE_PRESET_SUBSLICES);
        cube_memory_report r = m_report();
        assert_int_equal(r.count, def.count + 2);
        m_leave();
        skip();
    }
    CONF_OK(err);

    /* Three buffers in the expandable pool, one in a sliced pool; the
     * smallest over 1 MiB, so that they span pages (2 MiB on the host and
     * on GPUs) and the middle one's inside can be unmapped alone. */
    uint64_t lo = m_expandable_least(&l);
    const uint64_t sizes[4] = {lo + 5, 3 * lo + 1000, 8 * lo, 100};
    cube_handle h[4];
    unsigned char *keep[4];
    uint64_t in_use = 0;
    for (int i = 0; i < 4; i++) {
        h[i] = m_filled(sizes[i], 300 + (uint32_t)i, &keep[i]);
        if (i < 3)
            in_use += sizes[i];
    }
    cube_memory_report r = m_report();
    m_expect_sums(&r);
    const cube_pool_report *p = &r.pools[e];
    assert_int_equal(p->config.kind, CUBE_POOL_EXPANDABLE);
    assert_int_equal(p->buffers, 3);
    assert_int_equal(p->bytes_in_use, in_use);
    assert_true(p->bytes_reserved >= in_use);
    /* Reserved bytes are whole mapped pages of one size, a power of two. */
    assert_true(p->pages > 0);
    assert_int_equal(p->bytes_reserved % p->pages, 0);
    uint64_t page = p->bytes_reserved / p->pages;
    assert_int_equal(page & (page - 1), 0);
    /* No more than the buffers' pages and one shared page each side. */
    assert_true(p->bytes_reserved <= in_use + 6 * page);

    char *text = cube_memory_report_format(&r, CUBE_REPORT_TABLE);
    assert_non_null(text);
    int named = strstr(text, "expandable") != NULL;
    free(text);
    assert_true(named);
    text = cube_memory_report_format(&r, CUBE_REPORT_JSON);
    assert_non_null(text);
    json_error_t jerr;
    json_t *j = json_loads(text, 0, &jerr);
    free(text);
    assert_non_null(j);
    json_t *jp = json_array_get(json_object_get(j, "pools"), e);
    assert_string_equal(json_string_value(json_object_get(jp, "kind")),
                        "expandable");
    m_expect_json_u64(jp, "bytes_reserved", p->bytes_reserved);
    m_expect_json_u64(jp, "pages", p->pages);
    json_decref(j);

    /* The middle one goes and its pages stay mapped (a release never
     * unmaps); a cleanup unmaps the pages no live buffer touches, and the
     * others read back intact. */
    m_release(h[1]);
    cube_memory_report mid = m_report();
    assert_int_equal(mid.pools[e].buffers, 2);
    assert_int_equal(mid.pools[e].bytes_reserved, p->bytes_reserved);
    CONF_OK(cube_memory_cleanup(conf.client));
    cube_memory_report cleaned = m_report();
    m_expect_sums(&cleaned);
    assert_true(cleaned.pools[e].bytes_reserved < p->bytes_reserved);
    assert_true(cleaned.pools[e].bytes_reserved >= sizes[0] + sizes[2]);
    m_expect_contents(h[0], keep[0], sizes[0]);
    m_expect_contents(h[2], keep[2], sizes[2]);
    m_expect_contents(h[3], keep[3], sizes[3]);
    free(keep[1]);
    /* Asked again, the same size is served; then everything goes back. */
    h[1] = m_filled(sizes[1], 301, &keep[1]);
    m_expect_contents(h[1], keep[1], sizes[1]);
    for (int i = 0; i < 4; i++)
        m_release(h[i]);
    cube_memory_report idle = m_report();
    assert_int_equal(idle.pools[e].buffers, 0);
    assert_true(idle.pools[e].bytes_reserved > 0); /* cached */
    CONF_OK(cube_memory_cleanup(conf.client));
    cube_memory_report none = m_report();
    assert_int_equal(none.pools[e].bytes_reserved, 0);
    assert_int_equal(none.pools[e].pages, 0);
    assert_true(none.pools[e].bytes_reserved_peak >= in_use);
    assert_true(none.pools[e].pages_peak >= p->pages);
    m_leave();
}

/* A graph pins every buffer it names, so an expandable pool keeps their
 * pages mapped through a cleanup after their handles are gone: the replay
 * reads and writes every page of them (on the host backends an unmapped
 * page faults; on a GPU it is an illegal address). Once the graph is
 * destroyed, a cleanup unmaps them. */
CONF_TEST_NEEDS(
    memory_expandable_pool_keeps_a_live_graphs_buffers_mapped_through_cleanup,
    CUBE_FEATURE_KERNELS)
{
    m_enter();
    cube_memory_layout l = m_preset(CUBE_PRESET_EXPANDABLE);
    uint32_t e = l.count - 1;
    cube_error *err = cube_install_memory_pools(conf.client, &l);
    if (err && cube_error_code(err) == CUBE_ERR_UNSUPPORTED && !m_host()) {
        cube_error_free(err);
        m_leave();
        skip();
    }
    CONF_OK(err);
    /* Three buffers of the expandable pool, over several pages each. */
    const uint64_t n = (2 * m_expandable_least(&l) + 4096) / 4;
    const uint64_t bytes = n * 4;
    float *x0 = malloc(bytes), *got = malloc(bytes);
    assert_non_null(x0);
    assert_non_null(got);
    for (uint64_t i = 0; i < n; i++)
        x0[i] = 1.0f + (float)(i % 1000);
    cube_handle x = conf_create(x0, bytes);
    cube_handle y = conf_empty(bytes), w = conf_empty(bytes);
    cube_count count = cube_count_static(conf_div_up(n, 64), 1, 1);
    cube_arg a1[3] = {cube_arg_buffer(x), cube_arg_buffer(y), cube_arg_f32(-1)};
    cube_arg a2[3] = {cube_arg_buffer(y), cube_arg_buffer(w), cube_arg_f32(2)};
    CONF_OK(cube_graph_prepare(conf.client));
    CONF_OK(conf_launch(conf.k.scale, count, a1, 3, CUBE_LAUNCH_EXECUTE));
    CONF_OK(conf_launch(conf.k.scale, count, a2, 3, CUBE_LAUNCH_EXECUTE));
    CONF_OK(cube_graph_begin(conf.client));
    CONF_OK(conf_launch(conf.k.scale, count, a1, 3, CUBE_LAUNCH_EXECUTE));
    CONF_OK(conf_launch(conf.k.scale, count, a2, 3, CUBE_LAUNCH_EXECUTE));
    cube_graph_id id = 0;
    CONF_OK(cube_graph_end(conf.client, &id));

    /* x and y are the graph's alone now; the cleanup leaves them mapped. */
    m_release(x);
    m_release(y);
    CONF_OK(cube_memory_cleanup(conf.client));
    cube_memory_report r = m_report();
    m_expect_sums(&r);
    assert_int_equal(r.pools[e].buffers, 3);
    assert_true(r.pools[e].bytes_reserved >= 3 * bytes);
    memset(got, 0, bytes);
    CONF_WRITE_OK(w, got, bytes);
    CONF_OK(cube_graph_replay(conf.client, id));
    CONF_READ_OK(w, got, bytes);
    for (uint64_t i = 0; i < n; i++)
        if (got[i] != -2 * x0[i]) {
            print_error("element %llu is %g, expected %g\n",
                        (unsigned long long)i, (double)got[i],
                        (double)(-2 * x0[i]));
            fail();
        }

    /* Destroyed, the graph lets its buffers go: their pages are unmapped. */
    CONF_OK(cube_graph_destroy(conf.client, id));
    CONF_OK(cube_sync(conf.client, NULL, 0));
    CONF_OK(cube_memory_cleanup(conf.client));
    cube_memory_report after = m_report();
    uint64_t page = r.pools[e].bytes_reserved / r.pools[e].pages;
    assert_int_equal(after.pools[e].buffers, 1);
    assert_true(after.pools[e].bytes_reserved < r.pools[e].bytes_reserved);
    assert_true(after.pools[e].bytes_reserved >= bytes);
    assert_true(after.pools[e].bytes_reserved <= bytes + 2 * page);
    m_release(w);
    free(x0);
    free(got);
    m_leave();
}

/* --- allocation modes --- */

CONF_TEST(memory_persistent_mode_routes_to_the_persistent_pool_auto_routes_back)
{
    m_enter();
    CONF_OK(cube_allocation_mode_set(conf.client, CUBE_ALLOC_PERSISTENT));
    cube_handle x = conf_empty(1000);
    cube_memory_report r = m_report();
    assert_int_equal(m_persistent(&r)->buffers, 1);
    assert_int_equal(m_persistent(&r)->bytes_in_use, 1000);
    assert_int_equal(m_dynamic_buffers(&r), 0);

    CONF_OK(cube_allocation_mode_set(conf.client, CUBE_ALLOC_AUTO));
    cube_handle y = conf_empty(1000);
    r = m_report();
    assert_int_equal(m_persistent(&r)->buffers, 1);
    assert_int_equal(m_dynamic_buffers(&r), 1);

    /* Not a mode: refused, and the mode stays auto. */
    CONF_EXPECT_MSG(
        cube_allocation_mode_set(conf.client, (cube_allocation_mode)7),
        CUBE_ERR_INVALID_ARGUMENT, "mode");
    cube_handle z = conf_empty(1000);
    r = m_report();
    assert_int_equal(m_persistent(&r)->buffers, 1);
    assert_int_equal(m_dynamic_buffers(&r), 2);
    m_release(x);
    m_release(y);
    m_release(z);
    m_leave();
}

CONF_TEST(memory_persistent_pool_reuses_a_released_buffer_of_the_same_size)
{
    m_enter();
    CONF_OK(cube_allocation_mode_set(conf.client, CUBE_ALLOC_PERSISTENT));
    m_release(conf_empty(3000));
    cube_memory_report r = m_report();
    const cube_pool_report held = *m_persistent(&r);
    assert_int_equal(held.buffers, 0);
    assert_true(held.bytes_reserved >= 3000);
    cube_handle h = conf_empty(3000);
    r = m_report();
    assert_int_equal(m_persistent(&r)->buffers, 1);
    assert_int_equal(m_persistent(&r)->bytes_reserved, held.bytes_reserved);
    assert_int_equal(m_persistent(&r)->pages, held.pages);
    CONF_OK(cube_allocation_mode_set(conf.client, CUBE_ALLOC_AUTO));
    m_release(h);
    m_leave();
}

CONF_TEST(memory_persistent_windows_nest_and_end_without_begin_is_invalid)
{
    m_enter();
    cube_handle h[6];
    uint64_t want_persistent = 0, want_dynamic = 0;
    cube_memory_report r;
#define M_ALLOC_EXPECT(i, persistent)                                          \
    do {                                                                       \
        h[i] = conf_empty(100 + (i));                                          \
        if (persistent)                                                        \
            want_persistent++;                                                 \
        else                                                                   \
            want_dynamic++;                                                    \
        r = m_report();                                                        \
        assert_int_equal(m_persistent(&r)->buffers, want_persistent);          \
        assert_int_equal(m_dynamic_buffers(&r), want_dynamic);                 \
    } while (0)

    CONF_OK(cube_persistent_begin(conf.client));
    CONF_OK(cube_persistent_begin(conf.client));
    CONF_OK(cube_persistent_end(conf.client));
    M_ALLOC_EXPECT(0, 1); /* one window still open */
    CONF_OK(cube_persistent_end(conf.client));
    M_ALLOC_EXPECT(1, 0);
    CONF_EXPECT(cube_persistent_end(conf.client), CUBE_ERR_INVALID_ARGUMENT);
    M_ALLOC_EXPECT(2, 0); /* the refused end changed nothing */
    /* A window does not end persistent mode. */
    CONF_OK(cube_allocation_mode_set(conf.client, CUBE_ALLOC_PERSISTENT));
    CONF_OK(cube_persistent_begin(conf.client));
    CONF_OK(cube_persistent_end(conf.client));
    M_ALLOC_EXPECT(3, 1);
    /* Nor does auto mode end an open window. */
    CONF_OK(cube_persistent_begin(conf.client));
    CONF_OK(cube_allocation_mode_set(conf.client, CUBE_ALLOC_AUTO));
    M_ALLOC_EXPECT(4, 1);
    CONF_OK(cube_persistent_end(conf.client));
    M_ALLOC_EXPECT(5, 0);
#undef M_ALLOC_EXPECT
    for (int i = 0; i < 6; i++)
        m_release(h[i]);
    m_leave();
}

CONF_TEST(memory_graph_prepare_allocates_persistently_until_graph_end)
{
    m_enter();
    CONF_OK(cube_graph_prepare(conf.client));
    cube_handle warm = conf_empty(4096); /* the warm-up's buffer */
    /* A second warm-up buffer, released: the capture's buffer reuses its
     * memory (device graphs refuse a capture that needs new memory). */
    m_release(conf_empty(4096));
    cube_memory_report r = m_report();
    assert_int_equal(m_persistent(&r)->buffers, 1);
    assert_int_equal(m_dynamic_buffers(&r), 0);
    CONF_OK(cube_graph_begin(conf.client));
    cube_handle inside = conf_empty(4096);
    r = m_report();
    assert_int_equal(m_persistent(&r)->buffers, 2);
    assert_int_equal(m_dynamic_buffers(&r), 0);
    cube_graph_id g = 0;
    CONF_OK(cube_graph_end(conf.client, &g));
    assert_true(g != 0);
    cube_handle after = conf_empty(4096);
    r = m_report();
    assert_int_equal(m_persistent(&r)->buffers, 2);
    assert_int_equal(m_dynamic_buffers(&r), 1);
    CONF_OK(cube_graph_destroy(conf.client, g));
    m_release(warm);
    m_release(inside);
    m_release(after);
    m_leave();
}

/* --- the report as text --- */

/* A stream with a buffer in each entry of m_layout3's report. */
static void m_fill_every_entry(cube_handle h[5])
{
    uint64_t a = m_a();
    h[0] = conf_empty(10 * a);
    h[1] = conf_empty(100 * a);
    h[2] = conf_empty(2000 * a);
    h[3] = conf_empty(M_MAX2(a) + 1);
    CONF_OK(cube_persistent_begin(conf.client));
    h[4] = conf_empty(3 * a);
    CONF_OK(cube_persistent_end(conf.client));
}

CONF_TEST(memory_report_format_table_names_every_pool_kind)
{
    m_enter();
    cube_memory_layout l = m_layout3();
    CONF_OK(cube_install_memory_pools(conf.client, &l));
    cube_handle h[5];
    m_fill_every_entry(h);
    cube_memory_report r = m_report();
    char *text = cube_memory_report_format(&r, CUBE_REPORT_TABLE);
    assert_non_null(text);
    int ok = strstr(text, "sliced") && strstr(text, "exclusive") &&
             strstr(text, "persistent");
    uint32_t lines = 0;
    for (const char *c = text; *c; c++)
        lines += *c == '\n';
    if (!ok || lines < r.count)
        print_error("the table:\n%s", text);
    free(text);
    assert_true(ok);
    assert_true(lines >= r.count); /* one line per pool */
    assert_null(cube_memory_report_format(NULL, CUBE_REPORT_TABLE));
    assert_null(cube_memory_report_format(NULL, CUBE_REPORT_JSON));
    for (int i = 0; i < 5; i++)
        m_release(h[i]);
    m_leave();
}

static void m_expect_json_u64(json_t *obj, const char *key, uint64_t want)
{
    json_t *v = json_object_get(obj, key);
    if (!json_is_integer(v))
        fail_msg("the JSON report has no integer \"%s\"", key);
    assert_int_equal((uint64_t)json_integer_value(v), want);
}

CONF_TEST(memory_report_format_json_parses_with_pools_and_usage)
{
    m_enter();
    cube_memory_layout l = m_layout3();
    CONF_OK(cube_install_memory_pools(conf.client, &l));
    cube_handle h[5];
    m_fill_every_entry(h);
    cube_memory_report r = m_report();
    char *text = cube_memory_report_format(&r, CUBE_REPORT_JSON);
    assert_non_null(text);
    json_error_t jerr;
    json_t *root = json_loads(text, 0, &jerr);
    if (!root)
        print_error("the JSON report does not parse (line %d: %s):\n%s",
                    jerr.line, jerr.text, text);
    free(text);
    assert_non_null(root);
    assert_true(json_is_object(root));

    json_t *pools = json_object_get(root, "pools");
    assert_true(json_is_array(pools));
    assert_int_equal(json_array_size(pools), r.count);
    for (size_t i = 0; i < json_array_size(pools); i++) {
        json_t *p = json_array_get(pools, i);
        assert_true(json_is_object(p));
        if (json_object_get(p, "buffers"))
            m_expect_json_u64(p, "buffers", r.pools[i].buffers);
        if (json_object_get(p, "bytes_in_use"))
            m_expect_json_u64(p, "bytes_in_use", r.pools[i].bytes_in_use);
    }
    json_t *usage = json_object_get(root, "usage");
    assert_true(json_is_object(usage));
    m_expect_json_u64(usage, "buffers", r.usage.buffers);
    m_expect_json_u64(usage, "bytes_in_use", r.usage.bytes_in_use);
    m_expect_json_u64(usage, "bytes_padding", r.usage.bytes_padding);
    m_expect_json_u64(usage, "bytes_reserved", r.usage.bytes_reserved);
    json_decref(root);
    for (int i = 0; i < 5; i++)
        m_release(h[i]);
    m_leave();
}

CONF_TEST(memory_report_format_refuses_a_count_above_its_array)
{
    /* A report holds at most CUBE_MAX_POOLS + 2 entries: a count above
     * that is not a report cube_memory_report_get filled, and formatting
     * it would read past the caller's struct. It is refused (NULL) in
     * both formats; a full array still formats. */
    m_enter();
    cube_memory_report r = m_report();
    const uint32_t full = CUBE_MAX_POOLS + 2;
    assert_int_equal(sizeof r.pools / sizeof r.pools[0], full);
    const uint32_t bad[3] = {full + 1, 1u << 20, UINT32_MAX};
    for (int i = 0; i < 3; i++) {
        r.count = bad[i];
        assert_null(cube_memory_report_format(&r, CUBE_REPORT_TABLE));
        assert_null(cube_memory_report_format(&r, CUBE_REPORT_JSON));
    }
    r.count = full;
    for (int f = CUBE_REPORT_TABLE; f <= CUBE_REPORT_JSON; f++) {
        char *text = cube_memory_report_format(&r, (cube_report_format)f);
        assert_non_null(text);
        free(text);
    }
    m_leave();
}

/* --- layouts of data --- */

CONF_TEST(memory_layout_strides_contiguous_and_pitched)
{
    const struct {
        cube_layout_policy policy;
        uint32_t rank;
        uint64_t shape[3];
        uint32_t elem;
        uint64_t pitch;
        uint64_t strides[3];
        uint64_t bytes;
    } cases[] = {
        /* dense row-major; pitch_align is not used */
        {CUBE_LAYOUT_CONTIGUOUS, 3, {3, 5, 7}, 4, 0, {35, 7, 1}, 105 * 4},
        {CUBE_LAYOUT_CONTIGUOUS, 1, {10}, 8, 0, {1}, 80},
        /* 3 x 5 floats, rows padded to 64 bytes: 16 floats */
        {CUBE_LAYOUT_PITCHED, 2, {3, 5}, 4, 64, {16, 1}, (2 * 16 + 5) * 4},
        /* a single row has no pitch */
        {CUBE_LAYOUT_PITCHED, 1, {10}, 4, 64, {1}, 40},
        /* rows already a multiple of the pitch */
        {CUBE_LAYOUT_PITCHED, 2, {4, 16}, 4, 64, {16, 1}, 256},
        /* only the rows are padded */
        {CUBE_LAYOUT_PITCHED, 3, {2, 3, 5}, 4, 64, {48, 16, 1}, 85 * 4},
        /* the pitch holds whole elements: 192 bytes, 16 of 12 */
        {CUBE_LAYOUT_PITCHED, 2, {2, 5}, 12, 64, {16, 1}, 21 * 12},
        /* pitch_align 1 pads nothing */
        {CUBE_LAYOUT_PITCHED, 2, {3, 5}, 4, 1, {5, 1}, 60},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        uint64_t strides[CUBE_MAX_RANK], bytes = 0;
        memset(strides, 0xEE, sizeof strides);
        CONF_OK(cube_layout_strides(cases[i].policy, cases[i].rank,
                                    cases[i].shape, cases[i].elem,
                                    cases[i].pitch, strides, &bytes));
        for (uint32_t k = 0; k < cases[i].rank; k++) {
            if (strides[k] != cases[i].strides[k])
                print_error("case %zu: strides[%u] is %llu, expected %llu\n", i,
                            k, (unsigned long long)strides[k],
                            (unsigned long long)cases[i].strides[k]);
            assert_int_equal(strides[k], cases[i].strides[k]);
        }
        if (bytes != cases[i].bytes)
            print_error("case %zu: %llu bytes, expected %llu\n", i,
                        (unsigned long long)bytes,
                        (unsigned long long)cases[i].bytes);
        assert_int_equal(bytes, cases[i].bytes);
    }
    /* Rank 8, the most. */
    uint64_t shape8[CUBE_MAX_RANK], strides8[CUBE_MAX_RANK], bytes8 = 0;
    for (int k = 0; k < CUBE_MAX_RANK; k++)
        shape8[k] = 2;
    CONF_OK(cube_layout_strides(CUBE_LAYOUT_CONTIGUOUS, CUBE_MAX_RANK, shape8,
                                1, 0, strides8, &bytes8));
    assert_int_equal(strides8[0], 128);
    assert_int_equal(bytes8, 256);
}

CONF_TEST(memory_layout_strides_bad_inputs_are_invalid_argument)
{
    const uint64_t shape[CUBE_MAX_RANK + 1] = {3, 5, 1, 1, 1, 1, 1, 1, 1};
    const uint64_t zero[2] = {3, 0};
    const uint64_t huge[2] = {1ull << 40, 1ull << 40};
    const uint64_t long_row[1] = {1ull << 62};
    const uint64_t wide_rows[2] = {1ull << 60, UINT64_MAX / 4};
    uint64_t strides[CUBE_MAX_RANK + 1], bytes;
    int misses = 0;
    const cube_layout_policy C = CUBE_LAYOUT_CONTIGUOUS;
    const cube_layout_policy P = CUBE_LAYOUT_PITCHED;

    CONF_EXPECT_NAMED(cube_layout_strides(C, 0, shape, 4, 0, strides, &bytes),
                      CUBE_ERR_INVALID_ARGUMENT, "rank", &misses);
    CONF_EXPECT_NAMED(
        cube_layout_strides(C, CUBE_MAX_RANK + 1, shape, 4, 0, strides, &bytes),
        CUBE_ERR_INVALID_ARGUMENT, "rank", &misses);
    CONF_EXPECT_NAMED(cube_layout_strides(C, 2, zero, 4, 0, strides, &bytes),
                      CUBE_ERR_INVALID_ARGUMENT, "shape", &misses);
    CONF_EXPECT_NAMED(cube_layout_strides(P, 2, zero, 4, 64, strides, &bytes),
                      CUBE_ERR_INVALID_ARGUMENT, "shape", &misses);
    CONF_EXPECT_NAMED(cube_layout_strides(C, 2, shape, 0, 0, strides, &bytes),
                      CUBE_ERR_INVALID_ARGUMENT, "elem_size", &misses);
    CONF_EXPECT_NAMED(cube_layout_strides(P, 2, shape, 4, 0, strides, &bytes),
                      CUBE_ERR_INVALID_ARGUMENT, "pitch_align", &misses);
    CONF_EXPECT_NAMED(cube_layout_strides(P, 2, shape, 4, 48, strides, &bytes),
                      CUBE_ERR_INVALID_ARGUMENT, "pitch_align", &misses);
    CONF_EXPECT_NAMED(cube_layout_strides((cube_layout_policy)7, 2, shape, 4,
                                          64, strides, &bytes),
                      CUBE_ERR_INVALID_ARGUMENT, "policy", &misses);
    /* Overflow: of the element count, of the bytes, of a padded row. */
    CONF_EXPECT(cube_layout_strides(C, 2, huge, 8, 0, strides, &bytes),
                CUBE_ERR_INVALID_ARGUMENT);
    CONF_EXPECT(cube_layout_strides(C, 1, long_row, 8, 0, strides, &bytes),
                CUBE_ERR_INVALID_ARGUMENT);
    CONF_EXPECT(cube_layout_strides(P, 2, wide_rows, 4, 64, strides, &bytes),
                CUBE_ERR_INVALID_ARGUMENT);
    CONF_EXPECT(cube_layout_strides(P, 2, huge, 8, 1ull << 63, strides, &bytes),
                CUBE_ERR_INVALID_ARGUMENT);
    if (misses)
        fail_msg("%d INVALID_ARGUMENT messages do not name their argument",
                 misses);
}

/* --- NULL arguments --- */

CONF_TEST(memory_null_arguments_are_invalid_argument_naming_the_argument)
{
    cube_client *c = conf.client;
    cube_memory_layout l = m_preset(CUBE_PRESET_SUBSLICES);
    cube_memory_report r;
    const uint64_t shape[2] = {3, 5};
    uint64_t strides[2], bytes;
    int misses = 0;

    CONF_EXPECT_NAMED(
        cube_memory_layout_preset(NULL, CUBE_PRESET_SUBSLICES, &l),
        CUBE_ERR_INVALID_ARGUMENT, "client", &misses);
    CONF_EXPECT_NAMED(cube_memory_layout_preset(c, CUBE_PRESET_SUBSLICES, NULL),
                      CUBE_ERR_INVALID_ARGUMENT, "out", &misses);
    CONF_EXPECT_NAMED(cube_memory_layout_validate(NULL, &l),
                      CUBE_ERR_INVALID_ARGUMENT, "client", &misses);
    CONF_EXPECT_NAMED(cube_memory_layout_validate(c, NULL),
                      CUBE_ERR_INVALID_ARGUMENT, "layout", &misses);
    CONF_EXPECT_NAMED(cube_install_memory_pools(NULL, &l),
                      CUBE_ERR_INVALID_ARGUMENT, "client", &misses);
    CONF_EXPECT_NAMED(cube_install_memory_pools(c, NULL),
                      CUBE_ERR_INVALID_ARGUMENT, "layout", &misses);
    CONF_EXPECT_NAMED(cube_memory_report_get(NULL, &r),
                      CUBE_ERR_INVALID_ARGUMENT, "client", &misses);
    CONF_EXPECT_NAMED(cube_memory_report_get(c, NULL),
                      CUBE_ERR_INVALID_ARGUMENT, "out", &misses);
    CONF_EXPECT_NAMED(cube_memory_reset_peaks(NULL), CUBE_ERR_INVALID_ARGUMENT,
                      "client", &misses);
    CONF_EXPECT_NAMED(cube_allocation_mode_set(NULL, CUBE_ALLOC_AUTO),
                      CUBE_ERR_INVALID_ARGUMENT, "client", &misses);
    CONF_EXPECT_NAMED(cube_persistent_begin(NULL), CUBE_ERR_INVALID_ARGUMENT,
                      "client", &misses);
    CONF_EXPECT_NAMED(cube_persistent_end(NULL), CUBE_ERR_INVALID_ARGUMENT,
                      "client", &misses);
    CONF_EXPECT_NAMED(cube_layout_strides(CUBE_LAYOUT_CONTIGUOUS, 2, NULL, 4, 0,
                                          strides, &bytes),
                      CUBE_ERR_INVALID_ARGUMENT, "shape", &misses);
    CONF_EXPECT_NAMED(cube_layout_strides(CUBE_LAYOUT_CONTIGUOUS, 2, shape, 4,
                                          0, NULL, &bytes),
                      CUBE_ERR_INVALID_ARGUMENT, "strides", &misses);
    CONF_EXPECT_NAMED(cube_layout_strides(CUBE_LAYOUT_CONTIGUOUS, 2, shape, 4,
                                          0, strides, NULL),
                      CUBE_ERR_INVALID_ARGUMENT, "bytes", &misses);
    assert_null(cube_memory_report_format(NULL, CUBE_REPORT_TABLE));
    /* None of this changed the calling stream's mode: the main stream
     * still allocates from its dynamic pools. */
    cube_memory_report before = m_report();
    cube_handle h = conf_empty(64);
    r = m_report();
    assert_int_equal(m_persistent(&r)->buffers, m_persistent(&before)->buffers);
    assert_int_equal(m_dynamic_buffers(&r), m_dynamic_buffers(&before) + 1);
    m_release(h);
    if (misses)
        fail_msg("%d INVALID_ARGUMENT messages do not name their argument",
                 misses);
}

/* --- dry runs --- */

CONF_TEST(memory_dry_run_buffers_get_memory_at_first_real_use)
{
    /* Inside a dry-run scope a buffer is handed out without memory; the
     * first real use outside the scope backs it, and it then behaves like
     * any other buffer. */
    m_enter();
    cube_memory_usage u0 = m_usage();
    CONF_OK(cube_dry_run_begin(conf.client));
    cube_handle h = {0};
    cube_error *err = cube_empty(conf.client, 1000, &h);
    cube_memory_usage u1 = m_usage();
    cube_handle too_big = {0};
    cube_error *big =
        cube_empty(conf.client, conf.props.max_buffer_size + 1, &too_big);
    CONF_OK(cube_dry_run_end(conf.client));
    CONF_OK(err);
    /* No memory yet, and a size that can never fit is still refused. */
    assert_int_equal(u1.buffers, u0.buffers);
    assert_int_equal(u1.bytes_reserved, u0.bytes_reserved);
    CONF_EXPECT(big, CUBE_ERR_BUFFER_TOO_BIG);

    unsigned char src[1000], back[1000];
    for (int i = 0; i < 1000; i++)
        src[i] = (unsigned char)(i * 7 + 3);
    CONF_WRITE_OK(h, src, sizeof src);
    cube_memory_usage u2 = m_usage();
    assert_int_equal(u2.buffers, u0.buffers + 1);
    assert_int_equal(u2.bytes_in_use, u0.bytes_in_use + 1000);
    CONF_READ_OK(h, back, sizeof back);
    assert_memory_equal(src, back, sizeof src);
    m_release(h);
    m_leave();
}

CONF_TEST(memory_dry_run_buffer_without_memory_passes_sync_and_check)
{
    /* A buffer made in a dry run has no memory until its first real use.
     * Never written, it has nothing to wait for: cube_sync and cube_check
     * of it succeed, inside the scope and after it, without backing it;
     * its first write then backs it as usual. */
    m_enter();
    cube_memory_usage u0 = m_usage();
    CONF_OK(cube_dry_run_begin(conf.client));
    cube_handle h = {0};
    cube_error *made = cube_empty(conf.client, 64, &h);
    cube_error *synced = made ? NULL : cube_sync(conf.client, &h, 1);
    cube_error *checked = made ? NULL : cube_check(conf.client, &h, 1);
    CONF_OK(cube_dry_run_end(conf.client));
    CONF_OK(made);
    CONF_OK(synced);
    CONF_OK(checked);
    /* Outside the scope, still unbacked, alone and beside a backed one. */
    cube_handle b = conf_empty(64);
    cube_handle both[2] = {h, b};
    CONF_OK(cube_sync(conf.client, &h, 1));
    CONF_OK(cube_sync(conf.client, both, 2));
    CONF_OK(cube_check(conf.client, both, 2));
    cube_memory_usage u1 = m_usage();
    assert_int_equal(u1.buffers, u0.buffers + 1); /* b only */
    unsigned char src[64], back[64];
    for (int i = 0; i < 64; i++)
        src[i] = (unsigned char)(i * 5 + 1);
    CONF_WRITE_OK(h, src, sizeof src);
    CONF_OK(cube_sync(conf.client, both, 2));
    CONF_READ_OK(h, back, sizeof back);
    assert_memory_equal(src, back, sizeof src);
    assert_int_equal(m_usage().buffers, u0.buffers + 2);
    m_release(b);
    m_release(h);
    m_leave();
}

CONF_TEST(memory_dry_run_buffer_that_cannot_be_backed_is_storage_mapping_failed)
{
    /* Backing at first use can fail like any allocation: the call reports
     * CUBE_ERR_STORAGE_MAPPING_FAILED (the cause says why) and reads of
     * the buffer are refused until it is backed. */
    m_enter();
    uint64_t p = 256 * m_a();
    cube_memory_layout l = m_layout_capped();
    CONF_OK(cube_install_memory_pools(conf.client, &l));
    CONF_OK(cube_dry_run_begin(conf.client));
    cube_handle a = {0}, b = {0};
    cube_error *ea = cube_empty(conf.client, 4 * p, &a);
    cube_error *eb = cube_empty(conf.client, 2 * p, &b);
    CONF_OK(cube_dry_run_end(conf.client));
    CONF_OK(ea);
    CONF_OK(eb);

    unsigned char *src = calloc(4 * p, 1);
    assert_non_null(src);
    /* a takes all of the only pool that holds 2 P... */
    CONF_WRITE_OK(a, src, 4 * p);
    /* ...so b cannot be backed. */
    cube_error *err = conf_write(b, src, 2 * p);
    CONF_CODE(err, CUBE_ERR_STORAGE_MAPPING_FAILED);
    assert_int_equal(cube_error_cause_count(err), 1);
    assert_int_equal(cube_error_code(cube_error_cause(err, 0)),
                     CUBE_ERR_POOL_CAPACITY_EXCEEDED);
    cube_error_free(err);
    err = conf_read(b, src, 2 * p);
    CONF_CODE(err, CUBE_ERR_SEVERAL);
    assert_int_equal(cube_error_code(cube_error_cause(err, 0)),
                     CUBE_ERR_STORAGE_MAPPING_FAILED);
    cube_error_free(err);

    /* Room again: the next write backs it and clears the failure. */
    m_release(a);
    CONF_WRITE_OK(b, src, 2 * p);
    CONF_READ_OK(b, src, 2 * p);
    m_release(b);
    free(src);
    m_leave();
}

CONF_TEST_NEEDS(
    memory_dry_run_buffer_that_cannot_be_backed_fails_its_launch_as_mapping,
    CUBE_FEATURE_KERNELS)
{
    /* A launch is a first real use too: a buffer that cannot be backed
     * then fails the launch with CUBE_ERR_STORAGE_MAPPING_FAILED (what
     * cube_launch documents), its cause the pool's
     * CUBE_ERR_POOL_CAPACITY_EXCEEDED; nothing ran. */
    m_enter();
    uint64_t p = 256 * m_a();
    cube_memory_layout l = m_layout_capped();
    CONF_OK(cube_install_memory_pools(conf.client, &l));
    CONF_OK(cube_dry_run_begin(conf.client));
    cube_handle a = {0}, b = {0};
    cube_error *ea = cube_empty(conf.client, 4 * p, &a);
    cube_error *eb = cube_empty(conf.client, 2 * p, &b);
    CONF_OK(cube_dry_run_end(conf.client));
    CONF_OK(ea);
    CONF_OK(eb);
    unsigned char *src = calloc(4 * p, 1);
    assert_non_null(src);
    CONF_WRITE_OK(a, src, 4 * p);
    uint32_t n = (uint32_t)(2 * p / 4);
    cube_arg args[2] = {cube_arg_buffer(b), cube_arg_u32(7)};
    cube_error *err =
        conf_launch(conf.k.fill, cube_count_static(conf_div_up(n, 32), 1, 1),
                    args, 2, CUBE_LAUNCH_EXECUTE);
    CONF_CODE(err, CUBE_ERR_STORAGE_MAPPING_FAILED);
    assert_int_equal(cube_error_cause_count(err), 1);
    assert_int_equal(cube_error_code(cube_error_cause(err, 0)),
                     CUBE_ERR_POOL_CAPACITY_EXCEEDED);
    cube_error_free(err);
    /* Room again: the launch backs it and runs. */
    m_release(a);
    CONF_OK(conf_launch(conf.k.fill,
                        cube_count_static(conf_div_up(n, 32), 1, 1), args, 2,
                        CUBE_LAUNCH_EXECUTE));
    uint32_t *got = (uint32_t *)src;
    CONF_READ_OK(b, got, 2 * p);
    for (uint32_t i = 0; i < n; i++)
        if (got[i] != 7 + i)
            fail_msg("element %u is %u, expected %u", i, got[i], 7 + i);
    m_release(b);
    free(src);
    m_leave();
}

/* --- totals over every stream --- */

typedef struct {
    cube_handle h[3];
    int go_on;
    pthread_mutex_t m;
    pthread_cond_t cv;
} usage_worker;

/* Allocates three buffers on its own stream, then waits to be told to
 * release them (on that same stream). */
static void *usage_worker_main(void *arg)
{
    usage_worker *w = arg;
    for (int i = 0; i < 3; i++)
        if (cube_empty(conf.client, 4096u << i, &w->h[i]))
            return NULL;
    pthread_mutex_lock(&w->m);
    w->go_on = 1;
    pthread_cond_broadcast(&w->cv);
    while (w->go_on != 2)
        pthread_cond_wait(&w->cv, &w->m);
    pthread_mutex_unlock(&w->m);
    for (int i = 0; i < 3; i++)
        cube_error_free(cube_handle_release(conf.client, w->h[i]));
    return NULL;
}

CONF_TEST(memory_usage_device_counts_every_thread_s_stream)
{
    cube_memory_usage before, mine, all;
    CONF_OK(cube_memory_usage_device(conf.client, &before));
    usage_worker w;
    memset(&w, 0, sizeof w);
    pthread_mutex_init(&w.m, NULL);
    pthread_cond_init(&w.cv, NULL);
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, usage_worker_main, &w), 0);
    pthread_mutex_lock(&w.m);
    while (w.go_on != 1)
        pthread_cond_wait(&w.cv, &w.m);
    pthread_mutex_unlock(&w.m);

    /* The worker's buffers are on its stream: this thread's usage does
     * not see them, the device's totals do. */
    CONF_OK(cube_memory_usage_get(conf.client, &mine));
    CONF_OK(cube_memory_usage_device(conf.client, &all));
    assert_true(all.buffers >= before.buffers + 3);
    assert_true(all.bytes_in_use >=
                before.bytes_in_use + 4096u + 8192u + 16384u);
    assert_true(all.buffers >= mine.buffers + 3);
    assert_true(all.bytes_reserved >= all.bytes_in_use);

    pthread_mutex_lock(&w.m);
    w.go_on = 2;
    pthread_cond_broadcast(&w.cv);
    pthread_mutex_unlock(&w.m);
    pthread_join(t, NULL);
    CONF_OK(cube_memory_usage_device(conf.client, &all));
    assert_int_equal(all.buffers, before.buffers);
    assert_int_equal(all.bytes_in_use, before.bytes_in_use);
    pthread_cond_destroy(&w.cv);
    pthread_mutex_destroy(&w.m);

    CONF_EXPECT(cube_memory_usage_device(NULL, &all),
                CUBE_ERR_INVALID_ARGUMENT);
    CONF_EXPECT(cube_memory_usage_device(conf.client, NULL),
                CUBE_ERR_INVALID_ARGUMENT);
}

/* cube_memory_stats_get: on a stream of its own, a miss then a hit, each
 * released; the device scope sums this stream with the others; the
 * struct's size field; bad input leaves the client usable. */
CONF_TEST(memory_stats_count_a_known_sequence)
{
    m_enter();
    cube_memory_stats st, all;
    memset(&st, 0, sizeof st);
    st.struct_size = sizeof st;
    CONF_OK(cube_memory_stats_get(conf.client, CUBE_MEMORY_STREAM, &st));
    assert_int_equal(st.struct_size, sizeof st);
    assert_int_equal(st.allocations, 0);

    cube_handle h = conf_empty(4 * m_a());
    m_release(h);
    h = conf_empty(4 * m_a());
    cube_memory_stats live;
    memset(&live, 0, sizeof live);
    live.struct_size = sizeof live;
    CONF_OK(cube_memory_stats_get(conf.client, CUBE_MEMORY_STREAM, &live));
    m_release(h);
    CONF_OK(cube_memory_stats_get(conf.client, CUBE_MEMORY_STREAM, &st));
    assert_int_equal(st.streams, 1);
    assert_int_equal(st.allocations, 2);
    assert_int_equal(st.releases, 2);
    assert_int_equal(st.pool_misses, 1);
    assert_int_equal(st.pool_hits, 1);
    assert_true(st.device_allocations >= 1);
    assert_int_equal(st.oom_events, 0);
    assert_int_equal(live.buffers, 1);
    assert_int_equal(live.allocated_bytes, 4 * m_a());
    assert_int_equal(st.buffers, 0);
    assert_int_equal(st.allocated_bytes, 0);
    assert_int_equal(st.allocated_bytes_peak, 4 * m_a());
    assert_true(st.reserved_bytes >= 4 * m_a());
    assert_int_equal(st.free_bytes, st.reserved_bytes);
    cube_memory_usage u;
    CONF_OK(cube_memory_usage_get(conf.client, &u));
    assert_int_equal(st.reserved_bytes, u.bytes_reserved);

    /* The device: this stream and every other one. */
    memset(&all, 0, sizeof all);
    all.struct_size = sizeof all;
    CONF_OK(cube_memory_stats_get(conf.client, CUBE_MEMORY_DEVICE, &all));
    assert_true(all.streams >= 2); /* the suite's main stream too */
    assert_true(all.allocations >= st.allocations + 1);
    assert_true(all.reserved_bytes >= st.reserved_bytes);

    /* A caller built against a larger struct: the fields known here are
     * filled, the rest untouched, struct_size says how much. */
    struct {
        cube_memory_stats s;
        uint64_t later;
    } big;
    memset(&big, 0, sizeof big);
    big.s.struct_size = sizeof big;
    big.later = 77;
    CONF_OK(cube_memory_stats_get(conf.client, CUBE_MEMORY_STREAM, &big.s));
    assert_int_equal(big.s.struct_size, sizeof(cube_memory_stats));
    assert_int_equal(big.s.allocations, 2);
    assert_int_equal(big.later, 77);

    /* Bad input. */
    CONF_EXPECT(cube_memory_stats_get(NULL, CUBE_MEMORY_STREAM, &st),
                CUBE_ERR_INVALID_ARGUMENT);
    CONF_EXPECT(cube_memory_stats_get(conf.client, CUBE_MEMORY_STREAM, NULL),
                CUBE_ERR_INVALID_ARGUMENT);
    st.struct_size = 8;
    CONF_EXPECT(cube_memory_stats_get(conf.client, CUBE_MEMORY_STREAM, &st),
                CUBE_ERR_INVALID_ARGUMENT);
    st.struct_size = sizeof st;
    CONF_EXPECT(cube_memory_stats_get(conf.client, (cube_memory_scope)7, &st),
                CUBE_ERR_INVALID_ARGUMENT);
    /* The client still answers. */
    CONF_OK(cube_memory_stats_get(conf.client, CUBE_MEMORY_STREAM, &st));
    assert_int_equal(st.allocations, 2);
    m_leave();
}
