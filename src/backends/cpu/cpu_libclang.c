/* Loads libclang's C API with dlopen (see cpu_libclang.h). */
#include "backends/cpu/cpu_libclang.h"

#ifdef CUBE_HAVE_LIBCLANG
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "cubert/backend/config.h"
#include "cubert/log.h"

static pthread_once_t cpu_libclang_once = PTHREAD_ONCE_INIT;
static cpu_libclang cpu_libclang_table;
static const cpu_libclang *cpu_libclang_loaded;
static char cpu_libclang_why[256];

/* Resolves every entry; false (with the reason) when one is missing. */
static int cpu_libclang_resolve(void *h, cpu_libclang *t)
{
    static const struct {
        const char *name;
        size_t offset;
    } entries[] = {
#define E(field, symbol) {symbol, offsetof(cpu_libclang, field)}
        E(createIndex, "clang_createIndex"),
        E(disposeIndex, "clang_disposeIndex"),
        E(toggleCrashRecovery, "clang_toggleCrashRecovery"),
        E(parseTranslationUnit2, "clang_parseTranslationUnit2"),
        E(disposeTranslationUnit, "clang_disposeTranslationUnit"),
        E(getNumDiagnostics, "clang_getNumDiagnostics"),
        E(getDiagnostic, "clang_getDiagnostic"),
        E(getDiagnosticSeverity, "clang_getDiagnosticSeverity"),
        E(getDiagnosticSpelling, "clang_getDiagnosticSpelling"),
        E(disposeDiagnostic, "clang_disposeDiagnostic"),
        E(getTranslationUnitCursor, "clang_getTranslationUnitCursor"),
        E(visitChildren, "clang_visitChildren"),
        E(getCursorKind, "clang_getCursorKind"),
        E(getCursorSpelling, "clang_getCursorSpelling"),
        E(getCString, "clang_getCString"),
        E(disposeString, "clang_disposeString"),
        E(isCursorDefinition, "clang_isCursorDefinition"),
        E(getCursorExtent, "clang_getCursorExtent"),
        E(getRangeStart, "clang_getRangeStart"),
        E(getRangeEnd, "clang_getRangeEnd"),
        E(getExpansionLocation, "clang_getExpansionLocation"),
        E(getSpellingLocation, "clang_getSpellingLocation"),
        E(Location_isFromMainFile, "clang_Location_isFromMainFile"),
        E(getCursorReferenced, "clang_getCursorReferenced"),
        E(equalCursors, "clang_equalCursors"),
        E(getCursorType, "clang_getCursorType"),
        E(getTypeSpelling, "clang_getTypeSpelling"),
        E(getCanonicalType, "clang_getCanonicalType"),
        E(isVolatileQualifiedType, "clang_isVolatileQualifiedType"),
        E(Type_getSizeOf, "clang_Type_getSizeOf"),
        E(Cursor_getStorageClass, "clang_Cursor_getStorageClass"),
        E(tokenize, "clang_tokenize"),
        E(getTokenSpelling, "clang_getTokenSpelling"),
        E(getTokenExtent, "clang_getTokenExtent"),
        E(disposeTokens, "clang_disposeTokens"),
#undef E
    };
    for (size_t i = 0; i < sizeof entries / sizeof entries[0]; i++) {
        void *p = dlsym(h, entries[i].name);
        if (!p) {
            snprintf(cpu_libclang_why, sizeof cpu_libclang_why,
                     "the library has no %s", entries[i].name);
            return 0;
        }
        memcpy((char *)t + entries[i].offset, &p, sizeof p);
    }
    return 1;
}

static void cpu_libclang_load(void)
{
    const char *configured = cube_config_text("cpu_libclang");
    void *h = NULL;
    char tried[160];
    if (configured) {
        h = dlopen(configured, RTLD_NOW | RTLD_LOCAL);
        snprintf(tried, sizeof tried, "'%s'", configured);
    } else {
        h = dlopen("libclang.so.1", RTLD_NOW | RTLD_LOCAL);
        for (int v = 19; !h && v >= 11; v--) {
            char name[32];
            snprintf(name, sizeof name, "libclang-%d.so.1", v);
            h = dlopen(name, RTLD_NOW | RTLD_LOCAL);
        }
        snprintf(tried, sizeof tried,
                 "libclang.so.1 nor libclang-<N>.so.1 (N 19 to 11)");
    }
    if (!h) {
        snprintf(cpu_libclang_why, sizeof cpu_libclang_why, "cannot load %s",
                 tried);
        return;
    }
    if (!cpu_libclang_resolve(h, &cpu_libclang_table)) {
        dlclose(h);
        return;
    }
    cube_log_write(CUBE_LOG_DEBUG, "compile", "barrier pass: loaded %s",
                   configured ? configured : "libclang");
    cpu_libclang_loaded = &cpu_libclang_table;
}

const cpu_libclang *cpu_libclang_get(const char **why)
{
    pthread_once(&cpu_libclang_once, cpu_libclang_load);
    if (!cpu_libclang_loaded && why)
        *why = cpu_libclang_why;
    return cpu_libclang_loaded;
}
#else
typedef int cpu_libclang_unavailable;
#endif
