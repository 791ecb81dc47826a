/* int8-weight linears for the CPU, W8A16 (W8A8 is in gemm_w8a8.c; npu_ops/quant.py holds the PyTorch
 * reference both are tested against).
 *
 * W8A16: y[M, N] = (x[M, K] . Wq[N, K]^T) * w_scale[N] (+ bias), x fp32. Wq is packed like gemm.c's fp32
 *   panels (16 output columns, k-major: Wp[N/16][K][16]) but in int8: a quarter of the bytes to stream,
 *   widened to fp32 in registers and shared by every row of a tile: with AVX-512 tiles of up to 12 rows x 16
 *   columns (one zmm) at any M; with AVX2 tiles of 6 x 16 for a few rows, and for more rows each panel widened
 *   to fp32 once and run through gemm.c's tile.
 * Threads: the OpenMP runtime PyTorch loaded. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <omp.h>

#ifdef __AVX2__
#include <immintrin.h>
#endif

#include "gemm.h"
#include "gemm_int8.h"
#include "gemm_tile.h"
#include "kernels.h"
#include "team_sync.h"

#define QNR F32_TILE_NR /* W8A16 panel width: gemm.c's, so that a widened panel runs its fp32 tile */
#define QMR F32_TILE_MR
#define QMC 96

/* ------------------------------------------------------------------ W8A16 */
int64_t packed_w8a16_numel(int64_t N, int64_t K) { return (N + QNR - 1) / QNR * QNR * K; }

void pack_w8a16(const int8_t *w, int64_t N, int64_t K, int8_t *wp) {
    const int64_t np = (N + QNR - 1) / QNR;
    for (int64_t p = 0; p < np; ++p)
        for (int64_t k = 0; k < K; ++k)
            for (int64_t j = 0; j < QNR; ++j) {
                const int64_t n = p * QNR + j;
                wp[(p * K + k) * QNR + j] = n < N ? w[n * K + k] : 0;
            }
}

#if defined(__AVX512F__)
/* AVX-512: one zmm holds a whole panel row (16 columns); up to 12 rows share each widened weight vector, and
 * even and odd k accumulate apart (two chains: a row or two still keep both FMA pipes busy). No widened copy
 * of the panel is needed at any M. */
#define TMR 12
static inline __attribute__((always_inline)) void qtile_r(const int R, const float *restrict a, int64_t lda,
                                                          const int8_t *restrict b, int64_t K, float *restrict c) {
    __m512 c0[TMR], c1[TMR];
#pragma GCC unroll 12
    for (int r = 0; r < R; ++r) c0[r] = c1[r] = _mm512_setzero_ps();
    int64_t k = 0;
    for (; k + 2 <= K; k += 2) {
        const __m512 b0 = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(b + k * QNR))));
        const __m512 b1 =
            _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(b + (k + 1) * QNR))));
#pragma GCC unroll 12
        for (int r = 0; r < R; ++r) {
            c0[r] = _mm512_fmadd_ps(_mm512_set1_ps(a[r * lda + k]), b0, c0[r]);
            c1[r] = _mm512_fmadd_ps(_mm512_set1_ps(a[r * lda + k + 1]), b1, c1[r]);
        }
    }
    if (k < K) {
        const __m512 b0 = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(b + k * QNR))));
#pragma GCC unroll 12
        for (int r = 0; r < R; ++r) c0[r] = _mm512_fmadd_ps(_mm512_set1_ps(a[r * lda + k]), b0, c0[r]);
    }
#pragma GCC unroll 12
    for (int r = 0; r < R; ++r) _mm512_storeu_ps(c + r * QNR, _mm512_add_ps(c0[r], c1[r]));
}
#elif defined(__AVX2__)
#define TMR QMR
static inline __attribute__((always_inline)) void qtile_r(const int R, const float *restrict a, int64_t lda,
                                                          const int8_t *restrict b, int64_t K, float *restrict c) {
    __m256 c0[QMR], c1[QMR];
#pragma GCC unroll 6
    for (int r = 0; r < R; ++r) c0[r] = c1[r] = _mm256_setzero_ps();
    for (int64_t k = 0; k < K; ++k) {
        const __m128i w16 = _mm_loadu_si128((const __m128i *)(b + k * QNR));
        const __m256 b0 = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(w16));
        const __m256 b1 = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(w16, 8)));
#pragma GCC unroll 6
        for (int r = 0; r < R; ++r) {
            const __m256 av = _mm256_broadcast_ss(a + r * lda + k);
            c0[r] = _mm256_fmadd_ps(av, b0, c0[r]);
            c1[r] = _mm256_fmadd_ps(av, b1, c1[r]);
        }
        if ((k & 3) == 0) __builtin_prefetch(b + (k + 32) * QNR, 0, 1);
    }
#pragma GCC unroll 6
    for (int r = 0; r < R; ++r) {
        _mm256_storeu_ps(c + r * QNR, c0[r]);
        _mm256_storeu_ps(c + r * QNR + 8, c1[r]);
    }
}
#endif

#ifdef __AVX2__
#define QTILE(R)                                                                                  \
    static void qtile##R(const float *a, int64_t lda, const int8_t *b, int64_t K, float *c) {     \
        qtile_r(R, a, lda, b, K, c);                                                              \
    }
QTILE(1)
QTILE(2)
QTILE(3)
QTILE(4)
QTILE(5)
QTILE(6)
typedef void (*qtile_fn)(const float *, int64_t, const int8_t *, int64_t, float *);
#if TMR > 6
QTILE(7)
QTILE(8)
QTILE(9)
QTILE(10)
QTILE(11)
QTILE(12)
static const qtile_fn QTILES[TMR + 1] = {0,      qtile1, qtile2, qtile3,  qtile4,  qtile5, qtile6,
                                         qtile7, qtile8, qtile9, qtile10, qtile11, qtile12};
#else
static const qtile_fn QTILES[TMR + 1] = {0, qtile1, qtile2, qtile3, qtile4, qtile5, qtile6};
#endif
static void qtile(int mr, const float *a, int64_t lda, const int8_t *b, int64_t K, float *c) {
    QTILES[mr](a, lda, b, K, c);
}
#else
#define TMR QMR
static void qtile(int mr, const float *a, int64_t lda, const int8_t *b, int64_t K, float *c) {
    memset(c, 0, sizeof(float) * (size_t)(mr * QNR));
    for (int r = 0; r < mr; ++r)
        for (int64_t k = 0; k < K; ++k)
            for (int j = 0; j < QNR; ++j) c[r * QNR + j] += a[r * lda + k] * (float)b[k * QNR + j];
}
#endif

/* One row against QG panels in lockstep: QG streams from memory (a one-stream decode step is bandwidth-bound;
 * one panel a thread left memory idle part of the time). Each column accumulates as qtile's single row does
 * (AVX-512: even and odd k apart, added at the end), so the result is bit-identical to it. */
#define QG 4
#if defined(__AVX512F__)
static void qrow_multi(const float *restrict a, const int8_t *const *bp, int64_t K, float *restrict c) {
    __m512 e[QG], o[QG];
#pragma GCC unroll 4
    for (int g = 0; g < QG; ++g) e[g] = o[g] = _mm512_setzero_ps();
    int64_t k = 0;
    for (; k + 2 <= K; k += 2) {
        const __m512 a0 = _mm512_set1_ps(a[k]), a1 = _mm512_set1_ps(a[k + 1]);
#pragma GCC unroll 4
        for (int g = 0; g < QG; ++g) {
            const int8_t *b = bp[g] + k * QNR;
            e[g] = _mm512_fmadd_ps(a0, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)b))), e[g]);
            o[g] = _mm512_fmadd_ps(a1, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(b + QNR)))),
                                   o[g]);
        }
    }
    if (k < K) {
        const __m512 a0 = _mm512_set1_ps(a[k]);
#pragma GCC unroll 4
        for (int g = 0; g < QG; ++g)
            e[g] = _mm512_fmadd_ps(
                a0, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(bp[g] + k * QNR)))), e[g]);
    }
#pragma GCC unroll 4
    for (int g = 0; g < QG; ++g) _mm512_storeu_ps(c + g * QNR, _mm512_add_ps(e[g], o[g]));
}
#elif defined(__AVX2__)
static void qrow_multi(const float *restrict a, const int8_t *const *bp, int64_t K, float *restrict c) {
    __m256 lo[QG], hi[QG];
#pragma GCC unroll 4
    for (int g = 0; g < QG; ++g) lo[g] = hi[g] = _mm256_setzero_ps();
    for (int64_t k = 0; k < K; ++k) {
        const __m256 av = _mm256_broadcast_ss(a + k);
#pragma GCC unroll 4
        for (int g = 0; g < QG; ++g) {
            const __m128i w16 = _mm_loadu_si128((const __m128i *)(bp[g] + k * QNR));
            lo[g] = _mm256_fmadd_ps(av, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(w16)), lo[g]);
            hi[g] = _mm256_fmadd_ps(av, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(w16, 8))), hi[g]);
        }
    }
#pragma GCC unroll 4
    for (int g = 0; g < QG; ++g) {
        _mm256_storeu_ps(c + g * QNR, lo[g]);
        _mm256_storeu_ps(c + g * QNR + 8, hi[g]);
    }
}
#else
static void qrow_multi(const float *a, const int8_t *const *bp, int64_t K, float *c) {
    for (int g = 0; g < QG; ++g) qtile(1, a, K, bp[g], K, c + g * QNR);
}
#endif

/* c's row (panel p's columns) scaled into y (+ bias); add: y += that (PyTorch's `x + linear(h)` rounding) */
static void w8a16_store(const float *cr, int64_t p, int64_t N, const float *scale, const float *bias, float *yr,
                        int add) {
    const int64_t n0 = p * QNR, ncols = N - n0 < QNR ? N - n0 : QNR;
    for (int64_t j = 0; j < ncols; ++j) {
        const float v = cr[j] * scale[n0 + j] + (bias != NULL ? bias[n0 + j] : 0.f);
        yr[n0 + j] = add ? yr[n0 + j] + v : v;
    }
}

/* One row: this thread's share of the panels (split by hand, balanced to one panel), QG at a time, one from
 * each QG-th of the share (streams far apart: gemm.c's row_panels). */
static void w8a16_row(const float *x, int64_t K, const int8_t *wp, const float *scale, int64_t N, const float *bias,
                      float *y, int add) {
    int64_t p0, p1;
    team_share((N + QNR - 1) / QNR, &p0, &p1);
    float c[QG * QNR];
    const int64_t q = (p1 - p0) / QG;
    for (int64_t i = 0; i < q; ++i) {
        const int8_t *bp[QG];
        for (int g = 0; g < QG; ++g) bp[g] = wp + (p0 + g * q + i) * K * QNR;
        qrow_multi(x, bp, K, c);
        for (int g = 0; g < QG; ++g) w8a16_store(c + g * QNR, p0 + g * q + i, N, scale, bias, y, add);
    }
    for (int64_t p = p0 + QG * q; p < p1; ++p) {
        qtile(1, x, K, wp + p * K * QNR, K, c);
        w8a16_store(c, p, N, scale, bias, y, add);
    }
}

/* By every thread of a team (orphaned `omp for`): the fused layers' W8A16 linear (layers_f32.c) and the body
 * of linear_w8a16_f32 (add: y += the result). Ends on the team's barrier. */
void linear_w8a16_f32_team(const float *x, int64_t M, int64_t K, const int8_t *wp, const float *scale, int64_t N,
                           const float *bias, float *y, int add) {
    const int64_t np = (N + QNR - 1) / QNR;
    if (M == 1) {
        w8a16_row(x, K, wp, scale, N, bias, y, add);
        team_barrier();
        return;
    }
    /* Without AVX-512, more rows than one tile: widen each panel to fp32 once (it stays in L2) and run
     * gemm.c's fp32 tiles over it; AVX-512's tiles widen in registers at any M. */
    const int widen = TMR == QMR && M > QMR;
    float *buf = widen ? malloc(sizeof(float) * (size_t)(K * QNR)) : NULL;
    for (int64_t m0 = 0; m0 < M; m0 += QMC) {
        const int64_t m1 = m0 + QMC < M ? m0 + QMC : M;
#pragma omp for schedule(static)
        for (int64_t p = 0; p < np; ++p) {
            const int8_t *w = wp + p * K * QNR;
            float c[TMR * QNR];
            if (buf != NULL)
                for (int64_t i = 0; i < K * QNR; ++i) buf[i] = (float)w[i];
            for (int64_t m = m0; m < m1; m += (buf != NULL ? QMR : TMR)) {
                const int tmr = buf != NULL ? QMR : TMR, mr = m1 - m < tmr ? (int)(m1 - m) : tmr;
                if (buf != NULL)
                    f32_tile(mr, x + m * K, K, buf, K, c, buf, 0); /* gemm.c's tile; the panel is in L2 */
                else
                    qtile(mr, x + m * K, K, w, K, c);
                for (int r = 0; r < mr; ++r) w8a16_store(c + r * QNR, p, N, scale, bias, y + (m + r) * N, add);
            }
        }
    }
    free(buf);
}

void linear_w8a16_f32(const float *x, int64_t M, int64_t K, const int8_t *wp, const float *scale, int64_t N,
                      const float *bias, float *y, int nthreads) {
#pragma omp parallel num_threads(nthreads)
    linear_w8a16_f32_team(x, M, K, wp, scale, N, bias, y, 0);
}
