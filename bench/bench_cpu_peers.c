/* Peers of bench_cpu's barrier kernels (section (f)), built with the CPU
 * backend's JIT flags (-O3 -march=native -ffp-contract=fast; see
 * bench/CMakeLists.txt) so that the comparison is with the same compiler
 * doing its best on plain C. */
#include <stddef.h>
#include <stdint.h>

#include "bench_cpu_peers.h"

/* c = a . b for n x n row-major matrices: the i-k-j loop, rows over the
 * OpenMP threads. */
void bench_peer_sgemm_ikj(const float *restrict a, const float *restrict b,
                          float *restrict c, uint32_t n)
{
#ifdef _OPENMP
#pragma omp parallel for schedule(static)
#endif
    for (uint32_t i = 0; i < n; i++) {
        float *ci = c + (size_t)i * n;
        for (uint32_t j = 0; j < n; j++)
            ci[j] = 0.0f;
        for (uint32_t k = 0; k < n; k++) {
            const float aik = a[(size_t)i * n + k];
            const float *bk = b + (size_t)k * n;
            for (uint32_t j = 0; j < n; j++)
                ci[j] += aik * bk[j];
        }
    }
}

/* The sum of x[0..n): a vectorized OpenMP reduction. */
float bench_peer_sum(const float *restrict x, size_t n)
{
    float sum = 0.0f;
#ifdef _OPENMP
#pragma omp parallel for simd reduction(+ : sum) schedule(static)
#endif
    for (size_t i = 0; i < n; i++)
        sum += x[i];
    return sum;
}
