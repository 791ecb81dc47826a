/* The team half of a GGUF block-quantized projection (gguf_linear.c), for the fused decoder (layers_f32.c,
 * decode_f32.c): gguf_seg is one segment of its output rows, filled by npu_ops/quant_gguf.py. */
#ifndef MINDIE_GGUF_LINEAR_H
#define MINDIE_GGUF_LINEAR_H
#include <stdint.h>

typedef void (*gguf_matmul_fn)(const uint8_t *w, int64_t n_out, int64_t k, const float *x, int64_t m, float *y);
typedef void (*gguf_row_fn)(const uint8_t *w, int64_t k, float *out);

/* rows of W [rows, K] in one GGUF block type: fn computes them, row_fn dequantizes one (an embedding row; may be
 * NULL), row_bytes apart from w; fn_q8 (may be NULL) computes them against int8 activations, taken for calls of at
 * most q8_rows rows of x (a decode step: bandwidth-bound, where int8 activations cost fewer instructions) */
typedef struct gguf_seg {
    gguf_matmul_fn fn;
    gguf_row_fn row_fn;
    const uint8_t *w;
    int64_t rows, row_bytes;
    gguf_matmul_fn fn_q8;
    int64_t q8_rows;
} gguf_seg;

/* the segments of a table ended by one whose fn is NULL (as npu_ops/gguf_modules.py writes them) */
int64_t gguf_seg_count(const gguf_seg *segs);
/* y[M, N] = x[M, K] . W^T (+ bias) over the segments (their rows add up to N), by every thread of the calling team
 * (add: y += that); ends on the team's barrier; 0, or 3 without scratch */
int gguf_linear_team(const gguf_seg *segs, int64_t nseg, const float *x, int64_t M, int64_t K, const float *bias,
                     float *y, int64_t N, int add);
#endif
