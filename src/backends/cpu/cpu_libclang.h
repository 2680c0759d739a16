/* libclang's C API, loaded at run time with dlopen: the CPU backend's
 * barrier pass (barrier_pass.c) parses kernels with it. libclang is
 * optional: without it, or without its headers at build time, every
 * kernel that calls cube_sync() runs its units as fibers.
 *
 * The library is the configuration key cpu_libclang ($CUBERT_CPU_LIBCLANG),
 * else the first of libclang.so.1 and libclang-<N>.so.1 (N from 19 down to
 * 11) that loads. It is loaded once per process, on the first call, and
 * never unloaded; a failed load is not retried.
 *
 * Thread safety: cpu_libclang_get may be called from any thread. */
#ifndef CUBE_CPU_LIBCLANG_H
#define CUBE_CPU_LIBCLANG_H

#include <stddef.h>

#ifdef CUBE_HAVE_LIBCLANG
#include <clang-c/Index.h>

/* The entry points the pass calls, resolved from the library. */
typedef struct cpu_libclang {
    CXIndex (*createIndex)(int, int);
    void (*disposeIndex)(CXIndex);
    void (*toggleCrashRecovery)(unsigned);
    enum CXErrorCode (*parseTranslationUnit2)(CXIndex, const char *,
                                              const char *const *, int,
                                              struct CXUnsavedFile *, unsigned,
                                              unsigned, CXTranslationUnit *);
    void (*disposeTranslationUnit)(CXTranslationUnit);
    unsigned (*getNumDiagnostics)(CXTranslationUnit);
    CXDiagnostic (*getDiagnostic)(CXTranslationUnit, unsigned);
    enum CXDiagnosticSeverity (*getDiagnosticSeverity)(CXDiagnostic);
    CXString (*getDiagnosticSpelling)(CXDiagnostic);
    void (*disposeDiagnostic)(CXDiagnostic);
    CXCursor (*getTranslationUnitCursor)(CXTranslationUnit);
    unsigned (*visitChildren)(CXCursor, CXCursorVisitor, CXClientData);
    enum CXCursorKind (*getCursorKind)(CXCursor);
    CXString (*getCursorSpelling)(CXCursor);
    const char *(*getCString)(CXString);
    void (*disposeString)(CXString);
    unsigned (*isCursorDefinition)(CXCursor);
    CXSourceRange (*getCursorExtent)(CXCursor);
    CXSourceLocation (*getRangeStart)(CXSourceRange);
    CXSourceLocation (*getRangeEnd)(CXSourceRange);
    void (*getExpansionLocation)(CXSourceLocation, CXFile *, unsigned *,
                                 unsigned *, unsigned *);
    void (*getSpellingLocation)(CXSourceLocation, CXFile *, unsigned *,
                                unsigned *, unsigned *);
    int (*Location_isFromMainFile)(CXSourceLocation);
    CXCursor (*getCursorReferenced)(CXCursor);
    unsigned (*equalCursors)(CXCursor, CXCursor);
    CXType (*getCursorType)(CXCursor);
    CXString (*getTypeSpelling)(CXType);
    CXType (*getCanonicalType)(CXType);
    unsigned (*isVolatileQualifiedType)(CXType);
    long long (*Type_getSizeOf)(CXType);
    enum CX_StorageClass (*Cursor_getStorageClass)(CXCursor);
    void (*tokenize)(CXTranslationUnit, CXSourceRange, CXToken **, unsigned *);
    CXString (*getTokenSpelling)(CXTranslationUnit, CXToken);
    CXSourceRange (*getTokenExtent)(CXTranslationUnit, CXToken);
    void (*disposeTokens)(CXTranslationUnit, CXToken *, unsigned);
} cpu_libclang;

/* The loaded library's entry points, or NULL when it cannot be loaded or
 * lacks one of them; then *why (when not NULL) says why, for a log line. */
const cpu_libclang *cpu_libclang_get(const char **why);
#endif

#endif /* CUBE_CPU_LIBCLANG_H */
