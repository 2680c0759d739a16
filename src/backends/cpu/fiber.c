/* Fibers for the CPU backend (see fiber.h).
 *
 * Switching is a hand-written register swap: swapcontext() would make a
 * sigprocmask system call on every switch, and a tiled kernel that calls
 * cube_sync() switches millions of times. Only the callee-saved state of the
 * platform ABI is swapped, since a switch is an ordinary function call as far
 * as the compiler is concerned. Other architectures fall back to ucontext.
 *
 * A yield switches straight to the next live fiber; a fiber whose function
 * returns switches back to the scheduler loop in cpu_fibers_run(), which
 * unlinks it and resumes the next live one. The live fibers form a circular
 * doubly linked list in index order, so both steps are O(1).
 */
#include "backends/cpu/fiber.h"

#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "cubert/backend/errors.h"
#include "cubert/log.h"

#if defined(CPU_FIBER_FORCE_UCONTEXT)
#define CPU_FIBER_UCONTEXT 1
#elif defined(__x86_64__) && !defined(__ILP32__)
#define CPU_FIBER_X86_64 1
#elif defined(__aarch64__) && !defined(__ILP32__)
#define CPU_FIBER_AARCH64 1
#else
#define CPU_FIBER_UCONTEXT 1
#endif

#if defined(CPU_FIBER_UCONTEXT)
#include <ucontext.h>
#endif

/* Which sanitizer is on: gcc defines __SANITIZE_*__, clang answers
 * __has_feature (older clang has no macro). */
#if defined(__clang__)
#if __has_feature(address_sanitizer)
#define CPU_FIBER_ASAN 1
#endif
#if __has_feature(thread_sanitizer)
#define CPU_FIBER_TSAN 1
#endif
#else
#if defined(__SANITIZE_ADDRESS__)
#define CPU_FIBER_ASAN 1
#endif
#if defined(__SANITIZE_THREAD__)
#define CPU_FIBER_TSAN 1
#endif
#endif
#if defined(CPU_FIBER_ASAN)
#include <sanitizer/common_interface_defs.h>
#endif
#if defined(CPU_FIBER_TSAN)
#include <sanitizer/tsan_interface.h>
#endif

/* The entry function is reached through a stored address, never called:
 * keep it an out-of-line function. (This file needs gcc or clang anyway.) */
#define CPU_FIBER_NOINLINE __attribute__((noinline))

/* Hints only: lazily committed, no swap reservation, used as a stack. */
#if !defined(MAP_NORESERVE)
#define MAP_NORESERVE 0
#endif
#if !defined(MAP_STACK)
#define MAP_STACK 0
#endif

/* The entry function of a fiber never returns, so a sanitizer's bookkeeping
 * pushed on entry would never be popped: stack redzones (ASan) would stay
 * poisoned on a reused stack and the shadow call stack (TSan) would grow by
 * one frame per run. It is therefore left uninstrumented. clang's
 * no_sanitize("thread") still records function entry and exit, so clang
 * gets the attribute that turns off everything. */
#if defined(__clang__) && __has_attribute(disable_sanitizer_instrumentation)
#define CPU_FIBER_NO_SANITIZE __attribute__((disable_sanitizer_instrumentation))
#elif defined(CPU_FIBER_ASAN) && defined(CPU_FIBER_TSAN)
#define CPU_FIBER_NO_SANITIZE                                                  \
    __attribute__((no_sanitize_address, no_sanitize_thread))
#elif defined(CPU_FIBER_ASAN)
#define CPU_FIBER_NO_SANITIZE __attribute__((no_sanitize_address))
#elif defined(CPU_FIBER_TSAN)
#define CPU_FIBER_NO_SANITIZE __attribute__((no_sanitize_thread))
#else
#define CPU_FIBER_NO_SANITIZE
#endif

/* Tells TSan which fiber's state the next accesses belong to. It must come
 * right before the stack switch, in the function that switches: an
 * instrumented function returning in between would pop the shadow call
 * stack of the wrong fiber. Hence a macro, not a helper function. */
#if defined(CPU_FIBER_TSAN)
#define CPU_FIBER_TSAN_SWITCH(to_state) __tsan_switch_to_fiber((to_state), 0)
#else
#define CPU_FIBER_TSAN_SWITCH(to_state) ((void)0)
#endif

#define CPU_FIBER_MIN_STACK ((size_t)16 * 1024)

/* ------------------------------------------------------------------------ */
/* Context switch                                                           */
/* ------------------------------------------------------------------------ */

#if defined(CPU_FIBER_X86_64) || defined(CPU_FIBER_AARCH64)

/* A suspended context is just its stack pointer: everything else it needs
 * was pushed onto its own stack by cpu_fiber_switch. */
typedef struct cpu_fiber_ctx {
    void *sp;
} cpu_fiber_ctx;

/* Saves the callee-saved registers on the current stack, stores the stack
 * pointer in *save_sp, loads load_sp and pops the registers saved there.
 * Defined in assembly below; hidden so a shared build calls it directly. */
__attribute__((visibility("hidden"))) void cpu_fiber_switch(void **save_sp,
                                                            void *load_sp);

#if defined(CPU_FIBER_X86_64)
/* SysV x86-64: rbx, rbp, r12-r15 are callee-saved, and so are the control
 * bits of MXCSR and the x87 control word (rounding, exception masks). The
 * frame, from the saved stack pointer up: MXCSR (4 bytes) and x87 control
 * word (2 bytes) in one 8-byte slot, r15, r14, r13, r12, rbx, rbp, return
 * address. */
__asm__(".pushsection .text\n"
        ".p2align 4\n"
        ".globl cpu_fiber_switch\n"
        ".hidden cpu_fiber_switch\n"
        ".type cpu_fiber_switch,@function\n"
        "cpu_fiber_switch:\n"
        "    pushq %rbp\n"
        "    pushq %rbx\n"
        "    pushq %r12\n"
        "    pushq %r13\n"
        "    pushq %r14\n"
        "    pushq %r15\n"
        "    subq $8, %rsp\n"
        "    stmxcsr (%rsp)\n"
        "    fnstcw 4(%rsp)\n"
        "    movq %rsp, (%rdi)\n"
        "    movq %rsi, %rsp\n"
        "    ldmxcsr (%rsp)\n"
        "    fldcw 4(%rsp)\n"
        "    addq $8, %rsp\n"
        "    popq %r15\n"
        "    popq %r14\n"
        "    popq %r13\n"
        "    popq %r12\n"
        "    popq %rbx\n"
        "    popq %rbp\n"
        "    ret\n"
        ".size cpu_fiber_switch, .-cpu_fiber_switch\n"
        ".popsection\n");

/* Words in the first frame of a fiber: the 8-byte FP control slot, six
 * registers, the return address (the entry function) and a zero word that
 * stands where the entry function's caller would have pushed its return
 * address. */
#define CPU_FIBER_FRAME_WORDS 9
#else
/* AAPCS64: x19-x28, the frame pointer x29, the link register x30 and the low
 * halves d8-d15 of v8-v15 are callee-saved. The frame, from the saved stack
 * pointer up: x19 ... x30, then d8 ... d15; 160 bytes keeps sp 16-aligned. */
__asm__(".pushsection .text\n"
        ".p2align 4\n"
        ".globl cpu_fiber_switch\n"
        ".hidden cpu_fiber_switch\n"
        ".type cpu_fiber_switch,%function\n"
        "cpu_fiber_switch:\n"
        "    sub sp, sp, #160\n"
        "    stp x19, x20, [sp, #0]\n"
        "    stp x21, x22, [sp, #16]\n"
        "    stp x23, x24, [sp, #32]\n"
        "    stp x25, x26, [sp, #48]\n"
        "    stp x27, x28, [sp, #64]\n"
        "    stp x29, x30, [sp, #80]\n"
        "    stp d8, d9, [sp, #96]\n"
        "    stp d10, d11, [sp, #112]\n"
        "    stp d12, d13, [sp, #128]\n"
        "    stp d14, d15, [sp, #144]\n"
        "    mov x9, sp\n"
        "    str x9, [x0]\n"
        "    mov sp, x1\n"
        "    ldp x19, x20, [sp, #0]\n"
        "    ldp x21, x22, [sp, #16]\n"
        "    ldp x23, x24, [sp, #32]\n"
        "    ldp x25, x26, [sp, #48]\n"
        "    ldp x27, x28, [sp, #64]\n"
        "    ldp x29, x30, [sp, #80]\n"
        "    ldp d8, d9, [sp, #96]\n"
        "    ldp d10, d11, [sp, #112]\n"
        "    ldp d12, d13, [sp, #128]\n"
        "    ldp d14, d15, [sp, #144]\n"
        "    add sp, sp, #160\n"
        "    ret\n"
        ".size cpu_fiber_switch, .-cpu_fiber_switch\n"
        ".popsection\n");

#define CPU_FIBER_FRAME_WORDS 20
#endif

#else /* CPU_FIBER_UCONTEXT */

typedef struct cpu_fiber_ctx {
    ucontext_t uc;
} cpu_fiber_ctx;

#endif

/* Saves the running context in `save` and resumes `load`; returns when
 * something resumes `save`. Always inlined, so the switch stays in the
 * caller's frame and under the caller's sanitizer attributes. */
__attribute__((always_inline)) static inline void
cpu_fiber_swap(cpu_fiber_ctx *save, cpu_fiber_ctx *load)
{
#if defined(CPU_FIBER_UCONTEXT)
    swapcontext(&save->uc, &load->uc);
#else
    cpu_fiber_switch(&save->sp, load->sp);
#endif
}

/* ------------------------------------------------------------------------ */
/* Fiber set                                                                */
/* ------------------------------------------------------------------------ */

typedef struct cpu_fiber {
    cpu_fiber_ctx ctx;       /* where a suspended fiber resumes */
    unsigned char *stack_lo; /* lowest usable byte, just above the guard */
    uint32_t next;           /* next live fiber in index order (circular) */
    uint32_t prev;           /* previous live fiber */
#if defined(CPU_FIBER_ASAN)
    void *asan_fake; /* ASan's fake stack while suspended */
#endif
#if defined(CPU_FIBER_TSAN)
    void *tsan_fiber; /* TSan's per-fiber state, kept across runs */
#endif
} cpu_fiber;

/* One mmap'd block of stacks (each growth maps one). */
typedef struct cpu_fiber_map {
    void *base;
    size_t len;
} cpu_fiber_map;

struct cpu_fibers {
    size_t stack_size; /* usable bytes per stack, a page multiple */
    size_t page;       /* page size, also the guard size */
    cpu_fiber *fib;    /* one per stack */
    uint32_t cap;      /* stacks mapped so far */
    cpu_fiber_map *maps;
    size_t map_count;

    /* State of the run in progress. */
    cpu_fiber_fn fn;
    void *arg;
    uint32_t cur;  /* the fiber running, or being switched to */
    uint32_t live; /* fibers whose function has not returned */
    int running;
    cpu_fiber_ctx sched; /* the scheduler loop in cpu_fibers_run */
#if defined(CPU_FIBER_X86_64)
    uint32_t mxcsr; /* the caller's FP control state, inherited by */
    uint16_t fpcw;  /* every fiber of the run */
#endif
#if defined(CPU_FIBER_ASAN)
    void *sched_fake;
    const void *sched_bottom; /* the scheduler's stack, learnt on arrival */
    size_t sched_size;
    int from_sched; /* the switch in flight left the scheduler */
#endif
#if defined(CPU_FIBER_TSAN)
    void *sched_tsan;
#endif
};

/* The set whose run is in progress on this thread. */
static _Thread_local cpu_fibers *cpu_fibers_tls;

/* ------------------------------------------------------------------------ */
/* Sanitizer hooks around every switch                                      */
/* ------------------------------------------------------------------------ */

/* ASan's half of a switch, called just before it. `from` is the context
 * being left and `to` the one being entered, NULL meaning the scheduler
 * loop; `from_dies` says the context being left will never resume. ASan
 * learns which stack comes next and where to park the fake stack of the one
 * being left. */
CPU_FIBER_NO_SANITIZE static inline void cpu_fiber_leave(cpu_fibers *f,
                                                         cpu_fiber *from,
                                                         int from_dies,
                                                         const cpu_fiber *to)
{
#if defined(CPU_FIBER_ASAN)
    void **save = from_dies ? NULL : from ? &from->asan_fake : &f->sched_fake;
    if (!from)
        f->from_sched = 1;
    if (to)
        __sanitizer_start_switch_fiber(save, to->stack_lo, f->stack_size);
    else
        __sanitizer_start_switch_fiber(save, f->sched_bottom, f->sched_size);
#else
    (void)f;
    (void)from;
    (void)from_dies;
    (void)to;
#endif
}

/* Called right after a context regains control: `self` is that context
 * (NULL for the scheduler loop), `first` says it is a fiber's first entry.
 * Uninstrumented, so no frame of it can land on a fake stack before ASan
 * knows which stack it is on. */
CPU_FIBER_NO_SANITIZE static inline void
cpu_fiber_arrive(cpu_fibers *f, cpu_fiber *self, int first)
{
#if defined(CPU_FIBER_ASAN)
    if (!self) {
        __sanitizer_finish_switch_fiber(f->sched_fake, NULL, NULL);
        return;
    }
    const void *from_bottom = NULL;
    size_t from_size = 0;
    __sanitizer_finish_switch_fiber(first ? NULL : self->asan_fake,
                                    &from_bottom, &from_size);
    if (f->from_sched) {
        /* The fiber that finishes next needs the scheduler's stack to
         * switch back to it; ASan knows it, the scheduler does not. */
        f->sched_bottom = from_bottom;
        f->sched_size = from_size;
        f->from_sched = 0;
    }
#else
    (void)f;
    (void)self;
    (void)first;
#endif
}

/* ------------------------------------------------------------------------ */
/* Fiber entry and first frame                                              */
/* ------------------------------------------------------------------------ */

/* Every fiber starts here on its own stack. The set and the index come from
 * the thread-local set and its `cur`, which the switching code set before
 * switching, so no argument passing through the first frame is needed. */
CPU_FIBER_NO_SANITIZE CPU_FIBER_NOINLINE static void cpu_fiber_entry(void)
{
    cpu_fibers *f = cpu_fibers_tls;
    uint32_t index = f->cur;

    cpu_fiber_arrive(f, &f->fib[index], 1);
    f->fn(f->arg, index);

    /* The function returned: hand control back to the scheduler loop, which
     * unlinks this fiber. This context is never resumed (the next run gives
     * the stack a fresh first frame), so ASan may drop its fake stack. */
    cpu_fiber *fb = &f->fib[f->cur];
    cpu_fiber_leave(f, fb, 1, NULL);
    CPU_FIBER_TSAN_SWITCH(f->sched_tsan);
    cpu_fiber_swap(&fb->ctx, &f->sched);
    /* Unreachable: nothing resumes a finished fiber, and there is no frame
     * to return to. Stop here rather than run off the stack. */
    __builtin_trap();
}

/* Gives fiber `fb` a first frame that enters cpu_fiber_entry. */
static void cpu_fiber_prepare(cpu_fibers *f, cpu_fiber *fb)
{
#if defined(CPU_FIBER_UCONTEXT)
    /* Only the fallback: getcontext is a system call, but this runs once
     * per fiber per run. It cannot fail on Linux for a valid pointer. */
    (void)getcontext(&fb->ctx.uc);
    fb->ctx.uc.uc_stack.ss_sp = fb->stack_lo;
    fb->ctx.uc.uc_stack.ss_size = f->stack_size;
    fb->ctx.uc.uc_link = NULL;
    makecontext(&fb->ctx.uc, cpu_fiber_entry, 0);
#else
    /* The stack top is page-aligned, so 16-aligned as both ABIs require. */
    uintptr_t *frame = (uintptr_t *)(void *)(fb->stack_lo + f->stack_size) -
                       CPU_FIBER_FRAME_WORDS;
    memset(frame, 0, CPU_FIBER_FRAME_WORDS * sizeof *frame);
#if defined(CPU_FIBER_X86_64)
    /* cpu_fiber_switch pops the FP controls and six zeroed registers (rbp
     * zero ends frame-pointer unwinding), then `ret` jumps to the entry
     * with rsp at the zero word on top: 8 mod 16, exactly as after a call.
     */
    frame[0] = (uintptr_t)f->mxcsr | ((uintptr_t)f->fpcw << 32);
    frame[7] = (uintptr_t)cpu_fiber_entry;
#else
    /* x29 = 0 ends frame-pointer unwinding; x30 is where `ret` goes; sp
     * ends at the stack top, 16-aligned. */
    frame[11] = (uintptr_t)cpu_fiber_entry;
#endif
    fb->ctx.sp = frame;
#endif
}

/* ------------------------------------------------------------------------ */
/* Stacks                                                                   */
/* ------------------------------------------------------------------------ */

/* Turns the lowest page of each of the `count` stacks in a block into a
 * PROT_NONE guard. Each guard splits the mapping, so a block costs two
 * entries of vm.max_map_count per fiber; when the kernel runs out of them
 * the block is made whole again and left unguarded, with a warning: a
 * launch that runs without guards beats one that fails. Returns 0, or -1
 * when the block is unusable (errno set). */
static int cpu_fibers_guard(unsigned char *base, size_t len, size_t per,
                            size_t page, uint32_t count)
{
    for (uint32_t k = 0; k < count; k++) {
        if (mprotect(base + (size_t)k * per, page, PROT_NONE) == 0)
            continue;
        int e = errno;
        /* Restoring one protection over the whole block merges it back
         * into a single mapping. */
        if (mprotect(base, len, PROT_READ | PROT_WRITE) != 0)
            return -1;
        cube_log_write(CUBE_LOG_WARN, "cpu",
                       "cpu fibers: no guard pages for %u stacks (%s; "
                       "vm.max_map_count is probably exhausted): a stack "
                       "overflow will not fault",
                       (unsigned)count, strerror(e));
        return 0;
    }
    return 0;
}

/* Makes sure there are stacks for `n` fibers, mapping the missing ones as
 * one block, each with a guard page below it. Pages are committed only
 * when touched. On failure nothing changes. */
static cube_error *cpu_fibers_reserve(cpu_fibers *f, uint32_t n)
{
    if (n <= f->cap)
        return NULL;

    uint32_t add = n - f->cap;
    size_t per = f->page + f->stack_size; /* cannot wrap: see create */
    size_t fib_bytes = (size_t)n * sizeof(cpu_fiber);
    if (add > SIZE_MAX / per || fib_bytes / sizeof(cpu_fiber) != n)
        return cube_error_new(CUBE_ERR_OUT_OF_MEMORY,
                              "cpu fibers: %u stacks of %zu bytes do not fit "
                              "in the address space",
                              (unsigned)n, f->stack_size);
    size_t len = (size_t)add * per;

    cpu_fiber_map *maps = realloc(f->maps, (f->map_count + 1) * sizeof *maps);
    if (!maps)
        return cube_error_new(CUBE_ERR_OUT_OF_MEMORY,
                              "cpu fibers: no memory for the stack table");
    f->maps = maps;

    int flags = MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_STACK;
    void *mem = mmap(NULL, len, PROT_READ | PROT_WRITE, flags, -1, 0);
    if (mem == MAP_FAILED)
        return cube_error_new(CUBE_ERR_OUT_OF_MEMORY,
                              "cpu fibers: cannot map %u stacks of %zu bytes "
                              "(%zu bytes): %s",
                              (unsigned)add, f->stack_size, len,
                              strerror(errno));
    unsigned char *base = mem;
    if (cpu_fibers_guard(base, len, per, f->page, add) != 0) {
        int e = errno;
        munmap(mem, len);
        return cube_error_new(CUBE_ERR_OUT_OF_MEMORY,
                              "cpu fibers: cannot protect %u new stacks: %s",
                              (unsigned)add, strerror(e));
    }

    /* Mapped before the table grows, so a failed mapping leaves no
     * oversized table behind. */
    cpu_fiber *fib = realloc(f->fib, fib_bytes);
    if (!fib) {
        munmap(mem, len);
        return cube_error_new(CUBE_ERR_OUT_OF_MEMORY,
                              "cpu fibers: no memory for %u fibers",
                              (unsigned)n);
    }
    f->fib = fib;

    for (uint32_t k = 0; k < add; k++) {
        cpu_fiber *fb = &f->fib[f->cap + k];
        memset(fb, 0, sizeof *fb);
        fb->stack_lo = base + (size_t)k * per + f->page;
#if defined(CPU_FIBER_TSAN)
        fb->tsan_fiber = __tsan_create_fiber(0);
#endif
    }
    f->maps[f->map_count].base = mem;
    f->maps[f->map_count].len = len;
    f->map_count++;
    f->cap = n;
    return NULL;
}

/* ------------------------------------------------------------------------ */
/* Public interface                                                         */
/* ------------------------------------------------------------------------ */

cube_error *cpu_fibers_create(size_t stack_bytes, cpu_fibers **out)
{
    if (!out)
        return cube_error_new(CUBE_ERR_INVALID_ARGUMENT,
                              "cpu_fibers_create: out is NULL");
    *out = NULL;
    if (stack_bytes < CPU_FIBER_MIN_STACK)
        return cube_error_new(CUBE_ERR_INVALID_ARGUMENT,
                              "cpu_fibers_create: stack of %zu bytes is "
                              "under the minimum of %zu",
                              stack_bytes, CPU_FIBER_MIN_STACK);

    long ps = sysconf(_SC_PAGESIZE);
    size_t page = ps > 0 ? (size_t)ps : 4096;
    if (stack_bytes > SIZE_MAX - (page - 1) - page)
        return cube_error_new(CUBE_ERR_INVALID_ARGUMENT,
                              "cpu_fibers_create: stack of %zu bytes is too "
                              "large",
                              stack_bytes);
    size_t stack_size = (stack_bytes + page - 1) / page * page;

    cpu_fibers *f = calloc(1, sizeof *f);
    if (!f)
        return cube_error_new(CUBE_ERR_OUT_OF_MEMORY,
                              "cpu_fibers_create: no memory");
    f->stack_size = stack_size;
    f->page = page;
    *out = f;
    return NULL;
}

void cpu_fibers_destroy(cpu_fibers *fibers)
{
    if (!fibers)
        return;
    if (fibers->running) {
        /* Freeing stacks that fibers are running on would crash later in
         * an unrelated place; leaking them is the lesser harm. */
        cube_log_write(CUBE_LOG_WARN, "cpu",
                       "cpu_fibers_destroy called during a run; the fiber "
                       "set is leaked");
        return;
    }
#if defined(CPU_FIBER_TSAN)
    for (uint32_t i = 0; i < fibers->cap; i++)
        __tsan_destroy_fiber(fibers->fib[i].tsan_fiber);
#endif
    for (size_t m = 0; m < fibers->map_count; m++) {
        if (munmap(fibers->maps[m].base, fibers->maps[m].len) != 0)
            cube_log_write(CUBE_LOG_WARN, "cpu",
                           "cpu fibers: munmap of %zu stack bytes failed: %s",
                           fibers->maps[m].len, strerror(errno));
    }
    free(fibers->maps);
    free(fibers->fib);
    free(fibers);
}

cube_error *cpu_fibers_run(cpu_fibers *fibers, uint32_t n, cpu_fiber_fn fn,
                           void *arg)
{
    if (!fibers)
        return cube_error_new(CUBE_ERR_INVALID_ARGUMENT,
                              "cpu_fibers_run: fibers is NULL");
    if (n == 0)
        return cube_error_new(CUBE_ERR_INVALID_ARGUMENT,
                              "cpu_fibers_run: n is 0");
    if (!fn)
        return cube_error_new(CUBE_ERR_INVALID_ARGUMENT,
                              "cpu_fibers_run: fn is NULL");
    if (cpu_fibers_tls || fibers->running)
        return cube_error_new(CUBE_ERR_INVALID_ARGUMENT,
                              "cpu_fibers_run: nested run (called from "
                              "inside a fiber or during another run of "
                              "this set)");

    cube_error *err = cpu_fibers_reserve(fibers, n);
    if (err)
        return err;

    cpu_fibers *f = fibers;
    f->fn = fn;
    f->arg = arg;
#if defined(CPU_FIBER_X86_64)
    /* Fibers start with the caller's rounding mode and exception masks. */
    __asm__ volatile("stmxcsr %0" : "=m"(f->mxcsr));
    __asm__ volatile("fnstcw %0" : "=m"(f->fpcw));
#endif
    for (uint32_t i = 0; i < n; i++) {
        cpu_fiber *fb = &f->fib[i];
        cpu_fiber_prepare(f, fb);
        fb->next = i + 1 == n ? 0 : i + 1;
        fb->prev = i == 0 ? n - 1 : i - 1;
    }
#if defined(CPU_FIBER_TSAN)
    f->sched_tsan = __tsan_get_current_fiber();
#endif
    f->live = n;
    f->cur = 0;
    f->running = 1;
    cpu_fibers_tls = f;

    /* The scheduler loop: resume the current fiber; control comes back only
     * when it has returned, then the next live one in index order goes. */
    for (;;) {
        cpu_fiber *fb = &f->fib[f->cur];
        cpu_fiber_leave(f, NULL, 0, fb);
        CPU_FIBER_TSAN_SWITCH(fb->tsan_fiber);
        cpu_fiber_swap(&f->sched, &fb->ctx);
        cpu_fiber_arrive(f, NULL, 0);
        uint32_t done = f->cur;
        if (--f->live == 0)
            break;
        cpu_fiber *d = &f->fib[done];
        f->fib[d->prev].next = d->next;
        f->fib[d->next].prev = d->prev;
        f->cur = d->next;
    }

    cpu_fibers_tls = NULL;
    f->running = 0;
    f->fn = NULL;
    f->arg = NULL;
    return NULL;
}

void cpu_fibers_yield(cpu_fibers *fibers)
{
    /* Outside a run of this set on this thread there is nothing to switch
     * to. */
    if (!fibers || cpu_fibers_tls != fibers)
        return;
    cpu_fibers *f = fibers;
    uint32_t me = f->cur;
    cpu_fiber *self = &f->fib[me];
    uint32_t next = self->next;
    if (next == me)
        return;
    cpu_fiber *to = &f->fib[next];
    f->cur = next;
    cpu_fiber_leave(f, self, 0, to);
    CPU_FIBER_TSAN_SWITCH(to->tsan_fiber);
    cpu_fiber_swap(&self->ctx, &to->ctx);
    cpu_fiber_arrive(f, self, 0);
}

cpu_fibers *cpu_fibers_current(void)
{
    return cpu_fibers_tls;
}
