/* The int8 KV cache's rows (npu_ops/quant_kv.py: D int8 values, then their fp32 scale) as the attention kernels
 * read and the fused layers (layers_f32.c) write them: attention_int8.c (batch rows) and attention_lone_i8.c (a
 * lone row shared by a team) share these, so a row has the same bits on either path. */
#ifndef MINDIE_ATTENTION_I8_H
#define MINDIE_ATTENTION_I8_H
#include <stdint.h>
#include <string.h>

#include "layers_f32.h"
#include "vec_math.h"

static inline float row_scale(const int8_t *row, int64_t D) {
    float s;
    memcpy(&s, row + D, sizeof s);
    return s;
}

#ifdef __AVX2__
static inline __m256 load8_i8(const int8_t *p) {
    return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)p)));
}
#endif

/* the widest head the fused layers quantize into an int8 cache (a row is rotated on the stack first) */
#define KV_I8_MAX_D 512

/* whether attend_lone_row_i8 takes a lone row of these heads (else the plan's per-head tasks do) */
static inline int lone_i8_supported(int64_t H, int64_t KVH, int64_t D) {
#ifdef __AVX2__
    return D % 64 == 0 && H % KVH == 0 && H / KVH <= 4;
#else
    (void)H, (void)KVH, (void)D;
    return 0;
#endif
}

/* whether a task's query heads [h0, h1) go by whole KV-head groups (attn_score_group_i8, attn_acc_group_i8: a row
 * widened once for the group): AVX2, D a multiple of 64, G <= 3 (the sums of 32 columns for each head in registers) */
static inline int groups_i8(int64_t G, int64_t D, int64_t h0, int64_t h1) {
#ifdef __AVX2__
    return D % 64 == 0 && G >= 1 && G <= 3 && h0 % G == 0 && h1 % G == 0;
#else
    (void)G, (void)D, (void)h0, (void)h1;
    return 0;
#endif
}
/* s[h * L + j] = attn_score_rows_i8's score of query head h (q + h * D) for the n rows k_j, h < G (the same bits) */
void attn_score_group_i8(int64_t G, const float *q, const int8_t *k, int64_t stride, int64_t n, int64_t D, float scale,
                         float *s, int64_t L);
/* acc[h * D:(h + 1) * D] += accumulate_rows_i8 of the score row p + h * L over the n rows v_j, h < G (the same bits) */
void attn_acc_group_i8(int64_t G, const float *p, int64_t L, const int8_t *v, int64_t stride, int64_t n, int64_t D,
                       float *acc);

/* s[j] = q . k_j * scale_j * scale for the n int8 rows k_j = k + j * stride (bytes) */
void attn_score_rows_i8(const float *restrict q, const int8_t *restrict k, int64_t stride, int64_t n, int64_t D,
                        float scale, float *restrict s);
void kv_quantize_row_i8(const float *restrict x, int64_t D, int8_t *restrict out);
void attn_rows_i8_team(const attn_plan *pl, const float *q, const int8_t *k_cache, const int8_t *v_cache,
                       const int32_t *block_tables, const int32_t *row_seq, const int32_t *row_pos, float *out,
                       int64_t H, int64_t KVH, int64_t D, int64_t BS, int64_t MB, float scale, float *scores,
                       float *acc);
/* a lone row by every thread of the team (orphaned; ends on the team's barrier); scores: pl->shared */
void attend_lone_row_i8(const attn_plan *pl, const float *restrict q, const int8_t *restrict k_cache,
                        const int8_t *restrict v_cache, const int32_t *restrict bt, int64_t pos, float *restrict out,
                        int64_t H, int64_t KVH, int64_t D, int64_t BS, float scale);
#endif
