/* Profiling windows (the work's time on the host clock, as the backend
 * counts it, unless the backend times on the device) and the dry-run
 * scopes, per thread and client. */
#include <stdlib.h>

#include "base/error.h"
#include "base/grow.h"
#include "core/client_internal.h"

static atomic_uint_fast64_t next_token = 1;
/* Dry-run scopes of the calling thread, per client: a thread has scopes
 * open on at most DRY_RUN_CLIENTS clients at once. An entry of a client
 * that has closed gives its room back (serials are never reused). */
#define DRY_RUN_CLIENTS 8
/* An entry's value is how deep the client's scopes nest. */
static _Thread_local core_client_entry dry_runs[DRY_RUN_CLIENTS];
/* How many entries are in use: none, the common case, answers at once. */
static _Thread_local int dry_run_count;

/* The calling thread's entry for `c`, or -1. */
static int dry_run_find(const cube_client *c)
{
    for (int i = 0; dry_run_count && i < DRY_RUN_CLIENTS; i++)
        if (dry_runs[i].client_serial == c->serial)
            return i;
    return -1;
}

int core_dry_run_active(const cube_client *c)
{
    return dry_run_count && dry_run_find(c) >= 0;
}

int cube_dry_run_active(cube_client *c)
{
    return c ? core_dry_run_active(c) : 0;
}

cube_error *cube_dry_run_begin(cube_client *c)
{
    if (!c)
        return cube_error_null_argument("cube_dry_run_begin", "client");
    int i = dry_run_find(c);
    if (i >= 0) {
        dry_runs[i].value++;
        return NULL;
    }
    if (core_client_entry_take(dry_runs, DRY_RUN_CLIENTS, &dry_run_count, c,
                               1) < 0)
        return cube_error_new(CUBE_ERR_RESOURCE_LIMIT,
                              "cube_dry_run_begin: a thread may have dry-run "
                              "scopes open on at most %d open clients at once",
                              DRY_RUN_CLIENTS);
    return NULL;
}

cube_error *cube_dry_run_end(cube_client *c)
{
    if (!c)
        return cube_error_null_argument("cube_dry_run_end", "client");
    int i = dry_run_find(c);
    if (i < 0)
        return cube_error_new(CUBE_ERR_INVALID_ARGUMENT,
                              "cube_dry_run_end: the calling thread has no "
                              "dry-run scope open on this client");
    if (--dry_runs[i].value == 0) {
        dry_runs[i].client_serial = 0;
        dry_run_count--;
    }
    return NULL;
}

static cube_error *profile_start_call(cube_client *c, cube_profile_token *out)
{
    CORE_CHECK_CLIENT_OUT(c, out, "cube_profile_start");
    *out = 0;
    core_stream *s = NULL;
    cube_error *err = core_stream_enter_uncaptured(c, "cube_profile_start", &s);
    if (err)
        return err;
    core_window *grown = cube_grow(s->windows, s->window_count, &s->window_cap,
                                   sizeof *grown, 4);
    if (!grown)
        err = cube_error_new(CUBE_ERR_OUT_OF_MEMORY, "cube_profile_start");
    else
        s->windows = grown;
    uint64_t token = 0;
    if (!err && c->vt->start_profile)
        err = c->vt->start_profile(c->server, &s->base, &token);
    if (!err) {
        core_window *w = &s->windows[s->window_count++];
        /* Tokens the caller sees never repeat, whatever the backend's
         * (an address it may reuse) looks like. */
        w->token = atomic_fetch_add(&next_token, 1);
        w->client_serial = c->serial;
        w->backend_token = token;
        w->launches_at_start = s->launches;
        w->failures_at_start = s->failures;
        /* On the host clock the backend times the work it runs while a
         * window is open; the window measures what it adds. */
        w->busy_at_start = s->base.busy_ns;
        s->base.profiling = 1;
        *out = w->token;
    }
    core_stream_unlock(s);
    /* err is a fresh error object, not derived from token. */
    // cppcheck-suppress returnDanglingLifetime
    return err;
}

cube_error *cube_profile_start(cube_client *c, cube_profile_token *out)
{
    CORE_CALL(c, "cube_profile_start", profile_start_call(c, out));
}

/* The index of `token` among the windows `c` opened on the stream, or
 * -1 (another client's window on a shared stream is not its to end). */
static long find_window(const cube_client *c, const core_stream *s,
                        cube_profile_token token)
{
    for (size_t i = 0; i < s->window_count; i++)
        if (s->windows[i].token == token &&
            s->windows[i].client_serial == c->serial)
            return (long)i;
    return -1;
}

void core_stream_window_remove(core_stream *s, size_t i)
{
    s->windows[i] = s->windows[--s->window_count];
    if (s->window_count == 0) {
        /* No window can report it any more. */
        cube_error_free(s->last_failure);
        s->last_failure = NULL;
        s->base.profiling = 0;
    }
}

static cube_error *profile_end_call(cube_client *c, cube_profile_token token,
                                    cube_profile_result *out)
{
    CORE_CHECK_CLIENT_OUT(c, out, "cube_profile_end");
    out->seconds = 0;
    out->method = CUBE_TIMING_HOST_CLOCK;
    out->launches = 0;
    /* A capture refuses first, whatever the token; a window stays open,
     * for the caller to end after the capture. */
    core_stream *s = NULL;
    cube_error *err = core_stream_enter_uncaptured(c, "cube_profile_end", &s);
    if (err)
        return err;
    long i = find_window(c, s, token);
    if (i < 0) {
        core_stream_unlock(s);
        return cube_error_new(CUBE_ERR_PROFILE,
                              "cube_profile_end: token %llu is not an open "
                              "window of the calling stream (unknown, "
                              "already closed, another stream's or another "
                              "client's)",
                              (unsigned long long)token);
    }
    core_window w = s->windows[i];
    double seconds = 0;
    cube_timing_method method = CUBE_TIMING_HOST_CLOCK;
    if (c->vt->end_profile) {
        err = c->vt->end_profile(c->server, &s->base, w.backend_token, &seconds,
                                 &method);
    } else {
        /* The backend ran the window's work at issue time and timed it:
         * the time spent in that work, not the time the host spent
         * between calls. The drain is for a fault. */
        err = c->vt->sync(c->server, &s->base, NULL, 0);
        seconds = (double)(s->base.busy_ns - w.busy_at_start) * 1e-9;
    }
    core_fault_note(c, err);
    if (!err && s->failures != w.failures_at_start) {
        err = cube_error_new(
            CUBE_ERR_PROFILE,
            "cube_profile_end: %llu launch(es), write(s) or "
            "replay(s) failed inside the window; its "
            "duration would not measure the work asked for",
            (unsigned long long)(s->failures - w.failures_at_start));
        cube_error_add_cause(err, cube_error_clone(s->last_failure));
    }
    if (!err) {
        out->seconds = seconds;
        out->method = method;
        out->launches = s->launches - w.launches_at_start;
    }
    core_stream_window_remove(s, (size_t)i);
    core_stream_unlock(s);
    return err;
}

cube_error *cube_profile_end(cube_client *c, cube_profile_token token,
                             cube_profile_result *out)
{
    CORE_CALL(c, "cube_profile_end", profile_end_call(c, token, out));
}

static void profile_abandon(cube_client *c, cube_profile_token token)
{
    if (!c)
        return;
    core_stream *s = NULL;
    if (!core_stream_enter_or_drop(
            c, "a thread without a stream has no window to abandon", &s))
        return;
    long i = find_window(c, s, token);
    if (i >= 0) {
        if (c->vt->abandon_profile)
            c->vt->abandon_profile(c->server, &s->base,
                                   s->windows[i].backend_token);
        core_stream_window_remove(s, (size_t)i);
    }
    core_stream_unlock(s);
}

void cube_profile_abandon(cube_client *c, cube_profile_token token)
{
    core_call_shard *call = c ? core_call_enter(c) : NULL;
    if (!call)
        return; /* no client, or one that is closing (which drops it) */
    profile_abandon(c, token);
    core_call_leave(call);
}
