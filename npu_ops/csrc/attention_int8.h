/* Batch rows over the int8 KV cache (attention_int8.c), and the one writer of its rows. */
#ifndef MINDIE_ATTENTION_INT8_H
#define MINDIE_ATTENTION_INT8_H
#include <stdint.h>

#include "attention_rows.h"

/* s[j] = q . k_j * scale_j * scale for the n int8 rows k_j = k + j * stride (bytes) */
void attn_score_rows_i8(const float *restrict q, const int8_t *restrict k, int64_t stride, int64_t n, int64_t D,
                        float scale, float *restrict s);
/* one cache row from D floats, as npu_ops/quant_kv.py's quantize writes it */
void kv_quantize_row_i8(const float *restrict x, int64_t D, int8_t *restrict out);
/* the plan's rows over int8 pages by the calling team (a lone row: attend_lone_row_i8); ends on its barrier */
void attn_rows_i8_team(const attn_plan *pl, const float *q, const int8_t *k_cache, const int8_t *v_cache,
                       const int32_t *block_tables, const int32_t *row_seq, const int32_t *row_pos, float *out,
                       int64_t H, int64_t KVH, int64_t D, int64_t BS, int64_t MB, float scale, float *scores,
                       float *acc);
#endif
