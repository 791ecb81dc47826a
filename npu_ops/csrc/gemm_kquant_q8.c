/* GGUF K-quant linears against int8 activations (a decode step at any row count; a prefill under int8-all): each
 * activation row is quantized per 256 columns to int8 with an fp32 scale (llama.cpp's Q8_K: d = max|x| / 127,
 * q = round-half-even(x * (1 / d))), and each super-block's products are exact integer sums (maddubs of the unsigned
 * quants against the int8 row, madd by the sub-block scales, the mins / Q6_K's -32 through the row's sums per 16),
 * reduced to exact int32 a super-block (S; Q4_K / Q5_K also the mins' M) before fp32: acc += (d d_x) S, acc_m +=
 * (dmin d_x) M, y = acc - acc_m: gemm_kquant_q8_lanes.c's order, so its batches of 4+ rows give each row these bits.
 * Several rows of x (below 4: the lanes kernel takes more): each super-block unpacked once for up to KMR rows,
 * over chunks of x rows that stay in L2 (1.4x fp32 at 16 rows, 1.2x at 32, 0.9x at 64, 0.77x at 512 on one core
 * of this machine, tools/bench_gguf_kernels.py --gemv; a row's operations, so its bits, the same whatever the tile).
 * The last 1-3 rows (one to three streams' decode step) take kquant_q8_wide.h's passes, 4 W rows at a time (one core,
 * weights in cache: 1.35-1.5x the 1-row pass; the same bits).
 * quant_gguf_kquant.matmul_q8_ref is the reference (the quantized rows, dequantized, times gguf's W): the kernel
 * differs from it only in the order of fp32 operations.
 * Threads: the OpenMP runtime's team, each a contiguous share of W's rows (team_share); called inside a team
 * (quant_gguf's kernel contract: a segment of gguf_linear.c's), the calling thread alone. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <omp.h>

#include "gemm_kquant.h"
#include "gemm_kquant_q8.h"
#include "gguf_xq.h"
#include "kquant_block.h"
#include "vec_math.h"
#include "kernels.h"
#include "team_sync.h"

#define QK 256
static const int64_t BLOCK_BYTES[3] = {144, 176, 210};

/* x[k] -> xq[k] int8, xd[k / 256] fp32 scales, bs[k / 16] int16 sums of each 16 quants. */
void gguf_q8k_quantize_row(const float *x, int64_t k, int8_t *xq, float *xd, int16_t *bs) {
    for (int64_t b = 0; b < k / QK; ++b) {
        const float *xb = x + b * QK;
        float amax = 0.0f;
        for (int e = 0; e < QK; ++e) amax = fabsf(xb[e]) > amax ? fabsf(xb[e]) : amax;
        const float d = amax / 127.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
        xd[b] = d;
        for (int g = 0; g < QK / 16; ++g) {
            int sum = 0;
            for (int e = 16 * g; e < 16 * g + 16; ++e) {
                float r = nearbyintf(xb[e] * id);
                r = r > 127.0f ? 127.0f : r < -127.0f ? -127.0f : r;
                xq[b * QK + e] = (int8_t)r;
                sum += (int)r;
            }
            bs[b * (QK / 16) + g] = (int16_t)sum;
        }
    }
}

#if defined(__AVX2__) && defined(__F16C__)
#include <immintrin.h>

#include "kquant_q8_wide.h"

#define KMR 4 /* rows of x a pass shares each super-block's unpacked quants with */

/* Q4_K / Q5_K super-block . mr quantized row blocks (row r's at xq + r * k, its scale xd[r * nb], its sums of 16
 * at bs + r * nb * 16), into each row's accumulators: acc[r] += (d * xd) * sum_s sc[s] q.x8, acc_m[r] +=
 * (dmin * xd) * sum_s m[s] bsum_s, each sum an exact int32 (|sum| < 2^25: its float rounds once, as the lanes'
 * kernel's). The quants are unpacked once for the mr rows; each row's
 * operations are the same whatever mr, so are its bits. */
static inline __attribute__((always_inline)) void dot_q45k(const int five, const int mr, const uint8_t *b,
                                                           const int8_t *xq, int64_t k, const float *xd, int64_t nb,
                                                           const int16_t *bs, __m128 *acc) {
    const __m128i sm = kq_scales_mins_v(b);
    const __m256i sc = _mm256_broadcastsi128_si256(_mm_cvtepu8_epi16(sm));
    const uint8_t *qs = b + (five ? 48 : 16);
    const __m256i nib = _mm256_set1_epi8(0xF), one = _mm256_set1_epi8(1);
    const __m256i hbits = five ? _mm256_loadu_si256((const __m256i *)(b + 16)) : _mm256_setzero_si256();
    __m256i sumi[KMR];
    for (int r = 0; r < mr; ++r) sumi[r] = _mm256_setzero_si256();
#pragma GCC unroll 4
    for (int j = 0; j < 4; ++j) {
        const __m256i q4 = _mm256_loadu_si256((const __m256i *)(qs + 32 * j));
        __m256i lo = _mm256_and_si256(q4, nib), hi = _mm256_and_si256(_mm256_srli_epi16(q4, 4), nib);
        if (five) {
            lo = _mm256_or_si256(lo, _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hbits, 2 * j), one), 4));
            hi = _mm256_or_si256(hi, _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hbits, 2 * j + 1), one), 4));
        }
        const __m256i s_lo = _mm256_shuffle_epi8(sc, PICK16(2 * j)), s_hi = _mm256_shuffle_epi8(sc, PICK16(2 * j + 1));
        for (int r = 0; r < mr; ++r) {
            const int8_t *x = xq + r * k + 64 * j;
            const __m256i pl = _mm256_maddubs_epi16(lo, _mm256_loadu_si256((const __m256i *)x));
            const __m256i ph = _mm256_maddubs_epi16(hi, _mm256_loadu_si256((const __m256i *)(x + 32)));
            sumi[r] = dot_s16(sumi[r], s_lo, pl);
            sumi[r] = dot_s16(sumi[r], s_hi, ph);
        }
    }
    /* the mins against each row's sums of 32 (pairs of its sums of 16), 8 int16 products summed in pairs */
    const __m128i m16 = _mm_cvtepu8_epi16(_mm_unpackhi_epi64(sm, sm));
    uint32_t dd;
    memcpy(&dd, b, 4);
    const __m128 dm = _mm_cvtph_ps(_mm_cvtsi32_si128((int)dd)); /* d, dmin */
    for (int r = 0; r < mr; ++r) {
        const int16_t *s = bs + r * nb * 16;
        const __m128i pairs = _mm_hadd_epi16(_mm_loadu_si128((const __m128i *)s),
                                             _mm_loadu_si128((const __m128i *)(s + 8)));
        const __m128i mins = _mm_madd_epi16(m16, pairs);
        /* the super-block's exact sums S (lane 0) and M (lane 1), then fp32 in gemm_kquant_q8_lanes.c's order (the
         * same bits): acc += (d d_x) S, acc_m += (dmin d_x) M */
        const __m128i h = _mm_add_epi32(_mm256_castsi256_si128(sumi[r]), _mm256_extracti128_si256(sumi[r], 1));
        const __m128i sm2 = _mm_hadd_epi32(_mm_hadd_epi32(h, mins), _mm_setzero_si128());
        acc[r] = _mm_fmadd_ps(_mm_mul_ps(dm, _mm_set1_ps(xd[r * nb])), _mm_cvtepi32_ps(sm2), acc[r]);
    }
}

/* Q6_K super-block . mr quantized row blocks (as dot_q45k): acc[r] += (d * xd) * (sum_g sc[g] q6.x8 - 32 sum_g
 * sc[g] bsum_g) */
static inline __attribute__((always_inline)) void dot_q6k(const int mr, const uint8_t *b, const int8_t *xq,
                                                          int64_t k, const float *xd, int64_t nb, const int16_t *bs,
                                                          __m128 *acc) {
    const int8_t *sc = (const int8_t *)(b + 192);
    const __m256i nib = _mm256_set1_epi8(0xF), two = _mm256_set1_epi8(0x30);
    const __m256i sc16 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)sc));
    __m256i sumi[KMR];
    for (int r = 0; r < mr; ++r)
        sumi[r] = _mm256_sub_epi32(_mm256_setzero_si256(), _mm256_slli_epi32(
            _mm256_madd_epi16(sc16, _mm256_loadu_si256((const __m256i *)(bs + r * nb * 16))), 5));
#pragma GCC unroll 2
    for (int h = 0; h < 2; ++h) {
        const __m256i a = _mm256_loadu_si256((const __m256i *)(b + 64 * h));
        const __m256i c = _mm256_loadu_si256((const __m256i *)(b + 64 * h + 32));
        const __m256i q = _mm256_loadu_si256((const __m256i *)(b + 128 + 32 * h));
        const __m256i lows[4] = {_mm256_and_si256(a, nib), _mm256_and_si256(c, nib),
                                 _mm256_and_si256(_mm256_srli_epi16(a, 4), nib),
                                 _mm256_and_si256(_mm256_srli_epi16(c, 4), nib)};
        const __m256i highs[4] = {_mm256_slli_epi16(q, 4), _mm256_slli_epi16(q, 2), q, _mm256_srli_epi16(q, 2)};
#pragma GCC unroll 4
        for (int i = 0; i < 4; ++i) {
            const __m256i q6 = _mm256_or_si256(lows[i], _mm256_and_si256(highs[i], two));
            const int g = 8 * h + 2 * i;
            const __m256i scl = _mm256_set_m128i(_mm_set1_epi16(sc[g + 1]), _mm_set1_epi16(sc[g]));
            for (int r = 0; r < mr; ++r) {
                const __m256i xv = _mm256_loadu_si256((const __m256i *)(xq + r * k + 128 * h + 32 * i));
                sumi[r] = dot_s16(sumi[r], scl, _mm256_maddubs_epi16(q6, xv));
            }
        }
    }
    const float d = f16_to_f32(b + 208);
    for (int r = 0; r < mr; ++r) { /* the super-block's exact sum, then fp32 in the lanes kernel's order (lane 0) */
        __m128i h = _mm_add_epi32(_mm256_castsi256_si128(sumi[r]), _mm256_extracti128_si256(sumi[r], 1));
        h = _mm_add_epi32(h, _mm_shuffle_epi32(h, 0x4e));
        h = _mm_add_epi32(h, _mm_shuffle_epi32(h, 0xb1));
        acc[r] = _mm_fmadd_ss(_mm_set_ss(d * xd[r * nb]), _mm_cvtepi32_ps(h), acc[r]);
    }
}

/* One W row (nb super-blocks of `type`) . mr quantized rows of x (row r at xq + r * k) -> y[r * ldy] */
static inline __attribute__((always_inline)) void rows_dot(const int type, const int mr, const uint8_t *row,
                                                           int64_t nb, int64_t bb, const int8_t *xq, int64_t k,
                                                           const float *xd, const int16_t *bs, float *y,
                                                           int64_t ldy) {
    __m128 acc[KMR]; /* lanes: acc, acc_m (the mins; Q6_K: 0) */
    for (int r = 0; r < mr; ++r) acc[r] = _mm_setzero_ps();
    for (int64_t i = 0; i < nb; ++i) {
        /* every line of the super-block 8 on (one ask a super-block left 1-2 of its 3-4 lines to the hardware
         * prefetchers: Q6_K 1.6x, Q4_K 1.2x a core from memory with all asked; 16 on did no better) */
        for (int64_t o = 0; o < bb; o += 64) __builtin_prefetch(row + (i + 8) * bb + o, 0, 0);
        if (type == GGUF_KQ_Q6_K)
            dot_q6k(mr, row + i * bb, xq + i * QK, k, xd + i, nb, bs + i * 16, acc);
        else
            dot_q45k(type == GGUF_KQ_Q5_K, mr, row + i * bb, xq + i * QK, k, xd + i, nb, bs + i * 16, acc);
    }
    for (int r = 0; r < mr; ++r) y[r * ldy] = _mm_cvtss_f32(_mm_sub_ss(acc[r], _mm_movehdup_ps(acc[r])));
}

/* W rows n0..n1 against the quantized rows [c0, c1): a W row KMR x rows a pass, then the last 1-3 x rows NW W rows
 * a pass (a group's rows stay in cache for its passes) */
static inline __attribute__((always_inline)) void rows_chunk(const int type, const uint8_t *w, int64_t n0, int64_t n1,
                                                             int64_t n_out, int64_t k, const int8_t *xq,
                                                             const float *xd, const int16_t *bs, int64_t c0,
                                                             int64_t c1, float *y) {
    const int64_t nb = k / QK, bb = BLOCK_BYTES[type], tail = c0 + (c1 - c0) / KMR * KMR;
    for (int64_t n = n0; n < n1;) {
        const int64_t nw = n1 - n >= NW ? NW : 1;
        int64_t r;
#define ROWS(n, mr) rows_dot(type, mr, w + (n) * nb * bb, nb, bb, xq + r * k, k, xd + r * nb, bs + r * nb * 16, \
                             y + r * n_out + (n), n_out)
#define WIDE(mr) rows_wide(type, mr, w + n * nb * bb, nb * bb, nb, bb, xq + r * k, k, xd + r * nb, bs + r * nb * 16, \
                           y + r * n_out + n, n_out)
        for (int64_t v = n; v < n + nw; ++v)
            for (r = c0; r < tail; r += KMR) ROWS(v, KMR);
        r = tail;
        if (r + 2 <= c1) {
            if (nw == NW) WIDE(2); else ROWS(n, 2);
            r += 2;
        }
        if (r < c1) {
            if (nw == NW) WIDE(1); else ROWS(n, 1);
        }
#undef ROWS
#undef WIDE
        n += nw;
    }
}

#define ROWS_CHUNK(T)                                                                                              \
    static void rows_chunk_##T(const uint8_t *w, int64_t n0, int64_t n1, int64_t n_out, int64_t k,              \
                               const int8_t *xq, const float *xd, const int16_t *bs, int64_t c0, int64_t c1,    \
                               float *y) {                                                                        \
        rows_chunk(T, w, n0, n1, n_out, k, xq, xd, bs, c0, c1, y);                                               \
    }
ROWS_CHUNK(GGUF_KQ_Q4_K)
ROWS_CHUNK(GGUF_KQ_Q5_K)
ROWS_CHUNK(GGUF_KQ_Q6_K)
typedef void (*chunk_fn)(const uint8_t *w, int64_t n0, int64_t n1, int64_t n_out, int64_t k, const int8_t *xq,
                         const float *xd, const int16_t *bs, int64_t c0, int64_t c1, float *y);
static const chunk_fn CHUNK_FNS[3] = {rows_chunk_GGUF_KQ_Q4_K, rows_chunk_GGUF_KQ_Q5_K, rows_chunk_GGUF_KQ_Q6_K};
#else
/* Without AVX2: the blocks' fp32 values against the dequantized int8 row (same values, fp32 sums). */
static float row_dot_any(int type, const uint8_t *row, int64_t nb, int64_t bb, const int8_t *xq, const float *xd) {
    float w[QK], acc = 0.0f;
    for (int64_t i = 0; i < nb; ++i) {
        float s = 0.0f;
        gguf_kquant_decode_block(type, row + i * bb, w);
        for (int e = 0; e < QK; ++e) s += w[e] * (float)xq[i * QK + e];
        acc += s * xd[i];
    }
    return acc;
}
#endif

/* W rows n0..n1 against m quantized rows, in chunks of x rows of about X_CHUNK_BYTES (a prefill's GEMM: the chunk
 * stays in L2 while the share's weight rows pass; each output's operations are the same whatever the chunking) */
#define X_CHUNK_BYTES (96 * 1024)
static void rows_q8(int type, const uint8_t *w, int64_t n0, int64_t n1, int64_t n_out, int64_t k, const int8_t *xq,
                    const float *xd, const int16_t *bs, int64_t m, float *y) {
    const int64_t chunk = X_CHUNK_BYTES / k > 1 ? X_CHUNK_BYTES / k : 1;
#if !defined(__AVX2__) || !defined(__F16C__)
    const int64_t nb = k / QK, bb = BLOCK_BYTES[type];
    (void)bs;
#endif
    for (int64_t c0 = 0; c0 < m; c0 += chunk) {
        const int64_t c1 = m - c0 < chunk ? m : c0 + chunk;
#if defined(__AVX2__) && defined(__F16C__)
        CHUNK_FNS[type](w, n0, n1, n_out, k, xq, xd, bs, c0, c1, y);
#else
        for (int64_t n = n0; n < n1; ++n)
            for (int64_t r = c0; r < c1; ++r)
                y[r * n_out + n] = row_dot_any(type, w + n * nb * bb, nb, bb, xq + r * k, xd + r * nb);
#endif
    }
}

int gguf_matmul_kquant_q8_team(int type, const uint8_t *w, int64_t n_out, int64_t k, const int8_t *xq,
                               const float *xd, const int16_t *bs, int64_t m, float *y) {
    int64_t n0, n1;
    team_share(n_out, &n0, &n1);
    rows_q8(type, w, n0, n1, n_out, k, xq, xd, bs, m, y);
    team_barrier();
    return 0;
}

void gguf_kquant_q8_matmul(int type, const uint8_t *w, int64_t n_out, int64_t k, const float *x, int64_t m, float *y) {
    if (k % QK != 0 || m <= 0) return;  /* the Python wrapper refuses a bad k first */
    const gguf_xq *team = gguf_xq_find(x, m, k, GGUF_XQ_Q8K); /* x quantized by the team (gguf_linear.c) */
    int8_t *xq = team != NULL ? team->q : malloc((size_t)(m * k));
    float *xd = team != NULL ? team->d : malloc(sizeof(float) * (size_t)(m * k / QK));
    int16_t *bs = team != NULL ? team->bs : malloc(sizeof(int16_t) * (size_t)(m * k / 16));
    if (xq != NULL && xd != NULL && bs != NULL) {
        for (int64_t r = 0; team == NULL && r < m; ++r)
            gguf_q8k_quantize_row(x + r * k, k, xq + r * k, xd + r * k / QK, bs + r * k / 16);
        if (omp_get_level() > 0) { /* inside a team (gguf_linear.c's segments): the calling thread runs it all */
            rows_q8(type, w, 0, n_out, n_out, k, xq, xd, bs, m, y);
        } else {
#pragma omp parallel
            gguf_matmul_kquant_q8_team(type, w, n_out, k, xq, xd, bs, m, y);
        }
    }
    if (team == NULL) {
        free(xq);
        free(xd);
        free(bs);
    }
}

