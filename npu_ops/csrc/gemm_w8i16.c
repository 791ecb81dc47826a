/* W8I16: the int8 LM head's linear (npu_ops/quant.py's w8i16_ref is its reference, bit for bit).
 *
 * y[M, N] = (sum over chunks of (xq . Wq^T) in int32, each chunk converted to fp32 and added in order)
 *           * (x_scale[m] * w_scale[n]) (+ bias)
 * xq: each row quantized to int16 with its own scale (amax / 16383, quantize_rows.c); Wq int8 per output channel.
 * Why not W8A16's fp32 activations: widening every weight to fp32 costs three vector ops for 16 weights, which
 * made the 49,152 x 576 head of SmolLM2 compute-bound at one stream (1 ms a token against 0.7 ms to read it);
 * vpmaddwd multiplies 32 int8-widened weights by int16 activation pairs in one op (vpdpwssd with VNNI also adds).
 * 14-bit activations keep the head's error the int8 weights' (the activation step is 1/16383 of the row's amax
 * against 1/127 of a weight row's). A chunk is 1,024 k: 1,024 products of |x| <= 16383 and |w| <= 127 stay
 * under 2^31.
 * Wq is packed in panels of 16 columns by pairs of k: Wp[N/16][K2][16][2] (K padded to K2 * 2 with zeros),
 * so that one 32-byte load widens to the 16 columns' pairs for one broadcast activation pair.
 * Threads: the OpenMP runtime PyTorch loaded. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <omp.h>

#ifdef __AVX2__
#include <immintrin.h>
#endif

#include "gemm_w8i16.h"
#include "kernels.h"
#include "quantize_rows.h"
#include "team_sync.h"

#define HNR 16  /* panel width */
#define HCH 512 /* k pairs a chunk */
#define HG 4    /* panels a lone row streams at once */
#define HMR 4   /* rows a tile */

static inline int64_t k2_of(int64_t K) { return (K + 1) / 2; }
static inline int64_t hpanels(int64_t N) { return (N + HNR - 1) / HNR; }

int64_t packed_w8i16_numel(int64_t N, int64_t K) { return hpanels(N) * HNR * k2_of(K) * 2; }

void pack_w8i16(const int8_t *w, int64_t N, int64_t K, int8_t *wp) {
    const int64_t np = hpanels(N), K2 = k2_of(K);
    for (int64_t p = 0; p < np; ++p)
        for (int64_t q = 0; q < K2; ++q)
            for (int64_t j = 0; j < HNR; ++j)
                for (int64_t e = 0; e < 2; ++e) {
                    const int64_t n = p * HNR + j, k = 2 * q + e;
                    wp[((p * K2 + q) * HNR + j) * 2 + e] = (n < N && k < K) ? w[n * K + k] : 0;
                }
}

/* c[R][16] (fp32) = R rows of pairs a (lda int16 apart) . panels: with ``one`` every row reads panel b[0] (a
 * batch's tile; the widened weights are shared), else row r reads b[r] (a lone row, lda 0, over R panels in
 * lockstep: R streams from memory). The chunk sums are exact integers, so both round alike. */
#if defined(__AVX512F__) && defined(__AVX512BW__)
#if defined(__AVX512VNNI__)
#define DPW(acc, w, x) _mm512_dpwssd_epi32(acc, w, x)
#else
#define DPW(acc, w, x) _mm512_add_epi32(acc, _mm512_madd_epi16(w, x))
#endif
static inline __attribute__((always_inline)) void htile_r(const int R, const int one, const int16_t *restrict a,
                                                          int64_t lda, const int8_t *const *b, int64_t K2,
                                                          float *restrict c) {
    __m512 f[HMR];
    for (int r = 0; r < R; ++r) f[r] = _mm512_setzero_ps();
    for (int64_t q0 = 0; q0 < K2; q0 += HCH) {
        const int64_t q1 = q0 + HCH < K2 ? q0 + HCH : K2;
        __m512i s[HMR];
        for (int r = 0; r < R; ++r) s[r] = _mm512_setzero_si512();
        for (int64_t q = q0; q < q1; ++q) {
            const __m512i w0 = _mm512_cvtepi8_epi16(_mm256_loadu_si256((const __m256i *)(b[0] + q * 32)));
            for (int r = 0; r < R; ++r) {
                int32_t pair;
                memcpy(&pair, a + r * lda + 2 * q, 4);
                const __m512i w =
                    one || r == 0 ? w0 : _mm512_cvtepi8_epi16(_mm256_loadu_si256((const __m256i *)(b[r] + q * 32)));
                s[r] = DPW(s[r], w, _mm512_set1_epi32(pair));
            }
        }
        for (int r = 0; r < R; ++r) f[r] = _mm512_add_ps(f[r], _mm512_cvtepi32_ps(s[r]));
    }
    for (int r = 0; r < R; ++r) _mm512_storeu_ps(c + r * HNR, f[r]);
}
#elif defined(__AVX2__)
static inline __attribute__((always_inline)) void htile_r(const int R, const int one, const int16_t *restrict a,
                                                          int64_t lda, const int8_t *const *b, int64_t K2,
                                                          float *restrict c) {
    __m256 f0[HMR], f1[HMR];
    for (int r = 0; r < R; ++r) f0[r] = f1[r] = _mm256_setzero_ps();
    for (int64_t q0 = 0; q0 < K2; q0 += HCH) {
        const int64_t q1 = q0 + HCH < K2 ? q0 + HCH : K2;
        __m256i s0[HMR], s1[HMR];
        for (int r = 0; r < R; ++r) s0[r] = s1[r] = _mm256_setzero_si256();
        for (int64_t q = q0; q < q1; ++q) {
            const __m256i w00 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(b[0] + q * 32)));
            const __m256i w01 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(b[0] + q * 32 + 16)));
            for (int r = 0; r < R; ++r) {
                int32_t pair;
                memcpy(&pair, a + r * lda + 2 * q, 4);
                const __m256i x = _mm256_set1_epi32(pair);
                const int8_t *w = b[r] + q * 32;
                const __m256i w0 = one || r == 0 ? w00 : _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)w));
                const __m256i w1 = one || r == 0 ? w01 : _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(w + 16)));
                s0[r] = _mm256_add_epi32(s0[r], _mm256_madd_epi16(w0, x));
                s1[r] = _mm256_add_epi32(s1[r], _mm256_madd_epi16(w1, x));
            }
        }
        for (int r = 0; r < R; ++r) {
            f0[r] = _mm256_add_ps(f0[r], _mm256_cvtepi32_ps(s0[r]));
            f1[r] = _mm256_add_ps(f1[r], _mm256_cvtepi32_ps(s1[r]));
        }
    }
    for (int r = 0; r < R; ++r) {
        _mm256_storeu_ps(c + r * HNR, f0[r]);
        _mm256_storeu_ps(c + r * HNR + 8, f1[r]);
    }
}
#else
static void htile_r(const int R, const int one, const int16_t *a, int64_t lda, const int8_t *const *b, int64_t K2,
                    float *c) {
    (void)one; /* the caller fills b[r] for every row either way */
    for (int r = 0; r < R; ++r)
        for (int j = 0; j < HNR; ++j) {
            float f = 0.f;
            for (int64_t q0 = 0; q0 < K2; q0 += HCH) {
                int32_t s = 0;
                for (int64_t q = q0; q < q0 + HCH && q < K2; ++q)
                    s += (int32_t)a[r * lda + 2 * q] * b[r][q * 32 + 2 * j] +
                         (int32_t)a[r * lda + 2 * q + 1] * b[r][q * 32 + 2 * j + 1];
                f += (float)s;
            }
            c[r * HNR + j] = f;
        }
}
#endif

#define HTILE(R)                                                                                              \
    static void htile##R(const int16_t *a, int64_t lda, const int8_t *const *b, int64_t K2, float *c) {     \
        htile_r(R, 1, a, lda, b, K2, c);                                                                      \
    }
HTILE(1)
HTILE(2)
HTILE(3)
HTILE(4)
typedef void (*htile_fn)(const int16_t *, int64_t, const int8_t *const *, int64_t, float *);
static const htile_fn HTILES[5] = {0, htile1, htile2, htile3, htile4};

static void hrow_multi(const int16_t *a, const int8_t *const *b, int64_t K2, float *c) {
    htile_r(HG, 0, a, 0, b, K2, c);
}

/* c's rows (panel p's columns) scaled into y (+ bias) */
static void w8i16_store(const float *c, int mr, const float *xs, int64_t p, int64_t N, const float *ws,
                        const float *bias, float *y) {
    const int64_t n0 = p * HNR, ncols = N - n0 < HNR ? N - n0 : HNR;
    for (int r = 0; r < mr; ++r)
        for (int64_t j = 0; j < ncols; ++j) {
            const float v = c[r * HNR + j] * (xs[r] * ws[n0 + j]);
            y[r * N + n0 + j] = bias != NULL ? v + bias[n0 + j] : v;
        }
}

/* One row: this thread's share of the panels, HG at a time (HG streams from memory), the rest one by one. */
static void w8i16_row(const int16_t *xq, const float *xs, int64_t K2, const int8_t *wp, const float *ws, int64_t N,
                      const float *bias, float *y) {
    int64_t p0, p1;
    team_share(hpanels(N), &p0, &p1);
    float c[HG * HNR];
    /* HG streams far apart, one in each HG-th of the share: adjacent panels (9 KiB apart) read 1.19-1.25x
     * slower from memory here (tools/ab_kernels.py-style paired runs, 400 pairs) */
    const int64_t q = (p1 - p0) / HG;
    for (int64_t i = 0; i < q; ++i) {
        const int8_t *bp[HG];
        for (int g = 0; g < HG; ++g) bp[g] = wp + (p0 + g * q + i) * K2 * 32;
        hrow_multi(xq, bp, K2, c);
        for (int g = 0; g < HG; ++g) w8i16_store(c + g * HNR, 1, xs, p0 + g * q + i, N, ws, bias, y);
    }
    for (int64_t p = p0 + HG * q; p < p1; ++p) {
        const int8_t *bp[1] = {wp + p * K2 * 32};
        htile1(xq, 0, bp, K2, c);
        w8i16_store(c, 1, xs, p, N, ws, bias, y);
    }
}

/* By every thread of a team (orphaned `omp for`): rows xq (int16, K2 * 2 a row) with scales xs, already
 * quantized (quantize_row_i16), into y: linear_w8i16_f32's body. */
static void w8i16_rows_team(const int16_t *xq, const float *xs, int64_t M, int64_t K, const int8_t *wp, const float *ws,
                     int64_t N, const float *bias, float *y) {
    const int64_t K2 = k2_of(K), np = hpanels(N);
    if (M == 1) {
        w8i16_row(xq, xs, K2, wp, ws, N, bias, y);
        team_barrier();
        return;
    }
#pragma omp for schedule(static)
    for (int64_t p = 0; p < np; ++p) {
        const int8_t *bp[HMR];
        float c[HMR * HNR];
        for (int i = 0; i < HMR; ++i) bp[i] = wp + p * K2 * 32;
        for (int64_t m = 0; m < M; m += HMR) {
            const int mr = M - m < HMR ? (int)(M - m) : HMR;
            HTILES[mr](xq + m * K2 * 2, K2 * 2, bp, K2, c);
            w8i16_store(c, mr, xs + m, p, N, ws, bias, y + m * N);
        }
    }
}

int linear_w8i16_f32(const float *x, int64_t M, int64_t K, const int8_t *wp, const float *ws, int64_t N,
                     const float *bias, float *y, int nthreads) {
    const int64_t KP = k2_of(K) * 2;
    int16_t *xq = malloc(sizeof(int16_t) * (size_t)(M * KP));
    float *xs = malloc(sizeof(float) * (size_t)M);
    if (xq == NULL || xs == NULL) {
        free(xq);
        free(xs);
        return 3;
    }
    for (int64_t m = 0; m < M; ++m) quantize_row_i16(x + m * K, K, KP, xq + m * KP, xs + m);
#pragma omp parallel num_threads(nthreads)
    w8i16_rows_team(xq, xs, M, K, wp, ws, N, bias, y);
    free(xq);
    free(xs);
    return 0;
}
