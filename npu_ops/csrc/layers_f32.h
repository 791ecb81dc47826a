/* What the fused fp32 decoder layers (layers_f32.c) share with the single-op kernels: the row functions of
 * elementwise.c, the team (orphaned `omp for`) halves of gemm.c and attention.c. One compiled copy of each,
 * so the fused path rounds exactly as the op-by-op path does. */
#ifndef MINDIE_LAYERS_F32_H
#define MINDIE_LAYERS_F32_H
#include <stdint.h>

void rms_norm_row_f32(const float *restrict xr, const float *restrict w, float *restrict o, int64_t dim, float eps);
void silu_mul_row_f32(const float *restrict g, const float *restrict u, float *restrict o, int64_t n);
void rotary_head_f32(const float *restrict x, const float *restrict c, const float *restrict s, float *restrict o,
                     int64_t half);

void linear_f32_team(const float *x, int64_t M, int64_t K, const float *wp, int64_t N, const float *bias, float *y,
                     int add);
void gate_up_silu_f32_team(const float *x, int64_t M, int64_t K, const float *wp, int64_t inter, const float *bias,
                           float *h);

/* int8-weight linears by every thread of a team (gemm_int8.c, gemm_w8a8.c): the single-op kernels' bodies */
void linear_w8a16_f32_team(const float *x, int64_t M, int64_t K, const int8_t *wp, const float *scale, int64_t N,
                           const float *bias, float *y, int add);
void linear_w8a8_f32_team(const float *x, int64_t M, int64_t K, const int8_t *wp, const float *ws, int64_t N,
                          const float *bias, float *y, int8_t *xq, float *xs, const int8_t *zero, int add);
int64_t w8a8_zero_bytes(int64_t K);
/* one row's silu(gate) * up into h from the packed W8A8 [gate | up] projection (gemm_w8a8_row.c): every thread of the
 * team, x quantized into its own xq / xs; the bits of linear_w8a8_f32_team then silu_mul_row_f32. Ends on the
 * team's barrier. */
void gate_up_silu_w8a8_team(const float *x, int64_t K, const int8_t *wp, const float *ws, int64_t inter,
                            const float *bias, float *h, int8_t *xq, float *xs);
#endif
