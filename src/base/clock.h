/* The monotonic clock, read the one way the library reads it: for spans
 * (compile times, launch durations, timeouts, trace timestamps), never for
 * dates.
 *
 * Thread safety: any thread. Errors: none; a clock that cannot be read
 * (not seen on Linux) reads 0.
 */
#ifndef CUBE_BASE_CLOCK_H
#define CUBE_BASE_CLOCK_H

#include <stdint.h>
#include <time.h>

/* Nanoseconds on CLOCK_MONOTONIC. */
static inline uint64_t cube_clock_ns(void)
{
    struct timespec ts;
    if (clock_gettime(CLOCK_MONOTONIC, &ts) != 0)
        return 0;
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* Milliseconds on CLOCK_MONOTONIC, with their fraction (for the times
 * that are reported, as compile_ms). */
static inline double cube_clock_ms(void)
{
    struct timespec ts;
    if (clock_gettime(CLOCK_MONOTONIC, &ts) != 0)
        return 0;
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

#endif /* CUBE_BASE_CLOCK_H */
