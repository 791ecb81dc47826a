/* The W8A8 integer tiles (gemm_w8a8.c: the layout, the batched and whole-row kernels; gemm_w8a8_row.c: one row
 * by a team) and their epilogue: one source for both files, so both round alike. */
#ifndef MINDIE_GEMM_W8A8_TILE_H
#define MINDIE_GEMM_W8A8_TILE_H
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <omp.h>

#include "stream_ahead.h"

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
static inline void atile(int mr, const int8_t *a, int64_t lda, const int8_t *b0, const int8_t *b1, int64_t K4, int32_t *c) {
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

/* One row against G <= GQ panel pairs in lockstep (2 * G streams from memory: a one-stream decode step is
 * bandwidth-bound, and one pair a thread left memory idle part of the time): c[g * TW + j] as atile's c for
 * pair g. Integer sums: the same values whatever the order. Each stream asks for its lines STREAM_AHEAD bytes ahead
 * (stream_ahead.h); over its last STREAM_AHEAD bytes it asks for the first ones of the next round's streams nbp
 * (2 * nG of them, NULL: none): their starts are not where the hardware prefetchers would look. */
#define GQ 4
#if W8A8_VNNI
#define ROW_Q_BYTES 64 /* a panel's bytes a step of k */
#define ROW_STEP(q)                                                                                                   \
    do {                                                                                                              \
        int32_t quad;                                                                                                 \
        memcpy(&quad, a + (q) * 4, 4);                                                                                \
        const __m512i xv = _mm512_set1_epi32(quad);                                                                  \
        _Pragma("GCC unroll 8") for (int i = 0; i < 2 * G; ++i) acc[i] =                                              \
            _mm512_dpbusd_epi32(acc[i], xv, _mm512_loadu_si512(bp[i] + (q) * 64));                                   \
    } while (0)
#define ROW_ACC __m512i acc[2 * GQ]
#define ROW_ZERO(i) acc[i] = _mm512_setzero_si512()
#define ROW_STORE(i) _mm512_storeu_si512(c + (i) * ANR, acc[i])
#elif defined(__AVX2__)
#define ROW_Q_BYTES 32
#define ROW_STEP(q)                                                                                                   \
    do {                                                                                                              \
        int32_t quad;                                                                                                 \
        memcpy(&quad, a + (q) * 4, 4);                                                                                \
        const __m256i xv = _mm256_set1_epi32(quad), ax = _mm256_abs_epi8(xv);                                       \
        _Pragma("GCC unroll 8") for (int i = 0; i < 2 * G; ++i) {                                                     \
            const __m256i w = _mm256_loadu_si256((const __m256i *)(bp[i] + (q) * 32));                               \
            acc[i] = _mm256_add_epi32(acc[i], _mm256_madd_epi16(_mm256_maddubs_epi16(ax, _mm256_sign_epi8(w, xv)),  \
                                                                 _mm256_set1_epi16(1)));                             \
        }                                                                                                             \
    } while (0)
#define ROW_ACC __m256i acc[2 * GQ]
#define ROW_ZERO(i) acc[i] = _mm256_setzero_si256()
#define ROW_STORE(i) _mm256_storeu_si256((__m256i *)(c + (i) * ANR), acc[i])
#endif

#ifdef ROW_STEP
static inline __attribute__((always_inline)) void arow_g(const int G, const int8_t *restrict a,
                                                         const int8_t *const *bp, const int8_t *const *nbp, int nG,
                                                         int64_t K4, int32_t *restrict c) {
    ROW_ACC;
#pragma GCC unroll 8
    for (int i = 0; i < 2 * G; ++i) ROW_ZERO(i);
    /* a line a stream every 64 / ROW_Q_BYTES steps */
    const int64_t every = 64 / ROW_Q_BYTES, ahead = STREAM_AHEAD / ROW_Q_BYTES, split = K4 > ahead ? K4 - ahead : 0;
    int64_t q = 0;
    for (; q < split; ++q) {
        if (q % every == 0)
#pragma GCC unroll 8
            for (int i = 0; i < 2 * G; ++i) stream_ahead(bp[i] + q * ROW_Q_BYTES);
        ROW_STEP(q);
    }
    for (; q < K4; ++q) {
        if (nbp != NULL && (q - split) % every == 0)
            for (int i = 0; i < 2 * nG; ++i) stream_at(nbp[i] + (q - split) * ROW_Q_BYTES);
        ROW_STEP(q);
    }
#pragma GCC unroll 8
    for (int i = 0; i < 2 * G; ++i) ROW_STORE(i);
}
#define AROW(G_)                                                                                                     \
    static void arow_##G_(const int8_t *a, const int8_t *const *bp, const int8_t *const *nbp, int nG, int64_t K4,    \
                          int32_t *c) {                                                                               \
        arow_g(G_, a, bp, nbp, nG, K4, c);                                                                           \
    }
AROW(1)
AROW(2)
AROW(3)
AROW(4)
typedef void (*arow_fn)(const int8_t *, const int8_t *const *, const int8_t *const *, int, int64_t, int32_t *);
static const arow_fn AROWS[GQ + 1] = {NULL, arow_1, arow_2, arow_3, arow_4};

static inline void arow_multi(int G, const int8_t *a, const int8_t *const *bp, const int8_t *const *nbp, int nG,
                              int64_t K4, int32_t *c) {
    AROWS[G](a, bp, nbp, nG, K4, c);
}
#else
static inline void arow_multi(int G, const int8_t *a, const int8_t *const *bp, const int8_t *const *nbp, int nG,
                              int64_t K4, int32_t *c) {
    (void)nbp, (void)nG;
    for (int g = 0; g < G; ++g) atile(1, a, K4 * 4, bp[2 * g], bp[2 * g + 1], K4, c + g * TW);
}
#endif

/* A thread's n panel pairs as W <= GQ streams, each a run of consecutive pairs, far apart (gemm.c's row_panels), in
 * R = ceil(n / GQ) rounds: W = ceil(n / R), so that every round has W streams or, the last, a few fewer (9 pairs:
 * 3 rounds of 3, not 4 + 4 + 1). Round i takes pair row_pair(n, g, i) of each stream g < row_streams(n, i). */
static inline int64_t row_rounds(int64_t n) { return (n + GQ - 1) / GQ; }
static inline int64_t row_width(int64_t n) { return n > 0 ? (n + row_rounds(n) - 1) / row_rounds(n) : 0; }
/* the streams R pairs long (the rest are R - 1) */
static inline int64_t row_full(int64_t n) { return n - row_width(n) * (row_rounds(n) - 1); }
static inline int row_streams(int64_t n, int64_t i) {
    return (int)(i < row_rounds(n) - 1 ? row_width(n) : row_full(n));
}
static inline int64_t row_pair(int64_t n, int g, int64_t i) {
    const int64_t e = row_full(n);
    return g * (row_rounds(n) - 1) + (g < e ? g : e) + i;
}

/* y[r, 0:ncols] = (c[r] - comp) * xs[r] * ws (+ bias): the reference's float ops in its order; with add,
 * y += that (the residual stream: PyTorch's `x + linear(h)` rounds the same). */
static inline void epilogue(const int32_t *c, int mr, const float *xs, const int32_t *comp, const float *ws,
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

#endif
