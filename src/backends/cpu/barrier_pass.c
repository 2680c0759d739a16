/* The barrier pass (barrier_pass.h): the parse and the entry point. Its
 * tree, analysis and output are barrier_tree.c, barrier_analysis.c and
 * barrier_emit.c (barrier_pass_internal.h says how the pass works). */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif

#include "backends/cpu/barrier_pass.h"
#include "backends/cpu/barrier_pass_internal.h"
#include "backends/cpu/cpu_libclang.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifndef CUBE_HAVE_LIBCLANG

cpu_barrier_pass_status cpu_barrier_pass_transform(const char *source,
                                                   const char *name,
                                                   const unsigned dim[3],
                                                   char **out, char *why,
                                                   size_t why_len)
{
    (void)source;
    (void)name;
    (void)dim;
    *out = NULL;
    snprintf(why, why_len, "cubert was built without libclang's headers");
    return CPU_BARRIER_PASS_REFUSED;
}

#else

#include <pthread.h>

/* ----------------------------------------------------------- the driver */

/* Parses bp->src into bp->tu; 0 when libclang cannot or reports an error
 * (refused). */
static int bp_parse(barrier_pass *bp, CXIndex index)
{
    const cpu_libclang *lc = bp->lc;
    static const char path[] = "/cubert/kernel.c";
    struct CXUnsavedFile file = {path, bp->src, (unsigned long)bp->srclen};
    const char *const args[] = {"-x", "c", "-std=c11", "-DCUBE_CHECKED=0",
                                "-w"};
    enum CXErrorCode ec = lc->parseTranslationUnit2(
        index, path, args, (int)(sizeof args / sizeof args[0]), &file, 1,
        CXTranslationUnit_DetailedPreprocessingRecord, &bp->tu);
    if (ec != CXError_Success || !bp->tu)
        return bp_refuse(bp, "libclang could not parse the kernel (error %d)",
                         (int)ec);
    unsigned nd = lc->getNumDiagnostics(bp->tu);
    for (unsigned i = 0; i < nd && !bp->refused; i++) {
        CXDiagnostic d = lc->getDiagnostic(bp->tu, i);
        if (lc->getDiagnosticSeverity(d) >= CXDiagnostic_Error) {
            char msg[200];
            bp_copy_string(bp, lc->getDiagnosticSpelling(d), msg, sizeof msg);
            bp_refuse(bp, "libclang reports an error: %s", msg);
        }
        lc->disposeDiagnostic(d);
    }
    return !bp->refused;
}

/* Parses `source`, analyses the body and, when the pass takes it, writes
 * its cube function into bp->out. */
static void bp_run(barrier_pass *bp, CXIndex index)
{
    if (bp_parse(bp, index) && bp_build_tree(bp) && bp_analyse(bp))
        bp_emit(bp);
}

/* libclang's index: created one at a time, its crash recovery (signal
 * handlers of its own, for the whole process) turned off at once. */
static pthread_mutex_t bp_index_lock = PTHREAD_MUTEX_INITIALIZER;

cpu_barrier_pass_status cpu_barrier_pass_transform(const char *source,
                                                   const char *name,
                                                   const unsigned dim[3],
                                                   char **out, char *why,
                                                   size_t why_len)
{
    *out = NULL;
    if (why_len)
        why[0] = '\0';
    const char *lwhy = "";
    const cpu_libclang *lc = cpu_libclang_get(&lwhy);
    if (!lc) {
        snprintf(why, why_len, "libclang is not available: %s", lwhy);
        return CPU_BARRIER_PASS_REFUSED;
    }
    barrier_pass bp;
    memset(&bp, 0, sizeof bp);
    bp.lc = lc;
    bp.src = source;
    bp.srclen = strlen(source);
    bp.kname = name;
    memcpy(bp.dim, dim, sizeof bp.dim);
    bp.why = why;
    bp.why_len = why_len;
    pthread_mutex_lock(&bp_index_lock);
    CXIndex index = lc->createIndex(0, 0);
    if (index)
        lc->toggleCrashRecovery(0);
    pthread_mutex_unlock(&bp_index_lock);
    if (!index) {
        snprintf(why, why_len, "libclang cannot create an index");
        return CPU_BARRIER_PASS_REFUSED;
    }
    bp_run(&bp, index);
    if (bp.tu)
        lc->disposeTranslationUnit(bp.tu);
    lc->disposeIndex(index);
    cpu_barrier_pass_status st = CPU_BARRIER_PASS_DONE;
    if (bp.oom || bp.out.failed)
        st = CPU_BARRIER_PASS_NO_MEMORY;
    else if (bp.refused)
        st = CPU_BARRIER_PASS_REFUSED;
    if (st == CPU_BARRIER_PASS_DONE)
        *out = bp.out.data;
    else
        free(bp.out.data);
    if (st == CPU_BARRIER_PASS_NO_MEMORY)
        snprintf(why, why_len, "out of memory");
    free(bp.n);
    free(bp.v);
    free(bp.m);
    free(bp.r);
    return st;
}

#endif /* CUBE_HAVE_LIBCLANG */
