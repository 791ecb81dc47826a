/* A lone row's attention over int8 pages by the whole team (attention_lone_i8.c), and its KV-head group primitives,
 * which attention_int8.c's batch rows run too (the same bits either way). */
#ifndef MINDIE_ATTENTION_LONE_I8_H
#define MINDIE_ATTENTION_LONE_I8_H
#include <stdint.h>

#include "attention_rows.h"

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
/* a lone row by every thread of the team (orphaned; ends on the team's barrier); scores: pl->shared */
void attend_lone_row_i8(const attn_plan *pl, const float *restrict q, const int8_t *restrict k_cache,
                        const int8_t *restrict v_cache, const int32_t *restrict bt, int64_t pos, float *restrict out,
                        int64_t H, int64_t KVH, int64_t D, int64_t BS, float scale);
#endif
