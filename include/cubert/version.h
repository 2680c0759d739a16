/* cubert — the library's version at run time.
 *
 * CUBE_VERSION_MAJOR/MINOR/PATCH (cubert/export.h) are the version of the
 * headers a program was compiled with; these calls answer the version of
 * the library it runs with, which differs when a program meets another
 * build of the shared library. Same major version: compatible.
 *
 * Thread safety: any thread, any time, before or without a client.
 * Ownership: the string is static; the caller frees nothing. Never fails.
 */
#ifndef CUBERT_VERSION_H
#define CUBERT_VERSION_H

#include <stdint.h>

#include "cubert/export.h"

#ifdef __cplusplus
extern "C" {
#endif

/* "MAJOR.MINOR.PATCH" of the library, static. */
CUBE_API const char *cube_version(void);

/* The library's version as CUBE_VERSION_HEX spells the headers':
 * 0xMMmmpp. */
CUBE_API uint32_t cube_version_hex(void);

#ifdef __cplusplus
}
#endif

#endif /* CUBERT_VERSION_H */
