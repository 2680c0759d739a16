/* cubert — symbol visibility and version macros.
 *
 * Only functions marked CUBE_API are exported from the shared library; the
 * build compiles everything else with -fvisibility=hidden.
 */
#ifndef CUBERT_EXPORT_H
#define CUBERT_EXPORT_H

#define CUBE_VERSION_MAJOR 0
#define CUBE_VERSION_MINOR 1
#define CUBE_VERSION_PATCH 0
/* 0xMMmmpp: compare with >= in preprocessor checks. */
#define CUBE_VERSION_HEX                                                       \
    ((CUBE_VERSION_MAJOR << 16) | (CUBE_VERSION_MINOR << 8) |                  \
     CUBE_VERSION_PATCH)

#if defined(CUBE_BUILDING_SHARED) && defined(CUBE_USING_STATIC)
#error "CUBE_BUILDING_SHARED and CUBE_USING_STATIC cannot both be defined"
#endif

#if defined(CUBE_BUILDING_SHARED) && defined(__GNUC__)
#define CUBE_API __attribute__((visibility("default")))
#else
#define CUBE_API
#endif

/* Functions returning an owned error: ignoring the result leaks it. */
#if defined(__GNUC__)
#define CUBE_MUST_USE __attribute__((warn_unused_result))
#define CUBE_PRINTF(fmt, args) __attribute__((format(printf, fmt, args)))
#define CUBE_RETURNS_NONNULL __attribute__((returns_nonnull))
#else
#define CUBE_RETURNS_NONNULL
#define CUBE_MUST_USE
#define CUBE_PRINTF(fmt, args)
#endif

#endif /* CUBERT_EXPORT_H */
