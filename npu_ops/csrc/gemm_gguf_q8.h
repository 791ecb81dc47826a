/* GGUF's simple blocks against int8 activations, 4 weight rows a pass (gemm_gguf_q8.c): Q8_0's entry point is in
 * kernels.h (the fused paths reach it through a segment's fn_q8, gguf_linear.c); the 4-bit types' entry points are
 * gemm_gguf_q4_q8.c's, which hands its few-row calls and its rows' quantization to this file. */
#ifndef MINDIE_GEMM_GGUF_Q8_H
#define MINDIE_GEMM_GGUF_Q8_H
#include <stdint.h>

#include "gguf_xq.h"

#define GGUF_Q8_Q4_0 0
#define GGUF_Q8_Q4_1 1
#define GGUF_Q8_Q8_0 2
#define GGUF_Q8_Q4_1F 3
#define GGUF_Q8_X4 4 /* added to a 4-bit type: its 4-row interleaved layout (gguf_x4.h) */

/* x[k] -> xq[k] int8 per 16 values (d = max|x| / 127, round-half-even, clamped to +-127), xd[8 * (k / 32)] each
 * block's two scales (lanes 0-3 d0, 4-7 d1), xs[k / 32] = d0 * sum(q[0:16]) + d1 * sum(q[16:32]) */
void gguf_q8_quantize_row(const float *x, int64_t k, int8_t *xq, float *xd, float *xs);
/* row i of m, quantized by gguf_q8_quantize_row (q, xd, xs), put where gemm_gguf_q4_q8.c's lanes kernel reads it
 * (gguf_xq.h's block-major layout; its own x and the team's, gguf_linear.c): block b's 32 quants at qb + (b m + i) 32,
 * its numbers (d0, d1, s, 0) at xb + 4 (b m + i) */
static inline void gguf_q8_lanes_row(const int8_t *q, const float *xd, const float *xs, int64_t nb, int64_t m,
                                     int64_t i, int8_t *qb, float *xb) {
    gguf_xq_blocks(q, nb, 32, m, i, qb);
    for (int64_t b = 0; b < nb; ++b) {
        float *e = xb + 4 * (b * m + i);
        e[0] = xd[8 * b], e[1] = xd[8 * b + 4], e[2] = xs[b], e[3] = 0.0f;
    }
}
/* y[m, n_out] = x . W^T for W of GGUF_Q8_* `type`: 4 weight rows a pass sharing each x block, MR rows of x a tile */
void gguf_q8_matmul(int type, const uint8_t *w, int64_t n_out, int64_t k, const float *x, int64_t m, float *y);
#endif
