/* A backend without communicators (cube_backend.comm NULL,
 * cubert/backend/comm.h): cube_comm_init_all, cube_comm_init_rank and
 * cube_comm_id_new answer CUBE_ERR_UNSUPPORTED, make nothing, and leave
 * the client as usable as before.
 *
 * The backend is "bare", the null backend with its communicator table
 * taken away: this executable is linked with
 * -Wl,--wrap=core_backend_find (tests/CMakeLists.txt), so the registry's
 * lookup finds it by that name; every other name is looked up as built. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <string.h>

#include "core/client_internal.h"
#include "cubert/comm.h"
#include "cubert/cubert.h"

extern const cube_backend cube_backend_null;
const cube_backend *__real_core_backend_find(const char *name);

static cube_backend bare;

const cube_backend *__wrap_core_backend_find(const char *name);
const cube_backend *__wrap_core_backend_find(const char *name)
{
    if (strcmp(name, "bare") == 0) {
        bare = cube_backend_null;
        bare.name = "bare";
        bare.comm = NULL;
        return &bare;
    }
    return __real_core_backend_find(name);
}

static void expect_unsupported(cube_error *err, const char *needle)
{
    assert_non_null(err);
    assert_int_equal(cube_error_code(err), CUBE_ERR_UNSUPPORTED);
    if (!strstr(cube_error_message(err), needle))
        fail_msg("'%s' does not name '%s'", cube_error_message(err), needle);
    cube_error_free(err);
}

/* No id is made, and *out is left zeroed. */
static void test_id_new_is_unsupported(void **state)
{
    (void)state;
    cube_comm_id id;
    memset(&id, 0xAB, sizeof id);
    expect_unsupported(cube_comm_id_new("bare", &id), "bare backend");
    cube_comm_id zero;
    memset(&zero, 0, sizeof zero);
    assert_memory_equal(&id, &zero, sizeof id);
}

/* Neither kind of communicator is made; the client still makes, writes,
 * reads and syncs buffers afterwards. */
static void test_init_is_unsupported_and_the_client_goes_on(void **state)
{
    (void)state;
    cube_client *c = NULL;
    assert_null(cube_client_open("bare", NULL, &c));
    assert_null(c->comm);

    /* Refused before anything is made: comms is left as it was. */
    cube_comm *comm = NULL;
    expect_unsupported(cube_comm_init_all(&c, 1, NULL, &comm), "collectives");
    assert_null(comm);

    /* An id as cube_comm_id_new would make it for the client's backend
     * (its properties name the null backend it is made from). */
    cube_comm_id id;
    memset(&id, 0, sizeof id);
    memcpy(id.bytes, "CBC1", 4);
    memcpy(id.bytes + 4, "null", 4);
    comm = (cube_comm *)&comm;
    expect_unsupported(cube_comm_init_rank(c, &id, 2, 0, NULL, &comm),
                       "between processes");
    assert_null(comm);

    float in[16], out[16];
    for (int i = 0; i < 16; i++)
        in[i] = (float)i;
    cube_handle h = {0};
    assert_null(cube_create(c, in, sizeof in, &h));
    assert_null(cube_sync(c, &h, 1));
    memset(out, 0, sizeof out);
    assert_null(cube_read_all(c, h, out, sizeof out));
    assert_memory_equal(in, out, sizeof in);
    assert_null(cube_handle_release(c, h));
    cube_client_close(c);
}

/* The null backend itself keeps its communicators (the shared host
 * table): the wrapper takes them away from "bare" only. */
static void test_the_null_backend_keeps_its_table(void **state)
{
    (void)state;
    assert_non_null(cube_backend_null.comm);
    cube_client *c = NULL;
    assert_null(cube_client_open("null", NULL, &c));
    assert_ptr_equal(c->comm, cube_backend_null.comm);
    cube_comm *comm = NULL;
    assert_null(cube_comm_init_all(&c, 1, NULL, &comm));
    assert_non_null(comm);
    cube_comm_destroy(comm);
    cube_client_close(c);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_id_new_is_unsupported),
        cmocka_unit_test(test_init_is_unsupported_and_the_client_goes_on),
        cmocka_unit_test(test_the_null_backend_keeps_its_table),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
