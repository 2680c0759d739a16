/* Unit tests of tracing: the trace file is read back with a JSON parser. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <fcntl.h>
#include <ftw.h>
#include <inttypes.h>
#include <jansson.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/client_internal.h"
#include "core/trace.h"
#include "cubert/backend/errors.h"
#include "cubert/cubert.h"

#define OWN_BIT (1ull << 63)

static char tmp_dir[256];

/* A path inside the test's scratch directory. */
static const char *tmp_path(const char *name)
{
    static char buf[4][512];
    static int next;
    char *p = buf[next++ % 4];
    snprintf(p, sizeof buf[0], "%s/%s", tmp_dir, name);
    return p;
}

/* --- captured log messages ------------------------------------------------ */

typedef struct captured {
    int count;
    char text[16][512];
} captured;

static void capture_sink(void *user, cube_log_level level, const char *category,
                         const char *message)
{
    captured *c = user;
    if (level < CUBE_LOG_WARN)
        return;
    if (c->count < 16)
        snprintf(c->text[c->count], sizeof c->text[0], "%s: %s", category,
                 message);
    c->count++;
}

/* --- reading a trace back ------------------------------------------------- */

/* Loads `path`, checks the top-level shape and returns the events array
 * (borrowed from *root, which the caller frees). */
static json_t *load_events(const char *path, json_t **root)
{
    json_error_t jerr;
    *root = json_load_file(path, 0, &jerr);
    if (!*root)
        fail_msg("%s is not valid JSON: line %d: %s", path, jerr.line,
                 jerr.text);
    assert_true(json_is_object(*root));
    json_t *events = json_object_get(*root, "traceEvents");
    assert_non_null(events);
    assert_true(json_is_array(events));
    json_t *unit = json_object_get(*root, "displayTimeUnit");
    assert_non_null(unit);
    assert_string_equal(json_string_value(unit), "ms");
    return events;
}

static const char *str_field(json_t *ev, const char *key)
{
    json_t *v = json_object_get(ev, key);
    return json_is_string(v) ? json_string_value(v) : NULL;
}

static int count_phase(json_t *events, const char *ph)
{
    int n = 0;
    size_t i;
    for (i = 0; i < json_array_size(events); i++) {
        json_t *ev = json_array_get(events, i);
        const char *p = str_field(ev, "ph");
        if (p && strcmp(p, ph) == 0)
            n++;
    }
    return n;
}

/* The "stream 0x..." name the trace gave `tid`, or NULL. Fails when a tid
 * is named twice. */
static const char *thread_name(json_t *events, json_int_t tid)
{
    const char *found = NULL;
    size_t i;
    for (i = 0; i < json_array_size(events); i++) {
        json_t *ev = json_array_get(events, i);
        const char *ph = str_field(ev, "ph");
        const char *name = str_field(ev, "name");
        if (!ph || strcmp(ph, "M") != 0 || !name ||
            strcmp(name, "thread_name") != 0)
            continue;
        if (json_integer_value(json_object_get(ev, "tid")) != tid)
            continue;
        assert_null(found);
        json_t *args = json_object_get(ev, "args");
        assert_true(json_is_object(args));
        found = str_field(args, "name");
        assert_non_null(found);
    }
    return found;
}

/* Checks the fields every span, instant and counter sample carries. */
static void check_event_fields(json_t *ev)
{
    const char *ph = str_field(ev, "ph");
    assert_non_null(ph);
    assert_true(json_is_integer(json_object_get(ev, "pid")));
    assert_int_equal(json_integer_value(json_object_get(ev, "pid")),
                     (json_int_t)getpid());
    assert_true(json_is_integer(json_object_get(ev, "tid")));
    assert_non_null(str_field(ev, "name"));
    if (strcmp(ph, "M") == 0)
        return;
    assert_non_null(str_field(ev, "cat"));
    json_t *ts = json_object_get(ev, "ts");
    assert_true(json_is_number(ts));
    assert_true(json_number_value(ts) >= 0.0);
    if (strcmp(ph, "X") == 0) {
        json_t *dur = json_object_get(ev, "dur");
        assert_true(json_is_number(dur));
        assert_true(json_number_value(dur) >= 0.0);
    } else if (strcmp(ph, "C") == 0) {
        assert_true(json_is_object(json_object_get(ev, "args")));
    } else {
        assert_string_equal(ph, "i");
        assert_string_equal(str_field(ev, "s"), "t");
    }
}

/* --- tests ---------------------------------------------------------------- */

/* Runs first: CUBERT_TRACE (set by main) names a path that cannot be
 * opened, so the start from the environment logs a warning naming it. */
static void test_from_env_failure_warns(void **state)
{
    (void)state;
    captured cap = {0};
    cube_log_set_sink(capture_sink, &cap);
    core_trace_from_env();
    cube_log_set_sink(NULL, NULL);
    assert_false(core_trace_on());
    int named = 0;
    for (int i = 0; i < cap.count && i < 16; i++)
        if (strstr(cap.text[i], "CUBERT_TRACE"))
            named = 1;
    assert_true(named);
    /* Once per process: a second call does nothing. */
    cap.count = 0;
    cube_log_set_sink(capture_sink, &cap);
    core_trace_from_env();
    cube_log_set_sink(NULL, NULL);
    assert_int_equal(cap.count, 0);
}

static void test_clock(void **state)
{
    (void)state;
    uint64_t a = core_clock_ns();
    uint64_t b = core_clock_ns();
    assert_true(a > 0);
    assert_true(b >= a);
}

static void test_argument_errors(void **state)
{
    (void)state;
    cube_error *err = cube_trace_start(NULL);
    assert_int_equal(cube_error_code(err), CUBE_ERR_INVALID_ARGUMENT);
    cube_error_free(err);
    err = cube_trace_start("");
    assert_int_equal(cube_error_code(err), CUBE_ERR_INVALID_ARGUMENT);
    cube_error_free(err);
    err = cube_trace_start("/nonexistent-cubert-dir/sub/trace.json");
    assert_int_equal(cube_error_code(err), CUBE_ERR_IO);
    assert_non_null(strstr(cube_error_message(err), "nonexistent-cubert-dir"));
    cube_error_free(err);
    err = cube_trace_start(tmp_dir); /* a directory */
    assert_int_equal(cube_error_code(err), CUBE_ERR_IO);
    cube_error_free(err);
    assert_false(core_trace_on());
    /* Stop without a trace: nothing to do. */
    assert_null(cube_trace_stop());
    assert_null(cube_trace_stop());
    /* Events without a trace go nowhere and do not crash. */
    core_trace_span("launch", "k", 1, 0, 10, NULL);
    core_trace_instant("sync", "s", 1, 0, NULL);
}

/* A FIFO is refused at once, whether or not something reads it: an open
 * that waited for a reader would hang the program, and a reader that goes
 * away would raise SIGPIPE in it. SIGALRM ends a regression that blocks. */
static void test_fifo_refused(void **state)
{
    (void)state;
    const char *fifo = tmp_path("trace.fifo");
    unlink(fifo);
    assert_int_equal(mkfifo(fifo, 0600), 0);
    alarm(20);
    cube_error *err = cube_trace_start(fifo);
    alarm(0);
    assert_int_equal(cube_error_code(err), CUBE_ERR_IO);
    assert_non_null(strstr(cube_error_message(err), fifo));
    assert_non_null(strstr(cube_error_message(err), "FIFO"));
    cube_error_free(err);
    assert_false(core_trace_on());

    int reader = open(fifo, O_RDONLY | O_NONBLOCK);
    assert_true(reader >= 0);
    alarm(20);
    err = cube_trace_start(fifo);
    alarm(0);
    assert_int_equal(cube_error_code(err), CUBE_ERR_IO);
    assert_non_null(strstr(cube_error_message(err), "FIFO"));
    cube_error_free(err);
    assert_false(core_trace_on());
    char buf[16];
    assert_true(read(reader, buf, sizeof buf) <= 0); /* nothing written */
    close(reader);
    unlink(fifo);

    /* The writer is free for the next trace. */
    const char *path = tmp_path("after-fifo.json");
    assert_null(cube_trace_start(path));
    assert_null(cube_trace_stop());
    json_t *root;
    load_events(path, &root);
    json_decref(root);
}

/* A regular file is truncated; a character device (/dev/null) is
 * accepted and left as it is. */
static void test_truncates_regular_file(void **state)
{
    (void)state;
    const char *path = tmp_path("truncated.json");
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    for (int i = 0; i < 1000; i++)
        fputs("old contents that must go\n", f);
    assert_int_equal(fclose(f), 0);
    assert_null(cube_trace_start(path));
    assert_null(cube_trace_stop());
    json_t *root;
    load_events(path, &root);
    json_decref(root);
    assert_null(cube_trace_start("/dev/null"));
    assert_null(cube_trace_stop());
}

static void test_twice_and_state(void **state)
{
    (void)state;
    const char *path = tmp_path("twice.json");
    assert_false(core_trace_on());
    assert_null(cube_trace_start(path));
    assert_true(core_trace_on());
    cube_error *err = cube_trace_start(tmp_path("other.json"));
    assert_int_equal(cube_error_code(err), CUBE_ERR_INVALID_ARGUMENT);
    cube_error_free(err);
    err = cube_trace_start(path);
    assert_int_equal(cube_error_code(err), CUBE_ERR_INVALID_ARGUMENT);
    cube_error_free(err);
    assert_true(core_trace_on());
    assert_null(cube_trace_stop());
    assert_false(core_trace_on());
    assert_null(cube_trace_stop());
    /* The refused start did not create its file. */
    assert_int_equal(access(tmp_path("other.json"), F_OK), -1);
    json_t *root;
    load_events(path, &root);
    json_decref(root);
}

static void test_zero_events_is_valid(void **state)
{
    (void)state;
    const char *path = tmp_path("empty.json");
    assert_null(cube_trace_start(path));
    assert_null(cube_trace_stop());
    json_t *root;
    json_t *events = load_events(path, &root);
    assert_int_equal(count_phase(events, "X"), 0);
    assert_int_equal(count_phase(events, "i"), 0);
    /* The process is named. */
    int named = 0;
    size_t i;
    for (i = 0; i < json_array_size(events); i++) {
        json_t *ev = json_array_get(events, i);
        check_event_fields(ev);
        const char *name = str_field(ev, "name");
        if (name && strcmp(name, "process_name") == 0) {
            json_t *args = json_object_get(ev, "args");
            assert_string_equal(str_field(args, "name"), "cubert");
            named++;
        }
    }
    assert_int_equal(named, 1);
    json_decref(root);
}

/* --- the trace-event format's rules ----------------------------------------
 */

enum { MAX_LANES = 1024, MAX_DEPTH = 64 };

/* Checks `events` against the rules of the trace-event format that cubert
 * writes to: known phases; name, pid and tid on every event; a
 * non-negative ts on every event but metadata; X with a non-negative dur;
 * C with an object of numbers as args; every B closed by an E on the same
 * lane (pid, tid) after it, and nothing left open; B, E and C in time
 * order on each lane (X spans are written when they end, so they may come
 * after later events). Returns NULL, or what is wrong (in `why`, or a
 * string literal). */
static const char *trace_rules_broken(json_t *events, char *why, size_t cap)
{
    static json_int_t lane_tid[MAX_LANES];
    static double lane_ts[MAX_LANES];
    static int depth[MAX_LANES];
    size_t lanes = 0;
    for (size_t i = 0; i < json_array_size(events); i++) {
        json_t *ev = json_array_get(events, i);
        if (!json_is_object(ev))
            return snprintf(why, cap, "event %zu is not an object", i), why;
        const char *ph = str_field(ev, "ph");
        if (!ph || strlen(ph) != 1 || !strchr("MXiICBE", ph[0]))
            return snprintf(why, cap, "event %zu: phase '%s'", i,
                            ph ? ph : "(none)"),
                   why;
        if (!str_field(ev, "name"))
            return snprintf(why, cap, "event %zu: no name", i), why;
        if (!json_is_integer(json_object_get(ev, "pid")) ||
            !json_is_integer(json_object_get(ev, "tid")))
            return snprintf(why, cap, "event %zu: no pid or tid", i), why;
        if (ph[0] == 'M')
            continue;
        json_t *tsv = json_object_get(ev, "ts");
        if (!json_is_number(tsv) || json_number_value(tsv) < 0)
            return snprintf(why, cap, "event %zu: bad ts", i), why;
        double ts = json_number_value(tsv);
        if (ph[0] == 'X') {
            json_t *dur = json_object_get(ev, "dur");
            if (!json_is_number(dur) || json_number_value(dur) < 0)
                return snprintf(why, cap, "event %zu: X without dur", i), why;
            continue;
        }
        if (ph[0] == 'C') {
            json_t *args = json_object_get(ev, "args");
            if (!json_is_object(args) || json_object_size(args) == 0)
                return snprintf(why, cap, "event %zu: C without args", i), why;
            const char *key;
            json_t *v;
            json_object_foreach(args, key, v)
            {
                if (!json_is_number(v))
                    return snprintf(why, cap,
                                    "event %zu: C arg '%s' is not "
                                    "a number",
                                    i, key),
                           why;
            }
        }
        if (ph[0] == 'i' || ph[0] == 'I')
            continue;
        /* B, E, C: the lane's order. */
        json_int_t tid = json_integer_value(json_object_get(ev, "tid"));
        size_t l = 0;
        while (l < lanes && lane_tid[l] != tid)
            l++;
        if (l == lanes) {
            if (lanes == MAX_LANES)
                return "too many lanes";
            lane_tid[lanes] = tid;
            lane_ts[lanes] = 0;
            depth[lanes++] = 0;
        }
        if (ts < lane_ts[l])
            return snprintf(why, cap,
                            "event %zu: ts %.3f before %.3f on "
                            "lane %lld",
                            i, ts, lane_ts[l], (long long)tid),
                   why;
        lane_ts[l] = ts;
        if (ph[0] == 'B') {
            if (depth[l] == MAX_DEPTH)
                return "B nested too deep";
            depth[l]++;
        } else if (ph[0] == 'E') {
            if (depth[l] == 0)
                return snprintf(why, cap,
                                "event %zu: E without a B on lane "
                                "%lld",
                                i, (long long)tid),
                       why;
            depth[l]--;
        }
    }
    for (size_t l = 0; l < lanes; l++)
        if (depth[l])
            return snprintf(why, cap, "lane %lld: %d B without an E",
                            (long long)lane_tid[l], depth[l]),
                   why;
    return NULL;
}

static void assert_trace_rules(json_t *events)
{
    char why[200];
    const char *broken = trace_rules_broken(events, why, sizeof why);
    if (broken)
        fail_msg("the trace breaks a rule: %s", broken);
}

/* The checker itself refuses what breaks each rule. */
static void test_rules_checker_refuses_bad_traces(void **state)
{
    (void)state;
    static const char *bad[] = {
        "[{\"ph\":\"Q\",\"name\":\"a\",\"pid\":1,\"tid\":1,\"ts\":0}]",
        "[{\"ph\":\"i\",\"pid\":1,\"tid\":1,\"ts\":0}]",
        "[{\"ph\":\"X\",\"name\":\"a\",\"pid\":1,\"tid\":1,\"ts\":0}]",
        "[{\"ph\":\"C\",\"name\":\"a\",\"pid\":1,\"tid\":1,\"ts\":0,"
        "\"args\":{\"x\":\"1\"}}]",
        "[{\"ph\":\"B\",\"name\":\"a\",\"pid\":1,\"tid\":1,\"ts\":0}]",
        "[{\"ph\":\"E\",\"name\":\"a\",\"pid\":1,\"tid\":1,\"ts\":0}]",
        "[{\"ph\":\"B\",\"name\":\"a\",\"pid\":1,\"tid\":1,\"ts\":5},"
        "{\"ph\":\"E\",\"name\":\"a\",\"pid\":1,\"tid\":1,\"ts\":4}]",
        "[{\"ph\":\"B\",\"name\":\"a\",\"pid\":1,\"tid\":1,\"ts\":1},"
        "{\"ph\":\"E\",\"name\":\"a\",\"pid\":1,\"tid\":2,\"ts\":2}]",
    };
    char why[200];
    for (size_t k = 0; k < sizeof bad / sizeof bad[0]; k++) {
        json_error_t jerr;
        json_t *events = json_loads(bad[k], 0, &jerr);
        assert_non_null(events);
        if (!trace_rules_broken(events, why, sizeof why))
            fail_msg("accepted: %s", bad[k]);
        json_decref(events);
    }
    json_error_t jerr;
    json_t *good = json_loads(
        "[{\"ph\":\"B\",\"name\":\"a\",\"pid\":1,\"tid\":1,\"ts\":1},"
        "{\"ph\":\"C\",\"name\":\"m\",\"pid\":1,\"tid\":1,\"ts\":2,"
        "\"args\":{\"x\":1}},"
        "{\"ph\":\"E\",\"name\":\"a\",\"pid\":1,\"tid\":1,\"ts\":3}]",
        0, &jerr);
    assert_null(trace_rules_broken(good, why, sizeof why));
    json_decref(good);
}

/* Buffers allocated and released on a CPU client: every alloc event and
 * its release name the same buffer, and each is followed by a counter
 * sample of the stream's reserved and live bytes. */
static void test_memory_events_pair_and_count(void **state)
{
    (void)state;
    cube_client *c = NULL;
    assert_null(cube_client_open("cpu", NULL, &c));
    const char *path = tmp_path("memory.json");
    assert_null(cube_trace_start(path));
    cube_handle h[3];
    for (int k = 0; k < 3; k++)
        assert_null(cube_empty(c, 1000u << k, &h[k]));
    /* The second buffer is labelled: a "label" event, and its release
     * carries the label. */
    assert_null(cube_handle_set_label(c, h[1], "weights"));
    for (int k = 0; k < 3; k++)
        assert_null(cube_handle_release(c, h[k]));
    assert_null(cube_sync(c, NULL, 0));
    assert_null(cube_trace_stop());
    cube_client_close(c);

    json_t *root;
    json_t *events = load_events(path, &root);
    assert_trace_rules(events);
    int allocs = 0, releases = 0, counters = 0, labels = 0;
    for (size_t i = 0; i < json_array_size(events); i++) {
        json_t *ev = json_array_get(events, i);
        const char *ph = str_field(ev, "ph");
        const char *name = str_field(ev, "name");
        json_t *args = json_object_get(ev, "args");
        if (strcmp(ph, "C") == 0) {
            assert_true(strncmp(name, "memory 0x", 9) == 0);
            json_t *reserved = json_object_get(args, "reserved");
            json_t *live = json_object_get(args, "live");
            assert_true(json_is_integer(reserved) && json_is_integer(live));
            assert_true(json_integer_value(reserved) >=
                        json_integer_value(live));
            counters++;
            continue;
        }
        if (strcmp(ph, "i") != 0 || strcmp(str_field(ev, "cat"), "memory"))
            continue;
        const char *buffer = str_field(args, "buffer");
        assert_non_null(buffer);
        char want[32];
        int k = 0;
        for (; k < 3; k++) {
            snprintf(want, sizeof want, "0x%016llx",
                     (unsigned long long)h[k].bits);
            if (strcmp(buffer, want) == 0)
                break;
        }
        assert_true(k < 3);
        const char *label = str_field(args, "label");
        if (strcmp(name, "label") == 0) {
            assert_int_equal(k, 1);
            assert_string_equal(label, "weights");
            labels++;
        } else if (strcmp(name, "alloc") == 0) {
            assert_null(label);          /* labels come after the allocation */
            assert_int_equal(allocs, k); /* in order, each once */
            allocs++;
        } else {
            assert_string_equal(name, "release");
            assert_int_equal(releases, k);
            if (k == 1)
                assert_string_equal(label, "weights");
            else
                assert_null(label);
            releases++;
        }
    }
    assert_int_equal(allocs, 3);
    assert_int_equal(releases, 3);
    assert_int_equal(labels, 1);
    assert_int_equal(counters, 6);
    json_decref(root);
}

/* --- many threads, many streams ------------------------------------------- */

enum { THREADS = 8, SPANS = 300, INSTANTS = 50 };

/* Stream k of thread t: a thread's own stream (top bit set) and an
 * application-chosen one. */
static cube_stream_id stream_of(int t, int k)
{
    return k == 0 ? OWN_BIT | (uint64_t)(0x1000 + t) : (uint64_t)(7 + t);
}

/* Every span name needs escaping. */
static void span_name(char *buf, size_t size, int t, int i)
{
    snprintf(buf, size, "k\"%d\\%d\n\ttab\x01", t, i);
}

static void *emit_thread(void *arg)
{
    int t = (int)(intptr_t)arg;
    char name[64], args[128];
    for (int i = 0; i < SPANS; i++) {
        span_name(name, sizeof name, t, i);
        snprintf(args, sizeof args,
                 "{\"thread\":%d,\"i\":%d,\"k\":%d,\"q\":\"a\\\"b\"}", t, i,
                 i % 2);
        uint64_t start = core_clock_ns();
        uint64_t end = core_clock_ns() + (uint64_t)i;
        core_trace_span(i % 3 ? "launch" : "co\"py", name, stream_of(t, i % 2),
                        start, end, args);
    }
    for (int i = 0; i < INSTANTS; i++) {
        snprintf(args, sizeof args, "{\"thread\":%d,\"k\":%d}", t, i % 2);
        core_trace_instant("sync", "barrier", stream_of(t, i % 2),
                           core_clock_ns(), i % 5 ? args : NULL);
    }
    return NULL;
}

static void test_threads_and_streams(void **state)
{
    (void)state;
    const char *path = tmp_path("threads.json");
    assert_null(cube_trace_start(path));
    pthread_t th[THREADS];
    for (int t = 0; t < THREADS; t++)
        assert_int_equal(
            pthread_create(&th[t], NULL, emit_thread, (void *)(intptr_t)t), 0);
    for (int t = 0; t < THREADS; t++)
        pthread_join(th[t], NULL);
    /* A span that began before the trace did starts at 0; one that ends
     * before it begins has no length. */
    core_trace_span("memory", "early", 5, 1, core_clock_ns(), NULL);
    core_trace_span("memory", "backwards", 5, core_clock_ns(), 1,
                    "{\"ok\":true}");
    core_trace_span(NULL, NULL, 5, core_clock_ns(), core_clock_ns(), "");
    assert_null(cube_trace_stop());

    json_t *root;
    json_t *events = load_events(path, &root);
    assert_int_equal(count_phase(events, "X"), THREADS * SPANS + 3);
    assert_int_equal(count_phase(events, "i"), THREADS * INSTANTS);
    int metadata = count_phase(events, "M");
    /* process_name plus one thread_name per stream. */
    assert_int_equal(metadata, 1 + 2 * THREADS + 1);

    int seen[THREADS][SPANS] = {{0}};
    size_t i;
    for (i = 0; i < json_array_size(events); i++) {
        json_t *ev = json_array_get(events, i);
        check_event_fields(ev);
        const char *ph = str_field(ev, "ph");
        if (strcmp(ph, "M") == 0)
            continue;
        json_int_t tid = json_integer_value(json_object_get(ev, "tid"));
        assert_true(tid >= 1);
        const char *tname = thread_name(events, tid);
        assert_non_null(tname);
        json_t *args = json_object_get(ev, "args");
        const char *name = str_field(ev, "name");
        if (strcmp(name, "early") == 0 || strcmp(name, "backwards") == 0 ||
            strcmp(name, "") == 0) {
            assert_string_equal(tname, "stream 0x5");
            if (strcmp(name, "early") == 0)
                assert_true(json_number_value(json_object_get(ev, "ts")) ==
                            0.0);
            if (strcmp(name, "backwards") == 0) {
                assert_true(json_number_value(json_object_get(ev, "dur")) ==
                            0.0);
                assert_true(json_is_true(json_object_get(args, "ok")));
            }
            if (strcmp(name, "") == 0) {
                assert_string_equal(str_field(ev, "cat"), "");
                assert_null(args);
            }
            continue;
        }
        if (strcmp(ph, "i") == 0) {
            assert_string_equal(name, "barrier");
            assert_string_equal(str_field(ev, "cat"), "sync");
            if (!args)
                continue;
        }
        assert_true(json_is_object(args));
        int t = (int)json_integer_value(json_object_get(args, "thread"));
        int k = (int)json_integer_value(json_object_get(args, "k"));
        assert_in_range(t, 0, THREADS - 1);
        char expect[64];
        snprintf(expect, sizeof expect, "stream 0x%" PRIx64, stream_of(t, k));
        assert_string_equal(tname, expect);
        if (strcmp(ph, "X") == 0) {
            int n = (int)json_integer_value(json_object_get(args, "i"));
            assert_in_range(n, 0, SPANS - 1);
            char want[64];
            span_name(want, sizeof want, t, n);
            assert_string_equal(name, want);
            assert_string_equal(str_field(ev, "cat"),
                                n % 3 ? "launch" : "co\"py");
            assert_string_equal(str_field(args, "q"), "a\"b");
            seen[t][n]++;
        }
    }
    for (int t = 0; t < THREADS; t++)
        for (int n = 0; n < SPANS; n++)
            assert_int_equal(seen[t][n], 1);
    assert_trace_rules(events);
    json_decref(root);
}

/* Bytes that are not UTF-8 still make valid JSON. */
static void test_bad_utf8(void **state)
{
    (void)state;
    const char *path = tmp_path("utf8.json");
    assert_null(cube_trace_start(path));
    core_trace_instant("c\xff",
                       "\xc3\xa9t\xc3\xa9 \xe2\x82\xac \xed\xa0\x80\xc3", 3,
                       core_clock_ns(), NULL);
    assert_null(cube_trace_stop());
    json_t *root;
    json_t *events = load_events(path, &root);
    int found = 0;
    size_t i;
    for (i = 0; i < json_array_size(events); i++) {
        json_t *ev = json_array_get(events, i);
        if (strcmp(str_field(ev, "ph"), "i") != 0)
            continue;
        found++;
        assert_string_equal(str_field(ev, "cat"), "c\xef\xbf\xbd");
        assert_non_null(
            strstr(str_field(ev, "name"), "\xc3\xa9t\xc3\xa9 \xe2\x82\xac"));
    }
    assert_int_equal(found, 1);
    json_decref(root);
}

/* A trace whose writes fail is reported by cube_trace_stop. */
static void test_write_failure(void **state)
{
    (void)state;
    if (access("/dev/full", W_OK) != 0)
        skip();
    captured cap = {0};
    cube_log_set_sink(capture_sink, &cap);
    assert_null(cube_trace_start("/dev/full"));
    for (int i = 0; i < 2000; i++)
        core_trace_span("launch", "fill", 1, core_clock_ns(), core_clock_ns(),
                        "{\"padding\":\"xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx\"}");
    cube_error *err = cube_trace_stop();
    cube_log_set_sink(NULL, NULL);
    assert_int_equal(cube_error_code(err), CUBE_ERR_IO);
    assert_non_null(strstr(cube_error_message(err), "/dev/full"));
    cube_error_free(err);
    /* The failure was also logged while the trace ran, once. */
    assert_int_equal(cap.count, 1);
    assert_non_null(strstr(cap.text[0], "/dev/full"));
    assert_false(core_trace_on());
    /* The writer recovers for the next trace. */
    const char *path = tmp_path("after-failure.json");
    assert_null(cube_trace_start(path));
    core_trace_instant("sync", "ok", 1, core_clock_ns(), NULL);
    assert_null(cube_trace_stop());
    json_t *root;
    assert_int_equal(count_phase(load_events(path, &root), "i"), 1);
    json_decref(root);
}

/* Starting and stopping while other threads emit. */
static atomic_int racing;

static void *race_thread(void *arg)
{
    cube_stream_id s = (cube_stream_id)(intptr_t)arg;
    while (atomic_load(&racing)) {
        core_trace_span("launch", "race", s, core_clock_ns(), core_clock_ns(),
                        "{\"n\":1}");
        core_trace_instant("sync", "race", s | OWN_BIT, core_clock_ns(), NULL);
    }
    return NULL;
}

static void test_start_stop_while_emitting(void **state)
{
    (void)state;
    atomic_store(&racing, 1);
    pthread_t th[4];
    for (int t = 0; t < 4; t++)
        assert_int_equal(pthread_create(&th[t], NULL, race_thread,
                                        (void *)(intptr_t)(t + 1)),
                         0);
    for (int round = 0; round < 20; round++) {
        char name[32];
        snprintf(name, sizeof name, "race-%d.json", round % 2);
        const char *path = tmp_path(name);
        assert_null(cube_trace_start(path));
        usleep(1000);
        assert_null(cube_trace_stop());
        json_t *root;
        load_events(path, &root);
        json_decref(root);
    }
    atomic_store(&racing, 0);
    for (int t = 0; t < 4; t++)
        pthread_join(th[t], NULL);
}

/* --- through the public API ----------------------------------------------- */

static const char *scale_add_source =
    "CUBE_KERNEL(scale_add, CUBE_IN(float, x), CUBE_INOUT(float, y),\n"
    "            CUBE_SCALAR(float, a))\n"
    "{\n"
    "    int i = (int)ABSOLUTE_POS_X;\n"
    "    if (i < (int)CUBE_LEN(y))\n"
    "        CUBE_AT(y, i) = a * CUBE_AT(x, i) + CUBE_AT(y, i);\n"
    "}\n";

static void check(cube_error *err)
{
    if (err) {
        char *text = cube_error_format(err);
        cube_error_free(err);
        fail_msg("%s", text ? text : "out of memory");
    }
}

static void test_end_to_end(void **state)
{
    (void)state;
    enum { N = 1000 };
    static float x[N], y[N];
    for (int i = 0; i < N; i++) {
        x[i] = (float)i;
        y[i] = 1.0f;
    }
    const char *path = tmp_path("client.json");
    assert_null(cube_trace_start(path));

    cube_client *client;
    cube_kernel *kernel;
    cube_handle hx, hy;
    cube_kernel_desc desc = {"scale_add", scale_add_source, {256, 1, 1}};
    check(cube_client_open("cpu", NULL, &client));
    check(cube_kernel_create(&desc, &kernel));
    check(cube_create(client, x, sizeof x, &hx));
    check(cube_empty(client, sizeof y, &hy));
    cube_copy_desc dy = cube_copy_desc_contiguous(hy, sizeof y, sizeof(float));
    const void *src[] = {y};
    uint64_t size[] = {sizeof y};
    check(cube_write(client, &dy, src, size, 1));
    cube_arg args[] = {cube_arg_buffer(hx), cube_arg_buffer(hy),
                       cube_arg_f32(2.0f)};
    check(cube_launch(client, kernel, cube_count_static((N + 255) / 256, 1, 1),
                      args, 3, CUBE_LAUNCH_EXECUTE));
    check(cube_sync(client, &hy, 1));
    void *dst[] = {y};
    check(cube_read(client, &dy, dst, size, 1));
    assert_true(y[10] == 21.0f);
    check(cube_handle_release(client, hx));
    check(cube_handle_release(client, hy));
    cube_kernel_release(kernel);
    cube_client_close(client);
    assert_null(cube_trace_stop());

    json_t *root;
    json_t *events = load_events(path, &root);
    static const char *const cats[] = {"launch", "copy", "memory", "sync"};
    for (size_t c = 0; c < sizeof cats / sizeof cats[0]; c++) {
        int n = 0;
        size_t i;
        for (i = 0; i < json_array_size(events); i++) {
            json_t *ev = json_array_get(events, i);
            check_event_fields(ev);
            const char *cat = str_field(ev, "cat");
            if (cat && strcmp(cat, cats[c]) == 0)
                n++;
        }
        if (n == 0)
            fail_msg("no event of category '%s' in %s", cats[c], path);
    }
    assert_trace_rules(events);
    json_decref(root);
}

/* --- compile events ------------------------------------------------------ */

static const char *reverse_source =
    "CUBE_KERNEL(reverse64, CUBE_INOUT(float, y), CUBE_SHARED(float, t, 64))\n"
    "{\n"
    "    uint32_t u = UNIT_POS_X;\n"
    "    t[u] = CUBE_AT(y, u);\n"
    "    cube_sync();\n"
    "    CUBE_AT(y, u) = t[63 - u];\n"
    "}\n";

static int remove_entry(const char *path, const struct stat *st, int flag,
                        struct FTW *ftw)
{
    (void)st;
    (void)flag;
    (void)ftw;
    return remove(path);
}

/* Opens a CPU client on the cache directory `dir`, launches scale_add and
 * reverse64 `times` times each, and closes it (the device with it). */
static void launch_on_fresh_device(const char *dir, int times)
{
    cube_client_options opts = cube_client_options_default();
    opts.cache_dir = dir;
    cube_client *client;
    check(cube_client_open("cpu", &opts, &client));
    cube_kernel *sa, *rev;
    cube_kernel_desc d1 = {"scale_add", scale_add_source, {64, 1, 1}};
    cube_kernel_desc d2 = {"reverse64", reverse_source, {64, 1, 1}};
    check(cube_kernel_create(&d1, &sa));
    check(cube_kernel_create(&d2, &rev));
    cube_handle hx, hy;
    check(cube_empty(client, 64 * sizeof(float), &hx));
    check(cube_empty(client, 64 * sizeof(float), &hy));
    for (int i = 0; i < times; i++) {
        cube_arg a1[] = {cube_arg_buffer(hx), cube_arg_buffer(hy),
                         cube_arg_f32(2.0f)};
        check(cube_launch(client, sa, cube_count_static(1, 1, 1), a1, 3,
                          CUBE_LAUNCH_EXECUTE));
        cube_arg a2[] = {cube_arg_buffer(hy)};
        check(cube_launch(client, rev, cube_count_static(1, 1, 1), a2, 1,
                          CUBE_LAUNCH_EXECUTE));
    }
    check(cube_sync(client, NULL, 0));
    check(cube_handle_release(client, hx));
    check(cube_handle_release(client, hy));
    cube_kernel_release(sa);
    cube_kernel_release(rev);
    cube_client_close(client);
}

/* A compile, hits in memory, then (a new device on the same cache
 * directory) hits on disk: each request is an event of category "compile"
 * on the launching thread's lane, with its outcome. */
static void test_compile_events(void **state)
{
    (void)state;
    const char *cache = tmp_path("kernel-cache");
    assert_int_equal(mkdir(cache, 0700), 0);
    const char *path = tmp_path("compile.json");
    assert_null(cube_trace_start(path));
    launch_on_fresh_device(cache, 3);
    launch_on_fresh_device(cache, 1);
    assert_null(cube_trace_stop());

    json_t *root;
    json_t *events = load_events(path, &root);
    assert_trace_rules(events);
    int compiled[2] = {0}, disk[2] = {0}, memory = 0;
    json_int_t lane = -1, launch_lane = -1;
    for (size_t i = 0; i < json_array_size(events); i++) {
        json_t *ev = json_array_get(events, i);
        check_event_fields(ev);
        const char *cat = str_field(ev, "cat");
        json_int_t tid = json_integer_value(json_object_get(ev, "tid"));
        if (cat && strcmp(cat, "launch") == 0)
            launch_lane = tid;
        if (!cat || strcmp(cat, "compile") != 0)
            continue;
        if (lane < 0)
            lane = tid;
        assert_int_equal(tid, lane);
        const char *name = str_field(ev, "name");
        int k = strcmp(name, "scale_add") == 0 ? 0 : 1;
        if (k == 1)
            assert_string_equal(name, "reverse64");
        json_t *args = json_object_get(ev, "args");
        const char *outcome = str_field(args, "outcome");
        const char *ph = str_field(ev, "ph");
        assert_non_null(outcome);
        assert_string_equal(str_field(args, "backend"), "cpu");
        assert_true(json_is_false(json_object_get(args, "checked")));
        const char *barrier = str_field(args, "barrier_pass");
        if (strcmp(outcome, "memory hit") == 0) {
            assert_string_equal(ph, "i");
            memory++;
            continue;
        }
        assert_string_equal(ph, "X");
        /* Only reverse64 calls cube_sync(): the barrier pass ran on the
         * compile (or refused the kernel), its output came from disk on
         * the disk hit. */
        if (k == 0)
            assert_null(barrier);
        else
            assert_non_null(barrier);
        if (strcmp(outcome, "compiled") == 0) {
            assert_int_equal(disk[k], 0); /* compiled before any disk hit */
            if (k == 1)
                assert_true(strcmp(barrier, "ran") == 0 ||
                            strcmp(barrier, "refused") == 0);
            compiled[k]++;
        } else {
            assert_string_equal(outcome, "disk hit");
            if (k == 1)
                assert_true(strcmp(barrier, "disk") == 0 ||
                            strcmp(barrier, "refused") == 0);
            disk[k]++;
        }
    }
    assert_int_equal(compiled[0], 1);
    assert_int_equal(compiled[1], 1);
    assert_int_equal(disk[0], 1);
    assert_int_equal(disk[1], 1);
    assert_int_equal(memory, 4); /* launches 2 and 3 on the first device */
    assert_int_equal(lane, launch_lane); /* the launching thread's lane */
    json_decref(root);
}

/* --- ranges ----------------------------------------------------------------
 */

enum { RANGE_THREADS = 2, RANGE_STEPS = 20 };

typedef struct range_arg {
    cube_client *client;
    int t;
} range_arg;

/* Nested ranges with names that need escaping, around allocations (whose
 * events go to the same track). */
static void *range_thread(void *p)
{
    range_arg *a = p;
    char outer[64];
    snprintf(outer, sizeof outer, "thread %d \"outer\"", a->t);
    check(cube_range_push(a->client, outer));
    for (int i = 0; i < RANGE_STEPS; i++) {
        char step[64];
        snprintf(step, sizeof step, "step\t%d\\%d\n", a->t, i);
        check(cube_range_push(a->client, step));
        check(cube_range_push(a->client, "inner \xc3\xa9"));
        cube_handle h;
        check(cube_empty(a->client, 4096, &h));
        check(cube_handle_release(a->client, h));
        check(cube_range_pop(a->client));
        check(cube_range_pop(a->client));
    }
    check(cube_range_pop(a->client));
    return NULL;
}

/* Two threads nest ranges at once; the main thread leaves two open, which
 * the client's close ends. */
static void test_ranges_two_threads(void **state)
{
    (void)state;
    const char *path = tmp_path("ranges.json");
    assert_null(cube_trace_start(path));
    cube_client *c;
    check(cube_client_open("cpu", NULL, &c));
    check(cube_range_push(c, "left open"));
    check(cube_range_push(c, "left open too"));
    pthread_t th[RANGE_THREADS];
    range_arg args[RANGE_THREADS];
    for (int t = 0; t < RANGE_THREADS; t++) {
        args[t] = (range_arg){c, t};
        assert_int_equal(pthread_create(&th[t], NULL, range_thread, &args[t]),
                         0);
    }
    for (int t = 0; t < RANGE_THREADS; t++)
        pthread_join(th[t], NULL);
    cube_client_close(c);
    assert_null(cube_trace_stop());

    json_t *root;
    json_t *events = load_events(path, &root);
    assert_trace_rules(events);
    json_int_t outer_tid[RANGE_THREADS] = {-1, -1};
    int begins = 0, ends = 0, steps = 0, inner = 0, left = 0;
    for (size_t i = 0; i < json_array_size(events); i++) {
        json_t *ev = json_array_get(events, i);
        const char *ph = str_field(ev, "ph");
        if (strcmp(ph, "B") != 0 && strcmp(ph, "E") != 0)
            continue;
        assert_string_equal(str_field(ev, "cat"), "range");
        const char *name = str_field(ev, "name");
        json_int_t tid = json_integer_value(json_object_get(ev, "tid"));
        if (ph[0] == 'E') {
            ends++;
            continue;
        }
        begins++;
        int t;
        if (sscanf(name, "thread %d", &t) == 1) {
            char want[64];
            snprintf(want, sizeof want, "thread %d \"outer\"", t);
            assert_string_equal(name, want);
            outer_tid[t] = tid;
        } else if (strncmp(name, "step\t", 5) == 0) {
            assert_non_null(strchr(name, '\\'));
            assert_int_equal(name[strlen(name) - 1], '\n');
            steps++;
        } else if (strcmp(name, "inner \xc3\xa9") == 0) {
            inner++;
        } else {
            assert_true(strncmp(name, "left open", 9) == 0);
            left++;
        }
    }
    assert_int_equal(begins, ends);
    assert_int_equal(steps, RANGE_THREADS * RANGE_STEPS);
    assert_int_equal(inner, RANGE_THREADS * RANGE_STEPS);
    assert_int_equal(left, 2);
    /* Each thread on a track of its own. */
    assert_true(outer_tid[0] >= 0 && outer_tid[1] >= 0);
    assert_true(outer_tid[0] != outer_tid[1]);
    json_decref(root);
}

static void expect_code(cube_error *err, cube_code code)
{
    assert_non_null(err);
    assert_int_equal(cube_error_code(err), code);
    cube_error_free(err);
}

static cube_client *closing_client;
static int closing_refused;

static void push_while_closing(void *arg)
{
    (void)arg;
    cube_error *err = cube_range_push(closing_client, "late");
    closing_refused = cube_error_code(err) == CUBE_ERR_INVALID_ARGUMENT;
    cube_error_free(err);
}

/* Bad calls get clear errors and change nothing; without a trace, ranges
 * are no-ops; a trace restarted in between gets no stray end. */
static void test_range_errors(void **state)
{
    (void)state;
    cube_client *c;
    check(cube_client_open("cpu", NULL, &c));
    /* No trace: nothing recorded, nothing refused but NULL arguments. */
    expect_code(cube_range_push(NULL, "x"), CUBE_ERR_INVALID_ARGUMENT);
    expect_code(cube_range_pop(NULL), CUBE_ERR_INVALID_ARGUMENT);
    expect_code(cube_range_push(c, NULL), CUBE_ERR_INVALID_ARGUMENT);
    assert_null(cube_range_push(c, "ignored"));
    assert_null(cube_range_pop(c));
    assert_null(cube_range_pop(c));

    const char *path = tmp_path("range-errors.json");
    assert_null(cube_trace_start(path));
    expect_code(cube_range_push(c, NULL), CUBE_ERR_INVALID_ARGUMENT);
    expect_code(cube_range_pop(c), CUBE_ERR_INVALID_ARGUMENT);
    /* The depth limit. */
    for (int i = 0; i < CUBE_RANGE_MAX_DEPTH; i++)
        check(cube_range_push(c, "deep"));
    expect_code(cube_range_push(c, "too deep"), CUBE_ERR_RESOURCE_LIMIT);
    for (int i = 0; i < CUBE_RANGE_MAX_DEPTH; i++)
        check(cube_range_pop(c));
    expect_code(cube_range_pop(c), CUBE_ERR_INVALID_ARGUMENT);
    /* A long name is cut at a character boundary: "ab" then 2-byte
     * characters, so byte 255 is the second byte of one. */
    enum { LONG = 100000 };
    char *name = malloc(LONG + 1);
    assert_non_null(name);
    name[0] = 'a';
    name[1] = 'b';
    for (size_t i = 2; i + 1 < LONG; i += 2) {
        name[i] = (char)0xc3;
        name[i + 1] = (char)0xa9;
    }
    name[LONG - 1] = 'z';
    name[LONG] = '\0';
    check(cube_range_push(c, name));
    free(name);
    check(cube_range_pop(c));
    /* Left open when the trace stops: ended in its file. */
    check(cube_range_push(c, "across the stop"));
    assert_null(cube_trace_stop());
    /* The client is still usable. */
    cube_handle h;
    check(cube_empty(c, 64, &h));
    check(cube_handle_release(c, h));

    json_t *root;
    json_t *events = load_events(path, &root);
    assert_trace_rules(events);
    int long_seen = 0, stopped = 0;
    for (size_t i = 0; i < json_array_size(events); i++) {
        json_t *ev = json_array_get(events, i);
        const char *ph = str_field(ev, "ph");
        const char *n = str_field(ev, "name");
        if (strcmp(ph, "B") == 0 && strncmp(n, "ab", 2) == 0) {
            assert_int_equal(strlen(n), 254); /* "ab" + 126 characters */
            assert_int_equal((unsigned char)n[strlen(n) - 1], 0xa9);
            long_seen++;
        }
        if (strcmp(ph, "E") == 0 && strcmp(n, "trace stop") == 0)
            stopped++;
        assert_string_not_equal(n, "ignored");
        assert_string_not_equal(n, "too deep");
    }
    assert_int_equal(long_seen, 1);
    assert_int_equal(stopped, 1);
    json_decref(root);

    /* A new trace: the old range's pop writes no end into it, and the
     * close's check refuses pushes once closing has begun. */
    const char *again = tmp_path("range-again.json");
    assert_null(cube_trace_start(again));
    check(cube_range_pop(c));
    expect_code(cube_range_pop(c), CUBE_ERR_INVALID_ARGUMENT);
    check(cube_range_push(c, "closed by the close"));
    closing_client = c;
    closing_refused = 0;
    c->closing_hook = push_while_closing;
    cube_client_close(c);
    assert_true(closing_refused);
    assert_null(cube_trace_stop());
    events = load_events(again, &root);
    assert_trace_rules(events);
    assert_int_equal(count_phase(events, "B"), 1);
    assert_int_equal(count_phase(events, "E"), 1);
    json_decref(root);
}

int main(void)
{
    /* No configuration file from the user's home, and a CUBERT_TRACE that
     * cannot be opened, for test_from_env_failure_warns. */
    setenv("CUBERT_CONFIG", "", 1);
    unsetenv("CUBERT_LOG_FILE");
    const char *base = getenv("TMPDIR");
    if (!base || base[0] != '/')
        base = "/tmp";
    snprintf(tmp_dir, sizeof tmp_dir, "%s/cubert-trace-XXXXXX", base);
    if (!mkdtemp(tmp_dir)) {
        perror("mkdtemp");
        return 1;
    }
    setenv("CUBERT_TRACE", "/nonexistent-cubert-dir/env-trace.json", 1);

    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_from_env_failure_warns),
        cmocka_unit_test(test_clock),
        cmocka_unit_test(test_argument_errors),
        cmocka_unit_test(test_fifo_refused),
        cmocka_unit_test(test_truncates_regular_file),
        cmocka_unit_test(test_twice_and_state),
        cmocka_unit_test(test_zero_events_is_valid),
        cmocka_unit_test(test_threads_and_streams),
        cmocka_unit_test(test_rules_checker_refuses_bad_traces),
        cmocka_unit_test(test_memory_events_pair_and_count),
        cmocka_unit_test(test_bad_utf8),
        cmocka_unit_test(test_write_failure),
        cmocka_unit_test(test_start_stop_while_emitting),
        cmocka_unit_test(test_end_to_end),
        cmocka_unit_test(test_compile_events),
        cmocka_unit_test(test_ranges_two_threads),
        cmocka_unit_test(test_range_errors),
    };
    int failed = cmocka_run_group_tests(tests, NULL, NULL);

    static const char *const files[] = {
        "twice.json",         "empty.json",     "threads.json", "utf8.json",
        "after-failure.json", "race-0.json",    "race-1.json",  "client.json",
        "after-fifo.json",    "truncated.json", "compile.json"};
    for (size_t i = 0; i < sizeof files / sizeof files[0]; i++)
        unlink(tmp_path(files[i]));
    nftw(tmp_dir, remove_entry, 16, FTW_DEPTH | FTW_PHYS);
    return failed;
}
