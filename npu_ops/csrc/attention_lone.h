/* A lone row's attention over fp32 pages by the whole team (attention_lone.c). */
#ifndef MINDIE_ATTENTION_LONE_H
#define MINDIE_ATTENTION_LONE_H
#include <stdint.h>

#include "attention_rows.h"

/* a lone row by every thread of the team (orphaned; ends on the team's barrier); scores: pl->shared */
void attend_lone_row(const attn_plan *pl, const float *restrict q, const float *restrict k_cache,
                     const float *restrict v_cache, const int32_t *restrict bt, int64_t pos, float *restrict out,
                     int64_t H, int64_t D, int64_t BS, int64_t tok_stride, int64_t blk_stride, float scale);
#endif
