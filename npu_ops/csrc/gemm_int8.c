/* int8-weight linears for the CPU (npu_ops/quant.py holds the PyTorch reference they are tested against).
 *
 * W8A16: y[M, N] = (x[M, K] . Wq[N, K]^T) * w_scale[N] (+ bias), x fp32. Wq is packed like gemm.c's fp32
 *   panels (16 output columns, k-major: Wp[N/16][K][16]) but in int8: a quarter of the bytes to stream,
 *   widened to fp32 in registers and shared by every row of a tile.
 * W8A8: every row of x is quantized on the fly to int8 with its own scale (amax / 127, rounded to
 *   nearest even, as torch.round does), products accumulate in int32, and
 *   y = acc * x_scale[m] * w_scale[n] (+ bias). Wq is packed in panels of 8 columns by groups of 4 k:
 *   Wp[N/8][K4][8][4] (K padded to K4 * 4 with zeros), so that one 32-byte load holds 4 k of 8 columns.
 *
 * vpmaddubsw multiplies unsigned by signed bytes and adds pairs with int16 *saturation*: with plain
 * offsets (x + 128 up to 255) two products of 255 * 127 overflow int16. The sign trick avoids it:
 * maddubs(|x|, sign(w, x)) has the same products with |x| <= 127 (we clamp to [-127, 127]), so a pair
 * sums to at most 2 * 127 * 127 = 32258 < 32767. vpmaddwd against ones then widens pairs to int32.
 * Without AVX2 plain loops compute the same integers. Threads: the OpenMP runtime PyTorch loaded. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#ifdef __AVX2__
#include <immintrin.h>
#endif

#include "gemm_tile.h"

#define QNR F32_TILE_NR /* W8A16 panel width: gemm.c's, so that a widened panel runs its fp32 tile */
#define QMR F32_TILE_MR
#define QMC 96
#define ANR 8 /* W8A8 panel width */
#define AMR 4

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

#ifdef __AVX2__
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
static const qtile_fn QTILES[QMR + 1] = {0, qtile1, qtile2, qtile3, qtile4, qtile5, qtile6};
static void qtile(int mr, const float *a, int64_t lda, const int8_t *b, int64_t K, float *c) {
    QTILES[mr](a, lda, b, K, c);
}
#else
static void qtile(int mr, const float *a, int64_t lda, const int8_t *b, int64_t K, float *c) {
    memset(c, 0, sizeof(float) * (size_t)(mr * QNR));
    for (int r = 0; r < mr; ++r)
        for (int64_t k = 0; k < K; ++k)
            for (int j = 0; j < QNR; ++j) c[r * QNR + j] += a[r * lda + k] * (float)b[k * QNR + j];
}
#endif

void linear_w8a16_f32(const float *x, int64_t M, int64_t K, const int8_t *wp, const float *scale, int64_t N,
                      const float *bias, float *y, int nthreads) {
    const int64_t np = (N + QNR - 1) / QNR;
    /* More rows than one tile: widen each panel to fp32 once (it stays in L2) and run fp32 tiles over it. */
    const int widen = M > QMR;
    for (int64_t m0 = 0; m0 < M; m0 += QMC) {
        const int64_t m1 = m0 + QMC < M ? m0 + QMC : M;
#pragma omp parallel num_threads(nthreads)
        {
        float *buf = widen ? malloc(sizeof(float) * (size_t)(K * QNR)) : NULL;
#pragma omp for schedule(static)
        for (int64_t p = 0; p < np; ++p) {
            const int8_t *w = wp + p * K * QNR;
            const int64_t n0 = p * QNR, ncols = N - n0 < QNR ? N - n0 : QNR;
            float c[QMR * QNR];
            if (buf != NULL)
                for (int64_t i = 0; i < K * QNR; ++i) buf[i] = (float)w[i];
            for (int64_t m = m0; m < m1; m += QMR) {
                const int mr = m1 - m < QMR ? (int)(m1 - m) : QMR;
                if (buf != NULL)
                    f32_tile(mr, x + m * K, K, buf, K, c, buf, 0); /* gemm.c's tile; the panel is in L2 */
                else
                    qtile(mr, x + m * K, K, w, K, c);
                for (int r = 0; r < mr; ++r) {
                    float *yr = y + (m + r) * N + n0;
                    const float *cr = c + r * QNR;
                    for (int64_t j = 0; j < ncols; ++j)
                        yr[j] = cr[j] * scale[n0 + j] + (bias != NULL ? bias[n0 + j] : 0.f);
                }
            }
        }
        free(buf);
        }
    }
}

/* ------------------------------------------------------------------ W8A8 */
static inline int64_t k4_of(int64_t K) { return (K + 3) / 4; }

int64_t packed_w8a8_numel(int64_t N, int64_t K) { return (N + ANR - 1) / ANR * ANR * k4_of(K) * 4; }

void pack_w8a8(const int8_t *w, int64_t N, int64_t K, int8_t *wp) {
    const int64_t np = (N + ANR - 1) / ANR, K4 = k4_of(K);
    for (int64_t p = 0; p < np; ++p)
        for (int64_t q = 0; q < K4; ++q)
            for (int64_t j = 0; j < ANR; ++j)
                for (int64_t i = 0; i < 4; ++i) {
                    const int64_t n = p * ANR + j, k = q * 4 + i;
                    wp[((p * K4 + q) * ANR + j) * 4 + i] = (n < N && k < K) ? w[n * K + k] : 0;
                }
}

/* Per-row dynamic quantization: xq[m, 0:K4*4] (zero padded), xs[m] = amax / 127 (1 for a zero row).
 * Division, not multiplication by the reciprocal, so that the rounding matches the reference. */
void quantize_rows_i8(const float *x, int64_t M, int64_t K, int8_t *xq, float *xs, int nthreads) {
    const int64_t KP = k4_of(K) * 4;
    /* a decode step's few rows stay on the calling thread: waking the team costs more than the work */
#pragma omp parallel for num_threads(nthreads) if (M * K >= 65536) schedule(static)
    for (int64_t m = 0; m < M; ++m) {
        const float *xr = x + m * K;
        int8_t *qr = xq + m * KP;
        float amax = 0.f;
        for (int64_t k = 0; k < K; ++k) amax = fmaxf(amax, fabsf(xr[k]));
        const float s = amax > 0.f ? amax / 127.f : 1.f;
        xs[m] = s;
        int64_t k = 0;
#ifdef __AVX2__
        const __m256 sv = _mm256_set1_ps(s), lo = _mm256_set1_ps(-127.f), hi = _mm256_set1_ps(127.f);
        for (; k + 8 <= K; k += 8) {
            __m256 v = _mm256_min_ps(_mm256_max_ps(_mm256_div_ps(_mm256_loadu_ps(xr + k), sv), lo), hi);
            const __m256i i32 = _mm256_cvtps_epi32(v); /* round to nearest even (MXCSR default) */
            const __m128i i16 = _mm_packs_epi32(_mm256_castsi256_si128(i32), _mm256_extracti128_si256(i32, 1));
            _mm_storel_epi64((__m128i *)(qr + k), _mm_packs_epi16(i16, i16));
        }
#endif
        for (; k < K; ++k) {
            float v = nearbyintf(xr[k] / s);
            qr[k] = (int8_t)(v > 127.f ? 127.f : v < -127.f ? -127.f : v);
        }
        for (; k < KP; ++k) qr[k] = 0;
    }
}

/* acc[R][8] (int32) = xq rows . panel (4 k at a time) */
#ifdef __AVX2__
static inline __attribute__((always_inline)) void atile_r(const int R, const int8_t *restrict a, int64_t lda,
                                                          const int8_t *restrict b0p, const int8_t *restrict b1p,
                                                          int64_t K4, int32_t *restrict c0o, int32_t *restrict c1o) {
    __m256i c0[AMR], c1[AMR];
    const __m256i ones = _mm256_set1_epi16(1);
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) c0[r] = c1[r] = _mm256_setzero_si256();
    for (int64_t q = 0; q < K4; ++q) {
        const __m256i w0 = _mm256_loadu_si256((const __m256i *)(b0p + q * 32));
        const __m256i w1 = _mm256_loadu_si256((const __m256i *)(b1p + q * 32));
#pragma GCC unroll 4
        for (int r = 0; r < R; ++r) {
            int32_t quad;
            memcpy(&quad, a + r * lda + q * 4, 4);
            const __m256i xv = _mm256_set1_epi32(quad), ax = _mm256_abs_epi8(xv);
            /* sign(w, x): w negated where x < 0, zeroed where x == 0; |x| then carries no sign */
            const __m256i p0 = _mm256_maddubs_epi16(ax, _mm256_sign_epi8(w0, xv));
            const __m256i p1 = _mm256_maddubs_epi16(ax, _mm256_sign_epi8(w1, xv));
            c0[r] = _mm256_add_epi32(c0[r], _mm256_madd_epi16(p0, ones));
            c1[r] = _mm256_add_epi32(c1[r], _mm256_madd_epi16(p1, ones));
        }
    }
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) {
        _mm256_storeu_si256((__m256i *)(c0o + r * 16), c0[r]);
        _mm256_storeu_si256((__m256i *)(c1o + r * 16), c1[r]);
    }
}
#define ATILE(R)                                                                                                \
    static void atile##R(const int8_t *a, int64_t lda, const int8_t *b0, const int8_t *b1, int64_t K4,        \
                         int32_t *c0, int32_t *c1) {                                                            \
        atile_r(R, a, lda, b0, b1, K4, c0, c1);                                                                 \
    }
ATILE(1)
ATILE(2)
ATILE(3)
ATILE(4)
typedef void (*atile_fn)(const int8_t *, int64_t, const int8_t *, const int8_t *, int64_t, int32_t *, int32_t *);
static const atile_fn ATILES[AMR + 1] = {0, atile1, atile2, atile3, atile4};
#endif

/* Two panels (16 columns) at a time; c[r * 16 + j] for j < 8 from panel b0, j >= 8 from b1. */
static void atile(int mr, const int8_t *a, int64_t lda, const int8_t *b0, const int8_t *b1, int64_t K4, int32_t *c) {
#ifdef __AVX2__
    ATILES[mr](a, lda, b0, b1, K4, c, c + 8);
#else
    memset(c, 0, sizeof(int32_t) * (size_t)(mr * 16));
    for (int r = 0; r < mr; ++r)
        for (int64_t q = 0; q < K4; ++q)
            for (int j = 0; j < 16; ++j) {
                const int8_t *bp = (j < 8 ? b0 : b1) + q * 32 + (j % 8) * 4;
                for (int i = 0; i < 4; ++i) c[r * 16 + j] += (int32_t)a[r * lda + q * 4 + i] * (int32_t)bp[i];
            }
#endif
}

/* y = (xq . Wq^T) * xs[m] * ws[n] (+ bias): xq, xs from quantize_rows_i8. */
void linear_w8a8_i8(const int8_t *xq, const float *xs, int64_t M, int64_t K, const int8_t *wp, const float *ws,
                    int64_t N, const float *bias, float *y, int nthreads) {
    const int64_t K4 = k4_of(K), lda = K4 * 4, np = (N + ANR - 1) / ANR, npair = (np + 1) / 2;
    const int8_t *zero = NULL;
    int8_t *zbuf = NULL;
    if (np % 2) { /* an odd last panel pairs with zeros */
        zbuf = calloc((size_t)(K4 * 32), 1);
        if (zbuf == NULL) return;
        zero = zbuf;
    }
    for (int64_t m0 = 0; m0 < M; m0 += QMC) {
        const int64_t m1 = m0 + QMC < M ? m0 + QMC : M;
#pragma omp parallel for num_threads(nthreads) schedule(static)
        for (int64_t pp = 0; pp < npair; ++pp) {
            const int64_t p0 = 2 * pp, n0 = p0 * ANR, ncols = N - n0 < 16 ? N - n0 : 16;
            const int8_t *b0 = wp + p0 * K4 * 32, *b1 = p0 + 1 < np ? b0 + K4 * 32 : zero;
            int32_t c[AMR * 16];
            for (int64_t m = m0; m < m1; m += AMR) {
                const int mr = m1 - m < AMR ? (int)(m1 - m) : AMR;
                atile(mr, xq + m * lda, lda, b0, b1, K4, c);
                for (int r = 0; r < mr; ++r) {
                    float *yr = y + (m + r) * N + n0;
                    const float sx = xs[m + r];
                    for (int64_t j = 0; j < ncols; ++j)
                        yr[j] = (float)c[r * 16 + j] * sx * ws[n0 + j] + (bias != NULL ? bias[n0 + j] : 0.f);
                }
            }
        }
    }
    free(zbuf);
}

/* Raw int32 GEMM of already quantized rows (tests hold it to the exact integers at the +-127 extremes). */
void gemm_i8_i32(const int8_t *xq, int64_t M, int64_t K, const int8_t *wp, int64_t N, int32_t *acc) {
    const int64_t K4 = k4_of(K), lda = K4 * 4, np = (N + ANR - 1) / ANR;
    int8_t *zbuf = calloc((size_t)(K4 * 32), 1);
    if (zbuf == NULL) return;
    for (int64_t p0 = 0; p0 < np; p0 += 2) {
        const int8_t *b0 = wp + p0 * K4 * 32, *b1 = p0 + 1 < np ? b0 + K4 * 32 : zbuf;
        const int64_t n0 = p0 * ANR, ncols = N - n0 < 16 ? N - n0 : 16;
        int32_t c[AMR * 16];
        for (int64_t m = 0; m < M; m += AMR) {
            const int mr = M - m < AMR ? (int)(M - m) : AMR;
            atile(mr, xq + m * lda, lda, b0, b1, K4, c);
            for (int r = 0; r < mr; ++r)
                for (int64_t j = 0; j < ncols; ++j) acc[(m + r) * N + n0 + j] = c[r * 16 + j];
        }
    }
    free(zbuf);
}

/* fp32 rows in, fp32 out: quantize_rows_i8 into scratch of its own, then linear_w8a8_i8 (one call from
 * Python per linear instead of two, and no int8 tensors allocated by the caller). Returns 0, or 3 when
 * the scratch cannot be had. */
int linear_w8a8_f32(const float *x, int64_t M, int64_t K, const int8_t *wp, const float *ws, int64_t N,
                    const float *bias, float *y, int nthreads) {
    int8_t *xq = malloc((size_t)(M * k4_of(K) * 4));
    float *xs = malloc(sizeof(float) * (size_t)M);
    if (xq == NULL || xs == NULL) {
        free(xq);
        free(xs);
        return 3;
    }
    quantize_rows_i8(x, M, K, xq, xs, nthreads);
    linear_w8a8_i8(xq, xs, M, K, wp, ws, N, bias, y, nthreads);
    free(xq);
    free(xs);
    return 0;
}
