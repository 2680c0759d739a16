/* Unit tests of configuration: the file parser directly, the file reader,
 * the file's location, and (in one test, since it happens once per process)
 * the one-time read that merges the file with the environment. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "core/client_internal.h"
#include "core/config.h"
#include "core/trace.h"

static char tmp_dir[256];

static const char *tmp_path(const char *name)
{
    static char buf[4][512];
    static int next;
    char *p = buf[next++ % 4];
    snprintf(p, sizeof buf[0], "%s/%s", tmp_dir, name);
    return p;
}

static void write_file(const char *path, const char *text, size_t n)
{
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(text, 1, n, f), n);
    assert_int_equal(fclose(f), 0);
}

/* --- captured warnings ---------------------------------------------------- */

#define MAX_CAPTURED 32

typedef struct captured {
    int count;
    char text[MAX_CAPTURED][1024];
} captured;

static captured cap;

static void capture_sink(void *user, cube_log_level level, const char *category,
                         const char *message)
{
    (void)user;
    if (level < CUBE_LOG_WARN)
        return;
    if (cap.count < MAX_CAPTURED)
        snprintf(cap.text[cap.count], sizeof cap.text[0], "%s: %s", category,
                 message);
    cap.count++;
}

static int setup_capture(void **state)
{
    (void)state;
    memset(&cap, 0, sizeof cap);
    cube_log_set_sink(capture_sink, NULL);
    return 0;
}

static int teardown_capture(void **state)
{
    (void)state;
    cube_log_set_sink(NULL, NULL);
    return 0;
}

/* Nonzero when some captured warning holds a, b and c (c may be NULL). */
static int warned(const char *a, const char *b, const char *c)
{
    for (int i = 0; i < cap.count && i < MAX_CAPTURED; i++)
        if (strstr(cap.text[i], a) && strstr(cap.text[i], b) &&
            (!c || strstr(cap.text[i], c)))
            return 1;
    return 0;
}

/* core_config_file is large: keep it off the stack. */
static core_config_file fc;

/* --- the parser ----------------------------------------------------------- */

static void test_parse_good(void **state)
{
    (void)state;
    const char *text = "\xEF\xBB\xBF# cubert settings\n"
                       "\n"
                       "   \t\n"
                       "  # an indented comment = with an equals sign\n"
                       "   log_level   =   debug   \n"
                       "log_file = \"/tmp/with space/log.txt\"\n"
                       "cpu_threads=8 # eight\n"
                       "cache_dir = /tmp/a#b\n"
                       "device = cuda:1\r\n"
                       "TRACE = \"/tmp/t # not a comment.json\"   # a comment\n"
                       "bounds_check = Always";
    core_config_parse_text("good.conf", text, &fc);
    assert_int_equal(cap.count, 0);
    assert_int_equal(fc.set,
                     CORE_CONFIG_HAS_LOG_LEVEL | CORE_CONFIG_HAS_LOG_FILE |
                         CORE_CONFIG_HAS_CPU_THREADS |
                         CORE_CONFIG_HAS_CACHE_DIR | CORE_CONFIG_HAS_DEVICE |
                         CORE_CONFIG_HAS_TRACE | CORE_CONFIG_HAS_BOUNDS_CHECK);
    assert_int_equal(fc.log_level, CUBE_LOG_DEBUG);
    assert_string_equal(fc.log_file, "/tmp/with space/log.txt");
    assert_int_equal(fc.cpu_threads, 8);
    assert_string_equal(fc.cache_dir, "/tmp/a#b");
    assert_string_equal(fc.device, "cuda:1");
    assert_string_equal(fc.trace, "/tmp/t # not a comment.json");
    assert_int_equal(fc.bounds_always, 1);

    core_config_parse_text("b.conf", "bounds_check = launch\n", &fc);
    assert_int_equal(fc.set, CORE_CONFIG_HAS_BOUNDS_CHECK);
    assert_int_equal(fc.bounds_always, 0);
    assert_int_equal(cap.count, 0);
}

static void test_parse_empty_and_repeated(void **state)
{
    (void)state;
    core_config_parse_text("e.conf", "", &fc);
    assert_int_equal(fc.set, 0);
    core_config_parse_text("e.conf", NULL, &fc);
    assert_int_equal(fc.set, 0);
    core_config_parse_text(NULL, "device = cpu\n", &fc);
    assert_string_equal(fc.device, "cpu");
    core_config_parse_text("e.conf", "\n\n# only comments\n\n", &fc);
    assert_int_equal(fc.set, 0);
    core_config_parse_text("e.conf", NULL, NULL);

    /* The last line for a key wins; an empty value unsets the key. */
    core_config_parse_text("e.conf",
                           "cpu_threads = 4\ncpu_threads = 6\n"
                           "device = cpu\ndevice =\ntrace = \"\"\n",
                           &fc);
    assert_int_equal(fc.set, CORE_CONFIG_HAS_CPU_THREADS);
    assert_int_equal(fc.cpu_threads, 6);

    /* An empty cache_dir turns the disk cache off. */
    core_config_parse_text("e.conf", "cache_dir =\n", &fc);
    assert_int_equal(fc.set, CORE_CONFIG_HAS_CACHE_DIR);
    assert_string_equal(fc.cache_dir, "");
    core_config_parse_text("e.conf", "cache_dir = \"\"  # off\n", &fc);
    assert_int_equal(fc.set, CORE_CONFIG_HAS_CACHE_DIR);
    assert_string_equal(fc.cache_dir, "");

    /* A '#' right after '=' starts a comment: an empty value. */
    core_config_parse_text("e.conf", "device =# nothing\n", &fc);
    assert_int_equal(fc.set, 0);
    assert_int_equal(cap.count, 0);
}

/* One malformed line: a warning naming the file, the line and the key, and
 * the line has no effect while the good lines around it still count. */
typedef struct bad_case {
    const char *line;
    const char *key; /* the text the warning must show */
} bad_case;

static void test_parse_malformed(void **state)
{
    (void)state;
    static const bad_case cases[] = {
        {"log_level debug", "log_level debug"},
        {"colour = red", "colour"},
        {"log_levels = info", "log_levels"},
        {"= cpu", "''"},
        {"log_level = loud", "log_level"},
        {"cpu_threads = 0", "cpu_threads"},
        {"cpu_threads = 4097", "cpu_threads"},
        {"cpu_threads = -1", "cpu_threads"},
        {"cpu_threads = +4", "cpu_threads"},
        {"cpu_threads = 3x", "cpu_threads"},
        {"cpu_threads = four", "cpu_threads"},
        {"cpu_threads = 99999999999999999999999", "cpu_threads"},
        {"bounds_check = sometimes", "bounds_check"},
        {"bounds_check = \"\"always", "bounds_check"},
        {"log_file = \"/tmp/unterminated", "log_file"},
        {"log_file = \"/tmp/a\" b", "log_file"},
        {"device = 0123456789012345678901234567890123456789012345678901234567"
         "890123456789",
         "device"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char text[512];
        snprintf(text, sizeof text,
                 "cpu_threads = 2\n%s\nbounds_check = "
                 "always\n",
                 cases[i].line);
        cap.count = 0;
        core_config_parse_text("bad.conf", text, &fc);
        if (cap.count != 1 || !warned("bad.conf:2:", cases[i].key, NULL))
            fail_msg("line '%s': %d warning(s), first '%s'", cases[i].line,
                     cap.count, cap.count ? cap.text[0] : "");
        assert_non_null(strstr(cap.text[0], "config: "));
        /* Lines 1 and 3 still apply; line 2 does not. */
        assert_int_equal(fc.set, CORE_CONFIG_HAS_CPU_THREADS |
                                     CORE_CONFIG_HAS_BOUNDS_CHECK);
        assert_int_equal(fc.cpu_threads, 2);
        assert_int_equal(fc.bounds_always, 1);
    }
}

static void test_parse_too_long(void **state)
{
    (void)state;
    /* A line over the limit. */
    size_t n = CORE_CONFIG_LINE_MAX + 100;
    size_t size = n + 128;
    char *text = malloc(size);
    assert_non_null(text);
    int off = snprintf(text, size, "device = cpu\ntrace = ");
    memset(text + off, 'x', n);
    snprintf(text + off + n, size - ((size_t)off + n), "\ndevice = cuda\n");
    core_config_parse_text("long.conf", text, &fc);
    assert_int_equal(cap.count, 1);
    assert_true(warned("long.conf:2:", "trace", "longer"));
    assert_int_equal(fc.set, CORE_CONFIG_HAS_DEVICE);
    assert_string_equal(fc.device, "cuda");

    /* A path value over CORE_CONFIG_PATH_MAX on a line within the limit. */
    cap.count = 0;
    off = snprintf(text, n + 64, "cache_dir = ");
    memset(text + off, 'd', CORE_CONFIG_PATH_MAX);
    text[off + CORE_CONFIG_PATH_MAX] = '\0';
    core_config_parse_text("long.conf", text, &fc);
    assert_int_equal(cap.count, 1);
    assert_true(warned("long.conf:1:", "cache_dir", NULL));
    assert_int_equal(fc.set, 0);

    /* The longest path that fits is kept. */
    cap.count = 0;
    text[off + CORE_CONFIG_PATH_MAX - 1] = '\0';
    core_config_parse_text("long.conf", text, &fc);
    assert_int_equal(cap.count, 0);
    assert_int_equal(strlen(fc.cache_dir), CORE_CONFIG_PATH_MAX - 1);
    free(text);
}

/* Random bytes never crash the parser (the sanitizer builds check the
 * memory accesses). */
static void test_parse_garbage(void **state)
{
    (void)state;
    static const char alphabet[] = "=\"#\n\r\t ab_zKEYlog_levelcpu_threads"
                                   "0123456789\xff\xef\xbb\xbf";
    unsigned seed = 12345;
    char text[600];
    for (int round = 0; round < 3000; round++) {
        size_t n = (size_t)(round % (int)(sizeof text - 1));
        for (size_t i = 0; i < n; i++) {
            seed = seed * 1103515245u + 12345u;
            text[i] = alphabet[(seed >> 16) % (sizeof alphabet - 1)];
        }
        text[n] = '\0';
        core_config_parse_text("garbage.conf", text, &fc);
        if (fc.set & CORE_CONFIG_HAS_CPU_THREADS)
            assert_in_range(fc.cpu_threads, 1, 4096);
        assert_true(strlen(fc.device) < sizeof fc.device);
    }
}

/* --- reading a file ------------------------------------------------------- */

static void test_load_file(void **state)
{
    (void)state;
    const char *path = tmp_path("load.conf");
    const char good[] = "device = cpu\ncpu_threads = 5\nnope = 1\n";
    write_file(path, good, sizeof good - 1);
    assert_int_equal(core_config_load_file(path, NULL, &fc), 0);
    assert_int_equal(fc.cpu_threads, 5);
    assert_string_equal(fc.device, "cpu");
    assert_int_equal(cap.count, 1);
    assert_true(warned(path, ":3:", "nope"));

    /* A missing default file is silent; a missing named one is not. */
    cap.count = 0;
    const char *missing = tmp_path("missing.conf");
    assert_int_equal(core_config_load_file(missing, NULL, &fc), -1);
    assert_int_equal(cap.count, 0);
    assert_int_equal(fc.set, 0);
    assert_int_equal(core_config_load_file(missing, "CUBERT_CONFIG", &fc), -1);
    assert_int_equal(cap.count, 1);
    assert_true(warned("CUBERT_CONFIG", missing, NULL));

    /* A directory cannot be read. */
    cap.count = 0;
    assert_int_equal(core_config_load_file(tmp_dir, "CUBERT_CONFIG", &fc), -1);
    assert_int_equal(cap.count, 1);
    assert_true(warned("CUBERT_CONFIG", tmp_dir, NULL));

    /* A NUL byte: the file is not used at all. */
    cap.count = 0;
    const char nul[] = "device = cpu\n\0cpu_threads = 2\n";
    write_file(path, nul, sizeof nul - 1);
    assert_int_equal(core_config_load_file(path, NULL, &fc), -1);
    assert_int_equal(cap.count, 1);
    assert_true(warned(path, "NUL", NULL));
    assert_int_equal(fc.set, 0);

    /* Too large. */
    cap.count = 0;
    size_t big = CORE_CONFIG_FILE_MAX + 10;
    char *text = malloc(big);
    assert_non_null(text);
    memset(text, '#', big);
    write_file(path, text, big);
    free(text);
    assert_int_equal(core_config_load_file(path, NULL, &fc), -1);
    assert_int_equal(cap.count, 1);
    assert_true(warned(path, "too large", NULL));

    /* Exactly the limit is fine. */
    cap.count = 0;
    text = malloc(CORE_CONFIG_FILE_MAX);
    assert_non_null(text);
    memset(text, '#', CORE_CONFIG_FILE_MAX);
    static const char head[] = "device=cpu\n";
    for (size_t i = 0; head[i]; i++)
        text[i] = head[i];
    write_file(path, text, CORE_CONFIG_FILE_MAX);
    free(text);
    assert_int_equal(core_config_load_file(path, NULL, &fc), 0);
    assert_int_equal(cap.count, 0);
    assert_string_equal(fc.device, "cpu");

    /* An empty file. */
    write_file(path, "", 0);
    assert_int_equal(core_config_load_file(path, NULL, &fc), 0);
    assert_int_equal(fc.set, 0);
    assert_int_equal(core_config_load_file(NULL, NULL, &fc), -1);
    unlink(path);
}

/* --- where the file is ---------------------------------------------------- */

static void test_locate(void **state)
{
    (void)state;
    char buf[512];
    int explicit_path = -1;

    setenv("CUBERT_CONFIG", "/etc/elsewhere.conf", 1);
    setenv("XDG_CONFIG_HOME", "/xdg", 1);
    setenv("HOME", "/home/someone", 1);
    assert_string_equal(core_config_locate(buf, sizeof buf, &explicit_path),
                        "/etc/elsewhere.conf");
    assert_int_equal(explicit_path, 1);

    setenv("CUBERT_CONFIG", "", 1);
    assert_null(core_config_locate(buf, sizeof buf, &explicit_path));
    assert_int_equal(explicit_path, 1);

    unsetenv("CUBERT_CONFIG");
    assert_string_equal(core_config_locate(buf, sizeof buf, &explicit_path),
                        "/xdg/cubert/config");
    assert_int_equal(explicit_path, 0);

    setenv("XDG_CONFIG_HOME", "relative/dir", 1);
    assert_string_equal(core_config_locate(buf, sizeof buf, NULL),
                        "/home/someone/.config/cubert/config");
    unsetenv("XDG_CONFIG_HOME");
    assert_string_equal(core_config_locate(buf, sizeof buf, NULL),
                        "/home/someone/.config/cubert/config");

    unsetenv("HOME");
    assert_null(core_config_locate(buf, sizeof buf, &explicit_path));
    assert_int_equal(explicit_path, 0);

    /* Too long for the buffer. */
    setenv("HOME", "/home/someone", 1);
    assert_null(core_config_locate(buf, 10, NULL));
    assert_null(core_config_locate(NULL, 0, NULL));
}

/* --- the backends' keys and lookups --------------------------------------- */

/* Restores a variable the test changed; ctest sets CUBERT_CACHE_DIR. */
typedef struct saved_env {
    const char *name;
    char *value; /* NULL: was unset */
} saved_env;

static saved_env env_save(const char *name)
{
    const char *old = getenv(name);
    saved_env s = {name, old ? strdup(old) : NULL};
    return s;
}

static void env_restore(saved_env s)
{
    if (s.value)
        setenv(s.name, s.value, 1);
    else
        unsetenv(s.name);
    free(s.value);
}

/* The file sets a backend's keys too (the CPU backend's: it is always
 * built); the variable wins over it. */
static void test_backend_keys(void **state)
{
    (void)state;
    saved_env cc = env_save("CUBERT_CPU_CC");
    unsetenv("CUBERT_CPU_CC");
    unsetenv("CUBERT_CPU_CFLAGS");
    core_config_parse_text("b.conf",
                           "cpu_cc = clang\n"
                           "CPU_CFLAGS = \"-O1 -g\"  # debug\n"
                           "config = /etc/elsewhere.conf\n",
                           &fc);
    /* Only the environment names the file. */
    assert_int_equal(cap.count, 1);
    assert_true(warned("b.conf:3:", "'config'", "CUBERT_CONFIG"));
    assert_int_equal(fc.set, 0);

    cube_config_value v;
    char where[128];
    assert_int_equal(core_config_resolve(&fc, "b.conf", "cpu_cc", 1, &v), 0);
    assert_int_equal(v.origin, CUBE_CONFIG_FILE);
    assert_string_equal(v.text, "clang");
    assert_string_equal(v.file, "b.conf");
    assert_string_equal(v.owner, "cpu");
    assert_string_equal(v.variable, "CUBERT_CPU_CC");
    assert_null(v.rejected);
    assert_string_equal(cube_config_where(&v, where, sizeof where),
                        "cpu_cc in b.conf");
    assert_int_equal(core_config_resolve(&fc, "b.conf", "CPU_cflags", 1, &v),
                     0);
    assert_string_equal(v.text, "-O1 -g");

    /* An empty line unsets the key. */
    core_config_parse_text("e.conf", "cpu_cflags = -g\ncpu_cflags =\n", &fc);
    assert_int_equal(fc.backend_set, 0);
    assert_int_equal(core_config_resolve(&fc, "e.conf", "cpu_cflags", 1, &v),
                     0);
    assert_int_equal(v.origin, CUBE_CONFIG_UNSET);
    assert_null(v.text);
    assert_string_equal(cube_config_where(&v, where, sizeof where), "default");
    core_config_parse_text("b.conf", "cpu_cc = clang\n", &fc);

    /* The variable wins; an empty one counts as unset. */
    setenv("CUBERT_CPU_CC", "tcc", 1);
    assert_int_equal(core_config_resolve(&fc, "b.conf", "cpu_cc", 1, &v), 0);
    assert_int_equal(v.origin, CUBE_CONFIG_ENVIRONMENT);
    assert_string_equal(v.text, "tcc");
    assert_string_equal(cube_config_where(&v, where, sizeof where),
                        "CUBERT_CPU_CC");
    setenv("CUBERT_CPU_CC", "", 1);
    assert_int_equal(core_config_resolve(&fc, "b.conf", "cpu_cc", 1, &v), 0);
    assert_int_equal(v.origin, CUBE_CONFIG_FILE);

    /* No such key. */
    assert_int_equal(core_config_resolve(&fc, "b.conf", "cpu_ccc", 1, &v), -1);
    assert_null(v.key);
    assert_int_equal(core_config_resolve(&fc, "b.conf", NULL, 1, &v), -1);
    assert_int_equal(cap.count, 1);
    env_restore(cc);
}

/* A variable the key does not accept gives way to the file, is logged only
 * when asked, and is kept in `rejected`. */
static void test_resolve_rejected(void **state)
{
    (void)state;
    saved_env cache = env_save("CUBERT_CACHE_DIR");
    saved_env threads = env_save("CUBERT_CPU_THREADS");
    saved_env bounds = env_save("CUBERT_BOUNDS_CHECK");
    unsetenv("CUBERT_DEVICE");
    core_config_parse_text("r.conf", "cpu_threads = 5\nbounds_check = always\n",
                           &fc);
    cube_config_value v;
    setenv("CUBERT_CPU_THREADS", "lots", 1);
    assert_int_equal(core_config_resolve(&fc, "r.conf", "cpu_threads", 0, &v),
                     0);
    assert_int_equal(cap.count, 0);
    assert_int_equal(v.origin, CUBE_CONFIG_FILE);
    assert_int_equal(v.number, 5);
    assert_null(v.text);
    assert_string_equal(v.rejected, "lots");
    assert_int_equal(core_config_resolve(&fc, "r.conf", "cpu_threads", 1, &v),
                     0);
    assert_int_equal(cap.count, 1);
    assert_true(warned("CUBERT_CPU_THREADS='lots'", "1..4096", "ignored"));

    /* Words in any case; the value is the word's. */
    setenv("CUBERT_BOUNDS_CHECK", "LAUNCH", 1);
    assert_int_equal(core_config_resolve(&fc, "r.conf", "bounds_check", 1, &v),
                     0);
    assert_int_equal(v.origin, CUBE_CONFIG_ENVIRONMENT);
    assert_int_equal(v.number, 0);
    unsetenv("CUBERT_BOUNDS_CHECK");
    assert_int_equal(core_config_resolve(&fc, "r.conf", "bounds_check", 1, &v),
                     0);
    assert_int_equal(v.origin, CUBE_CONFIG_FILE);
    assert_int_equal(v.number, 1);

    /* Set nowhere. */
    assert_int_equal(core_config_resolve(&fc, "r.conf", "device", 1, &v), 0);
    assert_int_equal(v.origin, CUBE_CONFIG_UNSET);
    assert_string_equal(v.owner, "core");

    /* A path too long for the key; an empty cache_dir is a value. */
    char long_dir[CORE_CONFIG_PATH_MAX + 1];
    memset(long_dir, 'd', CORE_CONFIG_PATH_MAX);
    long_dir[CORE_CONFIG_PATH_MAX] = '\0';
    setenv("CUBERT_CACHE_DIR", long_dir, 1);
    cap.count = 0;
    assert_int_equal(core_config_resolve(&fc, "r.conf", "cache_dir", 1, &v), 0);
    assert_int_equal(v.origin, CUBE_CONFIG_UNSET);
    assert_non_null(v.rejected);
    assert_true(warned("CUBERT_CACHE_DIR", "longer than 1023 bytes", NULL));
    setenv("CUBERT_CACHE_DIR", "", 1);
    assert_int_equal(core_config_resolve(&fc, "r.conf", "cache_dir", 1, &v), 0);
    assert_int_equal(v.origin, CUBE_CONFIG_ENVIRONMENT);
    assert_string_equal(v.text, "");
    assert_int_equal(cap.count, 1);

    env_restore(bounds);
    env_restore(threads);
    env_restore(cache);
}

/* --- the one-time read ---------------------------------------------------- */

/* --- files that are not regular files ------------------------------------ */

/* Each call below must return at once. A regression that blocks (an open
 * that waits for the other end of a FIFO) is ended by SIGALRM, which fails
 * the test instead of hanging it. */
#define WATCHDOG_SECONDS 20

static const char *make_fifo(const char *name)
{
    const char *path = tmp_path(name);
    unlink(path);
    assert_int_equal(mkfifo(path, 0600), 0);
    return path;
}

static void test_load_fifo(void **state)
{
    (void)state;
    const char *fifo = make_fifo("fifo.conf");

    /* Named by CUBERT_CONFIG: refused with a warning naming it. */
    alarm(WATCHDOG_SECONDS);
    int rc = core_config_load_file(fifo, "CUBERT_CONFIG", &fc);
    alarm(0);
    assert_int_equal(rc, -1);
    assert_int_equal(cap.count, 1);
    assert_true(warned("CUBERT_CONFIG", fifo, "not a regular file"));
    assert_true(warned(fifo, "FIFO", NULL));
    assert_int_equal(fc.set, 0);

    /* At a default location: it exists, so it is reported too. */
    cap.count = 0;
    alarm(WATCHDOG_SECONDS);
    rc = core_config_load_file(fifo, NULL, &fc);
    alarm(0);
    assert_int_equal(rc, -1);
    assert_int_equal(cap.count, 1);
    assert_true(warned(fifo, "FIFO", "not using it"));

    /* With a writer at the other end that never closes it: still refused,
     * nothing read from it. */
    int writer = open(fifo, O_RDWR | O_NONBLOCK);
    assert_true(writer >= 0);
    static const char text[] = "cpu_threads = 7\n";
    assert_int_equal(write(writer, text, sizeof text - 1),
                     (ssize_t)(sizeof text - 1));
    cap.count = 0;
    alarm(WATCHDOG_SECONDS);
    rc = core_config_load_file(fifo, "CUBERT_CONFIG", &fc);
    alarm(0);
    assert_int_equal(rc, -1);
    assert_int_equal(fc.set, 0);
    assert_int_equal(cap.count, 1);
    char left[64];
    assert_int_equal(read(writer, left, sizeof left),
                     (ssize_t)(sizeof text - 1));
    close(writer);

    /* /dev/null is a device, not a configuration file. */
    cap.count = 0;
    assert_int_equal(core_config_load_file("/dev/null", "CUBERT_CONFIG", &fc),
                     -1);
    assert_true(warned("CUBERT_CONFIG", "/dev/null", "character device"));
    unlink(fifo);
}

static void test_log_file_fifo(void **state)
{
    (void)state;
    const char *fifo = make_fifo("fifo.log");

    /* Nobody reads it. */
    alarm(WATCHDOG_SECONDS);
    cube_error *err = cube_log_set_file(fifo);
    alarm(0);
    assert_int_equal(cube_error_code(err), CUBE_ERR_IO);
    assert_non_null(strstr(cube_error_message(err), fifo));
    assert_non_null(strstr(cube_error_message(err), "FIFO"));
    cube_error_free(err);

    /* Someone reads it: still not a file that can be appended to safely
     * (the reader going away would raise SIGPIPE in the program). */
    int reader = open(fifo, O_RDONLY | O_NONBLOCK);
    assert_true(reader >= 0);
    alarm(WATCHDOG_SECONDS);
    err = cube_log_set_file(fifo);
    alarm(0);
    assert_int_equal(cube_error_code(err), CUBE_ERR_IO);
    assert_non_null(strstr(cube_error_message(err), "FIFO"));
    cube_error_free(err);
    close(reader);

    /* The logger still writes where it did (the captured sink). */
    cap.count = 0;
    cube_log_write(CUBE_LOG_WARN, "test", "still here");
    assert_int_equal(cap.count, 1);
    assert_true(warned("test", "still here", NULL));

    /* A directory is refused the same way. */
    err = cube_log_set_file(tmp_dir);
    assert_int_equal(cube_error_code(err), CUBE_ERR_IO);
    assert_non_null(strstr(cube_error_message(err), "directory"));
    cube_error_free(err);
    unlink(fifo);
}

/* Runs `body` in a child process with `name` set to `value`: the child
 * does the one-time read the parent has not done yet. The child exits with
 * body's answer (0: as expected) and is ended by SIGALRM if it hangs. */
static void in_child(const char *name, const char *value, int (*body)(void))
{
    fflush(NULL);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        alarm(WATCHDOG_SECONDS);
        /* Only the variable under test: no file from the user's home. */
        setenv("CUBERT_CONFIG", "", 1);
        unsetenv("CUBERT_LOG_FILE");
        unsetenv("CUBERT_TRACE");
        setenv(name, value, 1);
        cap.count = 0;
        _exit(body());
    }
    int status = 0;
    while (waitpid(pid, &status, 0) < 0)
        assert_int_equal(errno, EINTR);
    if (WIFSIGNALED(status))
        fail_msg("%s=%s: the child was killed by signal %d%s", name, value,
                 WTERMSIG(status),
                 WTERMSIG(status) == SIGALRM ? " (it hung)" : "");
    assert_true(WIFEXITED(status));
    if (WEXITSTATUS(status) != 0)
        fail_msg("%s=%s: check %d failed in the child", name, value,
                 WEXITSTATUS(status));
}

static const char *child_expect_a, *child_expect_b;

/* Opens and closes a CPU client; 0 when that worked and a warning named
 * child_expect_a and child_expect_b. */
static int open_client_and_check(void)
{
    cube_client *client = NULL;
    cube_error *err = cube_client_open("cpu", NULL, &client);
    if (err) {
        cube_error_free(err);
        return 2;
    }
    cube_client_close(client);
    if (core_trace_on())
        return 3;
    return warned(child_expect_a, child_expect_b, NULL) ? 0 : 4;
}

/* A FIFO named by CUBERT_CONFIG, CUBERT_LOG_FILE or CUBERT_TRACE: the
 * first cube_client_open returns, opens the client and warns. */
static void test_fifo_settings(void **state)
{
    (void)state;
    const char *fifo = make_fifo("fifo.any");
    child_expect_a = "CUBERT_CONFIG";
    child_expect_b = "FIFO";
    in_child("CUBERT_CONFIG", fifo, open_client_and_check);
    child_expect_a = "CUBERT_LOG_FILE";
    in_child("CUBERT_LOG_FILE", fifo, open_client_and_check);
    child_expect_a = "CUBERT_TRACE";
    in_child("CUBERT_TRACE", fifo, open_client_and_check);
    unlink(fifo);
}

/* The only test that triggers the one-time read: the file gives every key,
 * the environment overrides some, a malformed variable falls back to the
 * file, and later changes to either have no effect. */
static void test_read_once(void **state)
{
    (void)state;
    const char *path = tmp_path("once.conf");
    const char *trace_file = tmp_path("from-file.json");
    char text[1024];
    int n = snprintf(text, sizeof text,
                     "# every key\n"
                     "log_level = error\n"
                     "cpu_threads = 3\n"
                     "device = cpu\n"
                     "cache_dir = %s/cache-from-file\n"
                     "trace = \"%s\"\n"
                     "bogus = 1\n"
                     "bounds_check = always\n",
                     tmp_dir, trace_file);
    write_file(path, text, (size_t)n);
    char env_cache[512];
    snprintf(env_cache, sizeof env_cache, "%s/cache-from-env", tmp_dir);

    setenv("CUBERT_CONFIG", path, 1);
    setenv("CUBERT_LOG_LEVEL", "info", 1); /* wins over the file */
    unsetenv("CUBERT_LOG_FILE");
    setenv("CUBERT_CPU_THREADS", "abc", 1); /* malformed: the file's 3 */
    setenv("CUBERT_CACHE_DIR", env_cache, 1);
    unsetenv("CUBERT_DEVICE");
    unsetenv("CUBERT_TRACE");
    setenv("CUBERT_BOUNDS_CHECK", "launch", 1); /* wins over "always" */

    /* Any accessor triggers the read. */
    assert_int_equal(core_config_bounds_always(), 0);
    const core_config *cfg = core_config_get();
    assert_int_equal(cube_log_get_level(), CUBE_LOG_INFO);
    assert_int_equal(cfg->cpu_threads, 3);
    assert_int_equal(cfg->cache_dir_set, 1);
    assert_string_equal(cfg->cache_dir, env_cache);
    assert_string_equal(cfg->device, "cpu");
    assert_non_null(core_config_trace_path());
    assert_string_equal(core_config_trace_path(), trace_file);
    assert_non_null(strstr(core_config_trace_origin(), path));
    assert_non_null(core_config_file_path());
    assert_string_equal(core_config_file_path(), path);

    assert_true(warned(path, ":7:", "bogus"));
    assert_true(warned("CUBERT_CPU_THREADS", "abc", NULL));
    assert_int_equal(cap.count, 2);

    /* Read once: changes now are not seen. */
    setenv("CUBERT_BOUNDS_CHECK", "always", 1);
    setenv("CUBERT_CPU_THREADS", "9", 1);
    setenv("CUBERT_TRACE", "/elsewhere.json", 1);
    assert_int_equal(core_config_bounds_always(), 0);
    assert_int_equal(core_config_get()->cpu_threads, 3);
    assert_string_equal(core_config_trace_path(), trace_file);

    /* The trace named by the file starts from there. */
    assert_false(core_trace_on());
    core_trace_from_env();
    assert_true(core_trace_on());
    assert_null(cube_trace_stop());
    assert_false(core_trace_on());
    struct stat st;
    assert_int_equal(stat(trace_file, &st), 0);
    assert_int_equal(st.st_mode & 0777, 0600);

    cube_log_set_level(CUBE_LOG_WARN);
    unlink(trace_file);
    unlink(path);
}

/* After the one-time read (test_read_once): lookups use the file the
 * process read and the environment as it is now; a listing never logs. */
static void test_lookup_and_entries(void **state)
{
    (void)state;
    const char *path = core_config_file_path();
    assert_non_null(path);
    assert_string_equal(cube_config_file(), path);
    saved_env threads = env_save("CUBERT_CPU_THREADS");
    cube_config_value v;
    unsetenv("CUBERT_DEVICE");
    assert_int_equal(cube_config_lookup("device", &v), 0);
    assert_int_equal(v.origin, CUBE_CONFIG_FILE);
    assert_string_equal(v.text, "cpu");
    assert_string_equal(v.file, path);

    /* The variable as it is now, while the core keeps what it read. */
    setenv("CUBERT_DEVICE", "cuda:2", 1);
    assert_int_equal(cube_config_lookup("DEVICE", &v), 0);
    assert_int_equal(v.origin, CUBE_CONFIG_ENVIRONMENT);
    assert_string_equal(cube_config_text("device"), "cuda:2");
    assert_string_equal(core_config_get()->device, "cpu");
    unsetenv("CUBERT_DEVICE");
    assert_null(cube_config_text("cpu_threads")); /* a number, not text */
    assert_null(cube_config_text("no_such_key"));
    assert_int_equal(cube_config_lookup("no_such_key", &v), -1);
    assert_int_equal(cube_config_lookup(NULL, &v), -1);
    assert_int_equal(cube_config_lookup("device", NULL), -1);

    /* Every key once, in the table's order, without a warning even for a
     * variable that is not usable. */
    setenv("CUBERT_CPU_THREADS", "many", 1);
    cap.count = 0;
    size_t n = 0;
    int threads_seen = 0;
    for (; cube_config_entry(n, &v) == 0; n++) {
        assert_ptr_equal(v.key, core_config_key_at(n, NULL));
        if (strcmp(v.key->name, "cpu_threads") == 0) {
            threads_seen = 1;
            assert_string_equal(v.rejected, "many");
            assert_int_equal(v.origin, CUBE_CONFIG_FILE);
            assert_int_equal(v.number, 3);
        }
    }
    assert_true(threads_seen);
    assert_null(core_config_key_at(n, NULL));
    assert_int_equal(cube_config_entry(n, &v), -1);
    assert_int_equal(cube_config_entry(0, NULL), -1);
    assert_int_equal(cap.count, 0);

    /* A lookup does warn. */
    assert_int_equal(cube_config_lookup("cpu_threads", &v), 0);
    assert_int_equal(cap.count, 1);
    assert_true(warned("CUBERT_CPU_THREADS='many'", "ignored", NULL));
    env_restore(threads);
}

int main(void)
{
    const char *base = getenv("TMPDIR");
    if (!base || base[0] != '/')
        base = "/tmp";
    snprintf(tmp_dir, sizeof tmp_dir, "%s/cubert-config-XXXXXX", base);
    if (!mkdtemp(tmp_dir)) {
        perror("mkdtemp");
        return 1;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_parse_good, setup_capture,
                                        teardown_capture),
        cmocka_unit_test_setup_teardown(test_parse_empty_and_repeated,
                                        setup_capture, teardown_capture),
        cmocka_unit_test_setup_teardown(test_parse_malformed, setup_capture,
                                        teardown_capture),
        cmocka_unit_test_setup_teardown(test_parse_too_long, setup_capture,
                                        teardown_capture),
        cmocka_unit_test_setup_teardown(test_parse_garbage, setup_capture,
                                        teardown_capture),
        cmocka_unit_test_setup_teardown(test_load_file, setup_capture,
                                        teardown_capture),
        cmocka_unit_test_setup_teardown(test_locate, setup_capture,
                                        teardown_capture),
        cmocka_unit_test_setup_teardown(test_backend_keys, setup_capture,
                                        teardown_capture),
        cmocka_unit_test_setup_teardown(test_resolve_rejected, setup_capture,
                                        teardown_capture),
        cmocka_unit_test_setup_teardown(test_load_fifo, setup_capture,
                                        teardown_capture),
        cmocka_unit_test_setup_teardown(test_log_file_fifo, setup_capture,
                                        teardown_capture),
        /* Reads the configuration in child processes only. */
        cmocka_unit_test_setup_teardown(test_fifo_settings, setup_capture,
                                        teardown_capture),
        /* The tests above never trigger the one-time read; this one does,
         * and the ones after it rely on it. */
        cmocka_unit_test_setup_teardown(test_read_once, setup_capture,
                                        teardown_capture),
        cmocka_unit_test_setup_teardown(test_lookup_and_entries, setup_capture,
                                        teardown_capture),
    };
    int failed = cmocka_run_group_tests(tests, NULL, NULL);
    rmdir(tmp_dir);
    return failed;
}
