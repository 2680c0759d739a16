/* Checks for the test programs that run on their own, outside cmocka (as
 * several processes, or bounding every wait themselves): CHECK counts a
 * failure, says where on stderr and goes on; ok and expect check a call's
 * answer and free it. A program may define CHECK_WHO() before including
 * this to start each message (its rank, say). */
#ifndef CUBE_TESTS_PROGRAM_CHECKS_H
#define CUBE_TESTS_PROGRAM_CHECKS_H

#include <stdint.h>
#include <stdio.h>
#include <time.h>
#include <unistd.h>

#include "cubert/cubert.h"

#ifndef CHECK_WHO
#define CHECK_WHO() ((void)0)
#endif

static int failures;

#define CHECK(cond, ...)                                                       \
    do {                                                                       \
        if (!(cond)) {                                                         \
            CHECK_WHO();                                                       \
            fprintf(stderr, "line %d: ", __LINE__);                            \
            fprintf(stderr, __VA_ARGS__);                                      \
            fprintf(stderr, "\n");                                             \
            failures++;                                                        \
        }                                                                      \
    } while (0)

static void ok(cube_error *err, const char *what)
{
    CHECK(!err, "%s: %s", what, err ? cube_error_message(err) : "");
    cube_error_free(err);
}

static void expect(cube_error *err, cube_code code, const char *what)
{
    CHECK(cube_error_code(err) == code, "%s: expected code %d, got %d (%s)",
          what, (int)code, (int)cube_error_code(err),
          err ? cube_error_message(err) : "success");
    cube_error_free(err);
}

/* The code of `err`, or of its first cause for CUBE_ERR_SEVERAL (a read
 * of a buffer that carries a failure). */
static cube_code code_or_cause(const cube_error *err)
{
    if (cube_error_code(err) == CUBE_ERR_SEVERAL &&
        cube_error_cause_count(err) > 0)
        return cube_error_code(cube_error_cause(err, 0));
    return cube_error_code(err);
}

static uint64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

/* Reads the first `bytes` of `h` into `out`, waiting at most `limit_ms`:
 * a wait that would never end is the failure being checked for, reported
 * before the process exits (its stream cannot be drained). */
static cube_error *read_bounded(cube_client *c, cube_handle h, void *out,
                                uint64_t bytes, uint64_t limit_ms)
{
    cube_copy_desc d = cube_copy_desc_contiguous(h, bytes, 4);
    void *dst[1] = {out};
    uint64_t size[1] = {bytes};
    cube_future *f = NULL;
    cube_error *err = cube_read_async(c, &d, dst, size, 1, &f);
    if (err)
        return err;
    uint64_t start = now_ms();
    while (!cube_future_ready(f)) {
        if (now_ms() - start >= limit_ms) {
            CHECK_WHO();
            fprintf(stderr,
                    "FAILED: hang (the read was still waiting %llu ms "
                    "after it was issued)\n",
                    (unsigned long long)(now_ms() - start));
            fflush(stderr);
            _exit(1);
        }
        struct timespec pause = {0, 10 * 1000 * 1000};
        nanosleep(&pause, NULL);
    }
    err = cube_future_wait(f);
    cube_future_free(f);
    return err;
}

#endif /* CUBE_TESTS_PROGRAM_CHECKS_H */
