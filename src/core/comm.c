/* Communicators (cubert/comm.h): the object. Making one over clients of
 * this process (cube_comm_init_all) or one rank of a communicator between
 * processes from an id (cube_comm_id_new, _format, _parse,
 * cube_comm_init_rank), destroying and aborting it, and the names the
 * other comm_*.c files use in their errors.
 *
 * The calls of the ranks meet in the rendezvous (comm_rendezvous.c), a
 * rank's part is issued or recorded by comm_issue.c, the public calls and
 * groups are in comm_call.c, the calls between processes the backend
 * follows on the device in comm_follow.c, and the replays of recorded
 * calls in comm_replay.c. comm_internal.h holds what they share and the
 * order of their locks.
 */
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/error.h"
#include "core/comm_internal.h"

#define DEFAULT_TIMEOUT_MS 300000u

uint32_t cube_dtype_size(cube_dtype dtype)
{
    switch (dtype) {
    case CUBE_DTYPE_I8:
    case CUBE_DTYPE_U8: return 1;
    case CUBE_DTYPE_F16:
    case CUBE_DTYPE_BF16: return 2;
    case CUBE_DTYPE_I32:
    case CUBE_DTYPE_U32:
    case CUBE_DTYPE_F32: return 4;
    case CUBE_DTYPE_I64:
    case CUBE_DTYPE_U64:
    case CUBE_DTYPE_F64: return 8;
    }
    return 0;
}

const char *comm_kind_name(cube_collective_kind kind)
{
    switch (kind) {
    case CUBE_COLLECTIVE_ALL_REDUCE: return "cube_all_reduce";
    case CUBE_COLLECTIVE_BROADCAST: return "cube_broadcast";
    case CUBE_COLLECTIVE_REDUCE: return "cube_reduce";
    case CUBE_COLLECTIVE_ALL_GATHER: return "cube_all_gather";
    case CUBE_COLLECTIVE_REDUCE_SCATTER: return "cube_reduce_scatter";
    case CUBE_COLLECTIVE_SEND: return "cube_send";
    case CUBE_COLLECTIVE_RECV: return "cube_recv";
    }
    return "collective";
}

cube_error *comm_aborted_error(cube_collective_kind kind)
{
    return cube_error_new(CUBE_ERR_ABORTED, "%s: the communicator was aborted",
                          comm_kind_name(kind));
}

/* --- communicators --- */

cube_comm_options cube_comm_options_default(void)
{
    cube_comm_options o;
    memset(&o, 0, sizeof o);
    o.struct_size = sizeof o;
    return o;
}

uint32_t cube_comm_rank(const cube_comm *comm)
{
    return comm ? comm->rank : 0;
}

uint32_t cube_comm_size(const cube_comm *comm)
{
    return comm ? comm->group->n : 0;
}

/* Frees the group's per-rank arrays (any of them may be NULL). */
static void group_arrays_free(comm_group *g)
{
    free(g->seq);
    free(g->send_seq);
    free(g->recv_seq);
    free(g->gone);
}

static void group_free(comm_group *g)
{
    while (g->calls) {
        comm_call *next = g->calls->next;
        comm_call_free(g->calls);
        g->calls = next;
    }
    for (int i = 0; i < 2; i++)
        free(g->spare[i]);
    group_arrays_free(g);
    free(g->inflight);
    pthread_cond_destroy(&g->changed);
    if (g->remote)
        cube_mutex_destroy(&g->reap_lock);
    cube_mutex_destroy(&g->lock);
    free(g);
}

/* Frees comm's group and its ranks once the last of them and of the
 * graphs holding them went. */
void comm_free_ranks(cube_comm *comm)
{
    /* In one process the ranks are one array; a communicator between
     * processes is this rank alone. */
    comm_group *g = comm->group;
    cube_comm *first = g->remote ? comm : comm - comm->rank;
    group_free(g);
    free(first);
}

/* Whether `options` (NULL for the defaults) is a cube_comm_options of
 * this or an earlier version. */
static cube_error *check_options(const cube_comm_options *options,
                                 const char *fn)
{
    if (options && (options->struct_size < sizeof(uint32_t) ||
                    options->struct_size > sizeof(cube_comm_options)))
        return cube_error_new(CUBE_ERR_INVALID_ARGUMENT,
                              "%s: options->struct_size %u is not "
                              "sizeof(cube_comm_options)",
                              fn, options->struct_size);
    return NULL;
}

/* The timeout `options` asks for (checked), or the default. */
static uint64_t timeout_ms_of(const cube_comm_options *options)
{
    cube_comm_options o = cube_comm_options_default();
    if (options)
        memcpy(&o, options, options->struct_size);
    return o.timeout_ms ? o.timeout_ms : DEFAULT_TIMEOUT_MS;
}

/* Whether clients[i] may join clients[0..i) in one communicator. */
static cube_error *check_init_client(cube_client *const *clients, uint32_t i)
{
    if (!clients[i])
        return cube_error_new(CUBE_ERR_INVALID_ARGUMENT,
                              "cube_comm_init_all: clients[%u] is NULL", i);
    if (clients[i]->vt != clients[0]->vt)
        return cube_error_new(CUBE_ERR_INVALID_ARGUMENT,
                              "cube_comm_init_all: clients[0] is on %s "
                              "and clients[%u] on %s: a communicator "
                              "joins devices of one backend",
                              clients[0]->device, i, clients[i]->device);
    for (uint32_t j = 0; j < i; j++)
        if (clients[j]->dev == clients[i]->dev)
            return cube_error_new(
                CUBE_ERR_INVALID_ARGUMENT,
                "cube_comm_init_all: clients[%u] and clients[%u] are "
                "both on %s: each rank needs a device of its own",
                j, i, clients[i]->device);
    if (atomic_load_explicit(&clients[i]->dev->faulted, memory_order_acquire))
        return core_fault_get(clients[i]);
    return NULL;
}

static cube_error *check_init(cube_client *const *clients, uint32_t n,
                              const cube_comm_options *options,
                              cube_comm **comms)
{
    if (!clients || !comms)
        return cube_error_null_argument("cube_comm_init_all",
                                        clients ? "comms" : "clients");
    if (n == 0 || n > CUBE_MAX_RANKS)
        return cube_error_new(CUBE_ERR_INVALID_ARGUMENT,
                              "cube_comm_init_all: n = %u is not in 1..%u", n,
                              CUBE_MAX_RANKS);
    cube_error *err = check_options(options, "cube_comm_init_all");
    for (uint32_t i = 0; i < n && !err; i++)
        err = check_init_client(clients, i);
    if (err)
        return err;
    if (!clients[0]->comm || !clients[0]->comm->collective)
        return cube_error_new(CUBE_ERR_UNSUPPORTED,
                              "cube_comm_init_all: the %s backend has no "
                              "collectives",
                              clients[0]->props.backend);
    return NULL;
}

/* A zeroed group of n ranks in one process with its per-rank arrays;
 * NULL for want of memory. */
static comm_group *group_alloc(uint32_t n)
{
    comm_group *g = calloc(1, sizeof *g);
    if (!g)
        return NULL;
    g->seq = calloc(n, sizeof *g->seq);
    g->send_seq = calloc((size_t)n * n, sizeof *g->send_seq);
    g->recv_seq = calloc((size_t)n * n, sizeof *g->recv_seq);
    g->gone = calloc(n, 1);
    if (!g->seq || !g->send_seq || !g->recv_seq || !g->gone) {
        group_arrays_free(g);
        free(g);
        return NULL;
    }
    return g;
}

/* Frees what cube_comm_init_all allocated before its group was made
 * (any of it may be NULL). */
static void init_undo(comm_group *g, cube_comm *made, cube_backend_comm **impls)
{
    if (g)
        group_arrays_free(g);
    free(g);
    free(made);
    free(impls);
}

cube_error *cube_comm_init_all(cube_client *const *clients, uint32_t n,
                               const cube_comm_options *options,
                               cube_comm **comms)
{
    cube_error *err = check_init(clients, n, options, comms);
    if (err)
        return err;
    for (uint32_t i = 0; i < n; i++)
        comms[i] = NULL;
    uint64_t timeout_ms = timeout_ms_of(options);
    comm_group *g = group_alloc(n);
    cube_comm *made = calloc(n, sizeof *made);
    cube_server **servers = calloc(n, sizeof(cube_server *));
    cube_backend_comm **impls = calloc(n, sizeof *impls);
    if (!g || !made || !servers || !impls) {
        free(servers);
        init_undo(g, made, impls);
        return cube_error_new(CUBE_ERR_OUT_OF_MEMORY, "cube_comm_init_all");
    }
    for (uint32_t i = 0; i < n; i++)
        servers[i] = clients[i]->server;
    const cube_comm_vtable *vt = clients[0]->comm;
    err = vt->init ? vt->init(servers, n, timeout_ms, impls) : NULL;
    free(servers);
    if (err) {
        init_undo(g, made, impls);
        return cube_error_prefix(err, "cube_comm_init_all");
    }
    cube_mutex_init(&g->lock);
    /* Deadlines are on the monotonic clock: setting the date does not
     * move them. */
    pthread_condattr_t attr;
    pthread_condattr_init(&attr);
    pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
    pthread_cond_init(&g->changed, &attr);
    pthread_condattr_destroy(&attr);
    g->n = n;
    g->alive = n;
    g->vt = vt;
    g->timeout_ns = timeout_ms * 1000000ull;
    /* One allocation for the ranks: comms[i] points into it, and the
     * last destroy frees it with the group. */
    for (uint32_t i = 0; i < n; i++) {
        made[i].group = g;
        made[i].rank = i;
        made[i].client = clients[i];
        made[i].impl = impls[i];
        comms[i] = &made[i];
    }
    free(impls);
    cube_log_write(CUBE_LOG_INFO, "comm", "communicator of %u rank(s) on %s%s",
                   n, clients[0]->device, n > 1 ? ", ..." : "");
    return NULL;
}

void cube_comm_destroy(cube_comm *comm)
{
    if (!comm)
        return;
    comm_group *g = comm->group;
    if (g->remote)
        comm_drain_remote(g);
    /* A hardware graph that captured this rank's calls still names the
     * backend's communicator: its destroy waits for the last such graph
     * (core_comm_release); replays are refused from now on. */
    cube_mutex_lock(&g->lock);
    int deferred = comm->hw_holds > 0;
    comm->destroy_deferred = deferred;
    cube_mutex_unlock(&g->lock);
    if (!deferred) {
        if (g->vt->destroy && comm->impl)
            g->vt->destroy(comm->client->server, comm->impl);
        comm->impl = NULL;
    }
    cube_mutex_lock(&g->lock);
    if (g->gone)
        g->gone[comm->rank] = 1;
    int last = --g->alive == 0 && g->holds == 0;
    /* Peers waiting for this rank will not see it come. */
    pthread_cond_broadcast(&g->changed);
    cube_mutex_unlock(&g->lock);
    if (last)
        comm_free_ranks(comm);
}

cube_error *cube_comm_abort(cube_comm *comm)
{
    if (!comm)
        return cube_error_null_argument("cube_comm_abort", "comm");
    comm_group *g = comm->group;
    cube_mutex_lock(&g->lock);
    g->aborted = 1;
    pthread_cond_broadcast(&g->changed);
    cube_mutex_unlock(&g->lock);
    if (g->vt->abort && g->remote) {
        if (comm->impl)
            g->vt->abort(comm->client->server, comm->impl);
    } else if (g->vt->abort) {
        cube_comm *first = comm - comm->rank;
        for (uint32_t i = 0; i < g->n; i++)
            if (first[i].impl)
                g->vt->abort(first[i].client->server, first[i].impl);
    }
    return NULL;
}

/* --- communicators between processes --- */

/* An id: "CBC1", the backend's name (NUL-padded), the backend's bytes. */
#define ID_MAGIC "CBC1"
#define ID_NAME 12
_Static_assert(4 + ID_NAME + CUBE_COMM_ID_PAYLOAD == CUBE_COMM_ID_BYTES,
               "an id is its header and the backend's bytes");

cube_error *cube_comm_id_new(const char *backend, cube_comm_id *out)
{
    if (!backend || !out)
        return cube_error_null_argument("cube_comm_id_new",
                                        backend ? "out" : "backend");
    memset(out, 0, sizeof *out);
    const cube_backend *b = core_backend_find(backend);
    if (!b)
        return cube_error_new(core_backend_left_out(backend)
                                  ? CUBE_ERR_UNAVAILABLE
                                  : CUBE_ERR_NOT_FOUND,
                              "cube_comm_id_new: no backend '%s' in this "
                              "build",
                              backend);
    if (strlen(b->name) >= ID_NAME || !b->comm || !b->comm->id_new)
        return cube_error_new(CUBE_ERR_UNSUPPORTED,
                              "cube_comm_id_new: the %s backend has no "
                              "communicators between processes",
                              b->name);
    memcpy(out->bytes, ID_MAGIC, 4);
    memcpy(out->bytes + 4, b->name, strlen(b->name));
    cube_error *err = b->comm->id_new(out->bytes + 4 + ID_NAME);
    if (err) {
        memset(out, 0, sizeof *out);
        return cube_error_prefix(err, "cube_comm_id_new(%s)", backend);
    }
    return NULL;
}

cube_error *cube_comm_id_format(const cube_comm_id *id, char *text, size_t cap)
{
    if (!id || !text)
        return cube_error_null_argument("cube_comm_id_format",
                                        id ? "text" : "id");
    if (cap < CUBE_COMM_ID_TEXT)
        return cube_error_new(CUBE_ERR_INVALID_ARGUMENT,
                              "cube_comm_id_format: cap %zu is less than "
                              "CUBE_COMM_ID_TEXT (%d)",
                              cap, CUBE_COMM_ID_TEXT);
    static const char hex[] = "0123456789abcdef";
    memcpy(text, "cubert-comm:", 12);
    for (size_t i = 0; i < CUBE_COMM_ID_BYTES; i++) {
        text[12 + 2 * i] = hex[id->bytes[i] >> 4];
        text[13 + 2 * i] = hex[id->bytes[i] & 15];
    }
    text[12 + 2 * CUBE_COMM_ID_BYTES] = '\0';
    return NULL;
}

/* Whether the id's header is one cube_comm_id_new writes (the backend's
 * name NUL-terminated). */
static int id_well_formed(const cube_comm_id *id)
{
    return memcmp(id->bytes, ID_MAGIC, 4) == 0 &&
           id->bytes[4 + ID_NAME - 1] == 0;
}

/* Blanks a file or a shell may leave after an id. */
static int is_trailing_blank(char c)
{
    return c == '\n' || c == ' ' || c == '\r' || c == '\t';
}

static int hex_digit(char c)
{
    return c >= '0' && c <= '9'   ? c - '0'
           : c >= 'a' && c <= 'f' ? c - 'a' + 10
           : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                  : -1;
}

cube_error *cube_comm_id_parse(const char *text, cube_comm_id *out)
{
    if (!text || !out)
        return cube_error_null_argument("cube_comm_id_parse",
                                        text ? "out" : "text");
    memset(out, 0, sizeof *out);
    /* Trailing blanks and a newline, as a file or a shell may leave. */
    size_t len = strlen(text);
    while (len && is_trailing_blank(text[len - 1]))
        len--;
    if (len != 12 + 2 * CUBE_COMM_ID_BYTES ||
        strncmp(text, "cubert-comm:", 12) != 0)
        return cube_error_new(CUBE_ERR_INVALID_ARGUMENT,
                              "cube_comm_id_parse: not an id made by "
                              "cube_comm_id_format (\"cubert-comm:\" and "
                              "%d hexadecimal digits)",
                              2 * CUBE_COMM_ID_BYTES);
    for (size_t i = 0; i < CUBE_COMM_ID_BYTES; i++) {
        int hi = hex_digit(text[12 + 2 * i]), lo = hex_digit(text[13 + 2 * i]);
        if (hi < 0 || lo < 0) {
            memset(out, 0, sizeof *out);
            return cube_error_new(CUBE_ERR_INVALID_ARGUMENT,
                                  "cube_comm_id_parse: character %zu is not "
                                  "a hexadecimal digit",
                                  12 + 2 * i + (hi < 0 ? 0 : 1));
        }
        out->bytes[i] = (unsigned char)(hi << 4 | lo);
    }
    if (!id_well_formed(out)) {
        memset(out, 0, sizeof *out);
        return cube_error_new(CUBE_ERR_INVALID_ARGUMENT,
                              "cube_comm_id_parse: the digits do not hold a "
                              "cubert communicator id");
    }
    return NULL;
}

static cube_error *init_rank_call(cube_client *c, const cube_comm_id *id,
                                  uint32_t nranks, uint32_t rank,
                                  const cube_comm_options *options,
                                  cube_comm **out)
{
    CORE_CHECK_CLIENT(c, "cube_comm_init_rank");
    if (!id || !out)
        return cube_error_null_argument("cube_comm_init_rank",
                                        id ? "out" : "id");
    *out = NULL;
    if (nranks == 0 || nranks > CUBE_MAX_RANKS || rank >= nranks)
        return cube_error_new(CUBE_ERR_INVALID_ARGUMENT,
                              "cube_comm_init_rank: rank %u of %u ranks is "
                              "not in range (1..%u ranks)",
                              rank, nranks, CUBE_MAX_RANKS);
    cube_error *err = check_options(options, "cube_comm_init_rank");
    if (err)
        return err;
    char name[ID_NAME];
    memcpy(name, id->bytes + 4, ID_NAME);
    if (!id_well_formed(id))
        return cube_error_new(CUBE_ERR_INVALID_ARGUMENT,
                              "cube_comm_init_rank: the id was not made by "
                              "cube_comm_id_new");
    if (strcmp(name, c->props.backend) != 0)
        return cube_error_new(CUBE_ERR_INVALID_ARGUMENT,
                              "cube_comm_init_rank: the id is for the %s "
                              "backend and the client is on %s",
                              name, c->device);
    const cube_comm_vtable *vt = c->comm;
    if (!vt || !vt->init_rank || !vt->collective)
        return cube_error_new(CUBE_ERR_UNSUPPORTED,
                              "cube_comm_init_rank: the %s backend has no "
                              "communicators between processes",
                              c->props.backend);
    uint64_t timeout_ms = timeout_ms_of(options);
    comm_group *g = calloc(1, sizeof *g);
    cube_comm *comm = calloc(1, sizeof *comm);
    if (!g || !comm) {
        free(g);
        free(comm);
        return cube_error_new(CUBE_ERR_OUT_OF_MEMORY, "cube_comm_init_rank");
    }
    cube_backend_comm *impl = NULL;
    err = vt->init_rank(c->server, id->bytes + 4 + ID_NAME, nranks, rank,
                        timeout_ms, &impl);
    if (err) {
        free(g);
        free(comm);
        return cube_error_prefix(err, "cube_comm_init_rank");
    }
    cube_mutex_init(&g->lock);
    cube_mutex_init(&g->reap_lock);
    pthread_cond_init(&g->changed, NULL);
    g->n = nranks;
    g->alive = 1;
    g->vt = vt;
    g->remote = 1;
    g->timeout_ns = timeout_ms * 1000000ull;
    comm->group = g;
    comm->rank = rank;
    comm->client = c;
    comm->impl = impl;
    g->remote_rank = comm;
    if (vt->poll)
        comm_remote_list(g);
    *out = comm;
    cube_log_write(CUBE_LOG_INFO, "comm",
                   "rank %u of %u (between processes) on %s", rank, nranks,
                   c->device);
    return NULL;
}

cube_error *cube_comm_init_rank(cube_client *client, const cube_comm_id *id,
                                uint32_t nranks, uint32_t rank,
                                const cube_comm_options *options,
                                cube_comm **out)
{
    if (out)
        *out = NULL;
    CORE_CALL(client, "cube_comm_init_rank",
              init_rank_call(client, id, nranks, rank, options, out));
}
