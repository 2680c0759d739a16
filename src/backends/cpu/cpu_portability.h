/* The CPU backend's portability check: a cube C kernel the system C
 * compiler accepts may still fail under NVRTC, which compiles it as CUDA
 * C++ (an implicit conversion from void *, a designated initializer, an
 * include, size_t, an atomic the CUDA prelude lacks). After a kernel is
 * really compiled (not loaded from a cache), the check runs the C++
 * compiler (key cpu_cxx) syntax-only over host stand-ins for NVRTC's
 * built-ins (prelude_portable.h), the CUDA prelude, the common prelude and
 * the kernel, and logs one warning (category "compile") naming the kernel
 * and the first error when that fails. It never fails the compile: the
 * kernel runs on the CPU either way. Key cpu_portability_check=0 turns it
 * off.
 *
 * Thread safety: a cpu_portability may be used from any number of threads
 * at once.
 */
#ifndef CUBE_CPU_PORTABILITY_H
#define CUBE_CPU_PORTABILITY_H

#include <stdint.h>

#include "backends/cpu/cpu_jit.h"

typedef struct cpu_portability cpu_portability;

/* A checker for one server: it checks each kernel (by kernel id) once.
 * NULL for want of memory; a NULL checker checks nothing. */
cpu_portability *cpu_portability_create(void);
void cpu_portability_destroy(cpu_portability *p);

/* Checks the cube C source `user` of kernel `name` (id `kernel_id`) with
 * the compile's `flags` (-DCUBE_CHECKED=... as given to the C compiler),
 * unless this checker has checked that kernel already, the key turns it
 * off, or no C++ compiler could be run (then one info line, once per
 * checker, and no more checks). Logs the verdict: a warning when the
 * kernel would not compile for CUDA, a debug line when it would; any
 * failure to check (memory, a temporary file, the compiler killed) is an
 * info line. Returns nothing: the compile goes on regardless. */
void cpu_portability_check(cpu_portability *p, const cpu_jit *jit,
                           uint64_t kernel_id, const char *name,
                           const char *user, const char *flags);

/* The text the check compiles for `user` (kernel `name`): the stand-ins,
 * the CUDA prelude, the common prelude, a #line naming "<name>.cube.c",
 * the source. malloc'd (the caller frees); NULL for want of memory. For
 * tests. */
char *cpu_portability_source(const char *name, const char *user);

#endif /* CUBE_CPU_PORTABILITY_H */
