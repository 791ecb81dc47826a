/* The fp32 attention row primitives that attention.c (batch rows) and attention_lone.c (a lone row shared by a
 * team) both run: one compiled copy, so both round alike. */
#ifndef MINDIE_ATTENTION_ROWS_H
#define MINDIE_ATTENTION_ROWS_H
#include <stdint.h>

#include "layers_f32.h"

/* s[j] = q . k_j * scale for the n rows k_j = k + j * stride */
void attn_score_rows(const float *restrict q, const float *restrict k, int64_t stride, int64_t n, int64_t D,
                     float scale, float *restrict s);
/* the n floats from p on their way to the cache (a K/V block the hardware prefetcher cannot foresee) */
void attn_prefetch_block(const float *p, int64_t n);
/* a lone row by every thread of the team (orphaned; ends on the team's barrier); scores: pl->shared */
void attend_lone_row(const attn_plan *pl, const float *restrict q, const float *restrict k_cache,
                     const float *restrict v_cache, const int32_t *restrict bt, int64_t pos, float *restrict out,
                     int64_t H, int64_t D, int64_t BS, int64_t tok_stride, int64_t blk_stride, float scale);
#endif
