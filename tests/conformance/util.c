/* Helpers shared by the conformance tests. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "conformance.h"

static void print_whole(const char *what, const cube_error *err)
{
    char *text = cube_error_format(err);
    print_error("%s%s", what, text ? text : "(unformattable error)\n");
    free(text);
}

void conf_ok_at(cube_error *err, const char *expr, const char *file, int line)
{
    if (!err)
        return;
    print_error("%s:%d: %s failed:\n", file, line, expr);
    print_whole("  ", err);
    cube_error_free(err);
    _fail(file, line);
}

void conf_code_at(const cube_error *err, cube_code code, const char *expr,
                  const char *file, int line)
{
    if (!err) {
        print_error("%s:%d: %s succeeded; expected [%s]\n", file, line, expr,
                    cube_code_name(code));
        _fail(file, line);
    }
    if (cube_error_code(err) != code) {
        print_error("%s:%d: %s: expected [%s], got:\n", file, line, expr,
                    cube_code_name(code));
        print_whole("  ", err);
        _fail(file, line);
    }
    if (cube_error_message(err)[0] == '\0') {
        print_error("%s:%d: %s: [%s] with an empty message\n", file, line, expr,
                    cube_code_name(code));
        _fail(file, line);
    }
}

void conf_expect_at(cube_error *err, cube_code code, const char *needle,
                    const char *expr, const char *file, int line)
{
    if (err && cube_error_code(err) != code) {
        print_error("%s:%d: %s: expected [%s], got:\n", file, line, expr,
                    cube_code_name(code));
        print_whole("  ", err);
        cube_error_free(err);
        _fail(file, line);
    }
    conf_code_at(err, code, expr, file, line);
    if (needle && !strstr(cube_error_message(err), needle)) {
        print_error("%s:%d: %s: the message does not name '%s': %s\n", file,
                    line, expr, needle, cube_error_message(err));
        cube_error_free(err);
        _fail(file, line);
    }
    cube_error_free((cube_error *)err);
}

void conf_expect_named_at(cube_error *err, cube_code code, const char *needle,
                          int *misses, const char *expr, const char *file,
                          int line)
{
    conf_code_at(err, code, expr, file, line);
    if (!strstr(cube_error_message(err), needle)) {
        print_error("%s:%d: %s: the message does not name '%s': %s\n", file,
                    line, expr, needle, cube_error_message(err));
        (*misses)++;
    }
    cube_error_free(err);
}

int conf_error_has_code(const cube_error *err, cube_code code)
{
    if (!err)
        return 0;
    if (cube_error_code(err) == code)
        return 1;
    for (size_t i = 0; i < cube_error_cause_count(err); i++)
        if (conf_error_has_code(cube_error_cause(err, i), code))
            return 1;
    return 0;
}

cube_handle conf_create(const void *bytes, uint64_t size)
{
    cube_handle h = {0};
    CONF_OK(cube_create(conf.client, bytes, size, &h));
    assert_true(h.bits != 0);
    return h;
}

cube_handle conf_empty(uint64_t size)
{
    cube_handle h = {0};
    CONF_OK(cube_empty(conf.client, size, &h));
    assert_true(h.bits != 0);
    return h;
}

cube_handle conf_slice(cube_handle h, uint64_t offset, uint64_t size)
{
    cube_handle s = {0};
    CONF_OK(cube_handle_slice(conf.client, h, offset, size, &s));
    assert_true(s.bits != 0);
    return s;
}

void conf_release(cube_handle h)
{
    CONF_OK(cube_handle_release(conf.client, h));
}

cube_error *conf_read(cube_handle h, void *dst, uint64_t size)
{
    cube_copy_desc d = cube_copy_desc_contiguous(h, size, 1);
    void *dsts[1] = {dst};
    uint64_t sizes[1] = {size};
    return cube_read(conf.client, &d, dsts, sizes, 1);
}

cube_error *conf_write(cube_handle h, const void *src, uint64_t size)
{
    cube_copy_desc d = cube_copy_desc_contiguous(h, size, 1);
    const void *srcs[1] = {src};
    uint64_t sizes[1] = {size};
    return cube_write(conf.client, &d, srcs, sizes, 1);
}

cube_error *conf_launch(cube_kernel *k, cube_count count, const cube_arg *args,
                        size_t nargs, uint32_t mode)
{
    return cube_launch(conf.client, k, count, args, nargs, mode);
}

cube_code conf_mark_code(void)
{
    return conf_runs_kernels() ? CUBE_ERR_RESOURCE_LIMIT : CUBE_ERR_UNSUPPORTED;
}

void conf_mark_failed(cube_handle h)
{
    cube_arg a = cube_arg_buffer(h);
    CONF_EXPECT(conf_launch(conf.k.mark, cube_count_static(1, 1, 1), &a, 1,
                            CUBE_LAUNCH_EXECUTE),
                conf_mark_code());
}

void conf_require(uint32_t features, const char *names)
{
    uint32_t missing = features & ~conf.props.features;
    if (!missing)
        return;
    print_message("skipped: the %s backend does not report %s (features "
                  "0x%x)\n",
                  conf.props.backend, names, conf.props.features);
    skip();
}

void conf_expect_refused_at(cube_handle h, uint64_t size, cube_code cause,
                            const char *file, int line)
{
    unsigned char *dst = malloc(size);
    assert_non_null(dst);
    memset(dst, 0xCD, size);
    cube_error *err = conf_read(h, dst, size);
    int touched = 0;
    for (uint64_t i = 0; i < size; i++)
        touched |= dst[i] != 0xCD;
    free(dst);
    if (!err) {
        print_error("%s:%d: the read of a buffer whose writer failed "
                    "succeeded; expected [%s] with a [%s] cause\n",
                    file, line, cube_code_name(CUBE_ERR_SEVERAL),
                    cube_code_name(cause));
        _fail(file, line);
    }
    int ok = cube_error_code(err) == CUBE_ERR_SEVERAL &&
             cube_error_cause_count(err) >= 1 &&
             conf_error_has_code(err, cause) &&
             cube_error_message(err)[0] != '\0';
    if (!ok) {
        print_error("%s:%d: expected [%s] with a [%s] cause, got:\n", file,
                    line, cube_code_name(CUBE_ERR_SEVERAL),
                    cube_code_name(cause));
        print_whole("  ", err);
    }
    cube_error_free(err);
    if (!ok)
        _fail(file, line);
    if (touched) {
        print_error("%s:%d: a refused read wrote into its destination\n", file,
                    line);
        _fail(file, line);
    }
}

cube_kernel *conf_kernel(const char *name, const char *source, uint32_t dx,
                         uint32_t dy, uint32_t dz)
{
    cube_kernel_desc d = {name, source, {dx, dy, dz}};
    cube_kernel *k = NULL;
    CONF_OK(cube_kernel_create(&d, &k));
    assert_non_null(k);
    return k;
}

int conf_runs_kernels(void)
{
    return (conf.props.features & CUBE_FEATURE_KERNELS) != 0;
}

uint32_t conf_div_up(uint64_t n, uint32_t d)
{
    return (uint32_t)((n + d - 1) / d);
}

void conf_pattern(void *dst, size_t n, uint32_t seed)
{
    unsigned char *p = dst;
    uint32_t x = seed * 2654435761u + 12345u;
    for (size_t i = 0; i < n; i++) {
        x ^= x << 13;
        x ^= x >> 17;
        x ^= x << 5;
        p[i] = (unsigned char)(x >> 7);
    }
}

/* --- host models of the u32 kernels of main.c (rewrite, spin) --- */

/* x = 3x + 1 (mod 2^32) applied `steps` times is one affine map. */
static void conf_affine_steps(uint64_t steps, uint32_t *a, uint32_t *b)
{
    uint32_t fa = 1u, fb = 0u;
    for (uint64_t k = 0; k < steps; k++) {
        fa *= 3u;
        fb = fb * 3u + 1u;
    }
    *a = fa;
    *b = fb;
}

void conf_rewritten(const uint32_t *x0, uint32_t *out, uint32_t n,
                    uint64_t steps)
{
    uint32_t a, b;
    conf_affine_steps(steps, &a, &b);
    for (uint32_t i = 0; i < n; i++)
        out[i] = a * x0[i] + b;
}

void conf_spin_model(const uint32_t *x, uint32_t *y, uint32_t n, uint32_t iters)
{
    uint32_t a, b;
    conf_affine_steps(iters, &a, &b);
    for (uint32_t i = 0; i < n; i++) {
        uint32_t v = a * x[i] + b;
        uint32_t j = i + 1u + (v & 1u);
        while (j >= n)
            j -= n;
        y[i] = v + x[j];
    }
}

uint32_t *conf_host_u32(uint32_t n)
{
    uint32_t *p = malloc((size_t)n * 4u);
    assert_non_null(p);
    return p;
}

cube_code conf_code(cube_error *err)
{
    cube_code code = cube_error_code(err);
    if (err && cube_error_message(err)[0] == '\0')
        code = CUBE_ERR_INTERNAL; /* an error must say what went wrong */
    cube_error_free(err);
    return code;
}

void conf_expect_codes_at(const cube_code *got, const cube_code *want,
                          const char *const *what, size_t n, const char *file,
                          int line)
{
    int bad = 0;
    for (size_t i = 0; i < n; i++) {
        if (got[i] != want[i]) {
            print_error("%s:%d: %s: got [%s], expected [%s]\n", file, line,
                        what[i], cube_code_name(got[i]),
                        cube_code_name(want[i]));
            bad = 1;
        }
    }
    if (bad)
        _fail(file, line);
}
