/* A data-parallel training step of a small MLP with cubert kernels, one
 * rank per device, as PyTorch's DistributedDataParallel runs it (its peer:
 * bench/gpu/peers_torch_ddp.py, the same shapes and per-rank batch).
 *
 * Every rank (a thread, its own client on device r, all in one
 * communicator from cube_comm_init_all) starts from the same weights
 * (drawn from a seed) and holds its own shard of a synthetic regression
 * batch (drawn from the seed and the rank). A step, all in cube C:
 *   forward   Z1 = X W1, A = relu(Z1 + b1), Z2 = A W2, Y = Z2 + b2
 *   loss      L = sum((Y - T)^2) / (B O N), the mean over every rank's
 *             batch; dY = 2 (Y - T) / (B O N)
 *   backward  dW2 = A^T dY, db2 = colsum(dY), dA = (dY W2^T) * (A > 0),
 *             dW1 = X^T dA, db1 = colsum(dA)
 *   exchange  one all-reduce (sum) of every gradient packed in one buffer,
 *             the loss after them (DDP's single bucket at these sizes)
 *   update    P -= lr G (SGD) over the parameters, packed alike.
 * The gradients are divided by N in dY, so the sum is DDP's average.
 *
 * Two modes are timed: eager (the launches and the all-reduce issued each
 * step) and graph (the step captured once per rank after
 * cube_graph_prepare and a warm-up step, then replayed on each rank's
 * thread). Each runs W warm-up steps and S timed ones from the initial
 * weights; steps per second = S / the time from a barrier before the
 * first timed step to one after every rank's cube_sync.
 *
 * --check compares, after both runs, every rank's weights and loss with a
 * host reference in double of the same W + S data-parallel steps (every
 * rank must hold the same bytes; tolerance 1e-3 relative plus 1e-5);
 * exit 1 on a mismatch.
 *
 * Usage: bench_ddp_mlp [--backend cpu|cuda] [--ranks N] [--steps S]
 *   [--warmup W] [--batch B] [--in D] [--hidden H] [--out O] [--lr LR]
 *   [--json FILE] [--check]
 * Defaults: cuda, every GPU, S 1000, W 20; cpu, 2 ranks (CUBERT_CPU_DEVICES
 * is set to N when unset), S 50, W 3; B 64 per rank, D 256, H 1024,
 * O 256, LR 0.05. Exits 77 when the backend has fewer than N devices. */
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cubert/cubert.h"

#define PROGRAM "bench_ddp_mlp"
#define MAX_RANKS 64

/* --- kernels --- */

/* Each kernel is a source of its own: a source that never mentions
 * cube_sync runs its units as a plain loop on the CPU backend. */

/* c (m x n, row-major) = a b, a's element (i, q) at i * ars + q * acs,
 * b's (q, j) at q * brs + j * bcs: a transpose is a swap of strides. */
static const char *src_mm =
    "#define TILE 16\n"
    "CUBE_KERNEL(mm, CUBE_IN(float, a), CUBE_IN(float, b), CUBE_OUT(float, "
    "c),\n"
    "            CUBE_SCALAR(uint32_t, m), CUBE_SCALAR(uint32_t, n),\n"
    "            CUBE_SCALAR(uint32_t, k), CUBE_SCALAR(uint32_t, ars),\n"
    "            CUBE_SCALAR(uint32_t, acs), CUBE_SCALAR(uint32_t, brs),\n"
    "            CUBE_SCALAR(uint32_t, bcs), CUBE_SHARED(float, ta, TILE * "
    "TILE),\n"
    "            CUBE_SHARED(float, tb, TILE * TILE))\n"
    "{\n"
    "    uint32_t tx = UNIT_POS_X, ty = UNIT_POS_Y;\n"
    "    uint64_t row = ABSOLUTE_POS_Y, col = ABSOLUTE_POS_X;\n"
    "    float acc = 0.0f;\n"
    "    for (uint32_t t = 0; t < (k + TILE - 1) / TILE; t++) {\n"
    "        uint64_t ak = (uint64_t)t * TILE + tx;\n"
    "        uint64_t bk = (uint64_t)t * TILE + ty;\n"
    "        ta[ty * TILE + tx] = (row < m && ak < k)\n"
    "            ? CUBE_AT(a, row * ars + ak * acs) : 0.0f;\n"
    "        tb[ty * TILE + tx] = (bk < k && col < n)\n"
    "            ? CUBE_AT(b, bk * brs + col * bcs) : 0.0f;\n"
    "        cube_sync();\n"
    "        for (uint32_t q = 0; q < TILE; q++)\n"
    "            acc += ta[ty * TILE + q] * tb[q * TILE + tx];\n"
    "        cube_sync();\n"
    "    }\n"
    "    if (row < m && col < n)\n"
    "        CUBE_AT(c, row * n + col) = acc;\n"
    "}\n";

/* a = relu(z + b), b broadcast over the rows. */
static const char *src_bias_relu =
    "CUBE_KERNEL(bias_relu, CUBE_IN(float, z), CUBE_IN(float, b),\n"
    "            CUBE_OUT(float, a), CUBE_SCALAR(int32_t, cols))\n"
    "{\n"
    "    int i = (int)ABSOLUTE_POS_X;\n"
    "    if (i < (int)CUBE_LEN(a)) {\n"
    "        float v = CUBE_AT(z, i) + CUBE_AT(b, i % cols);\n"
    "        CUBE_AT(a, i) = v > 0.0f ? v : 0.0f;\n"
    "    }\n"
    "}\n";

/* dy = s (z + b - t): the loss's gradient at the output. */
static const char *src_out_grad =
    "CUBE_KERNEL(out_grad, CUBE_IN(float, z), CUBE_IN(float, b),\n"
    "            CUBE_IN(float, t), CUBE_OUT(float, dy),\n"
    "            CUBE_SCALAR(int32_t, cols), CUBE_SCALAR(float, s))\n"
    "{\n"
    "    int i = (int)ABSOLUTE_POS_X;\n"
    "    if (i < (int)CUBE_LEN(dy))\n"
    "        CUBE_AT(dy, i) = s * (CUBE_AT(z, i) + CUBE_AT(b, i % cols) -\n"
    "                              CUBE_AT(t, i));\n"
    "}\n";

/* out[0] = inv * sum((z + b - t)^2), one cube of RED units. */
static const char *src_loss_sum =
    "#define RED 256\n"
    "CUBE_KERNEL(loss_sum, CUBE_IN(float, z), CUBE_IN(float, b),\n"
    "            CUBE_IN(float, t), CUBE_OUT(float, out),\n"
    "            CUBE_SCALAR(uint32_t, cols), CUBE_SCALAR(float, inv),\n"
    "            CUBE_SHARED(float, part, RED))\n"
    "{\n"
    "    uint32_t u = UNIT_POS_X;\n"
    "    float acc = 0.0f;\n"
    "    for (uint64_t i = u; i < CUBE_LEN(t); i += RED) {\n"
    "        float d = CUBE_AT(z, i) + CUBE_AT(b, i % cols) - CUBE_AT(t, "
    "i);\n"
    "        acc += d * d;\n"
    "    }\n"
    "    part[u] = acc;\n"
    "    cube_sync();\n"
    "    for (uint32_t half = RED / 2; half > 0; half /= 2) {\n"
    "        if (u < half)\n"
    "            part[u] += part[u + half];\n"
    "        cube_sync();\n"
    "    }\n"
    "    if (u == 0)\n"
    "        CUBE_AT(out, 0) = part[0] * inv;\n"
    "}\n";

/* da *= relu'(z1), read from a = relu(z1 + b1). */
static const char *src_relu_grad =
    "CUBE_KERNEL(relu_grad, CUBE_INOUT(float, da), CUBE_IN(float, a))\n"
    "{\n"
    "    int i = (int)ABSOLUTE_POS_X;\n"
    "    if (i < (int)CUBE_LEN(da))\n"
    "        CUBE_AT(da, i) = CUBE_AT(a, i) > 0.0f ? CUBE_AT(da, i) : "
    "0.0f;\n"
    "}\n";

/* s[j] = sum over rows of x[., j]: a bias's gradient. */
static const char *src_colsum =
    "CUBE_KERNEL(colsum, CUBE_IN(float, x), CUBE_OUT(float, s),\n"
    "            CUBE_SCALAR(uint32_t, rows), CUBE_SCALAR(uint32_t, cols))\n"
    "{\n"
    "    uint32_t j = ABSOLUTE_POS_X;\n"
    "    if (j < cols) {\n"
    "        float acc = 0.0f;\n"
    "        for (uint32_t i = 0; i < rows; i++)\n"
    "            acc += CUBE_AT(x, (uint64_t)i * cols + j);\n"
    "        CUBE_AT(s, j) = acc;\n"
    "    }\n"
    "}\n";

/* p -= lr g over p's elements (g may be longer: the loss follows). */
static const char *src_sgd =
    "CUBE_KERNEL(sgd, CUBE_INOUT(float, p), CUBE_IN(float, g),\n"
    "            CUBE_SCALAR(float, lr))\n"
    "{\n"
    "    int i = (int)ABSOLUTE_POS_X;\n"
    "    if (i < (int)CUBE_LEN(p))\n"
    "        CUBE_AT(p, i) -= lr * CUBE_AT(g, i);\n"
    "}\n";

enum { K_MM, K_BIAS_RELU, K_OUT_GRAD, K_LOSS, K_RELU_GRAD, K_COLSUM, K_SGD };
static const struct {
    const char *name;
    const char *const *src;
    uint32_t dim[3];
} kernel_list[] = {{"mm", &src_mm, {16, 16, 1}},
                   {"bias_relu", &src_bias_relu, {256, 1, 1}},
                   {"out_grad", &src_out_grad, {256, 1, 1}},
                   {"loss_sum", &src_loss_sum, {256, 1, 1}},
                   {"relu_grad", &src_relu_grad, {256, 1, 1}},
                   {"colsum", &src_colsum, {256, 1, 1}},
                   {"sgd", &src_sgd, {256, 1, 1}}};

#define NKERNELS (sizeof kernel_list / sizeof kernel_list[0])

/* --- configuration and shared state --- */

typedef struct config {
    const char *backend;
    uint32_t ranks, steps, warmup;
    uint32_t batch, in, hidden, out;
    float lr;
    uint64_t seed;
    const char *json;
    int check;
} config;

/* Offsets (in floats) of the packed parameters, and of their gradients
 * in the packed gradient buffer, which has the loss after them. */
typedef struct layout {
    uint64_t w1, b1, w2, b2, params, loss, grads;
} layout;

enum { EAGER, GRAPH, MODES };
static const char *mode_name[MODES] = {"eager", "graph"};

typedef struct bench {
    config cfg;
    layout lay;
    cube_kernel *k[NKERNELS];
    cube_client *client[MAX_RANKS];
    cube_comm *comm[MAX_RANKS];
    pthread_barrier_t barrier;
    float *init; /* the initial parameters */
    double seconds[MODES];
    /* per rank and mode, for --check: the parameters and the loss after
     * the run */
    float *final[MAX_RANKS][MODES];
    float loss[MAX_RANKS][MODES];
} bench;

static void ok(cube_error *err, const char *what)
{
    if (!err)
        return;
    fprintf(stderr, PROGRAM ": %s: %s\n", what, cube_error_message(err));
    const char *log = cube_error_log(err);
    if (log && *log)
        fprintf(stderr, "%s\n", log);
    exit(1);
}

static void *xmalloc(size_t bytes)
{
    void *p = malloc(bytes ? bytes : 1);
    if (!p) {
        fprintf(stderr, PROGRAM ": out of host memory\n");
        exit(1);
    }
    return p;
}

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

/* --- deterministic data --- */

static uint64_t mix64(uint64_t z)
{
    z += 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* Element i of stream `stream`, uniform in [-1, 1) with 24 bits: the
 * same float on every rank and in the reference. */
static float uniform(uint64_t seed, uint64_t stream, uint64_t i)
{
    uint64_t z = mix64(mix64(seed) ^ mix64((stream << 48) ^ i));
    return (float)((double)(z >> 40) / (double)(1u << 23) - 1.0);
}

enum { S_W1 = 1, S_B1, S_W2, S_B2, S_X, S_T };

static layout make_layout(const config *c)
{
    layout l;
    l.w1 = 0;
    l.b1 = l.w1 + (uint64_t)c->in * c->hidden;
    l.w2 = l.b1 + c->hidden;
    l.b2 = l.w2 + (uint64_t)c->hidden * c->out;
    l.params = l.b2 + c->out;
    l.loss = l.params;
    l.grads = l.loss + 1;
    return l;
}

/* PyTorch's default for a linear layer: uniform in +-1/sqrt(fan_in), the
 * weights and the bias alike. */
static float *initial_params(const config *c, const layout *l)
{
    float *p = xmalloc(l->params * sizeof *p);
    float s1 = 1.0f / sqrtf((float)c->in), s2 = 1.0f / sqrtf((float)c->hidden);
    for (uint64_t i = 0; i < l->b1 - l->w1; i++)
        p[l->w1 + i] = s1 * uniform(c->seed, S_W1, i);
    for (uint64_t i = 0; i < c->hidden; i++)
        p[l->b1 + i] = s1 * uniform(c->seed, S_B1, i);
    for (uint64_t i = 0; i < l->b2 - l->w2; i++)
        p[l->w2 + i] = s2 * uniform(c->seed, S_W2, i);
    for (uint64_t i = 0; i < c->out; i++)
        p[l->b2 + i] = s2 * uniform(c->seed, S_B2, i);
    return p;
}

/* Rank r's shard: rows r B .. r B + B - 1 of the global batch. */
static float *shard(const config *c, uint32_t r, int stream, uint32_t cols)
{
    uint64_t n = (uint64_t)c->batch * cols;
    float *x = xmalloc(n * sizeof *x);
    for (uint64_t i = 0; i < n; i++)
        x[i] = uniform(c->seed, (uint64_t)stream,
                       (uint64_t)r * c->batch * cols + i);
    return x;
}

/* --- one rank --- */

typedef struct rank_ctx {
    bench *b;
    uint32_t r;
    cube_client *c;
    cube_comm *comm;
    /* packed parameters and gradients, the shard, activations */
    cube_handle P, G, X, T, Z1, A, Z2, dY, dA;
    /* slices of P, and of G */
    cube_handle W1, b1, W2, b2, gW1, gb1, gW2, gb2, gloss;
} rank_ctx;

static cube_handle new_buffer(rank_ctx *k, uint64_t floats)
{
    cube_handle h;
    ok(cube_empty(k->c, floats * 4, &h), "cube_empty");
    return h;
}

static cube_handle slice(rank_ctx *k, cube_handle h, uint64_t at,
                         uint64_t floats)
{
    cube_handle s;
    ok(cube_handle_slice(k->c, h, at * 4, floats * 4, &s), "slice");
    return s;
}

static void write_floats(rank_ctx *k, cube_handle h, const float *src,
                         uint64_t n)
{
    cube_copy_desc d = cube_copy_desc_contiguous(h, n * 4, 4);
    const void *srcs[1] = {src};
    uint64_t sizes[1] = {n * 4};
    ok(cube_write(k->c, &d, srcs, sizes, 1), "cube_write");
}

static void read_floats(rank_ctx *k, cube_handle h, float *dst, uint64_t n)
{
    cube_copy_desc d = cube_copy_desc_contiguous(h, n * 4, 4);
    void *dsts[1] = {dst};
    uint64_t sizes[1] = {n * 4};
    ok(cube_read(k->c, &d, dsts, sizes, 1), "cube_read");
}

static void launch(rank_ctx *k, int which, uint64_t x, uint64_t y,
                   const cube_arg *args, uint32_t nargs)
{
    ok(cube_launch(k->c, k->b->k[which],
                   cube_count_static((uint32_t)x, (uint32_t)y, 1), args, nargs,
                   CUBE_LAUNCH_EXECUTE),
       kernel_list[which].name);
}

/* c (m x n) = a b with a's (i, q) at i ars + q acs, b's (q, j) at
 * q brs + j bcs. */
static void mm(rank_ctx *k, cube_handle a, cube_handle b, cube_handle c,
               uint32_t m, uint32_t n, uint32_t kk, uint32_t ars, uint32_t acs,
               uint32_t brs, uint32_t bcs)
{
    cube_arg args[] = {cube_arg_buffer(a), cube_arg_buffer(b),
                       cube_arg_buffer(c), cube_arg_u32(m),
                       cube_arg_u32(n),    cube_arg_u32(kk),
                       cube_arg_u32(ars),  cube_arg_u32(acs),
                       cube_arg_u32(brs),  cube_arg_u32(bcs)};
    launch(k, K_MM, (n + 15) / 16, (m + 15) / 16, args, 10);
}

static uint64_t cubes(uint64_t n)
{
    return (n + 255) / 256;
}

/* One data-parallel step on this rank's stream. */
static void step(rank_ctx *k)
{
    const config *c = &k->b->cfg;
    uint32_t B = c->batch, D = c->in, H = c->hidden, O = c->out;
    uint64_t bh = (uint64_t)B * H, bo = (uint64_t)B * O;
    float inv = 1.0f / ((float)B * (float)O * (float)c->ranks);
    /* forward */
    mm(k, k->X, k->W1, k->Z1, B, H, D, D, 1, H, 1);
    cube_arg br[] = {cube_arg_buffer(k->Z1), cube_arg_buffer(k->b1),
                     cube_arg_buffer(k->A), cube_arg_i32((int32_t)H)};
    launch(k, K_BIAS_RELU, cubes(bh), 1, br, 4);
    mm(k, k->A, k->W2, k->Z2, B, O, H, H, 1, O, 1);
    /* loss and its gradient */
    cube_arg og[] = {cube_arg_buffer(k->Z2),   cube_arg_buffer(k->b2),
                     cube_arg_buffer(k->T),    cube_arg_buffer(k->dY),
                     cube_arg_i32((int32_t)O), cube_arg_f32(2.0f * inv)};
    launch(k, K_OUT_GRAD, cubes(bo), 1, og, 6);
    cube_arg ls[] = {cube_arg_buffer(k->Z2), cube_arg_buffer(k->b2),
                     cube_arg_buffer(k->T),  cube_arg_buffer(k->gloss),
                     cube_arg_u32(O),        cube_arg_f32(inv)};
    launch(k, K_LOSS, 1, 1, ls, 6);
    /* backward */
    mm(k, k->A, k->dY, k->gW2, H, O, B, 1, H, O, 1); /* A^T dY */
    cube_arg c2[] = {cube_arg_buffer(k->dY), cube_arg_buffer(k->gb2),
                     cube_arg_u32(B), cube_arg_u32(O)};
    launch(k, K_COLSUM, cubes(O), 1, c2, 4);
    mm(k, k->dY, k->W2, k->dA, B, H, O, O, 1, 1, O); /* dY W2^T */
    cube_arg rg[] = {cube_arg_buffer(k->dA), cube_arg_buffer(k->A)};
    launch(k, K_RELU_GRAD, cubes(bh), 1, rg, 2);
    mm(k, k->X, k->dA, k->gW1, D, H, B, 1, D, H, 1); /* X^T dA */
    cube_arg c1[] = {cube_arg_buffer(k->dA), cube_arg_buffer(k->gb1),
                     cube_arg_u32(B), cube_arg_u32(H)};
    launch(k, K_COLSUM, cubes(H), 1, c1, 4);
    /* one bucket: every gradient and the loss */
    ok(cube_all_reduce(k->comm, k->G, k->G, k->b->lay.grads, CUBE_DTYPE_F32,
                       CUBE_REDUCE_SUM),
       "all-reduce");
    cube_arg sg[] = {cube_arg_buffer(k->P), cube_arg_buffer(k->G),
                     cube_arg_f32(c->lr)};
    launch(k, K_SGD, cubes(k->b->lay.params), 1, sg, 3);
}

/* The time of `steps` steps (or replays of `graph`) between barriers of
 * every rank, each rank's stream drained; rank 0 keeps it. */
static void timed(rank_ctx *k, int mode, cube_graph_id graph)
{
    uint32_t steps = k->b->cfg.steps;
    ok(cube_sync(k->c, NULL, 0), "sync");
    pthread_barrier_wait(&k->b->barrier);
    double t0 = now_s();
    for (uint32_t i = 0; i < steps; i++) {
        if (mode == GRAPH)
            ok(cube_graph_replay(k->c, graph), "replay");
        else
            step(k);
    }
    ok(cube_sync(k->c, NULL, 0), "sync");
    pthread_barrier_wait(&k->b->barrier);
    if (k->r == 0)
        k->b->seconds[mode] = now_s() - t0;
}

static void keep_result(rank_ctx *k, int mode)
{
    bench *b = k->b;
    if (!b->cfg.check)
        return;
    b->final[k->r][mode] = xmalloc(b->lay.params * sizeof(float));
    read_floats(k, k->P, b->final[k->r][mode], b->lay.params);
    read_floats(k, k->gloss, &b->loss[k->r][mode], 1);
}

static void *rank_main(void *arg)
{
    rank_ctx *k = arg;
    bench *b = k->b;
    const config *c = &b->cfg;
    const layout *l = &b->lay;
    uint32_t B = c->batch;
    k->P = new_buffer(k, l->params);
    k->G = new_buffer(k, l->grads);
    k->X = new_buffer(k, (uint64_t)B * c->in);
    k->T = new_buffer(k, (uint64_t)B * c->out);
    k->Z1 = new_buffer(k, (uint64_t)B * c->hidden);
    k->A = new_buffer(k, (uint64_t)B * c->hidden);
    k->Z2 = new_buffer(k, (uint64_t)B * c->out);
    k->dY = new_buffer(k, (uint64_t)B * c->out);
    k->dA = new_buffer(k, (uint64_t)B * c->hidden);
    k->W1 = slice(k, k->P, l->w1, l->b1 - l->w1);
    k->b1 = slice(k, k->P, l->b1, c->hidden);
    k->W2 = slice(k, k->P, l->w2, l->b2 - l->w2);
    k->b2 = slice(k, k->P, l->b2, c->out);
    k->gW1 = slice(k, k->G, l->w1, l->b1 - l->w1);
    k->gb1 = slice(k, k->G, l->b1, c->hidden);
    k->gW2 = slice(k, k->G, l->w2, l->b2 - l->w2);
    k->gb2 = slice(k, k->G, l->b2, c->out);
    k->gloss = slice(k, k->G, l->loss, 1);
    float *x = shard(c, k->r, S_X, c->in), *t = shard(c, k->r, S_T, c->out);
    write_floats(k, k->X, x, (uint64_t)B * c->in);
    write_floats(k, k->T, t, (uint64_t)B * c->out);
    free(x);
    free(t);

    /* eager: W warm-up steps (the kernels compile in the first), S timed */
    write_floats(k, k->P, b->init, l->params);
    for (uint32_t i = 0; i < c->warmup; i++)
        step(k);
    timed(k, EAGER, 0);
    keep_result(k, EAGER);

    /* graph: from the initial weights again; the warm-up step before the
     * capture is the first of the W, the capture runs nothing */
    write_floats(k, k->P, b->init, l->params);
    cube_graph_id graph = 0;
    ok(cube_graph_prepare(k->c), "cube_graph_prepare");
    step(k);
    ok(cube_graph_begin(k->c), "cube_graph_begin");
    step(k);
    ok(cube_graph_end(k->c, &graph), "cube_graph_end");
    for (uint32_t i = 1; i < c->warmup; i++)
        ok(cube_graph_replay(k->c, graph), "replay");
    timed(k, GRAPH, graph);
    keep_result(k, GRAPH);
    ok(cube_graph_destroy(k->c, graph), "cube_graph_destroy");

    cube_handle all[] = {k->P,  k->G,   k->X,   k->T,   k->Z1,  k->A,
                         k->Z2, k->dY,  k->dA,  k->W1,  k->b1,  k->W2,
                         k->b2, k->gW1, k->gb1, k->gW2, k->gb2, k->gloss};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        ok(cube_handle_release(k->c, all[i]), "release");
    return NULL;
}

/* --- the host reference --- */

/* `steps` data-parallel steps over every rank's shard in double, from
 * the initial parameters; p receives the parameters, *loss the loss of
 * the last step (before its update). */
static void reference(const bench *b, uint32_t steps, double *p, double *loss)
{
    const config *c = &b->cfg;
    const layout *l = &b->lay;
    uint32_t B = c->batch, D = c->in, H = c->hidden, O = c->out, N = c->ranks;
    double inv = 1.0 / ((double)B * O * N);
    double *g = xmalloc(l->params * sizeof *g);
    double *a = xmalloc((uint64_t)B * H * sizeof *a);
    double *da = xmalloc((uint64_t)B * H * sizeof *da);
    double *dy = xmalloc((uint64_t)B * O * sizeof *dy);
    float **xs = xmalloc(N * sizeof *xs), **ts = xmalloc(N * sizeof *ts);
    for (uint32_t r = 0; r < N; r++) {
        xs[r] = shard(c, r, S_X, D);
        ts[r] = shard(c, r, S_T, O);
    }
    for (uint64_t i = 0; i < l->params; i++)
        p[i] = b->init[i];
    const double *w1 = p + l->w1, *b1 = p + l->b1, *w2 = p + l->w2,
                 *b2 = p + l->b2;
    double *gw1 = g + l->w1, *gb1 = g + l->b1, *gw2 = g + l->w2,
           *gb2 = g + l->b2;
    for (uint32_t s = 0; s < steps; s++) {
        memset(g, 0, l->params * sizeof *g);
        *loss = 0;
        for (uint32_t r = 0; r < N; r++) {
            const float *x = xs[r], *t = ts[r];
            for (uint32_t i = 0; i < B; i++)
                for (uint32_t h = 0; h < H; h++) {
                    double z = b1[h];
                    for (uint32_t d = 0; d < D; d++)
                        z += (double)x[i * D + d] * w1[(uint64_t)d * H + h];
                    a[(uint64_t)i * H + h] = z > 0 ? z : 0;
                }
            for (uint32_t i = 0; i < B; i++)
                for (uint32_t o = 0; o < O; o++) {
                    double y = b2[o];
                    for (uint32_t h = 0; h < H; h++)
                        y += a[(uint64_t)i * H + h] * w2[(uint64_t)h * O + o];
                    double d = y - t[i * O + o];
                    *loss += d * d * inv;
                    dy[i * O + o] = 2.0 * inv * d;
                }
            for (uint32_t i = 0; i < B; i++)
                for (uint32_t o = 0; o < O; o++) {
                    gb2[o] += dy[i * O + o];
                    for (uint32_t h = 0; h < H; h++)
                        gw2[(uint64_t)h * O + o] +=
                            a[(uint64_t)i * H + h] * dy[i * O + o];
                }
            for (uint32_t i = 0; i < B; i++)
                for (uint32_t h = 0; h < H; h++) {
                    double v = 0;
                    for (uint32_t o = 0; o < O; o++)
                        v += dy[i * O + o] * w2[(uint64_t)h * O + o];
                    da[(uint64_t)i * H + h] =
                        a[(uint64_t)i * H + h] > 0 ? v : 0;
                }
            for (uint32_t i = 0; i < B; i++)
                for (uint32_t h = 0; h < H; h++) {
                    double v = da[(uint64_t)i * H + h];
                    gb1[h] += v;
                    for (uint32_t d = 0; d < D; d++)
                        gw1[(uint64_t)d * H + h] += (double)x[i * D + d] * v;
                }
        }
        for (uint64_t i = 0; i < l->params; i++)
            p[i] -= (double)c->lr * g[i];
    }
    for (uint32_t r = 0; r < N; r++) {
        free(xs[r]);
        free(ts[r]);
    }
    free(xs);
    free(ts);
    free(g);
    free(a);
    free(da);
    free(dy);
}

static int close_enough(double got, double want)
{
    return fabs(got - want) <= 1e-5 + 1e-3 * fabs(want);
}

/* 0 when every rank of both modes holds the reference's parameters and
 * loss, and the same bytes as rank 0. */
static int check(const bench *b)
{
    const config *c = &b->cfg;
    const layout *l = &b->lay;
    uint32_t steps = c->warmup + c->steps;
    double *p = xmalloc(l->params * sizeof *p), loss = 0;
    reference(b, steps, p, &loss);
    int bad = 0;
    for (int m = 0; m < MODES; m++) {
        double worst = 0;
        for (uint32_t r = 0; r < c->ranks; r++) {
            const float *q = b->final[r][m];
            if (r > 0 && memcmp(q, b->final[0][m], l->params * 4) != 0) {
                fprintf(stderr,
                        PROGRAM ": %s: rank %u's parameters differ from "
                                "rank 0's\n",
                        mode_name[m], r);
                bad = 1;
            }
            uint64_t wrong = 0;
            for (uint64_t i = 0; i < l->params; i++) {
                double e = fabs(q[i] - p[i]);
                worst = e > worst ? e : worst;
                if (!close_enough(q[i], p[i]) && wrong++ == 0)
                    fprintf(stderr,
                            PROGRAM ": %s: rank %u parameter %llu is %.9g, "
                                    "the reference %.9g\n",
                            mode_name[m], r, (unsigned long long)i, q[i], p[i]);
            }
            if (wrong) {
                fprintf(stderr,
                        PROGRAM ": %s: rank %u: %llu of %llu "
                                "parameters off\n",
                        mode_name[m], r, (unsigned long long)wrong,
                        (unsigned long long)l->params);
                bad = 1;
            }
            if (!close_enough(b->loss[r][m], loss)) {
                fprintf(stderr,
                        PROGRAM ": %s: rank %u loss is %.9g, the reference "
                                "%.9g\n",
                        mode_name[m], r, b->loss[r][m], loss);
                bad = 1;
            }
        }
        printf("check %s: %u steps, %u ranks, loss %.6g (reference %.6g), "
               "largest parameter error %.3g: %s\n",
               mode_name[m], steps, c->ranks, b->loss[0][m], loss, worst,
               bad ? "MISMATCH" : "ok");
    }
    free(p);
    return bad;
}

/* --- main --- */

static void usage(FILE *f)
{
    fprintf(f, "usage: " PROGRAM " [--backend cpu|cuda] [--ranks N] "
               "[--steps S] [--warmup W] [--batch B] [--in D] [--hidden H] "
               "[--out O] [--lr LR] [--json FILE] [--check]\n");
}

static int parse_u32(const char *s, uint32_t *out)
{
    char *end;
    unsigned long v = strtoul(s, &end, 10);
    if (!*s || *end || *s == '-' || v == 0 || v > 1u << 24)
        return -1;
    *out = (uint32_t)v;
    return 0;
}

int main(int argc, char **argv)
{
    static bench b;
    config *c = &b.cfg;
    c->backend = "cuda";
    c->batch = 64;
    c->in = 256;
    c->hidden = 1024;
    c->out = 256;
    c->lr = 0.05f;
    c->seed = 12345;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        uint32_t *u = strcmp(a, "--ranks") == 0    ? &c->ranks
                      : strcmp(a, "--steps") == 0  ? &c->steps
                      : strcmp(a, "--warmup") == 0 ? &c->warmup
                      : strcmp(a, "--batch") == 0  ? &c->batch
                      : strcmp(a, "--in") == 0     ? &c->in
                      : strcmp(a, "--hidden") == 0 ? &c->hidden
                      : strcmp(a, "--out") == 0    ? &c->out
                                                   : NULL;
        if (strcmp(a, "--check") == 0) {
            c->check = 1;
        } else if (strcmp(a, "--help") == 0) {
            usage(stdout);
            return 0;
        } else if (!v) {
            usage(stderr);
            return 2;
        } else if (u) {
            if (parse_u32(v, u)) {
                fprintf(stderr, PROGRAM ": bad value '%s' for %s\n", v, a);
                return 2;
            }
            i++;
        } else if (strcmp(a, "--backend") == 0) {
            c->backend = argv[++i];
        } else if (strcmp(a, "--json") == 0) {
            c->json = argv[++i];
        } else if (strcmp(a, "--lr") == 0) {
            c->lr = strtof(argv[++i], NULL);
        } else {
            usage(stderr);
            return 2;
        }
    }
    int cpu = strcmp(c->backend, "cpu") == 0;
    if (!cpu && strcmp(c->backend, "cuda") != 0) {
        fprintf(stderr, PROGRAM ": backend '%s': cpu or cuda\n", c->backend);
        return 2;
    }
    if (!c->steps)
        c->steps = cpu ? 50 : 1000;
    if (!c->warmup)
        c->warmup = cpu ? 3 : 20;
    if (cpu && !c->ranks)
        c->ranks = 2;
    /* The CPU backend's virtual devices, read when it first starts. */
    if (cpu) {
        char n[16];
        snprintf(n, sizeof n, "%u", c->ranks);
        setenv("CUBERT_CPU_DEVICES", n, 0);
    }
    uint32_t devices = 0;
    cube_error *err = cube_device_count(c->backend, &devices);
    if (err || devices == 0) {
        fprintf(stderr, PROGRAM ": no %s device (%s)\n", c->backend,
                err ? cube_error_message(err) : "none found");
        cube_error_free(err);
        return 77;
    }
    if (!c->ranks)
        c->ranks = devices < MAX_RANKS ? devices : MAX_RANKS;
    if (c->ranks > devices || c->ranks > MAX_RANKS) {
        fprintf(stderr, PROGRAM ": %u ranks, %u %s device(s)\n", c->ranks,
                devices, c->backend);
        return 77;
    }
    b.lay = make_layout(c);
    if (b.lay.grads > (1ull << 31) / 4 ||
        (uint64_t)c->batch * (c->hidden > c->in ? c->hidden : c->in) >
            (1ull << 31)) {
        fprintf(stderr, PROGRAM ": sizes too large\n");
        return 2;
    }
    for (size_t i = 0; i < NKERNELS; i++) {
        cube_kernel_desc d = {kernel_list[i].name,
                              *kernel_list[i].src,
                              {kernel_list[i].dim[0], kernel_list[i].dim[1],
                               kernel_list[i].dim[2]}};
        ok(cube_kernel_create(&d, &b.k[i]), "cube_kernel_create");
    }
    for (uint32_t r = 0; r < c->ranks; r++) {
        char name[32];
        snprintf(name, sizeof name, "%s:%u", c->backend, r);
        ok(cube_client_open(name, NULL, &b.client[r]), name);
    }
    err = cube_comm_init_all(b.client, c->ranks, NULL, b.comm);
    if (err) {
        fprintf(stderr, PROGRAM ": %s\n", cube_error_message(err));
        return cube_error_code(err) == CUBE_ERR_UNAVAILABLE ? 77 : 1;
    }
    b.init = initial_params(c, &b.lay);
    cube_device_info info;
    ok(cube_client_device(b.client[0], &info), "cube_client_device");
    printf("MLP %u-%u-%u, batch %u per rank, %u rank(s) on %s (%s); "
           "%llu parameters, one all-reduce of %llu bytes per step\n",
           c->in, c->hidden, c->out, c->batch, c->ranks, c->backend,
           info.properties.name, (unsigned long long)b.lay.params,
           (unsigned long long)b.lay.grads * 4);

    pthread_barrier_init(&b.barrier, NULL, c->ranks);
    static rank_ctx ranks[MAX_RANKS];
    pthread_t threads[MAX_RANKS];
    for (uint32_t r = 0; r < c->ranks; r++) {
        ranks[r] =
            (rank_ctx){.b = &b, .r = r, .c = b.client[r], .comm = b.comm[r]};
        pthread_create(&threads[r], NULL, rank_main, &ranks[r]);
    }
    for (uint32_t r = 0; r < c->ranks; r++)
        pthread_join(threads[r], NULL);
    pthread_barrier_destroy(&b.barrier);

    double sps[MODES];
    for (int m = 0; m < MODES; m++) {
        sps[m] = c->steps / b.seconds[m];
        printf("%-6s %10.1f steps/s  %9.3f ms/step  (%u steps after %u "
               "warm-up)\n",
               mode_name[m], sps[m], 1e3 / sps[m], c->steps, c->warmup);
    }
    int status = c->check ? check(&b) : 0;
    if (c->json) {
        FILE *f = fopen(c->json, "w");
        if (!f) {
            fprintf(stderr, PROGRAM ": cannot write %s\n", c->json);
            return 1;
        }
        fprintf(f,
                "{\n  \"backend\": \"%s\",\n  \"device\": \"%s\",\n"
                "  \"ranks\": %u,\n  \"batch\": %u,\n  \"in\": %u,\n"
                "  \"hidden\": %u,\n  \"out\": %u,\n  \"lr\": %g,\n"
                "  \"params\": %llu,\n  \"bucket_bytes\": %llu,\n"
                "  \"warmup\": %u,\n  \"steps\": %u,\n"
                "  \"eager_steps_per_s\": %.3f,\n"
                "  \"graph_steps_per_s\": %.3f,\n  \"checked\": %s\n}\n",
                c->backend, info.properties.name, c->ranks, c->batch, c->in,
                c->hidden, c->out, (double)c->lr,
                (unsigned long long)b.lay.params,
                (unsigned long long)b.lay.grads * 4, c->warmup, c->steps,
                sps[EAGER], sps[GRAPH],
                !c->check ? "null"
                : status  ? "false"
                          : "true");
        fclose(f);
    }
    for (uint32_t r = 0; r < c->ranks; r++) {
        cube_comm_destroy(b.comm[r]);
        cube_client_close(b.client[r]);
        for (int m = 0; m < MODES; m++)
            free(b.final[r][m]);
    }
    for (size_t i = 0; i < NKERNELS; i++)
        cube_kernel_release(b.k[i]);
    free(b.init);
    return status;
}
