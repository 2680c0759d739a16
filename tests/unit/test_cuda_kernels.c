/* The CUDA backend's module stamp (src/backends/cuda/cuda_kernels.c): the
 * device global that names the disk cache entry a module was built for,
 * checked in a cached CUBIN's bytes before the driver loads it and in the
 * loaded module's global after. What runs without a GPU: the stamp's text,
 * the stamped source, both checks on given bytes, and (where NVRTC can be
 * loaded) that a CUBIN NVRTC builds from the stamped source carries its
 * own stamp and no other. The driver-side load runs in the conformance
 * suite on a GPU. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backends/cuda/cuda_internal.h"

static disk_cache_key key_of(const char *text)
{
    const void *parts[1] = {text};
    size_t lens[1] = {strlen(text)};
    disk_cache_key key;
    disk_cache_key_make(parts, lens, 1, &key);
    return key;
}

/* Bytes around `stamp` (with its NUL), as a CUBIN holds an initialized
 * global among other sections. */
static unsigned char *wrap_bytes(const char *stamp, size_t *len)
{
    static const char before[] = "\177ELF...code...", after[] = "...more";
    size_t n = sizeof before + strlen(stamp) + 1 + sizeof after;
    unsigned char *b = malloc(n);
    assert_non_null(b);
    memcpy(b, before, sizeof before);
    memcpy(b + sizeof before, stamp, strlen(stamp) + 1);
    memcpy(b + sizeof before + strlen(stamp) + 1, after, sizeof after);
    *len = n;
    return b;
}

static void test_stamp_names_the_entry(void **state)
{
    (void)state;
    disk_cache_key a = key_of("kernel a"), b = key_of("kernel b");
    char sa[CUDA_STAMP_BUF], sb[CUDA_STAMP_BUF], again[CUDA_STAMP_BUF];
    cuda_stamp_text(&a, sa, sizeof sa);
    cuda_stamp_text(&b, sb, sizeof sb);
    cuda_stamp_text(&a, again, sizeof again);
    assert_string_equal(sa, again);
    assert_string_not_equal(sa, sb);
    assert_int_equal(strncmp(sa, CUDA_STAMP_PREFIX, strlen(CUDA_STAMP_PREFIX)),
                     0);
    assert_true(strlen(sa) < CUDA_STAMP_BUF);

    char *src = cuda_stamped_source("__global__ void k() {}", &a);
    assert_non_null(src);
    assert_non_null(strstr(src, "__global__ void k() {}"));
    assert_non_null(strstr(
        src, "extern \"C\" __device__ const char " CUDA_STAMP_SYMBOL "[]"));
    assert_non_null(strstr(src, sa));
    free(src);
}

static void test_cubin_must_carry_its_own_stamp(void **state)
{
    (void)state;
    disk_cache_key a = key_of("kernel a"), b = key_of("kernel b");
    char sa[CUDA_STAMP_BUF], sb[CUDA_STAMP_BUF];
    cuda_stamp_text(&a, sa, sizeof sa);
    cuda_stamp_text(&b, sb, sizeof sb);
    size_t len = 0;
    unsigned char *bytes = wrap_bytes(sa, &len);
    assert_null(cuda_artifact_wrong(bytes, len, 1, &a));
    /* Another entry's CUBIN, or one without a stamp: never trusted. */
    assert_non_null(cuda_artifact_wrong(bytes, len, 1, &b));
    free(bytes);
    static const unsigned char plain[] = "\177ELF no stamp at all";
    assert_non_null(cuda_artifact_wrong(plain, sizeof plain, 1, &a));
    /* A longer text that starts with the stamp is not it. */
    char longer[CUDA_STAMP_BUF + 8];
    snprintf(longer, sizeof longer, "%sXY", sa);
    bytes = wrap_bytes(longer, &len);
    assert_non_null(cuda_artifact_wrong(bytes, len, 1, &a));
    free(bytes);
    /* PTX spells initialized globals as numbers: the module decides. */
    assert_null(cuda_artifact_wrong(plain, sizeof plain, 0, &a));
}

static void test_loaded_module_stamp(void **state)
{
    (void)state;
    disk_cache_key a = key_of("kernel a"), b = key_of("kernel b");
    char sa[CUDA_STAMP_BUF];
    cuda_stamp_text(&a, sa, sizeof sa);
    assert_null(cuda_module_stamp_wrong(sa, strlen(sa) + 1, &a));
    assert_non_null(cuda_module_stamp_wrong(sa, strlen(sa) + 1, &b));
    assert_non_null(cuda_module_stamp_wrong(NULL, 0, &a));
    assert_non_null(cuda_module_stamp_wrong(sa, 0, &a));
    assert_non_null(cuda_module_stamp_wrong(sa, strlen(sa), &a));
}

/* NVRTC needs no GPU: build a CUBIN from a stamped source and check that
 * its bytes hold the stamp as the cache check expects. */
typedef int (*nvrtc_create_fn)(void **, const char *, const char *, int,
                               const char *const *, const char *const *);
typedef int (*nvrtc_compile_fn)(void *, int, const char *const *);
typedef int (*nvrtc_size_fn)(void *, size_t *);
typedef int (*nvrtc_get_fn)(void *, char *);
typedef int (*nvrtc_destroy_fn)(void **);

static void test_nvrtc_cubin_carries_its_stamp(void **state)
{
    (void)state;
    void *h = dlopen("libnvrtc.so", RTLD_NOW | RTLD_LOCAL);
    if (!h)
        h = dlopen("/usr/local/cuda/lib64/libnvrtc.so", RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        print_message("skipped: NVRTC cannot be loaded here\n");
        skip();
    }
    nvrtc_create_fn create;
    nvrtc_compile_fn compile;
    nvrtc_size_fn size_of;
    nvrtc_get_fn get;
    nvrtc_destroy_fn destroy;
    *(void **)&create = dlsym(h, "nvrtcCreateProgram");
    *(void **)&compile = dlsym(h, "nvrtcCompileProgram");
    *(void **)&size_of = dlsym(h, "nvrtcGetCUBINSize");
    *(void **)&get = dlsym(h, "nvrtcGetCUBIN");
    *(void **)&destroy = dlsym(h, "nvrtcDestroyProgram");
    if (!create || !compile || !size_of || !get || !destroy) {
        dlclose(h);
        print_message("skipped: this NVRTC makes no CUBIN\n");
        skip();
    }
    disk_cache_key a = key_of("kernel a"), b = key_of("kernel b");
    char *src = cuda_stamped_source(
        "extern \"C\" __global__ void cube__kernel_k(int *p) { *p = 1; }", &a);
    assert_non_null(src);
    void *prog = NULL;
    assert_int_equal(create(&prog, src, "k.cube.cu", 0, NULL, NULL), 0);
    const char *opts[] = {"-arch=sm_90", "-std=c++17"};
    int rc = compile(prog, 2, opts);
    assert_int_equal(rc, 0);
    size_t n = 0;
    assert_int_equal(size_of(prog, &n), 0);
    assert_true(n > 0);
    unsigned char *cubin = malloc(n);
    assert_non_null(cubin);
    assert_int_equal(get(prog, (char *)cubin), 0);
    destroy(&prog);
    assert_null(cuda_artifact_wrong(cubin, n, 1, &a));
    assert_non_null(cuda_artifact_wrong(cubin, n, 1, &b));
    free(cubin);
    free(src);
    /* NVRTC stays loaded: what it keeps for the process stays reachable
     * (a leak check after dlclose would blame its allocations on us). */
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_stamp_names_the_entry),
        cmocka_unit_test(test_cubin_must_carry_its_own_stamp),
        cmocka_unit_test(test_loaded_module_stamp),
        cmocka_unit_test(test_nvrtc_cubin_carries_its_stamp),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
