/* The validating mode's verdict (validate.h). */
#include <string.h>

#include "backends/common/validate.h"
#include "base/error.h"

cube_error *validate_report(const cube_compiled *compiled,
                            const validate_record *record)
{
    const validate_record *r = record;
    if (!r->count)
        return NULL;
    char name[VALIDATE_NAME];
    memcpy(name, r->name, sizeof name);
    name[VALIDATE_NAME - 1] = 0;
    uint32_t elem = r->param < compiled->param_count
                        ? compiled->params[r->param].elem_size
                        : 0;
    return cube_error_new(CUBE_ERR_INVALID_ARGUMENT,
                          "out-of-range access (validating launch): buffer "
                          "parameter %u '%s' indexed at %llu, its length is "
                          "%llu elements of %u bytes; %llu out-of-range "
                          "accesses in all (reads gave 0, writes were "
                          "dropped)",
                          r->param, name, r->index, r->len, elem, r->count);
}
