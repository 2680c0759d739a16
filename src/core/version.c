/* The library's version (cubert/version.h), from the headers it was built
 * with: the build keeps them equal to the project's version, and a test
 * checks it. */
#include "cubert/version.h"

#define CUBE_STR2(x) #x
#define CUBE_STR(x) CUBE_STR2(x)

const char *cube_version(void)
{
    return CUBE_STR(CUBE_VERSION_MAJOR) "." CUBE_STR(
        CUBE_VERSION_MINOR) "." CUBE_STR(CUBE_VERSION_PATCH);
}

uint32_t cube_version_hex(void)
{
    return (uint32_t)CUBE_VERSION_HEX;
}
