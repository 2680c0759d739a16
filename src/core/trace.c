/* Tracing: Chrome trace-event JSON, object form.
 *
 *   {"traceEvents":[
 *   {"ph":"M","name":"process_name",...,"args":{"name":"cubert"}},
 *   {"ph":"M","name":"thread_name",...,"args":{"name":"stream 0x..."}},
 *   {"ph":"X","cat":"launch","name":"k","pid":..,"tid":1,"ts":..,"dur":..},
 *   ...
 *   ],"displayTimeUnit":"ms"}
 *
 * One mutex guards the writer: the FILE, the stream-to-tid table and the
 * trace's start time. An event's strings are escaped into a local buffer
 * before the lock is taken, so the lock covers only the table lookup and
 * one buffered write. `trace_active` mirrors "a trace is open" for the
 * hooks' fast path, a single atomic load.
 *
 * Stream ids are 64-bit (a thread's own stream has the top bit set); the
 * viewers want small thread ids, so each stream gets the next tid (1, 2,
 * ...) the first time it appears, together with a thread_name event that
 * names it "stream 0x<id>".
 *
 * A trace that is still open when the process exits is finished by an
 * atexit handler. A child made by fork() does not inherit the trace: its
 * copy of the file's unwritten buffer is discarded, so it cannot duplicate
 * or corrupt the parent's output. */
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "base/clock.h"
#include "base/error.h"
#include "base/mutex.h"
#include "core/config.h"
#include "core/file_open.h"
#include "core/trace.h"
#include "cubert/backend/errors.h"
#include "cubert/log.h"
#include "cubert/profile.h"

/* --- state ---------------------------------------------------------------- */

typedef struct stream_slot {
    cube_stream_id id;
    uint32_t tid;  /* 0: empty */
    uint32_t open; /* "B" events not yet ended by an "E" */
} stream_slot;

static atomic_int trace_active;
static cube_mutex trace_lock = CUBE_MUTEX_INIT;
static pthread_once_t trace_hooks_once = PTHREAD_ONCE_INIT;
static pthread_once_t trace_env_once = PTHREAD_ONCE_INIT;

/* Everything below is under trace_lock. */
static FILE *trace_file CUBE_GUARDED_BY(trace_lock);
static char *trace_path CUBE_GUARDED_BY(trace_lock);
static uint64_t trace_t0 CUBE_GUARDED_BY(trace_lock);
static long trace_pid CUBE_GUARDED_BY(trace_lock);
static int trace_failed CUBE_GUARDED_BY(trace_lock); /* a write failed */
static int trace_warned CUBE_GUARDED_BY(trace_lock); /* that was logged */
/* events dropped for want of memory */
static uint64_t trace_lost CUBE_GUARDED_BY(trace_lock);
/* open addressing, capacity a power of two */
static stream_slot *streams CUBE_GUARDED_BY(trace_lock);
static size_t stream_cap CUBE_GUARDED_BY(trace_lock);
static size_t stream_count CUBE_GUARDED_BY(trace_lock);
static uint32_t next_tid CUBE_GUARDED_BY(trace_lock);

uint64_t core_clock_ns(void)
{
    return cube_clock_ns();
}

int core_trace_on(void)
{
    return atomic_load_explicit(&trace_active, memory_order_acquire);
}

/* --- a growable text buffer ----------------------------------------------- */

typedef struct text {
    char *p;
    size_t len, cap;
    int oom;
    char local[768];
} text;

static void text_init(text *t)
{
    t->p = t->local;
    t->len = 0;
    t->cap = sizeof t->local;
    t->oom = 0;
    t->local[0] = '\0';
}

static void text_free(text *t)
{
    if (t->p != t->local)
        free(t->p);
}

/* Makes room for `more` bytes plus a terminator. Returns 0 on success. */
static int text_reserve(text *t, size_t more)
{
    if (t->oom)
        return -1;
    if (more < t->cap - t->len)
        return 0;
    size_t cap = t->cap;
    while (more >= cap - t->len) {
        if (cap > SIZE_MAX / 2) {
            t->oom = 1;
            return -1;
        }
        cap *= 2;
    }
    char *p = t->p == t->local ? malloc(cap) : realloc(t->p, cap);
    if (!p) {
        t->oom = 1;
        return -1;
    }
    if (t->p == t->local)
        memcpy(p, t->local, t->len + 1);
    t->p = p;
    t->cap = cap;
    return 0;
}

static void text_put(text *t, const char *s, size_t n)
{
    if (text_reserve(t, n) != 0)
        return;
    memcpy(t->p + t->len, s, n);
    t->len += n;
    t->p[t->len] = '\0';
}

static void text_puts(text *t, const char *s)
{
    text_put(t, s, strlen(s));
}

/* The length of the valid UTF-8 sequence at `s` (1..4), or 0 when the
 * bytes there are not one (overlong forms and surrogates included). */
static size_t utf8_sequence(const unsigned char *s)
{
    unsigned char c = s[0];
    if (c < 0x80)
        return 1;
    size_t n;
    unsigned char lo = 0x80, hi = 0xBF;
    if (c >= 0xC2 && c <= 0xDF)
        n = 2;
    else if (c >= 0xE0 && c <= 0xEF) {
        n = 3;
        if (c == 0xE0)
            lo = 0xA0;
        else if (c == 0xED)
            hi = 0x9F;
    } else if (c >= 0xF0 && c <= 0xF4) {
        n = 4;
        if (c == 0xF0)
            lo = 0x90;
        else if (c == 0xF4)
            hi = 0x8F;
    } else
        return 0;
    if (s[1] < lo || s[1] > hi)
        return 0;
    for (size_t i = 2; i < n; i++)
        if (s[i] < 0x80 || s[i] > 0xBF)
            return 0;
    return n;
}

/* Appends `s` as a JSON string: quotes, backslashes and control characters
 * escaped, bytes that are not UTF-8 replaced by U+FFFD. NULL is "". */
static void text_json_string(text *t, const char *s)
{
    static const char hex[] = "0123456789abcdef";
    text_put(t, "\"", 1);
    const unsigned char *u = (const unsigned char *)(s ? s : "");
    while (*u) {
        const unsigned char *run = u;
        while (*u >= 0x20 && *u < 0x80 && *u != '"' && *u != '\\')
            u++;
        if (u > run)
            text_put(t, (const char *)run, (size_t)(u - run));
        if (!*u)
            break;
        unsigned char c = *u;
        switch (c) {
        case '"': text_put(t, "\\\"", 2); break;
        case '\\': text_put(t, "\\\\", 2); break;
        case '\n': text_put(t, "\\n", 2); break;
        case '\r': text_put(t, "\\r", 2); break;
        case '\t': text_put(t, "\\t", 2); break;
        case '\b': text_put(t, "\\b", 2); break;
        case '\f': text_put(t, "\\f", 2); break;
        default:
            if (c < 0x20) {
                char esc[6] = {'\\', 'u', '0', '0', hex[c >> 4], hex[c & 15]};
                text_put(t, esc, sizeof esc);
            } else {
                size_t n = utf8_sequence(u);
                if (n == 0) {
                    text_put(t, "\\ufffd", 6);
                    n = 1;
                } else {
                    text_put(t, (const char *)u, n);
                }
                u += n;
                continue;
            }
        }
        u++;
    }
    text_put(t, "\"", 1);
}

/* --- the writer (all under trace_lock) ------------------------------------ */

static uint32_t hash_stream(cube_stream_id id)
{
    id ^= id >> 33;
    id *= 0xff51afd7ed558ccdull;
    id ^= id >> 33;
    id *= 0xc4ceb9fe1a85ec53ull;
    id ^= id >> 33;
    return (uint32_t)id;
}

/* Called with trace_lock held. */
static void streams_clear(void) CUBE_REQUIRES(trace_lock);
static int streams_grow(void) CUBE_REQUIRES(trace_lock);
static void note_write(int rc) CUBE_REQUIRES(trace_lock);
static stream_slot *stream_find(cube_stream_id stream)
    CUBE_REQUIRES(trace_lock);
static uint32_t stream_tid(cube_stream_id stream) CUBE_REQUIRES(trace_lock);
static double trace_us(uint64_t ns) CUBE_REQUIRES(trace_lock);

static void streams_clear(void)
{
    free(streams);
    streams = NULL;
    stream_cap = stream_count = 0;
    next_tid = 1;
}

/* Doubles the table (or makes the first one). Returns 0 on success. */
static int streams_grow(void)
{
    size_t cap = stream_cap ? stream_cap * 2 : 64;
    stream_slot *fresh = calloc(cap, sizeof *fresh);
    if (!fresh)
        return -1;
    for (size_t i = 0; i < stream_cap; i++) {
        if (!streams[i].tid)
            continue;
        size_t j = hash_stream(streams[i].id) & (cap - 1);
        while (fresh[j].tid)
            j = (j + 1) & (cap - 1);
        fresh[j] = streams[i];
    }
    free(streams);
    streams = fresh;
    stream_cap = cap;
    return 0;
}

static void note_write(int rc)
{
    if (rc < 0)
        trace_failed = 1;
}

/* The slot of `stream`, or NULL when it has none yet. */
static stream_slot *stream_find(cube_stream_id stream)
{
    if (stream_cap) {
        size_t j = hash_stream(stream) & (stream_cap - 1);
        while (streams[j].tid) {
            if (streams[j].id == stream)
                return &streams[j];
            j = (j + 1) & (stream_cap - 1);
        }
    }
    return NULL;
}

/* The tid of `stream`, assigning one (and writing its thread_name event)
 * on first sight. 0 when memory ran out. */
static uint32_t stream_tid(cube_stream_id stream)
{
    stream_slot *known = stream_find(stream);
    if (known)
        return known->tid;
    if ((stream_count + 1) * 2 > stream_cap && streams_grow() != 0)
        return 0;
    size_t j = hash_stream(stream) & (stream_cap - 1);
    while (streams[j].tid)
        j = (j + 1) & (stream_cap - 1);
    streams[j].id = stream;
    streams[j].tid = next_tid++;
    stream_count++;
    note_write(fprintf(trace_file,
                       ",\n{\"ph\":\"M\",\"name\":\"thread_name\",\"pid\":%ld,"
                       "\"tid\":%" PRIu32
                       ",\"args\":{\"name\":\"stream 0x%" PRIx64 "\"}}",
                       trace_pid, streams[j].tid, (uint64_t)stream));
    return streams[j].tid;
}

/* Microseconds from the trace's start to `ns` (0 for earlier times). */
static double trace_us(uint64_t ns)
{
    return ns > trace_t0 ? (double)(ns - trace_t0) / 1000.0 : 0.0;
}

/* Builds the parts of an event that do not need the lock:
 *   head = {"ph":"<ph>","cat":"..","name":"..",
 *   tail = ,"args":{..}}     (or just } without args) */
static void event_parts(text *head, text *tail, const char *ph, const char *cat,
                        const char *name, const char *args_json)
{
    text_puts(head, "{\"ph\":\"");
    text_puts(head, ph);
    text_puts(head, "\",\"cat\":");
    text_json_string(head, cat);
    text_puts(head, ",\"name\":");
    text_json_string(head, name);
    if (args_json) {
        while (*args_json == ' ' || *args_json == '\t' || *args_json == '\n' ||
               *args_json == '\r')
            args_json++;
    }
    if (args_json && *args_json == '{') {
        text_puts(tail, ",\"args\":");
        text_puts(tail, args_json);
    }
    text_put(tail, "}", 1);
}

/* Logs a write failure once per trace; called without the lock. */
static void report_failure(int failed_now, const char *path)
{
    if (failed_now)
        cube_log_write(CUBE_LOG_WARN, "trace",
                       "writing the trace to '%s' failed; the trace will be "
                       "incomplete",
                       path);
}

/* Writes an event built by event_parts on lane `tid`. */
static void trace_write(const char *ph, const char *head, const char *tail,
                        uint32_t tid, uint64_t at_ns, uint64_t end_ns)
    CUBE_REQUIRES(trace_lock);
static void trace_write(const char *ph, const char *head, const char *tail,
                        uint32_t tid, uint64_t at_ns, uint64_t end_ns)
{
    int now = ph[0] == 'C' || ph[0] == 'B' || ph[0] == 'E';
    if (now)
        at_ns = core_clock_ns(); /* ordered by the lock */
    double ts = trace_us(at_ns);
    if (now)
        note_write(fprintf(
            trace_file, ",\n%s,\"pid\":%ld,\"tid\":%" PRIu32 ",\"ts\":%.3f%s",
            head, trace_pid, tid, ts, tail));
    else if (ph[0] == 'X')
        note_write(fprintf(
            trace_file,
            ",\n%s,\"pid\":%ld,\"tid\":%" PRIu32 ",\"ts\":%.3f,\"dur\":%.3f%s",
            head, trace_pid, tid, ts, trace_us(end_ns) - ts, tail));
    else
        note_write(fprintf(trace_file,
                           ",\n%s,\"s\":\"t\",\"pid\":%ld,\"tid\":%" PRIu32
                           ",\"ts\":%.3f%s",
                           head, trace_pid, tid, ts, tail));
    if (ferror(trace_file))
        trace_failed = 1;
}

/* Writes one event: `ph` "X" spans [at_ns, end_ns), "i" is an instant at
 * at_ns (end_ns unused); "C" a counter sample, "B" and "E" a range's
 * begin and end, at the time of writing (at_ns and end_ns unused). An "E"
 * on a lane without an open "B" is dropped: its "B" went to an earlier
 * trace. */
static void trace_emit(const char *ph, const char *cat, const char *name,
                       cube_stream_id stream, uint64_t at_ns, uint64_t end_ns,
                       const char *args_json)
{
    text head, tail;
    text_init(&head);
    text_init(&tail);
    event_parts(&head, &tail, ph, cat, name, args_json);
    int fail_now = 0;
    char path[256] = "";
    cube_mutex_lock(&trace_lock);
    if (trace_file) {
        /* A range's end needs its begin open on the lane in this trace. */
        stream_slot *slot = ph[0] == 'E' ? stream_find(stream) : NULL;
        int range = ph[0] == 'B' || ph[0] == 'E';
        if (ph[0] == 'E' && (!slot || !slot->open)) {
            /* its begin went to an earlier trace */
        } else if (head.oom || tail.oom) {
            trace_lost++;
        } else {
            uint32_t tid = stream_tid(stream);
            /* The table may have grown: the slot is looked up again. */
            slot = range && tid ? stream_find(stream) : NULL;
            if (range && !slot) {
                trace_lost++; /* a begin without a lane to count it on */
            } else {
                if (slot)
                    slot->open += ph[0] == 'B' ? 1u : (uint32_t)-1;
                trace_write(ph, head.p, tail.p, tid, at_ns, end_ns);
            }
        }
        if (trace_failed && !trace_warned) {
            trace_warned = 1;
            fail_now = 1;
            snprintf(path, sizeof path, "%s", trace_path);
        }
    }
    cube_mutex_unlock(&trace_lock);
    report_failure(fail_now, path);
    text_free(&head);
    text_free(&tail);
}

void core_trace_span(const char *cat, const char *name, cube_stream_id stream,
                     uint64_t start_ns, uint64_t end_ns, const char *args_json)
{
    if (!core_trace_on())
        return;
    trace_emit("X", cat, name, stream, start_ns,
               end_ns > start_ns ? end_ns : start_ns, args_json);
}

void core_trace_instant(const char *cat, const char *name,
                        cube_stream_id stream, uint64_t at_ns,
                        const char *args_json)
{
    if (!core_trace_on())
        return;
    trace_emit("i", cat, name, stream, at_ns, at_ns, args_json);
}

void core_trace_counter(const char *name, cube_stream_id stream,
                        const char *args_json)
{
    if (!core_trace_on())
        return;
    trace_emit("C", "memory", name, stream, 0, 0, args_json);
}

void core_trace_range(int begin, const char *name, cube_stream_id lane)
{
    if (!core_trace_on())
        return;
    trace_emit(begin ? "B" : "E", "range", name, lane, 0, 0, NULL);
}

/* Ends every range still open on each lane, at the trace's stop, so that
 * every "B" of the file has its "E". */
static void close_open_ranges(FILE *f) CUBE_REQUIRES(trace_lock);
static void close_open_ranges(FILE *f)
{
    double ts = trace_us(core_clock_ns());
    for (size_t i = 0; i < stream_cap; i++)
        for (; streams[i].tid && streams[i].open; streams[i].open--)
            note_write(fprintf(f,
                               ",\n{\"ph\":\"E\",\"cat\":\"range\","
                               "\"name\":\"trace stop\",\"pid\":%ld,"
                               "\"tid\":%" PRIu32 ",\"ts\":%.3f}",
                               trace_pid, streams[i].tid, ts));
}

/* --- starting and stopping ------------------------------------------------ */

static void trace_at_exit(void)
{
    cube_error *err = cube_trace_stop();
    if (err) {
        cube_log_write(CUBE_LOG_WARN, "trace", "at exit: %s",
                       cube_error_message(err));
        cube_error_free(err);
    }
}

/* fork(): the writer's lock is held across the fork so the child gets a
 * consistent copy; the child then drops the trace without writing a byte
 * of it, its unwritten buffer sent to /dev/null. */
/* The analysis cannot follow a lock taken in one handler and dropped in
 * another. */
static void trace_fork_prepare(void) CUBE_NO_TSA;
static void trace_fork_parent(void) CUBE_NO_TSA;
static void trace_fork_child(void) CUBE_NO_TSA;

static void trace_fork_prepare(void)
{
    cube_mutex_lock(&trace_lock);
}

static void trace_fork_parent(void)
{
    cube_mutex_unlock(&trace_lock);
}

static void trace_fork_child(void)
{
    if (trace_file) {
        atomic_store_explicit(&trace_active, 0, memory_order_release);
        core_file_drop_in_child(trace_file);
        trace_file = NULL;
        free(trace_path);
        trace_path = NULL;
        streams_clear();
    }
    cube_mutex_unlock(&trace_lock);
}

static void trace_install_hooks(void)
{
    if (atexit(trace_at_exit) != 0)
        cube_log_write(CUBE_LOG_WARN, "trace",
                       "cannot register the exit handler; a trace not "
                       "stopped with cube_trace_stop will be incomplete");
    if (pthread_atfork(trace_fork_prepare, trace_fork_parent,
                       trace_fork_child) != 0)
        cube_log_write(CUBE_LOG_DEBUG, "trace",
                       "cannot register the fork handlers");
}

cube_error *cube_trace_start(const char *path)
{
    if (!path || !*path)
        return cube_error_new(CUBE_ERR_INVALID_ARGUMENT,
                              "cube_trace_start: path is NULL or empty");
    pthread_once(&trace_hooks_once, trace_install_hooks);

    cube_mutex_lock(&trace_lock);
    if (trace_file) {
        cube_error *err = cube_error_new(CUBE_ERR_INVALID_ARGUMENT,
                                         "cube_trace_start: a trace is already "
                                         "being written to '%s'",
                                         trace_path);
        cube_mutex_unlock(&trace_lock);
        return err;
    }
    char *copy = strdup(path);
    if (!copy) {
        cube_mutex_unlock(&trace_lock);
        return cube_error_new(CUBE_ERR_OUT_OF_MEMORY, "cube_trace_start");
    }
    /* A regular file (truncated) or a character device (/dev/null): a FIFO
     * would block the open until a reader came. */
    char why[256];
    int fd = core_file_open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600,
                            CORE_FILE_REGULAR_OR_CHAR, why, sizeof why);
    FILE *f = fd >= 0 ? fdopen(fd, "w") : NULL;
    if (!f) {
        if (fd >= 0) {
            snprintf(why, sizeof why, "out of memory");
            close(fd);
        }
        cube_mutex_unlock(&trace_lock);
        free(copy);
        return cube_error_new(CUBE_ERR_IO,
                              "cube_trace_start: cannot write a trace to "
                              "'%s': %s",
                              path, why);
    }
    /* Fully buffered; stdio picks the buffer. */
    setvbuf(f, NULL, _IOFBF, 1 << 16);
    trace_file = f;
    trace_path = copy;
    trace_failed = trace_warned = 0;
    trace_lost = 0;
    trace_pid = (long)getpid();
    streams_clear();
    note_write(fprintf(f,
                       "{\"traceEvents\":[\n{\"ph\":\"M\",\"name\":\"process_"
                       "name\",\"pid\":%ld,\"tid\":0,\"args\":{\"name\":"
                       "\"cubert\"}}",
                       trace_pid));
    trace_t0 = core_clock_ns();
    atomic_store_explicit(&trace_active, 1, memory_order_release);
    cube_mutex_unlock(&trace_lock);
    cube_log_write(CUBE_LOG_INFO, "trace", "writing a trace to '%s'", path);
    return NULL;
}

cube_error *cube_trace_stop(void)
{
    cube_mutex_lock(&trace_lock);
    if (!trace_file) {
        cube_mutex_unlock(&trace_lock);
        return NULL;
    }
    atomic_store_explicit(&trace_active, 0, memory_order_release);
    FILE *f = trace_file;
    char *path = trace_path;
    close_open_ranges(f);
    uint64_t lost = trace_lost;
    int failed = trace_failed;
    trace_file = NULL;
    trace_path = NULL;
    streams_clear();
    if (fputs("\n],\"displayTimeUnit\":\"ms\"}\n", f) == EOF)
        failed = 1;
    if (fflush(f) != 0 || ferror(f))
        failed = 1;
    if (fclose(f) != 0)
        failed = 1;
    cube_mutex_unlock(&trace_lock);

    cube_error *err = NULL;
    if (failed)
        err = cube_error_new(CUBE_ERR_IO,
                             "cube_trace_stop: writing the trace to '%s' "
                             "failed; the file is incomplete",
                             path);
    else if (lost)
        cube_log_write(CUBE_LOG_WARN, "trace",
                       "%" PRIu64 " event(s) were left out of '%s' for want "
                       "of memory",
                       lost, path);
    else
        cube_log_write(CUBE_LOG_INFO, "trace", "trace written to '%s'", path);
    free(path);
    return err;
}

static void trace_start_from_config(void)
{
    const char *path = core_config_trace_path();
    if (!path || !*path)
        return;
    cube_mutex_lock(&trace_lock);
    int running = trace_file != NULL;
    cube_mutex_unlock(&trace_lock);
    if (running)
        return;
    cube_error *err = cube_trace_start(path);
    if (cube_error_code(err) == CUBE_ERR_INVALID_ARGUMENT) {
        cube_error_ignore(err, "another thread started a trace in between");
    } else if (err) {
        cube_log_write(CUBE_LOG_WARN, "trace",
                       "cannot start the trace named by %s ('%s'): %s; "
                       "not tracing",
                       core_config_trace_origin(), path,
                       cube_error_message(err));
        cube_error_free(err);
    }
}

void core_trace_from_env(void)
{
    pthread_once(&trace_env_once, trace_start_from_config);
}
