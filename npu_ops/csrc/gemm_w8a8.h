/* The W8A8 linear by every thread of a team (gemm_w8a8.c), for the fused layers (layers_f32.c). */
#ifndef MINDIE_GEMM_W8A8_H
#define MINDIE_GEMM_W8A8_H
#include <stdint.h>


/* x's rows quantized into xq (k4 * 4 bytes a row) and xs, then linear_w8a8_f32's tiles (add: y += the result); one
 * row is quantized by every thread into its own xq / xs. zero: w8a8_zero_bytes(K) zero bytes */
void linear_w8a8_f32_team(const float *x, int64_t M, int64_t K, const int8_t *wp, const float *ws, int64_t N,
                          const float *bias, float *y, int8_t *xq, float *xs, const int8_t *zero, int add);
/* the bytes of a zero panel (the partner of an odd last panel) for K */
int64_t w8a8_zero_bytes(int64_t K);
#endif
