/* Mutexes the compiler can check: a pthread mutex wrapped in a type that
 * clang's thread-safety analysis knows as a capability, with the attribute
 * macros to say which fields a mutex guards and which functions expect it
 * held.
 *
 * Built with clang and -Wthread-safety (`make test-thread-safety`, part of
 * `make test`), a global marked CUBE_GUARDED_BY used without its mutex, a
 * function marked CUBE_REQUIRES called without the lock it names, a lock
 * released that was not held, or a lock left held on some path out of a
 * function is a compile error. Other compilers see plain pthread
 * calls. The analysis is per function and does not follow pointers into
 * other objects' locks; docs/threading.md writes down the order in which
 * the library's locks nest, which no compiler checks.
 *
 * Thread safety: as pthread_mutex_t (default attributes).
 */
#ifndef CUBE_BASE_MUTEX_H
#define CUBE_BASE_MUTEX_H

#include <pthread.h>

#if defined(__clang__)
#define CUBE_TSA(x) __attribute__((x))
#else
#define CUBE_TSA(x)
#endif

#define CUBE_CAPABILITY(name) CUBE_TSA(capability(name))
#define CUBE_GUARDED_BY(m) CUBE_TSA(guarded_by(m))
/* On a struct field. In C, clang (14 here) cannot name a sibling field in
 * an attribute, so this says in code which lock guards the field and
 * expands to nothing; compilers that parse such attributes late can check
 * it by defining CUBE_CHECK_GUARDED_FIELDS. Globals use CUBE_GUARDED_BY,
 * and functions CUBE_REQUIRES on a parameter's field, both checked. */
#if defined(CUBE_CHECK_GUARDED_FIELDS)
#define CUBE_GUARDED_FIELD(m) CUBE_GUARDED_BY(m)
#else
#define CUBE_GUARDED_FIELD(m)
#endif
#define CUBE_PT_GUARDED_BY(m) CUBE_TSA(pt_guarded_by(m))
#define CUBE_REQUIRES(...) CUBE_TSA(requires_capability(__VA_ARGS__))
#define CUBE_EXCLUDES(...) CUBE_TSA(locks_excluded(__VA_ARGS__))
#define CUBE_ACQUIRE(...) CUBE_TSA(acquire_capability(__VA_ARGS__))
#define CUBE_RELEASE(...) CUBE_TSA(release_capability(__VA_ARGS__))
#define CUBE_TRY_ACQUIRE(...) CUBE_TSA(try_acquire_capability(__VA_ARGS__))
#define CUBE_ACQUIRED_BEFORE(...) CUBE_TSA(acquired_before(__VA_ARGS__))
#define CUBE_ACQUIRED_AFTER(...) CUBE_TSA(acquired_after(__VA_ARGS__))
/* For the few functions whose locking the analysis cannot follow (a lock
 * taken in one function and dropped in another, chosen at run time); each
 * use says why. */
#define CUBE_NO_TSA CUBE_TSA(no_thread_safety_analysis)

typedef struct CUBE_CAPABILITY("mutex") cube_mutex {
    pthread_mutex_t m;
} cube_mutex;

#define CUBE_MUTEX_INIT                                                        \
    {                                                                          \
        PTHREAD_MUTEX_INITIALIZER                                              \
    }

/* pthread_mutex_init's result: 0 on success. */
static inline int cube_mutex_init(cube_mutex *mu)
{
    return pthread_mutex_init(&mu->m, NULL);
}

static inline void cube_mutex_destroy(cube_mutex *mu)
{
    pthread_mutex_destroy(&mu->m);
}

static inline void cube_mutex_lock(cube_mutex *mu) CUBE_ACQUIRE(mu) CUBE_NO_TSA
{
    pthread_mutex_lock(&mu->m);
}

static inline void cube_mutex_unlock(cube_mutex *mu)
    CUBE_RELEASE(mu) CUBE_NO_TSA
{
    pthread_mutex_unlock(&mu->m);
}

/* Nonzero when the mutex was taken. */
static inline int cube_mutex_trylock(cube_mutex *mu)
    CUBE_TRY_ACQUIRE(1, mu) CUBE_NO_TSA
{
    return pthread_mutex_trylock(&mu->m) == 0;
}

/* pthread_cond_wait on a cube_mutex the caller holds. */
static inline void cube_cond_wait(pthread_cond_t *cv, cube_mutex *mu)
    CUBE_REQUIRES(mu) CUBE_NO_TSA
{
    pthread_cond_wait(cv, &mu->m);
}

/* pthread_cond_timedwait on a cube_mutex the caller holds, until
 * `deadline` (of the clock the condition was made with). */
static inline void cube_cond_timedwait(pthread_cond_t *cv, cube_mutex *mu,
                                       const struct timespec *deadline)
    CUBE_REQUIRES(mu) CUBE_NO_TSA
{
    pthread_cond_timedwait(cv, &mu->m, deadline);
}

#endif /* CUBE_BASE_MUTEX_H */
