/* The row functions of the fused elementwise ops (elementwise.c), run also by the fused layers (layers_f32.c),
 * the fused decode step (decode_f32.c) and the gate/up epilogues (gemm.c, gemm_w8a8_row.c): one compiled copy, so
 * every path rounds as the single-op kernels do. */
#ifndef MINDIE_ELEMENTWISE_H
#define MINDIE_ELEMENTWISE_H
#include <stdint.h>


/* o = w * (x * rsqrt(mean(x^2) + eps)) over one row of dim */
void rms_norm_row_f32(const float *restrict xr, const float *restrict w, float *restrict o, int64_t dim, float eps);
/* o = silu(g) * u over n; the same bits for any split of a row into whole 8-float vectors */
void silu_mul_row_f32(const float *restrict g, const float *restrict u, float *restrict o, int64_t n);
/* one head's rotate-half rotary: o = x * c + rotate_half(x) * s, half = head_dim / 2 */
void rotary_head_f32(const float *restrict x, const float *restrict c, const float *restrict s, float *restrict o,
                     int64_t half);
#endif
