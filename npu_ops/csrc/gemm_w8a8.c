/* W8A8 linears for the CPU (npu_ops/quant.py holds the PyTorch reference they are tested against).
 *
 * Every row of x is quantized on the fly to int8 with its own scale (amax / 127, rounded to nearest even,
 * as torch.round does), products accumulate in int32 and y = acc * x_scale[m] * w_scale[n] (+ bias).
 * Wq is packed in panels of ANR columns by groups of 4 k: Wp[N/ANR][K4][ANR][4] (K padded to K4 * 4 with
 * zeros), followed by one int32 per padded column: 128 * sum_k Wq[n, k] (the offset correction below).
 * The layout is this build's: pack and kernels come from the same library.
 *
 * Two integer cores, picked at build time:
 * - AVX512-VNNI (vpdpbusd: u8 x s8, four products summed into int32 with no int16 step): activations are
 *   stored offset, u = x + 128 in [1, 255], so the instruction takes them as they are;
 *   sum_k u * w = sum_k x * w + 128 * sum_k w, and the packed column sums take the second term back out
 *   exactly. Panels of 16 columns (one zmm), a tile of up to 8 rows x 32 columns in 16 accumulators.
 * - AVX2 (no VNNI): vpmaddubsw multiplies unsigned by signed bytes and adds pairs with int16 *saturation*,
 *   so offsets overflow (2 * 255 * 127 > 32767). The sign trick avoids it: maddubs(|x|, sign(w, x)) has the
 *   same products with |x| <= 127 (x is clamped to [-127, 127]), a pair sums to at most 32258;
 *   vpmaddwd against ones widens pairs to int32. Panels of 8 columns, tiles of 4 rows x 16 columns.
 * Without AVX2 plain loops compute the same integers. Threads: the OpenMP runtime PyTorch loaded. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <omp.h>

#include "layers_f32.h"
#include "quantize_rows.h"
#include "team_sync.h"

#ifdef __AVX2__
#include <immintrin.h>
#endif

#if defined(__AVX512VNNI__) && defined(__AVX512BW__) && defined(__AVX512F__)
#define W8A8_VNNI 1
#define ANR 16
#define AMR 8
#else
#define W8A8_VNNI 0
#define ANR 8
#define AMR 4
#endif
#define TW (2 * ANR) /* a tile's columns: two panels */
#define MC 96

static inline int64_t k4_of(int64_t K) { return (K + 3) / 4; }
static inline int64_t npanels(int64_t N) { return (N + ANR - 1) / ANR; }

int64_t packed_w8a8_numel(int64_t N, int64_t K) { return npanels(N) * ANR * (k4_of(K) * 4 + 4); }

int w8a8_panel_width(void) { return ANR; }

void pack_w8a8(const int8_t *w, int64_t N, int64_t K, int8_t *wp) {
    const int64_t np = npanels(N), K4 = k4_of(K);
    int32_t *comp = (int32_t *)(wp + np * ANR * K4 * 4);
    for (int64_t p = 0; p < np; ++p)
        for (int64_t q = 0; q < K4; ++q)
            for (int64_t j = 0; j < ANR; ++j)
                for (int64_t i = 0; i < 4; ++i) {
                    const int64_t n = p * ANR + j, k = q * 4 + i;
                    wp[((p * K4 + q) * ANR + j) * 4 + i] = (n < N && k < K) ? w[n * K + k] : 0;
                }
    for (int64_t n = 0; n < np * ANR; ++n) {
        int32_t s = 0;
        for (int64_t k = 0; n < N && k < K; ++k) s += w[n * K + k];
        comp[n] = 128 * s;
    }
}

/* c[R][TW] (int32) = rows a (lda bytes apart, in this core's activation format) . panels b0, b1 */
#if W8A8_VNNI
static inline __attribute__((always_inline)) void atile_r(const int R, const int8_t *restrict a, int64_t lda,
                                                          const int8_t *restrict b0p, const int8_t *restrict b1p,
                                                          int64_t K4, int32_t *restrict c) {
    __m512i c0[AMR], c1[AMR];
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) c0[r] = c1[r] = _mm512_setzero_si512();
    for (int64_t q = 0; q < K4; ++q) {
        const __m512i w0 = _mm512_loadu_si512(b0p + q * 64), w1 = _mm512_loadu_si512(b1p + q * 64);
#pragma GCC unroll 8
        for (int r = 0; r < R; ++r) {
            int32_t quad;
            memcpy(&quad, a + r * lda + q * 4, 4);
            const __m512i xv = _mm512_set1_epi32(quad); /* 4 unsigned (offset) bytes of row r */
            c0[r] = _mm512_dpbusd_epi32(c0[r], xv, w0);
            c1[r] = _mm512_dpbusd_epi32(c1[r], xv, w1);
        }
    }
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
        _mm512_storeu_si512(c + r * TW, c0[r]);
        _mm512_storeu_si512(c + r * TW + 16, c1[r]);
    }
}
#elif defined(__AVX2__)
static inline __attribute__((always_inline)) void atile_r(const int R, const int8_t *restrict a, int64_t lda,
                                                          const int8_t *restrict b0p, const int8_t *restrict b1p,
                                                          int64_t K4, int32_t *restrict c) {
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
        _mm256_storeu_si256((__m256i *)(c + r * TW), c0[r]);
        _mm256_storeu_si256((__m256i *)(c + r * TW + 8), c1[r]);
    }
}
#endif

#ifdef __AVX2__
#define ATILE(R)                                                                                          \
    static void atile##R(const int8_t *a, int64_t lda, const int8_t *b0, const int8_t *b1, int64_t K4,  \
                         int32_t *c) {                                                                    \
        atile_r(R, a, lda, b0, b1, K4, c);                                                                \
    }
ATILE(1)
ATILE(2)
ATILE(3)
ATILE(4)
#if AMR > 4
ATILE(5)
ATILE(6)
ATILE(7)
ATILE(8)
#endif
typedef void (*atile_fn)(const int8_t *, int64_t, const int8_t *, const int8_t *, int64_t, int32_t *);
#if AMR > 4
static const atile_fn ATILES[AMR + 1] = {0, atile1, atile2, atile3, atile4, atile5, atile6, atile7, atile8};
#else
static const atile_fn ATILES[AMR + 1] = {0, atile1, atile2, atile3, atile4};
#endif
#endif

/* c[r * TW + j]: j < ANR from panel b0, j >= ANR from b1; rows in this core's activation format. */
static void atile(int mr, const int8_t *a, int64_t lda, const int8_t *b0, const int8_t *b1, int64_t K4, int32_t *c) {
#ifdef __AVX2__
    ATILES[mr](a, lda, b0, b1, K4, c);
#else
    memset(c, 0, sizeof(int32_t) * (size_t)(mr * TW));
    for (int r = 0; r < mr; ++r)
        for (int64_t q = 0; q < K4; ++q)
            for (int j = 0; j < TW; ++j) {
                const int8_t *bp = (j < ANR ? b0 : b1) + (q * ANR + j % ANR) * 4;
                for (int i = 0; i < 4; ++i) c[r * TW + j] += (int32_t)a[r * lda + q * 4 + i] * (int32_t)bp[i];
            }
#endif
}

/* One row against GQ panel pairs in lockstep (2 * GQ streams from memory: a one-stream decode step is
 * bandwidth-bound, and one pair a thread left memory idle part of the time): c[g * TW + j] as atile's c for
 * pair g. Integer sums: the same values whatever the order. */
#define GQ 4
#if W8A8_VNNI
static void arow_multi(const int8_t *restrict a, const int8_t *const *bp, int64_t K4, int32_t *restrict c) {
    __m512i acc[2 * GQ];
#pragma GCC unroll 8
    for (int i = 0; i < 2 * GQ; ++i) acc[i] = _mm512_setzero_si512();
    for (int64_t q = 0; q < K4; ++q) {
        int32_t quad;
        memcpy(&quad, a + q * 4, 4);
        const __m512i xv = _mm512_set1_epi32(quad);
#pragma GCC unroll 8
        for (int i = 0; i < 2 * GQ; ++i) acc[i] = _mm512_dpbusd_epi32(acc[i], xv, _mm512_loadu_si512(bp[i] + q * 64));
    }
#pragma GCC unroll 8
    for (int i = 0; i < 2 * GQ; ++i) _mm512_storeu_si512(c + i * ANR, acc[i]);
}
#elif defined(__AVX2__)
static void arow_multi(const int8_t *restrict a, const int8_t *const *bp, int64_t K4, int32_t *restrict c) {
    __m256i acc[2 * GQ];
    const __m256i ones = _mm256_set1_epi16(1);
#pragma GCC unroll 8
    for (int i = 0; i < 2 * GQ; ++i) acc[i] = _mm256_setzero_si256();
    for (int64_t q = 0; q < K4; ++q) {
        int32_t quad;
        memcpy(&quad, a + q * 4, 4);
        const __m256i xv = _mm256_set1_epi32(quad), ax = _mm256_abs_epi8(xv);
#pragma GCC unroll 8
        for (int i = 0; i < 2 * GQ; ++i) {
            const __m256i w = _mm256_loadu_si256((const __m256i *)(bp[i] + q * 32));
            acc[i] = _mm256_add_epi32(acc[i], _mm256_madd_epi16(_mm256_maddubs_epi16(ax, _mm256_sign_epi8(w, xv)), ones));
        }
    }
#pragma GCC unroll 8
    for (int i = 0; i < 2 * GQ; ++i) _mm256_storeu_si256((__m256i *)(c + i * ANR), acc[i]);
}
#else
static void arow_multi(const int8_t *a, const int8_t *const *bp, int64_t K4, int32_t *c) {
    for (int g = 0; g < GQ; ++g) atile(1, a, K4 * 4, bp[2 * g], bp[2 * g + 1], K4, c + g * TW);
}
#endif

/* y[r, 0:ncols] = (c[r] - comp) * xs[r] * ws (+ bias): the reference's float ops in its order; with add,
 * y += that (the residual stream: PyTorch's `x + linear(h)` rounds the same). */
static void epilogue(const int32_t *c, int mr, const float *xs, const int32_t *comp, const float *ws,
                     const float *bias, float *y, int64_t ldy, int64_t ncols, int add) {
    for (int r = 0; r < mr; ++r) {
        float *yr = y + r * ldy;
        const int32_t *cr = c + r * TW;
        int64_t j = 0;
#if W8A8_VNNI
        const __m512 sx = _mm512_set1_ps(xs[r]);
        for (; j < ncols; j += 16) {
            const __mmask16 mk = ncols - j >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (ncols - j)) - 1);
            const __m512i acc = _mm512_sub_epi32(_mm512_loadu_si512(cr + j), _mm512_loadu_si512(comp + j));
            __m512 v = _mm512_mul_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(acc), sx), _mm512_maskz_loadu_ps(mk, ws + j));
            if (bias != NULL) v = _mm512_add_ps(v, _mm512_maskz_loadu_ps(mk, bias + j));
            if (add) v = _mm512_add_ps(_mm512_maskz_loadu_ps(mk, yr + j), v);
            _mm512_mask_storeu_ps(yr + j, mk, v);
        }
#endif
        for (; j < ncols; ++j) {
            const float v = (float)(cr[j] - (comp != NULL ? comp[j] : 0)) * xs[r] * ws[j] + (bias != NULL ? bias[j] : 0.f);
            yr[j] = add ? yr[j] + v : v;
        }
    }
}

/* pair pp's single-row tile c scaled into y */
static void pair_store(const int32_t *c, int64_t pp, int64_t N, const float *xs, const int32_t *comp, const float *ws,
                       const float *bias, float *y, int add) {
    const int64_t n0 = 2 * pp * ANR, ncols = N - n0 < TW ? N - n0 : TW;
    epilogue(c, 1, xs, comp != NULL ? comp + n0 : NULL, ws + n0, bias != NULL ? bias + n0 : NULL, y + n0, N, ncols,
             add);
}

/* One row: this thread's share of the panel pairs (split by hand, balanced to one pair), GQ pairs at a time. */
static void w8a8_row(const int8_t *xr, const float *xs, int64_t K, const int8_t *wp, const float *ws, int64_t N,
                     const float *bias, float *y, const int8_t *zero, int add) {
    const int64_t K4 = k4_of(K), np = npanels(N), npair = (np + 1) / 2, psz = K4 * ANR * 4;
    const int32_t *comp = W8A8_VNNI ? (const int32_t *)(wp + np * psz) : NULL;
    int64_t q0, q1;
    team_share(npair, &q0, &q1);
    int32_t c[GQ * TW];
    /* GQ pairs at a time, one from each GQ-th of the share (streams far apart: gemm.c's row_panels); a last
     * pair with an odd panel (zero for its second) goes with the rest, one by one */
    const int64_t whole = q1 == npair && np % 2 ? q1 - 1 : q1, q = whole > q0 ? (whole - q0) / GQ : 0;
    for (int64_t i = 0; i < q; ++i) {
        const int8_t *bp[2 * GQ];
        for (int g = 0; g < GQ; ++g) bp[2 * g] = wp + 2 * (q0 + g * q + i) * psz, bp[2 * g + 1] = bp[2 * g] + psz;
        arow_multi(xr, bp, K4, c);
        for (int g = 0; g < GQ; ++g) pair_store(c + g * TW, q0 + g * q + i, N, xs, comp, ws, bias, y, add);
    }
    for (int64_t pp = q0 + GQ * q; pp < q1; ++pp) {
        const int8_t *b0 = wp + 2 * pp * psz, *b1 = 2 * pp + 1 < np ? b0 + psz : zero;
        atile(1, xr, K4 * 4, b0, b1, K4, c);
        pair_store(c, pp, N, xs, comp, ws, bias, y, add);
    }
}

/* y = rows . Wq^T, scaled: xr rows (lda = K4 * 4 bytes) already in this core's activation format. Called by
 * every thread of a team (orphaned `omp for`); ends on the team's barrier. */
static void w8a8_rows_team(const int8_t *xr, const float *xs, int64_t M, int64_t K, const int8_t *wp,
                           const float *ws, int64_t N, const float *bias, float *y, const int8_t *zero, int add) {
    const int64_t K4 = k4_of(K), lda = K4 * 4, np = npanels(N), npair = (np + 1) / 2;
    const int32_t *comp = W8A8_VNNI ? (const int32_t *)(wp + np * ANR * K4 * 4) : NULL;
    if (M == 1) {
        w8a8_row(xr, xs, K, wp, ws, N, bias, y, zero, add);
        team_barrier();
        return;
    }
    for (int64_t m0 = 0; m0 < M; m0 += MC) {
        const int64_t m1 = m0 + MC < M ? m0 + MC : M;
#pragma omp for schedule(static)
        for (int64_t pp = 0; pp < npair; ++pp) {
            const int64_t p0 = 2 * pp, n0 = p0 * ANR, ncols = N - n0 < TW ? N - n0 : TW;
            const int8_t *b0 = wp + p0 * K4 * ANR * 4, *b1 = p0 + 1 < np ? b0 + K4 * ANR * 4 : zero;
            int32_t c[AMR * TW];
            for (int64_t m = m0; m < m1; m += AMR) {
                const int mr = m1 - m < AMR ? (int)(m1 - m) : AMR;
                atile(mr, xr + m * lda, lda, b0, b1, K4, c);
                epilogue(c, mr, xs + m, comp != NULL ? comp + n0 : NULL, ws + n0, bias != NULL ? bias + n0 : NULL,
                         y + m * N + n0, N, ncols, add);
            }
        }
    }
}

static void w8a8_rows(const int8_t *xr, const float *xs, int64_t M, int64_t K, const int8_t *wp, const float *ws,
                      int64_t N, const float *bias, float *y, int nthreads, const int8_t *zero) {
#pragma omp parallel num_threads(nthreads)
    w8a8_rows_team(xr, xs, M, K, wp, ws, N, bias, y, zero, 0);
}

/* The fused layers' W8A8 linear (layers_f32.c), by every thread of a team: x's rows quantized into xq
 * (k4 * 4 bytes a row) and xs, then the tiles; zero: w8a8_zero_bytes(K) zero bytes; add: y += the result.
 * Same math as linear_w8a8_f32. One row (a one-stream decode step) is quantized by every thread into the
 * xq / xs it was given, which must then be its own: no barrier between quantizing and the tiles. */
void linear_w8a8_f32_team(const float *x, int64_t M, int64_t K, const int8_t *wp, const float *ws, int64_t N,
                          const float *bias, float *y, int8_t *xq, float *xs, const int8_t *zero, int add) {
    const int64_t KP = k4_of(K) * 4;
    const int8_t flip = W8A8_VNNI ? (int8_t)0x80 : 0;
    if (M == 1) {
        quantize_row_i8(x, K, k4_of(K) * 4, xq, xs, flip);
    } else {
#pragma omp for schedule(static)
        for (int64_t m = 0; m < M; ++m) quantize_row_i8(x + m * K, K, KP, xq + m * KP, xs + m, flip);
    }
    w8a8_rows_team(xq, xs, M, K, wp, ws, N, bias, y, zero, add);
}

int64_t w8a8_zero_bytes(int64_t K) { return k4_of(K) * ANR * 4; }

/* An odd last panel pairs with zeros: the scratch for it (NULL when N's panels pair up or none is had). */
static int8_t *zero_panel(int64_t N, int64_t K, int *failed) {
    if (npanels(N) % 2 == 0) return NULL;
    int8_t *z = calloc((size_t)(k4_of(K) * ANR * 4), 1);
    *failed = z == NULL;
    return z;
}

/* Rows quantized by quantize_rows_i8 (signed) into this core's format: a copy with offset bytes (VNNI), else
 * the rows as they are (*owned stays NULL). */
static const int8_t *core_rows(const int8_t *xq, int64_t M, int64_t K, int8_t **owned) {
    *owned = NULL;
    if (!W8A8_VNNI) return xq;
    const int64_t n = M * k4_of(K) * 4;
    *owned = malloc((size_t)n);
    if (*owned == NULL) return NULL;
    for (int64_t i = 0; i < n; ++i) (*owned)[i] = (int8_t)(xq[i] ^ (int8_t)0x80);
    return *owned;
}

/* y = (xq . Wq^T) * xs[m] * ws[n] (+ bias): xq, xs from quantize_rows_i8. Returns 0, or 3 without scratch. */
int linear_w8a8_i8(const int8_t *xq, const float *xs, int64_t M, int64_t K, const int8_t *wp, const float *ws,
                   int64_t N, const float *bias, float *y, int nthreads) {
    int failed = 0;
    int8_t *zero = zero_panel(N, K, &failed), *owned;
    const int8_t *rows = core_rows(xq, M, K, &owned);
    if (!failed && rows != NULL) w8a8_rows(rows, xs, M, K, wp, ws, N, bias, y, nthreads, zero);
    free(zero);
    free(owned);
    return failed || rows == NULL ? 3 : 0;
}

/* Raw int32 GEMM of already quantized rows (tests hold it to the exact integers at the +-127 extremes):
 * the same tiles with unit scales. */
int gemm_i8_i32(const int8_t *xq, int64_t M, int64_t K, const int8_t *wp, int64_t N, int32_t *acc) {
    const int64_t K4 = k4_of(K), np = npanels(N);
    const int32_t *comp = W8A8_VNNI ? (const int32_t *)(wp + np * ANR * K4 * 4) : NULL;
    int failed = 0;
    int8_t *zero = zero_panel(N, K, &failed), *owned;
    const int8_t *rows = core_rows(xq, M, K, &owned);
    for (int64_t p0 = 0; !failed && rows != NULL && p0 < np; p0 += 2) {
        const int8_t *b0 = wp + p0 * K4 * ANR * 4, *b1 = p0 + 1 < np ? b0 + K4 * ANR * 4 : zero;
        const int64_t n0 = p0 * ANR, ncols = N - n0 < TW ? N - n0 : TW;
        int32_t c[AMR * TW];
        for (int64_t m = 0; m < M; m += AMR) {
            const int mr = M - m < AMR ? (int)(M - m) : AMR;
            atile(mr, rows + m * K4 * 4, K4 * 4, b0, b1, K4, c);
            for (int r = 0; r < mr; ++r)
                for (int64_t j = 0; j < ncols; ++j)
                    acc[(m + r) * N + n0 + j] = c[r * TW + j] - (comp != NULL ? comp[n0 + j] : 0);
        }
    }
    free(zero);
    free(owned);
    return failed || rows == NULL ? 3 : 0;
}

/* fp32 rows in, fp32 out: the rows quantized straight into this core's format in scratch of its own, then
 * the tiles (one call from Python per linear, no int8 tensors allocated by the caller). Returns 0, or 3 when
 * the scratch cannot be had. */
int linear_w8a8_f32(const float *x, int64_t M, int64_t K, const int8_t *wp, const float *ws, int64_t N,
                    const float *bias, float *y, int nthreads) {
    int failed = 0;
    int8_t *xq = malloc((size_t)(M * k4_of(K) * 4)), *zero = zero_panel(N, K, &failed);
    float *xs = malloc(sizeof(float) * (size_t)M);
    if (xq != NULL && xs != NULL && !failed) {
        quantize_rows_offset(x, M, K, k4_of(K) * 4, xq, xs, nthreads, W8A8_VNNI);
        w8a8_rows(xq, xs, M, K, wp, ws, N, bias, y, nthreads, zero);
    }
    const int rc = xq == NULL || xs == NULL || failed ? 3 : 0;
    free(xq);
    free(xs);
    free(zero);
    return rc;
}
