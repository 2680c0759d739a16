/* cube C — the portability prelude: host stand-ins for what NVRTC gives a
 * CUDA program without any include, so that the CUDA prelude
 * (src/backends/cuda/prelude_cuda.h), the common prelude and a kernel can
 * be checked by the host C++ compiler (-x c++ -std=c++17 -fsyntax-only
 * -nostdinc) on the CPU backend: a kernel that fails here would fail to
 * compile for CUDA (cpu_portability.c).
 *
 * Only syntax and types matter: nothing here is ever linked or run. The
 * set is exactly what the CUDA prelude uses (its qualifiers, the thread
 * positions, __syncthreads, __trap and the atomic overloads it calls) and
 * the math functions docs/kernels.md promises; tests/unit/
 * test_cpu_portability.c fails when it and those two drift apart. No
 * standard header is reachable (-nostdinc), as under NVRTC: size_t, NULL,
 * malloc, printf and M_PI are undeclared there too.
 */
#define __CUDACC_RTC__ 1

#define __device__
#define __global__
#define __shared__
#define __forceinline__ inline __attribute__((always_inline))
#define __noinline__ __attribute__((noinline))
#define __restrict__ __restrict
#define __align__(n) __attribute__((aligned(n)))

struct cube__portable_dim3 {
    unsigned int x, y, z;
};
extern const cube__portable_dim3 threadIdx, blockIdx, blockDim, gridDim;

void __syncthreads(void);
void __trap(void);

/* The overloads of CUDA's atomic functions the CUDA prelude calls. */
int atomicAdd(int *p, int v);
unsigned int atomicAdd(unsigned int *p, unsigned int v);
unsigned long long atomicAdd(unsigned long long *p, unsigned long long v);
float atomicAdd(float *p, float v);
double atomicAdd(double *p, double v);
int atomicExch(int *p, int v);
unsigned int atomicExch(unsigned int *p, unsigned int v);
unsigned long long atomicExch(unsigned long long *p, unsigned long long v);
int atomicCAS(int *p, int e, int d);
unsigned int atomicCAS(unsigned int *p, unsigned int e, unsigned int d);
unsigned long long atomicCAS(unsigned long long *p, unsigned long long e,
                             unsigned long long d);
int atomicMax(int *p, int v);
unsigned int atomicMax(unsigned int *p, unsigned int v);
unsigned long long atomicMax(unsigned long long *p, unsigned long long v);
int atomicMin(int *p, int v);
unsigned int atomicMin(unsigned int *p, unsigned int v);
unsigned long long atomicMin(unsigned long long *p, unsigned long long v);

/* The math of docs/kernels.md ("Math"): each name with an f is float's;
 * the name without is double's and, as in CUDA C++, also float's, so a
 * call that mixes float and double is ambiguous here as it is there. */
#define CUBE__MATH1(name)                                                      \
    float name##f(float);                                                      \
    double name(double);                                                       \
    float name(float);
#define CUBE__MATH2(name)                                                      \
    float name##f(float, float);                                               \
    double name(double, double);                                               \
    float name(float, float);
#define CUBE__MATH3(name)                                                      \
    float name##f(float, float, float);                                        \
    double name(double, double, double);                                       \
    float name(float, float, float);
CUBE__MATH1(sqrt)
CUBE__MATH1(cbrt)
CUBE__MATH1(exp)
CUBE__MATH1(exp2)
CUBE__MATH1(expm1)
CUBE__MATH1(log)
CUBE__MATH1(log2)
CUBE__MATH1(log10)
CUBE__MATH1(log1p)
CUBE__MATH2(pow)
CUBE__MATH1(sin)
CUBE__MATH1(cos)
CUBE__MATH1(tan)
CUBE__MATH1(asin)
CUBE__MATH1(acos)
CUBE__MATH1(atan)
CUBE__MATH2(atan2)
CUBE__MATH1(sinh)
CUBE__MATH1(cosh)
CUBE__MATH1(tanh)
CUBE__MATH1(erf)
CUBE__MATH2(hypot)
CUBE__MATH1(fabs)
CUBE__MATH2(fmax)
CUBE__MATH2(fmin)
CUBE__MATH2(fmod)
CUBE__MATH1(floor)
CUBE__MATH1(ceil)
CUBE__MATH1(round)
CUBE__MATH1(trunc)
CUBE__MATH2(copysign)
CUBE__MATH3(fma)
#undef CUBE__MATH1
#undef CUBE__MATH2
#undef CUBE__MATH3
