/* Attention for a lone row (a one-stream decode step) over the int8 KV cache, by the whole team: attention_lone.c's
 * split (key blocks for the scores, heads for the softmax, KV heads and columns for the weighted sum of V) over
 * int8 rows (attention_i8.h). Every score, softmax and output element takes the operations attention_int8.c's
 * attend_i8 gives it, in the same order, so the row has the bits it has inside a batch. A row moves 68 bytes
 * where fp32 moves 256 (head_dim 64): one stream's attention reads about a quarter of the bytes. */
#include <stdint.h>
#include <string.h>

#include "attention_i8.h"
#include "attention_lone_i8.h"
#include "attention_rows.h"
#include "team_sync.h"

#ifdef __AVX2__
/* Blocks a V pass asks for ahead (attention_lone.c's V_AHEAD) */
#define VI_AHEAD 3

/* both cache lines a row of KV head g may touch, for the n rows of a block from v */
static inline void prefetch_rows_i8(const int8_t *v, int64_t stride, int64_t n, int64_t row) {
    for (int64_t j = 0; j < n; ++j) {
        __builtin_prefetch(v + j * stride, 0, 1);
        __builtin_prefetch(v + j * stride + row - 1, 0, 1);
    }
}

/* out[h, c0 + 8 i] for the G query heads h of KV head g and NC vectors of columns from c0: per element, from zero,
 * w = p_h[j] * scale_j and one fused multiply-add per key in key order, as accumulate_rows_i8 gives it; a row's
 * values are widened once for the G heads and the sums stay in registers over every key. */
static inline __attribute__((always_inline)) void vi_group_pass(const int G, const int NC, const float *restrict scores,
                                                                int64_t L, const int8_t *restrict v_cache,
                                                                const int32_t *restrict bt, int64_t g, int64_t D,
                                                                int64_t BS, int64_t tok_stride, int64_t blk_stride,
                                                                int64_t c0, float *restrict out) {
    const int64_t row = D + 4, nblk = (L + BS - 1) / BS;
    __m256 a[4][4];
#pragma GCC unroll 4
    for (int h = 0; h < G; ++h)
#pragma GCC unroll 4
        for (int i = 0; i < NC; ++i) a[h][i] = _mm256_setzero_ps();
    const float *p = scores + g * G * L;
    for (int64_t b = 1; b < VI_AHEAD && b < nblk; ++b)
        prefetch_rows_i8(v_cache + (int64_t)bt[b] * blk_stride + g * row, tok_stride, BS, row);
    for (int64_t b = 0; b < nblk; ++b) {
        const int64_t start = b * BS, n = L - start < BS ? L - start : BS;
        const int8_t *vb = v_cache + (int64_t)bt[b] * blk_stride + g * row;
        if (b + VI_AHEAD < nblk) /* blocks sit beyond the hardware prefetcher */
            prefetch_rows_i8(v_cache + (int64_t)bt[b + VI_AHEAD] * blk_stride + g * row, tok_stride, BS, row);
        for (int64_t j = 0; j < n; ++j) {
            const int8_t *vr = vb + j * tok_stride;
            const float sc = row_scale(vr, D);
            __m256 v[4];
#pragma GCC unroll 4
            for (int i = 0; i < NC; ++i) v[i] = load8_i8(vr + c0 + 8 * i);
#pragma GCC unroll 4
            for (int h = 0; h < G; ++h) {
                const __m256 w = _mm256_set1_ps(p[h * L + start + j] * sc);
#pragma GCC unroll 4
                for (int i = 0; i < NC; ++i) a[h][i] = _mm256_fmadd_ps(w, v[i], a[h][i]);
            }
        }
    }
#pragma GCC unroll 4
    for (int h = 0; h < G; ++h)
#pragma GCC unroll 4
        for (int i = 0; i < NC; ++i) _mm256_storeu_ps(out + (g * G + h) * D + c0 + 8 * i, a[h][i]);
}

/* s[h * L + j] for the G query heads h of one KV head (q: their rows, [G, D]) and its n rows k_j = k + j * stride:
 * attn_score_rows_i8's operations for each head and row (rows in whole fours: one multiply-add chain over D; the
 * rest: two chains, even and odd vectors), with a row widened once for the G heads instead of once for each. */
static inline __attribute__((always_inline)) void score_group_i8(const int G, const float *restrict q,
                                                                 const int8_t *restrict k, int64_t stride, int64_t n,
                                                                 int64_t D, float scale, float *restrict s, int64_t L) {
    const int64_t fours = n / 4 * 4;
    int64_t j = 0;
    for (; j < fours; j += 2) {
        const int8_t *k0 = k + j * stride, *k1 = k0 + stride;
        __m256 a[4][2];
#pragma GCC unroll 4
        for (int h = 0; h < G; ++h) a[h][0] = a[h][1] = _mm256_setzero_ps();
        for (int64_t d = 0; d < D; d += 8) {
            const __m256 x0 = load8_i8(k0 + d), x1 = load8_i8(k1 + d);
#pragma GCC unroll 4
            for (int h = 0; h < G; ++h) {
                const __m256 qv = _mm256_loadu_ps(q + h * D + d);
                a[h][0] = _mm256_fmadd_ps(qv, x0, a[h][0]);
                a[h][1] = _mm256_fmadd_ps(qv, x1, a[h][1]);
            }
        }
#pragma GCC unroll 4
        for (int h = 0; h < G; ++h) {
            s[h * L + j] = hsum256(a[h][0]) * row_scale(k0, D) * scale;
            s[h * L + j + 1] = hsum256(a[h][1]) * row_scale(k1, D) * scale;
        }
    }
    for (; j < n; ++j) {
        const int8_t *kr = k + j * stride;
        __m256 a0[4], a1[4];
#pragma GCC unroll 4
        for (int h = 0; h < G; ++h) a0[h] = a1[h] = _mm256_setzero_ps();
        for (int64_t d = 0; d < D; d += 16) { /* D a multiple of 64 here: no scalar rest */
            const __m256 x0 = load8_i8(kr + d), x1 = load8_i8(kr + d + 8);
#pragma GCC unroll 4
            for (int h = 0; h < G; ++h) {
                a0[h] = _mm256_fmadd_ps(_mm256_loadu_ps(q + h * D + d), x0, a0[h]);
                a1[h] = _mm256_fmadd_ps(_mm256_loadu_ps(q + h * D + d + 8), x1, a1[h]);
            }
        }
#pragma GCC unroll 4
        for (int h = 0; h < G; ++h) s[h * L + j] = hsum256(_mm256_add_ps(a0[h], a1[h])) * row_scale(kr, D) * scale;
    }
}

#define SCORE_GROUP(G_)                                                                                              \
    static void score_group_##G_(const float *q, const int8_t *k, int64_t stride, int64_t n, int64_t D, float scale, \
                                 float *s, int64_t L) {                                                              \
        score_group_i8(G_, q, k, stride, n, D, scale, s, L);                                                         \
    }
SCORE_GROUP(1)
SCORE_GROUP(2)
SCORE_GROUP(3)
SCORE_GROUP(4)
typedef void (*score_fn)(const float *, const int8_t *, int64_t, int64_t, int64_t, float, float *, int64_t);
static const score_fn SCORE_GROUPS[5] = {NULL, score_group_1, score_group_2, score_group_3, score_group_4};

void attn_score_group_i8(int64_t G, const float *q, const int8_t *k, int64_t stride, int64_t n, int64_t D, float scale,
                         float *s, int64_t L) {
    SCORE_GROUPS[G](q, k, stride, n, D, scale, s, L);
}

/* acc[h * D + c] += sum_j p_h[j] * scale_j * v_j[c] for the G query heads h of one KV head (p: their score rows, L
 * apart) and its n rows v_j = v + j * stride: accumulate_rows_i8's operations for each head, with a row widened once
 * for the group (32 columns at a time: the G x 4 sums stay in registers over the rows). */
static inline __attribute__((always_inline)) void acc_group_i8(const int G, const float *restrict p, int64_t L,
                                                               const int8_t *restrict v, int64_t stride, int64_t n,
                                                               int64_t D, float *restrict acc) {
    for (int64_t d0 = 0; d0 < D; d0 += 32) {
        __m256 a[4][4];
#pragma GCC unroll 4
        for (int h = 0; h < G; ++h)
#pragma GCC unroll 4
            for (int i = 0; i < 4; ++i) a[h][i] = _mm256_loadu_ps(acc + h * D + d0 + 8 * i);
        for (int64_t j = 0; j < n; ++j) {
            const int8_t *vr = v + j * stride;
            const float sc = row_scale(vr, D);
            __m256 x[4];
#pragma GCC unroll 4
            for (int i = 0; i < 4; ++i) x[i] = load8_i8(vr + d0 + 8 * i);
#pragma GCC unroll 4
            for (int h = 0; h < G; ++h) {
                const __m256 w = _mm256_set1_ps(p[h * L + j] * sc);
#pragma GCC unroll 4
                for (int i = 0; i < 4; ++i) a[h][i] = _mm256_fmadd_ps(w, x[i], a[h][i]);
            }
        }
#pragma GCC unroll 4
        for (int h = 0; h < G; ++h)
#pragma GCC unroll 4
            for (int i = 0; i < 4; ++i) _mm256_storeu_ps(acc + h * D + d0 + 8 * i, a[h][i]);
    }
}

#define ACC_GROUP(G_)                                                                                                \
    static void acc_group_##G_(const float *p, int64_t L, const int8_t *v, int64_t stride, int64_t n, int64_t D,    \
                               float *acc) {                                                                         \
        acc_group_i8(G_, p, L, v, stride, n, D, acc);                                                                \
    }
ACC_GROUP(1)
ACC_GROUP(2)
ACC_GROUP(3)
typedef void (*acc_fn)(const float *, int64_t, const int8_t *, int64_t, int64_t, int64_t, float *);
static const acc_fn ACC_GROUPS[4] = {NULL, acc_group_1, acc_group_2, acc_group_3};

void attn_acc_group_i8(int64_t G, const float *p, int64_t L, const int8_t *v, int64_t stride, int64_t n, int64_t D,
                       float *acc) {
    ACC_GROUPS[G](p, L, v, stride, n, D, acc);
}

#define VI_PASS(G_, NC_) LONE_V_PASS(vi_pass, vi_group_pass, G_, NC_)
#define VI_PASSES(G_) VI_PASS(G_, 1) VI_PASS(G_, 2) VI_PASS(G_, 4)
VI_PASSES(1)
VI_PASSES(2)
VI_PASSES(3)
VI_PASS(4, 1)
VI_PASS(4, 2)
/* [G][log2 NC]: the widest pass has G * NC accumulators within the registers (at most 12 of the 16) */
static const lone_v_pass VI_PASSES_BY[5][3] = {{0},
                                               {vi_pass_1_1, vi_pass_1_2, vi_pass_1_4},
                                               {vi_pass_2_1, vi_pass_2_2, vi_pass_2_4},
                                               {vi_pass_3_1, vi_pass_3_2, vi_pass_3_4},
                                               {vi_pass_4_1, vi_pass_4_2, NULL}};

void attend_lone_row_i8(const attn_plan *pl, const float *restrict q, const int8_t *restrict k_cache,
                        const int8_t *restrict v_cache, const int32_t *restrict bt, int64_t pos, float *restrict out,
                        int64_t H, int64_t KVH, int64_t D, int64_t BS, float scale) {
    const int64_t L = pos + 1, nblk = (L + BS - 1) / BS, G = H / KVH, row = D + 4, tok_stride = KVH * row,
                  blk_stride = BS * tok_stride;
    float *scores = pl->shared;
    int64_t b0, b1;
    team_share(nblk, &b0, &b1);
    for (int64_t b = b0; b < b1; ++b) {
        const int64_t start = b * BS, n = L - start < BS ? L - start : BS;
        const int8_t *kb = k_cache + (int64_t)bt[b] * blk_stride;
        /* the next block's lines a share before each KV head's scores (attention_lone.c) */
        const int8_t *nb = b + 1 < b1 ? k_cache + (int64_t)bt[b + 1] * blk_stride : NULL;
        const int64_t per = (blk_stride + 64 * KVH - 1) / (64 * KVH) * 64;
        for (int64_t g = 0; g < KVH; ++g) {
            if (nb != NULL)
                for (int64_t i = g * per; i < g * per + per && i < blk_stride; i += 64) __builtin_prefetch(nb + i, 0, 1);
            SCORE_GROUPS[G](q + g * G * D, kb + g * row, tok_stride, n, D, scale, scores + g * G * L + start, L);
        }
    }
    team_barrier();
    int64_t h0, h1;
    team_share(H, &h0, &h1);
    for (int64_t h = h0; h < h1; ++h) softmax_inplace(scores + h * L, L);
    team_barrier();
    lone_v_units(VI_PASSES_BY[G], 3, scores, L, v_cache, bt, KVH, D, BS, tok_stride, blk_stride, out);
    team_barrier();
}
#else
void attn_score_group_i8(int64_t G, const float *q, const int8_t *k, int64_t stride, int64_t n, int64_t D, float scale,
                         float *s, int64_t L) {
    (void)G, (void)q, (void)k, (void)stride, (void)n, (void)D, (void)scale, (void)s, (void)L; /* never called */
}
void attn_acc_group_i8(int64_t G, const float *p, int64_t L, const int8_t *v, int64_t stride, int64_t n, int64_t D,
                       float *acc) {
    (void)G, (void)p, (void)L, (void)v, (void)stride, (void)n, (void)D, (void)acc; /* never called */
}
void attend_lone_row_i8(const attn_plan *pl, const float *restrict q, const int8_t *restrict k_cache,
                        const int8_t *restrict v_cache, const int32_t *restrict bt, int64_t pos, float *restrict out,
                        int64_t H, int64_t KVH, int64_t D, int64_t BS, float scale) {
    (void)pl, (void)q, (void)k_cache, (void)v_cache, (void)bt, (void)pos, (void)out, (void)H, (void)KVH, (void)D,
        (void)BS, (void)scale; /* lone_i8_supported is false without AVX2: never called */
}
#endif
