/* GGUF's simple block types (Q4_0, Q4_1, Q8_0 and our Q4_1F, as gemm_gguf.c reads them) against int8 activations:
 * a decode step at any row count (bandwidth-bound), a prefill under ggufActivations int8-all (a GEMM: tiles of MR
 * rows of x by NR weight rows over L2-sized chunks of x). Each row of x is quantized per 16 columns (d = max|x| / 127,
 * q = round-half-even(x * (1 / d)) in fp32: llama.cpp's Q8_0 rule on half its block, with an fp32 scale where it
 * keeps fp16) with each block's sum of q * d (llama.cpp's Q8_1 s, for the Q4_1 min and Q4_0's -8); then each
 * weight block's product is an exact integer sum per half (maddubs of the unsigned nibbles, or of |w| against
 * sign-moved x for Q8_0, madd to int32), scaled once by d_w * d_x. Against fp32 activations (~20 instructions per
 * 32 weights a row, decoding them to fp32) this runs well under half that: 4 weight rows share one x block, their
 * int32 sums reduced together by hadd (the two halves land in the two 128-bit lanes, so the per-16 scales cost
 * nothing over per-32 ones), their scales gathered into one vector. Per 16 rather than llama.cpp's 32: half the
 * mean KL on SmolLM2 (an outlier sets the step of 16 values, not 32; tools/accuracy_gguf.py). The price is the
 * rounding of x (each element off by at most d / 2).
 *
 * Numerics: quant_gguf.matmul_q8_ref is the reference (the quantized rows, dequantized, times the dequantized W);
 * the kernel differs from it only in the order of fp32 operations. A row's result depends on nothing but its own
 * row of x and of W: not the tile, the row count or the thread split.
 * Threads: as gemm_gguf.c (inside any team the calling thread runs the whole call; x quantized once per call). */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <omp.h>
#ifdef __AVX2__
#include <immintrin.h>
#endif

#include "dot_u8s8.h"
#include "fp16_lanes.h"
#include "gemm_gguf_q8.h"
#include "gguf_x4.h"
#include "gguf_xq.h"
#include "kernels.h"
#include "team_sync.h"
#include "vec_math.h"
#include "stream_ahead.h"


#define QK 32 /* values per block */
#define NR 4  /* weight rows a pass */
#define MR 4  /* rows of x a tile (a prefill's GEMM: each weight block unpacked once for MR rows) */
#define X_CHUNK_BYTES (96 * 1024) /* a GEMM's rows of x are taken in chunks of about this many quantized bytes, so
                                    * the chunk stays in L2 while every weight group of the thread's share passes */
#define STACK_K 16384 /* x's quantized rows live on the stack up to this many values */

enum { T_Q4_0 = GGUF_Q8_Q4_0, T_Q4_1 = GGUF_Q8_Q4_1, T_Q8_0 = GGUF_Q8_Q8_0, T_Q4_1F = GGUF_Q8_Q4_1F };
static const int64_t BLOCK_BYTES[4] = {18, 20, 34, 24};
static const int QS_AT[4] = {2, 4, 2, 8}; /* where a block's quants start */

/* x[k] -> xq[k] int8 per 16 values with their scale d = max|x| / 127 (clamped to +-127, as the reference clamps),
 * xd[8 * (k / 32)]: each block's two scales as the tile multiplies them (the first 4 lanes d0, the last 4 d1),
 * xs[k / 32] = d0 * sum(q[0:16]) + d1 * sum(q[16:32]) */
void gguf_q8_quantize_row(const float *x, int64_t k, int8_t *xq, float *xd, float *xs) {
    for (int64_t b = 0; b < k / QK; ++b) {
        const float *v = x + b * QK;
        float d[2];
        int sum[2];
#ifdef __AVX2__
        const __m256 sign = _mm256_set1_ps(-0.0f);
        __m256i q[4];
        for (int h = 0; h < 2; ++h) {
            const __m256 f0 = _mm256_loadu_ps(v + 16 * h), f1 = _mm256_loadu_ps(v + 16 * h + 8);
            const __m256 mx = _mm256_max_ps(_mm256_andnot_ps(sign, f0), _mm256_andnot_ps(sign, f1));
            __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(mx), _mm256_extractf128_ps(mx, 1));
            m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
            d[h] = _mm_cvtss_f32(_mm_max_ss(m4, _mm_movehdup_ps(m4))) / 127.0f;
            const __m256 id = _mm256_set1_ps(d[h] != 0.0f ? 1.0f / d[h] : 0.0f);
            const __m256 lo = _mm256_set1_ps(-127.0f), hi = _mm256_set1_ps(127.0f);
            __m256i s8 = _mm256_setzero_si256();
            for (int i = 0; i < 2; ++i) {
                const __m256 r = _mm256_round_ps(_mm256_mul_ps(i ? f1 : f0, id),
                                                 _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
                q[2 * h + i] = _mm256_cvtps_epi32(_mm256_min_ps(_mm256_max_ps(r, lo), hi));
                s8 = _mm256_add_epi32(s8, q[2 * h + i]);
            }
            __m128i s4 = _mm_add_epi32(_mm256_castsi256_si128(s8), _mm256_extracti128_si256(s8, 1));
            s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0x4e));
            sum[h] = _mm_cvtsi128_si32(_mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0xb1)));
        }
        /* packs interleave the 128-bit lanes: the permute puts the 32 bytes back in order */
        const __m256i p = _mm256_packs_epi16(_mm256_packs_epi32(q[0], q[1]), _mm256_packs_epi32(q[2], q[3]));
        _mm256_storeu_si256((__m256i *)(xq + b * QK),
                            _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7)));
#else
        for (int h = 0; h < 2; ++h) {
            float amax = 0.0f;
            for (int e = 16 * h; e < 16 * h + 16; ++e) amax = fabsf(v[e]) > amax ? fabsf(v[e]) : amax;
            d[h] = amax / 127.0f;
            const float id = d[h] != 0.0f ? 1.0f / d[h] : 0.0f;
            sum[h] = 0;
            for (int e = 16 * h; e < 16 * h + 16; ++e) {
                const float r = nearbyintf(v[e] * id);
                const int q = (int)(r > 127.0f ? 127.0f : r < -127.0f ? -127.0f : r);
                xq[b * QK + e] = (int8_t)q;
                sum[h] += q;
            }
        }
#endif
        for (int j = 0; j < 8; ++j) xd[8 * b + j] = d[j / 4];
        xs[b] = d[0] * (float)sum[0] + d[1] * (float)sum[1];
    }
}

#ifdef __AVX2__
/* the 4 rows' scales (lanes 0-3) and, for Q4_1 / Q4_1F, mins (*mn) of the blocks at p[r] */
static inline __attribute__((always_inline)) __m128 scales4(const int t, const uint8_t *p[NR], __m128 *mn) {
    if (t != T_Q4_1F) return fp16_lanes4(p, t == T_Q4_1, mn); /* fp16 fields */
    /* Q4_1F's fp32 d and min: d0 m0 d1 m1 d2 m2 d3 m3 */
    const __m128i a = _mm_unpacklo_epi64(_mm_loadl_epi64((const __m128i *)p[0]), _mm_loadl_epi64((const __m128i *)p[1]));
    const __m128i c = _mm_unpacklo_epi64(_mm_loadl_epi64((const __m128i *)p[2]), _mm_loadl_epi64((const __m128i *)p[3]));
    __m256 dm = _mm256_castsi256_ps(_mm256_set_m128i(c, a));
    dm = _mm256_permutevar8x32_ps(dm, _mm256_setr_epi32(0, 2, 4, 6, 1, 3, 5, 7));
    *mn = _mm256_extractf128_ps(dm, 1);
    return _mm256_castps256_ps128(dm);
}

/* scales4 of a 4-row interleaved block step at g (gguf_x4.h: the 4 rows' scale fields side by side): one load */
static inline __attribute__((always_inline)) __m128 scales4_x4(const int t, const uint8_t *g, __m128 *mn) {
    if (t == T_Q4_0) return _mm_cvtph_ps(_mm_loadl_epi64((const __m128i *)g));
    const __m256 dm = _mm256_permutevar8x32_ps(t == T_Q4_1 ? _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)g))
                                                           : _mm256_loadu_ps((const float *)g),
                                               _mm256_setr_epi32(0, 2, 4, 6, 1, 3, 5, 7)); /* d0 m0 d1 m1 ... */
    *mn = _mm256_extractf128_ps(dm, 1);
    return _mm256_castps256_ps128(dm);
}

/* a block's 32 weights as bytes from its quants at qs: the nibbles (low ones first, ggml's order), or Q8_0's int8 */
static inline __attribute__((always_inline)) __m256i block_quants(const int t, const uint8_t *qs) {
    if (t == T_Q8_0) return _mm256_loadu_si256((const __m256i *)qs);
    /* the 16 bytes in both lanes by the load itself (no shuffle), the high lane's shifted by a variable shift */
    const __m256i q = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)qs));
    return _mm256_and_si256(_mm256_srlv_epi64(q, _mm256_setr_epi64x(0, 0, 4, 4)), _mm256_set1_epi8(0x0f));
}

/* 32 quants . 32 int8 x, 8 int32 partial sums (dot_u8s8.h): its first operand is unsigned, so Q8_0's signed weights
 * go in as |w| with x's signs moved onto them (llama.cpp's trick: |q| <= 128, maddubs' pairs stay within int16) */
static inline __attribute__((always_inline)) __m256i block_isum(const int t, __m256i q, __m256i xv) {
    return t == T_Q8_0 ? dot_u8s8(_mm256_setzero_si256(), _mm256_sign_epi8(q, q), _mm256_sign_epi8(xv, q))
                       : dot_u8s8(_mm256_setzero_si256(), q, xv);
}

/* y[i * ldy + r] = W row r . x row i (dequantized) for the 4 rows w[r] (rows past the last repeat it: their
 * results unused) and mr (1, 2 or MR) rows of x: a block's quants unpacked once for all of them; the next group's
 * lines (`ahead` bytes on) are asked for. The sequence of operations that makes each output is the same whatever
 * mr, so are its bits, and whatever x4 (the 4 rows interleaved at w[0], gguf_x4.h: only the loads differ). */
static inline __attribute__((always_inline)) void tile_q8(const int t, const int x4, const int mr, const uint8_t *w[NR],
                                                          int64_t nb, const int8_t *xq, const float *xd,
                                                          const float *xs, int64_t k, float *y, int64_t ldy, int nr,
                                                          int64_t ahead) {
    const int64_t bb = BLOCK_BYTES[t];
    __m256 acc[MR]; /* lanes r: values 0-15 of row r, r + 4: 16-31 */
    __m128 off[MR];
    for (int i = 0; i < mr; ++i) {
        acc[i] = _mm256_setzero_ps();
        off[i] = _mm_setzero_ps();
    }
    for (int64_t b = 0; b < nb; ++b) {
        const uint8_t *p[NR], *g = w[0] + b * NR * bb; /* x4: the block step's 4 rows */
        for (int r = 0; r < NR; ++r) p[r] = w[r] + b * bb;
        /* a group's NR rows further on (ahead: stream_ahead.h's groups_ahead; contiguous) asked for as one
         * stream, a step's share of it (NR blocks' bytes) a step. Each row asking for its own place there (4
         * streams 1-2 KiB apart where rows are short) read 1.05-1.3x slower a core from memory, 1.35-1.7x at two
         * cores (Q4_0 / Q4_1 / Q8_0 on 1.7B's and 360M's shapes, one run); a fixed 2 KiB past each row
         * (stream_ahead), slower again */
        for (int64_t o = 0; o < NR * bb; o += 64) stream_at(w[0] + ahead + b * NR * bb + o);
        __m256i q[NR];
        for (int r = 0; r < NR; ++r) q[r] = block_quants(t, x4 ? gguf_x4_quants_at(g, bb, r) : p[r] + QS_AT[t]);
        __m128 mn = _mm_setzero_ps();
        const __m128 d = x4 ? scales4_x4(t, g, &mn) : scales4(t, p, &mn);
        const __m256 d8 = _mm256_set_m128(d, d);
        for (int i = 0; i < mr; ++i) {
            const __m256i xv = _mm256_loadu_si256((const __m256i *)(xq + i * k + b * QK));
            /* lane r: row r's sum over values 0-15, lane 4 + r: over 16-31 (each half of x has its own scale) */
            const __m256i h = t == T_Q8_0 ? _mm256_hadd_epi32(_mm256_hadd_epi32(block_isum(t, q[0], xv),
                                                                                block_isum(t, q[1], xv)),
                                                              _mm256_hadd_epi32(block_isum(t, q[2], xv),
                                                                                block_isum(t, q[3], xv)))
                                          : rows4_isum(q, xv); /* dot_u8s8.h */
            const __m256 scale = _mm256_mul_ps(d8, _mm256_loadu_ps(xd + 8 * (i * nb + b)));
            acc[i] = _mm256_fmadd_ps(scale, _mm256_cvtepi32_ps(h), acc[i]);
            /* sum w x = d_w d_x sum q xq + off_w xs: Q4_1's off is its min, Q4_0's -8 d_w (the -8 applied below) */
            if (t == T_Q4_1 || t == T_Q4_1F) off[i] = _mm_fmadd_ps(mn, _mm_set1_ps(xs[i * nb + b]), off[i]);
            if (t == T_Q4_0) off[i] = _mm_fmadd_ps(d, _mm_set1_ps(xs[i * nb + b]), off[i]);
        }
    }
    for (int i = 0; i < mr; ++i) {
        __m128 v = _mm_add_ps(_mm256_castps256_ps128(acc[i]), _mm256_extractf128_ps(acc[i], 1));
        if (t == T_Q4_0) v = _mm_fnmadd_ps(_mm_set1_ps(8.0f), off[i], v);
        else if (t != T_Q8_0) v = _mm_add_ps(v, off[i]);
        float out[NR];
        _mm_storeu_ps(out, v);
        memcpy(y + i * ldy, out, sizeof(float) * (size_t)nr);
    }
}
#else
/* the same sums without AVX2, a row at a time */
static void tile_q8(const int t, const int x4, const int mr, const uint8_t *w[NR], int64_t nb, const int8_t *xq,
                    const float *xd, const float *xs, int64_t k, float *y, int64_t ldy, int nr, int64_t ahead) {
    (void)ahead;
    const int64_t bb = BLOCK_BYTES[t];
    for (int i = 0; i < mr; ++i)
        for (int r = 0; r < nr; ++r) {
            float acc = 0.0f, off = 0.0f;
            for (int64_t b = 0; b < nb; ++b) {
                const uint8_t *g = w[0] + b * NR * bb; /* x4: the block step's 4 rows */
                const uint8_t *p = x4 ? gguf_x4_scales_at(g, bb, r) : w[r] + b * bb;
                const uint8_t *qs = x4 ? gguf_x4_quants_at(g, bb, r) : p + QS_AT[t];
                const int8_t *x = xq + i * k + b * QK;
                int s[2] = {0, 0}; /* values 0-15, 16-31: each half of x has its own scale */
                for (int e = 0; e < QK / 2; ++e) {
                    const int lo = t == T_Q8_0 ? (int8_t)qs[e] : qs[e] & 0x0f;
                    const int hi = t == T_Q8_0 ? (int8_t)qs[QK / 2 + e] : qs[e] >> 4;
                    s[0] += lo * x[e];
                    s[1] += hi * x[e + QK / 2];
                }
                float d, mn;
                if (t == T_Q4_1F) { memcpy(&d, p, 4); memcpy(&mn, p + 4, 4); }
                else { d = f16_to_f32(p); mn = t == T_Q4_1 ? f16_to_f32(p + 2) : d; }
                const float *xdb = xd + 8 * (i * nb + b);
                acc = fmaf(d * xdb[0], (float)s[0], fmaf(d * xdb[4], (float)s[1], acc));
                if (t != T_Q8_0) off = fmaf(mn, xs[i * nb + b], off);
            }
            y[i * ldy + r] = t == T_Q4_0 ? fmaf(-8.0f, off, acc) : t == T_Q8_0 ? acc : acc + off;
        }
}
#endif

/* weight row groups [g0, g1) (NR rows each, the last maybe fewer) against m quantized rows of x: chunks of x rows
 * (X_CHUNK_BYTES) outermost, each group's blocks then unpacked once per MR rows of the chunk (a decode step's few
 * rows: one chunk, so each weight byte is read once) */
static inline __attribute__((always_inline)) void groups_q8(const int t, const int x4, const uint8_t *w,
                                                            int64_t n_out, int64_t k, const int8_t *xq, const float *xd,
                                                            const float *xs, int64_t m, float *y, int64_t g0,
                                                            int64_t g1) {
    const int64_t nb = k / QK, rb = nb * BLOCK_BYTES[t];
    int64_t chunk = X_CHUNK_BYTES / k / MR * MR;
    chunk = chunk < MR ? MR : chunk;
    for (int64_t c0 = 0; c0 < m; c0 += chunk) {
        const int64_t c1 = m - c0 < chunk ? m : c0 + chunk;
        for (int64_t g = g0; g < g1; ++g) {
            const int64_t r0 = g * NR;
            const int nr = n_out - r0 < NR ? (int)(n_out - r0) : NR;
            const uint8_t *rows[NR];
            for (int r = 0; r < NR; ++r) rows[r] = w + (r0 + (r < nr ? r : 0)) * rb;
            int64_t i = c0;
#define TILE(mr) \
    tile_q8(t, x4, mr, rows, nb, xq + i * k, xd + 8 * i * nb, xs + i * nb, k, y + i * n_out + r0, n_out, nr, \
            groups_ahead(NR * rb))
            for (; i + MR <= c1; i += MR) TILE(MR);
            if (i + 2 <= c1) {
                TILE(2);
                i += 2;
            }
            if (i < c1) TILE(1);
#undef TILE
        }
    }
}

/* each type's groups_q8 compiled for it: a parallel region's body is outlined once per function, before inlining
 * gives it its type, so the standalone call's team ran the type-generic code (a Q4_0 lone row 1.6x slower than
 * the same rows inside a team) until it called these */
typedef void (*groups_fn)(const uint8_t *w, int64_t n_out, int64_t k, const int8_t *xq, const float *xd,
                          const float *xs, int64_t m, float *y, int64_t g0, int64_t g1);
#define GROUPS_OF(T, X4)                                                                                           \
    static void groups_##T##_##X4(const uint8_t *w, int64_t n_out, int64_t k, const int8_t *xq, const float *xd,  \
                                  const float *xs, int64_t m, float *y, int64_t g0, int64_t g1) {                \
        groups_q8(T, X4, w, n_out, k, xq, xd, xs, m, y, g0, g1);                                                  \
    }
GROUPS_OF(T_Q4_0, 0)
GROUPS_OF(T_Q4_1, 0)
GROUPS_OF(T_Q8_0, 0)
GROUPS_OF(T_Q4_1F, 0)
GROUPS_OF(T_Q4_0, 1)
GROUPS_OF(T_Q4_1, 1)
GROUPS_OF(T_Q4_1F, 1)
#undef GROUPS_OF
/* by GGUF_Q8_* type (+ GGUF_Q8_X4: the 4-bit types' 4-row interleaved layout) */
static const groups_fn GROUPS[8] = {groups_T_Q4_0_0, groups_T_Q4_1_0, groups_T_Q8_0_0, groups_T_Q4_1F_0,
                                    groups_T_Q4_0_1, groups_T_Q4_1_1, NULL,             groups_T_Q4_1F_1};

static inline __attribute__((always_inline)) void matmul_q8(const int t, const int x4, const uint8_t *w,
                                                            int64_t n_out, int64_t k, const float *x, int64_t m,
                                                            float *y) {
    if (k % QK != 0 || m <= 0) return; /* the Python side refuses a bad k first */
    const int64_t nb = k / QK, groups = (n_out + NR - 1) / NR;
    int8_t sq[STACK_K];
    float sd[STACK_K / QK * 8], ss[STACK_K / QK];
    const gguf_xq *team = gguf_xq_find(x, m, k, GGUF_XQ_Q8); /* x quantized by the team (gguf_linear.c) */
    const int heap = team == NULL && m * k > STACK_K;
    int8_t *xq = team != NULL ? team->q : heap ? malloc((size_t)(m * k)) : sq;
    float *xd = team != NULL ? team->d : heap ? malloc(sizeof(float) * (size_t)(8 * m * nb)) : sd;
    float *xs = team != NULL ? team->s : heap ? malloc(sizeof(float) * (size_t)(m * nb)) : ss;
    if (xq != NULL && xd != NULL && xs != NULL) {
        for (int64_t i = 0; team == NULL && i < m; ++i)
            gguf_q8_quantize_row(x + i * k, k, xq + i * k, xd + 8 * i * nb, xs + i * nb);
        const groups_fn run = GROUPS[t + (x4 ? GGUF_Q8_X4 : 0)];
        if (omp_get_level() > 0 || groups == 1) { /* inside any team, a team of 1 included */
            run(w, n_out, k, xq, xd, xs, m, y, 0, groups);
        } else {
#pragma omp parallel
            {
                int64_t g0, g1;
                team_share(groups, &g0, &g1); /* this thread's consecutive groups of NR rows */
                run(w, n_out, k, xq, xd, xs, m, y, g0, g1);
            }
        }
    }
    if (heap) {
        free(xq);
        free(xd);
        free(xs);
    }
}

void gguf_q8_matmul(int type, const uint8_t *w, int64_t n_out, int64_t k, const float *x, int64_t m, float *y) {
    const int x4 = (type & GGUF_Q8_X4) != 0, t = type & ~GGUF_Q8_X4;
    if (x4 && (n_out % NR != 0 || t == T_Q8_0)) return; /* whole interleaved groups of a 4-bit type only */
    matmul_q8(t, x4, w, n_out, k, x, m, y);
}
void gguf_matmul_q8_0_q8(const uint8_t *w, int64_t n_out, int64_t k, const float *x, int64_t m, float *y) {
    matmul_q8(T_Q8_0, 0, w, n_out, k, x, m, y);
}
