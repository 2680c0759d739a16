/* The properties every backend starts from (properties.h). */
#include <stdio.h>
#include <string.h>

#include "backends/common/properties.h"
#include "cubert/backend/errors.h"

cube_error *properties_check_count(const cube_properties *p,
                                   const uint32_t count[3], const char *limit)
{
    for (int i = 0; i < 3; i++)
        if (count[i] > p->max_cube_count[i])
            return cube_error_new(CUBE_ERR_RESOURCE_LIMIT,
                                  "dynamic cube count %u along axis %d is "
                                  "over %s of %u",
                                  count[i], i, limit, p->max_cube_count[i]);
    return NULL;
}

void properties_defaults(cube_properties *p, const char *backend,
                         uint64_t total, uint64_t alignment)
{
    memset(p, 0, sizeof *p);
    snprintf(p->backend, sizeof p->backend, "%s", backend);
    p->max_cube_count[0] = UINT32_MAX;
    p->max_cube_count[1] = 65535;
    p->max_cube_count[2] = 65535;
    p->memory_total = total;
    p->memory_alignment = alignment;
    p->max_buffer_size = total;
    p->timing = CUBE_TIMING_HOST_CLOCK;
}
