/* The int8 KV cache's rows (npu_ops/quant_kv.py: D int8 values, then their fp32 scale) as the attention kernels
 * read them: attention_int8.c (batch rows) and attention_lone_i8.c (a lone row shared by a team) share these, so a
 * row has the same bits on either path. (kv_quantize_row_i8, attention_int8.c, writes them.) */
#ifndef MINDIE_ATTENTION_I8_H
#define MINDIE_ATTENTION_I8_H
#include <stdint.h>
#include <string.h>

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
#endif
