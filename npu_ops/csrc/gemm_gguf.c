/* GGUF's simple block types as they are stored, fp32 activations: y[m, n_out] = x[m, k] . W^T, W as a GGUF file
 * holds it (row r: k / 32 consecutive blocks). Q4_0 (18 bytes: fp16 d, 16 bytes of nibbles; w = d * (q - 8)),
 * Q4_1 (20 bytes: fp16 d, fp16 min, nibbles; w = d * q + min), Q8_0 (34 bytes: fp16 d, 32 int8; w = d * q). Value j
 * of a block is byte j's low nibble for j < 16, byte j - 16's high nibble after (ggml's order). Q4_1F is ours, not
 * ggml's (npu_ops/quant_w4a16.py): Q4_1 with fp32 d and min (24 bytes), for W4A16 groups whose scale or zero offset
 * fp16 cannot hold exactly.
 *
 * Numerics (npu_ops/quant_gguf.py holds the reference): each weight is dequantized in registers to exactly the fp32
 * value gguf.quants.dequantize gives it (d * q is exact in fp32, so d * q + min rounds once either way), then
 * multiplied with the fp32 activations; only the order of the fp32 sums differs from `x @ dequantize(W).T`. Every
 * output element sums in one order whatever the tile, the rows or the thread split: lane j of one 8-lane
 * accumulator takes k = 8 i + j for ascending i, and the lanes are added as vec_math.h's hsum256 adds them.
 *
 * One row of x (a decode step: bandwidth-bound) streams 4 weight rows at a time, decoded in registers. More rows (a
 * prefill) decode 4 weight rows once into an L1 buffer per chunk of MC rows of x and run a 4 x 3 register tile
 * over it, so each block is decoded once per MC rows rather than once per row.
 * Threads: weight rows split over the OpenMP team (orphaned when called inside one: a team of 1 each). */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <omp.h>
#if defined(__AVX2__) || defined(__F16C__)
#include <immintrin.h>
#endif

#include "gemm_gguf.h"
#include "kernels.h"
#include "team_sync.h"
#include "stream_ahead.h"
#include "vec_math.h"

#define QK 32 /* values per block */
#define NR 4  /* weight rows a tile */
#define NR_ROW 8 /* weight rows a lone row of x streams at once (two groups) */
#define MR 3  /* x rows a tile (the buffered path) */
#define MC 64 /* x rows a decoded weight buffer serves */

enum { T_Q4_0 = 0, T_Q4_1 = 1, T_Q8_0 = 2, T_Q4_1F = 3 };
static const int64_t BLOCK_BYTES[4] = {18, 20, 34, 24};
static const int QS_AT[4] = {2, 4, 2, 8}; /* where a block's quants start */

/* One block's 32 values, scalar: the reference of the vector decoders and the fallback without AVX2. */
static inline float f32_at(const uint8_t *p) {
    float f;
    memcpy(&f, p, 4);
    return f;
}

/* a block's scale and (Q4_1, Q4_1F) min */
static inline float block_d(int t, const uint8_t *b) { return t == T_Q4_1F ? f32_at(b) : f16_to_f32(b); }
static inline float block_min(int t, const uint8_t *b) {
    return t == T_Q4_1F ? f32_at(b + 4) : t == T_Q4_1 ? f16_to_f32(b + 2) : 0.0f;
}

static void dequant_block(int t, const uint8_t *b, float *out) {
    const float d = block_d(t, b);
    if (t == T_Q8_0) {
        for (int j = 0; j < QK; ++j) out[j] = d * (float)(int8_t)b[2 + j];
        return;
    }
    const uint8_t *qs = b + QS_AT[t];
    const float mn = block_min(t, b);
    for (int j = 0; j < QK / 2; ++j) {
        const int lo = qs[j] & 0x0f, hi = qs[j] >> 4;
        if (t != T_Q4_0) {
            out[j] = fmaf(d, (float)lo, mn);
            out[j + QK / 2] = fmaf(d, (float)hi, mn);
        } else {
            out[j] = d * (float)(lo - 8);
            out[j + QK / 2] = d * (float)(hi - 8);
        }
    }
}

__attribute__((unused)) static void dequant_row(int t, const uint8_t *w, int64_t k, float *out) { /* without AVX2 */
    for (int64_t b = 0; b < k / QK; ++b) dequant_block(t, w + b * BLOCK_BYTES[t], out + b * QK);
}


#ifdef __AVX2__

/* The block's 4 chunks of 8 values (k ascending), the values dequant_block gives. */
static inline __attribute__((always_inline)) void dequant_regs(const int t, const uint8_t *b, __m256 c[4]) {
    const __m256 d = _mm256_set1_ps(block_d(t, b));
    if (t == T_Q8_0) {
        for (int i = 0; i < 4; ++i)
            c[i] = _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(b + 2 + 8 * i)))));
        return;
    }
    const __m128i q = _mm_loadu_si128((const __m128i *)(b + QS_AT[t])), m4 = _mm_set1_epi8(0x0f);
    const __m128i lo = _mm_and_si128(q, m4), hi = _mm_and_si128(_mm_srli_epi16(q, 4), m4);
    const __m128i part[4] = {lo, _mm_srli_si128(lo, 8), hi, _mm_srli_si128(hi, 8)};
    /* Q4_0: d * (q - 8) = fma(d, q, -8 d), both exact but the one rounding; Q4_1, Q4_1F: fma(d, q, min) */
    const __m256 off = t != T_Q4_0 ? _mm256_set1_ps(block_min(t, b)) : _mm256_mul_ps(d, _mm256_set1_ps(-8.0f));
    for (int i = 0; i < 4; ++i) c[i] = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(part[i])), off);
}

/* A row decoded into a buffer (the prefill path's), 8 values a store: dequant_row's values. */
static inline __attribute__((always_inline)) void dequant_row_buf(const int t, const uint8_t *w, int64_t k, float *out) {
    for (int64_t b = 0; b < k / QK; ++b) {
        __m256 c[4];
        dequant_regs(t, w + b * BLOCK_BYTES[t], c);
        for (int i = 0; i < 4; ++i) _mm256_storeu_ps(out + b * QK + 8 * i, c[i]);
    }
}

/* y[0, r] for rows r < nr (<= NR_ROW) of w, one row of x: blocks decoded in registers. Each row keeps its one
 * accumulator chain (the buffered path's sums); NR_ROW rows at once so that 8 chains hide the FMAs' latency (4 left
 * the fp32 head's GEMV waiting on them). */
static inline __attribute__((always_inline)) void row_tile(const int t, const uint8_t *w, int64_t rb, int nr,
                                                           int64_t k, const float *x, float *y) {
    __m256 acc[NR_ROW];
    for (int r = 0; r < NR_ROW; ++r) acc[r] = _mm256_setzero_ps();
    const int64_t bb = BLOCK_BYTES[t];
    for (int64_t b = 0; b < k / QK; ++b) {
        const float *xb = x + b * QK;
#pragma GCC unroll 8
        for (int r = 0; r < NR_ROW; ++r) {
            if (r >= nr) break;
            __m256 c[4];
            /* the same place of the next group's row asked for about once a line read (stream_ahead.h): the
             * hardware prefetchers alone left the head's long GEMV at half the rate */
            if (bb * b % 64 < bb) stream_at(w + (r + NR_ROW) * rb + b * bb);
            dequant_regs(t, w + r * rb + b * bb, c);
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
    for (int r = 0; r < nr; ++r) {
        float a[8] = {0}, v[QK];
        for (int64_t b = 0; b < k / QK; ++b) {
            dequant_block(t, w + r * rb + b * BLOCK_BYTES[t], v);
            for (int i = 0; i < QK; ++i) a[i % 8] = fmaf(v[i], x[b * QK + i], a[i % 8]);
        }
        const float s0 = a[0] + a[4], s1 = a[1] + a[5], s2 = a[2] + a[6], s3 = a[3] + a[7];
        y[r] = (s0 + s2) + (s1 + s3);
    }
}
#endif

/* one row (or a run of whole blocks: gemm_gguf_tile.c's K-chunks) dequantized, 8 values a store */
void gguf_dequant_q4_0(const uint8_t *w, int64_t k, float *out) { dequant_row_buf(T_Q4_0, w, k, out); }
void gguf_dequant_q4_1(const uint8_t *w, int64_t k, float *out) { dequant_row_buf(T_Q4_1, w, k, out); }
void gguf_dequant_q8_0(const uint8_t *w, int64_t k, float *out) { dequant_row_buf(T_Q8_0, w, k, out); }
void gguf_dequant_q4_1f(const uint8_t *w, int64_t k, float *out) { dequant_row_buf(T_Q4_1F, w, k, out); }

/* Weight rows [r0, r0 + nr) (nr <= NR) against every row of x; wb: NR * k floats of scratch. */
static inline __attribute__((always_inline)) void rows_group(const int t, const uint8_t *w, int64_t rb, int nr,
                                                             int64_t k, const float *x, int64_t m, float *y,
                                                             int64_t ldy, float *wb) {
    if (m == 1) {
        row_tile(t, w, rb, nr, k, x, y);
        return;
    }
    for (int64_t m0 = 0; m0 < m; m0 += MC) {
        const int64_t m1 = m0 + MC < m ? m0 + MC : m;
        for (int r = 0; r < nr; ++r) dequant_row_buf(t, w + r * rb, k, wb + r * k);
        for (int64_t i = m0; i < m1; i += MR)
            buf_tile(wb, nr, k, x + i * k, m1 - i < MR ? (int)(m1 - i) : MR, y + i * ldy, ldy);
    }
}

/* weight row groups [g0, g1) (NR rows each, the last maybe fewer) against every row of x */
static inline __attribute__((always_inline)) void groups_range(const int t, const uint8_t *w, int64_t n_out,
                                                               int64_t k, const float *x, int64_t m, float *y,
                                                               int64_t g0, int64_t g1, float *wb) {
    const int64_t rb = k / QK * BLOCK_BYTES[t];
    if (m == 1) { /* a lone row: NR_ROW / NR groups at once, the same sums per row */
        const int64_t end = g1 * NR < n_out ? g1 * NR : n_out;
        int64_t r0 = g0 * NR;
        for (; r0 + NR_ROW <= end; r0 += NR_ROW) /* nr a constant: the accumulators stay in registers */
            row_tile(t, w + r0 * rb, rb, NR_ROW, k, x, y + r0);
        if (r0 < end) row_tile(t, w + r0 * rb, rb, (int)(end - r0), k, x, y + r0);
        return;
    }
    for (int64_t g = g0; g < g1; ++g) {
        const int64_t r0 = g * NR;
        const int nr = n_out - r0 < NR ? (int)(n_out - r0) : NR;
        if (m > 1 && wb == NULL) { /* no scratch: one row of x at a time, the same sums */
            for (int64_t i = 0; i < m; ++i) rows_group(t, w + r0 * rb, rb, nr, k, x + i * k, 1, y + i * n_out + r0, n_out, NULL);
            continue;
        }
        rows_group(t, w + r0 * rb, rb, nr, k, x, m, y + r0, n_out, wb);
    }
}

/* each type's groups_range compiled for it (gemm_gguf_q8.c's GROUPS: a parallel region's body is outlined before
 * inlining gives it its type) */
typedef void (*groups_fn)(const uint8_t *w, int64_t n_out, int64_t k, const float *x, int64_t m, float *y,
                          int64_t g0, int64_t g1, float *wb);
#define GROUPS_OF(T)                                                                                               \
    static void groups_##T(const uint8_t *w, int64_t n_out, int64_t k, const float *x, int64_t m, float *y,       \
                           int64_t g0, int64_t g1, float *wb) {                                                   \
        groups_range(T, w, n_out, k, x, m, y, g0, g1, wb);                                                        \
    }
GROUPS_OF(T_Q4_0)
GROUPS_OF(T_Q4_1)
GROUPS_OF(T_Q8_0)
GROUPS_OF(T_Q4_1F)
#undef GROUPS_OF
static const groups_fn GROUPS[4] = {groups_T_Q4_0, groups_T_Q4_1, groups_T_Q8_0, groups_T_Q4_1F};

/* Inside a team (the fused decoder's, gguf_linear.c's) the caller's thread runs it all; outside, a team of its own
 * splits the row groups. */
static inline __attribute__((always_inline)) void matmul(const int t, const uint8_t *w, int64_t n_out, int64_t k,
                                                         const float *x, int64_t m, float *y) {
    const int64_t groups = (n_out + NR - 1) / NR;
    if (omp_get_level() > 0 || groups == 1) { /* inside any team, a team of 1 included */
        float *wb = m > 1 ? malloc(sizeof(float) * (size_t)(NR * k)) : NULL;
        GROUPS[t](w, n_out, k, x, m, y, 0, groups, wb);
        free(wb);
        return;
    }
    const groups_fn run = GROUPS[t];
#pragma omp parallel
    {
        float *wb = m > 1 ? malloc(sizeof(float) * (size_t)(NR * k)) : NULL;
        int64_t g0, g1;
        team_share(groups, &g0, &g1); /* this thread's consecutive groups of NR rows */
        run(w, n_out, k, x, m, y, g0, g1, wb);
        free(wb);
    }
}

void gguf_matmul_q4_0(const uint8_t *w, int64_t n_out, int64_t k, const float *x, int64_t m, float *y) {
    matmul(T_Q4_0, w, n_out, k, x, m, y);
}
void gguf_matmul_q4_1(const uint8_t *w, int64_t n_out, int64_t k, const float *x, int64_t m, float *y) {
    matmul(T_Q4_1, w, n_out, k, x, m, y);
}
void gguf_matmul_q8_0(const uint8_t *w, int64_t n_out, int64_t k, const float *x, int64_t m, float *y) {
    matmul(T_Q8_0, w, n_out, k, x, m, y);
}
void gguf_matmul_q4_1f(const uint8_t *w, int64_t n_out, int64_t k, const float *x, int64_t m, float *y) {
    matmul(T_Q4_1F, w, n_out, k, x, m, y);
}
