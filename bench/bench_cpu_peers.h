/* Peers of bench_cpu's barrier kernels, built with the JIT's flags. */
#ifndef CUBE_BENCH_CPU_PEERS_H
#define CUBE_BENCH_CPU_PEERS_H

#include <stddef.h>
#include <stdint.h>

void bench_peer_sgemm_ikj(const float *restrict a, const float *restrict b,
                          float *restrict c, uint32_t n);
float bench_peer_sum(const float *x, size_t n);

#endif
