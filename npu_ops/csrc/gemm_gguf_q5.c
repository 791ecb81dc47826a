/* GGUF's Q5_0 and Q5_1 blocks as stored (gguf_q5_block.h), fp32 activations: y[m, n_out] = x[m, k] . W^T, W as a
 * GGUF file holds it (row r: k / 32 consecutive blocks). Files whose widths are not multiples of 256 (SmolLM2-360M's
 * 960) hold most of a "Q4_K_M" in Q5_0 and of a "Q5_K_M" in Q5_1: llama.cpp falls back to them where a K-quant's
 * 256-value super-block does not fit.
 *
 * Numerics and shape as gemm_gguf.c (npu_ops/quant_gguf.py holds the reference): each weight is dequantized in
 * registers to exactly gguf.quants.dequantize's fp32 value (Q5_0: fma(d, q, -16 d), exact; Q5_1: fma(d, q, m), one
 * rounding), then multiplied with the fp32 activations; lane j of one 8-lane accumulator takes k = 8 i + j for
 * ascending i, the lanes added as vec_math.h's hsum256 adds them, so a row's result is the same bits whatever the
 * tile, the row count or the thread split. One row of x streams 4 weight rows at a time, decoded in registers; more
 * rows decode 4 weight rows once into an L1 buffer per MC rows of x and run a 4 x 3 register tile over it.
 * Threads: weight rows split over the OpenMP team (inside one, the calling thread runs the whole call). */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <omp.h>

#include "gemm_gguf_q5.h"
#include "gguf_q5_block.h"
#include "kernels.h"
#include "team_sync.h"

#define NR 4  /* weight rows a tile */
#define MR 3  /* x rows a tile (the buffered path) */
#define MC 64 /* x rows a decoded weight buffer serves */

/* One block's 32 values, scalar: the reference of the vector decoder, the row kernel. */
static void dequant_block(int t, const uint8_t *b, float *out) {
    const float d = f16_to_f32(b), mn = q5_min(t, b);
    uint8_t q[Q5_QK];
    q5_quants_scalar(t, b, q);
    for (int j = 0; j < Q5_QK; ++j) out[j] = t == T_Q5_1 ? fmaf(d, (float)q[j], mn) : d * (float)(q[j] - 16);
}

static inline void dequant_row(int t, const uint8_t *w, int64_t k, float *out) {
    for (int64_t b = 0; b < k / Q5_QK; ++b) dequant_block(t, w + b * Q5_BYTES(t), out + b * Q5_QK);
}

#ifdef __AVX2__
#include "vec_math.h"

/* The block's 4 chunks of 8 values (k ascending), the values dequant_block gives. */
static inline __attribute__((always_inline)) void dequant_regs(const int t, const uint8_t *b, __m256 c[4]) {
    const __m256 d = _mm256_set1_ps(f16_to_f32(b));
    const __m256i q = q5_quants(t, b);
    const __m128i lo = _mm256_castsi256_si128(q), hi = _mm256_extracti128_si256(q, 1);
    const __m128i part[4] = {lo, _mm_srli_si128(lo, 8), hi, _mm_srli_si128(hi, 8)};
    const __m256 off = t == T_Q5_1 ? _mm256_set1_ps(q5_min(t, b)) : _mm256_mul_ps(d, _mm256_set1_ps(-16.0f));
    for (int i = 0; i < 4; ++i) c[i] = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(part[i])), off);
}

/* A row decoded into a buffer (the prefill path's): dequant_block's values. */
static inline __attribute__((always_inline)) void dequant_row_buf(const int t, const uint8_t *w, int64_t k,
                                                                  float *out) {
    for (int64_t b = 0; b < k / Q5_QK; ++b) {
        __m256 c[4];
        dequant_regs(t, w + b * Q5_BYTES(t), c);
        for (int i = 0; i < 4; ++i) _mm256_storeu_ps(out + b * Q5_QK + 8 * i, c[i]);
    }
}

/* y[0, r] for rows r < nr (<= NR) of w, one row of x: blocks decoded in registers. */
static inline __attribute__((always_inline)) void row_tile(const int t, const uint8_t *w, int64_t rb, int nr,
                                                           int64_t k, const float *x, float *y) {
    __m256 acc[NR];
    for (int r = 0; r < NR; ++r) acc[r] = _mm256_setzero_ps();
    for (int64_t b = 0; b < k / Q5_QK; ++b) {
        const float *xb = x + b * Q5_QK;
        for (int r = 0; r < NR; ++r) {
            if (r >= nr) break;
            __m256 c[4];
            dequant_regs(t, w + r * rb + b * Q5_BYTES(t), c);
            for (int i = 0; i < 4; ++i) acc[r] = _mm256_fmadd_ps(c[i], _mm256_loadu_ps(xb + 8 * i), acc[r]);
        }
    }
    for (int r = 0; r < nr; ++r) y[r] = hsum256(acc[r]);
}

/* y[m, r] (rows ldy apart) for mr (<= MR) rows of x against nr (<= NR) dequantized rows wb[r * k ...]. */
static void buf_tile(const float *wb, int nr, int64_t k, const float *x, int mr, float *y, int64_t ldy) {
    __m256 acc[NR][MR];
    for (int r = 0; r < NR; ++r)
        for (int m = 0; m < MR; ++m) acc[r][m] = _mm256_setzero_ps();
    for (int64_t i = 0; i < k; i += 8) {
        for (int r = 0; r < NR; ++r) {
            if (r >= nr) break;
            const __m256 wv = _mm256_loadu_ps(wb + r * k + i);
            for (int m = 0; m < MR; ++m)
                if (m < mr) acc[r][m] = _mm256_fmadd_ps(wv, _mm256_loadu_ps(x + m * k + i), acc[r][m]);
        }
    }
    for (int m = 0; m < mr; ++m)
        for (int r = 0; r < nr; ++r) y[m * ldy + r] = hsum256(acc[r][m]);
}
#else
/* lanes as the AVX2 path keeps them, added as hsum256 adds them: the same bits without AVX2 */
static float dot_lanes(const float *w, const float *x, int64_t k) {
    float a[8] = {0};
    for (int64_t i = 0; i < k; i += 8)
        for (int j = 0; j < 8; ++j) a[j] = fmaf(w[i + j], x[i + j], a[j]);
    const float s0 = a[0] + a[4], s1 = a[1] + a[5], s2 = a[2] + a[6], s3 = a[3] + a[7];
    return (s0 + s2) + (s1 + s3);
}

static void buf_tile(const float *wb, int nr, int64_t k, const float *x, int mr, float *y, int64_t ldy) {
    for (int m = 0; m < mr; ++m)
        for (int r = 0; r < nr; ++r) y[m * ldy + r] = dot_lanes(wb + r * k, x + m * k, k);
}

static void dequant_row_buf(const int t, const uint8_t *w, int64_t k, float *out) { dequant_row(t, w, k, out); }

static void row_tile(const int t, const uint8_t *w, int64_t rb, int nr, int64_t k, const float *x, float *y) {
    float v[Q5_QK];
    for (int r = 0; r < nr; ++r) {
        float a[8] = {0};
        for (int64_t b = 0; b < k / Q5_QK; ++b) {
            dequant_block(t, w + r * rb + b * Q5_BYTES(t), v);
            for (int i = 0; i < Q5_QK; ++i) a[i % 8] = fmaf(v[i], x[b * Q5_QK + i], a[i % 8]);
        }
        const float s0 = a[0] + a[4], s1 = a[1] + a[5], s2 = a[2] + a[6], s3 = a[3] + a[7];
        y[r] = (s0 + s2) + (s1 + s3);
    }
}
#endif

/* weight row groups [g0, g1) (NR rows each, the last maybe fewer) against every row of x; wb: NR * k floats of
 * scratch where m > 1 (NULL: one row of x at a time, the same sums) */
static inline __attribute__((always_inline)) void groups_range(const int t, const uint8_t *w, int64_t n_out,
                                                               int64_t k, const float *x, int64_t m, float *y,
                                                               int64_t g0, int64_t g1, float *wb) {
    const int64_t rb = k / Q5_QK * Q5_BYTES(t);
    for (int64_t g = g0; g < g1; ++g) {
        const int64_t r0 = g * NR;
        const int nr = n_out - r0 < NR ? (int)(n_out - r0) : NR;
        if (m == 1 || wb == NULL) {
            for (int64_t i = 0; i < m; ++i) row_tile(t, w + r0 * rb, rb, nr, k, x + i * k, y + i * n_out + r0);
            continue;
        }
        for (int64_t m0 = 0; m0 < m; m0 += MC) {
            const int64_t m1 = m0 + MC < m ? m0 + MC : m;
            for (int r = 0; r < nr; ++r) dequant_row_buf(t, w + (r0 + r) * rb, k, wb + r * k);
            for (int64_t i = m0; i < m1; i += MR)
                buf_tile(wb, nr, k, x + i * k, m1 - i < MR ? (int)(m1 - i) : MR, y + i * n_out + r0, n_out);
        }
    }
}

/* Inside a team (the fused decoder's, gguf_linear.c's) the caller's thread runs it all; outside, a team of its own
 * splits the row groups. */
static inline __attribute__((always_inline)) void matmul(const int t, const uint8_t *w, int64_t n_out, int64_t k,
                                                         const float *x, int64_t m, float *y) {
    const int64_t groups = (n_out + NR - 1) / NR;
    if (omp_get_level() > 0 || groups == 1) { /* inside any team, a team of 1 included */
        float *wb = m > 1 ? malloc(sizeof(float) * (size_t)(NR * k)) : NULL;
        groups_range(t, w, n_out, k, x, m, y, 0, groups, wb);
        free(wb);
        return;
    }
#pragma omp parallel
    {
        float *wb = m > 1 ? malloc(sizeof(float) * (size_t)(NR * k)) : NULL;
        int64_t g0, g1;
        team_share(groups, &g0, &g1); /* this thread's consecutive groups of NR rows */
        groups_range(t, w, n_out, k, x, m, y, g0, g1, wb);
        free(wb);
    }
}

/* One row dequantized (an embedding row in the fused decode step; a tile of rows decoded for a prefill's GEMM):
 * dequant_block's values, 8 a store where AVX2 is. */
void gguf_dequant_q5_0(const uint8_t *w, int64_t k, float *out) { dequant_row_buf(T_Q5_0, w, k, out); }
void gguf_dequant_q5_1(const uint8_t *w, int64_t k, float *out) { dequant_row_buf(T_Q5_1, w, k, out); }

void gguf_matmul_q5_0(const uint8_t *w, int64_t n_out, int64_t k, const float *x, int64_t m, float *y) {
    matmul(T_Q5_0, w, n_out, k, x, m, y);
}
void gguf_matmul_q5_1(const uint8_t *w, int64_t n_out, int64_t k, const float *x, int64_t m, float *y) {
    matmul(T_Q5_1, w, n_out, k, x, m, y);
}
