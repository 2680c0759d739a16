/* How the library waits for a flag another thread will soon set (a shard's
 * calls draining, a read's future leaving the client): what it waits for
 * takes microseconds to milliseconds, so the first tries only yield the
 * processor, the later ones sleep a tenth of a millisecond so that a long
 * wait costs no core.
 *
 * Thread safety: any thread. Errors: none.
 */
#ifndef CUBE_BASE_BACKOFF_H
#define CUBE_BASE_BACKOFF_H

#include <sched.h>
#include <time.h>

/* One wait of a loop that has already tried `spins` times. */
static inline void cube_backoff(unsigned spins)
{
    if (spins < 64) {
        sched_yield();
    } else {
        struct timespec pause = {0, 100000}; /* 0.1 ms */
        nanosleep(&pause, NULL);
    }
}

#endif /* CUBE_BASE_BACKOFF_H */
