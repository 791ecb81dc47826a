/* What other files run of the K-quant linears against int8 activations (gemm_kquant_q8.c): the team half, over
 * rows the caller quantized (Q8_K: int8 xq[m, k], fp32 xd[m, k / 256], int16 bs[m, k / 16] sums of 16). */
#ifndef MINDIE_GEMM_KQUANT_Q8_H
#define MINDIE_GEMM_KQUANT_Q8_H
#include <stdint.h>

/* y[m, n_out] = (xq * xd) . W^T, W of GGUF_KQ_* `type` as the file stores it, by every thread of the calling
 * team (a contiguous share of W's rows each); 0. Ends on the team's barrier. */
int gguf_matmul_kquant_q8_team(int type, const uint8_t *w, int64_t n_out, int64_t k, const int8_t *xq,
                               const float *xd, const int16_t *bs, int64_t m, float *y);
/* x[k] -> Q8_K: xq[k] int8, xd[k / 256] fp32 scales, bs[k / 16] int16 sums of each 16 quants */
void gguf_q8k_quantize_row(const float *x, int64_t k, int8_t *xq, float *xd, int16_t *bs);
/* b32[n32]: sums of each 32 quants from gguf_q8k_quantize_row's sums of 16 (gemm_kquant_q8_lanes.c's own x and the
 * team's, gguf_linear.c) */
static inline void gguf_q8k_sums32(const int16_t *bs, int64_t n32, int16_t *b32) {
    for (int64_t j = 0; j < n32; ++j) b32[j] = (int16_t)(bs[2 * j] + bs[2 * j + 1]);
}
/* y[m, n_out] = x . W^T (x quantized here), a W row a pass against up to 4 rows of x: gemm_kquant_q8_lanes.c's
 * few-row calls */
void gguf_kquant_q8_matmul(int type, const uint8_t *w, int64_t n_out, int64_t k, const float *x, int64_t m, float *y);
#endif
