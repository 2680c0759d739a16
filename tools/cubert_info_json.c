/* `cubert info --json`: what `cubert info` prints, as one JSON object for
 * programs (the version, the backends, every device with its properties or
 * why it is unavailable, every configuration key with its value and
 * origin). Byte counts are exact integers. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cubert/backend/config.h"
#include "cubert/cubert.h"
#include "cubert_tool.h"

/* A JSON string (quotes included) of `s`; null for NULL. */
static void json_str(const char *s)
{
    if (!s) {
        fputs("null", stdout);
        return;
    }
    putchar('"');
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        switch (*p) {
        case '"': fputs("\\\"", stdout); break;
        case '\\': fputs("\\\\", stdout); break;
        case '\n': fputs("\\n", stdout); break;
        case '\t': fputs("\\t", stdout); break;
        case '\r': fputs("\\r", stdout); break;
        default:
            if (*p < 0x20)
                printf("\\u%04x", *p);
            else
                putchar(*p);
        }
    }
    putchar('"');
}

static void json_features(uint32_t f)
{
    putchar('[');
    int any = 0;
    for (uint32_t bit = 1; bit; bit <<= 1) {
        const char *name = (f & bit) ? cube_feature_name(bit) : NULL;
        if (name) {
            printf("%s\"%s\"", any ? "," : "", name);
            any = 1;
        }
    }
    putchar(']');
}

static void json_properties(const cube_properties *p)
{
    printf("{\"name\":");
    json_str(p->name);
    printf(",\"backend\":");
    json_str(p->backend);
    printf(",\"architecture\":");
    json_str(p->architecture);
    printf(",\"compute_units\":%u,\"max_cube_dim\":[%u,%u,%u],"
           "\"max_units_per_cube\":%u,\"max_cube_count\":[%u,%u,%u],"
           "\"max_shared_memory\":%llu,\"memory_total\":%llu,"
           "\"memory_alignment\":%llu,\"max_buffer_size\":%llu,"
           "\"features\":",
           p->compute_units, p->max_cube_dim[0], p->max_cube_dim[1],
           p->max_cube_dim[2], p->max_units_per_cube, p->max_cube_count[0],
           p->max_cube_count[1], p->max_cube_count[2],
           (unsigned long long)p->max_shared_memory,
           (unsigned long long)p->memory_total,
           (unsigned long long)p->memory_alignment,
           (unsigned long long)p->max_buffer_size);
    json_features(p->features);
    printf(",\"timing\":\"%s\"}",
           p->timing == CUBE_TIMING_DEVICE ? "device" : "host_clock");
}

/* The backends compiled in, then those this build left out. */
static void json_backends(void)
{
    const char *const *built = cube_backend_names();
    const char *const *left_out = cube_backend_names_left_out();
    printf("\"backends\":[");
    for (size_t i = 0; built && built[i]; i++) {
        printf("%s", i ? "," : "");
        json_str(built[i]);
    }
    printf("],\"left_out\":[");
    for (size_t i = 0; left_out && left_out[i]; i++) {
        printf("%s", i ? "," : "");
        json_str(left_out[i]);
    }
    printf("]");
}

const char *cubert_unavailable_reason(const cube_error *err, const char *call)
{
    const char *message = cube_error_message(err);
    size_t n = strlen(call);
    if (strncmp(message, call, n) != 0)
        return *message ? message : "no reason given";
    /* "call: " or "call(argument): " */
    const char *p = message + n;
    if (*p == '(') {
        p = strchr(p, ')');
        if (!p)
            return message;
        p++;
    }
    if (p[0] != ':' || p[1] != ' ' || !p[2])
        return message;
    return p + 2;
}

/* `call` is the library function that answered `err`. */
static void json_unavailable(const char *backend, const char *device,
                             const char *call, cube_error *err)
{
    printf("{\"backend\":");
    json_str(backend);
    printf(",\"device\":");
    json_str(device);
    printf(",\"available\":false,\"code\":");
    json_str(cube_code_name(cube_error_code(err)));
    printf(",\"reason\":");
    json_str(cubert_unavailable_reason(err, call));
    printf("}");
    cube_error_free(err);
}

static void json_devices(void)
{
    const char *const *built = cube_backend_names();
    printf(",\"devices\":[");
    int first = 1;
    for (size_t b = 0; built && built[b]; b++) {
        uint32_t count = 0;
        cube_error *err = cube_device_count(built[b], &count);
        if (err) {
            printf("%s", first ? "" : ",");
            first = 0;
            json_unavailable(built[b], NULL, "cube_device_count", err);
            continue;
        }
        for (uint32_t d = 0; d < count; d++) {
            char name[64];
            snprintf(name, sizeof name, "%s:%u", built[b], d);
            cube_device_info info;
            printf("%s", first ? "" : ",");
            first = 0;
            if ((err = cube_device_describe(name, &info))) {
                json_unavailable(built[b], name, "cube_device_describe", err);
                continue;
            }
            printf("{\"backend\":");
            json_str(built[b]);
            printf(",\"device\":");
            json_str(name);
            printf(",\"available\":true,\"clients\":%u,\"properties\":",
                   info.clients);
            json_properties(&info.properties);
            printf("}");
        }
    }
    printf("]");
}

static void json_configuration(void)
{
    printf(",\"configuration\":{\"file\":");
    json_str(cube_config_file());
    printf(",\"keys\":[");
    cube_config_value v;
    for (size_t i = 0; cube_config_entry(i, &v) == 0; i++) {
        printf("%s{\"name\":", i ? "," : "");
        json_str(v.key->name);
        printf(",\"variable\":");
        json_str(v.variable);
        printf(",\"owner\":");
        json_str(v.owner);
        printf(",\"origin\":\"%s\"",
               v.origin == CUBE_CONFIG_ENVIRONMENT ? "environment"
               : v.origin == CUBE_CONFIG_FILE      ? "file"
                                                   : "default");
        printf(",\"value\":");
        if (v.origin == CUBE_CONFIG_UNSET)
            json_str(v.key->default_text);
        else if (v.key->type == CUBE_CONFIG_UINT ||
                 v.key->type == CUBE_CONFIG_WORD)
            printf("%u", (unsigned)v.number);
        else
            json_str(v.text);
        printf(",\"rejected\":");
        json_str(v.rejected);
        printf("}");
    }
    printf("]}");
}

int cubert_info_json(void)
{
    printf("{\"version\":");
    json_str(cube_version());
    printf(",");
    json_backends();
    json_devices();
    json_configuration();
    printf("}\n");
    return ferror(stdout) ? 1 : 0;
}
