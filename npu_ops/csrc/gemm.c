/* fp32 linear layer for the CPU: y[M, N] = x[M, K] . W[N, K]^T (+ bias), W pre-packed into panels
 * of 16 output columns, k-major (Wp[N/16][K][16], the last panel zero-padded).
 *
 * oneDNN's and MKL's sgemm on this kind of CPU (AVX2) leave the FMA units half idle on the skinny
 * matrices of decoding (a few to a few dozen rows) and do not overlap streaming the weights from
 * memory with the arithmetic. This is the classic register-blocked kernel: a 6 x 16 tile of y in
 * twelve ymm accumulators, one broadcast of x and two loads of the panel per k; the first tile of
 * each panel prefetches the next panel. Rows are taken in chunks of MC that stay in L2 while every
 * panel passes. Without AVX2 a plain loop computes the same tiles.
 * Threads come from the OpenMP runtime the process already has loaded (PyTorch's libgomp). */
#include <stdint.h>
#include <string.h>
#include <omp.h>

#include "elementwise.h"
#include "gemm.h"
#include "gemm_tile.h"
#include "kernels.h"
#include "team_sync.h"

#define NR F32_TILE_NR
#define MR F32_TILE_MR
#define MC 96
/* A single row (a one-stream decode step: bandwidth-bound) reads GP panels at once: one sequential stream a
 * thread left memory idle part of the time (tools/membw.c: 1 stream 43 GB/s, 4: 53). Each column still
 * accumulates over k in tile_r's order, so a row's result is bit-identical to the one-panel tiles'. */
#define GP 4

#ifdef __AVX2__
#include <immintrin.h>

/* c[R, 16] = a[R, K] (rows lda apart) . panel b[K, 16]; pf: where to prefetch, pf_step floats per k.
 * Always inlined with a constant R, so the accumulator arrays live in registers. */
static inline __attribute__((always_inline)) void tile_r(const int R, const float *restrict a, int64_t lda,
                                                         const float *restrict b, int64_t K, float *restrict c,
                                                         const float *restrict pf, int64_t pf_step) {
    __m256 c0[MR], c1[MR];
#pragma GCC unroll 6
    for (int r = 0; r < R; ++r) c0[r] = c1[r] = _mm256_setzero_ps();
    for (int64_t k = 0; k < K; ++k) {
        const __m256 b0 = _mm256_loadu_ps(b + k * NR), b1 = _mm256_loadu_ps(b + k * NR + 8);
#pragma GCC unroll 6
        for (int r = 0; r < R; ++r) {
            const __m256 av = _mm256_broadcast_ss(a + r * lda + k);
            c0[r] = _mm256_fmadd_ps(av, b0, c0[r]);
            c1[r] = _mm256_fmadd_ps(av, b1, c1[r]);
        }
        __builtin_prefetch(pf + k * pf_step, 0, 1);
    }
#pragma GCC unroll 6
    for (int r = 0; r < R; ++r) {
        _mm256_storeu_ps(c + r * NR, c0[r]);
        _mm256_storeu_ps(c + r * NR + 8, c1[r]);
    }
}

#define TILE(R)                                                                                            \
    static void tile##R(const float *a, int64_t lda, const float *b, int64_t K, float *c, const float *pf, \
                        int64_t pf_step) {                                                                 \
        tile_r(R, a, lda, b, K, c, pf, pf_step);                                                           \
    }
TILE(1)
TILE(2)
TILE(3)
TILE(4)
TILE(5)
TILE(6)

typedef void (*tile_fn)(const float *, int64_t, const float *, int64_t, float *, const float *, int64_t);
static const tile_fn TILES[MR + 1] = {0, tile1, tile2, tile3, tile4, tile5, tile6};

void f32_tile(int mr, const float *a, int64_t lda, const float *b, int64_t K, float *c, const float *pf,
              int64_t pf_step) {
    TILES[mr](a, lda, b, K, c, pf, pf_step);
}

/* c[g * 16 + j] = a[0:K] . panel bs[g], g < GP: one row against GP panels in lockstep. */
static void row_tile_multi(const float *restrict a, const float *const *bs, int64_t K, float *restrict c) {
    const float *restrict b0 = bs[0], *restrict b1 = bs[1], *restrict b2 = bs[2], *restrict b3 = bs[3];
    __m256 c0 = _mm256_setzero_ps(), c1 = c0, c2 = c0, c3 = c0, c4 = c0, c5 = c0, c6 = c0, c7 = c0;
    for (int64_t k = 0; k < K; ++k) {
        const __m256 av = _mm256_broadcast_ss(a + k);
        const int64_t o = k * NR;
        c0 = _mm256_fmadd_ps(av, _mm256_loadu_ps(b0 + o), c0);
        c1 = _mm256_fmadd_ps(av, _mm256_loadu_ps(b0 + o + 8), c1);
        c2 = _mm256_fmadd_ps(av, _mm256_loadu_ps(b1 + o), c2);
        c3 = _mm256_fmadd_ps(av, _mm256_loadu_ps(b1 + o + 8), c3);
        c4 = _mm256_fmadd_ps(av, _mm256_loadu_ps(b2 + o), c4);
        c5 = _mm256_fmadd_ps(av, _mm256_loadu_ps(b2 + o + 8), c5);
        c6 = _mm256_fmadd_ps(av, _mm256_loadu_ps(b3 + o), c6);
        c7 = _mm256_fmadd_ps(av, _mm256_loadu_ps(b3 + o + 8), c7);
    }
    _mm256_storeu_ps(c, c0);
    _mm256_storeu_ps(c + 8, c1);
    _mm256_storeu_ps(c + 16, c2);
    _mm256_storeu_ps(c + 24, c3);
    _mm256_storeu_ps(c + 32, c4);
    _mm256_storeu_ps(c + 40, c5);
    _mm256_storeu_ps(c + 48, c6);
    _mm256_storeu_ps(c + 56, c7);
}
#else
void f32_tile(int mr, const float *a, int64_t lda, const float *b, int64_t K, float *c, const float *pf,
              int64_t pf_step) {
    (void)pf;
    (void)pf_step;
    memset(c, 0, sizeof(float) * (size_t)(mr * NR));
    for (int r = 0; r < mr; ++r)
        for (int64_t k = 0; k < K; ++k)
            for (int j = 0; j < NR; ++j) c[r * NR + j] += a[r * lda + k] * b[k * NR + j];
}

static void row_tile_multi(const float *a, const float *const *bs, int64_t K, float *c) {
    for (int g = 0; g < GP; ++g) f32_tile(1, a, K, bs[g], K, c + g * NR, bs[g], 0);
}
#endif

int64_t packed_weight_numel(int64_t N, int64_t K) { return (N + NR - 1) / NR * NR * K; }

void pack_weight_f32(const float *w, int64_t N, int64_t K, float *wp) {
    const int64_t np = (N + NR - 1) / NR;
    for (int64_t p = 0; p < np; ++p)
        for (int64_t k = 0; k < K; ++k)
            for (int64_t j = 0; j < NR; ++j) {
                const int64_t n = p * NR + j;
                wp[(p * K + k) * NR + j] = n < N ? w[n * K + k] : 0.f;
            }
}

/* One row's tile of panel p (columns n0 = p * NR ...) into yr: + bias, then stored, or added to yr with add. */
static void store_tile(float *cr, const float *bias, int64_t p, int64_t N, float *yr, int add) {
    const int64_t n0 = p * NR, ncols = N - n0 < NR ? N - n0 : NR;
    yr += n0;
    if (bias != NULL)
        for (int64_t j = 0; j < ncols; ++j) cr[j] = cr[j] + bias[n0 + j];
    if (add)
        for (int64_t j = 0; j < ncols; ++j) yr[j] = yr[j] + cr[j];
    else
        memcpy(yr, cr, sizeof(float) * (size_t)ncols);
}

/* Panels [p0, p1) of one row x[K]: GP at a time, one from each GP-th of the range (streams far apart read
 * faster than adjacent panels: tools/ab_kernels.py), the rest one by one. */
static void row_panels(const float *x, int64_t K, const float *wp, int64_t p0, int64_t p1, int64_t N,
                       const float *bias, float *y, int add) {
    float c[GP * NR];
    const int64_t q = (p1 - p0) / GP;
    for (int64_t i = 0; i < q; ++i) {
        const float *bs[GP];
        for (int g = 0; g < GP; ++g) bs[g] = wp + (p0 + g * q + i) * K * NR;
        row_tile_multi(x, bs, K, c);
        for (int g = 0; g < GP; ++g) store_tile(c + g * NR, bias, p0 + g * q + i, N, y, add);
    }
    for (int64_t p = p0 + GP * q; p < p1; ++p) {
        f32_tile(1, x, K, wp + p * K * NR, K, c, wp + p * K * NR, 0);
        store_tile(c, bias, p, N, y, add);
    }
}

/* The tiles of panel p for rows [m0, m1) of y[M, N] = x . W^T (+ bias); add: y += that instead (the residual
 * stream, y[m, n] = y[m, n] + (c + bias): the rounding of PyTorch's `x + linear(h)`). */
static void panel_rows(const float *x, int64_t m0, int64_t m1, int64_t K, const float *wp, int64_t np, int64_t p,
                       int64_t N, const float *bias, float *y, int add) {
    const float *w = wp + p * K * NR;
    const float *next = p + 1 < np ? wp + (p + 1) * K * NR : w;
    float c[MR * NR];
    for (int64_t m = m0; m < m1; m += MR) {
        const int mr = m1 - m < MR ? (int)(m1 - m) : MR;
        /* the first tile walks the panel once from memory: let it pull the next panel in too */
        f32_tile(mr, x + m * K, K, w, K, c, m == m0 ? next : w, m == m0 ? NR : 0);
        for (int r = 0; r < mr; ++r) store_tile(c + r * NR, bias, p, N, y + (m + r) * N, add);
    }
}

/* linear_f32's work shared over the calling team by orphaned `omp for` (serial outside a parallel region);
 * every thread of the team must call it. Ends on the team's barrier. */
void linear_f32_team(const float *x, int64_t M, int64_t K, const float *wp, int64_t N, const float *bias, float *y,
                     int add) {
    const int64_t np = (N + NR - 1) / NR;
    if (M == 1) {
        int64_t p0, p1;
        team_share(np, &p0, &p1);
        row_panels(x, K, wp, p0, p1, N, bias, y, add);
        team_barrier();
        return;
    }
    for (int64_t m0 = 0; m0 < M; m0 += MC) {
        const int64_t m1 = m0 + MC < M ? m0 + MC : M;
#pragma omp for schedule(static)
        for (int64_t p = 0; p < np; ++p) panel_rows(x, m0, m1, K, wp, np, p, N, bias, y, add);
    }
}

/* gate/up panel pair p's single-row tiles g, u (+ bias) -> silu(g) * u into h's columns p * NR ... */
static void gate_up_store(float *g, float *u, const float *bias, int64_t p, int64_t inter, float *h) {
    const int64_t n0 = p * NR;
    if (bias != NULL)
        for (int j = 0; j < NR; ++j) {
            g[j] = g[j] + bias[n0 + j];
            u[j] = u[j] + bias[inter + n0 + j];
        }
    silu_mul_row_f32(g, u, h + n0, NR);
}

/* One row: this thread's gate/up panel pairs, GP / 2 pairs (GP streams) at a time. */
static void gate_up_row(const float *x, int64_t K, const float *wp, int64_t inter, const float *bias, float *h) {
    const int64_t half = inter / NR;
    int64_t p0, p1;
    team_share(half, &p0, &p1);
    float c[GP * NR];
    int64_t p = p0;
    for (; p + GP / 2 <= p1; p += GP / 2) {
        const float *bs[GP];
        for (int g = 0; g < GP / 2; ++g) {
            bs[2 * g] = wp + (p + g) * K * NR;
            bs[2 * g + 1] = wp + (half + p + g) * K * NR;
        }
        row_tile_multi(x, bs, K, c);
        for (int g = 0; g < GP / 2; ++g) gate_up_store(c + 2 * g * NR, c + (2 * g + 1) * NR, bias, p + g, inter, h);
    }
    for (; p < p1; ++p) {
        const float *wg = wp + p * K * NR, *wu = wp + (half + p) * K * NR;
        f32_tile(1, x, K, wg, K, c, wg, 0);
        f32_tile(1, x, K, wu, K, c + NR, wu, 0);
        gate_up_store(c, c + NR, bias, p, inter, h);
    }
}

/* The packed gate/up projection ([gate | up], each `inter` wide, inter % NR == 0) with silu(gate) * up in the
 * epilogue: panel p of gate and panel p of up go to the same thread, h[M, inter] is written directly. Each
 * element rounds as linear_f32 then silu_mul_f32 do (silu_mul_row_f32 takes the same vector/scalar split). */
void gate_up_silu_f32_team(const float *x, int64_t M, int64_t K, const float *wp, int64_t inter, const float *bias,
                           float *h) {
    const int64_t half = inter / NR;
    if (M == 1) {
        gate_up_row(x, K, wp, inter, bias, h);
        team_barrier();
        return;
    }
    for (int64_t m0 = 0; m0 < M; m0 += MC) {
        const int64_t m1 = m0 + MC < M ? m0 + MC : M;
#pragma omp for schedule(static)
        for (int64_t p = 0; p < half; ++p) {
            const float *wg = wp + p * K * NR, *wu = wp + (half + p) * K * NR;
            const float *ng = p + 1 < half ? wg + K * NR : wg, *nu = p + 1 < half ? wu + K * NR : wu;
            float cg[MR * NR], cu[MR * NR];
            for (int64_t m = m0; m < m1; m += MR) {
                const int mr = m1 - m < MR ? (int)(m1 - m) : MR;
                f32_tile(mr, x + m * K, K, wg, K, cg, m == m0 ? ng : wg, m == m0 ? NR : 0);
                f32_tile(mr, x + m * K, K, wu, K, cu, m == m0 ? nu : wu, m == m0 ? NR : 0);
                for (int r = 0; r < mr; ++r) gate_up_store(cg + r * NR, cu + r * NR, bias, p, inter, h + (m + r) * inter);
            }
        }
    }
}

void linear_f32(const float *x, int64_t M, int64_t K, const float *wp, int64_t N, const float *bias, float *y,
                int nthreads) {
#pragma omp parallel num_threads(nthreads)
    linear_f32_team(x, M, K, wp, N, bias, y, 0);
}
