/* What other files run of the GGUF K-quant linears (gemm_kquant.c): the team half, for a caller that already
 * has an OpenMP team (the fused layers), and the one-block decode (gemm_kquant_q8.c's portable path). */
#ifndef MINDIE_GEMM_KQUANT_H
#define MINDIE_GEMM_KQUANT_H
#include <stdint.h>

#include "kquant_block.h" /* the GGUF_KQ_* type numbers */

/* y[m, n_out] = x[m, k] . W^T, W as GGUF stores it (row r: k / 256 super-blocks of `type`), by every thread of
 * the calling team (each a contiguous share of W's rows; serial outside a parallel region); k % 256 == 0.
 * 0, or 3 where a thread had no decode buffer. Ends on the team's barrier. */
int gguf_matmul_kquant_team(int type, const uint8_t *w, int64_t n_out, int64_t k, const float *x, int64_t m,
                            float *y);
/* one super-block of `type` into out[256] fp32, exactly gguf.quants.dequantize's values */
void gguf_kquant_decode_block(int type, const uint8_t *block, float *out);
#endif
