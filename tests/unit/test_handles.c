/* The handle table's promise (src/core/handles.c): no handle ever names
 * two buffers. A slot that issued its last generation is spent and never
 * reused, also by the next client given the same tag; at most
 * CORE_MAX_CLIENTS clients are open at once, one tag each; a handle of a
 * closed client says so when refused. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "core/client_internal.h"
#include "cubert/cubert.h"

static const char *device(void)
{
    for (const char *const *n = cube_backend_names(); *n; n++)
        if (strcmp(*n, "null") == 0)
            return "null";
    return "cpu";
}

static cube_client *open_client(void)
{
    cube_client_options o = cube_client_options_default();
    o.cpu_threads = 1;
    cube_client *c = NULL;
    cube_error *err = cube_client_open(device(), &o, &c);
    if (err)
        fail_msg("%s", cube_error_message(err));
    return c;
}

static void expect_code(cube_error *err, cube_code code, const char *needle)
{
    assert_non_null(err);
    assert_int_equal(cube_error_code(err), code);
    if (needle && !strstr(cube_error_message(err), needle))
        fail_msg("'%s' does not name '%s'", cube_error_message(err), needle);
    cube_error_free(err);
}

static uint32_t index_of(cube_handle h)
{
    return (uint32_t)h.bits & CORE_HANDLE_INDEX_MASK;
}

static cube_handle with_gen(cube_handle h, uint32_t gen)
{
    uint64_t mask = (uint64_t)CORE_HANDLE_GEN_MAX << CORE_HANDLE_GEN_SHIFT;
    cube_handle out = {(h.bits & ~mask) |
                       ((uint64_t)gen << CORE_HANDLE_GEN_SHIFT)};
    return out;
}

enum { MANY = 3 * CORE_CHUNK_SLOTS };

/* Allocates MANY buffers, all live at once, and asserts that none uses
 * slot `spent` or equals `last`; releases them. */
static void expect_never_reissued(cube_client *c, uint32_t spent,
                                  cube_handle last)
{
    cube_handle *h = calloc(MANY, sizeof *h);
    assert_non_null(h);
    for (int i = 0; i < MANY; i++) {
        assert_null(cube_empty(c, 8, &h[i]));
        assert_int_not_equal(index_of(h[i]), spent);
        assert_true(h[i].bits != last.bits);
    }
    for (int i = 0; i < MANY; i++)
        assert_null(cube_handle_release(c, h[i]));
    /* One at a time, through the slot released last. */
    for (int i = 0; i < 100; i++) {
        cube_handle one;
        assert_null(cube_empty(c, 8, &one));
        assert_int_not_equal(index_of(one), spent);
        assert_null(cube_handle_release(c, one));
    }
    free(h);
}

/* A slot at its last generation: once released it is spent, in this
 * client and in the next one that gets the same tag. */
static void spent_slot_is_never_reused(void **state)
{
    (void)state;
    cube_client *c = open_client();
    cube_handle first, h;
    assert_null(cube_empty(c, 8, &first)); /* a slot before the one spent */
    assert_null(cube_empty(c, 64, &h));
    core_resolved r;
    assert_null(core_resolve(c, h, "test", &r));
    core_slot *slot = r.slot;
    uint32_t spent = r.slot_index;
    core_resolved_drop(c, &r);
    /* As if the slot had been reused 2^26 - 2 times: its handle now has
     * the last generation. */
    uint64_t refs = (uint32_t)atomic_load(&slot->state);
    atomic_store(&slot->state, ((uint64_t)CORE_HANDLE_GEN_MAX << 32) | refs);
    cube_handle last = with_gen(h, CORE_HANDLE_GEN_MAX);
    expect_code(cube_handle_retain(c, h), CUBE_ERR_NOT_FOUND, NULL);
    uint64_t size = 0;
    assert_null(cube_handle_size(c, last, &size));
    assert_int_equal(size, 64);
    assert_null(cube_handle_release(c, last));
    expect_code(cube_handle_release(c, last), CUBE_ERR_NOT_FOUND, NULL);
    expect_never_reissued(c, spent, last);

    uint32_t tag = c->tag;
    cube_client_close(c);
    c = open_client();
    assert_int_equal(c->tag, tag); /* the lowest free tag: the same */
    expect_code(cube_handle_retain(c, last), CUBE_ERR_NOT_FOUND, NULL);
    expect_never_reissued(c, spent, last);
    /* The handle of the closed client says whose it was. */
    expect_code(cube_handle_retain(c, first), CUBE_ERR_NOT_FOUND,
                "belongs to another client");
    cube_client_close(c);
}

/* Generations go on from client to client on one tag: a handle of a
 * closed client is refused by the next, which issues other values at
 * the same slots. */
static void generations_continue_on_a_reused_tag(void **state)
{
    (void)state;
    cube_client *c = open_client();
    uint32_t tag = c->tag;
    cube_handle old[4];
    for (int i = 0; i < 4; i++)
        assert_null(cube_empty(c, 8, &old[i]));
    /* The hot slot goes through a few generations. */
    for (int i = 0; i < 10; i++) {
        cube_handle t;
        assert_null(cube_empty(c, 8, &t));
        assert_null(cube_handle_release(c, t));
    }
    cube_client_close(c);
    for (int round = 0; round < 3; round++) {
        c = open_client();
        assert_int_equal(c->tag, tag);
        cube_handle now[8];
        for (int i = 0; i < 8; i++) {
            assert_null(cube_empty(c, 8, &now[i]));
            for (int k = 0; k < 4; k++)
                assert_true(now[i].bits != old[k].bits);
        }
        for (int k = 0; k < 4; k++)
            expect_code(cube_handle_release(c, old[k]), CUBE_ERR_NOT_FOUND,
                        "belongs to another client");
        for (int i = 0; i < 8; i++)
            assert_null(cube_handle_release(c, now[i]));
        /* The handles of this round are the old ones of the next. */
        memcpy(old, now, sizeof old);
        cube_client_close(c);
    }
}

/* Every open client holds a tag of its own: one more is refused, and a
 * close makes room again. */
static void at_most_max_clients_are_open_at_once(void **state)
{
    (void)state;
    cube_client **c = calloc(CORE_MAX_CLIENTS, sizeof *c);
    assert_non_null(c);
    for (uint32_t i = 0; i < CORE_MAX_CLIENTS; i++)
        c[i] = open_client();
    cube_client *more = NULL;
    expect_code(cube_client_open(device(), NULL, &more),
                CUBE_ERR_RESOURCE_LIMIT, "at most 4095 clients");
    assert_null(more);
    /* Tags are distinct. */
    unsigned char *seen = calloc(CORE_MAX_CLIENTS + 1, 1);
    assert_non_null(seen);
    for (uint32_t i = 0; i < CORE_MAX_CLIENTS; i++) {
        assert_true(c[i]->tag >= 1 && c[i]->tag <= CORE_MAX_CLIENTS);
        assert_int_equal(seen[c[i]->tag], 0);
        seen[c[i]->tag] = 1;
    }
    free(seen);
    cube_client_close(c[100]);
    c[100] = open_client();
    for (uint32_t i = 0; i < CORE_MAX_CLIENTS; i++)
        cube_client_close(c[i]);
    free(c);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(spent_slot_is_never_reused),
        cmocka_unit_test(generations_continue_on_a_reused_tag),
        cmocka_unit_test(at_most_max_clients_are_open_at_once),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
