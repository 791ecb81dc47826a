/* Paged attention rows by a team or standalone (attention.c): the fused layers' way into every attention path. */
#ifndef MINDIE_ATTENTION_H
#define MINDIE_ATTENTION_H
#include <stdint.h>

#include "attention_rows.h"

/* the plan's rows by the calling team over fp32 pages (attn_rows_f32_team) or int8 ones (kv_i8: attention_int8.c's
 * attn_rows_i8_team); ends on the team's barrier */
void attn_rows_team(const attn_plan *pl, int kv_i8, const float *q, const void *k_cache, const void *v_cache,
                    const int32_t *block_tables, const int32_t *row_seq, const int32_t *row_pos, float *out, int64_t H,
                    int64_t KVH, int64_t D, int64_t BS, int64_t MB, float scale, float *scores, float *acc);
/* a standalone kernel's plan, team and scratch around attn_rows_team */
int attn_rows_standalone(const float *q, const void *k_cache, const void *v_cache, const int32_t *block_tables,
                         const int32_t *row_seq, const int32_t *row_pos, float *out, int64_t T, int64_t S, int64_t H,
                         int64_t KVH, int64_t D, int64_t BS, int64_t MB, float scale, int nthreads, int kv_i8);
void attn_rows_f32_team(const attn_plan *pl, const float *q, const float *k_cache, const float *v_cache,
                        const int32_t *block_tables, const int32_t *row_seq, const int32_t *row_pos, float *out,
                        int64_t H, int64_t KVH, int64_t D, int64_t BS, int64_t MB, float scale, float *scores,
                        float *acc);
#endif
